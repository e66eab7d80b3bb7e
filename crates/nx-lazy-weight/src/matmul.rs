//! Quantized matmul: quantize each activation row once, then one dot product per output.
//!
//! `y[t][r] = dot(W row r, xq[t])` where `xq` is activation row `t` quantized to the
//! weight's `vec_dot_type`. Every output element is a single call of a dot kernel
//! whose reduction order depends on K alone, so `y[t][r]` is bit-identical whether
//! it is computed alone, inside a batch of any size, or inside any range of weight
//! rows — the batch- and thread-invariance guarantee. Threads split the work by
//! weight rows ([`matmul_quantized_pool`]), never along K.
//!
//! Tokens go through the tier's four-token kernel ([`crate::formats::DotKernel4`]) in
//! groups of four where it has one: each weight block is decoded once per group, and
//! each output still has the single-token kernel's exact bits (`tests/multi_token.rs`).

use std::ops::Range;

use nx_gguf::GgmlType;
use nx_syscalls::{CpuTier, ThreadPool};

use crate::dispatch::{
    dot_kernel4_for, dot_kernel_for, dot_kernel_rows4_for, DotKernel4, DotKernelRows4,
};
use crate::dot_scalar::DotKernel;
use crate::formats::row_bytes;
use crate::lazy::LazyWeight;
use crate::plan::{active_plan, DecodeKernel, FormatPlan, KernelPlan, PrefillKernel};
use crate::quant::quantize_row;
use crate::LazyWeightError;

/// Activation rows quantized to one `vec_dot_type`, reusable across weights with
/// the same K and dot type (Q, K and V projections share one) and across calls (the
/// buffer is kept and only grows).
#[derive(Debug, Clone)]
pub struct QuantizedActs {
    act_type: GgmlType,
    row_len: usize,
    n_rows: usize,
    row_bytes: usize,
    data: Vec<u8>,
    /// The 16-token groups again (a last one padded, see `ActTiles::groups_for`),
    /// interleaved for the tiled prefill kernels (built only when the process tier has
    /// them and there is at least one group).
    #[cfg(target_arch = "x86_64")]
    tiles: crate::act_tiles::ActTiles,
    /// The same groups in the other Q8_K layout than `tiles` (the VNNI tiles' `x + 128`
    /// beside AMX's raw quants, or the reverse), for a format multiplied with these
    /// activations whose kernel reads it (Q5_K, Q3_K, Q2_K, IQ4_XS and the grids beside
    /// AMX's Q4_K and Q6_K): built with `tiles` when the plan names both kernels, else on
    /// first need (`QuantizedActs::wide_tiles`).
    #[cfg(target_arch = "x86_64")]
    tiles_other: std::sync::OnceLock<crate::act_tiles::ActTiles>,
    /// The 2 to 16 tokens after the whole groups again (sixteen Q8_0 tokens take them
    /// instead of one wide group), for the narrow tiles (built only when the process
    /// tier has them and the activations are Q8_0).
    #[cfg(target_arch = "x86_64")]
    narrow: crate::narrow::NarrowTiles,
    /// The 2 to 16 tokens after the whole groups again, for the K formats' narrow tiles
    /// (built only when the CPU has them and the activations are Q8_K).
    #[cfg(target_arch = "x86_64")]
    narrow_k: crate::narrow_k::NarrowKTiles,
    /// Every token again, for the AVX2 tier's token groups (built only on that tier,
    /// for Q8_0 activations of at least two tokens).
    #[cfg(target_arch = "x86_64")]
    groups: crate::groups_avx2::GroupActs,
    /// Every token again, for the AVX2 tier's K-quant token groups (built only on that
    /// tier, for Q8_K activations of at least two tokens).
    #[cfg(target_arch = "x86_64")]
    kgroups: crate::kgroups_avx2::KGroupActs,
}

impl Default for QuantizedActs {
    fn default() -> Self {
        Self::new()
    }
}

impl QuantizedActs {
    /// An empty holder (no rows).
    pub fn new() -> Self {
        QuantizedActs {
            act_type: GgmlType::F32,
            row_len: 0,
            n_rows: 0,
            row_bytes: 0,
            data: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            tiles: crate::act_tiles::ActTiles::default(),
            #[cfg(target_arch = "x86_64")]
            tiles_other: std::sync::OnceLock::new(),
            #[cfg(target_arch = "x86_64")]
            narrow: crate::narrow::NarrowTiles::default(),
            #[cfg(target_arch = "x86_64")]
            narrow_k: crate::narrow_k::NarrowKTiles::default(),
            #[cfg(target_arch = "x86_64")]
            groups: crate::groups_avx2::GroupActs::default(),
            #[cfg(target_arch = "x86_64")]
            kgroups: crate::kgroups_avx2::KGroupActs::default(),
        }
    }

    /// Quantize `n` rows of `row_len` values from `x` (`[n, row_len]`, row-major) to
    /// `act_type` (F32, F16, BF16, Q8_0, Q8_1 or Q8_K), replacing the previous contents.
    pub fn quantize(
        &mut self,
        act_type: GgmlType,
        x: &[f32],
        n: usize,
        row_len: usize,
    ) -> Result<(), LazyWeightError> {
        self.quantize_with_plan(&*active_plan()?, act_type, x, n, row_len, None)
    }

    /// [`QuantizedActs::quantize`] with the rows spread over `pool`'s threads (each row
    /// is quantized on its own, so the bytes are the same).
    pub fn quantize_pool(
        &mut self,
        act_type: GgmlType,
        x: &[f32],
        n: usize,
        row_len: usize,
        pool: &ThreadPool,
    ) -> Result<(), LazyWeightError> {
        self.quantize_with_plan(&*active_plan()?, act_type, x, n, row_len, Some(pool))
    }

