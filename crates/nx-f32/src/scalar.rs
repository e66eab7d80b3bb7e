//! Scalar reference kernels: the portable definitions every SIMD twin is tested against.
//!
//! Every function here has a fixed reduction order that depends only on the slice
//! lengths, never on how a caller splits its work. The public functions in the crate
//! root call these today; a SIMD tier can later be dispatched in front of them without
//! changing any caller.
//!
//! Length mismatches are programming errors: they trip a `debug_assert!` in debug
//! builds and, in release builds, the kernels work on the common prefix (zipped
//! iterators), so a mismatch can never read or write out of bounds.

use half::f16;

/// Number of independent accumulators in [`dot`] and [`dot_f16`].
///
/// Eight lanes mirror one AVX2 register: lane `l` sums the products at indices
/// `i ≡ l (mod 8)` in increasing `i`, then the lanes are combined as
/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, then the tail (`len % 8` elements) is added
/// in order. Independent lanes also let the compiler vectorise the loop without
/// reassociating anything.
pub const DOT_LANES: usize = 8;

#[inline(always)]
fn combine_lanes(acc: [f32; DOT_LANES]) -> f32 {
    let s0 = acc[0] + acc[4];
    let s1 = acc[1] + acc[5];
    let s2 = acc[2] + acc[6];
    let s3 = acc[3] + acc[7];
    (s0 + s2) + (s1 + s3)
}

/// `Σ a[i]·b[i]` with the lane order described at [`DOT_LANES`].
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; DOT_LANES];
    let a_chunks = a.chunks_exact(DOT_LANES);
    let b_chunks = b.chunks_exact(DOT_LANES);
    let (a_tail, b_tail) = (a_chunks.remainder(), b_chunks.remainder());
    for (ca, cb) in a_chunks.zip(b_chunks) {
        for l in 0..DOT_LANES {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut sum = combine_lanes(acc);
    for (x, y) in a_tail.iter().zip(b_tail) {
        sum += x * y;
    }
    sum
}

/// `Σ a[i]·f32(b[i])` for an f16 row, in exactly the order of [`dot`].
#[inline]
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    debug_assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; DOT_LANES];
    let a_chunks = a.chunks_exact(DOT_LANES);
    let b_chunks = b.chunks_exact(DOT_LANES);
    let (a_tail, b_tail) = (a_chunks.remainder(), b_chunks.remainder());
    for (ca, cb) in a_chunks.zip(b_chunks) {
        for l in 0..DOT_LANES {
            acc[l] += ca[l] * cb[l].to_f32();
        }
    }
    let mut sum = combine_lanes(acc);
    for (x, y) in a_tail.iter().zip(b_tail) {
        sum += x * y.to_f32();
    }
    sum
}

/// `y[i] += alpha·x[i]` (a multiply then an add, never fused).
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    debug_assert_eq!(y.len(), x.len(), "axpy: length mismatch");
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `y[i] += alpha·f32(x[i])` for an f16 row.
#[inline]
pub fn axpy_f16(y: &mut [f32], alpha: f32, x: &[f16]) {
    debug_assert_eq!(y.len(), x.len(), "axpy_f16: length mismatch");
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi.to_f32();
    }
}

/// `x[i] *= s`.
#[inline]
pub fn scale(x: &mut [f32], s: f32) {
    for xi in x.iter_mut() {
        *xi *= s;
    }
}

/// `acc[i] += x[i]`.
#[inline]
pub fn add_in_place(acc: &mut [f32], x: &[f32]) {
    debug_assert_eq!(acc.len(), x.len(), "add_in_place: length mismatch");
    for (a, xi) in acc.iter_mut().zip(x) {
        *a += xi;
    }
}

/// `acc[i] *= x[i]`.
#[inline]
pub fn mul_in_place(acc: &mut [f32], x: &[f32]) {
    debug_assert_eq!(acc.len(), x.len(), "mul_in_place: length mismatch");
    for (a, xi) in acc.iter_mut().zip(x) {
        *a *= xi;
    }
}

