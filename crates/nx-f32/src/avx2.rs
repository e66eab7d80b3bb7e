//! AVX2 twins of the f16 attention helpers and of the RMSNorm sums of squares, bit-identical to their [`crate::scalar`] references.
//!
//! [`crate::scalar::dot_f16`] keeps eight lanes (lane `l` sums `a[i]·b[i]` for
//! `i ≡ l (mod 8)`, a multiply then an add, never fused) and combines them in a fixed
//! order, then adds the tail in order. One AVX2 register of eight f32 lanes does exactly
//! that: `acc = acc + a·f32(b)` with separate `mul`/`add`, then the same lane
//! combination and tail. F16C's conversion is exact, like `half`'s. So the results equal
//! the scalar ones bit for bit and the tier choice never changes an attention output.

use std::arch::x86_64::*;
use std::ops::Range;

use half::f16;

use crate::kv_rows::{HeadRows, KvElem, MAX_HEAD_DIM};

/// True when this CPU has AVX2 and F16C.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

/// [`crate::scalar::dot_f16`] with AVX2.
///
/// # Safety
/// The CPU has AVX2 and F16C ([`available`]).
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    debug_assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let full = n / 8 * 8;
    let mut acc = _mm256_setzero_ps();
    for i in (0..full).step_by(8) {
        // SAFETY: i + 8 <= full <= n for both slices; f16 is a 2-byte plain value, so 8
        // of them are 16 readable bytes; both loads are unaligned.
        let (av, bv) = unsafe {
            (
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i) as *const __m128i)),
            )
        };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(av, bv));
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32; unaligned store.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    // The scalar reference's lane combination, in its order.
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    for (x, y) in a[full..].iter().zip(&b[full..]) {
        sum += x * y.to_f32();
    }
    sum
}

/// [`crate::scalar::axpy_f16`] with AVX2: `y[i] += alpha·f32(x[i])`, multiply then add.
///
/// # Safety
/// The CPU has AVX2 and F16C ([`available`]).
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn axpy_f16(y: &mut [f32], alpha: f32, x: &[f16]) {
    debug_assert_eq!(y.len(), x.len(), "axpy_f16: length mismatch");
    let n = y.len().min(x.len());
    let full = n / 8 * 8;
    let alpha8 = _mm256_set1_ps(alpha);
    for i in (0..full).step_by(8) {
        // SAFETY: i + 8 <= full <= n for both slices (16 bytes of f16); unaligned
        // accesses; `y` is exclusively borrowed.
        unsafe {
            let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i) as *const __m128i));
            let yp = y.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                yp,
                _mm256_add_ps(_mm256_loadu_ps(yp), _mm256_mul_ps(alpha8, xv)),
            );
        }
    }
    for (yi, xi) in y[full..n].iter_mut().zip(&x[full..n]) {
        *yi += alpha * xi.to_f32();
    }
}

/// The attention scores of the query heads in `queries` (`[heads, head_dim]`,
/// `head_dim` a multiple of 64) against key rows `rows` (view row `j − first_row`), as the
/// portable code computes them: `probs[(first_head + g)·n + i] = scale·(q_g · k)` with the
/// 64 lanes of the dot in eight registers of eight (lane `l` sums `q[i]·k[i]` for
/// `i ≡ l (mod 64)` by fused multiply-adds in order) and the same reduction tree
/// ([`crate::scalar::reduce_lanes_64`]). Each key row is widened once for all the heads.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
///
/// # Panics
/// On shapes that do not fit (`head_dim` not a multiple of 64 or above
/// [`MAX_HEAD_DIM`], rows outside `keys`, `probs` too short).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
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
    let n = rows.len();
    let mut buf = [0f32; MAX_HEAD_DIM];
    for (i, j) in rows.enumerate() {
        let row = keys.row(j - first_row);
        if let Some(values) = &ahead {
            values.prefetch_row(j - first_row);
        }
        let k: &[f32] = match T::as_f16(row) {
            Some(h) => {
                assert!(h.len() >= head_dim);
                for c in (0..head_dim).step_by(8) {
                    // SAFETY: c + 8 <= head_dim <= h.len(), buf.len(); f16 is 2 bytes.
                    unsafe {
                        let bits = _mm_loadu_si128(h.as_ptr().add(c) as *const __m128i);
                        _mm256_storeu_ps(buf.as_mut_ptr().add(c), _mm256_cvtph_ps(bits));
                    }
                }
                &buf[..head_dim]
            }
            None => T::row_f32(row, &mut buf),
        };
        assert!(k.len() >= head_dim);
        for (g, q) in queries.chunks_exact(head_dim).enumerate() {
            let mut acc = [_mm256_setzero_ps(); 8];
            for c in (0..head_dim).step_by(64) {
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: c + 8r + 8 <= head_dim, inside q and k (asserted).
                    unsafe {
                        let qv = _mm256_loadu_ps(q.as_ptr().add(c + 8 * r));
                        let kv = _mm256_loadu_ps(k.as_ptr().add(c + 8 * r));
                        *a = _mm256_fmadd_ps(qv, kv, *a);
                    }
                }
            }
            probs[(first_head + g) * n + i] = scale * reduce_lanes_64(&acc);
        }
    }
}

