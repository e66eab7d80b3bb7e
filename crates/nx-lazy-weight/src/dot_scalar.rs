//! Scalar reference dot products of one weight row with one quantized activation row.
//!
//! These mirror ggml's generic (non-SIMD) `ggml_vec_dot_*` kernels: integer sums
//! inside each block, then one float accumulation whose order depends on the row
//! length K alone. For the K formats that order is ggml's: eight f32 lane sums
//! (`lane l` collects positions ≡ l mod 8 of each super-block, scaled by `d_w·d_x`),
//! a separate running f32 sum of the min terms (`−dmin_w·d_x·Σ bsum·m`), and at the
//! end the eight lanes added to it in lane order. The SIMD kernels that come later are
//! tested against these.
//!
//! | weight | activations | per block | accumulation |
//! |---|---|---|---|
//! | F32 | F32 | `w·x` in f32 | f64 sum, rounded to f32 at the end |
//! | F16 | F16 | `w·x` in f32 (exact) | f64 sum, rounded to f32 |
//! | BF16 | BF16 | `w·x` in f32 (exact) | f64 sum, rounded to f32 |
//! | Q4_0 | Q8_0 | `sumi` i32 | `sumf += (sumi·d_w)·d_x` |
//! | Q5_0 | Q8_0 | `sumi` i32 | `sumf += (d_w·d_x)·sumi` |
//! | Q8_0 | Q8_0 | `sumi` i32 | `sumf += sumi·(d_w·d_x)` |
//! | Q4_K, Q5_K, Q6_K | Q8_K | eight i32 lanes | lanes as above |

use nx_gguf::GgmlType;

use crate::dequant::q6_k_quads;
use crate::formats::{
    bf16_to_f32, f16_to_f32, q4_k, q5_0, q6_k, q8_k, read_f16, read_f32, read_i16, read_u32,
    row_bytes, scale_min_k4, vec_dot_type, Q4_0_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q5_K_BYTES,
    Q6_K_BYTES, Q8_0_BYTES, Q8_K_BYTES, QK_K,
};
use crate::LazyWeightError;

/// Dot product of a weight row (`weight_type`, `row_len` elements) with an activation
/// row already quantized to the weight's [`vec_dot_type`].
///
/// Errors when the type is unsupported or either slice has the wrong length.
pub fn dot_row(
    weight_type: GgmlType,
    w_row: &[u8],
    x_row: &[u8],
    row_len: usize,
) -> Result<f32, LazyWeightError> {
    let act_type = vec_dot_type(weight_type).ok_or(LazyWeightError::UnsupportedType {
        ggml_type: weight_type,
        op: "dot",
    })?;
    let w_bytes = row_bytes(weight_type, row_len)?;
    let x_bytes = row_bytes(act_type, row_len)?;
    if w_row.len() != w_bytes {
        return Err(LazyWeightError::LengthMismatch {
            what: "dot_row: weight row bytes",
            expected: w_bytes,
            actual: w_row.len(),
        });
    }
    if x_row.len() != x_bytes {
        return Err(LazyWeightError::LengthMismatch {
            what: "dot_row: activation row bytes",
            expected: x_bytes,
            actual: x_row.len(),
        });
    }
    Ok(dot_row_unchecked(weight_type, w_row, x_row))
}

/// [`dot_row`] without checks. The slices must hold the same number of elements in
/// their formats (a mismatch only shortens the sum; nothing reads out of bounds).
/// Unsupported types give 0.
#[inline]
pub(crate) fn dot_row_unchecked(weight_type: GgmlType, w: &[u8], x: &[u8]) -> f32 {
    match dot_kernel(weight_type) {
        Some(kernel) => kernel(w, x),
        None => 0.0,
    }
}

/// A dot kernel: weight row bytes, activation row bytes (same element count) → f32.
pub type DotKernel = fn(&[u8], &[u8]) -> f32;

/// The scalar dot kernel for a weight type (activations in its [`vec_dot_type`]).
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
        _ => return None,
    };
    Some(kernel)
}

/// F32 × F32.
pub fn dot_f32(w: &[u8], x: &[u8]) -> f32 {
    let mut sum = 0.0f64;
    for (a, b) in w.chunks_exact(4).zip(x.chunks_exact(4)) {
        sum += (read_f32(a, 0) * read_f32(b, 0)) as f64;
    }
    sum as f32
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

/// Sum of `w[j]·x[j]` over 32 i8 quants of a Q8_0 block against `wq` (already signed).
#[inline(always)]
fn isum32(wq: &[i32; 32], xq: &[u8]) -> i32 {
    let mut lo = 0i32;
    let mut hi = 0i32;
    for j in 0..16 {
        lo += wq[j] * xq[j] as i8 as i32;
        hi += wq[j + 16] * xq[j + 16] as i8 as i32;
    }
    lo + hi
}

/// Q4_0 × Q8_0.
pub fn dot_q4_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q4_0_BYTES).zip(x.chunks_exact(Q8_0_BYTES)) {
        let mut wq = [0i32; 32];
        for j in 0..16 {
            wq[j] = (wb[2 + j] & 0x0F) as i32 - 8;
            wq[j + 16] = (wb[2 + j] >> 4) as i32 - 8;
        }
        let sumi = isum32(&wq, &xb[2..]);
        sumf += sumi as f32 * read_f16(wb, 0) * read_f16(xb, 0);
    }
    sumf
}

