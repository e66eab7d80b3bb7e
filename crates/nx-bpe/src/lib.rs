//! Tokenizers from GGUF metadata: byte-level BPE and SentencePiece.
//!
//! This crate's work arrives with a later issue; see `ARCHITECTURE.md`.