/// `Σ_j p_j·v_j` for every head of `probs` (`[heads, n]`, already rounded to the cache's
/// precision) into `out` (`[heads, vd]`, `vd` a multiple of 64), with the portable code's
/// 64 value lanes and reduction: the AVX2 twin of
/// [`crate::avx512::weighted_values_heads`]. The lanes go in the sets the reduction's
/// first step adds (`l, l+16, l+32, l+48`, [`crate::scalar::value_lane_sets`]); for each set, up to four heads build their
/// lanes together in eight registers (four heads × 16 columns, two × 32 or one × 64 at a
/// time), so each value row is loaded and widened once for all of them. Each lane is the
/// portable code's (its rows in order, fused multiply-adds from `+0`, zero when no row
/// reaches it); each head keeps only its sixteen reduced lanes.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
///
/// # Panics
/// When `values` is not `vd` wide, `probs` is not `out.len() / vd` heads long, `reduced`
/// holds fewer than `(heads·16 + 4·min(heads, 4))·vd` values, or a row lies outside
/// `values`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn weighted_values_heads<T: KvElem>(
    probs: &[f32],
    values: HeadRows<'_, T>,
    (first_row, rows_start): (usize, usize),
    reduced: &mut [f32],
    out: &mut [f32],
) {
    let vd = values.head_dim();
    assert!(vd > 0 && vd.is_multiple_of(64) && vd <= MAX_HEAD_DIM);
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
                    1 => value_lanes_group::<T, 1>(lanes, firsts, four),
                    2 => value_lanes_group::<T, 2>(lanes, firsts, four),
                    3 => value_lanes_group::<T, 3>(lanes, firsts, four),
                    _ => value_lanes_group::<T, 4>(lanes, firsts, four),
                }
            }
        },
    );
}