/// Q5_0 × Q8_0.
pub fn dot_q5_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
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
        let sumi = isum32(&wq, &xb[2..]);
        sumf += (read_f16(wb, 0) * read_f16(xb, 0)) * sumi as f32;
    }
    sumf
}

/// Q8_0 × Q8_0.
pub fn dot_q8_0_q8_0(w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (wb, xb) in w.chunks_exact(Q8_0_BYTES).zip(x.chunks_exact(Q8_0_BYTES)) {
        let mut sumi = 0i32;
        for j in 0..32 {
            sumi += wb[2 + j] as i8 as i32 * xb[2 + j] as i8 as i32;
        }
        sumf += sumi as f32 * (read_f16(wb, 0) * read_f16(xb, 0));
    }
    sumf
}

/// Lane sums of one K super-block: `lanes[l] += scale(position)·w[p]·x[p]` over the
/// positions `p ≡ l (mod 8)`, where `scale` changes every `sub_len` weights.
#[inline(always)]
fn k_block_lanes(wq: &[i8; QK_K], xq: &[u8], scales: &[i32], sub_len: usize) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (s, (wsub, xsub)) in wq
        .chunks_exact(sub_len)
        .zip(xq.chunks_exact(sub_len))
        .enumerate()
    {
        let scale = scales[s];
        for (wg, xg) in wsub.chunks_exact(8).zip(xsub.chunks_exact(8)) {
            for l in 0..8 {
                // The product fits i16 (|w| ≤ 63, |x| ≤ 128), as ggml's aux16.
                let prod = (wg[l] as i16) * (xg[l] as i8 as i16);
                lanes[l] += scale * prod as i32;
            }
        }
    }
    lanes
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

/// The fixed K-format float reduction: lanes scaled per block, min terms subtracted
/// per block, lanes added last.
struct KAccumulator {
    lanes: [f32; 8],
    sumf: f32,
}

impl KAccumulator {
    fn new() -> Self {
        KAccumulator {
            lanes: [0.0; 8],
            sumf: 0.0,
        }
    }

    #[inline(always)]
    fn add_block(&mut self, d: f32, ints: &[i32; 8]) {
        for l in 0..8 {
            self.lanes[l] += d * ints[l] as f32;
        }
    }

    #[inline(always)]
    fn sub_min(&mut self, dmin: f32, sumi: i32) {
        self.sumf -= dmin * sumi as f32;
    }

    fn finish(self) -> f32 {
        let mut sumf = self.sumf;
        for l in 0..8 {
            sumf += self.lanes[l];
        }
        sumf
    }
}

/// Q4_K × Q8_K.
pub fn dot_q4_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = KAccumulator::new();
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
        let sumi_min = bsum_min_term(xb, &mn);
        let ints = k_block_lanes(&wq, &xb[q8_k::QS..q8_k::QS + QK_K], &sc, 32);
        let dx = read_f32(xb, 0);
        acc.add_block(read_f16(wb, 0) * dx, &ints);
        acc.sub_min(read_f16(wb, q4_k::DMIN) * dx, sumi_min);
    }
    acc.finish()
}

/// Q5_K × Q8_K.
pub fn dot_q5_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = KAccumulator::new();
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
        let sumi_min = bsum_min_term(xb, &mn);
        let ints = k_block_lanes(&wq, &xb[q8_k::QS..q8_k::QS + QK_K], &sc, 32);
        let dx = read_f32(xb, 0);
        acc.add_block(read_f16(wb, 0) * dx, &ints);
        acc.sub_min(read_f16(wb, q4_k::DMIN) * dx, sumi_min);
    }
    acc.finish()
}

/// Q6_K × Q8_K.
pub fn dot_q6_k_q8_k(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = KAccumulator::new();
    for (wb, xb) in w.chunks_exact(Q6_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)) {
        let mut wq = [0i8; QK_K];
        for half in 0..2 {
            let ql = &wb[q6_k::QL + 64 * half..q6_k::QL + 64 * half + 64];
            let qh = &wb[q6_k::QH + 32 * half..q6_k::QH + 32 * half + 32];
            for l in 0..32 {
                let q = q6_k_quads(ql, qh, l);
                for (k, &qk) in q.iter().enumerate() {
                    wq[128 * half + 32 * k + l] = qk;
                }
            }
        }
        let mut sc = [0i32; 16];
        for (j, s) in sc.iter_mut().enumerate() {
            *s = wb[q6_k::SCALES + j] as i8 as i32;
        }
        let ints = k_block_lanes(&wq, &xb[q8_k::QS..q8_k::QS + QK_K], &sc, 16);
        acc.add_block(read_f16(wb, q6_k::D) * read_f32(xb, 0), &ints);
    }
    acc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_row_checks_lengths() {
        let w = [0u8; Q4_K_BYTES];
        let x = [0u8; Q8_K_BYTES];
        assert_eq!(dot_row(GgmlType::Q4_K, &w, &x, 256).unwrap(), 0.0);
        assert!(dot_row(GgmlType::Q4_K, &w, &x[..100], 256).is_err());
        assert!(dot_row(GgmlType::Q4_K, &w[..100], &x, 256).is_err());
        assert!(dot_row(GgmlType::Q4_K, &w, &x, 32).is_err());
        assert!(matches!(
            dot_row(GgmlType::Q8_K, &x, &x, 256),
            Err(LazyWeightError::UnsupportedType { .. })
        ));
    }
}
