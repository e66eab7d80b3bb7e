//! Attention for one query head over K/V rows stored as f32 or f16.
//!
//! Invariance rule: for a given query, the result depends only on the row range and
//! `head_dim`, because the reduction order is fixed — scores in row order, softmax in
//! row order ([`crate::softmax_in_place`]), the weighted sum of values in an order set by
//! the absolute row index (f32 storage: the reference engine's 64-lane order; f16: row
//! order), each dot product in a lane order fixed by `head_dim`. Nothing here depends on how many
//! query rows a prefill chunk holds or on the thread count; that is what makes the
//! engine's logits bit-identical whatever the chunk size.

use std::ops::Range;

use half::f16;

/// An element type K/V rows can be stored in (`f32` or `half::f16`).
///
/// The row kernels are trait methods so that each storage type gets its own
/// (later SIMD) implementation behind one generic [`attend_head`].
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Converts one element to f32.
    fn to_f32(self) -> f32;
    /// Converts from f32 (round to nearest even for f16).
    fn from_f32(x: f32) -> Self;
    /// `Σ q[i]·row[i]` in the lane order of [`crate::dot`].
    fn dot_row(q: &[f32], row: &[Self]) -> f32;
    /// `acc[i] += weight·row[i]`.
    fn axpy_row(acc: &mut [f32], weight: f32, row: &[Self]);
    /// Rounds an activation to this storage precision. The reference engine multiplies
    /// f16 cache rows by f16 copies of the query and of the probabilities; doing the same
    /// keeps our logits next to its own on models with large activations (Gemma).
    fn round_activation(x: f32) -> f32;
    /// Whether the weighted sum of value rows follows the reference engine's f32 lane
    /// order (f32 storage) or plain row order (f16 storage, whose reference arithmetic is
    /// f16 and CPU-specific).
    const LANE_ORDERED_VALUES: bool;
}

impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline]
    fn dot_row(q: &[f32], row: &[Self]) -> f32 {
        crate::scalar::dot_vec_order(q, row)
    }
    #[inline]
    fn axpy_row(acc: &mut [f32], weight: f32, row: &[Self]) {
        crate::axpy(acc, weight, row)
    }
    #[inline(always)]
    fn round_activation(x: f32) -> f32 {
        x
    }
    const LANE_ORDERED_VALUES: bool = true;
}

impl KvElem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline]
    fn dot_row(q: &[f32], row: &[Self]) -> f32 {
        crate::dot_f16(q, row)
    }
    #[inline]
    fn axpy_row(acc: &mut [f32], weight: f32, row: &[Self]) {
        crate::axpy_f16(acc, weight, row)
    }
    #[inline(always)]
    fn round_activation(x: f32) -> f32 {
        f16::from_f32(x).to_f32()
    }
    const LANE_ORDERED_VALUES: bool = false;
}

/// A strided view of one head's slice inside K or V rows.
///
/// The cache stores each position as one row of `row_stride` elements (all KV heads
/// side by side); head `h` of row `j` is `data[j·row_stride + col_offset ..][..head_dim]`
/// with `col_offset = h·head_dim`. The number of rows is `data.len() / row_stride`.
#[derive(Debug, Clone, Copy)]
pub struct HeadRows<'a, T> {
    data: &'a [T],
    row_stride: usize,
    col_offset: usize,
    head_dim: usize,
    n_rows: usize,
}

impl<'a, T: KvElem> HeadRows<'a, T> {
    /// A view of `data` as rows of `row_stride`, selecting columns
    /// `col_offset..col_offset + head_dim`. `None` when `head_dim` is 0, the columns do
    /// not fit in a row, or `data.len()` is not a multiple of `row_stride`.
    pub fn new(
        data: &'a [T],
        row_stride: usize,
        col_offset: usize,
        head_dim: usize,
    ) -> Option<HeadRows<'a, T>> {
        if head_dim == 0 || row_stride == 0 {
            return None;
        }
        if col_offset.checked_add(head_dim)? > row_stride || !data.len().is_multiple_of(row_stride)
        {
            return None;
        }
        Some(HeadRows {
            data,
            row_stride,
            col_offset,
            head_dim,
            n_rows: data.len() / row_stride,
        })
    }

    /// The view of KV head `kv_head` in rows that hold `n_kv_heads` heads of `head_dim`
    /// each (`row_stride = n_kv_heads·head_dim`).
    pub fn head(
        data: &'a [T],
        n_kv_heads: usize,
        head_dim: usize,
        kv_head: usize,
    ) -> Option<HeadRows<'a, T>> {
        if kv_head >= n_kv_heads {
            return None;
        }
        HeadRows::new(
            data,
            n_kv_heads.checked_mul(head_dim)?,
            kv_head * head_dim,
            head_dim,
        )
    }

    /// Number of rows (positions) in the view.
    #[inline]
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Elements per head row.
    #[inline]
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Row `j` of this head. Panics if `j >= n_rows()` (a caller bug).
    #[inline]
    pub fn row(&self, j: usize) -> &'a [T] {
        let start = j * self.row_stride + self.col_offset;
        &self.data[start..start + self.head_dim]
    }
}

