//! Quantizers: activation rows (Q8_0, Q8_K, F16, BF16) bit-exact with ggml's reference
//! quantizers, and weight rows (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) for fixtures.
//!
//! The activation quantizers choose the integers our dot products see, so they follow
//! ggml's `quantize_row_q8_0_ref` / `quantize_row_q8_K_ref` arithmetic exactly:
//! - Q8_0: `d = amax/127`, `id = 1/d` (0 when d is 0), `q = round_half_away(x·id)`,
//!   `d` stored as f16.
//! - Q8_K: take the element of largest magnitude `max` (first one on ties),
//!   `iscale = −127/max`, `q = min(127, round_half_even(iscale·x))`, `d = 1/iscale`
//!   stored as f32, and `bsums[j]` = sum of quants `16j..16j+16`. An all-zero block
//!   gets `d = 0`, zero quants and zero bsums.
//!
//! Note: ggml's x86 AVX/AVX2 build quantizes Q8_0 activations with a SIMD routine
//! that computes `id = 127/amax` and rounds half to even, which can differ from the
//! reference in the last integer of rare elements; we follow the reference (what
//! ggml's generic build and the Python `gguf` package do).
//!
//! The weight quantizers are this crate's own simple designs (not llama.cpp's
//! search-based ones): they round-trip within the format's resolution and exist to
//! build test models and fixtures.

use nx_gguf::GgmlType;

use crate::formats::{
    f32_to_bf16, f32_to_f16, q8_0, q8_k, row_bytes, Q8_0_BYTES, Q8_K_BYTES, QK32, QK_K,
};
use crate::LazyWeightError;

/// Quantize one row of `x.len()` values to `ggml_type` into `out` (the row's bytes).
///
/// Supported: F32, F16, BF16, Q8_0, Q8_K, Q8_1 (activations: bit-exact with ggml) and
/// Q4_0, Q5_0, Q4_K, Q5_K, Q6_K and the weight formats of
/// [`crate::formats::BLOCK_FORMATS`] (weights: Q4_1, Q5_1, MXFP4, TQ2_0 and TQ1_0 as
/// ggml's reference quantizers, the others this crate's own simple ones, for fixtures).
pub fn quantize_row(ggml_type: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), LazyWeightError> {
    let f: fn(&[f32], &mut [u8]) = match ggml_type {
        GgmlType::F32 => quantize_f32,
        GgmlType::F16 => quantize_f16,
        GgmlType::BF16 => quantize_bf16,
        // The one quantizer with a SIMD twin, chosen by tier.
        GgmlType::Q8_K => quantize_q8_k_unchecked,
        _ => {
            let format = crate::formats::block_format(ggml_type);
            let Some((quantize_block, format)) =
                format.and_then(|f| f.quantize_block.map(|q| (q, f)))
            else {
                return Err(LazyWeightError::UnsupportedType {
                    ggml_type,
                    op: "quantize",
                });
            };
            check_lengths(ggml_type, x, out)?;
            let blocks = x.chunks_exact(format.block_len);
            for (xb, ob) in blocks.zip(out.chunks_exact_mut(format.block_bytes)) {
                quantize_block(xb, ob);
            }
            return Ok(());
        }
    };
    check_lengths(ggml_type, x, out)?;
    f(x, out);
    Ok(())
}

/// Quantize activations to Q8_0 exactly as ggml's `quantize_row_q8_0_ref`.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) -> Result<(), LazyWeightError> {
    quantize_row(GgmlType::Q8_0, x, out)
}

/// Quantize activations to Q8_K exactly as ggml's `quantize_row_q8_K_ref`.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) -> Result<(), LazyWeightError> {
    quantize_row(GgmlType::Q8_K, x, out)
}

fn check_lengths(ggml_type: GgmlType, x: &[f32], out: &[u8]) -> Result<(), LazyWeightError> {
    let expected = row_bytes(ggml_type, x.len())?;
    if out.len() != expected {
        return Err(LazyWeightError::LengthMismatch {
            what: "quantize_row: output bytes",
            expected,
            actual: out.len(),
        });
    }
    Ok(())
}

