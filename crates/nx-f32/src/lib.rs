//! Dense f32 kernels: dot, axpy, rmsnorm, rope, softmax, activations, attention primitives.
//!
//! Everything works on caller-provided slices and never allocates in a hot loop. The
//! reference definitions live in [`scalar`]; the functions at the crate root are the
//! ones callers use, and mostly forward to [`scalar`]. Where a SIMD twin exists
//! (`dot_f16` and `axpy_f16`, AVX2, used by attention over an f16 KV cache) the root
//! function dispatches on the process's CPU tier (`nx_syscalls::cpu_tier`); the twins
//! are bit-identical to their scalar references and tested against them.
//!
//! Reduction order is part of the contract: every reduction runs in an order fixed by
//! the slice lengths alone, so results never depend on how work is chunked or threaded
//! (the engine's batch-invariance guarantee rests on this).
//!
//! Arithmetic follows ggml's CPU backend where it matters for matching the reference
//! engine: RMSNorm sums squares in f64, softmax sums exponentials in f64, RoPE angles
//! are built by repeated f32 multiplication (see [`rope`]), SiLU is `x/(1+e^−x)`.
//!
//! Slice-length mismatches are caller bugs: they trip `debug_assert!`s, and release
//! builds process the common prefix — never undefined behaviour.

pub mod attention;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod convert;
pub mod gelu_table;
mod kv_rows;
pub mod rope;
pub mod scalar;

pub use attention::{
    attend, attend_group, attend_group_portable, attend_group_scratch_len, attend_head,
    attend_portable, attend_scratch_len, CacheView, HeadRows, KvElem, KvPrecision, Scoring,
    MAX_HEAD_DIM,
};
#[cfg(target_arch = "x86_64")]
pub use attention::{attend_avx2, attend_avx512, attend_group_avx2, attend_group_avx512};
pub use convert::{
    bf16_le_bytes_to_f32_row, bf16_to_f32_row, f16_le_bytes_to_f32_row, f16_to_f32_row,
    f32_to_bf16_row, f32_to_f16_row,
};
pub use gelu_table::GeluTable;
pub use half::{bf16, f16};
pub use rope::{
    rope_neox, rope_normal, rotate_heads, theta_scale, RopeError, RopeStyle, RopeTable,
};

/// Dot product `Σ a[i]·b[i]` (lane order: [`scalar::DOT_LANES`]).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    scalar::dot(a, b)
}

/// True when the f16 helpers run their AVX2 twins: the process tier
/// (`nx_syscalls::cpu_tier`, lowered by `NX_TIER`) is AVX2 or higher and the CPU has
/// AVX2 and F16C. The twins are bit-identical to the scalar references, so this only
/// changes speed; an unusable `NX_TIER` picks scalar here (the quantized matmul is
/// where that error is reported).
#[cfg(target_arch = "x86_64")]
fn use_avx2() -> bool {
    use nx_syscalls::CpuTier;
    static USE_AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USE_AVX2.get_or_init(|| {
        matches!(
            nx_syscalls::cpu_tier(),
            Ok(CpuTier::Avx2 | CpuTier::Avx512Vnni)
        ) && avx2::available()
    })
}

/// True when the attention kernel runs its AVX-512 build: the process tier is
/// AVX-512 VNNI and the CPU has AVX-512 F, AVX2, FMA and F16C. Bit-identical to the
/// portable build.
#[cfg(target_arch = "x86_64")]
fn use_avx512() -> bool {
    use nx_syscalls::CpuTier;
    static USE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USE.get_or_init(|| {
        matches!(nx_syscalls::cpu_tier(), Ok(CpuTier::Avx512Vnni)) && avx512::available()
    })
}

/// True when the attention kernel runs its AVX2 + FMA build: the process tier allows
/// AVX2 and the CPU has AVX2 and FMA. Bit-identical to the portable build.
#[cfg(target_arch = "x86_64")]
fn use_avx2_fma() -> bool {
    use nx_syscalls::CpuTier;
    static USE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USE.get_or_init(|| {
        matches!(
            nx_syscalls::cpu_tier(),
            Ok(CpuTier::Avx2 | CpuTier::Avx512Vnni)
        ) && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
    })
}

/// True when the CPU has AVX2 and FMA, whatever the tier: the portable attention code's
/// copies compiled for them (the same source, so the same bits) run even at the scalar
/// tier, where fused multiply-adds would otherwise be a library call each.
#[cfg(target_arch = "x86_64")]
fn cpu_has_avx2_fma() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

