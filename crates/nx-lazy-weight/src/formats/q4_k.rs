//! Q4_K: super-blocks of 256 weights in eight sub-blocks of 32, each with a 6-bit scale
//! and a 6-bit min, `w = d·sc·q − dmin·m`; multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..4 | `dmin` f16 |
//! | 4..16 | `scales[12]`: eight 6-bit scales and eight 6-bit mins, packed |
//! | 16..144 | `qs[128]`: four chunks of 32 bytes; chunk c holds sub-blocks 2c (low nibbles) and 2c+1 (high nibbles) |
//!
//! Q5_K shares the first sixteen bytes (its offsets are here too, for the kernels that
//! treat both).

use nx_gguf::GgmlType;

use super::block::{
    f16_bits_at_least, f16_to_f32, read_f16, read_f32, read_i16, BlockFormat, Q8_K_BLOCK_BYTES,
    Q8_K_BSUMS, Q8_K_QS,
};
use super::{pack_scale_min_k4, scale_min_k4};
use crate::reduce::{blocks_at, common_blocks, k_quad_lanes, Lanes8};

/// Bytes of one super-block.
pub const BYTES: usize = 144;
/// `dmin` f16.
pub const DMIN: usize = 2;
/// `scales[12]`: eight 6-bit scales and eight 6-bit mins, packed.
pub const SCALES: usize = 4;
/// Q4_K `qs[128]`: four chunks of 32 bytes; chunk c holds sub-blocks 2c (low
/// nibbles) and 2c+1 (high nibbles).
pub const QS: usize = 16;
/// Q5_K `qh[32]`: bit 2c of byte l is the fifth bit of weight l of sub-block 2c,
/// bit 2c+1 that of sub-block 2c+1.
pub const Q5_QH: usize = 16;
/// Q5_K `qs[128]`, laid out as Q4_K's.
pub const Q5_QS: usize = 48;
const _: () = assert!(QS + 128 == BYTES && GgmlType::Q4_K.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q4_K,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: Some(dot4),
    quantize_block: Some(quantize_block),
};

/// `y = (d·sc)·q − (dmin·m)`, both products rounded first (ggml's
/// `dequantize_row_q4_K`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, DMIN);
    let scales = &b[SCALES..SCALES + 12];
    for chunk in 0..4 {
        let qs = &b[QS + 32 * chunk..QS + 32 * chunk + 32];
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

/// Decoded 6-bit scales and mins of a Q4_K/Q5_K super-block.
#[inline(always)]
pub(crate) fn scales_mins(scales: &[u8]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, scales);
        sc[j] = s as i32;
        mn[j] = m as i32;
    }
    (sc, mn)
}

/// Q4_K × Q8_K: lanes as `k_quad_lanes`; the min terms go to four more lanes
/// (`lane m = m[2m]·(b[4m]+b[4m+1]) + m[2m+1]·(b[4m+2]+b[4m+3])` over the bsums `b`),
/// each fed by a fused multiply-add with `−d_x·dmin_w`, summed `(m0+m2)+(m1+m3)` and
/// added to the eight-lane sum at the end.
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
    let mut acc_m = [[0f32; 4]; N];
    for (b, wb) in w.chunks_exact(BYTES).take(n_blocks).enumerate() {
        let wq = unpack_quants(&wb[QS..QS + 128], None);
        let (sc, mn) = scales_mins(&wb[SCALES..SCALES + 12]);
        let (d_w, dmin_w) = (read_f16(wb, 0), read_f16(wb, DMIN));
        let xbs = blocks_at(&xs, b, Q8_K_BLOCK_BYTES);
        for ((acc, acc_m), xb) in acc.iter_mut().zip(&mut acc_m).zip(xbs) {
            let dx = read_f32(xb, 0);
            let (d, dmin) = (dx * d_w, -dx * dmin_w);
            let bsum = |j: usize| read_i16(xb, Q8_K_BSUMS + 2 * j) as i32;
            for (m, lane) in acc_m.iter_mut().enumerate() {
                let pair = |k: usize| bsum(2 * k) + bsum(2 * k + 1);
                let prod = mn[2 * m] * pair(2 * m) + mn[2 * m + 1] * pair(2 * m + 1);
                *lane = dmin.mul_add(prod as f32, *lane);
            }
            acc.fma_block(d, &k_quad_lanes(&wq, &xb[Q8_K_QS..Q8_K_QS + 256], &sc, 32));
        }
    }
    std::array::from_fn(|t| {
        let m = &acc_m[t];
        acc[t].sum() + ((m[0] + m[2]) + (m[1] + m[3]))
    })
}

