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

/// YaRN's setup of a table: the ramp's ends (pair indices) and its weight.
#[derive(Debug, Clone, Copy)]
struct Yarn {
    corr_dims: [f32; 2],
    ext_factor: f32,
}

/// The pair index at which `n_ctx_orig` positions make `n_rot` full rotations, as ggml's
/// `ggml_rope_yarn_corr_dim` computes it (f32, no fused operations).
fn yarn_corr_dim(rope_dim: usize, n_ctx_orig: usize, n_rot: f32, base: f32) -> f32 {
    let turns = n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI);
    rope_dim as f32 * turns.ln() / (2.0 * base.ln())
}

/// `[max(0, ⌊dim(beta_fast)⌋), min(rope_dim − 1, ⌈dim(beta_slow)⌉)]`.
fn yarn_corr_dims(rope_dim: usize, n_ctx_orig: usize, base: f32, fast: f32, slow: f32) -> [f32; 2] {
    let start = yarn_corr_dim(rope_dim, n_ctx_orig, fast, base).floor();
    let end = yarn_corr_dim(rope_dim, n_ctx_orig, slow, base).ceil();
    let last = (rope_dim as f32) - 1.0;
    [
        if 0.0 > start { 0.0 } else { start },
        if last < end { last } else { end },
    ]
}

/// `1 − clamp((i − low) / max(0.001, high − low), 0, 1)` for pair `i`.
fn yarn_ramp([low, high]: [f32; 2], i: usize) -> f32 {
    let span = if 0.001 > high - low {
        0.001
    } else {
        high - low
    };
    let y = (i as f32 - low) / span;
    let clamped = if 0.0 > y { 0.0 } else { y };
    1.0 - if 1.0 < clamped { 1.0 } else { clamped }
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
    yarn: Option<Yarn>,
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
            yarn: None,
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

    /// YaRN (`rope.scaling.type = yarn`): each pair's angle blends the interpolated
    /// angle (times `freq_scale`) and the original one by a ramp over the pairs between
    /// the correction dimensions of `n_ctx_orig` (`beta_fast` and `beta_slow` rotations),
    /// and the magnitudes grow by `1 + 0.1·ln(1/freq_scale)`, in the arithmetic of the
    /// reference's `rope_yarn` (its GCC build fuses the blend and the magnitude into
    /// multiply-adds). Call after [`RopeTable::with_freq_scale`].
    pub fn with_yarn(
        mut self,
        n_ctx_orig: usize,
        freq_base: f32,
        beta_fast: f32,
        beta_slow: f32,
    ) -> Result<RopeTable, RopeError> {
        for b in [beta_fast, beta_slow] {
            if !(b.is_finite() && b > 0.0) {
                return Err(RopeError::BadFreqScale(b));
            }
        }
        self.yarn = Some(Yarn {
            corr_dims: yarn_corr_dims(self.rope_dim, n_ctx_orig, freq_base, beta_fast, beta_slow),
            ext_factor: 1.0,
        });
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
        let (mut cos, mut sin) = (std::mem::take(&mut self.cos), std::mem::take(&mut self.sin));
        self.angles_at(pos, &mut cos, &mut sin);
        (self.cos, self.sin) = (cos, sin);
        self.pos = Some(pos);
    }

    /// Writes the cosines and sines of `pos` (what [`RopeTable::set_position`] would
    /// hold) to `cos` and `sin`, `rope_dim / 2` each, leaving the table as it is: so
    /// many positions' angles can be computed at once, on several threads, and applied
    /// with [`rotate_heads`].
    ///
    /// # Panics
    /// When `cos` or `sin` is not `rope_dim / 2` long.
    pub fn angles_at(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        let n_pairs = self.rope_dim / 2;
        assert!(
            cos.len() == n_pairs && sin.len() == n_pairs,
            "RopeTable::angles_at: {} cosines and {} sines for {n_pairs} pairs",
            cos.len(),
            sin.len()
        );
        let m = self.attn_factor;
        if let Some(y) = self.yarn {
            let (freq_scale, ff) = (self.freq_scale, self.freq_factors.as_deref());
            let m = m * 0.1f32.mul_add((1.0f32 / freq_scale).ln(), 1.0);
            let mut theta = pos as f32;
            for i in 0..n_pairs {
                let factor = ff.and_then(|f| f.get(i).copied()).unwrap_or(1.0);
                let extrap = theta / factor;
                let interp = freq_scale * extrap;
                let mix = yarn_ramp(y.corr_dims, i) * y.ext_factor;
                let angle = interp.mul_add(1.0 - mix, extrap * mix);
                cos[i] = angle.cos() * m;
                sin[i] = angle.sin() * m;
                theta *= self.theta_scale;
            }
            return;
        }
        for_each_angle(
            pos,
            self.theta_scale,
            n_pairs,
            self.freq_factors.as_deref(),
            self.freq_scale,
            |i, c, s| {
                cos[i] = c * m;
                sin[i] = s * m;
            },
        );
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
        rotate_head(&self.cos, &self.sin, x, style);
    }

    /// Rotates every head of a row laid out as `[n_heads, head_dim]` (`x.len()` a
    /// multiple of `head_dim`, `head_dim >= rope_dim`).
    pub fn apply_heads(&self, x: &mut [f32], head_dim: usize, style: RopeStyle) {
        debug_assert!(
            self.pos.is_some(),
            "RopeTable::apply_heads before set_position"
        );
        rotate_heads(&self.cos, &self.sin, x, head_dim, style);
    }
}

