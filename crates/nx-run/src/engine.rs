//! `Engine`: many sequences, one batched forward pass per step, continuous batching.
//!
//! [`Engine::submit`] queues a [`Request`] (prompt ids and how to generate) and returns
//! its [`SeqId`]; each [`Engine::step`] lets the scheduler pick a batch, runs it through
//! [`Model::forward_batch`] and reports [`EngineEvent`]s; [`Engine::cancel`] drops a
//! sequence.
//!
//! ## Scheduling
//! - **Admission** is FIFO, up to [`EngineConfig::max_running`] sequences, when the pool
//!   has blocks for the request's first chunk. On admission the longest cached prefix
//!   of its tokens (whole blocks) is shared from the prefix cache.
//! - **Each step** spends at most [`EngineConfig::step_tokens`] rows: first one token
//!   for every sequence that is decoding, then prefill chunks (at most
//!   [`EngineConfig::prefill_chunk`] each) of those still reading their prompt, in
//!   admission order. A long prompt never stalls the others for its whole prefill.
//! - **Preemption**: when a sequence needs a block and none is free (nor evictable from
//!   the prefix cache), the most recently admitted sequence outside the step's batch
//!   gives its blocks back and goes to the front of the queue; when it is admitted again
//!   its tokens (prompt and everything generated) are recomputed, from the prefix cache
//!   where possible.
//!
//! ## Why answers do not depend on the batch
//! A position's logits are bit-identical whatever else shares the forward pass, however
//! the prompt was chunked and whether its rows came from the prefix cache or were
//! recomputed after preemption (the kernels are batch-invariant; gate EQUIV-3). Each
//! sequence owns its sampler (a seeded ChaCha stream) and consumes it exactly as
//! [`crate::Runner`] does, so a request's tokens depend only on its own prompt,
//! settings and seed.
//!
//! # Example
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let model_bytes = nx_llama_stack::tiny_fixture::tiny_gguf(Default::default());
//! use std::sync::Arc;
//! use nx_run::{Engine, EngineConfig, EngineEvent, Model, Request, SamplerConfig};
//!
//! let model = Arc::new(Model::from_gguf(nx_gguf::Gguf::from_bytes(model_bytes)?)?);
//! let mut engine = Engine::new(model, None, EngineConfig::default())?;
//! let request = |prompt: Vec<u32>| Request {
//!     prompt,
//!     max_tokens: 4,
//!     sampler: SamplerConfig::greedy(),
//!     ..Request::default()
//! };
//! let a = engine.submit(request(vec![1, 2, 3]))?;
//! let b = engine.submit(request(vec![4, 5]))?;
//! let mut tokens = std::collections::HashMap::new();
//! while engine.has_work() {
//!     for event in engine.step()? {
//!         if let EngineEvent::Token { seq, id, .. } = event {
//!             tokens.entry(seq).or_insert_with(Vec::new).push(id);
//!         }
//!     }
//! }
//! assert_eq!(tokens[&a].len(), 4);
//! assert_eq!(tokens[&b].len(), 4);
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use nx_bpe::{DetachedDecoder, Tokenizer};
use nx_kv_cache::{BlockTable, KvDtype, KvError, PagedBatch, PagedKv};
use nx_llama_stack::{BatchItem, ForwardState, HeadChoice, Model};
use nx_sampler::{log_prob_given, log_softmax_top, log_sum_exp, Sampler, SamplerConfig};

use crate::json_mode::{JsonObject, JsonVocab};

use crate::spec::{check_same_vocab, DraftSource, Ewma, SpecState, Speculation, VERIFY_ROW_COST};
use crate::stop::{Released, StopMatcher};
use crate::{RunError, StopReason};

/// Identifies one submitted request inside an [`Engine`].
pub type SeqId = u64;

/// How an [`Engine`] schedules and stores sequences.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Most positions one sequence may hold (prompt + generated).
    pub n_ctx: usize,
    /// KV element type.
    pub kv_dtype: KvDtype,
    /// Bytes of the KV block pool shared by every sequence.
    pub kv_memory_bytes: u64,
    /// Positions per KV block (16 or 32).
    pub block_size: usize,
    /// Most sequences decoding at once (`--parallel`).
    pub max_running: usize,
    /// Most tokens one step's forward pass processes, decode and prefill together.
    pub step_tokens: usize,
    /// Most prompt tokens of one sequence that one step prefills.
    pub prefill_chunk: usize,
    /// Reuse full KV blocks of earlier sequences with the same token prefix.
    pub prefix_cache: bool,
    /// Most requests waiting for admission; `submit` refuses more ([`RunError::QueueFull`]).
    pub max_queue: usize,
    /// Weigh a draft model's measured cost against plain decoding when choosing how
    /// many guesses to ask of it (off: the acceptance rate alone decides, as the gate
    /// EQUIV-4 needs for timing-free draft lengths).
    pub weigh_draft_cost: bool,
}

impl Default for EngineConfig {
    /// 4096 positions per sequence, f16, 256 MiB of KV blocks of 16, 8 running
    /// sequences, 256 tokens per step, prefill chunks of 256, prefix cache on, 64 waiting.
    fn default() -> Self {
        EngineConfig {
            n_ctx: 4096,
            kv_dtype: KvDtype::F16,
            kv_memory_bytes: 256 << 20,
            block_size: 16,
            max_running: 8,
            step_tokens: 256,
            prefill_chunk: 256,
            prefix_cache: true,
            max_queue: 64,
            weigh_draft_cost: true,
        }
    }
}

/// One generation request: prompt ids and how to generate.
///
/// The default is an empty prompt, 128 tokens, the sampler's defaults, no stop strings,
/// no alternatives, stopping at end-of-generation, no byte cap.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Prompt token ids, used as given (BOS included if wanted).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How tokens are chosen (its seed makes the answer reproducible).
    pub sampler: SamplerConfig,
    /// Generation stops before the first occurrence of any of these (non-empty) strings.
    pub stop_strings: Vec<String>,
    /// How many alternatives each token event reports (0: none).
    pub logprobs: usize,
    /// Whether token events carry the chosen token's own log-probability. Without it
    /// (and without alternatives) the event's `logprob` is NaN and no log-sum-exp over
    /// the vocabulary is computed for the step: a server client that asked for no
    /// log-probabilities does not pay for them.
    pub token_logprobs: bool,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Cap on output bytes (`None`: no cap).
    pub max_bytes: Option<usize>,
    /// Speculative decoding (`None`: one token per pass). Never changes the answer.
    pub speculation: Option<Speculation>,
    /// Score the prompt: report the negative log-likelihood of every prompt token at
    /// position `score_from` or later given the tokens before it
    /// ([`EngineEvent::PromptScores`]; `nx perplexity`). `None`: no scoring.
    pub score_from: Option<usize>,
    /// JSON mode: only tokens that keep the generated text a prefix of one JSON object
    /// may be chosen ([`crate::json_mode`]). Needs the engine's tokenizer.
    pub json_object: bool,
}

/// Counts and timings of one finished request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    /// Prompt tokens of the request.
    pub prompt_tokens: usize,
    /// Of those, tokens whose KV rows came from the prefix cache.
    pub cached_prompt_tokens: usize,
    /// Tokens emitted as [`EngineEvent::Token`].
    pub generated_tokens: usize,
    /// Milliseconds from submit to the first token (0 when none).
    pub ttft_ms: f64,
    /// Milliseconds from submit to the end.
    pub total_ms: f64,
    /// Times the sequence was preempted and recomputed.
    pub preemptions: usize,
    /// Draft tokens verified (speculative decoding).
    pub drafted_tokens: usize,
    /// Of those, tokens kept.
    pub accepted_tokens: usize,
}