/// A Q4_K/Q5_K super-block's 256 quants in weight order: from its nibble bytes `qs`
/// (weight `l` of sub-block `2c` in the low nibble of byte `32c + l`, of sub-block `2c + 1`
/// in the high one) and, for Q5_K, the fifth bits `qh` (bits `2c` and `2c + 1` of byte
/// `l`). One helper for both formats' scalar dots, so they unpack alike.
#[inline(always)]
pub(super) fn unpack_quants(qs: &[u8], qh: Option<&[u8]>) -> [i8; 256] {
    let qs: &[u8; 128] = qs.try_into().expect("128 nibble bytes");
    let qh: [u8; 32] = qh.map_or([0; 32], |h| h.try_into().expect("32 high-bit bytes"));
    let mut wq = [0i8; 256];
    for chunk in 0..4 {
        for l in 0..32 {
            let q = qs[32 * chunk + l];
            let h_lo = ((qh[l] >> (2 * chunk)) & 1) << 4;
            let h_hi = ((qh[l] >> (2 * chunk + 1)) & 1) << 4;
            wq[64 * chunk + l] = ((q & 0x0F) | h_lo) as i8;
            wq[64 * chunk + 32 + l] = ((q >> 4) | h_hi) as i8;
        }
    }
    wq
}

/// Sub-block scales and mins of a Q4_K/Q5_K super-block, and the quants (this crate's
/// own quantizer, for fixtures).
///
/// Per sub-block of 32: offset `dmin·m ≥ −min(0, x)` (mins rounded up), then the
/// step `d·sc` is rounded up so that `offset + max_level·step ≥ max x`; quants are
/// `round((x + offset)/step)`, so the error is at most half a step.
pub(super) fn quantize_asym(
    xb: &[f32],
    max_level: u8,
    q: &mut [u8; 256],
) -> (u16, u16, [u8; 8], [u8; 8]) {
    let mut neg_min = [0f32; 8];
    let mut max = [0f32; 8];
    for (j, sub) in xb.chunks_exact(32).enumerate() {
        let lo = sub.iter().fold(0.0f32, |a, &v| a.min(v));
        let hi = sub.iter().fold(0.0f32, |a, &v| a.max(v));
        neg_min[j] = -lo;
        max[j] = hi;
    }
    let dmin_bits = f16_bits_at_least(neg_min.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0);
    let dmin = f16_to_f32(dmin_bits);
    let mut m_q = [0u8; 8];
    let mut offset = [0f32; 8];
    for j in 0..8 {
        m_q[j] = if dmin > 0.0 {
            (neg_min[j] / dmin).ceil().min(63.0) as u8
        } else {
            0
        };
        offset[j] = dmin * m_q[j] as f32;
    }
    let mut step_needed = [0f32; 8];
    for j in 0..8 {
        step_needed[j] = (max[j] + offset[j]) / max_level as f32;
    }
    let d_bits = f16_bits_at_least(step_needed.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0);
    let d = f16_to_f32(d_bits);
    let mut sc_q = [0u8; 8];
    for j in 0..8 {
        sc_q[j] = if d > 0.0 {
            (step_needed[j] / d).ceil().min(63.0) as u8
        } else {
            0
        };
    }
    for (j, sub) in xb.chunks_exact(32).enumerate() {
        // The same f32 products the dequantizer forms.
        let step = d * sc_q[j] as f32;
        let off = dmin * m_q[j] as f32;
        for (l, &v) in sub.iter().enumerate() {
            q[32 * j + l] = if step > 0.0 {
                ((v + off) / step).round().clamp(0.0, max_level as f32) as u8
            } else {
                0
            };
        }
    }
    (d_bits, dmin_bits, sc_q, m_q)
}

/// Weights for fixtures (`quantize_asym` with 15 levels).
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let mut q = [0u8; 256];
    let (d_bits, dmin_bits, sc, m) = quantize_asym(x, 15, &mut q);
    b[..2].copy_from_slice(&d_bits.to_le_bytes());
    b[DMIN..DMIN + 2].copy_from_slice(&dmin_bits.to_le_bytes());
    pack_scale_min_k4(&sc, &m, &mut b[SCALES..SCALES + 12]);
    for chunk in 0..4 {
        for l in 0..32 {
            b[QS + 32 * chunk + l] = q[64 * chunk + l] | (q[64 * chunk + 32 + l] << 4);
        }
    }
}
