//! Read-only file mapping, aligned scratch buffers and the CPU capability tier.
//!
//! This crate's work arrives with a later issue; see `ARCHITECTURE.md`.
