//! The block forward pass for one chunk of tokens.

use std::sync::atomic::{AtomicBool, Ordering};

use half::f16;
use nx_f32::{attend, attend_group, CacheView, GeluTable, HeadRows, KvElem, KvPrecision, Scoring};
use nx_kv_cache::{KvCache, KvDtype, KvError, KvRows, KvSegments};
use nx_syscalls::ThreadPool;

use crate::layer::{
    sized, BlockError, FfnActivation, FfnWeights, LayerConfig, LayerWeights, Segment,
};
use crate::moe::{moe_ffn, MoeScratch};
use crate::rope_rows::RopeRows;
use crate::Projector;

/// Buffers reused across chunks and layers; they grow to the largest chunk seen and never
/// shrink, so decoding allocates nothing.
#[derive(Default)]
pub struct BlockScratch {
    normed: Vec<f32>, // [n, n_embd]
    q: Vec<f32>,      // [n, n_head · head_dim]
    k: Vec<f32>,      // [n, n_head_kv · head_dim]
    v: Vec<f32>,      // [n, n_head_kv · value_dim]
    attn: Vec<f32>,   // [n, n_head · value_dim]
    proj: Vec<f32>,   // [n, n_embd]
    gate: Vec<f32>,   // [n, n_ff]
    up: Vec<f32>,     // [n, n_ff]
    /// One attention scratch (probabilities and value lanes) per pool thread.
    probs: Vec<Vec<f32>>,
    /// Cache rows gathered for attention (see [`segment_views`]).
    gathered: GatheredRows,
    projector: Projector,
    moe: MoeScratch,
    rope: RopeRows,
}

/// Cache rows copied out of non-contiguous (paged) storage for one layer's attention:
/// widened to f32 where several queries of a segment share each row (a prefill chunk),
/// as stored where one query reads each row once (a decode step of an f16 cache).
#[derive(Debug, Default)]
struct GatheredRows {
    k32: Vec<f32>,
    v32: Vec<f32>,
    k16: Vec<f16>,
    v16: Vec<f16>,
}

/// The first `len` values of `rest`, which keeps the others.
fn take_front<'a, T>(rest: &mut &'a mut [T], len: usize) -> &'a mut [T] {
    let (head, tail) = std::mem::take(rest).split_at_mut(len);
    *rest = tail;
    head
}

fn check(layer: usize, what: &'static str, v: &[f32], expected: usize) -> Result<(), BlockError> {
    if v.len() != expected {
        return Err(BlockError::Shape {
            layer,
            what,
            expected,
            actual: v.len(),
        });
    }
    Ok(())
}

fn add_bias_rows(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in x.chunks_exact_mut(b.len()) {
            nx_f32::add_in_place(row, b);
        }
    }
}

/// Runs layer `layer` over the chunk `x` (`[n, n_embd]`, updated in place) whose tokens sit
/// at positions `pos..pos+n` of the one sequence in `cache`: [`forward_batch`] with one
/// segment.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    cfg: &LayerConfig,
    w: &LayerWeights<'_>,
    layer: usize,
    x: &mut [f32],
    n: usize,
    pos: usize,
    cache: &mut KvCache,
    s: &mut BlockScratch,
    pool: &ThreadPool,
) -> Result<(), BlockError> {
    forward_batch(cfg, w, layer, x, &[Segment { n, pos }], cache, s, pool)
}

