//! Perplexity of a model on a text, computed the way llama.cpp's `llama-perplexity` does.
//!
//! The rules (those of llama.cpp's default, non-strided mode):
//! 1. The text loses one trailing `'\n'` (as llama.cpp's `-f` does), then is tokenized
//!    whole with the vocabulary's special tokens added (BOS when it asks for one) and
//!    special-token texts left as plain text.
//! 2. The tokens are cut into `n_chunk = len / n_ctx` non-overlapping windows of `n_ctx`
//!    tokens (a partial last window is dropped), at most `max_chunks` of them.
//! 3. Each window runs from an empty KV cache at positions `0..n_ctx`. When the vocabulary
//!    adds BOS, the window's first token is replaced by BOS for the forward pass.
//! 4. Only the second half of each window is scored: with `first = n_ctx / 2`, the logits
//!    at window position `i` predict token `i + 1`, for `i` in `first..n_ctx - 1`
//!    (`n_ctx - first - 1` tokens per window). The negative log-likelihood is
//!    `logsumexp(logits) - logits[target]`, computed in f64.
//! 5. After each window the running estimate is `exp(sum_nll / count)`; at the end
//!    `PPL = exp(mean_nll)` and its uncertainty is
//!    `PPL · sqrt((mean(nll²) - mean_nll²) / (count - 1))`.
//!
//! The LM head runs only for the scored rows, and a window is prefilled in chunks of at
//! most `batch` tokens (one forward pass per window when `batch >= n_ctx`). Per-token NLLs
//! are computed in parallel on the model's thread pool and summed in token order, so the
//! result does not depend on the thread count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nx_bpe::{EncodeOptions, Tokenizer, TokenizerError};
use nx_llama_stack::{KvDtype, Model, StackError};

use crate::engine::{Engine, EngineConfig, EngineEvent, Request};
use crate::RunError;

/// Settings of a perplexity run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerplexityConfig {
    /// Window length in tokens (llama.cpp's `-c`); at least [`MIN_N_CTX`].
    pub n_ctx: usize,
    /// Tokens per forward pass while prefilling a window (llama.cpp's `-b`); at least 1.
    /// Values above `n_ctx` act as `n_ctx`.
    pub batch: usize,
    /// Score at most this many windows (llama.cpp's `--chunks`); `None` scores them all.
    pub max_chunks: Option<usize>,
    /// Storage type of the KV cache.
    pub kv_dtype: KvDtype,
}

/// The smallest window: it scores at least one token (`n_ctx - n_ctx/2 - 1 >= 1`).
pub const MIN_N_CTX: usize = 3;

impl Default for PerplexityConfig {
    /// llama.cpp's defaults: 512-token windows, one forward pass each, every window,
    /// f16 cache.
    fn default() -> Self {
        PerplexityConfig {
            n_ctx: 512,
            batch: 512,
            max_chunks: None,
            kv_dtype: KvDtype::F16,
        }
    }
}

/// Why perplexity could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    /// A setting cannot be used.
    #[error("invalid perplexity config: {0}")]
    InvalidConfig(String),
    /// The text is empty (after dropping one trailing newline).
    #[error("the text is empty")]
    EmptyText,
    /// The text is too short for two windows (llama.cpp asks for `2 · n_ctx` tokens).
    #[error(
        "you need at least {needed} tokens to evaluate perplexity with a context of {n_ctx}; \
         the text tokenizes to only {n_tokens} tokens"
    )]
    TooFewTokens {
        /// Tokens the text gave (BOS included).
        n_tokens: usize,
        /// `2 · n_ctx`.
        needed: usize,
        n_ctx: usize,
    },
    /// A token id is outside the model's vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    /// The vocabulary adds BOS but names no BOS token.
    #[error("the vocabulary asks for BOS but has no BOS token id")]
    MissingBos,
    /// The model produced a NaN or infinite logit where a token was scored.
    #[error(
        "the model produced a non-finite logit ({value}) for token {token} at window {chunk} position {position}"
    )]
    NonFiniteLogits {
        /// Window index (0-based).
        chunk: usize,
        /// Position in the window whose logits were scored.
        position: usize,
        /// The first token id whose logit is not finite.
        token: u32,
        value: f32,
    },
    /// Tokenizing the text failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] StackError),
    /// The engine refused or failed the window.
    #[error(transparent)]
    Engine(RunError),
}