/// The RMSNorm scale `1 / sqrt(mean(x²) + eps)`.
///
/// Arithmetic as in ggml's CPU `rms_norm`: each square is rounded to f32, the squares
/// are summed in f64 in index order, the mean is rounded to f32, and the reciprocal
/// square root is taken in f32.
#[inline]
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    if x.is_empty() {
        return 0.0;
    }
    let mut sum = 0.0f64;
    for &xi in x {
        sum += f64::from(xi * xi);
    }
    scale_of_sum(sum, x.len(), eps)
}

/// [`rms_scale`] of `R` rows of the same length at once: each row's squares are still
/// summed in index order, but the `R` sums advance side by side, so the adds of one row
/// do not wait on each other (an f64 add's latency per element, for one row alone).
///
/// # Panics
/// When the rows differ in length.
#[inline]
pub fn rms_scales<const R: usize>(rows: [&[f32]; R], eps: f32) -> [f32; R] {
    let n = rows[0].len();
    assert!(rows.iter().all(|r| r.len() == n), "rms_scales: ragged rows");
    if n == 0 {
        return [0.0; R];
    }
    let mut sums = [0.0f64; R];
    for i in 0..n {
        for (sum, row) in sums.iter_mut().zip(&rows) {
            let xi = row[i];
            *sum += f64::from(xi * xi);
        }
    }
    sums.map(|sum| scale_of_sum(sum, n, eps))
}

/// The RMSNorm scale of a row of `n` values whose squares sum (in f64, in index order) to
/// `sum`: the mean rounded to f32, then the reciprocal square root in f32.
#[inline]
pub(crate) fn scale_of_sum(sum: f64, n: usize, eps: f32) -> f32 {
    let mean = (sum / n as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// `out[i] = (x[i]·s)·weight[i]` with `s = `[`rms_scale`]`(x, eps)`.
#[inline]
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    debug_assert_eq!(out.len(), x.len(), "rmsnorm: out/x length mismatch");
    debug_assert_eq!(weight.len(), x.len(), "rmsnorm: weight/x length mismatch");
    let s = rms_scale(x, eps);
    for ((o, &xi), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = xi * s * w;
    }
}

/// [`rmsnorm`] writing back into `x`.
#[inline]
pub fn rmsnorm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    debug_assert_eq!(weight.len(), x.len(), "rmsnorm_in_place: length mismatch");
    let s = rms_scale(x, eps);
    for (xi, &w) in x.iter_mut().zip(weight) {
        *xi = *xi * s * w;
    }
}

/// Softmax in place: subtract the maximum, exponentiate in f32, sum in f64 in index
/// order, multiply by the f32 reciprocal of the sum (as ggml's `soft_max` does).
///
/// An empty slice is left alone. If every element is −∞ (nothing to attend to) the
/// slice is filled with zeros rather than NaN.
#[inline]
pub fn softmax_in_place(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    // Groups of 16: the reference engine's vector exp, each group summed as a 16-lane
    // register is reduced, then added to an f64 total; the tail takes libm's exp one by
    // one. Same numbers as llama.cpp's AVX-512 softmax.
    let mut sum = 0.0f64;
    let mut groups = x.chunks_exact_mut(16);
    for group in &mut groups {
        let mut lanes = [0f32; 16];
        for (l, xi) in lanes.iter_mut().zip(group.iter_mut()) {
            *xi = expf_vector(*xi - max);
            *l = *xi;
        }
        sum += f64::from(reduce_add_16(&lanes));
    }
    for xi in groups.into_remainder() {
        let e = (*xi - max).exp();
        *xi = e;
        sum += f64::from(e);
    }
    let inv = (1.0 / sum) as f32;
    scale(x, inv);
}