/// Dot product of an f32 vector with an f16 row, same order as [`dot`] (AVX2 when the
/// tier allows, bit-identical to [`scalar::dot_f16`]).
#[inline]
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: `use_avx2` verified AVX2 and F16C on this CPU.
        return unsafe { avx2::dot_f16(a, b) };
    }
    scalar::dot_f16(a, b)
}

/// `y += alpha·f32(x)` for an f16 row, multiply then add (AVX2 when the tier allows,
/// bit-identical to [`scalar::axpy_f16`]).
#[inline]
pub fn axpy_f16(y: &mut [f32], alpha: f32, x: &[f16]) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: `use_avx2` verified AVX2 and F16C on this CPU.
        return unsafe { avx2::axpy_f16(y, alpha, x) };
    }
    scalar::axpy_f16(y, alpha, x)
}

/// `y += alpha·x`, element-wise.
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    scalar::axpy(y, alpha, x)
}

/// `x *= s`, element-wise.
#[inline]
pub fn scale(x: &mut [f32], s: f32) {
    scalar::scale(x, s)
}

/// `acc += x`, element-wise (residual adds, biases).
#[inline]
pub fn add_in_place(acc: &mut [f32], x: &[f32]) {
    scalar::add_in_place(acc, x)
}

/// `acc *= x`, element-wise.
#[inline]
pub fn mul_in_place(acc: &mut [f32], x: &[f32]) {
    scalar::mul_in_place(acc, x)
}

/// RMSNorm: `out = x / sqrt(mean(x²) + eps) · weight` (see [`scalar::rms_scale`] for
/// the exact arithmetic). `out`, `x` and `weight` have the same length.
#[inline]
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    scalar::rmsnorm(out, x, weight, eps)
}

/// [`rmsnorm`] in place.
#[inline]
pub fn rmsnorm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    scalar::rmsnorm_in_place(x, weight, eps)
}

/// [`rmsnorm`] over each row of a row-major `[n, dim]` matrix (`weight.len() == dim`,
/// `x.len() == out.len() == n·dim`). Each row is normalised independently, so a row's
/// result does not depend on `n`. A zero `dim` does nothing.
pub fn rmsnorm_rows(out: &mut [f32], x: &[f32], weight: &[f32], dim: usize, eps: f32) {
    debug_assert_eq!(out.len(), x.len(), "rmsnorm_rows: out/x length mismatch");
    debug_assert!(
        dim == 0 || x.len().is_multiple_of(dim),
        "rmsnorm_rows: ragged rows"
    );
    if dim == 0 {
        return;
    }
    for (o, xr) in out.chunks_mut(RMS_ROWS * dim).zip(x.chunks(RMS_ROWS * dim)) {
        let scales = rms_scales_of(xr, dim, eps);
        for ((o, xr), s) in o
            .chunks_exact_mut(dim)
            .zip(xr.chunks_exact(dim))
            .zip(scales)
        {
            for ((o, &xi), &w) in o.iter_mut().zip(xr).zip(weight) {
                *o = xi * s * w;
            }
        }
    }
}

/// Rows whose RMSNorm sums [`rms_scales_of`] forms at once.
const RMS_ROWS: usize = 16;

/// The RMSNorm scales ([`scalar::rms_scale`]'s bits) of the up to [`RMS_ROWS`] rows of
/// `dim` values in `rows`, first to last (the rest of the array is 0). Groups of eight
/// rows go side by side — transposed in registers where the tier has AVX2
/// (`avx2::square_sums`), else [`scalar::rms_scales`] — the rest one by one.
fn rms_scales_of(rows: &[f32], dim: usize, eps: f32) -> [f32; RMS_ROWS] {
    let n_rows = rows.len() / dim;
    debug_assert!(n_rows <= RMS_ROWS);
    let row = |r: usize| &rows[r * dim..][..dim];
    let mut scales = [0.0f32; RMS_ROWS];
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        let group = |g: usize| -> [&[f32]; 8] { std::array::from_fn(|r| row(8 * g + r)) };
        let finish = |sum: f64| scalar::scale_of_sum(sum, dim, eps);
        if n_rows == 16 {
            // SAFETY: the CPU has AVX2 (`use_avx2`).
            let sums = unsafe { avx2::square_sums::<2>([group(0), group(1)]) };
            for (s, sum) in scales.iter_mut().zip(sums.into_iter().flatten()) {
                *s = finish(sum);
            }
            done = 16;
        } else if n_rows >= 8 {
            // SAFETY: as above.
            let [sums] = unsafe { avx2::square_sums::<1>([group(0)]) };
            for (s, sum) in scales.iter_mut().zip(sums) {
                *s = finish(sum);
            }
            done = 8;
        }
    }
    while n_rows - done >= 8 {
        let group: [&[f32]; 8] = std::array::from_fn(|r| row(done + r));
        scales[done..done + 8].copy_from_slice(&scalar::rms_scales(group, eps));
        done += 8;
    }
    for (r, s) in scales.iter_mut().enumerate().take(n_rows).skip(done) {
        *s = scalar::rms_scale(row(r), eps);
    }
    scales
}