/// The four lanes `firsts` of `G` heads (`probs`: `[G, n]`) of [`weighted_values_heads`]:
/// for head `g` and lane `k`, `Σ p_i·v_i` over rows `i = firsts[k], firsts[k] + 64, …`
/// below `n`, in order by fused multiply-adds from `+0`, into `four[(4g + k)·vd..][..vd]`,
/// `CN = 8 / G` registers of columns at a time (eight accumulators in all).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
// The accumulators are indexed [head][column] by two loop positions at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn value_lanes_group<T: KvElem, const G: usize>(
    (probs, values, (first_row, rows_start)): (&[f32], HeadRows<'_, T>, (usize, usize)),
    firsts: &[usize; 4],
    four: &mut [f32],
) {
    let vd = values.head_dim();
    let n = probs.len() / G;
    assert!(four.len() >= 4 * G * vd && probs.len() == G * n);
    // Columns per pass, in registers of eight: 64 for one head, 32 for two, 16 for more.
    let cn = match G {
        1 => 8,
        2 => 4,
        _ => 2,
    };
    for (k, &first) in firsts.iter().enumerate() {
        for c0 in (0..vd / 8).step_by(cn) {
            let mut acc = [[_mm256_setzero_ps(); 8]; G];
            let mut i = first;
            while i < n {
                let row = values.row(rows_start + i - first_row);
                let mut p = [_mm256_setzero_ps(); G];
                for (g, p) in p.iter_mut().enumerate() {
                    *p = _mm256_set1_ps(probs[g * n + i]);
                }
                for c in 0..cn {
                    let at = 8 * (c0 + c);
                    let x = match (T::as_f16(row), T::as_f32(row)) {
                        (Some(h), _) => {
                            assert!(h.len() >= vd);
                            // SAFETY: at + 8 <= vd <= h.len() (asserted); f16 is 2 bytes.
                            unsafe {
                                _mm256_cvtph_ps(_mm_loadu_si128(
                                    h.as_ptr().add(at) as *const __m128i
                                ))
                            }
                        }
                        (None, Some(v)) => {
                            assert!(v.len() >= vd);
                            // SAFETY: at + 8 <= vd <= v.len() (asserted).
                            unsafe { _mm256_loadu_ps(v.as_ptr().add(at)) }
                        }
                        (None, None) => unreachable!("KV rows are f16 or f32"),
                    };
                    for g in 0..G {
                        acc[g][c] = _mm256_fmadd_ps(x, p[g], acc[g][c]);
                    }
                }
                i += 64;
            }
            for (g, acc) in acc.iter().enumerate() {
                let dst = &mut four[(4 * g + k) * vd..(4 * g + k + 1) * vd];
                for (c, a) in acc.iter().enumerate().take(cn) {
                    // SAFETY: 8(c0 + c) + 8 <= vd = dst.len().
                    unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(8 * (c0 + c)), *a) };
                }
            }
        }
    }
}

/// [`crate::scalar::reduce_lanes_64`] of 64 lanes held as eight registers (register `r`
/// is lanes `8r..8r+8`): `r_l = (l + l+32) + (l+16 + l+48)` for `l < 16`, then the
/// sixteen-lane horizontal sum (halves, quarters, pairs), the same additions.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn reduce_lanes_64(acc: &[__m256; 8]) -> f32 {
    let low = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    let high = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    // t8[i] = a[i+8] + a[i]; t4[i] = t8[i+4] + t8[i].
    let t8 = _mm256_add_ps(high, low);
    let t4 = _mm_add_ps(_mm256_extractf128_ps::<1>(t8), _mm256_castps256_ps128(t8));
    let mut t = [0f32; 4];
    // SAFETY: `t` holds four f32.
    unsafe { _mm_storeu_ps(t.as_mut_ptr(), t4) };
    (t[0] + t[2]) + (t[1] + t[3])
}

/// The f64 sums of squares of `8·G` rows of `n` values (`rows[g][r]`), each as
/// [`crate::scalar::rms_scales`] forms it — every square rounded to f32, then added in f64
/// in index order — with row `8g + r` in lane `r` of group `g`'s two registers. Each
/// block of eight columns is transposed in registers (eight loads, 24 shuffles) so that
/// one multiply, two conversions and two adds serve eight rows; the adds of a row still
/// follow each other, so with `G = 2` two groups' chains interleave to cover the add
/// latency. Where the scalar loop runs four instructions per value, this runs about one.
///
/// # Safety
/// The CPU has AVX2 ([`available`]).
///
/// # Panics
/// When the rows differ in length.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn square_sums<const G: usize>(rows: [[&[f32]; 8]; G]) -> [[f64; 8]; G] {
    let n = rows[0][0].len();
    assert!(
        rows.iter().flatten().all(|r| r.len() == n),
        "square_sums: ragged rows"
    );
    let mut acc = [[_mm256_setzero_pd(); 2]; G];
    let whole = n - n % 8;
    // SAFETY: every load reads columns `c..c + 8 <= n` of a row of `n` values (asserted).
    unsafe {
        for c in (0..whole).step_by(8) {
            for (g, rows) in rows.iter().enumerate() {
                let cols = transpose8(std::array::from_fn(|r| {
                    _mm256_loadu_ps(rows[r].as_ptr().add(c))
                }));
                for col in cols {
                    let sq = _mm256_mul_ps(col, col);
                    let (lo, hi) = (_mm256_castps256_ps128(sq), _mm256_extractf128_ps::<1>(sq));
                    acc[g][0] = _mm256_add_pd(acc[g][0], _mm256_cvtps_pd(lo));
                    acc[g][1] = _mm256_add_pd(acc[g][1], _mm256_cvtps_pd(hi));
                }
            }
        }
    }
    let mut sums = [[0.0f64; 8]; G];
    for (g, rows) in rows.iter().enumerate() {
        // SAFETY: the CPU has AVX (by AVX2); the stores fill the group's eight sums.
        unsafe {
            _mm256_storeu_pd(sums[g].as_mut_ptr(), acc[g][0]);
            _mm256_storeu_pd(sums[g].as_mut_ptr().add(4), acc[g][1]);
        }
        for (sum, row) in sums[g].iter_mut().zip(rows) {
            for &xi in &row[whole..] {
                *sum += f64::from(xi * xi);
            }
        }
    }
    sums
}

