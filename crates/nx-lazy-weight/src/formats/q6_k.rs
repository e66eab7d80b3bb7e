//! Q6_K: super-blocks of 256 weights as signed 6-bit levels `q − 32` with an i8 scale
//! per 16, `w = d·sc·(q − 32)`; multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..128 | `ql[128]`: low four bits |
//! | 128..192 | `qh[64]`: high two bits, four weights per byte |
//! | 192..208 | `scales[16]` i8, one per 16 weights |
//! | 208..210 | `d` f16 |

use nx_gguf::GgmlType;

use super::block::{
    f16_bits_at_least, f16_to_f32, read_f16, read_f32, read_i16, BlockFormat, Q8_K_BLOCK_BYTES,
    Q8_K_BSUMS, Q8_K_QS,
};
use crate::reduce::{blocks_at, common_blocks, k_quad_lanes, Lanes8};

/// Bytes of one super-block.
pub const BYTES: usize = 210;
/// `ql[128]`: low four bits.
pub const QL: usize = 0;
/// `qh[64]`: high two bits, four weights per byte.
pub const QH: usize = 128;
/// `scales[16]` i8, one per 16 weights.
pub const SCALES: usize = 192;
/// `d` f16.
pub const D: usize = 208;
const _: () = assert!(D + 2 == BYTES && GgmlType::Q6_K.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q6_K,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: Some(dot4),
    quantize_block: Some(quantize_block),
};

/// The four signed 6-bit quants (`q − 32`) that Q6_K stores at position `l` (0..32)
/// of a 128-weight half: weights l, l+32, l+64, l+96 of that half.
#[inline(always)]
pub(crate) fn quads(ql: &[u8], qh: &[u8], l: usize) -> [i8; 4] {
    let h = qh[l];
    [
        ((ql[l] & 0x0F) | ((h & 3) << 4)) as i8 - 32,
        ((ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) as i8 - 32,
        ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32,
        ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32,
    ]
}

/// `y = d·sc·(q − 32)`, evaluated left to right (ggml's `dequantize_row_q6_K`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, D);
    for half in 0..2 {
        let ql = &b[QL + 64 * half..QL + 64 * half + 64];
        let qh = &b[QH + 32 * half..QH + 32 * half + 32];
        let sc = &b[SCALES + 8 * half..SCALES + 8 * half + 8];
        let out = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q = quads(ql, qh, l);
            for (k, &qk) in q.iter().enumerate() {
                out[l + 32 * k] = d * (sc[is + 2 * k] as i8) as f32 * qk as f32;
            }
        }
    }
}

/// Q6_K × Q8_K: the unsigned 0..63 quants in `k_quad_lanes`, minus, per lane `l`,
/// `32·(b[2l]·s[2l] + b[2l+1]·s[2l+1])` over the bsums `b` and scales `s`; one fused
/// multiply-add per lane and block with `d_x·d_w`.
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    dot_rows(w, [x])[0]
}

/// [`dot`] for four activation rows, each super-block decoded once: row `t`'s result
/// is `dot(w, x[t])`, bit for bit.
#[inline(always)]
pub fn dot4(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    dot_rows(w, x)
}

/// [`dot`] for `N` activation rows, each with its own accumulators.
#[inline(always)]
fn dot_rows<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let n_blocks = common_blocks(w.len() / BYTES, Q8_K_BLOCK_BYTES, &xs);
    let mut acc = [Lanes8::default(); N];
    for (b, wb) in w.chunks_exact(BYTES).take(n_blocks).enumerate() {
        let mut wq = [0i8; 256];
        for half in 0..2 {
            let ql = &wb[QL + 64 * half..QL + 64 * half + 64];
            let qh = &wb[QH + 32 * half..QH + 32 * half + 32];
            for l in 0..32 {
                let q = quads(ql, qh, l);
                for (k, &qk) in q.iter().enumerate() {
                    // `quads` yields q − 32; the reference multiplies the unsigned q.
                    wq[128 * half + 32 * k + l] = qk + 32;
                }
            }
        }
        let mut sc = [0i32; 16];
        for (j, s) in sc.iter_mut().enumerate() {
            *s = wb[SCALES + j] as i8 as i32;
        }
        let d_w = read_f16(wb, D);
        for (acc, xb) in acc.iter_mut().zip(blocks_at(&xs, b, Q8_K_BLOCK_BYTES)) {
            let mut lanes = k_quad_lanes(&wq, &xb[Q8_K_QS..Q8_K_QS + 256], &sc, 16);
            for (l, lane) in lanes.iter_mut().enumerate() {
                let b = |j: usize| read_i16(xb, Q8_K_BSUMS + 2 * j) as i32;
                *lane -= 32 * (b(2 * l) * sc[2 * l] + b(2 * l + 1) * sc[2 * l + 1]);
            }
            acc.fma_block(read_f32(xb, 0) * d_w, &lanes);
        }
    }
    acc.map(|a| a.sum())
}

/// Weights for fixtures (this crate's own quantizer): symmetric per 16, step
/// `amax/31` so levels −31..31 cover the sub-block.
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let mut step_needed = [0f32; 16];
    for (j, sub) in x.chunks_exact(16).enumerate() {
        step_needed[j] = sub.iter().fold(0.0f32, |a, &v| a.max(v.abs())) / 31.0;
    }
    let d_bits = f16_bits_at_least(step_needed.iter().fold(0.0f32, |a, &v| a.max(v)) / 127.0);
    let d = f16_to_f32(d_bits);
    let mut sc = [0i8; 16];
    let mut q = [0u8; 256]; // q + 32, in 0..64
    for (j, sub) in x.chunks_exact(16).enumerate() {
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
    b[D..D + 2].copy_from_slice(&d_bits.to_le_bytes());
    for (j, &s) in sc.iter().enumerate() {
        b[SCALES + j] = s as u8;
    }
    for half in 0..2 {
        let qs = &q[128 * half..128 * half + 128];
        for l in 0..32 {
            let (a, bb, c, e) = (qs[l], qs[l + 32], qs[l + 64], qs[l + 96]);
            b[QL + 64 * half + l] = (a & 0x0F) | ((c & 0x0F) << 4);
            b[QL + 64 * half + l + 32] = (bb & 0x0F) | ((e & 0x0F) << 4);
            b[QH + 32 * half + l] = (a >> 4) | ((bb >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
        }
    }
}