/// What one [`Engine::step`] reports.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// One generated token of sequence `seq` (fields as [`crate::Event::Token`]).
    Token {
        seq: SeqId,
        id: u32,
        text: String,
        logprob: f32,
        top: Vec<(u32, f32)>,
    },
    /// Negative log-likelihoods (nats, f64) of prompt tokens `first..first + nll.len()` of
    /// sequence `seq`, each given the tokens before it ([`Request::score_from`]); one
    /// event per step that computed some.
    PromptScores {
        seq: SeqId,
        first: usize,
        nll: Vec<f64>,
    },
    /// Sequence `seq` ended; its blocks are freed.
    Done {
        seq: SeqId,
        reason: StopReason,
        usage: Usage,
        /// Held-back text no `Token` carried (as [`crate::Event::Done`]).
        flushed: String,
    },
    /// Sequence `seq` failed and was removed (e.g. it needs more KV memory than the pool).
    Failed { seq: SeqId, error: String },
}

/// Gauges and counters for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineMetrics {
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Sequences admitted (prefilling or decoding).
    pub running: usize,
    /// KV blocks referenced by sequences.
    pub kv_blocks_used: usize,
    /// KV blocks free or held only by the prefix cache (evictable).
    pub kv_blocks_free: usize,
    /// Blocks in the pool.
    pub kv_blocks_total: usize,
    /// Rows of the last step's forward pass.
    pub last_batch_tokens: usize,
    /// Sequences in the last step's forward pass.
    pub last_batch_seqs: usize,
    /// Requests submitted so far.
    pub requests_total: u64,
    /// Prompt tokens submitted so far.
    pub prompt_tokens_total: u64,
    /// Tokens generated so far.
    pub generated_tokens_total: u64,
    /// Prompt tokens served from the prefix cache so far.
    pub prefix_hit_tokens_total: u64,
    /// Preemptions so far.
    pub preemptions_total: u64,
    /// Forward steps so far.
    pub steps_total: u64,
    /// Draft tokens verified so far (speculative decoding).
    pub drafted_tokens_total: u64,
    /// Of those, tokens kept.
    pub accepted_tokens_total: u64,
    /// Tokens the draft model has read so far (prompt chunks, catching up, guessing).
    pub draft_model_tokens_total: u64,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            prompt: Vec::new(),
            max_tokens: 128,
            sampler: SamplerConfig::default(),
            stop_strings: Vec::new(),
            logprobs: 0,
            token_logprobs: true,
            ignore_eos: false,
            max_bytes: None,
            speculation: None,
            score_from: None,
            json_object: false,
        }
    }
}

/// One sequence: its tokens (prompt, then what it generated), its blocks and its
/// generation state.
struct Sequence {
    id: SeqId,
    /// Prompt and generated tokens; rows `0..table.len()` of them are in the cache.
    tokens: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    logprobs: usize,
    token_logprobs: bool,
    ignore_eos: bool,
    max_bytes: Option<usize>,
    table: BlockTable,
    sampler: Sampler,
    decoder: DetachedDecoder,
    stops: StopMatcher,
    text_bytes: usize,
    generated: usize,
    cached_prompt_tokens: usize,
    preemptions: usize,
    submitted: Instant,
    ttft_ms: f64,
    spec: Option<SpecState>,
    score_from: Option<usize>,
    /// Prompt targets below this were reported (a recomputed sequence does not repeat
    /// them).
    scored_upto: usize,
    /// JSON mode's state after the tokens chosen so far (`None`: off).
    json: Option<JsonMode>,
}

/// A sequence's JSON mode: its state and the engine's sorted vocabulary.
struct JsonMode {
    state: JsonObject,
    vocab: Arc<JsonVocab>,
}

impl Sequence {
    /// Prompt positions whose targets (the token after each) are scored when the batch
    /// covers positions `pos..pos+n`: the target range.
    fn scored_targets(&self, pos: usize, n: usize) -> std::ops::Range<usize> {
        match self.score_from {
            Some(from) => {
                let start = from.max(pos + 1).max(1).max(self.scored_upto);
                let end = (pos + n + 1).min(self.prompt_len);
                start..end.max(start)
            }
            None => 0..0,
        }
    }
}

impl Sequence {
    /// How many of each row's largest logits decide its tokens, when nothing else does
    /// (greedy or top-k, no penalties, no log-probabilities): the LM head may then bound
    /// the row instead of computing every logit ([`HeadChoice`]).
    fn bounded_top(&self) -> Option<usize> {
        if self.logprobs > 0 || self.token_logprobs || self.json.is_some() {
            return None;
        }
        self.sampler.top_needed().filter(|&k| k <= MAX_BOUNDED_TOP)
    }

    /// Tokens not yet in the cache.
    fn pending(&self) -> usize {
        self.tokens.len() - self.table.len()
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            cached_prompt_tokens: self.cached_prompt_tokens,
            generated_tokens: self.generated,
            ttft_ms: self.ttft_ms,
            total_ms: self.submitted.elapsed().as_secs_f64() * 1e3,
            preemptions: self.preemptions,
            drafted_tokens: self.spec.as_ref().map_or(0, |s| s.drafted),
            accepted_tokens: self.spec.as_ref().map_or(0, |s| s.accepted),
        }
    }
}

/// What sampling one token did to a sequence.
enum Sampled {
    /// The sequence goes on; the token was emitted.
    Continue(EngineEvent),
    /// The sequence ended (the token event, if any, then the end).
    Finished(Option<EngineEvent>, StopReason, String),
}

/// The step-wise engine; see the module docs.
pub struct Engine {
    model: Arc<Model>,
    tokenizer: Option<Arc<Tokenizer>>,
    /// The tokenizer's vocabulary sorted for JSON mode (built by the first such request).
    json_vocab: Option<Arc<JsonVocab>>,
    config: EngineConfig,
    kv: PagedKv,
    state: ForwardState,
    logits: Vec<f32>,
    /// One sampling buffer per pool thread.
    sample_bufs: Vec<Vec<f32>>,
    waiting: VecDeque<Sequence>,
    /// Admitted sequences, oldest first.
    running: Vec<Sequence>,
    next_id: SeqId,
    metrics: EngineMetrics,
    /// Why recent sequences failed, for [`Engine::take_failure`] (the newest few).
    failures: VecDeque<(SeqId, RunError)>,
    /// The draft model of [`DraftSource::Model`] speculation, with its own block pool.
    draft: Option<DraftModel>,
    /// Seconds per step of plain decoding (every slot one token, no guesses), against
    /// which a draft-model pass is weighed.
    plain_step_s: Ewma,
}

/// A draft model and its per-step state.
struct DraftModel {
    model: Arc<Model>,
    kv: PagedKv,
    state: ForwardState,
    logits: Vec<f32>,
    /// Seconds per drafting pass (one guess for every drafting sequence).
    pass_s: Ewma,
}

/// One sequence's part of a step: `n` of its pending tokens, then `drafts` to verify.
struct Slot {
    /// Index into `running`.
    index: usize,
    n: usize,
    drafts: Vec<u32>,
    /// Draft tokens asked of the draft model (filled in by the draft phase).
    model_drafts: usize,
}

/// Failures kept for [`Engine::take_failure`].
const KEPT_FAILURES: usize = 64;

/// Top-k counts above this take full logits: the bound pass keeps each token's `k`
/// largest lower ends and files each new one in O(k), and the candidates get their
/// exact logits one by one.
const MAX_BOUNDED_TOP: usize = 128;

