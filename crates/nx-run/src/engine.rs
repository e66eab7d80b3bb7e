//! `Engine`: many sequences, one batched forward pass per step, continuous batching.
//!
//! API (implementation in progress; the types are stable):
//! `Engine::new(model, tokenizer, EngineConfig)`, `submit(Request) -> SeqId`,
//! `step() -> Vec<EngineEvent>`, `cancel(SeqId)`, `has_work()`, `metrics()`.

use std::sync::Arc;

use nx_bpe::Tokenizer;
use nx_kv_cache::KvDtype;
use nx_llama_stack::Model;
use nx_sampler::SamplerConfig;

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
        }
    }
}

/// One generation request: prompt ids and how to generate.
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
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Cap on output bytes (`None`: no cap).
    pub max_bytes: Option<usize>,
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
}

/// The step-wise engine; see the module docs.
pub struct Engine {
    _model: Arc<Model>,
    _tokenizer: Option<Arc<Tokenizer>>,
    _config: EngineConfig,
}

impl Engine {
    /// An engine over `model`, with its KV block pool allocated.
    pub fn new(
        model: Arc<Model>,
        tokenizer: Option<Arc<Tokenizer>>,
        config: EngineConfig,
    ) -> Result<Engine, RunError> {
        Ok(Engine {
            _model: model,
            _tokenizer: tokenizer,
            _config: config,
        })
    }

    /// Queues `request`; errors (empty prompt, token out of range, prompt +
    /// `max_tokens` beyond `n_ctx`, queue full, bad sampler settings) leave nothing queued.
    pub fn submit(&mut self, _request: Request) -> Result<SeqId, RunError> {
        todo!("engine in progress")
    }

    /// Runs one forward pass over a batch chosen by the scheduler and returns what
    /// happened. With nothing to do it returns an empty list at once.
    pub fn step(&mut self) -> Result<Vec<EngineEvent>, RunError> {
        todo!("engine in progress")
    }

    /// Drops sequence `seq` (waiting or running) and frees its blocks; `false` if unknown.
    /// No event is reported for it.
    pub fn cancel(&mut self, _seq: SeqId) -> bool {
        todo!("engine in progress")
    }

    /// `true` while any sequence waits or runs.
    pub fn has_work(&self) -> bool {
        todo!("engine in progress")
    }

    /// Current gauges and counters.
    pub fn metrics(&self) -> EngineMetrics {
        todo!("engine in progress")
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self._model
    }

    /// The tokenizer, if any.
    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self._tokenizer.as_ref()
    }

    /// The settings in use.
    pub fn config(&self) -> &EngineConfig {
        &self._config
    }
}
