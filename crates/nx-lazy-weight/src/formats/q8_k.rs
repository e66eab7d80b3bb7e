//! Q8_K: 256 activations as signed bytes with an f32 scale and the sums of each 16
//! quants; the activation type of the K formats (no dot product of its own).
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | `d` f32 |
//! | 4..260 | `qs[256]` i8 |
//! | 260..292 | `bsums[16]` i16: sum of each 16 consecutive quants |

use nx_gguf::GgmlType;

use super::block::{nearest_int, read_f32, BlockFormat};

/// Bytes of one block.
pub const BYTES: usize = super::block::Q8_K_BLOCK_BYTES;
/// `qs[256]` i8.
pub const QS: usize = super::block::Q8_K_QS;
/// `bsums[16]` i16: sum of each 16 consecutive quants.
pub const BSUMS: usize = super::block::Q8_K_BSUMS;
const _: () =
    assert!(BSUMS + 32 == BYTES && QS + 256 == BSUMS && GgmlType::Q8_K.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q8_K,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: None,
    dot4: None,
    quantize_block: Some(quantize_block),
};

/// `y = d·q`.
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f32(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[QS..QS + 256]) {
        *v = d * q as i8 as f32;
    }
}

/// ggml's `quantize_row_q8_K_ref`: the element of largest magnitude `max` (the first
/// on ties), `iscale = −127/max`, `q = min(127, round_half_even(iscale·x))`,
/// `d = 1/iscale`, and the bsums; an all-zero block is all zero. The portable reference
/// of `crate::avx512::quantize_q8_k`.
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        if a > amax {
            amax = a;
            max = v;
        }
    }
    if amax == 0.0 {
        b.fill(0);
        return;
    }
    let iscale = -127.0f32 / max;
    let mut quants = [0i8; 256];
    for (q, &v) in quants.iter_mut().zip(x) {
        let r = nearest_int(iscale * v);
        *q = r.min(127) as i8;
    }
    b[..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
    for (o, &q) in b[QS..QS + 256].iter_mut().zip(&quants) {
        *o = q as u8;
    }
    for (j, group) in quants.chunks_exact(16).enumerate() {
        let sum: i32 = group.iter().map(|&q| q as i32).sum();
        let at = BSUMS + 2 * j;
        b[at..at + 2].copy_from_slice(&(sum as i16).to_le_bytes());
    }
}
