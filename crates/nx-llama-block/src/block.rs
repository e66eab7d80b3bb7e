//! The block forward pass for one chunk of tokens.

use std::sync::atomic::{AtomicBool, Ordering};

use nx_f32::{
    attend, attend_group, CacheView, GeluTable, HeadRows, KvElem, KvPrecision, RopeStyle, RopeTable,
};
use nx_kv_cache::{KvCache, KvError, KvRows};
use nx_lazy_weight::{LazyWeight, LazyWeightError};
use nx_syscalls::ThreadPool;

use crate::Projector;

/// The gated FFN's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// `down(silu(gate)·up)` (llama, qwen).
    Silu,
    /// `down(gelu_tanh(gate)·up)` (gemma).
    GeluTanh,
}

/// What one layer computes, independent of where its weights come from.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerConfig {
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub value_dim: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    /// Look-back of a local layer, the query's own row included.
    pub window: Option<usize>,
    /// Multiplier applied to Q after RoPE (Gemma scales Q instead of the scores).
    pub q_scale: f32,
    /// Multiplier applied to the scores `q·k`.
    pub kq_scale: f32,
    pub ffn_activation: FfnActivation,
}

/// The tensors of one layer. Norms and biases arrive as f32 vectors; matrices stay
/// quantized views into the mapping.
pub struct LayerWeights<'a> {
    pub attn_norm: &'a [f32],
    pub wq: LazyWeight<'a>,
    pub wk: LazyWeight<'a>,
    pub wv: LazyWeight<'a>,
    pub bq: Option<&'a [f32]>,
    pub bk: Option<&'a [f32]>,
    pub bv: Option<&'a [f32]>,
    /// Per-head RMSNorm weights of Q and K (`head_dim` each).
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    pub wo: LazyWeight<'a>,
    /// Gemma's norm of the attention output before the residual add.
    pub post_attn_norm: Option<&'a [f32]>,
    pub ffn_norm: &'a [f32],
    pub w_gate: LazyWeight<'a>,
    pub w_up: LazyWeight<'a>,
    pub w_down: LazyWeight<'a>,
    /// Gemma's norm of the FFN output before the residual add.
    pub post_ffn_norm: Option<&'a [f32]>,
    /// Llama 3.1 `rope_freqs.weight`.
    pub rope_freq_factors: Option<&'a [f32]>,
}

/// Why a block could not run.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error(transparent)]
    Weight(#[from] LazyWeightError),
    #[error(transparent)]
    Cache(#[from] KvError),
    #[error("layer {layer}: {what} has {actual} values, expected {expected}")]
    Shape {
        layer: usize,
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("bad RoPE setup: {0}")]
    Rope(String),
}

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
    /// A prefill chunk's f16 K and V cache rows widened to f32.
    widened_k: Vec<f32>,
    widened_v: Vec<f32>,
    projector: Projector,
    rope: Option<(usize, u32, RopeTable)>, // (rope_dim, base bits, table)
}

fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
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
/// at positions `pos..pos+n`. Writes the chunk's K/V rows into `cache` (rows
/// `pos..pos+n` of this layer), then token `i` attends to rows `0..=pos+i` (only the last
/// `window` of them in a local layer).
///
/// Matmuls (split by weight rows), attention (split by token × head) and the FFN
/// activation run on `pool`; each output element is computed by one thread in a fixed
/// order, so the result is bit-identical for any thread count.
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
    let n_embd = cfg.n_embd;
    let q_dim = cfg.n_head * cfg.head_dim;
    let k_dim = cfg.n_head_kv * cfg.head_dim;
    let v_dim = cfg.n_head_kv * cfg.value_dim;
    let attn_dim = cfg.n_head * cfg.value_dim;
    check(layer, "activations", x, n * n_embd)?;
    check(layer, "attn_norm", w.attn_norm, n_embd)?;
    check(layer, "ffn_norm", w.ffn_norm, n_embd)?;
    if n == 0 {
        return Ok(());
    }

    // ---- attention ----
    let normed = sized(&mut s.normed, n * n_embd); // [n, n_embd]
    rmsnorm_rows_pool(pool, normed, x, w.attn_norm, n_embd, cfg.rms_eps);
    s.projector.reset();
    let q = sized(&mut s.q, n * q_dim); // [n, q_dim]
    s.projector.project(&w.wq, normed, n, q, pool)?;
    let k = sized(&mut s.k, n * k_dim); // [n, k_dim]
    s.projector.project(&w.wk, normed, n, k, pool)?;
    let v = sized(&mut s.v, n * v_dim); // [n, v_dim]
    s.projector.project(&w.wv, normed, n, v, pool)?;
    add_bias_rows(q, w.bq);
    add_bias_rows(k, w.bk);
    add_bias_rows(v, w.bv);
    if let Some(qn) = w.q_norm {
        check(layer, "attn_q_norm", qn, cfg.head_dim)?;
        rmsnorm_in_place_pool(pool, q, qn, cfg.head_dim, cfg.rms_eps);
    }
    if let Some(kn) = w.k_norm {
        check(layer, "attn_k_norm", kn, cfg.head_dim)?;
        rmsnorm_in_place_pool(pool, k, kn, cfg.head_dim, cfg.rms_eps);
    }

    // RoPE: one table per position, shared by every Q and K head of the token.
    let base_bits = cfg.rope_base.to_bits();
    let rebuild = !matches!(&s.rope, Some((d, b, _)) if *d == cfg.rope_dim && *b == base_bits)
        || w.rope_freq_factors.is_some();
    if rebuild {
        let table = RopeTable::new(cfg.rope_dim, cfg.rope_base, w.rope_freq_factors)
            .map_err(|e| BlockError::Rope(e.to_string()))?;
        s.rope = Some((cfg.rope_dim, base_bits, table));
    }
    let rope = &mut s.rope.as_mut().expect("set above").2;
    for t in 0..n {
        rope.set_position(pos + t);
        rope.apply_heads(
            &mut q[t * q_dim..(t + 1) * q_dim],
            cfg.head_dim,
            cfg.rope_style,
        );
        rope.apply_heads(
            &mut k[t * k_dim..(t + 1) * k_dim],
            cfg.head_dim,
            cfg.rope_style,
        );
    }
    if cfg.q_scale != 1.0 {
        nx_f32::scale(q, cfg.q_scale);
    }

    cache.write_rows(layer, pos, k, v)?;
    let (keys, values) = cache.layer_rows(layer, pos + n)?;
    let attn = sized(&mut s.attn, n * attn_dim); // [n, n_head · value_dim]

    // One probability row per thread; a single one when the work is too small to split.
    let work = n * cfg.n_head * (pos + n) * (cfg.head_dim + cfg.value_dim);
    let n_slots = if work < MIN_PARALLEL_ATTENTION_WORK {
        1
    } else {
        pool.n_threads()
    };
    if s.probs.len() < n_slots {
        s.probs.resize_with(n_slots, Vec::new);
    }
    let group = cfg.n_head / cfg.n_head_kv.max(1);
    for p in &mut s.probs[..n_slots] {
        sized(
            p,
            nx_f32::attend_group_scratch_len(group, pos + n, cfg.value_dim),
        );
    }
    let probs = &mut s.probs[..n_slots];
    // The first cache row any query of the chunk reads.
    let first_row = match cfg.window {
        Some(wnd) => (pos + 1).saturating_sub(wnd),
        None => 0,
    };
    match (keys, values) {
        (KvRows::F16 { data: kd, .. }, KvRows::F16 { data: vd, .. }) if n > 1 => {
            // A prefill chunk reads every row many times: widen the rows it needs to f32
            // once (exact), and keep the f16 rounding of query and probabilities.
            let kd = &kd[first_row * k_dim..];
            let vd = &vd[first_row * v_dim..];
            let wk = sized(&mut s.widened_k, kd.len()); // [rows, k_dim]
            nx_f32::f16_to_f32_row(kd, wk);
            let wv = sized(&mut s.widened_v, vd.len()); // [rows, v_dim]
            nx_f32::f16_to_f32_row(vd, wv);
            let rows = CacheRows {
                keys: wk,
                values: wv,
                first_row,
                precision: KvPrecision::F16,
            };
            attend_chunk(cfg, layer, rows, q, pos, attn, probs, pool)?
        }
        (KvRows::F16 { data: kd, .. }, KvRows::F16 { data: vd, .. }) => {
            let rows = CacheRows {
                keys: kd,
                values: vd,
                first_row: 0,
                precision: KvPrecision::F16,
            };
            attend_chunk(cfg, layer, rows, q, pos, attn, probs, pool)?
        }
        (KvRows::F32 { data: kd, .. }, KvRows::F32 { data: vd, .. }) => {
            let rows = CacheRows {
                keys: kd,
                values: vd,
                first_row: 0,
                precision: KvPrecision::F32,
            };
            attend_chunk(cfg, layer, rows, q, pos, attn, probs, pool)?
        }
        _ => return Err(bad_view(layer, "mixed K/V storage types")),
    }

    let proj = sized(&mut s.proj, n * n_embd); // [n, n_embd]
    s.projector.reset();
    s.projector.project(&w.wo, attn, n, proj, pool)?;
    if let Some(pn) = w.post_attn_norm {
        check(layer, "post_attention_norm", pn, n_embd)?;
        rmsnorm_in_place_pool(pool, proj, pn, n_embd, cfg.rms_eps);
    }
    nx_f32::add_in_place(x, proj);

    // ---- feed-forward ----
    let normed = sized(&mut s.normed, n * n_embd);
    rmsnorm_rows_pool(pool, normed, x, w.ffn_norm, n_embd, cfg.rms_eps);
    s.projector.reset();
    let gate = sized(&mut s.gate, n * cfg.n_ff); // [n, n_ff]
    s.projector.project(&w.w_gate, normed, n, gate, pool)?;
    let up = sized(&mut s.up, n * cfg.n_ff); // [n, n_ff]
    s.projector.project(&w.w_up, normed, n, up, pool)?;
    // hidden = act(gate)·up, written over gate; elementwise, split by token rows.
    let activation = cfg.ffn_activation;
    let up = &*up;
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
                let table = GeluTable::shared();
                for (g, u) in gate.iter_mut().zip(up.iter()) {
                    *g = table.gelu(*g) * u;
                }
            }
        }
    });
    s.projector.reset();
    s.projector.project(&w.w_down, gate, n, proj, pool)?;
    if let Some(pn) = w.post_ffn_norm {
        check(layer, "post_ffw_norm", pn, n_embd)?;
        rmsnorm_in_place_pool(pool, proj, pn, n_embd, cfg.rms_eps);
    }
    nx_f32::add_in_place(x, proj);
    Ok(())
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
        let view = CacheView {
            keys: HeadRows::head(self.keys, cfg.n_head_kv, cfg.head_dim, kv_head)?,
            values: HeadRows::head(self.values, cfg.n_head_kv, cfg.value_dim, kv_head)?,
            first_row: self.first_row,
            precision: self.precision,
        };
        Some((view, start..end))
    }
}

