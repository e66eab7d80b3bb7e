//! K and V cache rows as attention reads them: the element types they are stored in,
//! the rounding that goes with each, and strided (or paged) views of one head's rows.
//! Shared by the attention entry points and the per-tier kernels.

use half::f16;

/// How the reference engine rounds attention over a cache of one storage type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPrecision {
    /// f32 cache: query and probabilities used as they are; score tails summed in f32
    /// (ggml's `vec_dot_f32`).
    F32,
    /// f16 cache: query and probabilities rounded to f16 before they meet the rows;
    /// score tails summed in f64 (ggml's `vec_dot_f16`).
    F16,
}

impl KvPrecision {
    /// Rounds an activation to the cache's precision.
    #[inline(always)]
    pub fn round(self, x: f32) -> f32 {
        match self {
            KvPrecision::F32 => x,
            KvPrecision::F16 => f16::from_f32(x).to_f32(),
        }
    }

    /// `xs[i] = self.round(xs[i])` for a whole row: with F16C eight at a time (`half`
    /// uses the same instructions, one value and one CPU check per call).
    pub fn round_row(self, xs: &mut [f32]) {
        if self == KvPrecision::F32 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") {
            // SAFETY: F16C (and the AVX it implies) was just detected.
            return unsafe { round_row_f16c(xs) };
        }
        for x in xs {
            *x = self.round(*x);
        }
    }
}

/// [`KvPrecision::round_row`] to f16 and back by `vcvtps2ph` (round to nearest even) and
/// `vcvtph2ps`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn round_row_f16c(xs: &mut [f32]) {
    use std::arch::x86_64::*;
    let whole = xs.len() / 8 * 8;
    let (wide, tail) = xs.split_at_mut(whole);
    for chunk in wide.chunks_exact_mut(8) {
        // SAFETY: eight f32 each way.
        unsafe {
            let halves =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(chunk.as_ptr()));
            _mm256_storeu_ps(chunk.as_mut_ptr(), _mm256_cvtph_ps(halves));
        }
    }
    for x in tail {
        *x = f16::from_f32(*x).to_f32();
    }
}

/// An element type K/V rows can be stored in (`f32` or `half::f16`).
pub trait KvElem: Copy + Send + Sync + 'static {
    /// The reference's rounding for a cache of this type.
    const PRECISION: KvPrecision;
    /// Converts one element to f32.
    fn to_f32(self) -> f32;
    /// Converts from f32 (round to nearest even for f16).
    fn from_f32(x: f32) -> Self;
    /// The row as f32: the row itself for f32 storage, else widened into `buf`
    /// (`buf.len() >= row.len()`).
    fn row_f32<'a>(row: &'a [Self], buf: &'a mut [f32]) -> &'a [f32];
    /// The row as f16 when that is the storage (so SIMD code can widen it in
    /// registers), else `None`.
    #[inline(always)]
    fn as_f16(_row: &[Self]) -> Option<&[f16]> {
        None
    }
    /// The row as f32 when that is the storage (read in place), else `None`.
    #[inline(always)]
    fn as_f32(_row: &[Self]) -> Option<&[f32]> {
        None
    }
    /// Writes `src` converted to this type into `dst` (the common length): a cache
    /// row's store, `from_f32` element by element unless the type has a row converter.
    #[inline(always)]
    fn store_row(dst: &mut [Self], src: &[f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(s);
        }
    }
}

impl KvElem for f32 {
    const PRECISION: KvPrecision = KvPrecision::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn row_f32<'a>(row: &'a [Self], _buf: &'a mut [f32]) -> &'a [f32] {
        row
    }
    #[inline(always)]
    fn as_f32(row: &[Self]) -> Option<&[f32]> {
        Some(row)
    }
}

impl KvElem for f16 {
    const PRECISION: KvPrecision = KvPrecision::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn row_f32<'a>(row: &'a [Self], buf: &'a mut [f32]) -> &'a [f32] {
        let buf = &mut buf[..row.len()];
        crate::f16_to_f32_row(row, buf);
        buf
    }
    #[inline(always)]
    fn as_f16(row: &[Self]) -> Option<&[f16]> {
        Some(row)
    }
    /// Rounded by the hardware converter where there is one: the same round to nearest
    /// even as `f16::from_f32`, eight or sixteen values at a time.
    #[inline(always)]
    fn store_row(dst: &mut [Self], src: &[f32]) {
        let n = dst.len().min(src.len());
        crate::f32_to_f16_row(&src[..n], &mut dst[..n]);
    }
}