/// Progress after one window, handed to the caller's callback.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChunkProgress {
    /// Window index (0-based).
    pub chunk: usize,
    /// Windows that will be scored in all.
    pub n_chunks: usize,
    /// Mean NLL of this window's scored tokens.
    pub chunk_nll: f64,
    /// Running estimate `exp(sum_nll / count)` over all windows so far (llama.cpp's
    /// `[k]value` figures).
    pub running_ppl: f64,
    /// Wall time of this window (forward passes and scoring).
    pub elapsed: Duration,
}

/// The result of a perplexity run.
#[derive(Debug, Clone, PartialEq)]
pub struct PerplexityReport {
    /// Tokens of the whole text (BOS included).
    pub n_tokens: usize,
    /// Window length.
    pub n_ctx: usize,
    /// Windows scored.
    pub n_chunks: usize,
    /// Tokens scored in all (`n_chunks · (n_ctx - n_ctx/2 - 1)`).
    pub count: usize,
    /// Mean negative log-likelihood (nats per token).
    pub mean_nll: f64,
    /// `exp(mean_nll)`.
    pub ppl: f64,
    /// llama.cpp's `+/-` figure; `None` when it is undefined (one scored token, or a
    /// non-positive variance, where llama.cpp prints an error instead).
    pub ppl_error: Option<f64>,
    /// The running estimate after each window.
    pub running_ppl: Vec<f64>,
    /// Wall time of the forward passes and scoring (tokenization excluded).
    pub elapsed: Duration,
}

/// Tokenizes a perplexity text as llama.cpp does: drops one trailing `'\n'`, adds the
/// vocabulary's special tokens (BOS), and reads special-token texts as plain text.
pub fn tokenize_text(tokenizer: &Tokenizer, text: &[u8]) -> Result<Vec<u32>, PerplexityError> {
    let text = text.strip_suffix(b"\n").unwrap_or(text);
    if text.is_empty() {
        return Err(PerplexityError::EmptyText);
    }
    Ok(tokenizer.encode_bytes(
        text,
        EncodeOptions {
            add_special: true,
            parse_special: false,
        },
    )?)
}

/// Computes the perplexity of `model` on `text` (see the module docs), calling
/// `on_chunk` after each window.
pub fn perplexity(
    model: &Arc<Model>,
    tokenizer: &Tokenizer,
    text: &[u8],
    config: &PerplexityConfig,
    on_chunk: impl FnMut(&ChunkProgress),
) -> Result<PerplexityReport, PerplexityError> {
    check_config(config)?;
    let tokens = tokenize_text(tokenizer, text)?;
    let bos = if tokenizer.add_bos() {
        Some(tokenizer.bos_id().ok_or(PerplexityError::MissingBos)?)
    } else {
        None
    };
    perplexity_of_tokens(model, &tokens, bos, config, on_chunk)
}