/// Softmax of the attention scores of the cache rows `first..first + x.len()`, in place,
/// rounded as the reference engine's softmax over its whole padded score row.
///
/// The reference scores every row of its cache view (a multiple of 256 rows), with −∞
/// for masked rows, and its softmax walks that row in registers of 16 starting at row 0.
/// So here the groups of 16 are aligned to absolute row indices, every element takes the
/// vector exp ([`expf_vector`]), and rows outside `x` count as the exact zeros the masked
/// rows give there. The result depends only on the scores and on `first`, never on how
/// the caller chunked its queries. Inlined so that callers compiled for FMA (the
/// attention kernel) get the fused multiply-adds of [`expf_vector`] as instructions.
#[inline(always)]
pub fn softmax_cache_row(x: &mut [f32], first: usize) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let end = first + x.len();
    let mut sum = 0.0f64;
    let mut group = first / 16 * 16;
    while group < end {
        let mut lanes = [0f32; 16];
        for row in group.max(first)..(group + 16).min(end) {
            let e = expf_vector(x[row - first] - max);
            x[row - first] = e;
            lanes[row - group] = e;
        }
        sum += f64::from(reduce_add_16(&lanes));
        group += 16;
    }
    let inv = (1.0 / sum) as f32;
    scale(x, inv);
}

/// Reduces 64 running sums held as four 16-lane registers `r0..r3` (lane `l` of `r_k` is
/// element `16k + l`): `r0 += r2`, `r1 += r3`, `r0 += r1`, then [`reduce_add_16`].
#[inline(always)]
pub fn reduce_lanes_64(lanes: &[f32; 64]) -> f32 {
    let mut r = [0f32; 16];
    for l in 0..16 {
        let r0 = lanes[l] + lanes[32 + l];
        let r1 = lanes[16 + l] + lanes[48 + l];
        r[l] = r0 + r1;
    }
    reduce_add_16(&r)
}

