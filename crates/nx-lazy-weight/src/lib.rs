//! Lazy typed views of quantized tensors inside the mapping; block formats and quantized matmul.
//!
//! This crate's work arrives with a later issue; see `ARCHITECTURE.md`.
