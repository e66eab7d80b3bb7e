//! Attention for one query head over K/V rows stored as f32 or f16.
//!
//! Invariance rule: for a given query, the result depends only on the row range and
//! the head sizes, because every reduction order is fixed by absolute row indices and
//! head sizes (see [`attend_head`]). Nothing here depends on how many query rows a
//! prefill chunk holds or on the thread count; that is what makes the engine's logits
//! bit-identical whatever the chunk size.

use std::ops::Range;

pub use crate::kv_rows::{HeadRows, KvElem, KvPrecision, MAX_HEAD_DIM};

/// Running sums of the weighted value sum: row `j` feeds sum `j mod 64`, as the lanes of
/// the reference engine's four 16-wide registers.
const VALUE_LANES: usize = 64;

/// How the raw scores `q·k` become the softmax's inputs: times `scale`, after a soft
/// cap `tanh(s/cap)·cap` where the model asks for one (Gemma 2's attention). An `f32`
/// converts to a plain scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scoring {
    /// Multiplier of the (capped) score.
    pub scale: f32,
    /// Soft cap of the raw score, if any.
    pub softcap: Option<f32>,
}

impl From<f32> for Scoring {
    fn from(scale: f32) -> Scoring {
        Scoring {
            scale,
            softcap: None,
        }
    }
}

impl Scoring {
    /// The multiplier the score loops apply: `scale`, or 1 when the cap comes first.
    #[inline(always)]
    fn dot_scale(self) -> f32 {
        if self.softcap.is_some() {
            1.0
        } else {
            self.scale
        }
    }

    /// Caps the raw scores and scales them, in the reference's order: times the f32
    /// inverse of the cap, `tanh`, times the cap, then the softmax's scale.
    #[inline(always)]
    fn cap(self, scores: &mut [f32]) {
        if let Some(cap) = self.softcap {
            let inverse = 1.0f32 / cap;
            for s in scores {
                *s = self.scale * ((*s * inverse).tanh() * cap);
            }
        }
    }
}

/// Scratch values [`attend_head`] needs for `n_rows` rows and value heads of
/// `value_dim`: the probabilities, then the 64 running sums of every value column.
pub fn attend_scratch_len(n_rows: usize, value_dim: usize) -> usize {
    n_rows + VALUE_LANES * value_dim
}

/// Attention of one query head over the rows `rows` of one KV head.
///
/// `scores_j = scale·(q·k_j)` for `j` in `rows`, `p = softmax(scores)`,
/// `out = Σ_j p_j·v_j`. `scratch` must hold [`attend_scratch_len`]`(rows.len(),
/// value_dim)` values; it is overwritten. An empty range writes zeros to `out`. Causal
/// masking and sliding windows are expressed by the caller's choice of `rows` (e.g.
/// `max(0, p+1−window)..p+1` for the query at position `p`).
///
/// Rounding is the reference engine's (llama.cpp's CPU attention without flash
/// attention, one-token path), so the logits match its own bit for bit:
/// - the query (and later the probabilities) are rounded as [`KvPrecision::round`];
/// - each score is a dot product in 64 lanes of fused multiply-adds, reduced as
///   [`crate::scalar::reduce_lanes_64`], the tail added in f32 or f64 per precision;
/// - the softmax is [`crate::scalar::softmax_cache_row`] (groups aligned to row 0);
/// - `out[d]` sums `p_j·v_j[d]` into lane `j mod 64` by fused multiply-adds, lanes
///   reduced as above; rows outside `rows` would add exact zeros, so skipping them
///   changes nothing.
///
/// Every order depends on absolute row indices only, never on how many queries a
/// prefill chunk holds or on the thread count.
///
/// # Panics
/// On shape mismatches, which are caller bugs, checked once per call:
/// `q.len() != keys.head_dim()`, `out.len() != values.head_dim()`, either above
/// [`MAX_HEAD_DIM`], `rows.end` beyond either view, or `scratch` too short.
pub fn attend_head<T: KvElem>(
    q: &[f32],
    keys: HeadRows<'_, T>,
    values: HeadRows<'_, T>,
    rows: Range<usize>,
    scoring: impl Into<Scoring>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let view = CacheView {
        keys,
        values,
        first_row: 0,
        precision: T::PRECISION,
    };
    attend(q, view, rows, scoring.into(), out, scratch)
}