/// Runs layer `layer` over a batch `x` (`[Σn, n_embd]`, updated in place): the rows of
/// segment 0, then those of segment 1, and so on. Every matmul takes all rows of the
/// batch at once (each weight is read once per step); RoPE, the K/V writes and attention
/// run per segment, each sequence over its own cache rows: token `i` of a segment at
/// `pos` attends to its rows `0..=pos+i` (only the last `window` of them in a local
/// layer).
///
/// Matmuls (split by weight rows), attention (split by token × head) and the FFN
/// activation run on `pool`; each output element is computed by one thread in a fixed
/// order that depends on neither the batch nor the thread count, so every row's result
/// is bit-identical to running its sequence alone.
#[allow(clippy::too_many_arguments)]
pub fn forward_batch(
    cfg: &LayerConfig,
    w: &LayerWeights<'_>,
    layer: usize,
    x: &mut [f32],
    segs: &[Segment],
    kv: &mut dyn KvSegments,
    s: &mut BlockScratch,
    pool: &ThreadPool,
) -> Result<(), BlockError> {
    let n: usize = segs.iter().map(|g| g.n).sum();
    let n_embd = cfg.n_embd;
    let q_dim = cfg.n_head * cfg.head_dim;
    let k_dim = cfg.n_head_kv * cfg.head_dim;
    let v_dim = cfg.n_head_kv * cfg.value_dim;
    let attn_dim = cfg.n_head * cfg.value_dim;
    check(layer, "activations", x, n * n_embd)?;
    if n == 0 {
        return Ok(());
    }

    // ---- attention ----
    let normed = sized(&mut s.normed, n * n_embd); // [n, n_embd]
    pre_norm(cfg, layer, "attn_norm", w.attn_norm, normed, x, pool)?;
    project_qkv(cfg, w, layer, n, s, pool)?;
    let q = &mut s.q[..n * q_dim]; // [n, q_dim]
    let k = &mut s.k[..n * k_dim]; // [n, k_dim]
    let v = &s.v[..n * v_dim]; // [n, v_dim]
    if cfg.use_rope {
        s.rope.apply(cfg, w.rope_freq_factors, q, k, segs, pool)?;
    }
    if cfg.q_scale != 1.0 {
        nx_f32::scale(q, cfg.q_scale);
    }
    write_cache_rows(cfg, layer, segs, k, v, kv)?;
    let attn = sized(&mut s.attn, n * attn_dim); // [n, n_head · value_dim]
    let views = segment_views(cfg, layer, segs, &*kv, &mut s.gathered, pool)?;
    let probs = attention_scratch(cfg, segs, &mut s.probs, pool);
    attend_batch(cfg, layer, &views, segs, q, attn, probs, pool)?;
    drop(views);
    let proj = sized(&mut s.proj, n * n_embd); // [n, n_embd]
    s.projector.project(&w.wo, attn, n, proj, pool)?;
    residual_add(
        cfg,
        layer,
        "post_attention_norm",
        w.post_attn_norm,
        x,
        proj,
        pool,
    )?;

    // ---- feed-forward ----
    let normed = sized(&mut s.normed, n * n_embd);
    pre_norm(cfg, layer, "ffn_norm", w.ffn_norm, normed, x, pool)?;
    match &w.ffn {
        FfnWeights::Dense { gate, up, down } => {
            let g = sized(&mut s.gate, n * cfg.n_ff); // [n, n_ff]
            let u = sized(&mut s.up, n * cfg.n_ff); // [n, n_ff]
            s.projector
                .project_all(normed, n, &mut [(gate, &mut *g), (up, &mut *u)], pool)?;
            gated_activation(cfg, g, u, pool); // hidden = act(gate)·up, over gate
            s.projector.project(down, g, n, proj, pool)?;
        }
        FfnWeights::Experts(m) => moe_ffn(m, layer, n_embd, normed, n, proj, &mut s.moe, pool)?,
    }
    residual_add(cfg, layer, "post_ffw_norm", w.post_ffn_norm, x, proj, pool)?;
    Ok(())
}

/// The sublayer input `normed` (`[n, n_embd]`): `x` through the layer's RMSNorm, or `x`
/// itself where the architecture has no pre-norm (OLMo 2).
fn pre_norm(
    cfg: &LayerConfig,
    layer: usize,
    what: &'static str,
    norm: Option<&[f32]>,
    normed: &mut [f32],
    x: &[f32],
    pool: &ThreadPool,
) -> Result<(), BlockError> {
    match norm {
        Some(weight) => {
            check(layer, what, weight, cfg.n_embd)?;
            rmsnorm_rows_pool(pool, normed, x, weight, cfg.n_embd, cfg.rms_eps);
        }
        None => normed.copy_from_slice(x),
    }
    Ok(())
}