/// Horizontal sum of 16 lanes in the order a 512-bit register is reduced: halves, then
/// quarters, then pairs.
#[inline(always)]
pub fn reduce_add_16(a: &[f32; 16]) -> f32 {
    let mut t8 = [0f32; 8];
    for i in 0..8 {
        t8[i] = a[i + 8] + a[i];
    }
    let mut t4 = [0f32; 4];
    for i in 0..4 {
        t4[i] = t8[i + 4] + t8[i];
    }
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// `e^x` computed the way the reference engine's vector code does (a degree-5 polynomial
/// after range reduction by `ln 2`, fused multiply-adds throughout; within about 1.5 ulp
/// of the true value). Using the same approximation as llama.cpp keeps softmax and SiLU
/// outputs identical to its own, so quantized activations downstream round the same way.
#[inline(always)]
pub fn expf_vector(x: f32) -> f32 {
    let c = |bits: u32| f32::from_bits(bits);
    let round_shift = c(0x4b40_0000); // 1.5·2^23
    let z = x.mul_add(c(0x3fb8_aa3b), round_shift); // x·log2(e) + shift
    let n = z - round_shift;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // j·2^n with one rounding: n is an integer with |n| <= 192, so 2^n is an exact f64
    // built from its exponent bits.
    let two_n = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (f64::from(j) * two_n) as f32
}

/// SiLU: `x / (1 + e^(−x))`, the form ggml uses, with libm's exp (the reference engine's
/// scalar tail).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SiLU with the reference engine's vector exp ([`expf_vector`]).
#[inline(always)]
pub fn silu_vector(x: f32) -> f32 {
    x / (1.0 + expf_vector(-x))
}

/// `gate[i] = silu(gate[i])·up[i]` over one row, as the reference engine's SwiGLU does it:
/// the vector SiLU for whole groups of 16 from the row start, the scalar one for the tail.
#[inline(always)]
pub fn swiglu_row_in_place(gate: &mut [f32], up: &[f32]) {
    let whole = (gate.len().min(up.len())) / 16 * 16;
    let (gate_whole, gate_tail) = gate.split_at_mut(whole);
    let (up_whole, up_tail) = up.split_at(whole);
    // Two loops, not one with a branch: merged, the compiler evaluated both SiLUs (and
    // libm's exp) for every element.
    for (g, &u) in gate_whole.iter_mut().zip(up_whole) {
        *g = silu_vector(*g) * u;
    }
    for (g, &u) in gate_tail.iter_mut().zip(up_tail) {
        *g = silu(*g) * u;
    }
}

/// `sqrt(2/π)` rounded to f32.
pub const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_4_f64 as f32;
/// The cubic coefficient of the tanh GELU approximation.
pub const GELU_COEF_A: f32 = 0.044715;

/// GELU, tanh approximation: `0.5·x·(1 + tanh(sqrt(2/π)·x·(1 + 0.044715·x²)))`, with
/// the operations in the order ggml's `ggml_gelu_f32` writes them and the rounding of
/// the reference's GCC build, which fuses `1 + (0.044715·x)·x` into one multiply-add.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// `out[i] = silu(gate[i])·up[i]`.
#[inline]
pub fn swiglu(out: &mut [f32], gate: &[f32], up: &[f32]) {
    debug_assert_eq!(out.len(), gate.len(), "swiglu: out/gate length mismatch");
    debug_assert_eq!(out.len(), up.len(), "swiglu: out/up length mismatch");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// `out[i] = gelu_tanh(gate[i])·up[i]`.
#[inline]
pub fn geglu(out: &mut [f32], gate: &[f32], up: &[f32]) {
    debug_assert_eq!(out.len(), gate.len(), "geglu: out/gate length mismatch");
    debug_assert_eq!(out.len(), up.len(), "geglu: out/up length mismatch");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(g) * u;
    }
}

/// One RoPE rotation of the pair `(x0, x1)` by the angle whose cosine and sine are `c`
/// and `s`: `(x0·c − x1·s, x0·s + x1·c)`, with the rounding of the reference engine's
/// GCC build, which contracts each line into one fused multiply-add whose addend is the
/// rounded second product (`fma(x0, c, −(x1·s))`, `fma(x0, s, x1·c)`).
#[inline(always)]
pub fn rotate(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (x0.mul_add(c, -(x1 * s)), x0.mul_add(s, x1 * c))
}

/// Rotates adjacent pairs `(x[2i], x[2i+1])` by the angle whose cosine and sine are
/// `cos[i]`, `sin[i]`. Pairs beyond `cos.len()` are left alone.
#[inline(always)]
pub fn rotate_adjacent_pairs(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    for ((pair, &c), &s) in x.chunks_exact_mut(2).zip(cos).zip(sin) {
        let (x0, x1) = (pair[0], pair[1]);
        (pair[0], pair[1]) = rotate(x0, x1, c, s);
    }
}

/// Rotates the pairs `(x[i], x[i+half])`, `half = cos.len()`, for `i < half`
/// (NeoX layout). Requires `x.len() >= 2·half`; otherwise only the pairs that fit are
/// rotated.
#[inline(always)]
pub fn rotate_half_pairs(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    debug_assert_eq!(cos.len(), sin.len());
    let half = cos.len().min(sin.len()).min(x.len() / 2);
    let (lo, rest) = x.split_at_mut(half);
    let hi = &mut rest[..half];
    for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
        (*a, *b) = rotate(*a, *b, c, s);
    }
}

/// Most heads the SIMD tiers' weighted values build lanes for at once: their
/// accumulators share each value row's load and f16 widening.
pub(crate) const VALUE_HEADS_AT_ONCE: usize = 4;

