//! One transformer block over a chunk of tokens.
//!
//! This crate's work arrives with a later issue; see `ARCHITECTURE.md`.