/// Computes the perplexity of `model` on already-tokenized `tokens`; `bos`, when given,
/// replaces each window's first token (see the module docs).
pub fn perplexity_of_tokens(
    model: &Arc<Model>,
    tokens: &[u32],
    bos: Option<u32>,
    config: &PerplexityConfig,
    mut on_chunk: impl FnMut(&ChunkProgress),
) -> Result<PerplexityReport, PerplexityError> {
    check_config(config)?;
    check_tokens(model, tokens, bos, config.n_ctx)?;
    let n_ctx = config.n_ctx;
    let n_chunk_max = tokens.len() / n_ctx;
    let n_chunks = config
        .max_chunks
        .map_or(n_chunk_max, |m| m.min(n_chunk_max));
    let batch = config.batch.min(n_ctx);
    let first = n_ctx / 2;
    // Logits rows `first..n_ctx-1` predict tokens `first+1..n_ctx`; row `n_ctx-1` would
    // predict the next window's first token, which llama.cpp does not score.
    let scored_per_chunk = n_ctx - 1 - first;

    // One window at a time through a one-slot engine, scoring rows `first..n_ctx-1`.
    let mut engine = window_engine(model, n_ctx, batch, config.kv_dtype)?;
    let mut window = Vec::with_capacity(n_ctx);
    let mut nll_rows = vec![0f64; scored_per_chunk];

    let mut nll_sum = 0f64;
    let mut nll2_sum = 0f64;
    let mut count = 0usize;
    let mut running_ppl = Vec::with_capacity(n_chunks);
    let started = Instant::now();

    for chunk in 0..n_chunks {
        let chunk_started = Instant::now();
        window.clear();
        window.extend_from_slice(&tokens[chunk * n_ctx..(chunk + 1) * n_ctx]);
        if let Some(bos) = bos {
            window[0] = bos;
        }
        // Targets: the window token after each scored position. The window's first
        // token was replaced by BOS, but it is never a target (first >= 1).
        score_window(&mut engine, &window, first + 1, &mut nll_rows)
            .map_err(|e| PerplexityError::in_chunk(chunk, e))?;

        let mut chunk_sum = 0f64;
        for &v in &nll_rows {
            chunk_sum += v;
            nll2_sum += v * v;
        }
        nll_sum += chunk_sum;
        count += scored_per_chunk;
        let running = (nll_sum / count as f64).exp();
        running_ppl.push(running);
        on_chunk(&ChunkProgress {
            chunk,
            n_chunks,
            chunk_nll: chunk_sum / scored_per_chunk as f64,
            running_ppl: running,
            elapsed: chunk_started.elapsed(),
        });
    }

    let (mean_nll, ppl, ppl_error) = final_estimate(nll_sum, nll2_sum, count);
    Ok(PerplexityReport {
        n_tokens: tokens.len(),
        n_ctx,
        n_chunks,
        count,
        mean_nll,
        ppl,
        ppl_error,
        running_ppl,
        elapsed: started.elapsed(),
    })
}

/// The text is long enough for two windows and every id (BOS too) is in the vocabulary.
fn check_tokens(
    model: &Model,
    tokens: &[u32],
    bos: Option<u32>,
    n_ctx: usize,
) -> Result<(), PerplexityError> {
    if tokens.is_empty() {
        return Err(PerplexityError::EmptyText);
    }
    if tokens.len() < 2 * n_ctx {
        return Err(PerplexityError::TooFewTokens {
            n_tokens: tokens.len(),
            needed: 2 * n_ctx,
            n_ctx,
        });
    }
    let n_vocab = model.config().n_vocab;
    if let Some(&id) = tokens
        .iter()
        .chain(bos.as_ref())
        .find(|&&id| id as usize >= n_vocab)
    {
        return Err(PerplexityError::TokenOutOfRange { id, n_vocab });
    }

    Ok(())
}

impl PerplexityError {
    /// An engine error of window `chunk`, non-finite logits named with their chunk.
    fn in_chunk(chunk: usize, e: RunError) -> PerplexityError {
        match e {
            RunError::NonFiniteLogits {
                position,
                token,
                value,
            } => PerplexityError::NonFiniteLogits {
                chunk,
                position,
                token,
                value,
            },
            other => PerplexityError::Engine(other),
        }
    }
}

/// `(mean_nll, ppl, ppl_error)` from the sums of NLL and NLL² over `count` tokens, with
/// llama.cpp's error formula: the standard error of the mean NLL, scaled by PPL (the
/// derivative of `exp`).
pub fn final_estimate(nll_sum: f64, nll2_sum: f64, count: usize) -> (f64, f64, Option<f64>) {
    let n = count as f64;
    let mean = nll_sum / n;
    let ppl = mean.exp();
    let variance = nll2_sum / n - mean * mean;
    let error = (count > 1 && variance > 0.0).then(|| (variance / (n - 1.0)).sqrt() * ppl);
    (mean, ppl, error)
}

/// `-log softmax(logits)[target]` in f64: `max + ln Σ exp(l - max) - l[target]`.
pub use crate::engine::token_nll;

/// A one-slot engine for windows of `n_ctx` tokens, prefilled `batch` at a time.
fn window_engine(
    model: &Arc<Model>,
    n_ctx: usize,
    batch: usize,
    kv_dtype: nx_kv_cache::KvDtype,
) -> Result<Engine, PerplexityError> {
    let block_size = 16;
    let blocks = n_ctx.div_ceil(block_size) as u64 + 1;
    let config = EngineConfig {
        n_ctx,
        kv_dtype,
        kv_memory_bytes: model.kv_bytes_per_position(kv_dtype) * block_size as u64 * blocks,
        block_size,
        max_running: 1,
        step_tokens: batch,
        prefill_chunk: batch,
        prefix_cache: false,
        max_queue: 1,
        weigh_draft_cost: true,
    };
    Engine::new(model.clone(), None, config).map_err(PerplexityError::Engine)
}