impl Engine {
    /// An engine over `model`, with its KV block pool allocated
    /// ([`EngineConfig::kv_memory_bytes`]).
    pub fn new(
        model: Arc<Model>,
        tokenizer: Option<Arc<Tokenizer>>,
        config: EngineConfig,
    ) -> Result<Engine, RunError> {
        let c = &config;
        if c.n_ctx == 0 || c.max_running == 0 || c.step_tokens == 0 || c.prefill_chunk == 0 {
            return Err(RunError::InvalidConfig(
                "n_ctx, max_running, step_tokens and prefill_chunk must be at least 1".into(),
            ));
        }
        if !(1..=1024).contains(&c.block_size) {
            return Err(RunError::InvalidConfig(format!(
                "block_size {} is not in 1..=1024",
                c.block_size
            )));
        }
        let kv = model.new_paged_cache(c.n_ctx, c.kv_dtype, c.block_size, c.kv_memory_bytes)?;
        // A step can hold a row of every running sequence: build what their LM head pass
        // needs now rather than in the first such step.
        model.prepare_bounded_head(c.max_running)?;
        Ok(Engine {
            model,
            tokenizer,
            json_vocab: None,
            config,
            kv,
            state: ForwardState::default(),
            logits: Vec::new(),
            sample_bufs: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 1,
            metrics: EngineMetrics::default(),
            failures: VecDeque::new(),
            draft: None,
            plain_step_s: Ewma::default(),
        })
    }

    /// Adds a draft model for [`DraftSource::Model`] speculation: a (smaller) model with
    /// the same vocabulary, given a block pool of its own for as many positions as the
    /// target's. A vocabulary that differs is an error naming the difference.
    pub fn with_draft_model(mut self, draft: Arc<Model>) -> Result<Engine, RunError> {
        check_same_vocab(self.model.gguf(), draft.gguf())?;
        let c = &self.config;
        let positions = self.kv.n_blocks() as u64 * c.block_size as u64;
        let bytes = positions * draft.kv_bytes_per_position(c.kv_dtype);
        let kv = draft.new_paged_cache(c.n_ctx, c.kv_dtype, c.block_size, bytes)?;
        self.draft = Some(DraftModel {
            model: draft,
            kv,
            state: ForwardState::default(),
            logits: Vec::new(),
            pass_s: Ewma::default(),
        });
        Ok(self)
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The tokenizer, if any.
    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.tokenizer.as_ref()
    }

    /// The settings in use.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues `request`; errors (empty prompt, token out of range, prompt +
    /// `max_tokens` beyond `n_ctx` or beyond the whole block pool, queue full, bad
    /// sampler settings) leave nothing queued.
    pub fn submit(&mut self, request: Request) -> Result<SeqId, RunError> {
        self.check_request(&request)?;
        let json = match (request.json_object, &self.tokenizer) {
            (true, Some(tok)) => Some(JsonMode {
                state: JsonObject::new(),
                vocab: self
                    .json_vocab
                    .get_or_insert_with(|| Arc::new(JsonVocab::new(tok)))
                    .clone(),
            }),
            _ => None,
        };
        let mut sampler = Sampler::new(request.sampler.clone())?;
        // The prompt enters the penalty window before the first token, as in the runner.
        sampler.accept_all(&request.prompt);
        let id = self.next_id;
        self.next_id += 1;
        self.metrics.requests_total += 1;
        self.metrics.prompt_tokens_total += request.prompt.len() as u64;
        self.waiting.push_back(Sequence {
            id,
            prompt_len: request.prompt.len(),
            stops: StopMatcher::new(&request.stop_strings),
            tokens: request.prompt,
            max_tokens: request.max_tokens,
            logprobs: request.logprobs,
            token_logprobs: request.token_logprobs || request.logprobs > 0,
            ignore_eos: request.ignore_eos,
            max_bytes: request.max_bytes,
            table: BlockTable::new(),
            sampler,
            decoder: DetachedDecoder::new(),
            text_bytes: 0,
            generated: 0,
            cached_prompt_tokens: 0,
            preemptions: 0,
            submitted: Instant::now(),
            ttft_ms: 0.0,
            spec: request.speculation.map(SpecState::new),
            score_from: request.score_from,
            scored_upto: 0,
            json,
        });
        Ok(id)
    }