/// `x += out`, after the sublayer output `out` goes through its post-norm (Gemma,
/// OLMo 2) and residual multiplier (Granite) where the layer has them.
fn residual_add(
    cfg: &LayerConfig,
    layer: usize,
    what: &'static str,
    post_norm: Option<&[f32]>,
    x: &mut [f32],
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), BlockError> {
    if let Some(weight) = post_norm {
        check(layer, what, weight, cfg.n_embd)?;
        rmsnorm_in_place_pool(pool, out, weight, cfg.n_embd, cfg.rms_eps);
    }
    if let Some(r) = cfg.residual_scale {
        nx_f32::scale(out, r);
    }
    nx_f32::add_in_place(x, out);
    Ok(())
}

/// Q, K and V of the normalised rows `s.normed` into `s.q`, `s.k`, `s.v` (`[n, dim]`
/// each): one quantization of the input for the three, then the biases and the per-head
/// Q/K norms where the layer has them.
fn project_qkv(
    cfg: &LayerConfig,
    w: &LayerWeights<'_>,
    layer: usize,
    n: usize,
    s: &mut BlockScratch,
    pool: &ThreadPool,
) -> Result<(), BlockError> {
    let q_dim = cfg.n_head * cfg.head_dim;
    let k_dim = cfg.n_head_kv * cfg.head_dim;
    let v_dim = cfg.n_head_kv * cfg.value_dim;
    let normed = &s.normed[..n * cfg.n_embd];
    let q = sized(&mut s.q, n * q_dim);
    let k = sized(&mut s.k, n * k_dim);
    let v = sized(&mut s.v, n * v_dim);
    let products = &mut [(&w.wq, &mut *q), (&w.wk, &mut *k), (&w.wv, &mut *v)];
    s.projector.project_all(normed, n, products, pool)?;
    add_bias_rows(q, w.bq);
    add_bias_rows(k, w.bk);
    add_bias_rows(v, w.bv);
    if let Some(qn) = w.q_norm {
        qk_norm(cfg, layer, "attn_q_norm", qn, q, q_dim, pool)?;
    }
    if let Some(kn) = w.k_norm {
        qk_norm(cfg, layer, "attn_k_norm", kn, k, k_dim, pool)?;
    }
    Ok(())
}

/// RMSNorm of Q or K rows (`[n, row_dim]`) in spans of the weight's length: one head
/// (`head_dim` weights) or the whole projection row (`row_dim` weights).
fn qk_norm(
    cfg: &LayerConfig,
    layer: usize,
    what: &'static str,
    weight: &[f32],
    rows: &mut [f32],
    row_dim: usize,
    pool: &ThreadPool,
) -> Result<(), BlockError> {
    if weight.len() != cfg.head_dim && weight.len() != row_dim {
        check(layer, what, weight, cfg.head_dim)?;
    }
    rmsnorm_in_place_pool(pool, rows, weight, weight.len(), cfg.rms_eps);
    Ok(())
}

/// Each sequence's new K/V rows (`[n, dim]`, batch order) into its own cache rows.
fn write_cache_rows(
    cfg: &LayerConfig,
    layer: usize,
    segs: &[Segment],
    k: &[f32],
    v: &[f32],
    kv: &mut dyn KvSegments,
) -> Result<(), BlockError> {
    let (k_dim, v_dim) = (cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.value_dim);
    let mut row = 0;
    for (i, g) in segs.iter().enumerate() {
        let (kr, vr) = (
            &k[row * k_dim..(row + g.n) * k_dim],
            &v[row * v_dim..(row + g.n) * v_dim],
        );
        kv.write_rows(i, layer, g.pos, kr, vr)?;
        row += g.n;
    }
    Ok(())
}