/// Rotates one head (`x.len() >= 2·cos.len()`) by one position's `cos` and `sin` (from
/// [`RopeTable::angles_at`]); elements from `2·cos.len()` on are unchanged.
#[inline(always)]
fn rotate_head(cos: &[f32], sin: &[f32], x: &mut [f32], style: RopeStyle) {
    let rope_dim = 2 * cos.len();
    debug_assert!(x.len() >= rope_dim, "head shorter than rope_dim");
    match style {
        RopeStyle::Normal => scalar::rotate_adjacent_pairs(x, cos, sin),
        RopeStyle::Neox => {
            let n = rope_dim.min(x.len());
            scalar::rotate_half_pairs(&mut x[..n], cos, sin)
        }
    }
}

/// Rotates every head of a row laid out as `[n_heads, head_dim]` (`x.len()` a multiple
/// of `head_dim`, `head_dim >= 2·cos.len()`) by one position's `cos` and `sin` (from
/// [`RopeTable::angles_at`]): [`RopeTable::apply_heads`] without the table, bit for bit.
pub fn rotate_heads(cos: &[f32], sin: &[f32], x: &mut [f32], head_dim: usize, style: RopeStyle) {
    #[cfg(target_arch = "x86_64")]
    // The portable code compiled with FMA, at every tier (the scalar one too) where the
    // CPU has it: the same bits.
    if crate::cpu_has_avx2_fma() {
        // SAFETY: cpu_has_avx2_fma verified AVX2 and FMA on this CPU.
        return unsafe { rotate_heads_fma(cos, sin, x, head_dim, style) };
    }
    rotate_heads_portable(cos, sin, x, head_dim, style)
}

/// [`rotate_heads`] compiled with FMA, so its fused multiply-adds are instructions (and
/// vectorized) instead of calls to the library's `fmaf`: the same operations.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rotate_heads_fma(
    cos: &[f32],
    sin: &[f32],
    x: &mut [f32],
    head_dim: usize,
    style: RopeStyle,
) {
    rotate_heads_portable(cos, sin, x, head_dim, style)
}

#[inline(always)]
fn rotate_heads_portable(
    cos: &[f32],
    sin: &[f32],
    x: &mut [f32],
    head_dim: usize,
    style: RopeStyle,
) {
    debug_assert!(head_dim >= 2 * cos.len() && head_dim > 0);
    debug_assert_eq!(x.len() % head_dim.max(1), 0);
    if head_dim == 0 {
        return;
    }
    for head in x.chunks_exact_mut(head_dim) {
        rotate_head(cos, sin, head, style);
    }
}