    /// Why `r` cannot be queued, if it cannot: a bad prompt or configuration, more
    /// positions or blocks than a sequence may have, a full queue.
    fn check_request(&self, r: &Request) -> Result<(), RunError> {
        let n_vocab = self.model.config().n_vocab;
        if r.prompt.is_empty() {
            return Err(RunError::EmptyPrompt);
        }
        if let Some(&id) = r.prompt.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(RunError::TokenOutOfRange { id, n_vocab });
        }
        if let Some(&(id, _)) = r
            .sampler
            .logit_bias
            .iter()
            .find(|b| b.0 as usize >= n_vocab)
        {
            return Err(RunError::InvalidConfig(format!(
                "logit bias token id {id} is outside the vocabulary of {n_vocab} tokens"
            )));
        }
        if r.stop_strings.iter().any(|s| s.is_empty()) {
            return Err(RunError::InvalidConfig("a stop string is empty".into()));
        }
        if r.json_object && self.tokenizer.is_none() {
            return Err(RunError::InvalidConfig(
                "JSON mode needs a tokenizer, and this engine has none".into(),
            ));
        }
        if r.max_bytes == Some(0) {
            return Err(RunError::InvalidConfig(
                "max_bytes must be at least 1 (leave it unset for no cap)".into(),
            ));
        }
        let needed = r.prompt.len().checked_add(r.max_tokens);
        if needed.is_none_or(|n| n > self.config.n_ctx) {
            return Err(RunError::ContextOverflow {
                cached: 0,
                prompt_tokens: r.prompt.len(),
                max_tokens: r.max_tokens,
                n_ctx: self.config.n_ctx,
            });
        }
        let blocks = self.kv.blocks_for(r.prompt.len() + r.max_tokens);
        if blocks > self.kv.n_blocks() {
            return Err(RunError::Cache(KvError::OutOfBlocks {
                needed: blocks,
                available: self.kv.n_blocks(),
            }));
        }
        if self.waiting.len() >= self.config.max_queue {
            return Err(RunError::QueueFull {
                max_queue: self.config.max_queue,
            });
        }
        if r.speculation.is_some() && r.score_from.is_some() {
            return Err(RunError::InvalidConfig(
                "prompt scoring and speculative decoding do not mix".into(),
            ));
        }
        if let Some(spec) = &r.speculation {
            spec.validate()?;
            if spec.source == DraftSource::Model && self.draft.is_none() {
                return Err(RunError::InvalidConfig(
                    "draft-model speculation needs a draft model (--draft-model)".into(),
                ));
            }
        }
        Ok(())
    }

    /// Drops sequence `seq` (waiting or running) and frees its blocks; `false` if unknown.
    /// No event is reported for it.
    pub fn cancel(&mut self, seq: SeqId) -> bool {
        if let Some(i) = self.waiting.iter().position(|s| s.id == seq) {
            let s = self.waiting.remove(i).expect("index found");
            self.release(s);
            return true;
        }
        if let Some(i) = self.running.iter().position(|s| s.id == seq) {
            let s = self.running.remove(i);
            self.release(s);
            return true;
        }
        false
    }

    /// Ends sequence `seq` now, as if a stop rule fired: frees its blocks and returns the
    /// text it held back (a possible stop-string prefix, an incomplete character), which
    /// no token event carried. `None` if unknown.
    pub fn finish_early(&mut self, seq: SeqId) -> Option<String> {
        let tokenizer = self.tokenizer.clone();
        let s = self
            .running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .find(|s| s.id == seq)?;
        let mut flushed = s.stops.flush();
        if tokenizer.is_some() {
            flushed.push_str(&s.decoder.finish());
        }
        if let Some(cap) = s.max_bytes {
            truncate_at_char(&mut flushed, cap.saturating_sub(s.text_bytes));
        }
        self.cancel(seq);
        Some(flushed)
    }

    /// The error behind the [`EngineEvent::Failed`] of `seq`, once (the newest few
    /// failures are kept).
    pub fn take_failure(&mut self, seq: SeqId) -> Option<RunError> {
        let i = self.failures.iter().position(|f| f.0 == seq)?;
        self.failures.remove(i).map(|f| f.1)
    }

    /// `true` while any sequence waits or runs.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Current gauges and counters.
    pub fn metrics(&self) -> EngineMetrics {
        let usage = self.kv.usage();
        EngineMetrics {
            waiting: self.waiting.len(),
            running: self.running.len(),
            kv_blocks_used: usage.used,
            kv_blocks_free: usage.free + usage.cached,
            kv_blocks_total: usage.total,
            ..self.metrics
        }
    }

    /// Runs one forward pass over a batch chosen by the scheduler and returns what
    /// happened. With nothing to do it returns an empty list at once. A sequence that
    /// fails (it cannot fit in the pool even alone, or the forward pass failed) gets an
    /// [`EngineEvent::Failed`]; the engine goes on with the others.
    pub fn step(&mut self) -> Result<Vec<EngineEvent>, RunError> {
        let mut events = Vec::new();
        self.admit();
        let mut plan = self.schedule(&mut events);
        if plan.is_empty() {
            return Ok(events);
        }
        self.draft_with_model(&mut plan);
        self.metrics.steps_total += 1;
        self.metrics.last_batch_seqs = plan.len();
        self.metrics.last_batch_tokens = plan.iter().map(|p| p.n + p.drafts.len()).sum();
        let started = std::time::Instant::now();
        let result = self.run_batch(&plan);
        if plan.iter().all(|s| s.n == 1) {
            // A decode step; with guesses to check its rows cost more, by the model of
            // `VERIFY_ROW_COST`, which takes them back out.
            let widest = plan.iter().map(|s| s.drafts.len()).max().unwrap_or(0);
            let plain = started.elapsed().as_secs_f64() / (1.0 + VERIFY_ROW_COST * widest as f64);
            self.plain_step_s.add(plain);
        }
        if let Err(e) = result {
            // Fail the batch, keep the engine.
            let message = e.to_string();
            let ids: Vec<SeqId> = plan.iter().map(|p| self.running[p.index].id).collect();
            let mut first = Some(e);
            for id in ids {
                let error = first
                    .take()
                    .unwrap_or_else(|| RunError::Batch(message.clone()));
                self.fail(id, error, &mut events);
            }
            return Ok(events);
        }
        self.sample_batch(&plan, &mut events);
        Ok(events)
    }

    /// Moves waiting sequences to running, oldest first, while there is room.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_running {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            // Share the longest cached prefix; the last token is always computed, since
            // its logits are needed.
            // A scored prompt computes every row it scores.
            let mut table = if self.config.prefix_cache && seq.score_from.is_none() {
                self.kv.match_prefix(&seq.tokens, seq.tokens.len() - 1)
            } else {
                BlockTable::new()
            };
            let first_chunk = seq.pending_after(&table).min(self.config.prefill_chunk);
            let need = self.kv.blocks_for(table.len() + first_chunk) - table.blocks().len();
            if need > self.kv.available_blocks() && !self.running.is_empty() {
                self.kv.release(&mut table);
                break;
            }
            let mut seq = self.waiting.pop_front().expect("front exists");
            if seq.generated == 0 && seq.preemptions == 0 {
                seq.cached_prompt_tokens = table.len();
                self.metrics.prefix_hit_tokens_total += table.len() as u64;
            }
            seq.table = table;
            self.running.push(seq);
        }
    }

    /// Chooses this step's batch (one [`Slot`] per sequence), reserving its blocks
    /// (preempting, or failing a sequence that cannot fit even alone, as needed). A
    /// decoding sequence with speculation gets its n-gram drafts here, or room for the
    /// draft model's.
    fn schedule(&mut self, events: &mut Vec<EngineEvent>) -> Vec<Slot> {
        let mut budget = self.config.step_tokens;
        let mut plan: Vec<(SeqId, usize, Vec<u32>, usize)> = Vec::new();
        // Decoding sequences first, then prefill chunks, each group oldest first.
        let mut order: Vec<(SeqId, usize)> = self
            .running
            .iter()
            .filter(|s| s.pending() == 1)
            .map(|s| (s.id, 1))
            .collect();
        order.extend(
            self.running
                .iter()
                .filter(|s| s.pending() > 1)
                .map(|s| (s.id, s.pending().min(self.config.prefill_chunk))),
        );
        for (id, want) in order {
            if budget == 0 {
                break;
            }
            let n = want.min(budget);
            let (drafts, model_drafts) = self.drafts_for(id, n, budget - n);
            let extra = drafts.len().max(model_drafts);
            let ids: Vec<(SeqId, usize)> = plan.iter().map(|p| (p.0, p.1)).collect();
            if self.reserve_or_preempt(id, n + extra, &ids, events) {
                plan.push((id, n, drafts, model_drafts));
                budget -= n + extra;
            }
        }
        plan.into_iter()
            .filter_map(|(id, n, drafts, model_drafts)| {
                Some(Slot {
                    index: self.running.iter().position(|s| s.id == id)?,
                    n,
                    drafts,
                    model_drafts,
                })
            })
            .collect()
    }

    /// Drafts for sequence `id` when it decodes (`n == 1`): n-gram drafts now, or how
    /// many to ask of the draft model; at most `room` tokens of the step budget.
    fn drafts_for(&mut self, id: SeqId, n: usize, room: usize) -> (Vec<u32>, usize) {
        // A draft-model pass as a share of a plain decode step, once both are measured.
        let draft_cost = self
            .draft
            .as_ref()
            .filter(|_| self.config.weigh_draft_cost)
            .and_then(|d| Some(d.pass_s.get()? / self.plain_step_s.get()?));
        let Some(seq) = self.running.iter_mut().find(|s| s.id == id) else {
            return (Vec::new(), 0);
        };
        let decoding = n == 1 && seq.pending() == 1;
        let remaining = seq.max_tokens.saturating_sub(seq.generated);
        let Some(spec) = seq.spec.as_mut().filter(|_| decoding) else {
            return (Vec::new(), 0);
        };
        if !spec.take_turn() {
            return (Vec::new(), 0);
        }
        let k = spec.next_len(remaining).min(room);
        match spec.spec.source {
            DraftSource::Ngram => (spec.ngram_drafts(&seq.tokens, k), 0),
            DraftSource::Model => (Vec::new(), spec.model_draft_len(k, draft_cost)),
        }
    }

    /// Runs the draft model for every slot that asked for drafts: first it catches up
    /// on the sequence's tokens, then proposes its greedy choices one pass at a time,
    /// all sequences batched. A sequence whose draft rows do not fit goes without.
    fn draft_with_model(&mut self, plan: &mut [Slot]) {
        if self.draft.is_none() {
            return;
        }
        // Slots whose draft rows found no room or whose draft pass failed this step.
        let mut gave_up = vec![false; plan.len()];
        loop {
            let work = self.draft_work(plan, &gave_up);
            if work.is_empty() {
                return;
            }
            let work = self.reserve_draft_rows(work, plan, &mut gave_up);
            match self.draft_pass(&work) {
                Some(guesses) => {
                    for (w, guess) in work.iter().filter(|w| w.wants_logits).zip(guesses) {
                        plan[w.slot].drafts.push(guess);
                    }
                }
                None => {
                    // Drafting is only a guess: without it every slot decodes plainly.
                    for w in &work {
                        plan[w.slot].model_drafts = 0;
                        gave_up[w.slot] = true;
                    }
                }
            }
        }
    }

    /// What the draft model reads next for each slot of `plan` that wants draft-model
    /// drafts: a chunk of the tokens it has not seen, or its own last guess.
    fn draft_work(&self, plan: &[Slot], gave_up: &[bool]) -> Vec<DraftWork> {
        let chunk = self.config.prefill_chunk;
        let mut work = Vec::new();
        for (k, slot) in plan.iter().enumerate() {
            if gave_up[k] {
                continue;
            }
            let seq = &self.running[slot.index];
            let Some(spec) = seq.spec.as_ref() else {
                continue;
            };
            let (dl, len) = (spec.draft_table.len(), seq.tokens.len());
            let item = |tokens: &[u32], wants_logits: bool| DraftWork {
                slot: k,
                seq_index: slot.index,
                tokens: tokens.to_vec(),
                pos: dl,
                wants_logits,
            };
            if slot.n > 1 && spec.spec.source == DraftSource::Model {
                // A prompt chunk: the draft reads it in the same step, so that its
                // prefill counts as prompt processing rather than delaying the first
                // guesses. It stops short of the last token, which the first
                // guessing pass reads.
                let upto = (seq.table.len() + slot.n).min(len - 1);
                if dl < upto {
                    work.push(item(&seq.tokens[dl..upto.min(dl + chunk)], false));
                }
                continue;
            }
            if slot.drafts.len() >= slot.model_drafts {
                continue; // no draft-model drafts asked, or all there
            }
            if dl < len {
                let end = len.min(dl + chunk);
                work.push(item(&seq.tokens[dl..end], end == len));
            } else {
                let last = *slot.drafts.last().expect("caught up after one draft");
                work.push(item(&[last], true));
            }
        }
        work
    }

    /// Reserves the draft cache rows of `work`; a sequence that does not fit gives up its
    /// drafts for this step (and is left out of what is returned).
    fn reserve_draft_rows(
        &mut self,
        work: Vec<DraftWork>,
        plan: &mut [Slot],
        gave_up: &mut [bool],
    ) -> Vec<DraftWork> {
        let d = self.draft.as_mut().expect("a draft model");
        let mut ok = Vec::with_capacity(work.len());
        for w in work {
            let spec = self.running[w.seq_index]
                .spec
                .as_mut()
                .expect("speculation");
            match d.kv.reserve(&mut spec.draft_table, w.pos + w.tokens.len()) {
                Ok(()) => ok.push(w),
                Err(_) => {
                    d.kv.release(&mut spec.draft_table);
                    plan[w.slot].model_drafts = 0;
                    gave_up[w.slot] = true;
                }
            }
        }
        ok
    }

    /// One batched draft-model pass over `work` (rows reserved); the greedy guess of each
    /// item that wants logits, in order, or `None` when the pass failed.
    fn draft_pass(&mut self, work: &[DraftWork]) -> Option<Vec<u32>> {
        let d = self.draft.as_mut().expect("a draft model");
        let n_vocab = d.model.config().n_vocab;
        let rows: Vec<[usize; 1]> = work.iter().map(|w| [w.tokens.len() - 1]).collect();
        let mut tables: Vec<&mut BlockTable> = Vec::with_capacity(work.len());
        let mut slots: Vec<Option<&mut Sequence>> = self.running.iter_mut().map(Some).collect();
        let indices: Vec<usize> = work.iter().map(|w| w.seq_index).collect();
        for &i in &indices {
            let seq = slots[i].take().expect("one slot per sequence");
            tables.push(&mut seq.spec.as_mut().expect("speculation").draft_table);
        }
        let items: Vec<BatchItem<'_>> = work
            .iter()
            .zip(&rows)
            .map(|(w, row)| BatchItem {
                tokens: &w.tokens,
                pos: w.pos,
                logit_rows: if w.wants_logits { &row[..] } else { &[] },
                top_rows: &[],
                top: 1,
            })
            .collect();
        let mut batch = PagedBatch {
            pool: &mut d.kv,
            tables,
        };
        let guessing = items
            .iter()
            .all(|i| i.tokens.len() == 1 && !i.logit_rows.is_empty());
        let started = std::time::Instant::now();
        let result = d
            .model
            .forward_batch(&items, &mut batch, &mut d.state, &mut d.logits);
        if guessing {
            d.pass_s.add(started.elapsed().as_secs_f64());
        }
        result.ok()?;
        self.metrics.draft_model_tokens_total +=
            items.iter().map(|i| i.tokens.len() as u64).sum::<u64>();
        let n_guesses = work.iter().filter(|w| w.wants_logits).count();
        Some(
            (0..n_guesses)
                .map(|row| greedy_choice(&d.logits[row * n_vocab..(row + 1) * n_vocab]))
                .collect(),
        )
    }

    /// Reserves blocks for `n` more tokens of sequence `id`, preempting the newest
    /// sequences outside `plan` while blocks are short. `false` when it was not reserved
    /// (it was preempted itself, or failed).
    fn reserve_or_preempt(
        &mut self,
        id: SeqId,
        n: usize,
        plan: &[(SeqId, usize)],
        events: &mut Vec<EngineEvent>,
    ) -> bool {
        // Draft-model drafts come after this reservation; they are counted in `n`.
        loop {
            let Some(i) = self.running.iter().position(|s| s.id == id) else {
                return false;
            };
            let seq = &mut self.running[i];
            let new_len = seq.table.len() + n;
            match self.kv.reserve(&mut seq.table, new_len) {
                Ok(()) => return true,
                Err(KvError::OutOfBlocks { .. }) => {}
                Err(e) => {
                    self.fail(id, e.into(), events);
                    return false;
                }
            }
            // The newest running sequence that is not in the batch gives its blocks back.
            let victim = self
                .running
                .iter()
                .rposition(|s| s.id != id && !plan.iter().any(|p| p.0 == s.id));
            match victim {
                Some(v) => self.preempt(v),
                None if plan.is_empty() => {
                    let needed = self.kv.blocks_for(new_len);
                    let error = KvError::OutOfBlocks {
                        needed,
                        available: self.kv.n_blocks(),
                    };
                    self.fail(id, error.into(), events);
                    return false;
                }
                None => {
                    // Others run this step; wait for their blocks.
                    self.preempt(i);
                    return false;
                }
            }
        }
    }

    /// Frees the blocks of a sequence that leaves the engine.
    fn release(&mut self, mut seq: Sequence) -> Sequence {
        self.kv.release(&mut seq.table);
        if let (Some(spec), Some(d)) = (seq.spec.as_mut(), self.draft.as_mut()) {
            d.kv.release(&mut spec.draft_table);
        }
        seq
    }

    fn preempt(&mut self, index: usize) {
        let seq = self.running.remove(index);
        let mut seq = self.release(seq);
        seq.preemptions += 1;
        self.metrics.preemptions_total += 1;
        self.waiting.push_front(seq);
    }

    fn fail(&mut self, id: SeqId, error: RunError, events: &mut Vec<EngineEvent>) {
        self.cancel(id);
        events.push(EngineEvent::Failed {
            seq: id,
            error: error.to_string(),
        });
        if self.failures.len() == KEPT_FAILURES {
            self.failures.pop_front();
        }
        self.failures.push_back((id, error));
    }

    /// The forward pass of the batch `plan`; logits for the last row of every sequence
    /// whose tokens are then all in the cache, and for every draft row.
    fn run_batch(&mut self, plan: &[Slot]) -> Result<(), RunError> {
        let mut fed: Vec<Vec<u32>> = Vec::with_capacity(plan.len());
        let mut rows: Vec<(Vec<usize>, Vec<usize>, usize)> = Vec::with_capacity(plan.len());
        for slot in plan {
            let seq = &self.running[slot.index];
            let pos = seq.table.len();
            let mut toks = seq.tokens[pos..pos + slot.n].to_vec();
            toks.extend_from_slice(&slot.drafts);
            let finishes = pos + slot.n == seq.tokens.len() && seq.max_tokens > 0;
            // Rows scoring prompt targets (the row of position t−1 predicts token t), then
            // the rows that choose tokens (only their largest logit, when that decides).
            let mut want: Vec<usize> = seq
                .scored_targets(pos, slot.n)
                .map(|t| t - 1 - pos)
                .collect();
            let mut top_rows = Vec::new();
            let top = seq.bounded_top();
            if finishes {
                let first_gen = slot.n - 1;
                want.retain(|&r| r < first_gen);
                if top.is_some() {
                    top_rows.extend(first_gen..toks.len());
                } else {
                    want.extend(first_gen..toks.len());
                }
            }
            rows.push((want, top_rows, top.unwrap_or(1)));
            fed.push(toks);
        }
        let mut slots: Vec<Option<&mut Sequence>> = self.running.iter_mut().map(Some).collect();
        let mut items = Vec::with_capacity(plan.len());
        let mut tables = Vec::with_capacity(plan.len());
        for ((slot, toks), (want, top_rows, top)) in plan.iter().zip(&fed).zip(&rows) {
            let seq = slots[slot.index]
                .take()
                .expect("each sequence once per batch");
            items.push(BatchItem {
                tokens: toks,
                pos: seq.table.len(),
                logit_rows: want,
                top_rows,
                top: *top,
            });
            tables.push(&mut seq.table);
        }
        let mut batch = PagedBatch {
            pool: &mut self.kv,
            tables,
        };
        self.model
            .forward_batch(&items, &mut batch, &mut self.state, &mut self.logits)?;
        Ok(())
    }

    /// Samples the next token of every sequence in `plan` that has logits — with drafts,
    /// one token per row until a sampled token differs from its draft — applies the stop
    /// rules, rolls rejected draft rows back and registers full blocks in the prefix cache.
    fn sample_batch(&mut self, plan: &[Slot], events: &mut Vec<EngineEvent>) {
        let mut finished: Vec<(SeqId, StopReason, String)> = Vec::new();
        let mut failed: Vec<(SeqId, RunError)> = Vec::new();
        let jobs = self.score_prompts(plan, events, &mut finished, &mut failed);
        let outcomes = self.verify_all(plan, &jobs);
        for (&(k, _), v) in jobs.iter().zip(outcomes) {
            let slot = &plan[k];
            let id = self.running[slot.index].id;
            self.metrics.generated_tokens_total += v.events.len() as u64;
            events.extend(v.events);
            match v.end {
                Some(Ok((reason, flushed))) => {
                    finished.push((id, reason, flushed));
                    continue;
                }
                Some(Err(e)) => {
                    failed.push((id, e));
                    continue;
                }
                None => {}
            }
            let seq = &mut self.running[slot.index];
            // Rows of rejected drafts go; the cache ends before the new unfed token.
            self.kv.truncate(&mut seq.table, v.base + v.kept);
            if let Some(spec) = seq.spec.as_mut() {
                if !slot.drafts.is_empty() {
                    spec.record(slot.drafts.len(), v.kept);
                }
                if let Some(d) = self.draft.as_mut() {
                    let valid = spec.draft_table.len().min(v.base + v.kept);
                    d.kv.truncate(&mut spec.draft_table, valid);
                }
            }
            self.register(slot.index);
        }
        self.finish(finished, failed, events);
    }

    /// Removes the sequences that ended this step, reporting `Done` or `Failed`.
    fn finish(
        &mut self,
        finished: Vec<(SeqId, StopReason, String)>,
        failed: Vec<(SeqId, RunError)>,
        events: &mut Vec<EngineEvent>,
    ) {
        for (id, reason, flushed) in finished {
            if let Some(i) = self.running.iter().position(|s| s.id == id) {
                let seq = self.running.remove(i);
                let seq = self.release(seq);
                self.metrics.drafted_tokens_total += seq.usage().drafted_tokens as u64;
                self.metrics.accepted_tokens_total += seq.usage().accepted_tokens as u64;
                events.push(EngineEvent::Done {
                    seq: id,
                    reason,
                    usage: seq.usage(),
                    flushed,
                });
            }
        }
        for (id, error) in failed {
            self.fail(id, error, events);
        }
    }

    /// The first pass over a step's logits: prompt scores (and their failures), the
    /// sequences still prefilling (their blocks registered), those with nothing to
    /// generate (finished), and the jobs `(slot, where its rows are)` that choose tokens.
    fn score_prompts(
        &mut self,
        plan: &[Slot],
        events: &mut Vec<EngineEvent>,
        finished: &mut Vec<(SeqId, StopReason, String)>,
        failed: &mut Vec<(SeqId, RunError)>,
    ) -> Vec<(usize, RowsAt)> {
        let n_vocab = self.model.config().n_vocab;
        // Prompt scores, and which slots choose tokens from which rows: logits rows, or
        // the LM head's choices for top rows (in the order `run_batch` asked).
        let mut jobs: Vec<(usize, RowsAt)> = Vec::new();
        let (mut row, mut choice) = (0, 0);
        for (k, slot) in plan.iter().enumerate() {
            let seq = &mut self.running[slot.index];
            // The chunk started where the cache ends now, less what this step added.
            let pos = seq.table.len() - slot.n - slot.drafts.len();
            let caught_up = seq.table.len() >= seq.tokens.len();
            let gen_rows = if caught_up && seq.max_tokens > 0 {
                slot.drafts.len() + 1
            } else {
                0
            };
            let targets = seq.scored_targets(pos, slot.n);
            let at = if seq.bounded_top().is_some() {
                RowsAt::Choices(choice)
            } else {
                RowsAt::Logits(row)
            };
            let skip_gen = |row: &mut usize, choice: &mut usize| match at {
                RowsAt::Choices(_) => *choice += gen_rows,
                RowsAt::Logits(_) => *row += gen_rows,
            };
            if !targets.is_empty() {
                seq.scored_upto = targets.end;
                let n = targets.len();
                let logits = &self.logits[row * n_vocab..(row + n) * n_vocab];
                row += n;
                match score_targets(&self.model, logits, &seq.tokens[targets.clone()]) {
                    Ok(nll) => events.push(EngineEvent::PromptScores {
                        seq: seq.id,
                        first: targets.start,
                        nll,
                    }),
                    Err((i, token, value)) => {
                        let position = targets.start + i - 1;
                        let error = RunError::NonFiniteLogits {
                            position,
                            token,
                            value,
                        };
                        failed.push((seq.id, error));
                        skip_gen(&mut row, &mut choice);
                        continue;
                    }
                }
            }
            if !caught_up {
                self.register(slot.index);
                continue; // mid-prefill: no logits this step
            }
            if seq.max_tokens == 0 {
                finished.push((seq.id, StopReason::MaxTokens, String::new()));
                continue;
            }
            // The generation rows follow the scoring rows.
            let at = match at {
                RowsAt::Logits(_) => RowsAt::Logits(row),
                at => at,
            };
            jobs.push((k, at));
            skip_gen(&mut row, &mut choice);
        }
        jobs
    }

    /// Chooses the tokens of every job `(slot, first logits row)`, the sequences spread
    /// over the model's pool (each sequence's tokens are chosen in order by one thread,
    /// with its own sampler, so the split never shows). Outcomes in job order.
    fn verify_all(&mut self, plan: &[Slot], jobs: &[(usize, RowsAt)]) -> Vec<Verified> {
        let n_vocab = self.model.config().n_vocab;
        let tokenizer = self.tokenizer.as_deref();
        let logits = &self.logits;
        let choices = self.state.head_choices();
        let mut seqs: Vec<Option<&mut Sequence>> = self.running.iter_mut().map(Some).collect();
        let mut work: Vec<VerifyJob<'_>> = jobs
            .iter()
            .map(|&(k, at)| {
                let slot = &plan[k];
                let seq = seqs[slot.index].take().expect("one slot per sequence");
                let n = slot.drafts.len() + 1;
                let rows = match at {
                    RowsAt::Logits(row) => {
                        JobRows::Logits(&logits[row * n_vocab..(row + n) * n_vocab])
                    }
                    RowsAt::Choices(c) => JobRows::Choices(&choices[c..c + n], logits),
                };
                (seq, &slot.drafts[..], rows, None)
            })
            .collect();
        let pool = self.model.pool();
        if self.sample_bufs.len() < pool.n_threads() {
            self.sample_bufs.resize_with(pool.n_threads(), Vec::new);
        }
        let bufs = &mut self.sample_bufs[..pool.n_threads()];
        let run = |buf: &mut Vec<f32>, item: &mut VerifyJob<'_>, facts: Option<&[RowFacts]>| {
            item.3 = Some(verify(
                item.0, item.1, item.2, n_vocab, tokenizer, buf, facts,
            ));
        };
        let single_logits = match &work[..] {
            [(_, _, JobRows::Logits(rows), _)] => Some(*rows),
            _ => None,
        };
        if let Some(rows) = single_logits {
            // One sequence: its rows' facts on every thread first (the tokens are then
            // chosen in order on this one); with several, each thread takes sequences.
            let item = &mut work[0];
            let facts = (!item.1.is_empty() && pool.n_threads() > 1).then(|| {
                let seq = &*item.0;
                let mut facts: Vec<RowFacts> =
                    (0..=item.1.len()).map(|_| RowFacts::default()).collect();
                let mut no_state = vec![(); pool.n_threads()];
                pool.parallel_chunks_mut(&mut facts, 1, 1, &mut no_state, |_, r, out| {
                    for (i, f) in r.zip(out.iter_mut()) {
                        *f = RowFacts::of(seq, &rows[i * n_vocab..(i + 1) * n_vocab]);
                    }
                });
                facts
            });
            run(&mut bufs[0], item, facts.as_deref());
        } else {
            pool.parallel_chunks_mut(&mut work, 1, 1, bufs, |buf, _, items| {
                for item in items {
                    run(buf, item, None);
                }
            });
        }
        work.into_iter()
            .map(|w| w.3.expect("every job ran"))
            .collect()
    }
    /// Files the full committed blocks of `running[index]` in the prefix cache.
    fn register(&mut self, index: usize) {
        if self.config.prefix_cache {
            let seq = &mut self.running[index];
            self.kv.register(&mut seq.table, &seq.tokens);
        }
    }
}

