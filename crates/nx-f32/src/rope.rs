//! Rotary position embedding (RoPE): normal (adjacent pairs) and NeoX (split halves).
//!
//! The angles are computed the way ggml's CPU `rope` computes them, so our rotated
//! vectors match the reference engine's as closely as f32 allows:
//!
//! - `theta_scale = powf(freq_base, -2 / rope_dim)` in f32;
//! - the angle of pair 0 is `pos` as f32, and each following pair's angle is the previous
//!   one times `theta_scale` (repeated f32 multiplication, not `pos·base^(−2i/d)`);
//! - with frequency factors (Llama 3.1 `rope_freqs`) the angle of pair `i` is divided by
//!   `freq_factors[i]`; with linear scaling it is then multiplied by `freq_scale`;
//! - `cos` and `sin` are taken in f32 (`cosf`/`sinf`).
//!
//! [`rope_normal`] / [`rope_neox`] compute the angles on the fly; [`RopeTable`] computes
//! them once per position (shared by every head of Q and K) with the same function, so
//! both give bit-identical results.
//!
//! - the rotation rounds like the reference's GCC build, which fuses each output line
//!   into one multiply-add (see [`scalar::rotate`]).

use crate::scalar;

/// Why a RoPE configuration was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RopeError {
    /// `rope_dim` must be even and non-zero.
    #[error("rope dimension {0} must be even and non-zero")]
    BadRopeDim(usize),
    /// `freq_base` must be finite and positive.
    #[error("rope frequency base {0} must be finite and positive")]
    BadFreqBase(f32),
    /// `freq_scale` must be finite and positive.
    #[error("rope frequency scale {0} must be finite and positive")]
    BadFreqScale(f32),
    /// Frequency factors must cover every rotated pair.
    #[error("rope frequency factors hold {got} values, need at least {need} (rope_dim / 2)")]
    FreqFactorsTooShort {
        /// `rope_dim / 2`.
        need: usize,
        /// Length supplied.
        got: usize,
    },
}

/// Which elements form a rotated pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: llama, mistral (ggml `GGML_ROPE_TYPE_NORMAL`).
    Normal,
    /// Pairs `(i, i + rope_dim/2)`: qwen2, qwen3, gemma3 (ggml `GGML_ROPE_TYPE_NEOX`).
    Neox,
}

/// `freq_base^(−2/rope_dim)` in f32, as ggml computes it.
#[inline]
pub fn theta_scale(freq_base: f32, rope_dim: usize) -> f32 {
    freq_base.powf(-2.0f32 / rope_dim as f32)
}

/// Calls `f(i, cos_i, sin_i)` for each pair `i < rope_dim/2` at position `pos`.
///
/// The single definition of the angle arithmetic: the free functions and
/// [`RopeTable`] both go through here so they cannot drift apart.
#[inline(always)]
fn for_each_angle(
    pos: usize,
    theta_scale: f32,
    n_pairs: usize,
    freq_factors: Option<&[f32]>,
    freq_scale: f32,
    mut f: impl FnMut(usize, f32, f32),
) {
    let mut theta = pos as f32;
    for i in 0..n_pairs {
        let factor = match freq_factors {
            Some(ff) => ff.get(i).copied().unwrap_or(1.0),
            None => 1.0,
        };
        let angle = freq_scale * (theta / factor);
        f(i, angle.cos(), angle.sin());
        theta *= theta_scale;
    }
}

/// Rotates one head in place with adjacent pairs `(2i, 2i+1)` for `i < rope_dim/2`; the
/// elements from `rope_dim` on are left unchanged.
///
/// `x` is one head (`head_dim` values, `head_dim >= rope_dim`). Pair `i` is rotated by
/// `pos·freq_base^(−2i/rope_dim) / freq_factors[i]` computed as described in the module
/// docs. An odd or zero `rope_dim`, or `rope_dim > x.len()`, is a caller bug: it trips
/// a `debug_assert!` and otherwise rotates only the pairs that fit.
pub fn rope_normal(
    x: &mut [f32],
    pos: usize,
    freq_base: f32,
    rope_dim: usize,
    freq_factors: Option<&[f32]>,
) {
    debug_assert!(rope_dim.is_multiple_of(2) && rope_dim > 0 && rope_dim <= x.len());
    let n_pairs = (rope_dim / 2).min(x.len() / 2);
    let ts = theta_scale(freq_base, rope_dim);
    for_each_angle(pos, ts, n_pairs, freq_factors, 1.0, |i, c, s| {
        (x[2 * i], x[2 * i + 1]) = scalar::rotate(x[2 * i], x[2 * i + 1], c, s);
    });
}

/// Rotates one head in place with NeoX pairs `(i, i + rope_dim/2)` for `i < rope_dim/2`;
/// the elements from `rope_dim` on are left unchanged.
///
/// When `rope_dim == head_dim` (every model we support) this pairs element `i` with
/// `i + head_dim/2`. Angles and preconditions as in [`rope_normal`].
pub fn rope_neox(
    x: &mut [f32],
    pos: usize,
    freq_base: f32,
    rope_dim: usize,
    freq_factors: Option<&[f32]>,
) {
    debug_assert!(rope_dim.is_multiple_of(2) && rope_dim > 0 && rope_dim <= x.len());
    let half = (rope_dim / 2).min(x.len() / 2);
    let ts = theta_scale(freq_base, rope_dim);
    for_each_angle(pos, ts, half, freq_factors, 1.0, |i, c, s| {
        (x[i], x[i + half]) = scalar::rotate(x[i], x[i + half], c, s);
    });
}

