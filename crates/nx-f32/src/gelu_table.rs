//! GELU through an f16 lookup table, reproducing how ggml's CPU backend evaluates GELU.
//!
//! ggml (built with its default `GGML_GELU_FP16`) does not evaluate the tanh formula
//! per element for f32 GELU / GeGLU: for `-10 < x < 10` it rounds `x` to f16, looks up
//! `f16(gelu_tanh(f32(that f16)))` in a 65 536-entry table and widens the result; for
//! `x <= -10` it returns 0 and for `x >= 10` it returns `x`. The result differs from
//! [`crate::gelu_tanh`] by up to f16 precision. This module reproduces it so a forward
//! pass can choose to follow the reference engine bit for bit in this op.

use std::sync::OnceLock;

use half::f16;

use crate::scalar;

/// The 65 536-entry f16 GELU table (128 KiB), indexed by the bits of an f16 input.
#[derive(Clone)]
pub struct GeluTable {
    table: Box<[f16]>,
}

impl std::fmt::Debug for GeluTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeluTable")
            .field("entries", &self.table.len())
            .finish()
    }
}

impl Default for GeluTable {
    fn default() -> Self {
        GeluTable::new()
    }
}

impl GeluTable {
    /// Builds the table (65 536 tanh evaluations, about a millisecond).
    pub fn new() -> GeluTable {
        let table = (0..=u16::MAX)
            .map(|bits| f16::from_f32(scalar::gelu_tanh(f16::from_bits(bits).to_f32())))
            .collect::<Vec<f16>>()
            .into_boxed_slice();
        GeluTable { table }
    }

    /// The process-wide table, built on first use.
    pub fn shared() -> &'static GeluTable {
        static TABLE: OnceLock<GeluTable> = OnceLock::new();
        TABLE.get_or_init(GeluTable::new)
    }

    /// GELU of `x` the way ggml's f32 GELU computes it (see the module docs).
    #[inline]
    pub fn gelu(&self, x: f32) -> f32 {
        if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            let bits = f16::from_f32(x).to_bits();
            self.table[usize::from(bits)].to_f32()
        }
    }

    /// `out[i] = gelu(gate[i])·up[i]` with the table GELU, like ggml's `geglu` op
    /// (for `gate >= 10` it is `gate·up`).
    pub fn geglu(&self, out: &mut [f32], gate: &[f32], up: &[f32]) {
        debug_assert_eq!(out.len(), gate.len(), "geglu: out/gate length mismatch");
        debug_assert_eq!(out.len(), up.len(), "geglu: out/up length mismatch");
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            // ggml writes a plain 0 below −10 (not 0·up), so keep that branch separate.
            *o = if g <= -10.0 { 0.0 } else { self.gelu(g) * u };
        }
    }
}
