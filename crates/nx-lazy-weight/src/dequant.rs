//! Row dequantization, bit-exact with ggml's `dequantize_row_*`.
//!
//! Each value is computed with the same f32 operations in the same order as ggml
//! (for example Q4_K is `(d·sc)·q − (dmin·m)`, the two products rounded first), so
//! the results match ggml and the Python `gguf` package bit for bit; the golden test
//! `tests/dequant_golden.rs` checks this against fixtures made by the latter.

use nx_gguf::GgmlType;

use crate::formats::{bf16_to_f32, f16_to_f32, read_f32, row_bytes};
use crate::LazyWeightError;

/// Dequantize one row: `bytes` holds `out.len()` elements of type `ggml_type`.
///
/// Supported: F32, F16, BF16 and every format of [`crate::formats::BLOCK_FORMATS`]
/// (each module's `dequantize_block`). Errors when
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{f32_to_f16, Q4_0_BYTES, Q5_0_BYTES};

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
            dequantize_row(GgmlType::NVFP4, &[0u8; 36], &mut [0f32; 64]),
            Err(LazyWeightError::UnsupportedType { .. })
        ));
    }
}