/// `gate = act(gate)·up` elementwise (`[n, n_ff]`), split by token rows over `pool`.
fn gated_activation(cfg: &LayerConfig, gate: &mut [f32], up: &[f32], pool: &ThreadPool) {
    let activation = cfg.ffn_activation;
    let mut no_state = vec![(); pool.n_threads()]; // zero-sized: allocates nothing
    pool.parallel_chunks_mut(gate, cfg.n_ff, 1, &mut no_state, |_, tokens, gate| {
        let up = &up[tokens.start * cfg.n_ff..tokens.end * cfg.n_ff];
        match activation {
            FfnActivation::Silu => {
                for (g, u) in gate
                    .chunks_exact_mut(cfg.n_ff)
                    .zip(up.chunks_exact(cfg.n_ff))
                {
                    nx_f32::swiglu_row_in_place(g, u);
                }
            }
            FfnActivation::GeluTanh => {
                GeluTable::shared().gelu_mul_in_place(gate, up);
            }
        }
    });
}

/// Fewer rows than this are normalised on the calling thread.
const MIN_PARALLEL_NORM_ROWS: usize = 64;

/// [`nx_f32::rmsnorm_rows`] with the rows spread over `pool` (each row is normalised on
/// its own, so the result does not depend on the split).
fn rmsnorm_rows_pool(
    pool: &ThreadPool,
    out: &mut [f32],
    x: &[f32],
    weight: &[f32],
    dim: usize,
    eps: f32,
) {
    let n_rows = out.len().checked_div(dim).unwrap_or(0);
    if pool.n_threads() < 2 || n_rows < MIN_PARALLEL_NORM_ROWS {
        return nx_f32::rmsnorm_rows(out, x, weight, dim, eps);
    }
    let chunk = n_rows.div_ceil(2 * pool.n_threads());
    let mut no_state = vec![(); pool.n_threads()]; // zero-sized: allocates nothing
    pool.parallel_chunks_mut(out, dim, chunk, &mut no_state, |_, rows, out| {
        nx_f32::rmsnorm_rows(out, &x[rows.start * dim..rows.end * dim], weight, dim, eps)
    });
}

/// [`nx_f32::rmsnorm_rows_in_place`] with the rows spread over `pool`.
fn rmsnorm_in_place_pool(pool: &ThreadPool, x: &mut [f32], weight: &[f32], dim: usize, eps: f32) {
    let n_rows = x.len().checked_div(dim).unwrap_or(0);
    if pool.n_threads() < 2 || n_rows < MIN_PARALLEL_NORM_ROWS {
        return nx_f32::rmsnorm_rows_in_place(x, weight, dim, eps);
    }
    let chunk = n_rows.div_ceil(2 * pool.n_threads());
    let mut no_state = vec![(); pool.n_threads()];
    pool.parallel_chunks_mut(x, dim, chunk, &mut no_state, |_, _, x| {
        nx_f32::rmsnorm_rows_in_place(x, weight, dim, eps)
    });
}

/// Below this much attention work (tokens × heads × rows × (head_dim + value_dim)) the
/// chunk's attention runs on the calling thread.
const MIN_PARALLEL_ATTENTION_WORK: usize = 1 << 15;

fn bad_view(layer: usize, what: &'static str) -> BlockError {
    BlockError::Shape {
        layer,
        what,
        expected: 0,
        actual: 0,
    }
}

/// One layer's K and V cache rows (`[rows, n_head_kv · dim]`) from cache row
/// `first_row` on, with the rounding of the cache type they came from.
struct CacheRows<'a, T> {
    keys: &'a [T],
    values: &'a [T],
    first_row: usize,
    precision: KvPrecision,
    /// In place in a block pool: `keys` and `values` are the layer's whole pools, these
    /// the segment's blocks, their size and the segment's rows (see
    /// [`nx_kv_cache::PagedRows`]).
    paged: Option<(&'a [u32], usize, usize)>,
}

