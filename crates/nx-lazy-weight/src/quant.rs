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
    f16_bits_at_least, f16_to_f32, f32_to_bf16, f32_to_f16, nearest_int, pack_scale_min_k4, q4_k,
    q5_0, q6_k, q8_k, row_bytes, signed_abs_max, Q4_0_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q5_K_BYTES,
    Q6_K_BYTES, Q8_0_BYTES, Q8_K_BYTES, QK32, QK_K,
};
use crate::LazyWeightError;

/// Quantize one row of `x.len()` values to `ggml_type` into `out` (the row's bytes).
///
/// Supported: F32, F16, BF16, Q8_0, Q8_K, Q8_1 (activations: bit-exact with ggml) and
/// Q4_0, Q5_0, Q4_K, Q5_K, Q6_K and the weight formats of
/// [`crate::formats::BLOCK_FORMATS`] (weights: Q4_1 and Q5_1 as ggml's reference
/// quantizers, the others this crate's own simple ones, for fixtures).
pub fn quantize_row(ggml_type: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), LazyWeightError> {
    let f: fn(&[f32], &mut [u8]) = match ggml_type {
        GgmlType::F32 => quantize_f32,
        GgmlType::F16 => quantize_f16,
        GgmlType::BF16 => quantize_bf16,
        GgmlType::Q8_0 => quantize_q8_0_unchecked,
        GgmlType::Q8_K => quantize_q8_k_unchecked,
        GgmlType::Q4_0 => quantize_q4_0_unchecked,
        GgmlType::Q5_0 => quantize_q5_0_unchecked,
        GgmlType::Q4_K => quantize_q4_k_unchecked,
        GgmlType::Q5_K => quantize_q5_k_unchecked,
        GgmlType::Q6_K => quantize_q6_k_unchecked,
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

pub(crate) fn quantize_q8_0_unchecked(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK32).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let mut amax = 0.0f32;
        for &v in xb {
            let a = v.abs();
            // ggml's MAX(a, b) is `a > b ? a : b`: keep the running max unless beaten.
            amax = if amax > a { amax } else { a };
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (o, &v) in ob[2..].iter_mut().zip(xb) {
            // `round` is half away from zero, as C's roundf.
            *o = (v * id).round() as i8 as u8;
        }
    }
}

/// Q8_0 for activations, the way ggml's x86 build quantizes them before a Q4_0/Q5_0/Q8_0
/// dot product: the multiplier is `127/amax` (not `1/(amax/127)`) and rounding is to
/// nearest-even. It differs from the reference quantizer in the last bit of rare
/// elements; using the same one as the reference engine keeps our logits next to its.
pub(crate) fn quantize_q8_0_acts(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK32).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (o, &v) in ob[2..].iter_mut().zip(xb) {
            *o = nearest_int(v * id).clamp(-128, 127) as i8 as u8;
        }
    }
}

pub(crate) fn quantize_q8_k_unchecked(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(crate::active_tier(), Ok(crate::CpuTier::Avx512Vnni)) && crate::avx512::available()
    {
        // SAFETY: the CPU has the AVX-512 VNNI tier's features (checked).
        return unsafe { crate::avx512::quantize_q8_k(x, out) };
    }
    quantize_q8_k_scalar(x, out)
}

/// The portable Q8_K quantizer (the reference for [`crate::avx512::quantize_q8_k`]).
pub fn quantize_q8_k_scalar(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in xb {
            let a = v.abs();
            if a > amax {
                amax = a;
                max = v;
            }
        }
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        let iscale = -127.0f32 / max;
        let mut quants = [0i8; QK_K];
        for (q, &v) in quants.iter_mut().zip(xb) {
            let r = nearest_int(iscale * v);
            *q = r.min(127) as i8;
        }
        ob[..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
        for (o, &q) in ob[q8_k::QS..q8_k::QS + QK_K].iter_mut().zip(&quants) {
            *o = q as u8;
        }
        for (j, group) in quants.chunks_exact(16).enumerate() {
            let sum: i32 = group.iter().map(|&q| q as i32).sum();
            let at = q8_k::BSUMS + 2 * j;
            ob[at..at + 2].copy_from_slice(&(sum as i16).to_le_bytes());
        }
    }
}

