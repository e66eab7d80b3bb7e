//! Scalar reference dot products of one weight row with one quantized activation row.
//!
//! Every quantized kernel reproduces the float order of the reference engine's x86
//! kernel (see `crate::reduce::Lanes8`): exact integer lanes per block, one fused
//! multiply-add of the block scale into each of eight f32 lanes, the lanes summed at the
//! end as ggml's `hsum_float_8`; Q4_K adds its min terms through four more lanes, Q5_K
//! (like Q4_1/Q5_1 in their modules) through one running f32 added last. The order depends
//! on the row length K alone. The float types mirror ggml's generic kernels (f64 sums).
//! The SIMD kernels (`avx2`, `avx512`) compute the same lane integers in the same float
//! order, so they are bit-identical to these (`tests/simd_twins.rs`), and both equal the
//! reference engine's own kernels bit for bit (`tests/dot_reference.rs`). Which kernel
//! runs is chosen in [`crate::dispatch`].
//!
//! | weight | activations | per block | accumulation |
//! |---|---|---|---|
//! | F32 | F32 | fused `w·x` | 64 f32 lanes (ggml's AVX-512 `vec_dot_f32`), f32 tail |
//! | F16 | F16 | `w·x` in f32 (exact) | f64 sum, rounded to f32 |
//! | BF16 | BF16 | `w·x` in f32 (exact) | f64 sum, rounded to f32 |
//! | Q4_0 | Q8_0 | `sumi` i32 | `sumf += (sumi·d_w)·d_x` |
//! | Q5_0 | Q8_0 | `sumi` i32 | `sumf += (d_w·d_x)·sumi` |
//! | Q8_0 | Q8_0 | `sumi` i32 | `sumf += sumi·(d_w·d_x)` |
//! | Q4_K, Q5_K, Q6_K | Q8_K | eight i32 lanes | lanes as above (mins apart) |

use nx_gguf::GgmlType;

use crate::dequant::q6_k_quads;
use crate::formats::{
    bf16_to_f32, f16_to_f32, q4_k, q5_0, q6_k, q8_k, read_f16, read_f32, read_i16, read_u32,
    scale_min_k4, Q4_0_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_0_BYTES,
    Q8_K_BYTES, QK_K,
};
use crate::reduce::{k_quad_lanes, quad_lanes, Lanes8};

pub use crate::formats::DotKernel;

/// The scalar dot kernel for a weight type (activations in its
/// [`vec_dot_type`](crate::formats::vec_dot_type)).
pub fn dot_kernel(weight_type: GgmlType) -> Option<DotKernel> {
    let kernel: DotKernel = match weight_type {
        GgmlType::F32 => dot_f32,
        GgmlType::F16 => dot_f16,
        GgmlType::BF16 => dot_bf16,
        GgmlType::Q4_0 => dot_q4_0_q8_0,
        GgmlType::Q5_0 => dot_q5_0_q8_0,
        GgmlType::Q8_0 => dot_q8_0_q8_0,
        GgmlType::Q4_K => dot_q4_k_q8_k,
        GgmlType::Q5_K => dot_q5_k_q8_k,
        GgmlType::Q6_K => dot_q6_k_q8_k,
        _ => {
            return crate::formats::block_format(weight_type)
                .and_then(|f| f.dot)
                .map(|(_, dot)| dot)
        }
    };
    Some(kernel)
}

/// F32 × F32 in the order of ggml's AVX-512 `vec_dot_f32` (what the reference runs for
/// an F32 weight such as a MoE router): 64 running fused multiply-adds, lane `l` taking
/// elements `l, l+64, …`, reduced as four 16-lane registers, then the elements past the
/// last whole 64 added one by one in f32.
pub fn dot_f32(w: &[u8], x: &[u8]) -> f32 {
    const LANES: usize = 64;
    let n = (w.len() / 4).min(x.len() / 4);
    let whole = n / LANES * LANES;
    let mut lanes = [0f32; LANES];
    for (cw, cx) in w[..whole * 4]
        .chunks_exact(LANES * 4)
        .zip(x[..whole * 4].chunks_exact(LANES * 4))
    {
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane = read_f32(cw, 4 * l).mul_add(read_f32(cx, 4 * l), *lane);
        }
    }
    let mut sum = if whole > 0 {
        nx_f32::scalar::reduce_lanes_64(&lanes)
    } else {
        0.0
    };
    for i in whole..n {
        sum += read_f32(w, 4 * i) * read_f32(x, 4 * i);
    }
    sum
}

