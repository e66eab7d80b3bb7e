//! `Runner`: one sequence's cache, scratch and sampler, and the prefill/decode loop.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nx_bpe::{EncodeOptions, StreamDecoder, Tokenizer};
use nx_kv_cache::KvCache;
use nx_llama_stack::{ForwardState, Model};
use nx_sampler::{log_prob, log_softmax_top, Sampler};

use crate::stop::{Released, StopMatcher};
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
    /// `decode_steps / decode_secs` (0 when nothing was timed).
    pub gen_tps: f64,
    /// Milliseconds from the start of the call (after validation and encoding) to the
    /// first token being chosen: prefill plus one sampling (0 when no token was sampled).
    pub ttft_ms: f64,
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
        /// penalties, temperature and filters).
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
/// The sequence is every token in the KV cache, plus (after a generation that stopped
/// on anything but an end-of-generation token) the last emitted token, which is fed at
/// the start of the next [`Runner::continue_with`]. An end-of-generation token that
/// ended a generation is not part of the sequence: chat templates write their own
/// end-of-turn marker.
pub struct Runner {
    model: Arc<Model>,
    tokenizer: Option<Arc<Tokenizer>>,
    config: RunConfig,
    cache: KvCache,
    state: ForwardState,
    sampler: Sampler,
    /// The logits row of the next position (valid after a prefill or decode step).
    logits: Vec<f32>,
    /// A copy of `logits` the sampler may modify (penalties).
    sample_buf: Vec<f32>,
    /// Tokens in the cache, in position order.
    history: Vec<u32>,
    /// The last emitted token, not yet fed to the model.
    unfed: Option<u32>,
}

impl Runner {
    /// A runner for `model`, with `tokenizer` for text prompts, output text and
    /// end-of-generation detection (without one, prompts must be ids, output text is
    /// empty and only `max_tokens`, `max_bytes` and the callback stop a generation).
    /// Allocates the KV cache for `config.n_ctx` positions.
    pub fn new(
        model: Arc<Model>,
        tokenizer: Option<Arc<Tokenizer>>,
        config: RunConfig,
    ) -> Result<Runner, RunError> {
        config.validate()?;
        let sampler = Sampler::new(config.sampler.clone())?;
        let cache = model.new_cache(config.n_ctx, config.kv_dtype)?;
        Ok(Runner {
            model,
            tokenizer,
            config,
            cache,
            state: ForwardState::default(),
            sampler,
            logits: Vec::new(),
            sample_buf: Vec::new(),
            history: Vec::new(),
            unfed: None,
        })
    }

