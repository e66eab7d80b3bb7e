//! TQ2_0 (ternary, BitNet b1.58 / TriLM): 256 weights as 2-bit levels `q` with one
//! scale, `w = d·(q − 1)` (the quantizer writes `q` in 0..=2; 3 decodes to `2d`);
//! multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..64 | `qs[64]`: weight `128h + 32k + m` is bits `2k..2k+2` of byte `32h + m` |
//! | 64..66 | `d` f16 |

use nx_gguf::GgmlType;

use super::block::{f32_to_f16, read_f16, read_f32, BlockFormat, Q8_K_BLOCK_BYTES};
use super::block::{Q8_K_BSUMS, Q8_K_QS};
use crate::reduce::{offset_pair_lanes, Lanes8};

/// Bytes of one super-block.
pub const BYTES: usize = 66;
/// `qs[64]`.
pub const QS: usize = 0;
/// `d` f16.
pub const D: usize = 64;
const _: () = assert!(QS + 64 == D && D + 2 == BYTES && GgmlType::TQ2_0.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::TQ2_0,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: Some(quantize_block),
};

/// The 256 stored levels (0..=3, the weight plus one), in weight order.
#[inline(always)]
fn levels(b: &[u8]) -> [u8; 256] {
    let mut q = [0u8; 256];
    for h in 0..2 {
        for k in 0..4 {
            for m in 0..32 {
                q[128 * h + 32 * k + m] = (b[QS + 32 * h + m] >> (2 * k)) & 3;
            }
        }
    }
    q
}

/// `y = (q − 1)·d` (ggml's `dequantize_row_tq2_0`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    ternary_dequantize(read_f16(b, D), &levels(b), y);
}

/// `y = (t − 1)·d` for the 256 levels `t` of a ternary block (TQ1_0, TQ2_0).
pub(crate) fn ternary_dequantize(d: f32, levels: &[u8; 256], y: &mut [f32]) {
    for (v, &q) in y.iter_mut().zip(levels) {
        *v = (q as i32 - 1) as f32 * d;
    }
}

/// TQ2_0 × Q8_K in the order of ggml's AVX2 kernel: per super-block eight 32-bit lanes
/// of `Σ q·x − bsums` formed in 16-bit lanes (`offset_pair_lanes`), one
/// `fma(d_x·d_w, lane)` into eight running lanes, `hsum_float_8` at the end.
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    ternary_dot(w, x, BYTES, |wb| (read_f16(wb, D), levels(wb)))
}

/// The reduction ggml's AVX2 kernels of both ternary formats share once the levels are
/// decoded (`decode` gives a block's scale and levels): eight 32-bit lanes of
/// `Σ t·x − bsums` per super-block formed in 16-bit lanes (`offset_pair_lanes`), one
/// `fma(d_x·d_w, lane)` into eight running lanes, `hsum_float_8` at the end.
#[inline(always)]
pub(crate) fn ternary_dot(
    w: &[u8],
    x: &[u8],
    block_bytes: usize,
    decode: impl Fn(&[u8]) -> (f32, [u8; 256]),
) -> f32 {
    let mut acc = Lanes8::default();
    for (wb, xb) in w
        .chunks_exact(block_bytes)
        .zip(x.chunks_exact(Q8_K_BLOCK_BYTES))
    {
        let (d_w, levels) = decode(wb);
        let d = read_f32(xb, 0) * d_w;
        let lanes = offset_pair_lanes(
            &levels,
            &xb[Q8_K_QS..Q8_K_QS + 256],
            &xb[Q8_K_BSUMS..Q8_K_BSUMS + 32],
        );
        acc.fma_block(d, &lanes);
    }
    acc.sum()
}

/// The scale and the ternary level (0, 1, 2 for −1, 0, +1) of every weight, as ggml's
/// TQ1_0/TQ2_0 reference quantizers pick them: `d = amax` (stored as f16),
/// `level = round_half_away(x/amax) + 1` with `1/amax` formed once in f32.
pub(crate) fn ternary_levels(x: &[f32]) -> (u16, [u8; 256]) {
    let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
    let mut q = [0u8; 256];
    for (l, &v) in q.iter_mut().zip(x) {
        *l = ((v * id).round() as i32 + 1) as u8;
    }
    (f32_to_f16(amax), q)
}

/// ggml's `quantize_row_tq2_0_ref`: `ternary_levels`, packed four to a byte.
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let (d, q) = ternary_levels(x);
    for h in 0..2 {
        for m in 0..32 {
            let mut byte = 0u8;
            for k in 0..4 {
                byte |= (q[128 * h + 32 * k + m] & 3) << (2 * k);
            }
            b[QS + 32 * h + m] = byte;
        }
    }
    b[D..D + 2].copy_from_slice(&d.to_le_bytes());
}
