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

use std::ops::Range;

use crate::kv_rows::{HeadRows, KvElem, KvPrecision, MAX_HEAD_DIM};

/// True when this CPU has what these builds use (AVX-512 F/DQ on top of AVX2, FMA, F16C).
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// [`KvElem::row_f32`] with an f16 row widened here by `vcvtph2ps`, sixteen at a time
/// (the library call it replaces runs the same exact conversion, but per eight values
/// behind a feature check: a tenth of a batched decode step went there).
#[target_feature(enable = "avx512f,f16c")]
#[inline]
fn widen_row<'a, T: KvElem>(row: &'a [T], buf: &'a mut [f32]) -> &'a [f32] {
    let Some(h) = T::as_f16(row) else {
        return T::row_f32(row, buf);
    };
    let buf = &mut buf[..h.len()];
    crate::convert::widen_f16_avx512(h, buf);
    buf
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
    reduce_add_16(lanes64_vertical(&q[..whole], k))
}

/// The four 16-lane FMA chains of a 64-lane dot over `q` and `k` (`q.len()` a multiple
/// of 64, `k` at least as long), combined as the first step of
/// [`crate::scalar::reduce_lanes_64`]: lane `l` is `(c0 + c2) + (c1 + c3)`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn lanes64_vertical(q: &[f32], k: &[f32]) -> __m512 {
    let whole = q.len();
    assert!(whole.is_multiple_of(64) && whole <= k.len());
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
    _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]))
}

/// [`reduce_add_16`] of sixteen registers at once: `out[j]` is the horizontal sum of
/// `r[j]` with exactly the same additions (halves, quarters, pairs).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn reduce_add_16x16(r: &[__m512; 16]) -> [f32; 16] {
    // Halves: [a lo8 | b lo8] + [a hi8 | b hi8] for rows (2i, 2i+1).
    let s1: [__m512; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[2 * i], r[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
        )
    });
    // Quarters: rows 4k..4k+4 one per 128-bit lane, t4[i] = t8[i+4] + t8[i].
    let s2: [__m512; 4] = std::array::from_fn(|k| {
        let (v, w) = (s1[2 * k], s1[2 * k + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b11_01_11_01>(v, w),
            _mm512_shuffle_f32x4::<0b10_00_10_00>(v, w),
        )
    });
    let mut out = [0f32; 16];
    for (k, v) in s2.into_iter().enumerate() {
        // (t0 + t2) + (t1 + t3) in element 0 of each 128-bit lane.
        let w = _mm512_add_ps(v, _mm512_shuffle_ps::<0b01_00_11_10>(v, v));
        let s = _mm512_add_ps(w, _mm512_shuffle_ps::<0b10_11_00_01>(w, w));
        let mut lanes = [0f32; 16];
        // SAFETY: `lanes` holds sixteen f32.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), s) };
        for i in 0..4 {
            out[4 * k + i] = lanes[4 * i];
        }
    }
    out
}

/// Scores of the query heads in `queries` (`[heads, head_dim]`, `head_dim` a multiple
/// of 64: no tail) against the key rows `rows` (view row `j - first_row`):
/// `probs[(first_head + g)·n + i]` = `scale · (q_g · k_{rows.start + i})` with the
/// portable code's 64-lane order and reduction, the horizontal sums done sixteen rows
/// at a time (one head at a time over a block of sixteen rows, whose keys stay in L1).
///
/// # Safety
/// The CPU has the features of [`available`].
///
/// # Panics
/// On shapes that do not fit (`head_dim` not a multiple of 64, rows outside `keys`,
/// `probs` too short).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn group_scores<T: KvElem>(
    queries: &[f32],
    head_dim: usize,
    (keys, ahead): (HeadRows<'_, T>, Option<HeadRows<'_, T>>),
    first_row: usize,
    rows: Range<usize>,
    scale: f32,
    probs: &mut [f32],
    first_head: usize,
) {
    assert!(head_dim > 0 && head_dim.is_multiple_of(64) && head_dim <= MAX_HEAD_DIM);
    assert!(queries.len().is_multiple_of(head_dim));
    let args = (queries, keys, first_row, rows.clone(), scale, first_head);
    // SAFETY (all three): forwarded contract; the width matches `head_dim`.
    match head_dim {
        64 => return unsafe { group_scores_fixed::<T, 4>(args, ahead, probs) },
        128 => return unsafe { group_scores_fixed::<T, 8>(args, ahead, probs) },
        256 => return unsafe { group_scores_fixed::<T, 16>(args, ahead, probs) },
        _ => {}
    }
    let n = rows.len();
    let mut buf = [0f32; MAX_HEAD_DIM];
    let mut r = [_mm512_setzero_ps(); 16];
    for block in (0..n).step_by(16) {
        let count = 16.min(n - block);
        for (g, q) in queries.chunks_exact(head_dim).enumerate() {
            for (i, ri) in r.iter_mut().enumerate().take(count) {
                let j = rows.start + block + i;
                let k = widen_row(keys.row(j - first_row), &mut buf);
                *ri = lanes64_vertical(q, k);
            }
            let sums = reduce_add_16x16(&r);
            let at = (first_head + g) * n + block;
            for (p, &s) in probs[at..at + count].iter_mut().zip(&sums) {
                *p = scale * s;
            }
        }
    }
}