/// The loop both SIMD tiers' `weighted_values_heads` run around their lane kernels: for
/// each set of lanes the value reduction's first step adds together (absolute lanes
/// `l, l+16, l+32, l+48`, `l < 16`) and each group of up to [`VALUE_HEADS_AT_ONCE`]
/// heads, `lanes(group_probs, firsts, four)` builds the group's four lanes into `four`
/// (`[group, 4, vd]`; `firsts[k]` is the relative row index of the first row of lane
/// `l + 16k`), [`first_step`] reduces each head's four into its sixteen reduced lanes in
/// `reduced`, and at the end every head's sixteen are summed into `out` (`[heads, vd]`).
/// `probs` is `[heads, n]`; `reduced` holds at least `(16·heads + 4·min(heads, 4))·vd`
/// values.
#[inline(always)]
pub(crate) fn value_lane_sets(
    probs: &[f32],
    (vd, rows_start): (usize, usize),
    reduced: &mut [f32],
    out: &mut [f32],
    mut lanes: impl FnMut(&[f32], &[usize; 4], &mut [f32]),
) {
    let n_heads = out.len() / vd;
    assert!(n_heads > 0 && out.len() == n_heads * vd);
    assert!(probs.len().is_multiple_of(n_heads));
    assert!(reduced.len() >= (n_heads * 16 + 4 * n_heads.min(VALUE_HEADS_AT_ONCE)) * vd);
    let n = probs.len() / n_heads;
    let (sets, rest) = reduced.split_at_mut(n_heads * 16 * vd);
    for l in 0..16 {
        let firsts: [usize; 4] = std::array::from_fn(|k| (l + 16 * k + 64 - rows_start % 64) % 64);
        for h0 in (0..n_heads).step_by(VALUE_HEADS_AT_ONCE) {
            let group = (n_heads - h0).min(VALUE_HEADS_AT_ONCE);
            let four = &mut rest[..4 * group * vd];
            lanes(&probs[h0 * n..(h0 + group) * n], &firsts, four);
            for (g, four) in four.chunks_exact(4 * vd).enumerate() {
                let h = h0 + g;
                first_step(
                    four,
                    vd,
                    &mut sets[(h * 16 + l) * vd..(h * 16 + l + 1) * vd],
                );
            }
        }
    }
    for (set, o) in sets.chunks_exact_mut(16 * vd).zip(out.chunks_exact_mut(vd)) {
        reduce_sixteen_lanes(set, vd, o);
    }
}

/// The first step of attention's value-lane reduction (64 lanes to one, as
/// [`reduce_lanes_64`]) for one set of lanes `l, l+16, l+32, l+48`
/// (`four`, in that order, `vd` values each): `r = (l + l+32) + (l+16 + l+48)`.
/// Inlined so that it is vectorised at the calling tier's width.
#[inline(always)]
pub(crate) fn first_step(four: &[f32], vd: usize, r: &mut [f32]) {
    for (d, r) in r[..vd].iter_mut().enumerate() {
        *r = (four[d] + four[2 * vd + d]) + (four[vd + d] + four[3 * vd + d]);
    }
}

/// The rest of attention's value-lane reduction once its first step has left `r_l` in lane `l` of
/// `lanes` (`l < 16`): the sixteen-lane horizontal sum (halves, quarters, pairs).
/// Inlined so that it is vectorised at the calling tier's width.
#[inline(always)]
pub(crate) fn reduce_sixteen_lanes(lanes: &mut [f32], value_dim: usize, out: &mut [f32]) {
    let vd = value_dim;
    for width in [8usize, 4] {
        for i in 0..width {
            let (lo, hi) = lanes.split_at_mut(width * vd);
            let dst = &mut lo[i * vd..(i + 1) * vd];
            let src = &hi[i * vd..(i + 1) * vd];
            for d in 0..vd {
                dst[d] += src[d];
            }
        }
    }
    for (d, o) in out.iter_mut().enumerate() {
        *o = (lanes[d] + lanes[2 * vd + d]) + (lanes[vd + d] + lanes[3 * vd + d]);
    }
}

#[cfg(test)]
mod vec_order_tests {
    use super::*;

    #[test]
    fn lane_reductions_follow_register_order() {
        // Distinct powers of two expose the order: every partial sum is exact, so the
        // total is the plain sum whichever way it is grouped...
        let lanes: [f32; 64] = std::array::from_fn(|i| (i as f32) * 0.5);
        let total: f32 = (0..64).map(|i| i as f32 * 0.5).sum();
        assert_eq!(reduce_lanes_64(&lanes), total);
        // ...while values that cancel only in one grouping show it is the register order:
        // (a0 + a8) first, so 1e8 and -1e8 cancel exactly before 1.0 is added.
        let mut a = [0f32; 16];
        a[0] = 1e8;
        a[8] = -1e8;
        a[1] = 1.0;
        assert_eq!(reduce_add_16(&a), 1.0);
    }
}