/// A strided view of one head's slice inside K or V rows.
///
/// The cache stores each position as one row of `row_stride` elements (all KV heads
/// side by side); head `h` of row `j` is `data[j·row_stride + col_offset ..][..head_dim]`
/// with `col_offset = h·head_dim`. The number of rows is `data.len() / row_stride`.
///
/// A paged view ([`HeadRows::head_paged`]) reads the rows in place from a block pool:
/// row `j` is pool row `blocks[j / block_size]·block_size + j % block_size`, so attention
/// over a paged cache copies nothing.
#[derive(Debug, Clone, Copy)]
pub struct HeadRows<'a, T> {
    data: &'a [T],
    row_stride: usize,
    col_offset: usize,
    head_dim: usize,
    n_rows: usize,
    /// The block table of a paged view (empty when the rows are contiguous).
    blocks: &'a [u32],
    /// log2 of the block size of a paged view.
    block_shift: u32,
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
            blocks: &[],
            block_shift: 0,
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

    /// [`HeadRows::head`] over the first `n_rows` rows of a paged cache: `pool` holds
    /// blocks of `block_size` rows (a power of two) and `blocks` lists this sequence's
    /// blocks in position order. `None` when the shape does not fit, the block size is
    /// not a power of two, or a block the rows reach lies outside `pool`.
    pub fn head_paged(
        pool: &'a [T],
        blocks: &'a [u32],
        block_size: usize,
        n_rows: usize,
        (n_kv_heads, head_dim, kv_head): (usize, usize, usize),
    ) -> Option<HeadRows<'a, T>> {
        if kv_head >= n_kv_heads || !block_size.is_power_of_two() {
            return None;
        }
        let row_stride = n_kv_heads.checked_mul(head_dim)?;
        let mut view = HeadRows::new(&pool[..0], row_stride, kv_head * head_dim, head_dim)?;
        let used = blocks.get(..n_rows.div_ceil(block_size))?;
        let block_len = block_size.checked_mul(row_stride)?;
        for &id in used {
            let end = (id as usize).checked_add(1)?.checked_mul(block_len)?;
            if end > pool.len() {
                return None;
            }
        }
        view.data = pool;
        view.n_rows = n_rows;
        view.blocks = used;
        view.block_shift = block_size.trailing_zeros();
        Some(view)
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

    /// Asks for row `j` to be brought into the L2 cache: a hint, which changes no value
    /// (nothing where the target has no prefetch instruction). Panics as
    /// [`HeadRows::row`].
    #[inline(always)]
    pub fn prefetch_row(&self, j: usize) {
        let row = self.row(j);
        #[cfg(target_arch = "x86_64")]
        for at in (0..std::mem::size_of_val(row)).step_by(64) {
            // SAFETY: a prefetch reads nothing and cannot fault (SSE, baseline on
            // x86_64); `at` lies inside `row`.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    row.as_ptr().cast::<i8>().add(at),
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = row;
    }

    /// Row `j` of this head. Panics if `j >= n_rows()` (a caller bug).
    #[inline]
    pub fn row(&self, j: usize) -> &'a [T] {
        let slot = if self.blocks.is_empty() {
            j
        } else {
            assert!(j < self.n_rows, "row {j} of {}", self.n_rows);
            let shift = self.block_shift;
            ((self.blocks[j >> shift] as usize) << shift) | (j & ((1 << shift) - 1))
        };
        let start = slot * self.row_stride + self.col_offset;
        &self.data[start..start + self.head_dim]
    }
}

/// Widest K or V head [`crate::attend_head`] accepts (every supported model's heads are at
/// most 256 wide).
pub const MAX_HEAD_DIM: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole row rounds as its elements do one by one: halfway cases (ties to even),
    /// the f16 range's edges, subnormals, infinities and NaNs, at lengths with and
    /// without a tail after the groups of eight.
    #[test]
    fn a_row_rounds_as_its_elements_do() {
        let mut values: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            1.0 + f32::EPSILON,
            1.000_488_3, // 1 + 2⁻¹¹: halfway between two f16, rounds to even
            1.001_464_8, // 1 + 3·2⁻¹¹: halfway, rounds up to even
            65504.0,
            65520.0,
            -65520.0,
            1e-8,
            6.0e-8,
            -3.0e-5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::MIN_POSITIVE,
        ];
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        values.extend((0..1000).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            f32::from_bits(state as u32)
        }));
        for len in [values.len(), values.len() - 3, 8, 5] {
            let mut row = values[..len].to_vec();
            KvPrecision::F16.round_row(&mut row);
            for (got, &x) in row.iter().zip(&values) {
                let want = KvPrecision::F16.round(x);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{x:e} ({:#010x})",
                    x.to_bits()
                );
            }
            let mut same = values[..len].to_vec();
            KvPrecision::F32.round_row(&mut same);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&same), bits(&values[..len]));
        }
    }
}