/// What the score passes take: the queries (`[heads, head_dim]`), the key rows, the
/// view's first row, the rows to score, the scale and the first head's index in `probs`.
type ScoreArgs<'a, T> = (&'a [f32], HeadRows<'a, T>, usize, Range<usize>, f32, usize);

/// [`group_scores`] for heads of `16·NQ` values (64, 128 or 256). An f16 cache goes
/// through [`scores_together`]: up to [`SCORE_HEADS_AT_ONCE`] heads meet each key row
/// together, so the row is loaded and widened once, in registers, for all of them. f32
/// rows (an f32 cache, or a prefill chunk's rows widened once) go head by head, each
/// query held in `NQ` registers while it meets a block of sixteen rows that stay in L1:
/// one load per FMA, where sharing the row would add the query's loads. The same four
/// FMA chains per score and the same reductions either way, so the same bits.
///
/// # Safety
/// The CPU has the features of [`available`].
///
/// # Panics
/// As [`group_scores`], and when `keys` is not `16·NQ` wide.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn group_scores_fixed<T: KvElem, const NQ: usize>(
    args: ScoreArgs<'_, T>,
    ahead: Option<HeadRows<'_, T>>,
    probs: &mut [f32],
) {
    let head_dim = 16 * NQ;
    assert!(args.1.head_dim() == head_dim && NQ.is_multiple_of(4));
    if T::PRECISION != KvPrecision::F16 {
        // SAFETY: forwarded contract.
        return unsafe { scores_head_by_head::<T, NQ>(args, probs) };
    }
    let (queries, keys, first_row, rows, scale, first_head) = args;
    let n_heads = queries.len() / head_dim;
    for h0 in (0..n_heads).step_by(SCORE_HEADS_AT_ONCE) {
        let group = (n_heads - h0).min(SCORE_HEADS_AT_ONCE);
        let qs = &queries[h0 * head_dim..(h0 + group) * head_dim];
        let args = (qs, keys, first_row, rows.clone(), scale, first_head + h0);
        // SAFETY: forwarded contract.
        unsafe {
            match group {
                1 => scores_together::<T, NQ, 1>(args, ahead, probs),
                2 => scores_together::<T, NQ, 2>(args, ahead, probs),
                3 => scores_together::<T, NQ, 3>(args, ahead, probs),
                _ => scores_together::<T, NQ, 4>(args, ahead, probs),
            }
        }
    }
}