    /// [`QuantizedActs::quantize`] laid out for `plan`'s kernels (the extra layouts the
    /// plan's prefill kernels read are built beside the rows), on `pool` when given.
    /// Activations built for one plan multiply correctly under any other: a kernel
    /// whose layout is missing is replaced by one that reads the plain rows.
    pub fn quantize_with_plan(
        &mut self,
        plan: &KernelPlan,
        act_type: GgmlType,
        x: &[f32],
        n: usize,
        row_len: usize,
        pool: Option<&ThreadPool>,
    ) -> Result<(), LazyWeightError> {
        let (rb, total) = checked_act_sizes(act_type, x.len(), n, row_len)?;
        self.data.resize(total, 0);
        if rb > 0 {
            quantize_act_rows(act_type, x, row_len, &mut self.data, rb, pool)?;
        }
        self.act_type = act_type;
        self.row_len = row_len;
        self.n_rows = n;
        self.row_bytes = rb;
        #[cfg(target_arch = "x86_64")]
        self.build_layouts(plan, pool);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (plan, pool);
        Ok(())
    }

    /// The extra layouts `plan`'s prefill kernels read, from the quantized rows.
    #[cfg(target_arch = "x86_64")]
    fn build_layouts(&mut self, plan: &KernelPlan, pool: Option<&ThreadPool>) {
        let (act_type, n, rb) = (self.act_type, self.n_rows, self.row_bytes);
        let amx = plan.wants(act_type, PrefillKernel::Amx);
        let vnni = plan.wants(act_type, PrefillKernel::Tiles);
        let tiles = amx || vnni;
        let n_groups = crate::act_tiles::ActTiles::groups_for(act_type, n);
        self.tiles_other = std::sync::OnceLock::new();
        if n_groups > 0 && tiles && crate::tiled::available() {
            let raw_k = amx && crate::amx::available();
            self.tiles.build(act_type, &self.data, n, rb, raw_k, pool);
            if self.tiles.raw_k() && vnni {
                let mut other = crate::act_tiles::ActTiles::default();
                other.build(act_type, &self.data, n, rb, false, pool);
                let _ = self.tiles_other.set(other);
            }
        } else {
            self.tiles.clear();
        }
        if act_type == GgmlType::Q8_0 && tiles && crate::tiled::available() {
            // Exactly one group of sixteen gets both layouts: Q8_0 weights take the
            // narrow tiles, the rest the wide ones (`narrow::takes_group`).
            let first = match n {
                crate::act_tiles::TILE => 0,
                _ => self.tiles.n_tokens(),
            };
            self.narrow.build(&self.data, first, n, rb);
        } else {
            self.narrow.clear();
        }
        if act_type == GgmlType::Q8_K && tiles && crate::narrow_k::available() {
            // Exactly one group of sixteen gets both layouts too, unless AMX multiplies
            // the wide ones: the narrow K tiles read the rows straight from the mapping,
            // where the VNNI wide tiles unpack them for one group's use (`nx bench
            // --parallel 16 -p 16 -n 32`, Qwen2.5-1.5B shapes, three alternating runs:
            // 84.5, 78.4, 80.2 → 88.3, 79.3, 89.1 t/s).
            let first = match n == crate::act_tiles::TILE && !self.tiles.raw_k() {
                true => 0,
                false => self.tiles.n_tokens(),
            };
            self.narrow_k.build(&self.data, first, n, rb);
        } else {
            self.narrow_k.clear();
        }
        let groups = plan.wants(act_type, PrefillKernel::Groups);
        if act_type == GgmlType::Q8_0 && groups && crate::groups_avx2::available() {
            self.groups.build(&self.data, n, rb);
        } else {
            self.groups.clear();
        }
        if act_type == GgmlType::Q8_K && groups && crate::kgroups_avx2::available() {
            self.kgroups.build(&self.data, n, rb);
        } else {
            self.kgroups.clear();
        }
    }

    /// The wide tiles in the layout a tile kernel reads (`raw_k`: AMX's raw Q8_K quants,
    /// else the VNNI one); the empty tiles when there are no groups (fewer than sixteen
    /// tokens). The other layout than `tiles` is built here on first need (on this
    /// thread; other threads asking meanwhile wait for it); `None` when it cannot exist
    /// (raw quants asked of other activations, or without AMX).
    #[cfg(target_arch = "x86_64")]
    fn wide_tiles(&self, raw_k: bool) -> Option<&crate::act_tiles::ActTiles> {
        if self.tiles.n_groups() == 0 || self.tiles.raw_k() == raw_k {
            return Some(&self.tiles);
        }
        if raw_k && !crate::amx::available() {
            return None;
        }
        let other = self.tiles_other.get_or_init(|| {
            let mut other = crate::act_tiles::ActTiles::default();
            let (act, n, rb) = (self.act_type, self.n_rows, self.row_bytes);
            other.build(act, &self.data, n, rb, raw_k, None);
            other
        });
        (other.n_groups() > 0 && other.raw_k() == raw_k).then_some(other)
    }

    /// Quantize `n` rows `x` (`[n, K]`) for multiplication with `w`.
    pub fn quantize_for(
        &mut self,
        w: &LazyWeight<'_>,
        x: &[f32],
        n: usize,
    ) -> Result<(), LazyWeightError> {
        self.quantize(w.vec_dot_type(), x, n, w.row_len())
    }

    /// [`QuantizedActs::quantize_for`] with the rows spread over `pool`'s threads.
    pub fn quantize_for_pool(
        &mut self,
        w: &LazyWeight<'_>,
        x: &[f32],
        n: usize,
        pool: &ThreadPool,
    ) -> Result<(), LazyWeightError> {
        self.quantize_pool(w.vec_dot_type(), x, n, w.row_len(), pool)
    }

    /// The activation type held.
    pub fn act_type(&self) -> GgmlType {
        self.act_type
    }

    /// Elements per row (K).
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Number of activation rows (tokens).
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Bytes per quantized row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The bytes of quantized row `t`, or `None` past the end.
    pub fn get_row(&self, t: usize) -> Option<&[u8]> {
        if t >= self.n_rows {
            return None;
        }
        self.data.get(t * self.row_bytes..(t + 1) * self.row_bytes)
    }