/// Q4_0 / Q5_0 style: `d = max/−levels_half` so the extreme element is level 0,
/// `q = clamp(trunc(x/d + half + 0.5), 0, 2·half − 1)`.
fn quantize_signed_32(xb: &[f32], half_levels: i32) -> (u16, [u8; QK32]) {
    let max = signed_abs_max(xb);
    let d_bits = f32_to_f16(max / -(half_levels as f32));
    let d = f16_to_f32(d_bits);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; QK32];
    for (qi, &v) in q.iter_mut().zip(xb) {
        let level = (v * id + half_levels as f32 + 0.5).trunc() as i32;
        *qi = level.clamp(0, 2 * half_levels - 1) as u8;
    }
    (d_bits, q)
}

fn quantize_q4_0_unchecked(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK32).zip(out.chunks_exact_mut(Q4_0_BYTES)) {
        let (d_bits, q) = quantize_signed_32(xb, 8);
        ob[..2].copy_from_slice(&d_bits.to_le_bytes());
        for j in 0..16 {
            ob[2 + j] = q[j] | (q[j + 16] << 4);
        }
    }
}

fn quantize_q5_0_unchecked(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK32).zip(out.chunks_exact_mut(Q5_0_BYTES)) {
        let (d_bits, q) = quantize_signed_32(xb, 16);
        ob[..2].copy_from_slice(&d_bits.to_le_bytes());
        let mut qh = 0u32;
        for j in 0..16 {
            ob[q5_0::QS + j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
            qh |= ((q[j] >> 4) as u32) << j;
            qh |= ((q[j + 16] >> 4) as u32) << (j + 16);
        }
        ob[q5_0::QH..q5_0::QH + 4].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Sub-block scales and mins of a Q4_K/Q5_K super-block, and the quants.
///
/// Per sub-block of 32: offset `dmin·m ≥ −min(0, x)` (mins rounded up), then the
/// step `d·sc` is rounded up so that `offset + max_level·step ≥ max x`; quants are
/// `round((x + offset)/step)`, so the error is at most half a step.
fn quantize_k_asym(xb: &[f32], max_level: u8, q: &mut [u8; QK_K]) -> (u16, u16, [u8; 8], [u8; 8]) {
    let mut neg_min = [0f32; 8];
    let mut max = [0f32; 8];
    for (j, sub) in xb.chunks_exact(32).enumerate() {
        let lo = sub.iter().fold(0.0f32, |a, &v| a.min(v));
        let hi = sub.iter().fold(0.0f32, |a, &v| a.max(v));
        neg_min[j] = -lo;
        max[j] = hi;
    }
    let dmin_bits = f16_bits_at_least(neg_min.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0);
    let dmin = f16_to_f32(dmin_bits);
    let mut m_q = [0u8; 8];
    let mut offset = [0f32; 8];
    for j in 0..8 {
        m_q[j] = if dmin > 0.0 {
            (neg_min[j] / dmin).ceil().min(63.0) as u8
        } else {
            0
        };
        offset[j] = dmin * m_q[j] as f32;
    }
    let mut step_needed = [0f32; 8];
    for j in 0..8 {
        step_needed[j] = (max[j] + offset[j]) / max_level as f32;
    }
    let d_bits = f16_bits_at_least(step_needed.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0);
    let d = f16_to_f32(d_bits);
    let mut sc_q = [0u8; 8];
    for j in 0..8 {
        sc_q[j] = if d > 0.0 {
            (step_needed[j] / d).ceil().min(63.0) as u8
        } else {
            0
        };
    }
    for (j, sub) in xb.chunks_exact(32).enumerate() {
        // The same f32 products the dequantizer forms.
        let step = d * sc_q[j] as f32;
        let off = dmin * m_q[j] as f32;
        for (l, &v) in sub.iter().enumerate() {
            q[32 * j + l] = if step > 0.0 {
                ((v + off) / step).round().clamp(0.0, max_level as f32) as u8
            } else {
                0
            };
        }
    }
    (d_bits, dmin_bits, sc_q, m_q)
}

fn quantize_q4_k_unchecked(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q4_K_BYTES)) {
        let mut q = [0u8; QK_K];
        let (d_bits, dmin_bits, sc, m) = quantize_k_asym(xb, 15, &mut q);
        ob[..2].copy_from_slice(&d_bits.to_le_bytes());
        ob[q4_k::DMIN..q4_k::DMIN + 2].copy_from_slice(&dmin_bits.to_le_bytes());
        pack_scale_min_k4(&sc, &m, &mut ob[q4_k::SCALES..q4_k::SCALES + 12]);
        for chunk in 0..4 {
            for l in 0..32 {
                ob[q4_k::QS + 32 * chunk + l] = q[64 * chunk + l] | (q[64 * chunk + 32 + l] << 4);
            }
        }
    }
}