/// [`rmsnorm_rows`] in place (also used for per-head Q/K norms with `dim = head_dim`).
pub fn rmsnorm_rows_in_place(x: &mut [f32], weight: &[f32], dim: usize, eps: f32) {
    debug_assert!(
        dim == 0 || x.len().is_multiple_of(dim),
        "rmsnorm_rows_in_place: ragged rows"
    );
    if dim == 0 {
        return;
    }
    for xr in x.chunks_mut(RMS_ROWS * dim) {
        let scales = rms_scales_of(xr, dim, eps);
        for (xr, s) in xr.chunks_exact_mut(dim).zip(scales) {
            for (xi, &w) in xr.iter_mut().zip(weight) {
                *xi = *xi * s * w;
            }
        }
    }
}

/// Max-subtracted softmax in place (sum in f64). All −∞ gives all zeros.
#[inline]
pub fn softmax_in_place(x: &mut [f32]) {
    scalar::softmax_in_place(x)
}

/// SiLU `x·σ(x)`, computed as `x / (1 + e^−x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    scalar::silu(x)
}

/// GELU, tanh approximation `0.5·x·(1 + tanh(sqrt(2/π)·x·(1 + 0.044715·x²)))`.
/// (ggml evaluates it through an f16 table instead; see [`GeluTable`].)
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    scalar::gelu_tanh(x)
}

pub use scalar::expf_vector;

/// `gate[i] = silu(gate[i])·up[i]` over one row with the reference engine's rounding
/// ([`scalar::swiglu_row_in_place`]); built for FMA when the tier allows, which turns
/// the vector exp's fused multiply-adds into instructions (same bits).
pub fn swiglu_row_in_place(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if use_avx512() {
        // SAFETY: `use_avx512` verified AVX-512 F/DQ, AVX2, FMA and F16C on this CPU.
        return unsafe { swiglu_row_avx512(gate, up) };
    }
    // The scalar code compiled for FMA, at every tier (the scalar one too) where the CPU
    // has it: the same bits.
    #[cfg(target_arch = "x86_64")]
    if cpu_has_avx2_fma() {
        // SAFETY: `cpu_has_avx2_fma` verified AVX2 and FMA on this CPU.
        return unsafe { swiglu_row_avx2(gate, up) };
    }
    scalar::swiglu_row_in_place(gate, up)
}

/// [`scalar::swiglu_row_in_place`] with the groups of 16 in 512-bit registers (the
/// vector exp of `avx512`, then the same division and products); bit-identical.
///
/// # Safety
/// The CPU must support AVX-512 F/DQ, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
pub unsafe fn swiglu_row_avx512(gate: &mut [f32], up: &[f32]) {
    // SAFETY: the caller's contract.
    unsafe { avx512::swiglu_row(gate, up) }
}

/// [`scalar::swiglu_row_in_place`] compiled for AVX2 + FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn swiglu_row_avx2(gate: &mut [f32], up: &[f32]) {
    scalar::swiglu_row_in_place(gate, up)
}

/// `x = silu(x)`, element-wise.
pub fn silu_in_place(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = scalar::silu(*v);
    }
}

/// `x = gelu_tanh(x)`, element-wise.
pub fn gelu_tanh_in_place(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = scalar::gelu_tanh(*v);
    }
}

/// SwiGLU: `out = silu(gate)·up`, element-wise.
#[inline]
pub fn swiglu(out: &mut [f32], gate: &[f32], up: &[f32]) {
    scalar::swiglu(out, gate, up)
}

/// GeGLU: `out = gelu_tanh(gate)·up`, element-wise.
#[inline]
pub fn geglu(out: &mut [f32], gate: &[f32], up: &[f32]) {
    scalar::geglu(out, gate, up)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_constants_match_their_definitions() {
        let sqrt_2_over_pi = (2.0f64 / std::f64::consts::PI).sqrt();
        assert_eq!(scalar::SQRT_2_OVER_PI, sqrt_2_over_pi as f32);
        assert_eq!(scalar::GELU_COEF_A, 0.044715f64 as f32);
    }
}