/// [`group_scores_fixed`] for f32 rows: one head at a time over each block of sixteen
/// key rows, its query in `NQ` registers.
///
/// # Safety
/// The CPU has the features of [`available`].
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn scores_head_by_head<T: KvElem, const NQ: usize>(
    (queries, keys, first_row, rows, scale, first_head): ScoreArgs<'_, T>,
    probs: &mut [f32],
) {
    let head_dim = 16 * NQ;
    assert!(keys.head_dim() == head_dim && NQ.is_multiple_of(4));
    let n = rows.len();
    // Only f32 rows come here (f16 ones go through `scores_together`), read in place.
    let mut r = [_mm512_setzero_ps(); 16];
    for block in (0..n).step_by(16) {
        let count = 16.min(n - block);
        for (g, q) in queries.chunks_exact(head_dim).enumerate() {
            // SAFETY: `q` holds 16·NQ values.
            let qv: [__m512; NQ] =
                std::array::from_fn(|j| unsafe { _mm512_loadu_ps(q.as_ptr().add(16 * j)) });
            for (i, ri) in r.iter_mut().enumerate().take(count) {
                let k = keys.row(rows.start + block + i - first_row);
                let k = T::as_f32(k).expect("scores_head_by_head reads f32 rows");
                assert!(k.len() >= head_dim);
                let mut acc = [_mm512_setzero_ps(); 4];
                for (j, &qj) in qv.iter().enumerate() {
                    // SAFETY: 16j + 16 <= head_dim <= k.len() (asserted).
                    let kv = unsafe { _mm512_loadu_ps(k.as_ptr().add(16 * j)) };
                    acc[j % 4] = _mm512_fmadd_ps(qj, kv, acc[j % 4]);
                }
                *ri = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
            }
            let sums = reduce_add_16x16(&r);
            let at = (first_head + g) * n + block;
            for (p, &s) in probs[at..at + count].iter_mut().zip(&sums) {
                *p = scale * s;
            }
        }
    }
}

/// Most query heads whose scores [`group_scores_fixed`] forms in one pass over the keys
/// (four FMA chains each: sixteen accumulators).
const SCORE_HEADS_AT_ONCE: usize = 4;

/// The scores of the `G` heads of `queries` over f16 key rows ([`group_scores_fixed`]'s
/// pass): per key row, each head's four FMA chains over the row's `NQ` registers in order, combined as
/// the first step of the 64-lane reduction; per block of sixteen rows, the horizontal
/// sums ([`reduce_add_16x16`]) times `scale`.
///
/// # Safety
/// The CPU has the features of [`available`].
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn scores_together<T: KvElem, const NQ: usize, const G: usize>(
    (queries, keys, first_row, rows, scale, first_head): ScoreArgs<'_, T>,
    ahead: Option<HeadRows<'_, T>>,
    probs: &mut [f32],
) {
    let head_dim = 16 * NQ;
    assert!(queries.len() == G * head_dim);
    let n = rows.len();
    let mut r = [[_mm512_setzero_ps(); 16]; G];
    for block in (0..n).step_by(16) {
        let count = 16.min(n - block);
        for i in 0..count {
            let row = keys.row(rows.start + block + i - first_row);
            if let Some(values) = &ahead {
                values.prefetch_row(rows.start + block + i - first_row);
            }
            let h = T::as_f16(row).expect("scores_together reads f16 rows");
            assert!(h.len() >= head_dim);
            let mut acc = [[_mm512_setzero_ps(); 4]; G];
            // Register j feeds chain j mod 4: four registers per step, so the chains
            // stay in registers (indexed by constants).
            for j4 in (0..NQ).step_by(4) {
                for c in 0..4 {
                    let j = j4 + c;
                    // SAFETY: 16j + 16 <= head_dim <= h.len() (asserted); f16 is two bytes.
                    let kv = unsafe {
                        _mm512_cvtph_ps(
                            _mm256_loadu_si256(h.as_ptr().add(16 * j) as *const __m256i),
                        )
                    };
                    for (g, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: head g's register j lies inside `queries` (asserted).
                        let qv =
                            unsafe { _mm512_loadu_ps(queries.as_ptr().add(g * head_dim + 16 * j)) };
                        acc[c] = _mm512_fmadd_ps(qv, kv, acc[c]);
                    }
                }
            }
            for (r, acc) in r.iter_mut().zip(&acc) {
                r[i] = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
            }
        }
        for (g, r) in r.iter().enumerate() {
            let sums = reduce_add_16x16(r);
            let at = (first_head + g) * n + block;
            for (p, &s) in probs[at..at + count].iter_mut().zip(&sums) {
                *p = scale * s;
            }
        }
    }
}

