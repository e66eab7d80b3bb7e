//! Q4_1: 32 weights as unsigned 4-bit levels with a scale and an offset, `w = d·q + m`;
//! multiplied with Q8_1 activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..4 | `m` f16 |
//! | 4..20 | `qs[16]`: low nibbles are weights 0..16, high nibbles 16..32 |

use nx_gguf::GgmlType;

use super::block::{f32_to_f16, read_f16, BlockFormat};
use super::q8_1;
use crate::reduce::{quad_lanes, Lanes8};

/// Bytes of one block.
pub const BYTES: usize = 20;
/// `m` f16.
pub const M: usize = 2;
/// `qs[16]`.
pub const QS: usize = 4;
const _: () = assert!(QS + 16 == BYTES && GgmlType::Q4_1.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q4_1,
    block_len: 32,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_1, dot)),
    dot4: None,
    quantize_block: Some(quantize_block),
};

/// The 32 levels of a block, in weight order.
#[inline(always)]
pub(crate) fn levels(b: &[u8]) -> [i32; 32] {
    let mut q = [0i32; 32];
    for j in 0..16 {
        q[j] = (b[QS + j] & 0x0F) as i32;
        q[j + 16] = (b[QS + j] >> 4) as i32;
    }
    q
}

/// `y = q·d + m`, each product rounded before the add (ggml's `dequantize_row_q4_1`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    offset_dequantize(b, y, levels);
}

/// Q4_1 × Q8_1 in the order of ggml's AVX2 kernel (see `offset_dot`).
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    offset_dot(w, x, BYTES, levels)
}

/// Dequantization of an offset block (Q4_1, Q5_1: `d` and `m` at the same offsets):
/// `y = q·d + m`, each product rounded before the add.
pub(crate) fn offset_dequantize(b: &[u8], y: &mut [f32], levels: fn(&[u8]) -> [i32; 32]) {
    let (d, m) = (read_f16(b, 0), read_f16(b, M));
    for (v, q) in y.iter_mut().zip(levels(b)) {
        *v = q as f32 * d + m;
    }
}

/// An offset format (Q4_1, Q5_1) × Q8_1 in the order of ggml's AVX2 kernels: eight lanes
/// fed per block by `fma(d_w·d_x, lane)`, the offset terms `m_w·s_x` in one running f32
/// (a fused multiply-add each: GCC contracts `summs += m*s`), added after the lane sum.
pub(crate) fn offset_dot(
    w: &[u8],
    x: &[u8],
    block_bytes: usize,
    levels: fn(&[u8]) -> [i32; 32],
) -> f32 {
    let mut acc = Lanes8::default();
    let mut summs = 0.0f32;
    for (wb, xb) in w.chunks_exact(block_bytes).zip(x.chunks_exact(q8_1::BYTES)) {
        summs = read_f16(wb, M).mul_add(read_f16(xb, q8_1::S), summs);
        let lanes = quad_lanes(&levels(wb), &xb[q8_1::QS..]);
        acc.fma_block(read_f16(wb, 0) * read_f16(xb, 0), &lanes);
    }
    acc.sum() + summs
}

/// Min/max quantization, as ggml's `quantize_row_q4_1_ref`: `d = (max − min)/15`,
/// `q = min(15, trunc((x − min)/d + 0.5))`.
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let q = quantize_min_max(x, 15, b);
    for j in 0..16 {
        b[QS + j] = q[j] | (q[j + 16] << 4);
    }
}

/// Writes `d` and `m` of a min/max block with levels `0..=max_level` and returns the
/// levels (shared with Q5_1, whose `d` and `m` sit at the same offsets).
pub(crate) fn quantize_min_max(x: &[f32], max_level: u8, b: &mut [u8]) -> [u8; 32] {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / max_level as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    b[M..M + 2].copy_from_slice(&f32_to_f16(min).to_le_bytes());
    let mut q = [0u8; 32];
    for (qi, &v) in q.iter_mut().zip(x) {
        // C's `(int8_t)(f + 0.5f)` truncates toward zero.
        *qi = (((v - min) * id + 0.5) as i8).min(max_level as i8) as u8;
    }
    q
}