/// F16 × F16.
pub fn dot_f16(w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in w.chunks_exact(2).zip(x.chunks_exact(2)) {
        let wa = f16_to_f32(u16::from_le_bytes([a[0], a[1]]));
        let xb = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        sum += (wa * xb) as f64;
    }
    sum as f32
}

/// BF16 × BF16.
pub fn dot_bf16(w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in w.chunks_exact(2).zip(x.chunks_exact(2)) {
        let wa = bf16_to_f32(u16::from_le_bytes([a[0], a[1]]));
        let xb = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        sum += (wa * xb) as f64;
    }
    sum as f32
}

/// Q4_0 × Q8_0.
pub fn dot_q4_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (wb, xb) in w.chunks_exact(Q4_0_BYTES).zip(x.chunks_exact(Q8_0_BYTES)) {
        let mut wq = [0i32; 32];
        for j in 0..16 {
            wq[j] = (wb[2 + j] & 0x0F) as i32 - 8;
            wq[j + 16] = (wb[2 + j] >> 4) as i32 - 8;
        }
        acc.fma_block(
            read_f16(wb, 0) * read_f16(xb, 0),
            &quad_lanes(&wq, &xb[2..]),
        );
    }
    acc.sum()
}

/// Q5_0 × Q8_0.
pub fn dot_q5_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (wb, xb) in w.chunks_exact(Q5_0_BYTES).zip(x.chunks_exact(Q8_0_BYTES)) {
        let qh = read_u32(wb, q5_0::QH);
        let qs = &wb[q5_0::QS..q5_0::QS + 16];
        let mut wq = [0i32; 32];
        for j in 0..16 {
            let h_lo = ((qh >> j) & 1) << 4;
            let h_hi = ((qh >> (j + 16)) & 1) << 4;
            wq[j] = ((qs[j] & 0x0F) as u32 | h_lo) as i32 - 16;
            wq[j + 16] = ((qs[j] >> 4) as u32 | h_hi) as i32 - 16;
        }
        acc.fma_block(
            read_f16(wb, 0) * read_f16(xb, 0),
            &quad_lanes(&wq, &xb[2..]),
        );
    }
    acc.sum()
}

/// Q8_0 × Q8_0.
pub fn dot_q8_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (wb, xb) in w.chunks_exact(Q8_0_BYTES).zip(x.chunks_exact(Q8_0_BYTES)) {
        let mut wq = [0i32; 32];
        for (q, &b) in wq.iter_mut().zip(&wb[2..34]) {
            *q = b as i8 as i32;
        }
        acc.fma_block(
            read_f16(wb, 0) * read_f16(xb, 0),
            &quad_lanes(&wq, &xb[2..]),
        );
    }
    acc.sum()
}

/// `Σ_j bsums[j]·m[j/2]`: the min term's integer part for Q4_K/Q5_K.
#[inline(always)]
fn bsum_min_term(xb: &[u8], mins: &[i32; 8]) -> i32 {
    let mut sumi = 0i32;
    for j in 0..16 {
        sumi += read_i16(xb, q8_k::BSUMS + 2 * j) as i32 * mins[j / 2];
    }
    sumi
}

/// Decoded 6-bit scales and mins of a Q4_K/Q5_K super-block.
#[inline(always)]
fn k4_scales_mins(scales: &[u8]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, scales);
        sc[j] = s as i32;
        mn[j] = m as i32;
    }
    (sc, mn)
}

