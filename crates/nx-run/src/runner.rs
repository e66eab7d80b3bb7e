//! `Runner`: one sequence at a time over a one-slot [`Engine`]; events and stats.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nx_bpe::{EncodeOptions, Tokenizer};
use nx_llama_stack::Model;
use nx_sampler::Sampler;

use crate::engine::{Engine, EngineConfig, EngineEvent, Request, SeqId};
use crate::{Prompt, RunConfig, RunError};

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    Eos,
    /// `max_tokens` tokens were generated.
    MaxTokens,
    /// The output reached `max_bytes`.
    MaxBytes,
    /// The output reached a stop string.
    StopString,
    /// The event callback asked to stop.
    Callback,
}

impl StopReason {
    /// The short name used in JSON output (`"eos"`, `"max_tokens"`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::MaxTokens => "max_tokens",
            StopReason::MaxBytes => "max_bytes",
            StopReason::StopString => "stop_string",
            StopReason::Callback => "callback",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Counts and timings of one generation.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stats {
    /// Tokens prefilled by this call (the new prompt tokens, plus the last token of the
    /// previous generation when continuing).
    pub prompt_tokens: usize,
    /// Tokens emitted as [`Event::Token`] (an end-of-generation token is not counted).
    pub generated_tokens: usize,
    /// Single-token forward passes of the decode phase (each followed by sampling).
    pub decode_steps: usize,
    /// Wall time of the prefill forward passes.
    pub prefill_secs: f64,
    /// Wall time of the decode steps (forward pass and sampling), excluding the
    /// callback and the sampling of the first token.
    pub decode_secs: f64,
    /// `prompt_tokens / prefill_secs` (0 when nothing was timed).
    pub prompt_tps: f64,
    /// Tokens chosen by the decode steps (every generated token after the first, and an
    /// end-of-generation token that ended the run) per second of `decode_secs`; without
    /// speculation that is `decode_steps / decode_secs` (0 when nothing was timed).
    pub gen_tps: f64,
    /// Milliseconds from the start of the call (after validation and encoding) to the
    /// first token being chosen: prefill plus one sampling (0 when no token was sampled).
    pub ttft_ms: f64,
    /// Draft tokens verified (speculative decoding).
    pub drafted_tokens: usize,
    /// Of those, tokens kept.
    pub accepted_tokens: usize,
}

/// What the runner reports while generating.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// One generated token.
    Token {
        /// The token id.
        id: u32,
        /// Output text released with this token: complete UTF-8 characters only, with
        /// any tail that might start a stop string held back (so it may be empty, or
        /// include text of earlier tokens). Control tokens add no text. Empty without
        /// a tokenizer.
        text: String,
        /// Log-probability of `id` under the model's distribution (raw logits, before
        /// penalties, temperature and filters); NaN unless [`crate::RunConfig::token_logprobs`].
        logprob: f32,
        /// The `logprobs` most likely tokens with their log-probabilities, best first
        /// (same distribution as `logprob`).
        top: Vec<(u32, f32)>,
    },
    /// The generation ended.
    Done {
        reason: StopReason,
        stats: Stats,
        /// Text held back until the end (a possible stop-string prefix, or an incomplete
        /// UTF-8 character rendered as U+FFFD) that no `Token` event carried. Usually
        /// empty.
        flushed: String,
    },
}

/// The result of one [`Runner::generate`] or [`Runner::continue_with`] call.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub reason: StopReason,
    pub stats: Stats,
    /// The emitted token ids, in order.
    pub tokens: Vec<u32>,
}

/// Generates from one model for one sequence at a time.
///
/// The sequence is every token fed so far, plus (after a generation that stopped on
/// anything but an end-of-generation token) the last emitted token, which is fed at the
/// start of the next [`Runner::continue_with`]. An end-of-generation token that ended a
/// generation is not part of the sequence: chat templates write their own end-of-turn
/// marker.
///
/// A runner is an [`Engine`] with one sequence: every generation is a request to it, so
/// `nx run`, `nx chat` and `nx serve` share one decode loop. A continuation is a request
/// for the whole sequence; its rows come back from the engine's prefix cache (whole
/// blocks), so only the tail is computed again.
pub struct Runner {
    engine: Engine,
    config: RunConfig,
    /// The sequence: fed tokens, then the unfed last token when `unfed`.
    tokens: Vec<u32>,
    unfed: bool,
}

impl Runner {
    /// A runner for `model`, with `tokenizer` for text prompts, output text and
    /// end-of-generation detection (without one, prompts must be ids, output text is
    /// empty and only `max_tokens`, `max_bytes` and the callback stop a generation).
    /// Allocates the KV blocks for `config.n_ctx` positions.
    pub fn new(
        model: Arc<Model>,
        tokenizer: Option<Arc<Tokenizer>>,
        config: RunConfig,
    ) -> Result<Runner, RunError> {
        config.validate()?;
        Sampler::new(config.sampler.clone())?;
        let block_size = 16;
        let n_blocks = config.n_ctx.div_ceil(block_size) as u64 + 1;
        let engine_config = EngineConfig {
            n_ctx: config.n_ctx,
            kv_dtype: config.kv_dtype,
            kv_memory_bytes: model.kv_bytes_per_position(config.kv_dtype)
                * block_size as u64
                * n_blocks,
            block_size,
            max_running: 1,
            step_tokens: config.prefill_chunk,
            prefill_chunk: config.prefill_chunk,
            prefix_cache: config.prefix_cache,
            max_queue: 1,
            weigh_draft_cost: true,
        };
        Ok(Runner {
            engine: Engine::new(model, tokenizer, engine_config)?,
            config,
            tokens: Vec::new(),
            unfed: false,
        })
    }