/// Runs `window` through `engine` and writes the NLL of its tokens `first..` into `out`.
fn score_window(
    engine: &mut Engine,
    window: &[u32],
    first: usize,
    out: &mut [f64],
) -> Result<(), RunError> {
    let seq = engine.submit(Request {
        prompt: window.to_vec(),
        max_tokens: 0,
        sampler: nx_sampler::SamplerConfig::greedy(),
        score_from: Some(first),
        ..Request::default()
    })?;
    loop {
        for event in engine.step()? {
            match event {
                EngineEvent::PromptScores { first: at, nll, .. } => {
                    out[at - first..at - first + nll.len()].copy_from_slice(&nll);
                }
                EngineEvent::Done { .. } => return Ok(()),
                EngineEvent::Failed { error, .. } => {
                    return Err(engine.take_failure(seq).unwrap_or(RunError::Batch(error)))
                }
                EngineEvent::Token { .. } => {}
            }
        }
    }
}

fn check_config(config: &PerplexityConfig) -> Result<(), PerplexityError> {
    if config.n_ctx < MIN_N_CTX {
        return Err(PerplexityError::InvalidConfig(format!(
            "the context must be at least {MIN_N_CTX} tokens, got {}",
            config.n_ctx
        )));
    }
    if config.batch == 0 {
        return Err(PerplexityError::InvalidConfig(
            "the batch size must be at least 1".into(),
        ));
    }
    if config.max_chunks == Some(0) {
        return Err(PerplexityError::InvalidConfig(
            "the number of chunks must be at least 1".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_nll_matches_a_direct_softmax() {
        let logits = [1.0f32, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        for (t, &l) in logits.iter().enumerate() {
            let want = -((l as f64).exp() / z).ln();
            let got = token_nll(&logits, t as u32);
            assert!((got - want).abs() < 1e-12, "token {t}: {got} vs {want}");
        }
    }

    #[test]
    fn token_nll_is_shift_invariant_and_stable() {
        // Huge logits overflow a naive exp; the max-shift keeps them exact.
        let logits = [1000.0f32, 1001.0, 999.0];
        let shifted = [0.0f32, 1.0, -1.0];
        for t in 0..3 {
            let a = token_nll(&logits, t);
            let b = token_nll(&shifted, t);
            assert!(a.is_finite() && (a - b).abs() < 1e-9, "{a} vs {b}");
        }
    }

    #[test]
    fn uniform_logits_give_vocab_size_perplexity() {
        let logits = vec![0.5f32; 1000];
        let nll = token_nll(&logits, 7);
        assert!((nll - (1000f64).ln()).abs() < 1e-9);
        let (_, ppl, err) = final_estimate(nll * 10.0, nll * nll * 10.0, 10);
        assert!((ppl - 1000.0).abs() < 1e-6, "{ppl}");
        // Every token has the same NLL: the variance is zero (up to rounding), which
        // llama.cpp reports as an error rather than a figure.
        assert!(err.is_none_or(|e| e < 1e-6), "{err:?}");
    }

    #[test]
    fn final_estimate_uses_the_standard_error_of_the_mean() {
        // NLLs 1, 2, 3: mean 2, population variance 2/3, error = sqrt((2/3)/2)·e².
        let (mean, ppl, err) = final_estimate(6.0, 14.0, 3);
        assert!((mean - 2.0).abs() < 1e-12);
        assert!((ppl - 2f64.exp()).abs() < 1e-12);
        let want = (1.0f64 / 3.0).sqrt() * 2f64.exp();
        assert!((err.unwrap() - want).abs() < 1e-12);
        // One token: undefined.
        assert_eq!(final_estimate(2.0, 4.0, 1).2, None);
    }

    #[test]
    fn bad_configs_are_rejected() {
        let ok = PerplexityConfig::default();
        assert!(check_config(&ok).is_ok());
        for bad in [
            PerplexityConfig { n_ctx: 2, ..ok },
            PerplexityConfig { batch: 0, ..ok },
            PerplexityConfig {
                max_chunks: Some(0),
                ..ok
            },
        ] {
            assert!(matches!(
                check_config(&bad),
                Err(PerplexityError::InvalidConfig(_))
            ));
        }
    }
}