impl<'a, T: KvElem> CacheRows<'a, T> {
    /// The rows of KV head `kv_head` and the cache rows the query at position `at` sees
    /// (`0..=at`, only the last `window` of them in a local layer); `None` when the
    /// head's view does not fit the rows.
    fn view(
        &self,
        cfg: &LayerConfig,
        kv_head: usize,
        at: usize,
    ) -> Option<(CacheView<'a, T>, std::ops::Range<usize>)> {
        let end = at + 1;
        let start = match cfg.window {
            Some(wnd) => end.saturating_sub(wnd),
            None => 0,
        };
        let (keys, values) = match self.paged {
            None => (
                HeadRows::head(self.keys, cfg.n_head_kv, cfg.head_dim, kv_head)?,
                HeadRows::head(self.values, cfg.n_head_kv, cfg.value_dim, kv_head)?,
            ),
            Some((blocks, block_size, n_rows)) => (
                HeadRows::head_paged(
                    self.keys,
                    blocks,
                    block_size,
                    n_rows,
                    (cfg.n_head_kv, cfg.head_dim, kv_head),
                )?,
                HeadRows::head_paged(
                    self.values,
                    blocks,
                    block_size,
                    n_rows,
                    (cfg.n_head_kv, cfg.value_dim, kv_head),
                )?,
            ),
        };
        let view = CacheView {
            keys,
            values,
            first_row: self.first_row,
            precision: self.precision,
        };
        Some((view, start..end))
    }
}

/// One segment's cache rows for attention: f16 rows (a decode step over an f16 cache,
/// borrowed or gathered from its blocks), or f32 rows (an f32 cache, or rows gathered
/// and widened once for a prefill chunk, keeping the f16 rounding).
enum SegmentRows<'a> {
    F16(CacheRows<'a, f16>),
    F32(CacheRows<'a, f32>),
}

/// Where one segment's rows come from in [`segment_views`].
#[derive(Clone, Copy, PartialEq)]
enum RowSource {
    /// Borrowed from contiguous storage.
    Direct,
    /// Read in place from a block pool.
    Paged,
    /// Copied as stored (f16), from this first row.
    Stored(usize),
    /// Copied and widened to f32, from this first row.
    Widened(usize),
}

/// The cache rows each segment's queries read in `layer`: borrowed in place (contiguous
/// storage, or a block pool read through the segment's block table) where no widening
/// pays, otherwise gathered into `gathered` from the first row any of the segment's
/// queries sees and widened to f32 once (several queries of an f16 cache share them).
fn segment_views<'a>(
    cfg: &LayerConfig,
    layer: usize,
    segs: &[Segment],
    kv: &'a dyn KvSegments,
    gathered: &'a mut GatheredRows,
    pool: &ThreadPool,
) -> Result<Vec<SegmentRows<'a>>, BlockError> {
    let precision = if kv.dtype() == KvDtype::F16 {
        KvPrecision::F16
    } else {
        KvPrecision::F32
    };
    let sources = row_sources(cfg, layer, segs, kv);
    let mut copies = gathered.destinations(cfg, segs, &sources);
    // The copies are independent (a batched decode step copies every sequence's rows
    // on every layer): spread over the pool.
    let mut no_state = vec![(); pool.n_threads()];
    pool.parallel_chunks_mut(&mut copies, 1, 1, &mut no_state, |_, _, part| {
        for c in part {
            c.result = match &mut c.dst {
                CopyDst::F16(kh, vh) => kv.gather_f16(c.seg, layer, c.rows.clone(), kh, vh),
                CopyDst::F32(kh, vh) => kv.gather_f32(c.seg, layer, c.rows.clone(), kh, vh),
            };
        }
    });
    let mut copied = copies.into_iter();
    let mut views = Vec::with_capacity(segs.len());
    for (i, (g, &src)) in segs.iter().zip(&sources).enumerate() {
        let view = match src {
            RowSource::Direct => direct_view(kv, i, layer, g.pos + g.n)?,
            RowSource::Paged => paged_view(kv, i, layer, g.pos + g.n)?,
            RowSource::Stored(_) | RowSource::Widened(_) => {
                let c = copied.next().expect("one copy per copied segment");
                c.result?;
                let first_row = c.rows.start;
                match c.dst {
                    CopyDst::F16(keys, values) => SegmentRows::F16(CacheRows {
                        keys,
                        values,
                        first_row,
                        precision,
                        paged: None,
                    }),
                    CopyDst::F32(keys, values) => SegmentRows::F32(CacheRows {
                        keys,
                        values,
                        first_row,
                        precision,
                        paged: None,
                    }),
                }
            }
        };
        views.push(view);
    }
    Ok(views)
}

