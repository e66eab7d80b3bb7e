//! Model config from GGUF metadata, embeddings, the block stack, final norm and LM head.
//!
//! This crate's work arrives with a later issue; see `ARCHITECTURE.md`.