/// The K and V rows of one KV head as [`attend`] reads them: view row `i` holds cache
/// row `first_row + i`, rounded as `precision` says (an f16 cache widened to f32 keeps
/// [`KvPrecision::F16`]).
#[derive(Debug, Clone, Copy)]
pub struct CacheView<'a, T> {
    pub keys: HeadRows<'a, T>,
    pub values: HeadRows<'a, T>,
    pub first_row: usize,
    pub precision: KvPrecision,
}

/// [`attend_head`] over a [`CacheView`]: `rows` are absolute cache rows (at least
/// `view.first_row`). This is how a caller that widened an f16 cache to f32 once per
/// chunk keeps the f16 rounding.
pub fn attend<T: KvElem>(
    q: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: impl Into<Scoring>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::use_avx512() {
        // SAFETY: `use_avx512` verified AVX-512 F, AVX2, FMA and F16C on this CPU.
        return unsafe { attend_avx512(q, view, rows, scoring.into(), out, scratch) };
    }
    // The portable code compiled for AVX2 + FMA: also the scalar tier's where the CPU has
    // them (same source, same bits).
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_has_avx2_fma() {
        // SAFETY: `cpu_has_avx2_fma` verified AVX2 and FMA on this CPU.
        return unsafe { attend_avx2(q, view, rows, scoring.into(), out, scratch) };
    }
    attend_portable(q, view, rows, scoring.into(), out, scratch)
}

/// [`attend`] with its score and value lanes in 512-bit registers (`crate::avx512`);
/// bit-identical to [`attend_portable`].
///
/// # Safety
/// The CPU must support AVX-512 F, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub unsafe fn attend_avx512<T: KvElem>(
    q: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: impl Into<Scoring>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    attend_body::<T, true>(q, view, rows, scoring.into(), out, scratch)
}

/// [`attend`] compiled for AVX2 + FMA: the same code, so fused multiply-adds become
/// single instructions and the lane loops vectorise; IEEE fused multiply-adds and
/// additions are exact operations, so the results are bit-identical.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn attend_avx2<T: KvElem>(
    q: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: impl Into<Scoring>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    attend_body::<T, false>(q, view, rows, scoring.into(), out, scratch)
}

/// [`attend`] without any CPU-specific code generation: the scalar twin.
pub fn attend_portable<T: KvElem>(
    q: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: impl Into<Scoring>,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    attend_body::<T, false>(q, view, rows, scoring.into(), out, scratch)
}

/// `WIDE`: the inner loops of [`crate::avx512`] (only inside an AVX-512 build).
#[inline(always)]
fn attend_body<T: KvElem, const WIDE: bool>(
    q: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: Scoring,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    check_head_shapes(q, &view, &rows, out, scratch);
    let n = rows.len();
    if n == 0 {
        out.fill(0.0);
        return;
    }
    let (probs, lanes) = scratch.split_at_mut(n);
    let lanes = &mut lanes[..VALUE_LANES * view.values.head_dim()]; // [64, value_dim]
                                                                    // With a soft cap the raw dot products are capped first and scaled after. One head
                                                                    // is a group of one (the portable scores outside the AVX-512 build, as before).
    group_scores_into::<T, WIDE, false>(q, view, rows.clone(), scoring.dot_scale(), probs);
    scoring.cap(probs);
    softmax::<WIDE>(probs, rows.start);
    let mut buf = [0f32; MAX_HEAD_DIM];
    let CacheView {
        values,
        first_row,
        precision,
        ..
    } = view;
    weighted_values::<T, WIDE>(
        probs, values, first_row, rows, precision, lanes, out, &mut buf,
    );
}