/// Cosines and sines for one position, computed once and applied to many heads.
///
/// Allocates its two `rope_dim/2` tables at construction and never again. Gives values
/// bit-identical to [`rope_normal`] / [`rope_neox`] (same angle code).
#[derive(Debug, Clone)]
pub struct RopeTable {
    rope_dim: usize,
    theta_scale: f32,
    freq_scale: f32,
    attn_factor: f32,
    freq_factors: Option<Vec<f32>>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    pos: Option<usize>,
}

impl RopeTable {
    /// A table for `rope_dim` rotated dimensions with base `freq_base` and optional
    /// per-pair frequency factors (`rope_freqs.weight`, at least `rope_dim/2` values).
    pub fn new(
        rope_dim: usize,
        freq_base: f32,
        freq_factors: Option<&[f32]>,
    ) -> Result<RopeTable, RopeError> {
        if rope_dim == 0 || !rope_dim.is_multiple_of(2) {
            return Err(RopeError::BadRopeDim(rope_dim));
        }
        if !(freq_base.is_finite() && freq_base > 0.0) {
            return Err(RopeError::BadFreqBase(freq_base));
        }
        let n_pairs = rope_dim / 2;
        if let Some(ff) = freq_factors {
            if ff.len() < n_pairs {
                return Err(RopeError::FreqFactorsTooShort {
                    need: n_pairs,
                    got: ff.len(),
                });
            }
        }
        Ok(RopeTable {
            rope_dim,
            theta_scale: theta_scale(freq_base, rope_dim),
            freq_scale: 1.0,
            attn_factor: 1.0,
            freq_factors: freq_factors.map(|ff| ff[..n_pairs].to_vec()),
            cos: vec![0.0; n_pairs],
            sin: vec![0.0; n_pairs],
            pos: None,
        })
    }

    /// Linear position interpolation (`rope.scaling.type = linear`): every angle is
    /// multiplied by `freq_scale` (1.0 = off, the default).
    pub fn with_freq_scale(mut self, freq_scale: f32) -> Result<RopeTable, RopeError> {
        if !(freq_scale.is_finite() && freq_scale > 0.0) {
            return Err(RopeError::BadFreqScale(freq_scale));
        }
        self.freq_scale = freq_scale;
        self.pos = None;
        Ok(self)
    }

    /// Scales every cosine and sine by `attn_factor` (`rope.scaling.attn_factor`,
    /// Phi-3's LongRoPE; 1.0 = off), as the reference's `cosf(θ)·mscale`.
    pub fn with_attn_factor(mut self, attn_factor: f32) -> Result<RopeTable, RopeError> {
        if !(attn_factor.is_finite() && attn_factor > 0.0) {
            return Err(RopeError::BadFreqScale(attn_factor));
        }
        self.attn_factor = attn_factor;
        self.pos = None;
        Ok(self)
    }

    /// Number of rotated dimensions.
    pub fn rope_dim(&self) -> usize {
        self.rope_dim
    }

    /// The position the table currently holds, if any.
    pub fn position(&self) -> Option<usize> {
        self.pos
    }

    /// Fills the table for `pos` (no-op if it already holds `pos`).
    pub fn set_position(&mut self, pos: usize) {
        if self.pos == Some(pos) {
            return;
        }
        let (cos, sin) = (&mut self.cos, &mut self.sin);
        let m = self.attn_factor;
        for_each_angle(
            pos,
            self.theta_scale,
            cos.len(),
            self.freq_factors.as_deref(),
            self.freq_scale,
            |i, c, s| {
                cos[i] = c * m;
                sin[i] = s * m;
            },
        );
        self.pos = Some(pos);
    }

    /// Cosines of the current position, one per pair.
    pub fn cos(&self) -> &[f32] {
        &self.cos
    }

    /// Sines of the current position, one per pair.
    pub fn sin(&self) -> &[f32] {
        &self.sin
    }

    /// Rotates one head (`x.len() >= rope_dim`) at the current position. Elements from
    /// `rope_dim` on are unchanged. Call [`RopeTable::set_position`] first (a table
    /// that was never positioned holds all-zero cos/sin and must not be applied:
    /// `debug_assert!`).
    pub fn apply(&self, x: &mut [f32], style: RopeStyle) {
        debug_assert!(self.pos.is_some(), "RopeTable::apply before set_position");
        debug_assert!(x.len() >= self.rope_dim, "head shorter than rope_dim");
        match style {
            RopeStyle::Normal => scalar::rotate_adjacent_pairs(x, &self.cos, &self.sin),
            RopeStyle::Neox => {
                let n = self.rope_dim.min(x.len());
                scalar::rotate_half_pairs(&mut x[..n], &self.cos, &self.sin)
            }
        }
    }

    /// Rotates every head of a row laid out as `[n_heads, head_dim]` (`x.len()` a
    /// multiple of `head_dim`, `head_dim >= rope_dim`).
    pub fn apply_heads(&self, x: &mut [f32], head_dim: usize, style: RopeStyle) {
        debug_assert!(head_dim >= self.rope_dim && head_dim > 0);
        debug_assert_eq!(x.len() % head_dim.max(1), 0);
        if head_dim == 0 {
            return;
        }
        for head in x.chunks_exact_mut(head_dim) {
            self.apply(head, style);
        }
    }
}
