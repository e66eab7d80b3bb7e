//! Q4_0: 32 weights as signed 4-bit levels `q − 8` with one scale, `w = d·(q − 8)`;
//! multiplied with Q8_0 activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..18 | `qs[16]`: low nibbles are weights 0..16, high nibbles 16..32 |

use nx_gguf::GgmlType;

use super::block::dot32_rows;
use super::block::{f16_to_f32, f32_to_f16, read_f16, signed_abs_max, BlockFormat};

/// Bytes of one block.
pub const BYTES: usize = 18;
/// `qs[16]`.
pub const QS: usize = 2;
const _: () = assert!(QS + 16 == BYTES && GgmlType::Q4_0.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q4_0,
    block_len: 32,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_0, dot)),
    dot4: Some(dot4),
    quantize_block: Some(quantize_block),
};

/// `y = (q − 8)·d` (ggml's `dequantize_row_q4_0`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let qs = &b[QS..QS + 16];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as i32 - 8;
        let hi = (qs[j] >> 4) as i32 - 8;
        y[j] = lo as f32 * d;
        y[j + 16] = hi as f32 * d;
    }
}

/// Q4_0 × Q8_0 in the order of ggml's x86 kernel: exact lanes per block, one fused
/// multiply-add of `d_w·d_x` per block into eight f32 lanes.
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

/// The signed quants `q − 8` of one block.
#[inline(always)]
fn quants(wb: &[u8]) -> [i32; 32] {
    let mut wq = [0i32; 32];
    for j in 0..16 {
        wq[j] = (wb[QS + j] & 0x0F) as i32 - 8;
        wq[j + 16] = (wb[QS + j] >> 4) as i32 - 8;
    }
    wq
}

/// Q4_0 / Q5_0 style: `d = max/−levels_half` so the extreme element is level 0,
/// `q = clamp(trunc(x/d + half + 0.5), 0, 2·half − 1)` (this crate's own quantizer, for
/// fixtures).
pub(super) fn quantize_signed_32(xb: &[f32], half_levels: i32) -> (u16, [u8; 32]) {
    let max = signed_abs_max(xb);
    let d_bits = f32_to_f16(max / -(half_levels as f32));
    let d = f16_to_f32(d_bits);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 32];
    for (qi, &v) in q.iter_mut().zip(xb) {
        let level = (v * id + half_levels as f32 + 0.5).trunc() as i32;
        *qi = level.clamp(0, 2 * half_levels - 1) as u8;
    }
    (d_bits, q)
}

/// Weights for fixtures (`quantize_signed_32` with 8 half levels).
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let (d_bits, q) = quantize_signed_32(x, 8);
    b[..2].copy_from_slice(&d_bits.to_le_bytes());
    for j in 0..16 {
        b[QS + j] = q[j] | (q[j + 16] << 4);
    }
}
