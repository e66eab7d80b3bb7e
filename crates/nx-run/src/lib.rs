//! The runner: encode, chunked prefill, decode loop, stop rules, streaming events.
//!
//! This crate's work arrives with a later issue; see `ARCHITECTURE.md`.
