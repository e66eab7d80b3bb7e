//! The runner: encode, chunked prefill, decode loop, stop rules, streaming events.
//!
//! [`Runner`] owns everything one sequence needs — a shared [`Model`], an optional
//! shared [`Tokenizer`], a [`KvCache`], the forward-pass scratch and a [`Sampler`] —
//! and turns a [`Prompt`] into a stream of [`Event`]s:
//!
//! 1. **Encode** a text prompt with the tokenizer (BOS when `add_special` and the
//!    vocabulary asks for it); token ids are taken as given.
//! 2. **Validate**: an empty prompt, a token id outside the vocabulary, or
//!    `cached + prompt + max_tokens > n_ctx` is an error before any work is done.
//! 3. **Prefill** in chunks of at most [`RunConfig::prefill_chunk`] tokens, asking the
//!    model for logits of one row only: the last prompt token of the last chunk.
//!    The prompt tokens also enter the sampler's penalty window (as llama.cpp does).
//! 4. **Decode**: sample, emit [`Event::Token`] (UTF-8-safe text from the streaming
//!    decoder, the token's log-probability and optionally the top-k alternatives),
//!    feed the token back, repeat until a stop rule fires, then emit [`Event::Done`]
//!    with the [`StopReason`] and [`Stats`].
//!
//! Control tokens (BOS, turn markers) that the model generates are emitted as tokens
//! with no text, as llama.cpp's tools print them.
//!
//! ## Stop rules
//! - **End of generation**: a token the tokenizer marks as EOG ([`Tokenizer::is_eog`]).
//!   It gets no `Token` event and is not part of the output text.
//! - **`max_tokens`** generated tokens.
//! - **`max_bytes`**: once the output text reaches the cap; the text is cut to at
//!   most `max_bytes` bytes, at a character boundary.
//! - **Stop strings**: the output up to the first occurrence of any stop string is
//!   emitted, the stop string and anything after it are not. Output that might be the
//!   beginning of a stop string is held back until the next tokens decide it.
//! - **The caller**: the event callback returns [`ControlFlow::Break`].
//!
//! Text held back when generation ends for a reason that is not a stop string (a
//! possible stop-string prefix, or an incomplete UTF-8 character) is released in
//! [`Event::Done`]'s `flushed`, so the concatenation of every `Token` text and the
//! final `flushed` is the complete output.
//!
//! ## Memory
//! Prefill memory is bounded by `prefill_chunk`, not by the prompt length: the model
//! computes activations for at most `prefill_chunk` tokens at a time, and
//! `Model::forward` computes the final norm and LM head only for the requested rows, so
//! the logits buffer is one `n_vocab` row whatever the prompt. Besides the mapped
//! weights, the only memory that grows with the sequence is the KV cache, allocated
//! once for `n_ctx` positions.
//!
//! ## Conversations
//! [`Runner::continue_with`] appends new tokens after everything already in the cache
//! (only the new ones are prefilled) and generates again, so a chat reuses its KV cache.
//! [`Runner::reset`] forgets the sequence.
//!
//! This crate contains no kernels: all arithmetic happens in `nx-llama-stack` and below.
//!
//! [`ControlFlow::Break`]: std::ops::ControlFlow::Break

pub mod chat;
mod config;
pub mod engine;
mod error;
pub mod json_mode;
pub mod perplexity;
mod runner;
pub mod spec;
mod stop;

pub use chat::{
    BuiltinTemplate, ChatError, ChatMessage, ChatSession, ChatTemplate, ChatTurn, TemplateChoice,
};
pub use config::{Prompt, RunConfig};
pub use engine::{Engine, EngineConfig, EngineEvent, EngineMetrics, Request, SeqId, Usage};
pub use error::RunError;
pub use json_mode::{JsonObject, JsonVocab};
pub use perplexity::{
    perplexity, ChunkProgress, PerplexityConfig, PerplexityError, PerplexityReport,
};
pub use runner::{Completion, Event, Runner, Stats, StopReason};
pub use spec::{DraftSource, Speculation};

pub use nx_bpe::Tokenizer;
pub use nx_llama_stack::{KvCache, KvDtype, Model};
pub use nx_sampler::{Sampler, SamplerConfig};
