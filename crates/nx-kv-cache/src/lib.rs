//! Per-layer K/V row storage (f32 or f16) with truncate and rollback.
//!
//! This crate's work arrives with a later issue; see `ARCHITECTURE.md`.