/// `-log softmax(row)[target]` (f64) for each logits row and its target, spread over the
/// model's pool; the first row whose value is not finite is an error `(row, token,
/// logit)`.
fn score_targets(
    model: &Model,
    logits: &[f32],
    targets: &[u32],
) -> Result<Vec<f64>, (usize, u32, f32)> {
    let n_vocab = model.config().n_vocab;
    let mut nll = vec![0f64; targets.len()];
    let mut states = vec![(); model.threads()];
    model
        .pool()
        .parallel_chunks_mut(&mut nll, 1, 8, &mut states, |_, range, part| {
            for (r, slot) in range.zip(part.iter_mut()) {
                *slot = token_nll(&logits[r * n_vocab..(r + 1) * n_vocab], targets[r]);
            }
        });
    if let Some(r) = nll.iter().position(|v| !v.is_finite()) {
        let row = &logits[r * n_vocab..(r + 1) * n_vocab];
        // Finite logits can still give an infinite NLL (a target far below the rest).
        let (token, value) = row
            .iter()
            .enumerate()
            .find(|(_, l)| !l.is_finite())
            .map_or((0, row[0]), |(t, &l)| (t as u32, l));
        return Err((r, token, value));
    }
    Ok(nll)
}

/// `-log softmax(logits)[target]` in f64: `max + ln Σ exp(l - max) - l[target]`.
pub fn token_nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    max + sum.ln() - logits[target as usize] as f64
}