/// Checks that the query, output, rows and scratch of [`attend`] fit `view` (panics
/// naming the mismatch otherwise).
#[inline(always)]
fn check_head_shapes<T: KvElem>(
    q: &[f32],
    view: &CacheView<'_, T>,
    rows: &Range<usize>,
    out: &[f32],
    scratch: &[f32],
) {
    let (keys, values, first_row) = (&view.keys, &view.values, view.first_row);
    let (head_dim, value_dim) = (keys.head_dim(), values.head_dim());
    assert_eq!(q.len(), head_dim, "attend_head: q length != key head_dim");
    assert_eq!(
        out.len(),
        value_dim,
        "attend_head: out length != value head_dim"
    );
    assert!(
        head_dim <= MAX_HEAD_DIM && value_dim <= MAX_HEAD_DIM,
        "attend_head: heads wider than {MAX_HEAD_DIM}"
    );
    assert!(
        rows.start >= first_row
            && rows.end - first_row <= keys.n_rows()
            && rows.end - first_row <= values.n_rows(),
        "attend_head: rows {rows:?} outside the cache views (from row {first_row}: {} key \
         rows, {} value rows)",
        keys.n_rows(),
        values.n_rows()
    );
    assert!(
        scratch.len() >= attend_scratch_len(rows.len(), value_dim),
        "attend_head: scratch holds {} values, need {}",
        scratch.len(),
        attend_scratch_len(rows.len(), value_dim)
    );
}

/// `out[d] = Σ_j p_j·v_j[d]` for the probabilities `probs` of `rows`: each row feeds
/// lane `j mod 64` of every column by a fused multiply-add (the first row that reaches a
/// lane sets it; lanes no row reaches are zeroed), then the lanes are reduced.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn weighted_values<T: KvElem, const WIDE: bool>(
    probs: &mut [f32],
    values: HeadRows<'_, T>,
    first_row: usize,
    rows: Range<usize>,
    precision: KvPrecision,
    lanes: &mut [f32],
    out: &mut [f32],
    buf: &mut [f32; MAX_HEAD_DIM],
) {
    let value_dim = values.head_dim();
    let n = rows.len();
    #[cfg(target_arch = "x86_64")]
    if WIDE && matches!(value_dim, 64 | 128 | 256) {
        match precision {
            KvPrecision::F32 => {}
            // SAFETY: WIDE is only set inside the AVX-512 builds, whose callers
            // verified the features.
            KvPrecision::F16 => unsafe { crate::avx512::round_to_f16(probs) },
        }
        // SAFETY: WIDE is only set inside `attend_avx512` / `attend_group_avx512`,
        // whose callers verified the CPU features.
        unsafe { wide_weighted_values(probs, values, (first_row, rows.start), lanes, out) };
        return;
    }
    if n < VALUE_LANES {
        for lane in 0..VALUE_LANES {
            let reached = (lane + VALUE_LANES - rows.start % VALUE_LANES) % VALUE_LANES < n;
            if !reached {
                lanes[lane * value_dim..(lane + 1) * value_dim].fill(0.0);
            }
        }
    }
    for (i, (&p, j)) in probs.iter().zip(rows).enumerate() {
        let p = precision.round(p);
        let v = T::row_f32(values.row(j - first_row), buf);
        let lane = &mut lanes[(j % VALUE_LANES) * value_dim..][..value_dim];
        if i < VALUE_LANES {
            for (l, &x) in lane.iter_mut().zip(v.iter()) {
                *l = x.mul_add(p, 0.0);
            }
        } else {
            for (l, &x) in lane.iter_mut().zip(v.iter()) {
                *l = x.mul_add(p, *l);
            }
        }
    }
    reduce_value_lanes(lanes, value_dim, out);
}

/// Scratch values [`attend_group`] needs for `group` query heads over `n_rows` rows.
pub fn attend_group_scratch_len(group: usize, n_rows: usize, value_dim: usize) -> usize {
    group * n_rows + group_lanes_len(group, value_dim)
}

/// Lane values [`attend_group`] keeps: the portable code's 64 lanes of one head, or the
/// SIMD code's sixteen reduced lanes of every head plus four in flight for each head
/// (the AVX-512 code builds several heads' lanes together).
fn group_lanes_len(group: usize, value_dim: usize) -> usize {
    VALUE_LANES.max(20 * group) * value_dim
}