    /// The settings in use.
    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The tokenizer, if any.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_deref()
    }

    /// Positions the cache holds.
    pub fn n_ctx(&self) -> usize {
        self.cache.n_ctx()
    }

    /// The sequence so far: the tokens in the cache, then the last emitted token if it
    /// has not been fed yet.
    pub fn tokens(&self) -> Vec<u32> {
        let mut t = self.history.clone();
        t.extend(self.unfed);
        t
    }

    /// Number of positions in the KV cache.
    pub fn cached_len(&self) -> usize {
        self.cache.len()
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

    /// Forgets the sequence: empties the cache and the penalty window and reseeds the
    /// sampler. The cache allocation is kept.
    pub fn reset(&mut self) {
        self.cache.clear();
        self.history.clear();
        self.unfed = None;
        self.logits.clear();
        self.sampler.reset();
    }

    /// Keeps only the first `n` tokens of [`Runner::tokens`] (e.g. to re-use the common
    /// prefix of an edited conversation). When tokens are removed, the penalty window
    /// is rebuilt from the kept tokens and the sampler's generator restarts from its
    /// seed.
    pub fn truncate(&mut self, n: usize) {
        let total = self.history.len() + usize::from(self.unfed.is_some());
        if n >= total {
            return;
        }
        if n <= self.history.len() {
            self.unfed = None;
            self.history.truncate(n);
            self.cache.truncate(n);
        }
        self.logits.clear();
        self.sampler.reset();
        let window = self.sampler.config().penalty_last_n;
        let start = self.history.len().saturating_sub(window);
        self.sampler.accept_all(&self.history[start..]);
    }

    /// Encodes `text` with the tokenizer (`add_special`: BOS/EOS as the vocabulary
    /// asks; `parse_special` from the config).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, RunError> {
        let tok = self.tokenizer.as_deref().ok_or(RunError::NoTokenizer)?;
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

    /// Appends `more` to the current sequence (prefilling only the new tokens, plus the
    /// previous generation's last token if it was not fed yet) and generates. A text
    /// prompt gets BOS only if the sequence is empty. With an empty sequence this is
    /// [`Runner::generate`] without the reset.
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
                let fresh = self.history.is_empty() && self.unfed.is_none();
                self.encode(&text, self.config.add_special && fresh)
            }
        }
    }

    /// Runs `chunk` at the end of the cache, writing the logits of `rows` into
    /// `self.logits`. On failure the cache is rolled back to the known sequence.
    fn forward(&mut self, chunk: &[u32], rows: &[usize]) -> Result<(), RunError> {
        let pos = self.cache.len();
        if let Err(e) = self.model.forward(
            chunk,
            pos,
            &mut self.cache,
            rows,
            &mut self.state,
            &mut self.logits,
        ) {
            self.cache.truncate(pos);
            self.logits.clear();
            return Err(e.into());
        }
        self.history.extend_from_slice(chunk);
        Ok(())
    }

    /// Checks the current logits row for NaN and infinities.
    fn check_logits(&self) -> Result<(), RunError> {
        match self.logits.iter().position(|l| !l.is_finite()) {
            None => Ok(()),
            Some(i) => Err(RunError::NonFiniteLogits {
                position: self.cache.len().saturating_sub(1),
                token: i as u32,
                value: self.logits[i],
            }),
        }
    }

    fn run(
        &mut self,
        new_tokens: Vec<u32>,
        on_event: &mut dyn FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Completion, RunError> {
        let t_start = Instant::now();
        let n_vocab = self.model.config().n_vocab;
        let mut feed: Vec<u32> = Vec::with_capacity(new_tokens.len() + 1);
        feed.extend(self.unfed);
        feed.extend_from_slice(&new_tokens);
        if feed.is_empty() {
            return Err(RunError::EmptyPrompt);
        }
        if let Some(&id) = feed.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(RunError::TokenOutOfRange { id, n_vocab });
        }
        let max_tokens = self.config.max_tokens;
        let cached = self.cache.len();
        let needed = cached
            .checked_add(feed.len())
            .and_then(|n| n.checked_add(max_tokens));
        if needed.is_none_or(|n| n > self.cache.n_ctx()) {
            return Err(RunError::ContextOverflow {
                cached,
                prompt_tokens: feed.len(),
                max_tokens,
                n_ctx: self.cache.n_ctx(),
            });
        }

        // Prefill: logits only for the last prompt token, and only if a token follows.
        let t_prefill = Instant::now();
        let n_chunks = feed.len().div_ceil(self.config.prefill_chunk);
        // The pending token is the first one fed; once its chunk is in the cache it is
        // part of the history.
        let pending = self.unfed.take();
        for (i, chunk) in feed.chunks(self.config.prefill_chunk).enumerate() {
            let last_row = [chunk.len() - 1];
            let rows: &[usize] = if i + 1 == n_chunks && max_tokens > 0 {
                &last_row
            } else {
                &[]
            };
            if let Err(e) = self.forward(chunk, rows) {
                if i == 0 {
                    self.unfed = pending;
                }
                return Err(e);
            }
        }
        let prefill_secs = t_prefill.elapsed().as_secs_f64();
        // The previous generation's last token is already in the penalty window.
        self.sampler.accept_all(&new_tokens);

        let mut stats = Stats {
            prompt_tokens: feed.len(),
            prefill_secs,
            prompt_tps: rate(feed.len(), prefill_secs),
            ..Stats::default()
        };
        let tokenizer = self.tokenizer.clone();
        let mut decoder: Option<StreamDecoder<'_>> =
            tokenizer.as_deref().map(|t| t.stream_decoder());
        let mut stops = StopMatcher::new(&self.config.stop_strings);
        let max_bytes = self.config.max_bytes;
        let mut text_bytes = 0usize;
        let mut generated: Vec<u32> = Vec::new();
        let mut decode_time = Duration::ZERO;
        // Start of the decode step in progress (forward pass, then sampling).
        let mut step_start: Option<Instant> = None;

        let reason = loop {
            if generated.len() == max_tokens {
                // Only reached with max_tokens == 0: prefill only.
                break StopReason::MaxTokens;
            }
            self.check_logits()?;
            let top = if self.config.logprobs > 0 {
                log_softmax_top(&self.logits, self.config.logprobs)
            } else {
                Vec::new()
            };
            self.sample_buf.clear();
            self.sample_buf.extend_from_slice(&self.logits);
            let id = self.sampler.sample(&mut self.sample_buf)?;
            self.sampler.accept(id);
            let logprob = log_prob(&self.logits, id).unwrap_or(f32::NEG_INFINITY);
            match step_start.take() {
                Some(t) => decode_time += t.elapsed(),
                None => stats.ttft_ms = t_start.elapsed().as_secs_f64() * 1e3,
            }

            if tokenizer.as_deref().is_some_and(|t| t.is_eog(id)) {
                break StopReason::Eos;
            }
            generated.push(id);
            self.unfed = Some(id);
            let last_allowed = generated.len() == max_tokens;

            // Control tokens (BOS, turn markers, …) are structure, not text: like
            // llama.cpp's tools, the output shows nothing for them.
            let is_control = match tokenizer.as_deref() {
                Some(t) => t.is_control(id)?,
                None => false,
            };
            let mut piece = match decoder.as_mut() {
                Some(d) if !is_control => d.push(id)?,
                _ => String::new(),
            };
            if last_allowed {
                if let Some(d) = decoder.as_mut() {
                    piece.push_str(&d.finish());
                }
            }
            let mut cap_hit = false;
            if let Some(cap) = max_bytes {
                if text_bytes + piece.len() >= cap {
                    truncate_at_char(&mut piece, cap - text_bytes);
                    cap_hit = true;
                }
            }
            text_bytes += piece.len();
            let (text, stop) = match stops.push(&piece) {
                Released::Stopped(before) => (before, Some(StopReason::StopString)),
                Released::Text(mut out) if cap_hit || last_allowed => {
                    out.push_str(&stops.flush());
                    let r = if cap_hit {
                        StopReason::MaxBytes
                    } else {
                        StopReason::MaxTokens
                    };
                    (out, Some(r))
                }
                Released::Text(out) => (out, None),
            };
            let flow = on_event(Event::Token {
                id,
                text,
                logprob,
                top,
            });
            if let Some(r) = stop {
                break r;
            }
            if flow.is_break() {
                break StopReason::Callback;
            }

            step_start = Some(Instant::now());
            self.forward(&[id], &[0])?;
            self.unfed = None;
            stats.decode_steps += 1;
        };

        // Text still held back when the output ends without a stop string match.
        let mut flushed = String::new();
        if matches!(reason, StopReason::Eos | StopReason::Callback) {
            flushed.push_str(&stops.flush());
            if let Some(d) = decoder.as_mut() {
                flushed.push_str(&d.finish());
            }
            if let Some(cap) = max_bytes {
                truncate_at_char(&mut flushed, cap.saturating_sub(text_bytes));
            }
        }
        stats.generated_tokens = generated.len();
        stats.decode_secs = decode_time.as_secs_f64();
        stats.gen_tps = rate(stats.decode_steps, stats.decode_secs);
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

fn rate(n: usize, secs: f64) -> f64 {
    if n > 0 && secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
fn truncate_at_char(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
}

#[cfg(test)]
mod tests {
    /// A runner can move to another thread (a server hands sequences to workers).
    #[test]
    fn runner_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<super::Runner>();
    }

    #[test]
    fn truncate_at_char_keeps_whole_characters() {
        let mut s = String::from("aé€b");
        super::truncate_at_char(&mut s, 4);
        assert_eq!(s, "aé");
        super::truncate_at_char(&mut s, 10);
        assert_eq!(s, "aé");
        super::truncate_at_char(&mut s, 2);
        assert_eq!(s, "a");
    }
}