/// The highest logit (lowest id on ties): the draft model's guess.
fn greedy_choice(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sequence {
    /// Tokens still to compute if `table` held this sequence's cached rows.
    fn pending_after(&self, table: &BlockTable) -> usize {
        self.tokens.len() - table.len()
    }
}

/// One sequence's token choice in [`Engine::verify_all`]: the sequence, its drafts, its
/// rows and the outcome.
type VerifyJob<'a> = (&'a mut Sequence, &'a [u32], JobRows<'a>, Option<Verified>);

/// Where a job's rows are in a step's output: logits rows from the first given, or the
/// LM head's choices for top rows ([`ForwardState::head_choices`]) from the first given.
#[derive(Debug, Clone, Copy)]
enum RowsAt {
    Logits(usize),
    Choices(usize),
}

/// A job's rows: its logits (`[n, n_vocab]`), or its head choices together with the
/// step's logits (which hold the rows of `HeadChoice::Logits`).
#[derive(Debug, Clone, Copy)]
enum JobRows<'a> {
    Logits(&'a [f32]),
    Choices(&'a [HeadChoice], &'a [f32]),
}

impl<'a> JobRows<'a> {
    /// Row `i`'s logits (empty where only candidates exist) and its facts (`facts`
    /// where precomputed). A row of candidates gets its token here, from the sequence's
    /// sampler at the position the token will take (what `sample_one` would draw).
    fn row(
        &self,
        i: usize,
        n_vocab: usize,
        seq: &mut Sequence,
        facts: Option<&[RowFacts]>,
    ) -> (&'a [f32], RowFacts) {
        let logits = match *self {
            JobRows::Logits(rows) => &rows[i * n_vocab..(i + 1) * n_vocab],
            JobRows::Choices(choices, all) => match &choices[i] {
                HeadChoice::Candidates(cands) => {
                    let position = seq.tokens.len() as u64;
                    let choice = seq.sampler.sample_among_at(cands, position);
                    let facts = RowFacts {
                        choice: Some(choice),
                        ..RowFacts::default()
                    };
                    return (&[], facts);
                }
                &HeadChoice::Logits(j) => &all[j * n_vocab..(j + 1) * n_vocab],
            },
        };
        match facts {
            Some(f) => (logits, f[i].clone()),
            None => (logits, RowFacts::of(seq, logits)),
        }
    }
}