/// [`attend`] for the `group` query heads that share one KV head (`qs`: `[group,
/// head_dim]`, `outs`: `[group, value_dim]`): each key row is read once for all of
/// them. Every head's result has the bits [`attend`] gives it alone.
///
/// # Panics
/// As [`attend`]; also when `qs` or `outs` is not `group` heads long or `scratch` is
/// shorter than [`attend_group_scratch_len`].
pub fn attend_group<T: KvElem>(
    qs: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: impl Into<Scoring>,
    outs: &mut [f32],
    scratch: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::use_avx512() {
        // SAFETY: `use_avx512` verified AVX-512 F, AVX2, FMA and F16C on this CPU.
        return unsafe { attend_group_avx512(qs, view, rows, scoring.into(), outs, scratch) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::use_avx2_fma() {
        // SAFETY: `use_avx2_fma` verified AVX2 and FMA on this CPU.
        return unsafe { attend_group_avx2(qs, view, rows, scoring.into(), outs, scratch) };
    }
    // The scalar tier on a CPU with AVX2 + FMA: the portable code compiled for them.
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_has_avx2_fma() {
        // SAFETY: `cpu_has_avx2_fma` verified AVX2 and FMA on this CPU.
        return unsafe { attend_group_portable_fma(qs, view, rows, scoring.into(), outs, scratch) };
    }
    attend_group_portable(qs, view, rows, scoring.into(), outs, scratch)
}

/// [`attend_group_portable`] compiled for AVX2 + FMA: the same source (no hand-written
/// SIMD), each fused multiply-add one instruction instead of a library call; Rust never
/// reassociates floats, so the bits are the portable build's.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn attend_group_portable_fma<T: KvElem>(
    qs: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: impl Into<Scoring>,
    outs: &mut [f32],
    scratch: &mut [f32],
) {
    attend_group_body::<T, false, PORTABLE>(qs, view, rows, scoring.into(), outs, scratch)
}

/// [`attend_group`] without any CPU-specific code generation: the scalar twin.
pub fn attend_group_portable<T: KvElem>(
    qs: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: impl Into<Scoring>,
    outs: &mut [f32],
    scratch: &mut [f32],
) {
    attend_group_body::<T, false, PORTABLE>(qs, view, rows, scoring.into(), outs, scratch)
}

/// [`attend_group`] with the lanes in 512-bit registers (as [`attend_avx512`]).
///
/// # Safety
/// The CPU must support AVX-512 F, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub unsafe fn attend_group_avx512<T: KvElem>(
    qs: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: impl Into<Scoring>,
    outs: &mut [f32],
    scratch: &mut [f32],
) {
    attend_group_body::<T, true, PORTABLE>(qs, view, rows, scoring.into(), outs, scratch)
}

/// [`attend_group`] compiled for AVX2 + FMA (bit-identical, as [`attend_avx2`]).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn attend_group_avx2<T: KvElem>(
    qs: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: impl Into<Scoring>,
    outs: &mut [f32],
    scratch: &mut [f32],
) {
    attend_group_body::<T, false, AVX2>(qs, view, rows, scoring.into(), outs, scratch)
}

/// [`attend_group`]'s work, compiled into each tier's entry point: the shapes checked,
/// the scores of every head, the soft cap, then softmax and the weighted values.
#[inline(always)]
fn attend_group_body<T: KvElem, const WIDE: bool, const AVX2_SCORES: bool>(
    qs: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scoring: Scoring,
    outs: &mut [f32],
    scratch: &mut [f32],
) {
    let group = check_group_shapes(qs, &view, &rows, outs, scratch);
    let n = rows.len();
    if n == 0 {
        outs.fill(0.0);
        return;
    }
    let (probs, lanes) = scratch.split_at_mut(group * n);
    let lanes = &mut lanes[..group_lanes_len(group, view.values.head_dim())];
    // With a soft cap the raw dot products are capped first and scaled after.
    group_scores_into::<T, WIDE, AVX2_SCORES>(qs, view, rows.clone(), scoring.dot_scale(), probs);
    scoring.cap(probs);
    group_values_into::<T, WIDE, AVX2_SCORES>(probs, view, rows, lanes, outs);
}