/// Attention of every (token, query head) pair of the chunk against the cache rows
/// `rows`, written to `attn` (`[n, n_head · value_dim]`). The pairs are spread over
/// `pool`, one scratch per thread (at most `probs.len()` threads); each pair is computed
/// whole by one thread, so the result does not depend on the split.
#[allow(clippy::too_many_arguments)]
fn attend_chunk<T: KvElem>(
    cfg: &LayerConfig,
    layer: usize,
    rows: CacheRows<'_, T>,
    q: &[f32],
    pos: usize,
    attn: &mut [f32],
    probs: &mut [Vec<f32>],
    pool: &ThreadPool,
) -> Result<(), BlockError> {
    if cfg.value_dim == 0 || attn.is_empty() {
        return Ok(());
    }
    let q_dim = cfg.n_head * cfg.head_dim;
    let group = cfg.n_head / cfg.n_head_kv;
    let n_pairs = attn.len() / cfg.value_dim;
    // Small claims balance the causal mask's uneven rows (later tokens see more).
    let chunk = n_pairs.div_ceil(probs.len() * 8).max(1);
    let missing_view = AtomicBool::new(false);
    if pos_is_prefill(attn.len(), cfg) {
        // Several tokens: one item per (token, KV head), its query heads scored together
        // so each key row is read once for the group.
        let n_items = attn.len() / (group * cfg.value_dim);
        let chunk = n_items.div_ceil(probs.len() * 8).max(1);
        pool.parallel_chunks_mut(
            attn,
            group * cfg.value_dim,
            chunk,
            probs,
            |probs, items, out| {
                for (i, out) in items.zip(out.chunks_exact_mut(group * cfg.value_dim)) {
                    let (t, kv_head) = (i / cfg.n_head_kv, i % cfg.n_head_kv);
                    let first_q = t * q_dim + kv_head * group * cfg.head_dim;
                    let qs = &q[first_q..first_q + group * cfg.head_dim];
                    let Some((view, seen)) = rows.view(cfg, kv_head, pos + t) else {
                        missing_view.store(true, Ordering::Relaxed);
                        return;
                    };
                    attend_group(qs, view, seen, cfg.kq_scale, out, probs);
                }
            },
        );
    } else {
        pool.parallel_chunks_mut(attn, cfg.value_dim, chunk, probs, |probs, pairs, out| {
            for (i, out) in pairs.zip(out.chunks_exact_mut(cfg.value_dim)) {
                let (t, h) = (i / cfg.n_head, i % cfg.n_head);
                let qh = &q[t * q_dim + h * cfg.head_dim..t * q_dim + (h + 1) * cfg.head_dim];
                let Some((view, seen)) = rows.view(cfg, h / group, pos + t) else {
                    missing_view.store(true, Ordering::Relaxed);
                    return;
                };
                attend(qh, view, seen, cfg.kq_scale, out, probs);
            }
        });
    }
    if missing_view.load(Ordering::Relaxed) {
        return Err(bad_view(layer, "key/value cache view"));
    }
    Ok(())
}

/// True when the attention output `[n, n_head · value_dim]` holds more than one token:
/// a prefill chunk, whose query heads are scored per KV group. One token (decoding)
/// keeps one item per query head, so its few heads still spread over the threads.
fn pos_is_prefill(attn_len: usize, cfg: &LayerConfig) -> bool {
    attn_len > cfg.n_head * cfg.value_dim
}