/// What one logits row says before its token is chosen: the first non-finite logit,
/// the log-sum-exp of the log-probability, and the token itself when the sampler's
/// choice depends on nothing but the row. Pure functions of the row (and the
/// sampler's settings), so they may be worked out on any thread in any order.
#[derive(Debug, Clone, Default)]
struct RowFacts {
    non_finite: Option<usize>,
    lse: Option<f64>,
    choice: Option<Result<u32, nx_sampler::SamplerError>>,
}

impl RowFacts {
    fn of(seq: &Sequence, logits: &[f32]) -> RowFacts {
        let sampler = &seq.sampler;
        let non_finite = first_non_finite(logits);
        if non_finite.is_some() {
            // `sample_one` stops at the error; nothing else is needed.
            return RowFacts {
                non_finite,
                ..RowFacts::default()
            };
        }
        RowFacts {
            non_finite,
            lse: if seq.token_logprobs {
                log_sum_exp(logits)
            } else {
                None
            },
            // JSON mode's mask decides too: the row alone does not.
            choice: seq
                .json
                .is_none()
                .then(|| sampler.stateless_choice(logits))
                .flatten(),
        }
    }
}

/// The index of the first NaN or infinite logit: sixteen at a time, then within the
/// chunk that holds it (a plain search stops at each element and stays scalar).
fn first_non_finite(logits: &[f32]) -> Option<usize> {
    const LANES: usize = 16;
    let chunk = logits
        .chunks(LANES)
        .position(|c| c.iter().fold(false, |hit, l| hit | !l.is_finite()))?;
    let within = logits[chunk * LANES..]
        .iter()
        .position(|l| !l.is_finite())?;
    Some(chunk * LANES + within)
}