/// Most query heads [`group_scores`] takes at once.
pub(crate) const MAX_HEADS_AT_ONCE: usize = 8;

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

/// `Σ_j p_j·v_j` for `n_heads` heads at once, reduced as the portable code reduces its
/// 64 value lanes: head `h`'s probabilities are `probs[h·n..(h+1)·n]` and its result goes
/// to `out[h·vd..(h+1)·vd]`.
///
/// The lanes go in the sets the reduction's first step adds together (absolute lanes
/// `l, l+16, l+32, l+48`, [`crate::scalar::value_lane_sets`]): for each set, up to four
/// heads build
/// their lanes together, so a value row (a sixteenth of the view, in L1 for the set) is
/// loaded and widened once for all of them, and no head keeps more than sixteen reduced
/// lanes. Each lane is the portable code's (its rows in order by fused multiply-adds
/// from `+0`, zero when no row reaches it) and every addition of the reduction is the
/// same, so each head's result has the portable bits.
///
/// # Safety
/// The CPU has the features of [`available`].
///
/// # Panics
/// When `values` is not `Z·16` wide, `probs` is not `n_heads` heads long, `out` is not
/// `n_heads·vd` long, `reduced` holds fewer than `(16·heads + 4·min(heads, 4))·vd`
/// values, or a row lies outside `values`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn weighted_values_heads<T: KvElem, const Z: usize>(
    probs: &[f32],
    values: HeadRows<'_, T>,
    (first_row, rows_start): (usize, usize),
    reduced: &mut [f32],
    out: &mut [f32],
) {
    let vd = 16 * Z;
    assert!(values.head_dim() == vd);
    let rows = (first_row, rows_start);
    crate::scalar::value_lane_sets(
        probs,
        (vd, rows_start),
        reduced,
        out,
        |probs, firsts, four| {
            let lanes = (probs, values, rows);
            // SAFETY: forwarded contract; `four` holds four lanes of the group's heads.
            unsafe {
                match four.len() / (4 * vd) {
                    1 => value_lanes_group::<T, Z, 1>(lanes, firsts, four),
                    2 => value_lanes_group::<T, Z, 2>(lanes, firsts, four),
                    3 => value_lanes_group::<T, Z, 3>(lanes, firsts, four),
                    _ => value_lanes_group::<T, Z, 4>(lanes, firsts, four),
                }
            }
        },
    );
}

/// The four lanes `firsts` (relative row indices below 64) of `G` heads (`probs`:
/// `[G, n]`) of [`weighted_values_heads`]: for head `g` and lane `k`, `Σ p_i·v_i` over
/// rows `i = firsts[k], firsts[k] + 64, …` below `n`, in that order by fused
/// multiply-adds from `+0`, written to `four[(4g + k)·vd..][..vd]`.
///
/// A pass keeps sixteen accumulators at most (fewer heads take more lanes or columns
/// per pass): `G` heads × `CN` registers of columns × `KP` lanes. Each value row's
/// registers are loaded and widened once per pass for all `G` heads.
///
/// # Safety
/// The CPU has the features of [`available`].
// The accumulators are indexed [head][lane][column] by three loop positions at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn value_lanes_group<T: KvElem, const Z: usize, const G: usize>(
    (probs, values, (first_row, rows_start)): (&[f32], HeadRows<'_, T>, (usize, usize)),
    firsts: &[usize; 4],
    four: &mut [f32],
) {
    let vd = 16 * Z;
    let n = probs.len() / G;
    assert!(four.len() >= 4 * G * vd && probs.len() == G * n);
    // Columns per pass: the largest power of two that keeps G·CN ≤ 16; then lanes.
    let cn = match 16 / G {
        16.. => 16,
        8.. => 8,
        _ => 4,
    }
    .min(Z);
    let kp = (16 / (G * cn)).clamp(1, 4);
    for k0 in (0..4).step_by(kp) {
        for c0 in (0..Z).step_by(cn) {
            let mut acc = [[[_mm512_setzero_ps(); 16]; 4]; G];
            let mut base = 0;
            while base < n {
                for kk in 0..kp {
                    let i = base + firsts[k0 + kk];
                    if i >= n {
                        continue;
                    }
                    let row = values.row(rows_start + i - first_row);
                    let mut p = [_mm512_setzero_ps(); G];
                    for (g, p) in p.iter_mut().enumerate() {
                        *p = _mm512_set1_ps(probs[g * n + i]);
                    }
                    for c in 0..cn {
                        let x = match (T::as_f16(row), T::as_f32(row)) {
                            (Some(h), _) => {
                                assert!(h.len() >= vd);
                                // SAFETY: 16(c0 + c) + 16 <= vd <= h.len() (asserted).
                                unsafe {
                                    _mm512_cvtph_ps(_mm256_loadu_si256(
                                        h.as_ptr().add(16 * (c0 + c)) as *const __m256i,
                                    ))
                                }
                            }
                            (None, Some(v)) => {
                                assert!(v.len() >= vd);
                                // SAFETY: 16(c0 + c) + 16 <= vd <= v.len() (asserted).
                                unsafe { _mm512_loadu_ps(v.as_ptr().add(16 * (c0 + c))) }
                            }
                            (None, None) => unreachable!("KV rows are f16 or f32"),
                        };
                        for g in 0..G {
                            acc[g][kk][c] = _mm512_fmadd_ps(x, p[g], acc[g][kk][c]);
                        }
                    }
                }
                base += 64;
            }
            for (g, acc) in acc.iter().enumerate() {
                for (kk, acc) in acc.iter().enumerate().take(kp) {
                    let dst = &mut four[(4 * g + k0 + kk) * vd..(4 * g + k0 + kk + 1) * vd];
                    for (c, a) in acc.iter().enumerate().take(cn) {
                        // SAFETY: 16(c0 + c) + 16 <= vd = dst.len().
                        unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(16 * (c0 + c)), *a) };
                    }
                }
            }
        }
    }
}