fn quantize_q5_k_unchecked(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q5_K_BYTES)) {
        let mut q = [0u8; QK_K];
        let (d_bits, dmin_bits, sc, m) = quantize_k_asym(xb, 31, &mut q);
        ob[..2].copy_from_slice(&d_bits.to_le_bytes());
        ob[q4_k::DMIN..q4_k::DMIN + 2].copy_from_slice(&dmin_bits.to_le_bytes());
        pack_scale_min_k4(&sc, &m, &mut ob[q4_k::SCALES..q4_k::SCALES + 12]);
        ob[q4_k::Q5_QH..q4_k::Q5_QH + 32].fill(0);
        for chunk in 0..4 {
            for l in 0..32 {
                let lo = q[64 * chunk + l];
                let hi = q[64 * chunk + 32 + l];
                ob[q4_k::Q5_QS + 32 * chunk + l] = (lo & 0x0F) | ((hi & 0x0F) << 4);
                ob[q4_k::Q5_QH + l] |= ((lo >> 4) << (2 * chunk)) | ((hi >> 4) << (2 * chunk + 1));
            }
        }
    }
}

fn quantize_q6_k_unchecked(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q6_K_BYTES)) {
        // Symmetric per 16: step = amax/31 so levels −31..31 cover the sub-block.
        let mut step_needed = [0f32; 16];
        for (j, sub) in xb.chunks_exact(16).enumerate() {
            step_needed[j] = sub.iter().fold(0.0f32, |a, &v| a.max(v.abs())) / 31.0;
        }
        let d_bits = f16_bits_at_least(step_needed.iter().fold(0.0f32, |a, &v| a.max(v)) / 127.0);
        let d = f16_to_f32(d_bits);
        let mut sc = [0i8; 16];
        let mut q = [0u8; QK_K]; // q + 32, in 0..64
        for (j, sub) in xb.chunks_exact(16).enumerate() {
            sc[j] = if d > 0.0 {
                (step_needed[j] / d).ceil().min(127.0) as i8
            } else {
                0
            };
            let step = d * sc[j] as f32;
            for (l, &v) in sub.iter().enumerate() {
                let level = if step > 0.0 {
                    (v / step).round().clamp(-32.0, 31.0) as i32
                } else {
                    0
                };
                q[16 * j + l] = (level + 32) as u8;
            }
        }
        ob[q6_k::D..q6_k::D + 2].copy_from_slice(&d_bits.to_le_bytes());
        for (j, &s) in sc.iter().enumerate() {
            ob[q6_k::SCALES + j] = s as u8;
        }
        for half in 0..2 {
            let qs = &q[128 * half..128 * half + 128];
            for l in 0..32 {
                let (a, b, c, e) = (qs[l], qs[l + 32], qs[l + 64], qs[l + 96]);
                ob[q6_k::QL + 64 * half + l] = (a & 0x0F) | ((c & 0x0F) << 4);
                ob[q6_k::QL + 64 * half + l + 32] = (b & 0x0F) | ((e & 0x0F) << 4);
                ob[q6_k::QH + 32 * half + l] =
                    (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
            }
        }
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
