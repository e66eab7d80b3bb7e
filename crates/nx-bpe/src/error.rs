//! Typed errors of tokenizer construction, encoding and decoding.

use nx_gguf::GgufError;

/// Everything that can go wrong building a tokenizer or using it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A metadata key is missing or has the wrong type (the message names the key).
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] GgufError),
    /// `tokenizer.ggml.model` names a tokenizer this crate does not implement.
    #[error("unsupported tokenizer model {0:?} (tokenizer.ggml.model); supported: \"gpt2\" (byte-level BPE), \"gemma4\" (SentencePiece-style BPE), \"llama\" (SentencePiece)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("unsupported pre-tokenizer {name:?} (tokenizer.ggml.pre); supported: {supported}")]
    UnsupportedPreTokenizer {
        /// The name the file gives.
        name: String,
        /// The names this crate implements, quoted and comma-separated.
        supported: String,
    },
    /// A split pattern of the pre-tokenizer table could not be compiled (a bug of this
    /// crate's table, reported rather than panicking).
    #[error("pre-tokenizer {name:?}: split pattern: {reason}")]
    BadPattern { name: &'static str, reason: String },
    /// A metadata value is present but unusable (wrong length, out of range).
    #[error("tokenizer metadata {key}: {reason}")]
    BadMetadata { key: &'static str, reason: String },
    /// A token id at or past the vocabulary size.
    #[error("unknown token id {id} (vocabulary has {n_vocab} tokens)")]
    UnknownTokenId { id: u32, n_vocab: usize },
    /// SentencePiece works on UTF-8 text; the input had an invalid byte here.
    #[error("input is not valid UTF-8 at byte offset {offset}")]
    InvalidUtf8 { offset: usize },
    /// The text needs a byte-fallback token the vocabulary lacks.
    #[error("vocabulary has no token for byte 0x{byte:02X} (needed for byte fallback) and no unknown token")]
    NoByteToken { byte: u8 },
    /// The input is longer than the tokenizer's 2 GiB limit (offsets are 32-bit).
    #[error("input of {len} bytes is longer than the 2 GiB a single encode call accepts")]
    InputTooLong { len: usize },
    /// `add_special` asked for BOS/EOS but the vocabulary does not define it.
    #[error("add_special requested a {which} token but the vocabulary defines none")]
    MissingSpecialToken { which: &'static str },
}