/// Where each segment's queries read their cache rows from in `layer` (see
/// [`segment_views`]).
fn row_sources(
    cfg: &LayerConfig,
    layer: usize,
    segs: &[Segment],
    kv: &dyn KvSegments,
) -> Vec<RowSource> {
    let f16_storage = kv.dtype() == KvDtype::F16;
    segs.iter()
        .enumerate()
        .map(|(i, g)| {
            let end = g.pos + g.n;
            let one_query = g.n == 1;
            // Rows read as stored: borrowed in place, contiguous or paged.
            if !f16_storage || one_query {
                if kv.contiguous(i, layer, end).is_some() {
                    return RowSource::Direct;
                }
                if kv.paged(i, layer, end).is_some() {
                    return RowSource::Paged;
                }
            }
            let first = match cfg.window {
                Some(wnd) => (g.pos + 1).saturating_sub(wnd),
                None => 0,
            };
            if f16_storage && one_query {
                RowSource::Stored(first)
            } else {
                RowSource::Widened(first)
            }
        })
        .collect()
}

impl GatheredRows {
    /// One copy per segment that `sources` says is copied, its destination cut from these
    /// buffers (grown to fit) in segment order.
    fn destinations(
        &mut self,
        cfg: &LayerConfig,
        segs: &[Segment],
        sources: &[RowSource],
    ) -> Vec<RowCopy<'_>> {
        let (k_dim, v_dim) = (cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.value_dim);
        let rows_of = |want: fn(RowSource) -> Option<usize>| -> usize {
            segs.iter()
                .zip(sources)
                .filter_map(|(g, &src)| want(src).map(|first| g.pos + g.n - first))
                .sum()
        };
        let stored = |s: RowSource| match s {
            RowSource::Stored(f) => Some(f),
            _ => None,
        };
        let widened = |s: RowSource| match s {
            RowSource::Widened(f) => Some(f),
            _ => None,
        };
        let (n_stored, n_widened) = (rows_of(stored), rows_of(widened));
        let mut k32 = sized(&mut self.k32, n_widened * k_dim);
        let mut v32 = sized(&mut self.v32, n_widened * v_dim);
        let mut k16 = sized(&mut self.k16, n_stored * k_dim);
        let mut v16 = sized(&mut self.v16, n_stored * v_dim);
        let mut copies = Vec::new();
        for (seg, (g, &src)) in segs.iter().zip(sources).enumerate() {
            let end = g.pos + g.n;
            let (first, dst) = match src {
                RowSource::Direct | RowSource::Paged => continue,
                RowSource::Stored(first) => (
                    first,
                    CopyDst::F16(
                        take_front(&mut k16, (end - first) * k_dim),
                        take_front(&mut v16, (end - first) * v_dim),
                    ),
                ),
                RowSource::Widened(first) => (
                    first,
                    CopyDst::F32(
                        take_front(&mut k32, (end - first) * k_dim),
                        take_front(&mut v32, (end - first) * v_dim),
                    ),
                ),
            };
            copies.push(RowCopy {
                seg,
                rows: first..end,
                dst,
                result: Ok(()),
            });
        }
        copies
    }
}

/// One segment's rows copied out of the cache by [`segment_views`].
struct RowCopy<'a> {
    seg: usize,
    rows: std::ops::Range<usize>,
    dst: CopyDst<'a>,
    result: Result<(), KvError>,
}

/// Where a [`RowCopy`] goes: K and V as stored (f16) or widened.
enum CopyDst<'a> {
    F16(&'a mut [f16], &'a mut [f16]),
    F32(&'a mut [f32], &'a mut [f32]),
}

/// Segment `seg`'s rows `0..end` of `layer`, borrowed from contiguous storage.
fn direct_view<'a>(
    kv: &'a dyn KvSegments,
    seg: usize,
    layer: usize,
    end: usize,
) -> Result<SegmentRows<'a>, BlockError> {
    let (keys, values) = kv
        .contiguous(seg, layer, end)
        .ok_or_else(|| bad_view(layer, "contiguous cache rows"))?;
    borrowed_rows(keys, values, None, layer)
}