    /// Adds a draft model for `DraftSource::Model` speculation (same vocabulary; see
    /// [`Engine::with_draft_model`]).
    pub fn with_draft_model(mut self, draft: Arc<Model>) -> Result<Runner, RunError> {
        self.engine = self.engine.with_draft_model(draft)?;
        Ok(self)
    }

    /// The settings in use.
    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    /// The model.
    pub fn model(&self) -> &Model {
        self.engine.model()
    }

    /// The tokenizer, if any.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.engine.tokenizer().map(|t| &**t)
    }

    /// Positions a sequence may hold.
    pub fn n_ctx(&self) -> usize {
        self.config.n_ctx
    }

    /// The sequence so far: the tokens fed to the model, then the last emitted token if
    /// it has not been fed yet.
    pub fn tokens(&self) -> Vec<u32> {
        self.tokens.clone()
    }

    /// Number of positions the model has computed for the sequence.
    pub fn cached_len(&self) -> usize {
        self.tokens.len() - usize::from(self.unfed)
    }

    /// Changes how many tokens the next generations may emit.
    pub fn set_max_tokens(&mut self, max_tokens: usize) {
        self.config.max_tokens = max_tokens;
    }

    /// Changes the stop strings of the next generations.
    pub fn set_stop_strings(&mut self, stop_strings: Vec<String>) -> Result<(), RunError> {
        if stop_strings.iter().any(|s| s.is_empty()) {
            return Err(RunError::InvalidConfig("a stop string is empty".into()));
        }
        self.config.stop_strings = stop_strings;
        Ok(())
    }

    /// Forgets the sequence. The KV blocks stay allocated (and cached for reuse).
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.unfed = false;
    }

    /// Keeps only the first `n` tokens of [`Runner::tokens`] (e.g. to re-use the common
    /// prefix of an edited conversation). The penalty window of the next generation is
    /// built from the kept tokens, and each draw depends only on the seed and position.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.tokens.len() {
            return;
        }
        self.tokens.truncate(n);
        self.unfed = false;
    }

    /// Encodes `text` with the tokenizer (`add_special`: BOS/EOS as the vocabulary
    /// asks; `parse_special` from the config).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, RunError> {
        let tok = self.tokenizer().ok_or(RunError::NoTokenizer)?;
        Ok(tok.encode(
            text,
            EncodeOptions {
                add_special,
                parse_special: self.config.parse_special,
            },
        )?)
    }

    /// Starts a new sequence from `prompt` (forgetting any previous one, as
    /// [`Runner::reset`]) and generates, reporting each token and the end to
    /// `on_event`.
    pub fn generate(
        &mut self,
        prompt: Prompt,
        mut on_event: impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Completion, RunError> {
        self.reset();
        let ids = self.prompt_ids(prompt)?;
        self.run(ids, &mut on_event)
    }

    /// Appends `more` to the current sequence (computing only the new tokens, plus the
    /// previous generation's last token if it was not fed yet, and what the prefix cache
    /// no longer holds) and generates. A text prompt gets BOS only if the sequence is
    /// empty. With an empty sequence this is [`Runner::generate`] without the reset.
    pub fn continue_with(
        &mut self,
        more: Prompt,
        mut on_event: impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Completion, RunError> {
        let ids = self.prompt_ids(more)?;
        self.run(ids, &mut on_event)
    }

    fn prompt_ids(&self, prompt: Prompt) -> Result<Vec<u32>, RunError> {
        match prompt {
            Prompt::Ids(ids) => Ok(ids),
            Prompt::Text(text) => {
                let fresh = self.tokens.is_empty();
                self.encode(&text, self.config.add_special && fresh)
            }
        }
    }

    /// Checks a generation of `new_tokens` before any work: the same errors, with the
    /// same numbers, whatever the engine would say.
    fn validate(&self, new_tokens: &[u32]) -> Result<(), RunError> {
        let n_vocab = self.model().config().n_vocab;
        let feed = usize::from(self.unfed) + new_tokens.len();
        if feed == 0 {
            return Err(RunError::EmptyPrompt);
        }
        if let Some(&id) = new_tokens.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(RunError::TokenOutOfRange { id, n_vocab });
        }
        let cached = self.cached_len();
        let max_tokens = self.config.max_tokens;
        let needed = cached
            .checked_add(feed)
            .and_then(|n| n.checked_add(max_tokens));
        if needed.is_none_or(|n| n > self.config.n_ctx) {
            return Err(RunError::ContextOverflow {
                cached,
                prompt_tokens: feed,
                max_tokens,
                n_ctx: self.config.n_ctx,
            });
        }
        Ok(())
    }

    fn run(
        &mut self,
        new_tokens: Vec<u32>,
        on_event: &mut dyn FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Completion, RunError> {
        self.validate(&new_tokens)?;
        let prompt_tokens = usize::from(self.unfed) + new_tokens.len();
        let mut sequence = self.tokens.clone();
        sequence.extend_from_slice(&new_tokens);
        let c = &self.config;
        let request = Request {
            prompt: sequence.clone(),
            max_tokens: c.max_tokens,
            sampler: c.sampler.clone(),
            stop_strings: c.stop_strings.clone(),
            logprobs: c.logprobs,
            token_logprobs: c.token_logprobs,
            ignore_eos: false,
            max_bytes: c.max_bytes,
            speculation: c.speculation,
            score_from: None,
            json_object: c.json_object,
        };
        let seq = self.engine.submit(request)?;
        let mut stats = Stats {
            prompt_tokens,
            ..Stats::default()
        };
        let steps = self.drive(seq, on_event, &mut stats)?;
        let (reason, flushed, generated) = (steps.reason, steps.flushed, steps.generated);
        let (first_token_at, decode_time) = (steps.first_token_at, steps.decode_time);
        // A generated token that did not end the generation is the sequence's unfed tail;
        // the previous unfed token (if any) was fed by this call.
        sequence.extend_from_slice(&generated);
        self.tokens = sequence;
        self.unfed = !generated.is_empty() && reason != StopReason::Eos;
        let ttft = first_token_at.unwrap_or_default();
        stats.prefill_secs = ttft.as_secs_f64();
        stats.prompt_tps = rate(prompt_tokens, stats.prefill_secs);
        if !generated.is_empty() || reason == StopReason::Eos {
            stats.ttft_ms = ttft.as_secs_f64() * 1e3;
        }
        stats.generated_tokens = generated.len();
        stats.decode_secs = decode_time.as_secs_f64();
        // The first token comes from the prefill's logits; with speculation one decode
        // step may choose several.
        let decode_tokens =
            (generated.len() + usize::from(reason == StopReason::Eos)).saturating_sub(1);
        stats.gen_tps = rate(decode_tokens, stats.decode_secs);
        let _ = on_event(Event::Done {
            reason,
            stats,
            flushed,
        });
        Ok(Completion {
            reason,
            stats,
            tokens: generated,
        })
    }
}

/// What [`Runner::drive`] saw of one generation.
struct Steps {
    reason: StopReason,
    flushed: String,
    generated: Vec<u32>,
    /// From the start of the generation to the first step that reported anything.
    first_token_at: Option<Duration>,
    /// Time in the steps after it.
    decode_time: Duration,
}

impl Runner {
    /// Steps the engine until sequence `seq` ends, turning its events into [`Event`]s
    /// (a `Break` from `on_event` ends it early) and counting decode steps in `stats`.
    fn drive(
        &mut self,
        seq: SeqId,
        on_event: &mut dyn FnMut(Event) -> ControlFlow<()>,
        stats: &mut Stats,
    ) -> Result<Steps, RunError> {
        let t_start = Instant::now();
        let mut generated: Vec<u32> = Vec::new();
        let mut decode_time = Duration::ZERO;
        let mut first_token_at: Option<Duration> = None;
        let (reason, flushed) = 'steps: loop {
            let t_step = Instant::now();
            let events = self.engine.step()?;
            match first_token_at {
                Some(_) => {
                    decode_time += t_step.elapsed();
                    stats.decode_steps += 1;
                }
                None if !events.is_empty() => first_token_at = Some(t_start.elapsed()),
                None => {}
            }
            for event in events {
                match event {
                    EngineEvent::Token {
                        id,
                        text,
                        logprob,
                        top,
                        ..
                    } => {
                        generated.push(id);
                        let flow = on_event(Event::Token {
                            id,
                            text,
                            logprob,
                            top,
                        });
                        if flow.is_break() {
                            if let Some(flushed) = self.engine.finish_early(seq) {
                                break 'steps (StopReason::Callback, flushed);
                            }
                        }
                    }
                    EngineEvent::Done {
                        reason,
                        flushed,
                        usage,
                        ..
                    } => {
                        stats.drafted_tokens = usage.drafted_tokens;
                        stats.accepted_tokens = usage.accepted_tokens;
                        break 'steps (reason, flushed);
                    }
                    EngineEvent::PromptScores { .. } => {} // never asked for
                    EngineEvent::Failed { error, .. } => {
                        return Err(self
                            .engine
                            .take_failure(seq)
                            .unwrap_or(RunError::Batch(error)));
                    }
                }
            }
        };
        Ok(Steps {
            reason,
            flushed,
            generated,
            first_token_at,
            decode_time,
        })
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    if n > 0 && secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    /// A runner can move to another thread (a server hands sequences to workers).
    #[test]
    fn runner_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<super::Runner>();
    }
}
