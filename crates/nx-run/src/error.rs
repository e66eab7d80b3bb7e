//! `RunError`: everything that stops a runner from generating.

use nx_bpe::TokenizerError;
use nx_llama_stack::StackError;
use nx_sampler::{ConfigError, SamplerError};

/// Why a generation could not start or could not finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A setting cannot be used.
    #[error("invalid run config: {0}")]
    InvalidConfig(String),
    /// A sampler setting cannot be used.
    #[error(transparent)]
    SamplerConfig(#[from] ConfigError),
    /// The prompt has no tokens (and there is nothing pending to continue from).
    #[error("the prompt is empty (no tokens to start from)")]
    EmptyPrompt,
    /// The prompt and the tokens to generate do not fit in the context.
    #[error(
        "prompt of {prompt_tokens} tokens + max_tokens {max_tokens}{} needs {} positions, \
         more than the context of {n_ctx}",
        cached_text(*.cached),
        .cached + .prompt_tokens + .max_tokens
    )]
    ContextOverflow {
        /// Tokens already in the cache (a continued conversation).
        cached: usize,
        /// New tokens to prefill.
        prompt_tokens: usize,
        /// Tokens the generation may add.
        max_tokens: usize,
        /// Positions the cache holds.
        n_ctx: usize,
    },
    /// A prompt token id is not in the model's vocabulary.
    #[error("prompt token id {id} is outside the vocabulary of {n_vocab} tokens")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    /// A text prompt was given but the runner has no tokenizer.
    #[error("a text prompt needs a tokenizer, and this runner has none")]
    NoTokenizer,
    /// JSON mode found no token that continues the JSON object (a vocabulary without
    /// `{`, say).
    #[error("JSON mode: no token of the vocabulary continues the JSON object")]
    NoJsonToken,
    /// The model produced a NaN or infinite logit.
    #[error(
        "the model produced a non-finite logit ({value}) for token {token} at position {position}"
    )]
    NonFiniteLogits {
        /// Position whose next-token logits were computed.
        position: usize,
        /// The first token id whose logit is not finite.
        token: u32,
        value: f32,
    },
    /// Encoding the prompt or decoding a token failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] StackError),
    /// No token could be sampled.
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// The batched forward pass this sequence was part of failed (for the first
    /// sequence of the batch the error itself is reported).
    #[error("the batched forward pass failed: {0}")]
    Batch(String),
    /// A draft model does not share the target's vocabulary.
    #[error("the draft model's vocabulary differs from the target's: {0}")]
    DraftVocab(String),
    /// The engine's queue of waiting requests is full.
    #[error("the queue is full ({max_queue} requests waiting); try again later")]
    QueueFull { max_queue: usize },
    /// The KV cache could not hold what was asked.
    #[error(transparent)]
    Cache(#[from] nx_kv_cache::KvError),
}

fn cached_text(cached: usize) -> String {
    if cached == 0 {
        String::new()
    } else {
        format!(" after {cached} cached tokens")
    }
}
