//! Token sampling: greedy, temperature, top-k/p, min-p, penalties, seeded ChaCha RNG.
//!
//! This crate's work arrives with a later issue; see `ARCHITECTURE.md`.
