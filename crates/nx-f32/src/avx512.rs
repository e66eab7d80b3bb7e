//! AVX-512 builds of the attention inner loops, bit-identical to the portable code.
//!
//! The portable attention keeps 64 lanes per score (four 16-wide registers in the
//! reference engine) and 64 running sums per value column (one per absolute row mod
//! 64). Here those lanes live in 512-bit registers: a score is four FMA chains over
//! `zmm` and the same reduction tree; a value lane is built row by row in registers
//! (`value_dim / 16` of them) instead of being loaded and stored per row. Every
//! operation is the same IEEE fused multiply-add or add on the same operands in the
//! same order, so the results equal the portable ones bit for bit
//! (`tests/kernels.rs` checks both).

use std::arch::x86_64::*;

use crate::attention::{HeadRows, KvElem, MAX_HEAD_DIM};

/// True when this CPU has what these builds use (AVX-512 F on top of AVX2, FMA, F16C).
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// The 64-lane dot of `q[..whole]` and `k[..whole]` (`whole` a multiple of 64), reduced
/// as [`crate::scalar::reduce_lanes_64`]: lane `l` sums `q[i]·k[i]` for `i ≡ l (mod
/// 64)` by fused multiply-adds in order.
///
/// # Safety
/// The CPU has the features of [`available`]; `whole` is a multiple of 64 and at most
/// both lengths.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn lanes64_dot(q: &[f32], k: &[f32], whole: usize) -> f32 {
    assert!(whole.is_multiple_of(64) && whole <= q.len() && whole <= k.len());
    let mut acc = [_mm512_setzero_ps(); 4];
    for c in (0..whole).step_by(64) {
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: c + 16r + 16 <= whole, inside both slices (asserted).
            let (qv, kv) = unsafe {
                (
                    _mm512_loadu_ps(q.as_ptr().add(c + 16 * r)),
                    _mm512_loadu_ps(k.as_ptr().add(c + 16 * r)),
                )
            };
            *a = _mm512_fmadd_ps(qv, kv, *a);
        }
    }
    // r_l = (lane l + lane 32+l) + (lane 16+l + lane 48+l)
    let r = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    reduce_add_16(r)
}

/// [`crate::scalar::reduce_add_16`] on a register: halves, quarters, then pairs.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn reduce_add_16(r: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(r);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(r)));
    let t8 = _mm256_add_ps(hi, lo);
    let t4 = _mm_add_ps(_mm256_extractf128_ps::<1>(t8), _mm256_castps256_ps128(t8));
    let mut t = [0f32; 4];
    // SAFETY: `t` holds four f32.
    unsafe { _mm_storeu_ps(t.as_mut_ptr(), t4) };
    (t[0] + t[2]) + (t[1] + t[3])
}

/// The 64 value lanes of `Z·16`-wide value rows: for every lane (absolute row mod 64)
/// that one of the `probs.len()` rows from `rows_start` reaches, `lanes[lane]` =
/// `Σ p_j·v_j` over that lane's rows in order, each by `fma(v, p, lane)` from `+0`
/// (the portable code's `v.mul_add(p, 0.0)` for the first); lanes no row reaches are
/// zero. `probs` are already rounded to the cache's precision; view row `i` of
/// `values` is cache row `first_row + i`.
///
/// # Safety
/// The CPU has the features of [`available`].
///
/// # Panics
/// When `values` is not `Z·16` wide, `lanes` holds fewer than `64·Z·16` values, or a
/// row lies outside `values`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn value_lanes<T: KvElem, const Z: usize>(
    probs: &[f32],
    values: HeadRows<'_, T>,
    first_row: usize,
    rows_start: usize,
    lanes: &mut [f32],
) {
    let vd = 16 * Z;
    assert!(values.head_dim() == vd && lanes.len() >= 64 * vd);
    let n = probs.len();
    let mut buf = [0f32; MAX_HEAD_DIM];
    for first in 0..64.min(n) {
        let lane = (rows_start + first) % 64;
        let mut acc = [_mm512_setzero_ps(); Z];
        let mut i = first;
        while i < n {
            let v = T::row_f32(values.row(rows_start + i - first_row), &mut buf);
            assert!(v.len() >= vd);
            let p = _mm512_set1_ps(probs[i]);
            for (z, a) in acc.iter_mut().enumerate() {
                // SAFETY: 16z + 16 <= vd <= v.len() (asserted).
                let x = unsafe { _mm512_loadu_ps(v.as_ptr().add(16 * z)) };
                *a = _mm512_fmadd_ps(x, p, *a);
            }
            i += 64;
        }
        let dst = &mut lanes[lane * vd..(lane + 1) * vd];
        for (z, a) in acc.iter().enumerate() {
            // SAFETY: dst holds vd = 16·Z values.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(16 * z), *a) };
        }
    }
    for first in n..64 {
        let lane = (rows_start + first) % 64;
        lanes[lane * vd..(lane + 1) * vd].fill(0.0);
    }
}
