//! Q5_1: 32 weights as unsigned 5-bit levels with a scale and an offset, `w = d·q + m`;
//! multiplied with Q8_1 activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..4 | `m` f16 |
//! | 4..8 | `qh` u32: bit j is the fifth bit of weight j |
//! | 8..24 | `qs[16]`: low nibbles are weights 0..16, high nibbles 16..32 |

use nx_gguf::GgmlType;

use super::block::{read_u32, BlockFormat};
use super::q4_1;

/// Bytes of one block.
pub const BYTES: usize = 24;
/// `m` f16 (where Q4_1 has it).
pub const M: usize = q4_1::M;
/// `qh` u32.
pub const QH: usize = 4;
/// `qs[16]`.
pub const QS: usize = 8;
const _: () = assert!(QS + 16 == BYTES && GgmlType::Q5_1.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q5_1,
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
    let qh = read_u32(b, QH);
    let mut q = [0i32; 32];
    for j in 0..16 {
        q[j] = ((b[QS + j] & 0x0F) as u32 | (((qh >> j) & 1) << 4)) as i32;
        q[j + 16] = ((b[QS + j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4)) as i32;
    }
    q
}

/// `y = q·d + m`, each product rounded before the add (ggml's `dequantize_row_q5_1`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    q4_1::offset_dequantize(b, y, levels);
}

/// Q5_1 × Q8_1 in the order of ggml's AVX2 kernel (as Q4_1's).
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    q4_1::offset_dot(w, x, BYTES, levels)
}

/// Min/max quantization, as ggml's `quantize_row_q5_1_ref` (`d = (max − min)/31`).
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let q = q4_1::quantize_min_max(x, 31, b);
    let mut qh = 0u32;
    for j in 0..16 {
        b[QS + j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        qh |= ((q[j] >> 4) as u32) << j;
        qh |= ((q[j + 16] >> 4) as u32) << (j + 16);
    }
    b[QH..QH + 4].copy_from_slice(&qh.to_le_bytes());
}