/// Widest head whose query is rounded to the storage precision (every supported model's
/// heads are at most 256 wide).
const MAX_ROUNDED_HEAD: usize = 512;

/// Attention of one query head over the rows `rows` of one KV head.
///
/// `scores_j = scale·(q·k_j)` for `j` in `rows`, `p = softmax(scores)`,
/// `out = Σ_j p_j·v_j` (rows in increasing order). `scratch` must hold at least
/// `rows.len()` values; it is overwritten with the probabilities. An empty range writes
/// zeros to `out`. Causal masking and sliding windows are expressed by the caller's
/// choice of `rows` (e.g. `max(0, p+1−window)..p+1` for the query at position `p`).
///
/// # Panics
/// On shape mismatches, which are caller bugs, checked once per call:
/// `q.len() != keys.head_dim()`, `out.len() != values.head_dim()`, `rows.end` beyond
/// either view, or `scratch` shorter than `rows.len()`.
pub fn attend_head<T: KvElem>(
    q: &[f32],
    keys: HeadRows<'_, T>,
    values: HeadRows<'_, T>,
    rows: Range<usize>,
    scale: f32,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    assert_eq!(
        q.len(),
        keys.head_dim(),
        "attend_head: q length != key head_dim"
    );
    assert_eq!(
        out.len(),
        values.head_dim(),
        "attend_head: out length != value head_dim"
    );
    assert!(
        rows.end <= keys.n_rows() && rows.end <= values.n_rows(),
        "attend_head: rows {rows:?} beyond the cache views ({} key rows, {} value rows)",
        keys.n_rows(),
        values.n_rows()
    );
    let n = rows.len();
    assert!(
        scratch.len() >= n,
        "attend_head: scratch holds {} values, need {n}",
        scratch.len()
    );
    out.fill(0.0);
    if n == 0 {
        return;
    }
    // The query at the cache's precision (a no-op for f32 storage).
    let mut q_rounded = [0f32; MAX_ROUNDED_HEAD];
    let q = if q.len() <= MAX_ROUNDED_HEAD {
        for (r, &x) in q_rounded.iter_mut().zip(q) {
            *r = T::round_activation(x);
        }
        &q_rounded[..q.len()]
    } else {
        q
    };
    let probs = &mut scratch[..n];
    for (s, j) in probs.iter_mut().zip(rows.clone()) {
        *s = scale * T::dot_row(q, keys.row(j));
    }
    crate::softmax_in_place(probs);
    if T::LANE_ORDERED_VALUES {
        // out[d] = Σ_j p_j·v_j[d] as the reference engine's f32 dot over the cache rows:
        // 64 running sums, row j feeding sum j mod 64 by a fused multiply-add, then the
        // register reduction. Lanes follow the absolute row index; rows outside `rows`
        // would add exact zeros there, so skipping them changes nothing.
        let mut lanes = [0f32; 64];
        for (d, o) in out.iter_mut().enumerate() {
            lanes.fill(0.0);
            for (&p, j) in probs.iter().zip(rows.clone()) {
                let v = values.row(j)[d].to_f32();
                lanes[j % 64] = v.mul_add(p, lanes[j % 64]);
            }
            *o = crate::scalar::reduce_lanes_64(&lanes);
        }
    } else {
        for (&p, j) in probs.iter().zip(rows) {
            T::axpy_row(out, T::round_activation(p), values.row(j));
        }
    }
}
