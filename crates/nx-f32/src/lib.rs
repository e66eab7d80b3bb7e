//! Dense f32 kernels: dot, axpy, rmsnorm, rope, softmax, activations, attention primitives.
//!
//! This crate's work arrives with a later issue; see `ARCHITECTURE.md`.