/// `x` rounded to f16 and back, sixteen at a time (round to nearest even, as
/// `f16::from_f32`), the rest one at a time.
///
/// # Safety
/// The CPU has the features of [`available`].
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn round_to_f16(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: sixteen f32.
        unsafe {
            let v = _mm512_loadu_ps(c.as_ptr());
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            _mm512_storeu_ps(c.as_mut_ptr(), _mm512_cvtph_ps(h));
        }
    }
    for v in chunks.into_remainder() {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

/// [`crate::scalar::expf_vector`] on sixteen lanes: the same fused multiply-adds, the
/// same `j·2^n` in f64 with one rounding, the same 0 / ∞ past `|n| > 192`.
#[target_feature(enable = "avx512f,avx512dq,fma")]
#[inline]
fn expf16(x: __m512) -> __m512 {
    let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
    let round_shift = c(0x4b40_0000);
    let z = _mm512_fmadd_ps(x, c(0x3fb8_aa3b), round_shift);
    let n = _mm512_sub_ps(z, round_shift);
    let neg_n = _mm512_sub_ps(_mm512_setzero_ps(), n);
    let b = _mm512_fmadd_ps(
        neg_n,
        c(0x35bf_be8e),
        _mm512_fmadd_ps(neg_n, c(0x3f31_7200), x),
    );
    let u = _mm512_mul_ps(b, b);
    let t1 = _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17));
    let t2 = _mm512_fmadd_ps(t1, u, _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)));
    let j = _mm512_fmadd_ps(
        t2,
        u,
        _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
    );
    // j·2^n in f64, eight lanes at a time; n is an integer (|n| <= 192 where it is used).
    let ni = _mm512_cvtps_epi32(n);
    let scale_half = |j8: __m256, n8: __m256i| {
        let e = _mm512_slli_epi64::<52>(_mm512_add_epi64(
            _mm512_cvtepi32_epi64(n8),
            _mm512_set1_epi64(1023),
        ));
        _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(j8), _mm512_castsi512_pd(e)))
    };
    let lo = scale_half(_mm512_castps512_ps256(j), _mm512_castsi512_si256(ni));
    let hi = scale_half(
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(j))),
        _mm512_extracti64x4_epi64::<1>(ni),
    );
    let r = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi);
    // Past |n| > 192: 0 for n <= 0, ∞ otherwise.
    let abs_n = _mm512_abs_ps(n);
    let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(abs_n, _mm512_set1_ps(192.0));
    let nonpos = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
    let r = _mm512_mask_mov_ps(r, big & nonpos, _mm512_setzero_ps());
    _mm512_mask_mov_ps(r, big & !nonpos, _mm512_set1_ps(f32::INFINITY))
}