/// Q4_K × Q8_K: lanes as [`k_quad_lanes`]; the min terms go to four more lanes
/// (`lane m = m[2m]·(b[4m]+b[4m+1]) + m[2m+1]·(b[4m+2]+b[4m+3])` over the bsums `b`),
/// each fed by a fused multiply-add with `−d_x·dmin_w`, summed `(m0+m2)+(m1+m3)` and
/// added to the eight-lane sum at the end.
pub fn dot_q4_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    let mut acc_m = [0f32; 4];
    for (wb, xb) in w.chunks_exact(Q4_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let mut wq = [0i8; QK_K];
        for chunk in 0..4 {
            let qs = &wb[q4_k::QS + 32 * chunk..q4_k::QS + 32 * chunk + 32];
            for l in 0..32 {
                wq[64 * chunk + l] = (qs[l] & 0x0F) as i8;
                wq[64 * chunk + 32 + l] = (qs[l] >> 4) as i8;
            }
        }
        let (sc, mn) = k4_scales_mins(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
        let dx = read_f32(xb, 0);
        let d = dx * read_f16(wb, 0);
        let dmin = -dx * read_f16(wb, q4_k::DMIN);
        let bsum = |j: usize| read_i16(xb, q8_k::BSUMS + 2 * j) as i32;
        for (m, lane) in acc_m.iter_mut().enumerate() {
            let pair = |k: usize| bsum(2 * k) + bsum(2 * k + 1);
            let prod = mn[2 * m] * pair(2 * m) + mn[2 * m + 1] * pair(2 * m + 1);
            *lane = dmin.mul_add(prod as f32, *lane);
        }
        acc.fma_block(
            d,
            &k_quad_lanes(&wq, &xb[q8_k::QS..q8_k::QS + QK_K], &sc, 32),
        );
    }
    acc.sum() + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

/// Q5_K × Q8_K in the order of ggml's AVX2 kernel: lanes as Q4_K's (levels 0..31), one
/// `fma(d_x·d_w, lane)` per super-block; the min term's integer `Σ m_j·(b_2j + b_2j+1)`
/// fused with `−d_x·dmin_w` into one running f32 (GCC contracts `summs += dmin*sumi`),
/// added after the lane sum.
pub fn dot_q5_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    let mut summs = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q5_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let qh = &wb[q4_k::Q5_QH..q4_k::Q5_QH + 32];
        let mut wq = [0i8; QK_K];
        for chunk in 0..4 {
            let qs = &wb[q4_k::Q5_QS + 32 * chunk..q4_k::Q5_QS + 32 * chunk + 32];
            for l in 0..32 {
                let h_lo = ((qh[l] >> (2 * chunk)) & 1) << 4;
                let h_hi = ((qh[l] >> (2 * chunk + 1)) & 1) << 4;
                wq[64 * chunk + l] = ((qs[l] & 0x0F) | h_lo) as i8;
                wq[64 * chunk + 32 + l] = ((qs[l] >> 4) | h_hi) as i8;
            }
        }
        let (sc, mn) = k4_scales_mins(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
        let dx = read_f32(xb, 0);
        let dmin = -dx * read_f16(wb, q4_k::DMIN);
        summs = dmin.mul_add(bsum_min_term(xb, &mn) as f32, summs);
        acc.fma_block(
            dx * read_f16(wb, 0),
            &k_quad_lanes(&wq, &xb[q8_k::QS..q8_k::QS + QK_K], &sc, 32),
        );
    }
    acc.sum() + summs
}

/// Q6_K × Q8_K: the unsigned 0..63 quants in [`k_quad_lanes`], minus, per lane `l`,
/// `32·(b[2l]·s[2l] + b[2l+1]·s[2l+1])` over the bsums `b` and scales `s`; one fused
/// multiply-add per lane and block with `d_x·d_w`.
pub fn dot_q6_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (wb, xb) in w.chunks_exact(Q6_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let mut wq = [0i8; QK_K];
        for half in 0..2 {
            let ql = &wb[q6_k::QL + 64 * half..q6_k::QL + 64 * half + 64];
            let qh = &wb[q6_k::QH + 32 * half..q6_k::QH + 32 * half + 32];
            for l in 0..32 {
                let q = q6_k_quads(ql, qh, l);
                for (k, &qk) in q.iter().enumerate() {
                    // q6_k_quads yields q − 32; the reference multiplies the unsigned q.
                    wq[128 * half + 32 * k + l] = qk + 32;
                }
            }
        }
        let mut sc = [0i32; 16];
        for (j, s) in sc.iter_mut().enumerate() {
            *s = wb[q6_k::SCALES + j] as i8 as i32;
        }
        let mut lanes = k_quad_lanes(&wq, &xb[q8_k::QS..q8_k::QS + QK_K], &sc, 16);
        for (l, lane) in lanes.iter_mut().enumerate() {
            let b = |j: usize| read_i16(xb, q8_k::BSUMS + 2 * j) as i32;
            *lane -= 32 * (b(2 * l) * sc[2 * l] + b(2 * l + 1) * sc[2 * l + 1]);
        }
        acc.fma_block(read_f32(xb, 0) * read_f16(wb, q6_k::D), &lanes);
    }
    acc.sum()
}