/// Segment `seg`'s rows `0..end` of `layer`, read in place from a block pool.
fn paged_view<'a>(
    kv: &'a dyn KvSegments,
    seg: usize,
    layer: usize,
    end: usize,
) -> Result<SegmentRows<'a>, BlockError> {
    let rows = kv
        .paged(seg, layer, end)
        .ok_or_else(|| bad_view(layer, "paged cache rows"))?;
    let paged = Some((rows.blocks, rows.block_size, end));
    borrowed_rows(rows.keys, rows.values, paged, layer)
}

/// Borrowed K and V storage as one segment's rows, read as stored (from cache row 0).
fn borrowed_rows<'a>(
    keys: KvRows<'a>,
    values: KvRows<'a>,
    paged: Option<(&'a [u32], usize, usize)>,
    layer: usize,
) -> Result<SegmentRows<'a>, BlockError> {
    match (keys, values) {
        (KvRows::F16 { data: kd, .. }, KvRows::F16 { data: vd, .. }) => {
            Ok(SegmentRows::F16(CacheRows {
                keys: kd,
                values: vd,
                first_row: 0,
                precision: KvPrecision::F16,
                paged,
            }))
        }
        (KvRows::F32 { data: kd, .. }, KvRows::F32 { data: vd, .. }) => {
            Ok(SegmentRows::F32(CacheRows {
                keys: kd,
                values: vd,
                first_row: 0,
                precision: KvPrecision::F32,
                paged,
            }))
        }
        _ => Err(bad_view(layer, "mixed K/V storage types")),
    }
}

/// One attention scratch (probabilities and value lanes) per thread that will run, sized
/// for the longest segment; a single one when the work is too small to split.
fn attention_scratch<'a>(
    cfg: &LayerConfig,
    segs: &[Segment],
    probs: &'a mut Vec<Vec<f32>>,
    pool: &ThreadPool,
) -> &'a mut [Vec<f32>] {
    let work: usize = segs
        .iter()
        .map(|g| g.n * cfg.n_head * (g.pos + g.n) * (cfg.head_dim + cfg.value_dim))
        .sum();
    let n_slots = if work < MIN_PARALLEL_ATTENTION_WORK {
        1
    } else {
        pool.n_threads()
    };
    if probs.len() < n_slots {
        probs.resize_with(n_slots, Vec::new);
    }
    let group = cfg.n_head / cfg.n_head_kv.max(1);
    let max_rows = segs.iter().map(|g| g.pos + g.n).max().unwrap_or(0);
    for p in &mut probs[..n_slots] {
        sized(
            p,
            nx_f32::attend_group_scratch_len(group, max_rows, cfg.value_dim),
        );
    }
    &mut probs[..n_slots]
}