    /// True when these activations can multiply `w` (same K and dot type).
    pub fn fits(&self, w: &LazyWeight<'_>) -> bool {
        self.check_for(w).is_ok()
    }

    pub(crate) fn check_for(&self, w: &LazyWeight<'_>) -> Result<(), LazyWeightError> {
        if self.act_type != w.vec_dot_type() {
            return Err(LazyWeightError::ActivationType {
                weight: w.ggml_type(),
                expected: w.vec_dot_type(),
                actual: self.act_type,
            });
        }
        if self.row_len != w.row_len() {
            return Err(LazyWeightError::LengthMismatch {
                what: "activation row length K",
                expected: w.row_len(),
                actual: self.row_len,
            });
        }
        Ok(())
    }
}

/// True when a matmul of `weight_type` by at least 16 tokens goes through the
/// token-tiled kernels (AVX-512 VNNI or AMX) under the active plan; their outputs are
/// bit-identical to the per-output kernels'.
pub fn uses_tiled_kernels(weight_type: GgmlType) -> bool {
    active_plan().is_ok_and(|p| {
        matches!(
            p.get(weight_type).prefill,
            PrefillKernel::Tiles | PrefillKernel::Amx
        )
    })
}

/// `y = x·Wᵀ`: `x` is `[n, K]`, `y` is `[n, N]` (N = `w.n_rows()`), both row-major.
/// Quantizes `x` into `scratch`, then calls [`matmul_quantized`].
pub fn matmul(
    w: &LazyWeight<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    scratch: &mut QuantizedActs,
) -> Result<(), LazyWeightError> {
    scratch.quantize_for(w, x, n)?;
    matmul_quantized(w, scratch, y)
}

/// [`matmul`] with the weight rows split across `pool`'s threads. Bit-identical to
/// [`matmul`] for any thread count.
pub fn matmul_pool(
    w: &LazyWeight<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    scratch: &mut QuantizedActs,
    pool: &ThreadPool,
) -> Result<(), LazyWeightError> {
    scratch.quantize_for_pool(w, x, n, pool)?;
    matmul_quantized_pool(w, scratch, y, pool)
}

/// `y[t][r] = dot(W row r, xq row t)` for all tokens and all weight rows; `y` is
/// `[xq.n_rows(), w.n_rows()]`.
pub fn matmul_quantized(
    w: &LazyWeight<'_>,
    xq: &QuantizedActs,
    y: &mut [f32],
) -> Result<(), LazyWeightError> {
    // For the full row range, matmul_rows' output layout [n, rows.len()] is y's.
    matmul_rows(w, xq, 0..w.n_rows(), y)
}

/// Fewer activation rows than this are quantized on the calling thread: a batched decode
/// step's 8 or 16 rows take a few microseconds, about what handing them to the pool
/// costs, and a step quantizes four times per layer. Inline, `nx bench -p 16 -n 96
/// --parallel 8` ran 2.7 % faster, 16 streams 2.2 % (medians of 10 and 8 alternating
/// pairs, with RoPE's `MIN_PARALLEL_ROWS` raised alike; AMD EPYC family 25 model 17).
const MIN_PARALLEL_QUANTIZE_ROWS: usize = 32;

/// Below this much work (weight bytes × tokens) a matmul runs on the calling thread:
/// waking the pool would cost more than it saves.
const MIN_PARALLEL_WORK: usize = 32 << 10;
/// Upper bound on one chunk's work, so a thread that is descheduled mid-matmul holds back
/// only a small part of it.
const MAX_CHUNK_WORK: usize = 256 << 10;
/// Chunks are whole multiples of this many weight rows (kernels may tile rows).
const ROW_GRAIN: usize = 16;

/// Weight rows per chunk for `n_cols` rows costing `row_work` each on `n_threads`
/// threads, or `None` when the matmul should not be split.
fn rows_per_chunk(n_cols: usize, row_work: usize, n_threads: usize) -> Option<usize> {
    if n_threads <= 1
        || n_cols < 2 * ROW_GRAIN
        || n_cols.saturating_mul(row_work) < MIN_PARALLEL_WORK
    {
        return None;
    }
    // About eight chunks per thread balances uneven progress; the cap bounds a chunk's
    // cost for huge matrices (the LM head).
    let balanced = n_cols.div_ceil(n_threads * 8).next_multiple_of(ROW_GRAIN);
    Some(balanced.min(bounded_chunk_rows(row_work)))
}

/// Weight rows per chunk for a matrix of `n_cols` rows, one of `n_jobs` in a batch
/// ([`matmul_batch_pool`]) on `n_threads` threads: about eight chunks per thread over the
/// whole batch, since the jobs balance each other, so a batch of many small matrices (a
/// token's experts) gives each one chunk. Cut as if alone (eight chunks per thread for
/// each of them), a token's sixteen expert projections made 256 short chunks, each
/// starting cold and two threads interleaving on every matrix: `nx bench -p 0 -n 48`,
/// Qwen3-MoE, AMD EPYC family 25 model 17, three alternating pairs, 55 → 68 tok/s on two
/// threads, 60.3 → 65.5 with `NX_TIER=avx2`, 41.2 → 42.7 on one; prefill unchanged.
fn batch_chunk_rows(n_cols: usize, n_threads: usize, n_jobs: usize) -> usize {
    let pieces = (n_threads.max(2) * 8).div_ceil(n_jobs.max(1));
    n_cols.div_ceil(pieces).next_multiple_of(ROW_GRAIN)
}

/// The most weight rows (a multiple of [`ROW_GRAIN`], at least one grain) whose work stays
/// within [`MAX_CHUNK_WORK`]: the pool's cap, and the chunks one thread runs in turn.
fn bounded_chunk_rows(row_work: usize) -> usize {
    (MAX_CHUNK_WORK / row_work.max(1))
        .max(1)
        .next_multiple_of(ROW_GRAIN)
}