/// What choosing one step's tokens did to a sequence.
struct Verified {
    /// Token events, in order.
    events: Vec<EngineEvent>,
    /// `Some` when the sequence ended (a stop rule, or an error).
    end: Option<Result<(StopReason, String), RunError>>,
    /// Position of the first token chosen now, and how many drafts were kept.
    base: usize,
    kept: usize,
}

/// Chooses tokens for `seq` from `rows` (one logits row for its last token, then one per
/// draft): one token per row, in order, until a chosen token differs from its draft or
/// a stop rule fires — exactly the tokens plain decoding would choose.
fn verify(
    seq: &mut Sequence,
    drafts: &[u32],
    rows: JobRows<'_>,
    n_vocab: usize,
    tokenizer: Option<&Tokenizer>,
    buf: &mut Vec<f32>,
    facts: Option<&[RowFacts]>,
) -> Verified {
    let base = seq.tokens.len();
    let mut v = Verified {
        events: Vec::new(),
        end: None,
        base,
        kept: 0,
    };
    for i in 0..=drafts.len() {
        let (logits, fact) = rows.row(i, n_vocab, seq, facts);
        match sample_one(seq, tokenizer, logits, fact, buf) {
            Ok(Sampled::Continue(event)) => v.events.push(event),
            Ok(Sampled::Finished(event, reason, flushed)) => {
                v.events.extend(event);
                v.end = Some(Ok((reason, flushed)));
                return v;
            }
            Err(e) => {
                v.end = Some(Err(e));
                return v;
            }
        }
        if i < drafts.len() && seq.tokens.last() == Some(&drafts[i]) {
            v.kept += 1;
        } else {
            break;
        }
    }
    v
}

/// The token JSON mode lets `sampler` choose from `logits` at `position`: the draw over
/// the row with every token `json` refuses at `−∞`. A greedy sampler's best token of the
/// whole row is that draw whenever `json` allows it (it is then the highest allowed
/// logit, lowest id on ties), which spares most tokens the pass over the vocabulary.
fn json_choice(
    sampler: &mut Sampler,
    json: &JsonMode,
    tokenizer: &Tokenizer,
    (logits, buf): (&[f32], &mut Vec<f32>),
    position: u64,
) -> Result<u32, RunError> {
    if sampler.config().is_greedy() {
        buf.clear();
        buf.extend_from_slice(logits);
        let best = sampler.sample_at(buf, position)?;
        if json.state.allows(tokenizer, best) {
            return Ok(best);
        }
    }
    buf.clear();
    buf.extend_from_slice(logits);
    json.state.mask(&json.vocab, tokenizer, buf);
    match sampler.sample_at(buf, position) {
        Err(nx_sampler::SamplerError::NoFiniteLogits { .. }) => Err(RunError::NoJsonToken),
        chosen => Ok(chosen?),
    }
}

/// Samples one token from `logits` for `seq` and applies the stop rules, exactly as the
/// runner's decode loop does (same sampler calls in the same order, same text rules).
fn sample_one(
    seq: &mut Sequence,
    tokenizer: Option<&Tokenizer>,
    logits: &[f32],
    facts: RowFacts,
    sample_buf: &mut Vec<f32>,
) -> Result<Sampled, RunError> {
    if let Some(i) = facts.non_finite {
        return Err(RunError::NonFiniteLogits {
            position: seq.table.len().saturating_sub(1),
            token: i as u32,
            value: logits[i],
        });
    }
    let top = if seq.logprobs > 0 {
        log_softmax_top(logits, seq.logprobs)
    } else {
        Vec::new()
    };
    // The draw is keyed by the position the token will take.
    let position = seq.tokens.len() as u64;
    let id = match (facts.choice, &seq.json, tokenizer) {
        (Some(choice), _, _) => choice?,
        (None, Some(json), Some(tok)) => {
            json_choice(&mut seq.sampler, json, tok, (logits, sample_buf), position)?
        }
        (None, _, _) => {
            sample_buf.clear();
            sample_buf.extend_from_slice(logits);
            seq.sampler.sample_at(sample_buf, position)?
        }
    };
    if let (Some(json), Some(tok)) = (&mut seq.json, tokenizer) {
        json.state.accept(tok, id);
    }
    seq.sampler.accept(id);
    let logprob = if seq.token_logprobs {
        log_prob_given(logits, id, facts.lse).unwrap_or(f32::NEG_INFINITY)
    } else {
        f32::NAN
    };
    if seq.generated == 0 {
        seq.ttft_ms = seq.submitted.elapsed().as_secs_f64() * 1e3;
    }
    if !seq.ignore_eos && tokenizer.is_some_and(|t| t.is_eog(id)) {
        let mut flushed = seq.stops.flush();
        flushed.push_str(&seq.decoder.finish());
        if let Some(cap) = seq.max_bytes {
            truncate_at_char(&mut flushed, cap.saturating_sub(seq.text_bytes));
        }
        return Ok(Sampled::Finished(None, StopReason::Eos, flushed));
    }
    seq.generated += 1;
    seq.tokens.push(id);
    let (text, stop) = release_text(seq, tokenizer, id)?;
    let event = EngineEvent::Token {
        seq: seq.id,
        id,
        text,
        logprob,
        top,
    };
    Ok(match stop {
        Some(reason) => Sampled::Finished(Some(event), reason, String::new()),
        None => Sampled::Continue(event),
    })
}

/// The text token `id` (just appended to `seq`) releases, and why the sequence stops
/// there if it does: a stop string, the byte cap or the token limit. Control tokens
/// print nothing; the last allowed token flushes what the decoder and the stop matcher
/// held back.
fn release_text(
    seq: &mut Sequence,
    tokenizer: Option<&Tokenizer>,
    id: u32,
) -> Result<(String, Option<StopReason>), RunError> {
    let last_allowed = seq.generated == seq.max_tokens;
    let is_control = match tokenizer {
        Some(t) => t.is_control(id)?,
        None => false,
    };
    let mut piece = match tokenizer {
        Some(t) if !is_control => seq.decoder.push(t, id)?,
        _ => String::new(),
    };
    if last_allowed && tokenizer.is_some() {
        piece.push_str(&seq.decoder.finish());
    }
    let mut cap_hit = false;
    if let Some(cap) = seq.max_bytes {
        if seq.text_bytes + piece.len() >= cap {
            truncate_at_char(&mut piece, cap - seq.text_bytes);
            cap_hit = true;
        }
    }
    seq.text_bytes += piece.len();
    let (text, stop) = match seq.stops.push(&piece) {
        Released::Stopped(before) => (before, Some(StopReason::StopString)),
        Released::Text(mut out) if cap_hit || last_allowed => {
            out.push_str(&seq.stops.flush());
            let r = if cap_hit {
                StopReason::MaxBytes
            } else {
                StopReason::MaxTokens
            };
            (out, Some(r))
        }
        Released::Text(out) => (out, None),
    };
    Ok((text, stop))
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
pub(crate) fn truncate_at_char(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
}

/// What the draft model reads for one slot in one pass.
struct DraftWork {
    /// The slot's index in the step's plan.
    slot: usize,
    /// Its sequence's index in `running`.
    seq_index: usize,
    /// The tokens to feed, from position `pos`.
    tokens: Vec<u32>,
    pos: usize,
    /// Whether its last row's logits give a guess.
    wants_logits: bool,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_chunked_search_finds_the_first_non_finite_logit() {
        for n in [0usize, 1, 15, 16, 17, 40] {
            for bad in 0..=n {
                for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut logits = vec![0.5f32; n];
                    if bad < n {
                        logits[bad] = value;
                        if bad + 3 < n {
                            logits[bad + 3] = f32::NAN;
                        }
                    }
                    let want = logits.iter().position(|l| !l.is_finite());
                    assert_eq!(super::first_non_finite(&logits), want, "n {n} bad {bad}");
                }
            }
        }
    }
}