/// [`crate::scalar::swiglu_row_in_place`]: `g = silu(g)·u` with the vector SiLU
/// `x / (1 + e^−x)` on whole groups of 16 from the row start (sixteen lanes at a time,
/// [`expf16`]), libm's on the tail, as the scalar code.
///
/// # Safety
/// The CPU has AVX-512 F/DQ, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn swiglu_row(gate: &mut [f32], up: &[f32]) {
    let whole = gate.len().min(up.len()) / 16 * 16;
    let sign = _mm512_set1_ps(-0.0);
    let one = _mm512_set1_ps(1.0);
    for i in (0..whole).step_by(16) {
        // SAFETY: i + 16 <= whole, inside both slices.
        unsafe {
            let g = _mm512_loadu_ps(gate.as_ptr().add(i));
            let u = _mm512_loadu_ps(up.as_ptr().add(i));
            let silu = _mm512_div_ps(g, _mm512_add_ps(one, expf16(_mm512_xor_ps(g, sign))));
            _mm512_storeu_ps(gate.as_mut_ptr().add(i), _mm512_mul_ps(silu, u));
        }
    }
    for (g, &u) in gate[whole..].iter_mut().zip(&up[whole..]) {
        *g = crate::scalar::silu(*g) * u;
    }
}

/// [`crate::scalar::softmax_cache_row`] with the exponentials sixteen at a time (one
/// group of 16 absolute rows per register, the same group sums in f64); bit-identical.
///
/// # Safety
/// The CPU has AVX-512 F/DQ and FMA.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn softmax_cache_row(x: &mut [f32], first: usize) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let end = first + x.len();
    let max_v = _mm512_set1_ps(max);
    let mut sum = 0.0f64;
    let mut group = first / 16 * 16;
    while group < end {
        // Lanes of this group inside [first, end): rows group + i.
        let lo = group.max(first) - group;
        let hi = (group + 16).min(end) - group;
        let mask: __mmask16 = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16;
        // SAFETY: the masked lanes map to x[group + i - first] for i in lo..hi, inside x;
        // masked-off lanes are not accessed.
        let base = unsafe { x.as_mut_ptr().offset(group as isize - first as isize) };
        let xv = unsafe { _mm512_maskz_loadu_ps(mask, base) };
        let e = _mm512_maskz_mov_ps(mask, expf16(_mm512_sub_ps(xv, max_v)));
        // SAFETY: as above.
        unsafe { _mm512_mask_storeu_ps(base, mask, e) };
        sum += f64::from(reduce_add_16(e));
        group += 16;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_matches_scalar_twin() {
        if !(available() && std::arch::is_x86_feature_detected!("avx512dq")) {
            return;
        }
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32
        };
        for len in [1usize, 5, 16, 17, 40, 100] {
            for first in [0usize, 3, 15, 16, 29] {
                for spread in [1.0f32, 30.0, 400.0] {
                    let x: Vec<f32> = (0..len).map(|_| (next() - 0.5) * spread).collect();
                    let mut a = x.clone();
                    let mut b = x.clone();
                    crate::scalar::softmax_cache_row(&mut a, first);
                    // SAFETY: features checked above.
                    unsafe { softmax_cache_row(&mut b, first) };
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&a),
                        bits(&b),
                        "len {len} first {first} spread {spread}"
                    );
                }
            }
        }
        // The exponential alone, across its range and past the cut-offs.
        for i in -2000..2000 {
            let v = i as f32 * 0.07;
            let got = {
                let mut out = [0f32; 16];
                // SAFETY: features checked above; out holds 16 f32.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr(), expf16(_mm512_set1_ps(v))) };
                out[0]
            };
            assert_eq!(
                got.to_bits(),
                crate::scalar::expf_vector(v).to_bits(),
                "exp({v})"
            );
        }
    }
}
