//! Q5_K: Q4_K with a fifth bit per weight, `w = d·sc·q − dmin·m` with `q` in 0..32;
//! multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..4 | `dmin` f16 |
//! | 4..16 | `scales[12]`, as Q4_K's |
//! | 16..48 | `qh[32]`: bit 2c of byte l is the fifth bit of weight l of sub-block 2c, bit 2c+1 that of sub-block 2c+1 |
//! | 48..176 | `qs[128]`, laid out as Q4_K's |

use nx_gguf::GgmlType;

use super::block::{
    read_f16, read_f32, read_i16, BlockFormat, Q8_K_BLOCK_BYTES, Q8_K_BSUMS, Q8_K_QS,
};
use super::q4_k::{quantize_asym, scales_mins, unpack_quants, DMIN, SCALES};
use super::{pack_scale_min_k4, scale_min_k4};
use crate::reduce::{blocks_at, common_blocks, k_quad_lanes, Lanes8};

/// Bytes of one super-block.
pub const BYTES: usize = 176;
/// `qh[32]`.
pub const QH: usize = super::q4_k::Q5_QH;
/// `qs[128]`.
pub const QS: usize = super::q4_k::Q5_QS;
const _: () = assert!(QS + 128 == BYTES && GgmlType::Q5_K.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q5_K,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: Some(dot4),
    quantize_block: Some(quantize_block),
};

/// As Q4_K's, with the fifth bits (ggml's `dequantize_row_q5_K`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, DMIN);
    let scales = &b[SCALES..SCALES + 12];
    let qh = &b[QH..QH + 32];
    for chunk in 0..4 {
        let qs = &b[QS + 32 * chunk..QS + 32 * chunk + 32];
        let (sc_lo, m_lo) = scale_min_k4(2 * chunk, scales);
        let (sc_hi, m_hi) = scale_min_k4(2 * chunk + 1, scales);
        let d_lo = d * sc_lo as f32;
        let min_lo = dmin * m_lo as f32;
        let d_hi = d * sc_hi as f32;
        let min_hi = dmin * m_hi as f32;
        let bit_lo = 1u8 << (2 * chunk);
        let bit_hi = 1u8 << (2 * chunk + 1);
        let out = &mut y[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            let q_lo = (qs[l] & 0x0F) + if qh[l] & bit_lo != 0 { 16 } else { 0 };
            let q_hi = (qs[l] >> 4) + if qh[l] & bit_hi != 0 { 16 } else { 0 };
            out[l] = d_lo * q_lo as f32 - min_lo;
            out[l + 32] = d_hi * q_hi as f32 - min_hi;
        }
    }
}

/// `Σ_j bsums[j]·m[j/2]`: the min term's integer part.
#[inline(always)]
fn bsum_min_term(xb: &[u8], mins: &[i32; 8]) -> i32 {
    let mut sumi = 0i32;
    for j in 0..16 {
        sumi += read_i16(xb, Q8_K_BSUMS + 2 * j) as i32 * mins[j / 2];
    }
    sumi
}

/// Q5_K × Q8_K in the order of ggml's AVX2 kernel: lanes as Q4_K's (levels 0..31), one
/// `fma(d_x·d_w, lane)` per super-block; the min term's integer `Σ m_j·(b_2j + b_2j+1)`
/// fused with `−d_x·dmin_w` into one running f32 (GCC contracts `summs += dmin*sumi`),
/// added after the lane sum.
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
    let mut summs = [0.0f32; N];
    for (b, wb) in w.chunks_exact(BYTES).take(n_blocks).enumerate() {
        let wq = unpack_quants(&wb[QS..QS + 128], Some(&wb[QH..QH + 32]));
        let (sc, mn) = scales_mins(&wb[SCALES..SCALES + 12]);
        let (d_w, dmin_w) = (read_f16(wb, 0), read_f16(wb, DMIN));
        let xbs = blocks_at(&xs, b, Q8_K_BLOCK_BYTES);
        for ((acc, summs), xb) in acc.iter_mut().zip(&mut summs).zip(xbs) {
            let dx = read_f32(xb, 0);
            let dmin = -dx * dmin_w;
            *summs = dmin.mul_add(bsum_min_term(xb, &mn) as f32, *summs);
            acc.fma_block(
                dx * d_w,
                &k_quad_lanes(&wq, &xb[Q8_K_QS..Q8_K_QS + 256], &sc, 32),
            );
        }
    }
    std::array::from_fn(|t| acc[t].sum() + summs[t])
}

/// Weights for fixtures (Q4_K's quantizer with 31 levels).
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let mut q = [0u8; 256];
    let (d_bits, dmin_bits, sc, m) = quantize_asym(x, 31, &mut q);
    b[..2].copy_from_slice(&d_bits.to_le_bytes());
    b[DMIN..DMIN + 2].copy_from_slice(&dmin_bits.to_le_bytes());
    pack_scale_min_k4(&sc, &m, &mut b[SCALES..SCALES + 12]);
    b[QH..QH + 32].fill(0);
    for chunk in 0..4 {
        for l in 0..32 {
            let lo = q[64 * chunk + l];
            let hi = q[64 * chunk + 32 + l];
            b[QS + 32 * chunk + l] = (lo & 0x0F) | ((hi & 0x0F) << 4);
            b[QH + l] |= ((lo >> 4) << (2 * chunk)) | ((hi >> 4) << (2 * chunk + 1));
        }
    }
}