fn quantize_f32(x: &[f32], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

fn quantize_f16(x: &[f32], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f32_to_f16(v).to_le_bytes());
    }
}

fn quantize_bf16(x: &[f32], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
    }
}

/// Q8_0 for activations as ggml's x86 build makes them (see
/// [`crate::formats::q8_0`]'s `quantize_acts_block`), for a whole row.
pub(crate) fn quantize_q8_0_acts(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(
        crate::active_tier(),
        Ok(crate::CpuTier::Avx2 | crate::CpuTier::Avx512Vnni)
    ) && crate::avx2::available()
    {
        // SAFETY: the CPU has the AVX2 tier's features (checked).
        return unsafe { crate::avx2::quantize_q8_0_acts(x, out) };
    }
    quantize_q8_0_acts_scalar(x, out)
}

/// The portable [`quantize_q8_0_acts`] (the reference for
/// `crate::avx2::quantize_q8_0_acts`).
pub(crate) fn quantize_q8_0_acts_scalar(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK32).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        q8_0::quantize_acts_block(xb, ob);
    }
}

pub(crate) fn quantize_q8_k_unchecked(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(crate::active_tier(), Ok(crate::CpuTier::Avx512Vnni)) && crate::avx512::available()
    {
        // SAFETY: the CPU has the AVX-512 VNNI tier's features (checked).
        return unsafe { crate::avx512::quantize_q8_k(x, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(crate::active_tier(), Ok(crate::CpuTier::Avx2)) && crate::avx2::available() {
        // SAFETY: the CPU has the AVX2 tier's features (checked).
        return unsafe { crate::avx2::quantize_q8_k(x, out) };
    }
    quantize_q8_k_scalar(x, out)
}

/// The portable Q8_K quantizer (the reference for `crate::avx512::quantize_q8_k` and
/// `crate::avx2::quantize_q8_k`).
pub fn quantize_q8_k_scalar(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        q8_k::quantize_block(xb, ob);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::read_i16;

    #[test]
    fn q8_k_bsums_and_extreme() {
        let x: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 100.0) * 0.25).collect();
        let mut out = vec![0u8; Q8_K_BYTES];
        quantize_row_q8_k(&x, &mut out).unwrap();
        let d = f32::from_le_bytes([out[0], out[1], out[2], out[3]]);
        // The largest magnitude (155·0.25, positive) maps to −127 so d is negative.
        assert!(d < 0.0);
        assert_eq!(out[q8_k::QS + 255] as i8, -127);
        for j in 0..16 {
            let sum: i32 = (0..16)
                .map(|l| out[q8_k::QS + 16 * j + l] as i8 as i32)
                .sum();
            assert_eq!(read_i16(&out, q8_k::BSUMS + 2 * j) as i32, sum);
        }
    }

    /// Uniform values in `[−0.5, 0.5)` from `seed` (a linear congruential generator).
    fn uniform(mut seed: u64) -> impl FnMut() -> f32 {
        move || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        }
    }

    /// Rows of 1024 values of `next` scaled to four spreads (1e-3 to 3e4).
    fn spread_rows(next: &mut impl FnMut() -> f32) -> Vec<Vec<f32>> {
        [1e-3f32, 1.0, 50.0, 3e4]
            .map(|spread| (0..1024).map(|_| next() * spread).collect())
            .to_vec()
    }

    /// The SIMD Q8_K quantizers (those this CPU runs) against the scalar one, byte for
    /// byte: random rows of several spreads, rows with ties of opposite sign for the
    /// largest magnitude, zero blocks, a single non-zero value, an infinity and a NaN.
    #[test]
    fn simd_q8_k_quantizers_match_scalar() {
        let mut next = uniform(11);
        let mut rows = spread_rows(&mut next);
        let mut ties: Vec<f32> = (0..512).map(|_| next()).collect();
        ties[7] = 2.0;
        ties[100] = -2.0;
        ties[256 + 200] = -3.0;
        ties[256 + 201] = 3.0;
        rows.push(ties);
        let mut sparse = vec![0.0f32; 768];
        sparse[300] = -0.25;
        rows.push(sparse);
        let mut odd: Vec<f32> = (0..512).map(|_| next()).collect();
        odd[17] = f32::NEG_INFINITY;
        odd[256 + 3] = f32::NAN;
        rows.push(odd);
        type Quantizer = unsafe fn(&[f32], &mut [u8]);
        #[allow(unused_mut)]
        let mut quantizers: Vec<(&str, Quantizer)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if crate::avx2::available() {
                quantizers.push(("avx2", crate::avx2::quantize_q8_k));
            }
            if crate::avx512::available() {
                quantizers.push(("avx512", crate::avx512::quantize_q8_k));
            }
        }
        for (name, quantize) in quantizers {
            for x in &rows {
                let n = x.len() / QK_K * Q8_K_BYTES;
                let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
                quantize_q8_k_scalar(x, &mut a);
                // SAFETY: the CPU has the quantizer's features (checked above); b holds
                // the blocks.
                unsafe { quantize(x, &mut b) };
                assert_eq!(a, b, "{name}");
            }
        }
    }

    /// The SIMD Q8_0 activation quantizer against the scalar one, byte for byte: rows of
    /// several spreads, values on rounding ties, zero blocks, a single non-zero value,
    /// infinities and a NaN.
    #[test]
    fn simd_q8_0_acts_quantizer_matches_scalar() {
        #[cfg(target_arch = "x86_64")]
        if crate::avx2::available() {
            let mut next = uniform(5);
            let mut rows = spread_rows(&mut next);
            // amax 127: d = 1, so halves land on ties (2.5, −2.5, 3.5).
            let mut ties: Vec<f32> = (0..64).map(|i| (i % 9) as f32 - 4.5).collect();
            ties[0] = 127.0;
            ties[32] = -127.0;
            ties[40] = 3.5;
            rows.push(ties);
            let mut sparse = vec![0.0f32; 96];
            sparse[40] = -0.25;
            rows.push(sparse);
            let mut odd: Vec<f32> = (0..128).map(|_| next()).collect();
            odd[17] = f32::NEG_INFINITY;
            odd[64 + 3] = f32::NAN;
            odd[96 + 5] = f32::INFINITY;
            odd[96 + 6] = f32::NAN;
            rows.push(odd);
            for x in &rows {
                let n = x.len() / QK32 * Q8_0_BYTES;
                let (mut a, mut b) = (vec![0u8; n], vec![0xAAu8; n]);
                quantize_q8_0_acts_scalar(x, &mut a);
                // SAFETY: the CPU has AVX2 and F16C (checked); b holds the blocks.
                unsafe { crate::avx2::quantize_q8_0_acts(x, &mut b) };
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn q8_k_zero_block_is_all_zero() {
        let mut out = vec![0xAAu8; Q8_K_BYTES];
        quantize_row_q8_k(&[0.0; QK_K], &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
    }

    #[test]
    fn q8_0_half_rounds_away_from_zero() {
        // amax 127 gives d = 1, id = 1: 2.5 → 3 and −2.5 → −3 (roundf), not 2 / −2.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let mut out = [0u8; Q8_0_BYTES];
        quantize_row_q8_0(&x, &mut out).unwrap();
        assert_eq!(out[2] as i8, 127);
        assert_eq!(out[3] as i8, 3);
        assert_eq!(out[4] as i8, -3);
    }

    #[test]
    fn unsupported_and_bad_lengths() {
        let mut out = [0u8; 84];
        assert!(matches!(
            quantize_row(GgmlType::IQ2_XXS, &[0.0; 256], &mut out),
            Err(LazyWeightError::UnsupportedType { .. })
        ));
        assert!(matches!(
            quantize_row(GgmlType::Q8_0, &[0.0; 32], &mut out),
            Err(LazyWeightError::LengthMismatch { .. })
        ));
    }
}
