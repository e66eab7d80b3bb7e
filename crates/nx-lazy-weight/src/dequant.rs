//! Row dequantization, bit-exact with ggml's `dequantize_row_*`.
//!
//! Each value is computed with the same f32 operations in the same order as ggml
//! (for example Q4_K is `(d·sc)·q − (dmin·m)`, the two products rounded first), so
//! the results match ggml and the Python `gguf` package bit for bit; the golden test
//! `tests/dequant_golden.rs` checks this against fixtures made by the latter.

use nx_gguf::GgmlType;

use crate::formats::{
    bf16_to_f32, f16_to_f32, q4_k, q5_0, q6_k, q8_k, read_f16, read_f32, read_u32, row_bytes,
    scale_min_k4, Q4_0_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_0_BYTES,
    Q8_K_BYTES, QK32, QK_K,
};
use crate::LazyWeightError;

/// Dequantize one row: `bytes` holds `out.len()` elements of type `ggml_type`.
///
/// Supported: F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K and every
/// format of [`crate::formats::BLOCK_FORMATS`]. Errors when
/// the type is unsupported, `out.len()` is not a whole number of blocks, or
/// `bytes.len()` is not the row's byte size.
pub fn dequantize_row(
    ggml_type: GgmlType,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), LazyWeightError> {
    if !crate::formats::can_dequantize(ggml_type) {
        return Err(LazyWeightError::UnsupportedType {
            ggml_type,
            op: "dequantize",
        });
    }
    let expected = row_bytes(ggml_type, out.len())?;
    if bytes.len() != expected {
        return Err(LazyWeightError::LengthMismatch {
            what: "dequantize_row: row bytes",
            expected,
            actual: bytes.len(),
        });
    }
    dequantize_row_unchecked(ggml_type, bytes, out);
    Ok(())
}

/// [`dequantize_row`] without the checks: lengths must already agree (a mismatch
/// only shortens the work, it cannot read out of bounds); unsupported types leave
/// `out` untouched.
pub(crate) fn dequantize_row_unchecked(ggml_type: GgmlType, bytes: &[u8], out: &mut [f32]) {
    match ggml_type {
        GgmlType::F32 => {
            for (y, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *y = read_f32(b, 0);
            }
        }
        GgmlType::F16 => {
            for (y, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *y = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::BF16 => {
            for (y, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::Q4_0 => zip_blocks(bytes, Q4_0_BYTES, out, QK32, dequantize_block_q4_0),
        GgmlType::Q5_0 => zip_blocks(bytes, Q5_0_BYTES, out, QK32, dequantize_block_q5_0),
        GgmlType::Q8_0 => zip_blocks(bytes, Q8_0_BYTES, out, QK32, dequantize_block_q8_0),
        GgmlType::Q4_K => zip_blocks(bytes, Q4_K_BYTES, out, QK_K, dequantize_block_q4_k),
        GgmlType::Q5_K => zip_blocks(bytes, Q5_K_BYTES, out, QK_K, dequantize_block_q5_k),
        GgmlType::Q6_K => zip_blocks(bytes, Q6_K_BYTES, out, QK_K, dequantize_block_q6_k),
        GgmlType::Q8_K => zip_blocks(bytes, Q8_K_BYTES, out, QK_K, dequantize_block_q8_k),
        _ => {
            if let Some(f) = crate::formats::block_format(ggml_type) {
                zip_blocks(bytes, f.block_bytes, out, f.block_len, f.dequantize_block);
            }
        }
    }
}

#[inline(always)]
fn zip_blocks(
    bytes: &[u8],
    block_bytes: usize,
    out: &mut [f32],
    block_len: usize,
    f: fn(&[u8], &mut [f32]),
) {
    for (b, y) in bytes
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(block_len))
    {
        f(b, y);
    }
}

fn dequantize_block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let qs = &b[2..2 + 16];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as i32 - 8;
        let hi = (qs[j] >> 4) as i32 - 8;
        y[j] = lo as f32 * d;
        y[j + 16] = hi as f32 * d;
    }
}

fn dequantize_block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let qh = read_u32(b, q5_0::QH);
    let qs = &b[q5_0::QS..q5_0::QS + 16];
    for j in 0..16 {
        let hi_bit_lo = (((qh >> j) << 4) & 0x10) as u8;
        let hi_bit_hi = ((qh >> (j + 12)) & 0x10) as u8;
        let lo = ((qs[j] & 0x0F) | hi_bit_lo) as i32 - 16;
        let hi = ((qs[j] >> 4) | hi_bit_hi) as i32 - 16;
        y[j] = lo as f32 * d;
        y[j + 16] = hi as f32 * d;
    }
}

fn dequantize_block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..2 + 32]) {
        *v = q as i8 as f32 * d;
    }
}