/// [`matmul_quantized`] with the weight rows split across `pool`'s threads in chunks
/// claimed dynamically. Every output element is still one dot-kernel call over its full
/// row, so `y` is bit-identical for any thread count.
pub fn matmul_quantized_pool(
    w: &LazyWeight<'_>,
    xq: &QuantizedActs,
    y: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), LazyWeightError> {
    matmul_quantized_pool_with(&*active_plan()?, w, xq, y, pool)
}

/// [`matmul_quantized_pool`] with the kernels of `plan` rather than the active plan's
/// (for timing candidates and for tests: every plan gives the same bits).
pub fn matmul_quantized_pool_with(
    plan: &KernelPlan,
    w: &LazyWeight<'_>,
    xq: &QuantizedActs,
    y: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), LazyWeightError> {
    let n_cols = w.n_rows();
    let row_work = w.row_bytes().saturating_mul(xq.n_rows());
    let kernels = checked_kernel(plan, w, xq, 0..n_cols, y.len())?;
    let Some(chunk) = rows_per_chunk(n_cols, row_work, pool.n_threads()) else {
        // On the calling thread, still in chunks of bounded work: `rows_into` reads a
        // chunk's weight rows once per token group, so a whole prefill matrix as one chunk
        // would stream from memory again for every group (the Qwen2.5-1.5B shapes' pp512
        // on one thread: 34.6 t/s so, against 130 on two threads).
        let serial = bounded_chunk_rows(row_work);
        for start in (0..n_cols).step_by(serial) {
            let rows = start..(start + serial).min(n_cols);
            // SAFETY: `y` holds exactly `[n, n_cols]` (checked), and the writes go to
            // `t·n_cols + r` for `t < n`, `r < n_cols`: all in bounds.
            unsafe { rows_into(kernels, w, xq, rows, y.as_mut_ptr(), n_cols, 0) };
        }
        return Ok(());
    };
    let out = OutPtr(y.as_mut_ptr());
    pool.parallel_for(n_cols, chunk, |rows| {
        // SAFETY: `y` holds `[n, n_cols]` (checked above) and stays mutably borrowed until
        // parallel_for returns; each chunk writes only the columns `rows` of every token
        // row, and the chunks' row ranges are disjoint, so no element is written twice or
        // by two threads.
        unsafe { rows_into(kernels, w, xq, rows, out.get(), n_cols, 0) }
    });
    Ok(())
}

/// One product of a batch for [`matmul_batch_pool`]: `y = xq·wᵀ`, `y: [xq.n_rows(), w.n_rows()]`.
pub struct MatmulJob<'j, 'w> {
    /// The weight.
    pub w: &'j LazyWeight<'w>,
    /// Its quantized activations.
    pub xq: &'j QuantizedActs,
    /// Where the product goes.
    pub y: &'j mut [f32],
}

