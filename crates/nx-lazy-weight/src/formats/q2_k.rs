//! Q2_K: 256 weights as 2-bit levels in sixteen sub-blocks of 16, each with a 4-bit scale
//! and a 4-bit min, `w = (d·sc)·q − (dmin·m)`; multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..16 | `scales[16]`: low nibble the scale, high nibble the min of sub-block j |
//! | 16..80 | `qs[64]`: weight `128h + 32k + b` is bits `2k..2k+2` of byte `32h + b` |
//! | 80..82 | `d` f16 |
//! | 82..84 | `dmin` f16 |

use nx_gguf::GgmlType;

use super::block::{
    f16_bits_at_least, f16_to_f32, read_f16, read_f32, read_i16, BlockFormat, Q8_K_BLOCK_BYTES,
    Q8_K_BSUMS, Q8_K_QS,
};
use crate::reduce::{k_quad_lanes, Lanes8};

/// Bytes of one super-block.
pub const BYTES: usize = 84;
/// `qs[64]`.
pub const QS: usize = 16;
/// `d` f16.
pub const D: usize = 80;
/// `dmin` f16.
pub const DMIN: usize = 82;
const _: () = assert!(DMIN + 2 == BYTES && GgmlType::Q2_K.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q2_K,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: Some(quantize_block),
};

/// The 256 levels (0..3), in weight order.
#[inline(always)]
pub(crate) fn levels(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    for h in 0..2 {
        for k in 0..4 {
            for i in 0..32 {
                q[128 * h + 32 * k + i] = ((b[QS + 32 * h + i] >> (2 * k)) & 3) as i8;
            }
        }
    }
    q
}

/// `y = (d·sc)·q − (dmin·m)`, both products rounded first (ggml's `dequantize_row_q2_K`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (read_f16(b, D), read_f16(b, DMIN));
    let q = levels(b);
    for (j, (ys, qs)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
        let dl = d * (b[j] & 0x0F) as f32;
        let ml = dmin * (b[j] >> 4) as f32;
        for (v, &q) in ys.iter_mut().zip(qs) {
            *v = dl * q as f32 - ml;
        }
    }
}

/// Q2_K × Q8_K in the order of ggml's AVX2 kernel: per super-block first the min term
/// (lane `l` = `m[2l]·bsum[2l] + m[2l+1]·bsum[2l+1]`, one `fma(−d_x·dmin_w, lane)`),
/// then the scaled level sums (one `fma(d_x·d_w, lane)`), into the same eight lanes.
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (wb, xb) in w.chunks_exact(BYTES).zip(x.chunks_exact(Q8_K_BLOCK_BYTES)) {
        let dx = read_f32(xb, 0);
        let d = dx * read_f16(wb, D);
        let dmin = -dx * read_f16(wb, DMIN);
        let mut sc = [0i32; 16];
        let mut mins = [0i32; 8];
        for j in 0..16 {
            sc[j] = (wb[j] & 0x0F) as i32;
            let bsum = read_i16(xb, Q8_K_BSUMS + 2 * j) as i32;
            mins[j / 2] += (wb[j] >> 4) as i32 * bsum;
        }
        acc.fma_block(dmin, &mins);
        acc.fma_block(
            d,
            &k_quad_lanes(&levels(wb), &xb[Q8_K_QS..Q8_K_QS + 256], &sc, 16),
        );
    }
    acc.sum()
}

/// A simple quantizer for fixtures (not ggml's search): per sub-block of 16 the offset
/// `dmin·m ≥ −min(0, x)` and step `d·sc ≥ (max x + offset)/3`, both rounded up, then
/// `q = round((x + offset)/step)`.
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let mut neg_min = [0.0f32; 16];
    let mut max = [0.0f32; 16];
    for (j, sub) in x.chunks_exact(16).enumerate() {
        neg_min[j] = -sub.iter().fold(0.0f32, |a, &v| a.min(v));
        max[j] = sub.iter().fold(0.0f32, |a, &v| a.max(v));
    }
    let dmin_bits = f16_bits_at_least(neg_min.iter().fold(0.0f32, |a, &v| a.max(v)) / 15.0);
    let dmin = f16_to_f32(dmin_bits);
    let mut m = [0u8; 16];
    let mut step_needed = [0.0f32; 16];
    for j in 0..16 {
        m[j] = if dmin > 0.0 {
            (neg_min[j] / dmin).ceil().min(15.0) as u8
        } else {
            0
        };
        step_needed[j] = (max[j] + dmin * m[j] as f32) / 3.0;
    }
    let d_bits = f16_bits_at_least(step_needed.iter().fold(0.0f32, |a, &v| a.max(v)) / 15.0);
    let d = f16_to_f32(d_bits);
    b.fill(0);
    for (j, sub) in x.chunks_exact(16).enumerate() {
        let sc = if d > 0.0 {
            (step_needed[j] / d).ceil().min(15.0) as u8
        } else {
            0
        };
        b[j] = sc | (m[j] << 4);
        // The same f32 products the dequantizer forms.
        let step = d * sc as f32;
        let offset = dmin * m[j] as f32;
        for (i, &v) in sub.iter().enumerate() {
            let q = if step > 0.0 {
                ((v + offset) / step).round().clamp(0.0, 3.0) as u8
            } else {
                0
            };
            let e = 16 * j + i;
            let (h, k, bi) = (e / 128, (e % 128) / 32, e % 32);
            b[QS + 32 * h + bi] |= q << (2 * k);
        }
    }
    b[D..D + 2].copy_from_slice(&d_bits.to_le_bytes());
    b[DMIN..DMIN + 2].copy_from_slice(&dmin_bits.to_le_bytes());
}
