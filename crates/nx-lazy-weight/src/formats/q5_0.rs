//! Q5_0: 32 weights as signed 5-bit levels `q − 16` with one scale, `w = d·(q − 16)`;
//! multiplied with Q8_0 activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..6 | `qh` u32: bit j is the fifth bit of weight j |
//! | 6..22 | `qs[16]`: low nibbles are weights 0..16, high nibbles 16..32 |

use nx_gguf::GgmlType;

use super::block::dot32_rows;
use super::block::{read_f16, read_u32, BlockFormat};
use super::q4_0::quantize_signed_32;

/// Bytes of one block.
pub const BYTES: usize = 22;
/// `qh`: u32, bit j is the fifth bit of weight j.
pub const QH: usize = 2;
/// `qs[16]`: low nibbles are weights 0..16, high nibbles 16..32.
pub const QS: usize = 6;
const _: () = assert!(QS + 16 == BYTES && GgmlType::Q5_0.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q5_0,
    block_len: 32,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_0, dot)),
    dot4: Some(dot4),
    quantize_block: Some(quantize_block),
};

/// `y = (q − 16)·d` (ggml's `dequantize_row_q5_0`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let qh = read_u32(b, QH);
    let qs = &b[QS..QS + 16];
    for j in 0..16 {
        let hi_bit_lo = (((qh >> j) << 4) & 0x10) as u8;
        let hi_bit_hi = ((qh >> (j + 12)) & 0x10) as u8;
        let lo = ((qs[j] & 0x0F) | hi_bit_lo) as i32 - 16;
        let hi = ((qs[j] >> 4) | hi_bit_hi) as i32 - 16;
        y[j] = lo as f32 * d;
        y[j + 16] = hi as f32 * d;
    }
}

/// Q5_0 × Q8_0 in the order of ggml's x86 kernel (as Q4_0's).
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    dot32_rows(w, BYTES, [x], quants)[0]
}

/// [`dot`] for four activation rows, each weight block decoded once: row `t`'s result
/// is `dot(w, x[t])`, bit for bit.
#[inline(always)]
pub fn dot4(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    dot32_rows(w, BYTES, x, quants)
}

/// The signed quants `q − 16` of one block (the fifth bits from `qh`).
#[inline(always)]
fn quants(wb: &[u8]) -> [i32; 32] {
    let qh = read_u32(wb, QH);
    let qs = &wb[QS..QS + 16];
    let mut wq = [0i32; 32];
    for j in 0..16 {
        let h_lo = ((qh >> j) & 1) << 4;
        let h_hi = ((qh >> (j + 16)) & 1) << 4;
        wq[j] = ((qs[j] & 0x0F) as u32 | h_lo) as i32 - 16;
        wq[j + 16] = ((qs[j] >> 4) as u32 | h_hi) as i32 - 16;
    }
    wq
}

/// Weights for fixtures (Q4_0's quantizer with 16 half levels).
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let (d_bits, q) = quantize_signed_32(x, 16);
    b[..2].copy_from_slice(&d_bits.to_le_bytes());
    let mut qh = 0u32;
    for j in 0..16 {
        b[QS + j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        qh |= ((q[j] >> 4) as u32) << j;
        qh |= ((q[j + 16] >> 4) as u32) << (j + 16);
    }
    b[QH..QH + 4].copy_from_slice(&qh.to_le_bytes());
}