/// Several independent matmuls in one parallel pass over `pool`: the chunks of every
/// job's weight rows share one work list, so many small products (a token's experts)
/// keep all threads busy where one pool call each would spend more waking threads than
/// computing. Every output element is still one dot-kernel call over its full row:
/// each `y` is bit-identical to [`matmul_quantized`] of its job, for any thread count.
pub fn matmul_batch_pool(
    jobs: &mut [MatmulJob<'_, '_>],
    pool: &ThreadPool,
) -> Result<(), LazyWeightError> {
    // (job, rows) chunks, about eight per thread over the whole batch.
    let plan = active_plan()?;
    let mut chunks: Vec<(usize, Range<usize>)> = Vec::new();
    let mut kernels = Vec::with_capacity(jobs.len());
    let mut outs = Vec::with_capacity(jobs.len());
    let n_jobs = jobs.len();
    for (j, job) in jobs.iter_mut().enumerate() {
        let n_cols = job.w.n_rows();
        kernels.push(checked_kernel(
            &plan,
            job.w,
            job.xq,
            0..n_cols,
            job.y.len(),
        )?);
        outs.push(OutPtr(job.y.as_mut_ptr()));
        let chunk = batch_chunk_rows(n_cols, pool.n_threads(), n_jobs);
        let mut start = 0;
        while start < n_cols {
            let end = (start + chunk.max(1)).min(n_cols);
            chunks.push((j, start..end));
            start = end;
        }
    }
    let views: Vec<(&LazyWeight<'_>, &QuantizedActs)> = jobs.iter().map(|j| (j.w, j.xq)).collect();
    pool.parallel_for(chunks.len(), 1, |range| {
        for (j, rows) in &chunks[range] {
            let (w, xq) = views[*j];
            // SAFETY: each job's `y` holds `[n, n_cols]` (checked by `checked_kernel`) and
            // stays mutably borrowed by `jobs` until parallel_for returns; a chunk writes
            // only the columns `rows` of its job's token rows, and the chunks of one job
            // have disjoint row ranges while different jobs own different buffers, so no
            // element is written twice or by two threads.
            unsafe {
                rows_into(
                    kernels[*j],
                    w,
                    xq,
                    rows.clone(),
                    outs[*j].get(),
                    w.n_rows(),
                    0,
                )
            }
        }
    });
    Ok(())
}

/// Prefetches the first [`crate::avx2::WEIGHT_PREFETCH_BYTES`] of a chunk's weight rows.
/// The kernels prefetch that far ahead of what they read, so a chunk's first bytes are
/// the ones nobody prefetched (the chunk before it in memory, which ran ahead into them,
/// went to another thread or another matrix): without this they arrive one demand miss
/// at a time, which costs the short chunks of small matrices (MoE experts) a large part
/// of their time.
///
/// Into L2, not L1: the 128 requests at once overflow the L1's miss buffers, and the
/// thread stalled on them (9 % of the MoE file's decode samples sat on this loop, AMD
/// EPYC family 25 model 17). With L2 prefetches, `nx bench -p 0 -n 48 -t 2`, means of
/// two to four alternating pairs: Qwen3-MoE 50.8 → 56.0 tok/s, Qwen2.5-1.5B shapes 31.8 → 33.8, the
/// default model 93.4 → 98.3; with `NX_TIER=avx2` MoE 46.8 → 52.0, the default model
/// 80.5 → 83.9; one thread MoE 40.5 → 42.0; prefill unchanged.
#[inline]
fn prefetch_chunk_start(w_rows: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in w_rows[..w_rows.len().min(crate::avx2::WEIGHT_PREFETCH_BYTES)].chunks(64) {
        // SAFETY: a prefetch is a hint that reads nothing and cannot fault (SSE, baseline
        // on x86_64).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                line.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = w_rows;
}

/// The inner entry for splitting work across threads by weight rows: computes
/// `out[t][r − rows.start] = dot(W row r, xq row t)` for `r` in `rows` and every token
/// `t`, with `out` laid out `[xq.n_rows(), rows.len()]` (token-major).
///
/// The value of each element does not depend on `rows` or on the number of tokens.
pub fn matmul_rows(
    w: &LazyWeight<'_>,
    xq: &QuantizedActs,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<(), LazyWeightError> {
    let kernels = checked_kernel(&*active_plan()?, w, xq, rows.clone(), out.len())?;
    let width = rows.len();
    // SAFETY: `out` holds exactly `[n, width]` (checked), and the writes go to
    // `t·width + (r − rows.start)` for `t < n`, `r ∈ rows`: all in bounds.
    unsafe {
        rows_into(
            kernels,
            w,
            xq,
            rows.clone(),
            out.as_mut_ptr(),
            width,
            rows.start,
        )
    };
    Ok(())
}

/// Validates a `rows` slice of `w` times `xq` into an output of `out_len` elements laid
/// out `[n, rows.len()]`, and returns `plan`'s dot kernels for `w`.
fn checked_kernel(
    plan: &KernelPlan,
    w: &LazyWeight<'_>,
    xq: &QuantizedActs,
    rows: Range<usize>,
    out_len: usize,
) -> Result<Kernels, LazyWeightError> {
    xq.check_for(w)?;
    if rows.start > rows.end || rows.end > w.n_rows() {
        return Err(LazyWeightError::RowOutOfRange {
            row: rows.end.max(rows.start),
            n_rows: w.n_rows(),
        });
    }
    let width = rows.end - rows.start;
    let n = xq.n_rows();
    if out_len != n * width {
        return Err(LazyWeightError::LengthMismatch {
            what: "matmul output [n, rows]",
            expected: n * width,
            actual: out_len,
        });
    }
    Kernels::of(plan.get(w.ggml_type()), w.ggml_type(), xq)
}

/// The dot kernels of one matmul, from its format's plan: the decode kernels (one row
/// and four rows at a time) for single tokens, and the prefill kernel for the rest.
#[derive(Clone, Copy)]
struct Kernels {
    single: DotKernel,
    four: Option<DotKernel4>,
    rows4: Option<DotKernelRows4>,
    /// The token-tiled kernels (VNNI or AMX) take the whole 16-token groups.
    tiled: bool,
    /// The tiled kernel is AMX's (it reads the raw Q8_K layout).
    #[cfg(target_arch = "x86_64")]
    tiled_raw: bool,
    /// The AVX2 token groups take every token (when there are two or more).
    #[cfg(target_arch = "x86_64")]
    groups: bool,
    /// The fewest tokens left after the groups of four that go through the four-token
    /// kernel as a padded group rather than one by one.
    pad_four_from: usize,
}

impl Kernels {
    /// The kernels `plan` names for `ty`. A prefill kernel whose activation layout `xq`
    /// lacks (built under another plan) gives way to the four-token kernel: same bits.
    fn of(plan: FormatPlan, ty: GgmlType, xq: &QuantizedActs) -> Result<Kernels, LazyWeightError> {
        let unsupported = LazyWeightError::UnsupportedType {
            ggml_type: ty,
            op: "matmul",
        };
        let tier = plan.decode.tier();
        let single = dot_kernel_for(tier, ty).ok_or(unsupported)?;
        let rows4 = match plan.decode {
            DecodeKernel::Rows4(t) => dot_kernel_rows4_for(t, ty),
            DecodeKernel::Rows1(_) => None,
        };
        #[cfg(target_arch = "x86_64")]
        let (tiled, groups) = match plan.prefill {
            // The wide tiles' layout must be the kernel's (raw quants for AMX); without
            // wide tiles the narrow ones, the same for both, still run.
            PrefillKernel::Tiles => (xq.wide_tiles(false).is_some(), false),
            PrefillKernel::Amx => (xq.wide_tiles(true).is_some(), false),
            PrefillKernel::Groups => (false, true),
            _ => (false, false),
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (tiled, _) = (false, xq);
        // The tokens the tiles and groups leave go four at a time when a tier has a
        // four-token kernel: the plan's, else the tiles' AVX-512 one, else AVX2's.
        let four = match plan.prefill {
            PrefillKernel::Tokens4(t) => dot_kernel4_for(t, ty),
            PrefillKernel::PerToken => None,
            PrefillKernel::Tiles | PrefillKernel::Amx => dot_kernel4_for(CpuTier::Avx512Vnni, ty),
            PrefillKernel::Groups => dot_kernel4_for(CpuTier::Avx2, ty),
        };
        // Two Q2_K / Q3_K tokens cost less one by one through the AVX-512 four-row kernel
        // than padded to four (`nx bench --parallel 2` on the Qwen2.5-1.5B Q2_K file).
        let pad_four_from = match (ty, plan.decode) {
            (GgmlType::Q2_K | GgmlType::Q3_K, DecodeKernel::Rows4(CpuTier::Avx512Vnni)) => 3,
            _ => PAD_TO_FOUR_FROM,
        };
        Ok(Kernels {
            single,
            four,
            rows4,
            pad_four_from,
            tiled,
            #[cfg(target_arch = "x86_64")]
            tiled_raw: plan.prefill == PrefillKernel::Amx,
            #[cfg(target_arch = "x86_64")]
            groups,
        })
    }
}

/// Writes `dot(W row r, xq row t)` to `out[t·stride + r − col0]` for `r` in `rows` and
/// every token `t`.
///
/// # Safety
/// `rows` must lie within `w`'s rows, `xq` must fit `w` and `kernels` must be `w`'s dot
/// kernels (see [`checked_kernel`]); `out` must be valid for writes at every index
/// `t·stride + r − col0` (`t < xq.n_rows()`, `r ∈ rows`), with no other thread
/// accessing those elements during the call.
unsafe fn rows_into(
    kernels: Kernels,
    w: &LazyWeight<'_>,
    xq: &QuantizedActs,
    rows: Range<usize>,
    out: *mut f32,
    stride: usize,
    col0: usize,
) {
    let n = xq.n_rows();
    if rows.is_empty() || n == 0 {
        return;
    }
    let row_bytes = w.row_bytes();
    let w_rows = &w.bytes()[rows.start * row_bytes..rows.end * row_bytes];
    prefetch_chunk_start(w_rows);
    // SAFETY: forwarded contract (the layouts' writes stay within it).
    #[cfg(target_arch = "x86_64")]
    let t0 = unsafe { layouts_into(kernels, w, xq, w_rows, rows.start, out, stride, col0) };
    #[cfg(not(target_arch = "x86_64"))]
    let t0 = 0;
    if t0 == n {
        return;
    }
    let x_row_bytes = xq.row_bytes;
    let x_rows = &xq.data[t0 * x_row_bytes..n * x_row_bytes];
    let rows_out = RowsOut {
        rows,
        out,
        stride,
        col0,
    };
    // Token groups outer, weight rows inner: a chunk's weight rows (a few KiB when
    // prefilling, see `rows_per_chunk`) stay in L1 while each group's activations are
    // read once per chunk, not once per weight row. Tokens go four at a time through
    // the four-token kernel (each weight block decoded once for the four); the rest
    // (every token when decoding) take four weight rows at a time through the four-row
    // kernel (each activation block prepared once for the four), or one at a time. All
    // give every output the same bits, so the grouping never shows in `y`.
    // SAFETY (both): forwarded contract; tokens `t0..n` of `xq` are `x_rows`.
    let grouped = unsafe {
        tokens4_into(
            kernels,
            w_rows,
            row_bytes,
            x_rows,
            x_row_bytes,
            t0,
            &rows_out,
        )
    };
    let rest = x_rows.chunks_exact(x_row_bytes).enumerate().skip(grouped);
    for (t, x_row) in rest {
        // SAFETY: as above.
        unsafe { token_into(kernels, w_rows, row_bytes, x_row, t0 + t, &rows_out) };
    }
}

/// Where [`rows_into`]'s outputs go: row `r ∈ rows` of token `t` to
/// `out[t·stride + r − col0]`.
struct RowsOut {
    rows: Range<usize>,
    out: *mut f32,
    stride: usize,
    col0: usize,
}

impl RowsOut {
    /// Writes token `t`'s output of row `r`.
    ///
    /// # Safety
    /// As [`rows_into`]: `t` a token of the call, `r ∈ rows`.
    #[inline(always)]
    unsafe fn put(&self, t: usize, r: usize, y: f32) {
        // SAFETY: in bounds and unshared by the caller's contract.
        unsafe { *self.out.add(t * self.stride + r - self.col0) = y };
    }
}

/// The tokens the x86 layouts take (the AVX2 token groups; the wide tiles' whole
/// groups of sixteen, then the narrow tiles' 2 to 16 after them), written through
/// those kernels; returns how many leading tokens are done (all of them after the
/// groups).
///
/// # Safety
/// As [`rows_into`], with `w_rows` the bytes of rows `row0..` of `w` in the call.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn layouts_into(
    kernels: Kernels,
    w: &LazyWeight<'_>,
    xq: &QuantizedActs,
    w_rows: &[u8],
    row0: usize,
    out: *mut f32,
    stride: usize,
    col0: usize,
) -> usize {
    let (n, row_bytes, ty) = (xq.n_rows(), w.row_bytes(), w.ggml_type());
    if kernels.groups {
        // SAFETY: `kernels.groups` means the CPU has the features and the type has a
        // group kernel; the groups were built from `xq`, which fits `w` (checked by the
        // caller). Writes go to `t·stride + r − col0` for `t < n`, `r ∈ rows`.
        let out_rows = unsafe { out.add(row0 - col0) };
        if xq.groups.n_tokens() == n {
            // SAFETY: as above (Q8_0 activations, a Q4_0 / Q5_0 / Q8_0 weight).
            unsafe { crate::groups_avx2::run(ty, w_rows, row_bytes, &xq.groups, out_rows, stride) };
            return n;
        }
        if xq.kgroups.n_tokens() == n && crate::kgroups_avx2::has_kernel(ty) {
            // SAFETY: as above (Q8_K activations, a Q4_K / Q5_K / Q6_K weight).
            let k = &xq.kgroups;
            unsafe { crate::kgroups_avx2::run(ty, w_rows, row_bytes, k, out_rows, stride) };
            return n;
        }
    }
    let mut t0 = 0;
    let narrow_whole = kernels.tiled
        && ((xq.narrow.held.all_of(n) && crate::narrow::takes_group(ty))
            || (xq.narrow_k.held.all_of(n) && crate::narrow_k::has_kernel(ty, n)));
    // Only a tile kernel asks for its layout (asking may build it).
    let wide = match kernels.tiled && !narrow_whole {
        true => xq.wide_tiles(kernels.tiled_raw),
        false => None,
    };
    if let Some(wide) = wide.filter(|t| t.n_groups() > 0) {
        // SAFETY: `kernels.tiled` means the CPU has the tiled kernels' features and the
        // type has one; the tiles (in the kernel's layout) were built from `xq`, which
        // fits `w` (checked by the caller). Writes go to `t·stride + r − col0` for
        // `t < n`, `r ∈ rows`.
        unsafe { crate::tiled::run(ty, w_rows, row_bytes, wide, out.add(row0 - col0), stride) };
        t0 = wide.n_tokens();
    }
    // The 2 to 16 tokens after them (a batched decode step, a draft verification) go
    // through the narrow tiles when the format has them.
    if let Some(count) = xq.narrow.held.from(t0) {
        if kernels.tiled && crate::narrow::has_kernel(ty) {
            // SAFETY: as for the wide tiles; the narrow tiles hold tokens t0..n of `xq`.
            unsafe {
                let out = out.add(t0 * stride + row0 - col0);
                crate::narrow::run(ty, w_rows, row_bytes, &xq.narrow, out, stride)
            };
            t0 += count;
        }
    }
    if let Some(count) = xq.narrow_k.held.from(t0) {
        if kernels.tiled && crate::narrow_k::has_kernel(ty, count) {
            // SAFETY: as for the wide tiles; the narrow K tiles hold tokens t0..n of `xq`.
            unsafe {
                let out = out.add(t0 * stride + row0 - col0);
                crate::narrow_k::run(ty, w_rows, row_bytes, &xq.narrow_k, out, stride)
            };
            t0 += count;
        }
    }
    t0
}

/// The leading tokens of `x_rows` (token `t0 + t` each) that go through the four-token
/// kernel, written; returns how many (none without a four-token kernel). Two or three
/// tokens left over also take it, the last one repeated in the empty places (whose
/// outputs are dropped): one pass over the weight rows instead of two or three.
///
/// # Safety
/// As [`rows_into`]: `w_rows` the bytes of `to.rows`, `x_rows` quantized tokens `t0..`.
unsafe fn tokens4_into(
    kernels: Kernels,
    w_rows: &[u8],
    row_bytes: usize,
    x_rows: &[u8],
    x_row_bytes: usize,
    t0: usize,
    to: &RowsOut,
) -> usize {
    let Some(four) = kernels.four else {
        return 0;
    };
    let n = x_rows.len() / x_row_bytes;
    let grouped = match n % 4 >= kernels.pad_four_from {
        true => n,
        false => n / 4 * 4,
    };
    let token = |t: usize| &x_rows[t.min(n - 1) * x_row_bytes..][..x_row_bytes];
    for g in (0..grouped).step_by(4) {
        let xs = [token(g), token(g + 1), token(g + 2), token(g + 3)];
        let real = (grouped - g).min(4);
        for (r, w_row) in to.rows.clone().zip(w_rows.chunks_exact(row_bytes)) {
            let ys = four(w_row, xs);
            for (k, &y) in ys[..real].iter().enumerate() {
                // SAFETY: token `t0 + g + k` of the call, `r ∈ rows`.
                unsafe { to.put(t0 + g + k, r, y) };
            }
        }
    }
    grouped
}

/// One token's outputs for every row: four weight rows at a time through the four-row
/// kernel when there is one, the rest one at a time.
///
/// # Safety
/// As [`rows_into`]: `w_rows` the bytes of `to.rows`, `x_row` quantized token `t`.
unsafe fn token_into(
    kernels: Kernels,
    w_rows: &[u8],
    row_bytes: usize,
    x_row: &[u8],
    t: usize,
    to: &RowsOut,
) {
    let mut r = to.rows.start;
    let mut w_left = w_rows;
    if let Some(rows4) = kernels.rows4 {
        while to.rows.end - r >= 4 {
            let (w4, rest) = w_left.split_at(4 * row_bytes);
            let (w01, w23) = w4.split_at(2 * row_bytes);
            let (w0, w1) = w01.split_at(row_bytes);
            let (w2, w3) = w23.split_at(row_bytes);
            for (i, y) in rows4([w0, w1, w2, w3], x_row).into_iter().enumerate() {
                // SAFETY: token `t` of the call, `r + i ∈ rows`.
                unsafe { to.put(t, r + i, y) };
            }
            w_left = rest;
            r += 4;
        }
    }
    for (r, w_row) in (r..to.rows.end).zip(w_left.chunks_exact(row_bytes)) {
        // SAFETY: token `t` of the call, `r ∈ rows`.
        unsafe { to.put(t, r, (kernels.single)(w_row, x_row)) };
    }
}

/// The fewest tokens left after the groups of four that go through the four-token
/// kernel as a padded group rather than one by one.
const PAD_TO_FOUR_FROM: usize = 2;

/// The output pointer of a threaded matmul, shared by the pool's threads.
struct OutPtr(*mut f32);

impl OutPtr {
    /// A method (not the field) so closures capture the `Sync` wrapper.
    fn get(&self) -> *mut f32 {
        self.0
    }
}

// SAFETY: threads write disjoint elements through it; see `matmul_quantized_pool`.
unsafe impl Sync for OutPtr {}

/// The matmul entry points of a weight (here, beside what they call, so that `lazy.rs`
/// does not depend on this module).
impl LazyWeight<'_> {
    /// Dot product of row `i` with activation row `t` of `xq`.
    pub fn dot(&self, i: usize, xq: &QuantizedActs, t: usize) -> Result<f32, LazyWeightError> {
        xq.check_for(self)?;
        let row = self.get_row(i).ok_or(LazyWeightError::RowOutOfRange {
            row: i,
            n_rows: self.n_rows(),
        })?;
        let x = xq.get_row(t).ok_or(LazyWeightError::RowOutOfRange {
            row: t,
            n_rows: xq.n_rows(),
        })?;
        Ok(crate::dispatch::active_dot_kernel(self.ggml_type())?(
            row, x,
        ))
    }

    /// `y[t][r] = Σ_k W[r][k]·x[t][k]` for `n` activation rows `x` (`[n, K]`) into
    /// `y` (`[n, N]`); see [`mod@crate::matmul`].
    pub fn matmul(
        &self,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        scratch: &mut QuantizedActs,
    ) -> Result<(), LazyWeightError> {
        matmul(self, x, n, y, scratch)
    }
}

/// Checks that `act_type` is an activation type and `x_len` is `n` rows of `row_len`;
/// returns the bytes of one quantized row and of all `n`.
fn checked_act_sizes(
    act_type: GgmlType,
    x_len: usize,
    n: usize,
    row_len: usize,
) -> Result<(usize, usize), LazyWeightError> {
    if !matches!(
        act_type,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q8_0
            | GgmlType::Q8_1
            | GgmlType::Q8_K
    ) {
        return Err(LazyWeightError::UnsupportedType {
            ggml_type: act_type,
            op: "quantize activations",
        });
    }
    let expected = n
        .checked_mul(row_len)
        .ok_or(LazyWeightError::LengthMismatch {
            what: "activations: n·K overflows",
            expected: usize::MAX,
            actual: x_len,
        })?;
    if x_len != expected {
        return Err(LazyWeightError::LengthMismatch {
            what: "activations [n, K]",
            expected,
            actual: x_len,
        });
    }
    let rb = row_bytes(act_type, row_len)?;
    let total = rb.checked_mul(n).ok_or(LazyWeightError::LengthMismatch {
        what: "quantized activations: size overflows",
        expected: usize::MAX,
        actual: 0,
    })?;
    Ok((rb, total))
}

/// Quantizes the rows of `x` (each `row_len` long) into `data` (each `rb` bytes), split
/// over `pool` when it has threads to spare and there are enough rows.
fn quantize_act_rows(
    act_type: GgmlType,
    x: &[f32],
    row_len: usize,
    data: &mut [u8],
    rb: usize,
    pool: Option<&ThreadPool>,
) -> Result<(), LazyWeightError> {
    let quantize_rows = |xs: &[f32], qs: &mut [u8]| -> Result<(), LazyWeightError> {
        for (xr, qr) in xs.chunks_exact(row_len).zip(qs.chunks_exact_mut(rb)) {
            if act_type == GgmlType::Q8_0 {
                crate::quant::quantize_q8_0_acts(xr, qr);
            } else {
                quantize_row(act_type, xr, qr)?;
            }
        }
        Ok(())
    };
    let n = data.len() / rb;
    match pool {
        Some(pool) if pool.n_threads() > 1 && n >= MIN_PARALLEL_QUANTIZE_ROWS => {
            // The type and sizes were checked before, so a row cannot fail.
            let failed = std::sync::atomic::AtomicBool::new(false);
            let chunk = n.div_ceil(pool.n_threads() * 4);
            pool.parallel_chunks_mut(
                data,
                rb,
                chunk,
                &mut vec![(); pool.n_threads()],
                |_, rows, qs| {
                    let xs = &x[rows.start * row_len..rows.end * row_len];
                    if quantize_rows(xs, qs).is_err() {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                },
            );
            if failed.into_inner() {
                // Redo serially for the error value.
                quantize_rows(x, data)?;
            }
            Ok(())
        }
        _ => quantize_rows(x, data),
    }
}

#[cfg(test)]
mod thread_split_tests {
    use super::*;

    #[test]
    fn chunking_splits_real_matmuls_and_skips_tiny_ones() {
        // One thread, or too little work: not split.
        assert_eq!(batch_chunk_rows(768, 2, 16), 768, "one chunk per expert");
        assert_eq!(batch_chunk_rows(768, 2, 8), 384);
        assert_eq!(batch_chunk_rows(4096, 2, 1), 256);
        assert_eq!(batch_chunk_rows(5, 4, 1), 16, "a whole grain");
        assert_eq!(rows_per_chunk(2048, 680, 1), None);
        assert_eq!(rows_per_chunk(16, 100_000, 4), None);
        assert_eq!(rows_per_chunk(64, 64, 4), None);
        // The sizes thread_invariance.rs uses (N = 260, K = 256) are split for every
        // type at one token (Q4_0/Q4_K rows are the smallest, 144 bytes).
        let c = rows_per_chunk(260, 144, 2).expect("split");
        assert!(c.is_multiple_of(ROW_GRAIN) && c < 260, "{c}");
        // Decode through an LM head (262144 rows of 680 bytes): chunks capped in work.
        let c = rows_per_chunk(262_144, 680, 2).expect("split");
        assert!(c * 680 <= MAX_CHUNK_WORK + ROW_GRAIN * 680, "{c}");
        assert!(262_144 / c >= 16);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod layout_tests {
    use super::*;

    #[test]
    fn amx_and_vnni_tiles_of_one_activation_get_a_layout_each() {
        if !(crate::tiled::available() && crate::amx::available()) {
            return;
        }
        let mut plan = KernelPlan::default_rules(CpuTier::Avx512Vnni);
        let amx = FormatPlan {
            prefill: PrefillKernel::Amx,
            ..plan.get(GgmlType::Q4_K)
        };
        let tiles = FormatPlan {
            prefill: PrefillKernel::Tiles,
            ..plan.get(GgmlType::IQ2_XXS)
        };
        plan.set(GgmlType::Q4_K, amx).unwrap();
        plan.set(GgmlType::IQ2_XXS, tiles).unwrap();
        let (n, k) = (32, 256);
        let x: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut xq = QuantizedActs::new();
        xq.quantize_with_plan(&plan, GgmlType::Q8_K, &x, n, k, None)
            .unwrap();
        for raw_k in [true, false] {
            let wide = xq.wide_tiles(raw_k).expect("a layout");
            assert_eq!((wide.raw_k(), wide.n_tokens()), (raw_k, n));
        }
        // Only AMX named among the chosen formats (the defaults of formats no model has,
        // Q5_K's VNNI tiles among them, do not count): no second copy up front; a VNNI
        // kernel gets one on first need.
        let per_token = FormatPlan {
            prefill: PrefillKernel::PerToken,
            ..tiles
        };
        plan.set(GgmlType::IQ2_XXS, per_token).unwrap();
        assert_eq!(plan.get(GgmlType::Q5_K).prefill, PrefillKernel::Tiles);
        xq.quantize_with_plan(&plan, GgmlType::Q8_K, &x, n, k, None)
            .unwrap();
        assert!(xq.tiles_other.get().is_none());
        let vnni = xq.wide_tiles(false).expect("built on need");
        assert_eq!((vnni.raw_k(), vnni.n_tokens()), (false, n));
        assert!(xq.wide_tiles(true).is_some_and(|t| t.raw_k()));
    }
}