fn dequantize_block_q4_k(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, q4_k::DMIN);
    let scales = &b[q4_k::SCALES..q4_k::SCALES + 12];
    for chunk in 0..4 {
        let qs = &b[q4_k::QS + 32 * chunk..q4_k::QS + 32 * chunk + 32];
        let (sc_lo, m_lo) = scale_min_k4(2 * chunk, scales);
        let (sc_hi, m_hi) = scale_min_k4(2 * chunk + 1, scales);
        // ggml rounds d·sc and dmin·m to f32 first, then d1·q − m1.
        let d_lo = d * sc_lo as f32;
        let min_lo = dmin * m_lo as f32;
        let d_hi = d * sc_hi as f32;
        let min_hi = dmin * m_hi as f32;
        let out = &mut y[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            out[l] = d_lo * (qs[l] & 0x0F) as f32 - min_lo;
            out[l + 32] = d_hi * (qs[l] >> 4) as f32 - min_hi;
        }
    }
}

fn dequantize_block_q5_k(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, q4_k::DMIN);
    let scales = &b[q4_k::SCALES..q4_k::SCALES + 12];
    let qh = &b[q4_k::Q5_QH..q4_k::Q5_QH + 32];
    for chunk in 0..4 {
        let qs = &b[q4_k::Q5_QS + 32 * chunk..q4_k::Q5_QS + 32 * chunk + 32];
        let (sc_lo, m_lo) = scale_min_k4(2 * chunk, scales);
        let (sc_hi, m_hi) = scale_min_k4(2 * chunk + 1, scales);
        let d_lo = d * sc_lo as f32;
        let min_lo = dmin * m_lo as f32;
        let d_hi = d * sc_hi as f32;
        let min_hi = dmin * m_hi as f32;
        let bit_lo = 1u8 << (2 * chunk);
        let bit_hi = 1u8 << (2 * chunk + 1);
        let out = &mut y[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            let q_lo = (qs[l] & 0x0F) + if qh[l] & bit_lo != 0 { 16 } else { 0 };
            let q_hi = (qs[l] >> 4) + if qh[l] & bit_hi != 0 { 16 } else { 0 };
            out[l] = d_lo * q_lo as f32 - min_lo;
            out[l + 32] = d_hi * q_hi as f32 - min_hi;
        }
    }
}

/// The four signed 6-bit quants (`q − 32`) that Q6_K stores at position `l` (0..32)
/// of a 128-weight half: weights l, l+32, l+64, l+96 of that half.
#[inline(always)]
pub(crate) fn q6_k_quads(ql: &[u8], qh: &[u8], l: usize) -> [i8; 4] {
    let h = qh[l];
    [
        ((ql[l] & 0x0F) | ((h & 3) << 4)) as i8 - 32,
        ((ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) as i8 - 32,
        ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32,
        ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32,
    ]
}

fn dequantize_block_q6_k(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, q6_k::D);
    for half in 0..2 {
        let ql = &b[q6_k::QL + 64 * half..q6_k::QL + 64 * half + 64];
        let qh = &b[q6_k::QH + 32 * half..q6_k::QH + 32 * half + 32];
        let sc = &b[q6_k::SCALES + 8 * half..q6_k::SCALES + 8 * half + 8];
        let out = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q = q6_k_quads(ql, qh, l);
            // ggml: d * sc * q, evaluated left to right.
            for (k, &qk) in q.iter().enumerate() {
                out[l + 32 * k] = d * (sc[is + 2 * k] as i8) as f32 * qk as f32;
            }
        }
    }
}

fn dequantize_block_q8_k(b: &[u8], y: &mut [f32]) {
    let d = read_f32(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[q8_k::QS..q8_k::QS + QK_K]) {
        *v = d * q as i8 as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::f32_to_f16;

    #[test]
    fn q4_0_layout_low_nibbles_first() {
        let mut block = [0u8; Q4_0_BYTES];
        block[..2].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
        for j in 0..16 {
            block[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q4_0, &block, &mut y).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5);
        }
    }

    #[test]
    fn q5_0_fifth_bit_from_qh() {
        let mut block = [0u8; Q5_0_BYTES];
        block[..2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
        // Weight 3 and weight 16+5 get the fifth bit; every nibble is 0.
        let qh: u32 = (1 << 3) | (1 << (16 + 5));
        block[2..6].copy_from_slice(&qh.to_le_bytes());
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q5_0, &block, &mut y).unwrap();
        for (j, &v) in y.iter().enumerate() {
            let expect = if j == 3 || j == 21 { 0.0 } else { -16.0 };
            assert_eq!(v, expect, "weight {j}");
        }
    }

    #[test]
    fn errors_not_panics() {
        let mut y = [0f32; 32];
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut y),
            Err(LazyWeightError::LengthMismatch { .. })
        ));
        assert!(matches!(
            dequantize_row(GgmlType::Q4_K, &[0u8; 144], &mut y),
            Err(LazyWeightError::NotBlockMultiple { .. })
        ));
        assert!(matches!(
            dequantize_row(GgmlType::IQ2_XXS, &[0u8; 66], &mut [0f32; 256]),
            Err(LazyWeightError::UnsupportedType { .. })
        ));
    }
}