/// The number of query heads in `qs`, after checking that the queries, outputs, rows
/// and scratch fit `view` (panics naming the mismatch otherwise).
#[inline(always)]
fn check_group_shapes<T: KvElem>(
    qs: &[f32],
    view: &CacheView<'_, T>,
    rows: &Range<usize>,
    outs: &[f32],
    scratch: &[f32],
) -> usize {
    let (head_dim, value_dim) = (view.keys.head_dim(), view.values.head_dim());
    assert!(head_dim > 0 && value_dim > 0, "attend_group: empty heads");
    let group = qs.len() / head_dim;
    assert!(
        qs.len() == group * head_dim && outs.len() == group * value_dim,
        "attend_group: {} query values and {} outputs for heads of {head_dim} and {value_dim}",
        qs.len(),
        outs.len()
    );
    assert!(
        head_dim <= MAX_HEAD_DIM && value_dim <= MAX_HEAD_DIM,
        "attend_group: heads wider than {MAX_HEAD_DIM}"
    );
    let first_row = view.first_row;
    assert!(
        rows.start >= first_row
            && rows.end - first_row <= view.keys.n_rows()
            && rows.end - first_row <= view.values.n_rows(),
        "attend_group: rows {rows:?} outside the cache views"
    );
    assert!(
        scratch.len() >= attend_group_scratch_len(group, rows.len(), value_dim),
        "attend_group: scratch too short"
    );
    group
}