/// Attention of every (token, query head) pair of the batch, each against its own
/// segment's rows `views[seg]`, written to `attn` (`[n, n_head · value_dim]`). The pairs
/// are spread over `pool`, one scratch per thread (at most `probs.len()` threads); each
/// pair is computed whole by one thread, so the result does not depend on the split.
#[allow(clippy::too_many_arguments)]
fn attend_batch(
    cfg: &LayerConfig,
    layer: usize,
    views: &[SegmentRows<'_>],
    segs: &[Segment],
    q: &[f32],
    attn: &mut [f32],
    probs: &mut [Vec<f32>],
    pool: &ThreadPool,
) -> Result<(), BlockError> {
    if cfg.value_dim == 0 || attn.is_empty() {
        return Ok(());
    }
    let q_dim = cfg.n_head * cfg.head_dim;
    let group = cfg.n_head / cfg.n_head_kv;
    // Row of the batch → (segment, position).
    let mut row_at: Vec<(usize, usize)> =
        Vec::with_capacity(attn.len() / (cfg.n_head * cfg.value_dim));
    for (i, g) in segs.iter().enumerate() {
        row_at.extend((g.pos..g.pos + g.n).map(|p| (i, p)));
    }
    let missing_view = AtomicBool::new(false);
    // Several rows: one item per (row, KV head), its query heads scored together so each
    // key row is read once for the group. One row (a lone decode step) splits its groups
    // only as far as it takes to give every thread an item.
    let heads_per_item = if row_at.len() > 1 {
        group
    } else {
        heads_per_decode_item(group, cfg.n_head_kv, probs.len())
    };
    let grouped = heads_per_item > 1;
    let items_per_row = cfg.n_head / heads_per_item;
    let out_len = heads_per_item * cfg.value_dim;
    let n_items = attn.len() / out_len;
    // Small claims, the latest tokens first: under the causal mask later tokens see more
    // rows, so the costliest items start first and the cheap ones fill the gaps.
    let chunk = n_items.div_ceil(probs.len() * 8).max(1);
    pool.parallel_chunks_mut_from_end(attn, out_len, chunk, probs, |probs, items, out| {
        for (i, out) in items.zip(out.chunks_exact_mut(out_len)) {
            let (r, j) = (i / items_per_row, i % items_per_row);
            let (seg, at) = row_at[r];
            let first_head = j * heads_per_item;
            let qs = &q[r * q_dim + first_head * cfg.head_dim..][..heads_per_item * cfg.head_dim];
            let kv_head = first_head / group;
            let ok = match &views[seg] {
                SegmentRows::F16(rows) => {
                    attend_item(cfg, rows, kv_head, at, qs, out, probs, grouped)
                }
                SegmentRows::F32(rows) => {
                    attend_item(cfg, rows, kv_head, at, qs, out, probs, grouped)
                }
            };
            if !ok {
                missing_view.store(true, Ordering::Relaxed);
                return;
            }
        }
    });
    if missing_view.load(Ordering::Relaxed) {
        return Err(bad_view(layer, "key/value cache view"));
    }
    Ok(())
}

/// Query heads per item of a lone decode row's attention: the largest divisor of `group`
/// that still leaves `n_threads` items (`n_head_kv · group / heads`), so every thread
/// works and each reads its KV head's rows once for as many heads as it can. Gemma 3
/// 270M (4 query heads on 1 KV head) on 2 threads: 2 items of 2 heads.
fn heads_per_decode_item(group: usize, n_head_kv: usize, n_threads: usize) -> usize {
    (1..=group)
        .rev()
        .filter(|&heads| group.is_multiple_of(heads))
        .find(|&heads| n_head_kv * (group / heads) >= n_threads)
        .unwrap_or(1)
}

/// One item of [`attend_batch`]: the query heads `qs` (a KV group, or one head) of the
/// token at position `at`; `false` when the rows do not fit the view.
#[allow(clippy::too_many_arguments)]
fn attend_item<T: KvElem>(
    cfg: &LayerConfig,
    rows: &CacheRows<'_, T>,
    kv_head: usize,
    at: usize,
    qs: &[f32],
    out: &mut [f32],
    scratch: &mut [f32],
    grouped: bool,
) -> bool {
    let Some((view, seen)) = rows.view(cfg, kv_head, at) else {
        return false;
    };
    let scoring = Scoring {
        scale: cfg.kq_scale,
        softcap: cfg.attn_softcap,
    };
    if grouped {
        attend_group(qs, view, seen, scoring, out, scratch);
    } else {
        attend(qs, view, seen, scoring, out, scratch);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::heads_per_decode_item;

    #[test]
    fn decode_items_split_groups_only_as_far_as_the_threads_need() {
        // Gemma 3 270M: 4 query heads on 1 KV head.
        assert_eq!(heads_per_decode_item(4, 1, 1), 4);
        assert_eq!(heads_per_decode_item(4, 1, 2), 2);
        assert_eq!(heads_per_decode_item(4, 1, 3), 1);
        assert_eq!(heads_per_decode_item(4, 1, 8), 1);
        // Qwen2.5 0.5B: 14 query heads on 2 KV heads; a group of 7 has divisors 7 and 1.
        assert_eq!(heads_per_decode_item(7, 2, 2), 7);
        assert_eq!(heads_per_decode_item(7, 2, 3), 1);
        // Multi-head attention (a group of one) and a degenerate thread count.
        assert_eq!(heads_per_decode_item(1, 8, 2), 1);
        assert_eq!(heads_per_decode_item(6, 2, 0), 6);
    }
}
