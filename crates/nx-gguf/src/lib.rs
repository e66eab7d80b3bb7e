//! GGUF v2/v3 reader and writer: header, typed metadata, tensor table; every bound checked.
//!
//! This crate's work arrives with a later issue; see `ARCHITECTURE.md`.