/// `probs[g·n + i]` = `scale · (q_g · k_{rows.start + i})` for every query head `g` of
/// `qs`, the queries first rounded to the cache's precision, a few heads at a time (all
/// of them for every supported model): one key row load serves those heads.
#[inline(always)]
fn group_scores_into<T: KvElem, const WIDE: bool, const AVX2_SCORES: bool>(
    qs: &[f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    scale: f32,
    probs: &mut [f32],
) {
    let CacheView {
        keys,
        values,
        first_row,
        precision,
    } = view;
    let head_dim = keys.head_dim();
    let (group, n) = (qs.len() / head_dim, rows.len());
    let tail_f64 = precision == KvPrecision::F16;
    let mut buf = [0f32; MAX_HEAD_DIM];
    // `[heads, head_dim]`, kept per thread (not zeroed on every call). Taken out of
    // the thread-local rather than used inside its closure: a closure is compiled
    // without the enclosing function's target features, so its `mul_add`s would be
    // library calls on the AVX2 build.
    let mut rounded_buf = ROUNDED_QUERIES.with(|cell| cell.take());
    // The AVX-512 build's scores (WIDE), the AVX2 build's (with F16C), or none.
    #[cfg(target_arch = "x86_64")]
    let tier_scores: Option<GroupScores<T>> = if WIDE {
        Some(crate::avx512::group_scores::<T>)
    } else if AVX2_SCORES && std::arch::is_x86_feature_detected!("f16c") {
        Some(crate::avx2::group_scores::<T>)
    } else {
        None
    };
    let rounded = &mut rounded_buf;
    rounded.resize(MAX_GROUP_ROUNDED * head_dim, 0.0);
    for first in (0..group).step_by(MAX_GROUP_ROUNDED) {
        let heads = MAX_GROUP_ROUNDED.min(group - first);
        let q_all = &qs[first * head_dim..(first + heads) * head_dim];
        let rounded = &mut rounded[..heads * head_dim];
        rounded.copy_from_slice(q_all);
        precision.round_row(rounded);
        let rounded = &*rounded;
        #[cfg(target_arch = "x86_64")]
        if let Some(scores) = tier_scores.filter(|_| head_dim.is_multiple_of(VALUE_LANES)) {
            // SAFETY: `tier_scores` is the scores of the build this body was compiled
            // into, whose callers verified its features (see `tier_scores`).
            unsafe {
                scores(
                    rounded,
                    head_dim,
                    // The value rows are asked for as each key row is read: the weighted
                    // values then visit them in pieces, rows 64 apart, which no hardware
                    // prefetcher follows, so from memory they stalled the thread.
                    (keys, Some(values)),
                    first_row,
                    rows.clone(),
                    scale,
                    probs,
                    first,
                )
            };
            continue;
        }
        for (i, j) in rows.clone().enumerate() {
            let k = T::row_f32(keys.row(j - first_row), &mut buf);
            for (g, q) in rounded.chunks_exact(head_dim).enumerate() {
                probs[(first + g) * n + i] = scale * score_dot::<WIDE>(q, k, tail_f64);
            }
        }
    }
    ROUNDED_QUERIES.with(|cell| cell.replace(rounded_buf));
}

/// Each head's softmax over its row of `probs` (`[group, n]`), then its output
/// `Σ_i p_i · v_{rows.start + i}` into `outs` (`[group, value_dim]`): the tier's
/// several-heads lanes where it has them, else head by head.
#[inline(always)]
fn group_values_into<T: KvElem, const WIDE: bool, const AVX2_SCORES: bool>(
    probs: &mut [f32],
    view: CacheView<'_, T>,
    rows: Range<usize>,
    lanes: &mut [f32],
    outs: &mut [f32],
) {
    let CacheView {
        values,
        first_row,
        precision,
        ..
    } = view;
    let value_dim = values.head_dim();
    let n = rows.len();
    #[cfg(target_arch = "x86_64")]
    if AVX2_SCORES
        && value_dim.is_multiple_of(VALUE_LANES)
        && std::arch::is_x86_feature_detected!("f16c")
    {
        for p in probs.chunks_exact_mut(n) {
            softmax::<WIDE>(p, rows.start);
            precision.round_row(p);
        }
        // SAFETY: AVX2_SCORES is only set inside the AVX2 build, whose callers verified
        // AVX2 and FMA; F16C was detected just above.
        unsafe {
            crate::avx2::weighted_values_heads(probs, values, (first_row, rows.start), lanes, outs)
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if WIDE && matches!(value_dim, 64 | 128 | 256) {
        for p in probs.chunks_exact_mut(n) {
            softmax::<WIDE>(p, rows.start);
            if precision == KvPrecision::F16 {
                // SAFETY: WIDE is only set inside the AVX-512 builds (see
                // weighted_values).
                unsafe { crate::avx512::round_to_f16(p) };
            }
        }
        // SAFETY: as above.
        unsafe { wide_weighted_values(probs, values, (first_row, rows.start), lanes, outs) };
        return;
    }
    let lanes = &mut lanes[..VALUE_LANES * value_dim];
    let mut buf = [0f32; MAX_HEAD_DIM];
    for (p, out) in probs
        .chunks_exact_mut(n)
        .zip(outs.chunks_exact_mut(value_dim))
    {
        softmax::<WIDE>(p, rows.start);
        weighted_values::<T, WIDE>(
            p,
            values,
            first_row,
            rows.clone(),
            precision,
            lanes,
            out,
            &mut buf,
        );
    }
}

thread_local! {
    /// [`attend_group`]'s rounded query heads.
    static ROUNDED_QUERIES: std::cell::RefCell<Vec<f32>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A tier's scores of a KV group's query heads (`crate::avx512::group_scores`,
/// `crate::avx2::group_scores`).
#[cfg(target_arch = "x86_64")]
type GroupScores<T> = unsafe fn(
    &[f32],
    usize,
    (HeadRows<'_, T>, Option<HeadRows<'_, T>>),
    usize,
    Range<usize>,
    f32,
    &mut [f32],
    usize,
);

/// `attend_group_body`'s last parameter: the AVX2 scores or the portable ones.
const AVX2: bool = true;
const PORTABLE: bool = false;

/// Query heads whose rounded copies [`attend_group`] keeps at once.
const MAX_GROUP_ROUNDED: usize = 8;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(MAX_GROUP_ROUNDED <= crate::avx512::MAX_HEADS_AT_ONCE);

/// The AVX-512 weighted values of every head of `probs` (`[heads, n]`, already rounded
/// to the cache's precision) into `outs` (`[heads, value_dim]`, value heads 64, 128 or
/// 256 wide), with `scratch` (at least `(16·heads + 4·min(heads, 4))·value_dim` values)
/// for the lanes.
///
/// # Safety
/// The CPU has AVX-512 F, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn wide_weighted_values<T: KvElem>(
    probs: &[f32],
    values: HeadRows<'_, T>,
    rows: (usize, usize),
    scratch: &mut [f32],
    outs: &mut [f32],
) {
    use crate::avx512::weighted_values_heads as heads;
    // SAFETY: forwarded contract.
    unsafe {
        match values.head_dim() {
            64 => heads::<T, 4>(probs, values, rows, scratch, outs),
            128 => heads::<T, 8>(probs, values, rows, scratch, outs),
            _ => heads::<T, 16>(probs, values, rows, scratch, outs),
        }
    }
}

/// `Σ q[i]·k[i]` in the reference's vector order: 64 lanes of fused multiply-adds over
/// whole groups of 64, reduced as [`crate::scalar::reduce_lanes_64`]; the tail products
/// rounded to f32 and added in f64 (`tail_f64`, the f16 dot) or in f32 (the f32 dot).
#[inline(always)]
fn score_dot<const WIDE: bool>(q: &[f32], k: &[f32], tail_f64: bool) -> f32 {
    let whole = q.len() / VALUE_LANES * VALUE_LANES;
    #[cfg(target_arch = "x86_64")]
    if WIDE {
        // SAFETY: WIDE is only set inside the AVX-512 builds (see weighted_values);
        // `whole` is a multiple of 64 within q, and k is at least as long as q.
        let sum = unsafe { crate::avx512::lanes64_dot(q, k, whole) };
        return score_tail(q, k, whole, sum, tail_f64);
    }
    let mut lanes = [0f32; VALUE_LANES];
    for (cq, ck) in q[..whole]
        .chunks_exact(VALUE_LANES)
        .zip(k[..whole].chunks_exact(VALUE_LANES))
    {
        for l in 0..VALUE_LANES {
            lanes[l] = cq[l].mul_add(ck[l], lanes[l]);
        }
    }
    let sum = if whole > 0 {
        crate::scalar::reduce_lanes_64(&lanes)
    } else {
        0.0
    };
    score_tail(q, k, whole, sum, tail_f64)
}

/// [`crate::scalar::softmax_cache_row`], in its AVX-512 build when `WIDE`.
#[inline(always)]
fn softmax<const WIDE: bool>(x: &mut [f32], first: usize) {
    #[cfg(target_arch = "x86_64")]
    if WIDE {
        // SAFETY: WIDE is only set inside the AVX-512 builds, whose callers verified
        // the features of `crate::avx512::available`.
        return unsafe { crate::avx512::softmax_cache_row(x, first) };
    }
    crate::scalar::softmax_cache_row(x, first)
}

/// Adds the products past the whole groups of 64 to the lane sum `sum`: rounded to f32
/// and summed in f64 (`tail_f64`, the f16 dot) or summed in f32 (the f32 dot).
#[inline(always)]
fn score_tail(q: &[f32], k: &[f32], whole: usize, sum: f32, tail_f64: bool) -> f32 {
    if tail_f64 {
        let mut sum = f64::from(sum);
        for (&a, &b) in q[whole..].iter().zip(&k[whole..]) {
            sum += f64::from(a * b);
        }
        sum as f32
    } else {
        let mut sum = sum;
        for (&a, &b) in q[whole..].iter().zip(&k[whole..]) {
            sum += a * b;
        }
        sum
    }
}

/// `out[d]` = the 64 lanes `lanes[l·value_dim + d]` reduced as
/// [`crate::scalar::reduce_lanes_64`], column by column (the lanes are overwritten).
#[inline(always)]
fn reduce_value_lanes(lanes: &mut [f32], value_dim: usize, out: &mut [f32]) {
    let vd = value_dim;
    // r_l = (lane l + lane 32+l) + (lane 16+l + lane 48+l), kept in lane l.
    for l in 0..16 {
        let (head, tail) = lanes.split_at_mut(16 * vd);
        let dst = &mut head[l * vd..(l + 1) * vd];
        let a16 = &tail[l * vd..(l + 1) * vd];
        let a32 = &tail[(16 + l) * vd..(17 + l) * vd];
        let a48 = &tail[(32 + l) * vd..(33 + l) * vd];
        for d in 0..vd {
            dst[d] = (dst[d] + a32[d]) + (a16[d] + a48[d]);
        }
    }
    crate::scalar::reduce_sixteen_lanes(lanes, vd, out);
}