/// An 8 × 8 transpose of f32: lane `r` of output `c` is lane `c` of input `r`.
///
/// # Safety
/// Only inlined into functions enabling AVX.
#[inline(always)]
unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        // Pairs of rows interleaved, then quadruples, then the 128-bit halves joined:
        // after the second step `q[4h + k]` holds column `k` (low half) and `k + 4`
        // (high half) of rows `4h..4h + 4`.
        let t: [__m256; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
            match i % 2 {
                0 => _mm256_unpacklo_ps(a, b),
                _ => _mm256_unpackhi_ps(a, b),
            }
        });
        let q: [__m256; 8] = std::array::from_fn(|i| {
            let (h, k) = (i / 4, i % 4);
            let (a, b) = (t[4 * h + k / 2], t[4 * h + 2 + k / 2]);
            match k % 2 {
                0 => _mm256_shuffle_ps::<0x44>(a, b),
                _ => _mm256_shuffle_ps::<0xEE>(a, b),
            }
        });
        std::array::from_fn(|c| match c < 4 {
            true => _mm256_permute2f128_ps::<0x20>(q[c], q[4 + c]),
            false => _mm256_permute2f128_ps::<0x31>(q[c - 4], q[c]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scalar;

    /// Values that exercise the conversion: normals of several magnitudes, f16
    /// subnormals, zeros of both signs, the largest finite f16, infinities.
    fn f16_values(n: usize, seed: u64) -> Vec<f16> {
        let mut state = seed;
        (0..n)
            .map(|i| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = (state >> 33) as u32;
                match i % 17 {
                    3 => f16::from_bits(0x0001 + (r & 0x3ff) as u16), // subnormal
                    5 => f16::from_bits(0x8000),
                    7 => f16::MAX,
                    _ => f16::from_bits((r & 0x7bff) as u16 | ((r >> 16) as u16 & 0x8000)),
                }
            })
            .collect()
    }

    fn f32_values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    #[test]
    fn dot_f16_is_bit_identical_to_scalar() {
        if !available() {
            eprintln!("skipped: no AVX2/F16C");
            return;
        }
        for n in (0..80).chain([255, 256, 257, 1024]) {
            for seed in 0..20 {
                let a = f32_values(n, seed);
                let b = f16_values(n, seed + 1000);
                let want = scalar::dot_f16(&a, &b);
                // SAFETY: checked `available()` above.
                let got = unsafe { dot_f16(&a, &b) };
                assert!(
                    want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                    "n={n} seed={seed}: scalar {want} avx2 {got}"
                );
            }
        }
    }

    #[test]
    fn axpy_f16_is_bit_identical_to_scalar() {
        if !available() {
            eprintln!("skipped: no AVX2/F16C");
            return;
        }
        for n in (0..40).chain([256, 1000]) {
            for seed in 0..10 {
                let x = f16_values(n, seed);
                let y0 = f32_values(n, seed + 77);
                let alpha = f32_values(1, seed + 5)[0];
                let mut want = y0.clone();
                scalar::axpy_f16(&mut want, alpha, &x);
                let mut got = y0.clone();
                // SAFETY: checked `available()` above.
                unsafe { axpy_f16(&mut got, alpha, &x) };
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert!(
                        w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()),
                        "n={n} seed={seed} i={i}: scalar {w} avx2 {g}"
                    );
                }
            }
        }
    }
}
