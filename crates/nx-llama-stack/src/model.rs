//! `Model`: the mapped file, its config and tensor table, and the forward pass.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use nx_gguf::{GgmlType, Gguf, TensorInfo};
use nx_kv_cache::{KvCache, KvDtype, KvSegments, PagedKv};
use nx_lazy_weight::{min_bounded_tokens, BoundedHead, BoundedScratch, LazyWeight, QuantizedActs};
use nx_llama_block::{BlockScratch, FfnWeights, LayerConfig, LayerWeights, MoeWeights, Segment};
use nx_syscalls::{Placement, ThreadPool};

use crate::config::{Arch, ModelConfig, QkNormSpan};
use crate::StackError;

/// A 1-D f32 tensor (norm weight, bias), dequantized on first use and kept: a few
/// kilobytes per layer, and reading it lazily keeps opening the model free of data reads.
struct Vector {
    info: TensorInfo,
    values: OnceLock<Vec<f32>>,
}

/// A matrix of the forward pass: a whole tensor, or rows of one (Phi-3's fused
/// `attn_qkv` and gate/up), viewed without a copy.
struct Matrix {
    info: TensorInfo,
    rows: Option<std::ops::Range<usize>>,
}

impl Matrix {
    fn whole(info: TensorInfo) -> Matrix {
        Matrix { info, rows: None }
    }

    /// Bytes a pass over the matrix reads.
    fn n_bytes(&self) -> u64 {
        match &self.rows {
            None => self.info.n_bytes,
            Some(r) => {
                let n_rows = self.info.ne.get(1).copied().unwrap_or(1).max(1);
                self.info.n_bytes / n_rows * r.len() as u64
            }
        }
    }
}

struct LayerTensors {
    attn_norm: Option<usize>,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    bq: Option<usize>,
    bk: Option<usize>,
    bv: Option<usize>,
    q_norm: Option<usize>,
    k_norm: Option<usize>,
    wo: TensorInfo,
    post_attn_norm: Option<usize>,
    ffn_norm: Option<usize>,
    ffn: FfnTensors,
    post_ffn_norm: Option<usize>,
}

/// A layer's FFN matrices: dense, or a router and 3-D expert tensors.
enum FfnTensors {
    Dense {
        gate: Matrix,
        up: Matrix,
        down: TensorInfo,
    },
    Experts {
        router: TensorInfo,
        gate: TensorInfo,
        up: TensorInfo,
        down: TensorInfo,
    },
}

impl FfnTensors {
    /// Bytes a one-token pass reads: every dense matrix, or the router and the share of
    /// the experts one token uses.
    fn bytes_per_token(&self, c: &ModelConfig) -> u64 {
        match self {
            FfnTensors::Dense { gate, up, down } => gate.n_bytes() + up.n_bytes() + down.n_bytes,
            FfnTensors::Experts {
                router,
                gate,
                up,
                down,
            } => {
                let (used, all) = c
                    .moe
                    .map_or((1, 1), |m| (m.n_expert_used as u64, m.n_expert as u64));
                router.n_bytes + (gate.n_bytes + up.n_bytes + down.n_bytes) / all * used
            }
        }
    }
}

/// A loaded model. Holds the mapping; every weight is a view into it.
pub struct Model {
    gguf: Gguf,
    config: ModelConfig,
    token_embd: TensorInfo,
    output_norm: usize,
    /// `output.weight`, or the token embedding when the head is tied.
    lm_head: TensorInfo,
    rope_freqs: Option<usize>,
    /// LongRoPE's factors for contexts up to `rope_orig_ctx`, and beyond it.
    rope_short: Option<usize>,
    rope_long: Option<usize>,
    layers: Vec<LayerTensors>,
    vectors: Vec<Vector>,
    /// Threads of the forward pass; the process-wide pool unless set.
    pool: Arc<ThreadPool>,
    /// The LM head prepared for top rows (built by [`Model::prepare_bounded_head`] or on
    /// the first step that has enough of them; `None` where the head's format or the CPU
    /// has no bound kernel).
    bounded_head: OnceLock<Option<BoundedHead>>,
}

/// What [`Model::forward_batch`] gives for a row of an item's `top_rows`.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadChoice {
    /// The tokens that can be among the row's `top` largest logits, in increasing id
    /// order, each with its exact logit (the bits the full LM head gives); every other
    /// logit is lower than `top` of these, and all are finite (see
    /// [`nx_lazy_weight::BoundedHead`]).
    Candidates(Vec<(u32, f32)>),
    /// The row's full logits: row `i` of the logits, counted after every
    /// `logit_rows` row.
    Logits(usize),
}

/// One sequence's part of a batched forward pass ([`Model::forward_batch`]).
#[derive(Debug, Clone, Copy)]
pub struct BatchItem<'a> {
    /// New tokens of the sequence.
    pub tokens: &'a [u32],
    /// Position of the first of them (the segment's committed length).
    pub pos: usize,
    /// Indices into `tokens` whose next-token logits are wanted.
    pub logit_rows: &'a [usize],
    /// Indices into `tokens` whose caller needs only the `top` largest logits (greedy or
    /// top-k choices without log-probabilities): a [`HeadChoice`] each, in
    /// [`ForwardState::head_choices`].
    pub top_rows: &'a [usize],
    /// How many of the largest logits decide a `top_rows` row's token (1: greedy).
    pub top: usize,
}

/// Per-sequence scratch of the forward pass, reused across calls.
#[derive(Default)]
pub struct ForwardState {
    x: Vec<f32>,       // [n, n_embd] residual stream
    head_in: Vec<f32>, // [rows, n_embd]
    head_acts: QuantizedActs,
    block: BlockScratch,
    bounded: BoundedScratch,
    choices: Vec<HeadChoice>,
}

impl ForwardState {
    /// The last [`Model::forward_batch`]'s choices for the items' `top_rows`, item 0's
    /// first.
    pub fn head_choices(&self) -> &[HeadChoice] {
        &self.choices
    }
}

impl Model {
    /// Maps `path` and reads its header and config. No tensor data is read.
    pub fn open(path: impl AsRef<Path>) -> Result<Model, StackError> {
        Model::from_gguf(Gguf::open(path)?)
    }

    /// Opens `path` with its bytes placed as `placement` says ([`Placement::choose`] picks
    /// the fastest here). A resident model is first opened mapped, so that a file nx
    /// cannot run fails before anything is copied. The bytes are the same either way, so
    /// are the outputs; only the time to open and to read weights differ.
    pub fn open_placed(path: impl AsRef<Path>, placement: Placement) -> Result<Model, StackError> {
        let path = path.as_ref();
        let mapped = Model::open(path)?;
        match placement {
            Placement::Mapped => Ok(mapped),
            Placement::Resident => {
                drop(mapped);
                Model::from_gguf(Gguf::read_resident(path)?)
            }
        }
    }

    /// Builds the model over an already-parsed file.
    pub fn from_gguf(gguf: Gguf) -> Result<Model, StackError> {
        // Fail on the architecture before looking for its tensors.
        let arch = gguf.architecture()?.to_string();
        Arch::from_name(&arch)?;
        check_layer_count(&gguf, &arch)?;
        let token_embd = find(&gguf, "token_embd.weight")?;
        if token_embd.ne.len() != 2 {
            return Err(StackError::TensorShape {
                name: token_embd.name.clone(),
                ne: token_embd.ne.clone(),
                expected: "[n_embd, n_vocab]".into(),
            });
        }
        let n_vocab = token_embd.ne[1] as usize;
        let config = ModelConfig::from_metadata(gguf.metadata(), n_vocab)?;
        let c = &config;
        let mut t = TensorTable {
            gguf: &gguf,
            vectors: Vec::new(),
        };
        expect_shape(&token_embd, &[c.n_embd, n_vocab])?;
        let output_norm = t.vector("output_norm.weight", c.n_embd)?;
        let lm_head = match gguf.tensor("output.weight") {
            Some(t) => t.clone(),
            None => token_embd.clone(),
        };
        expect_shape(&lm_head, &[c.n_embd, n_vocab])?;
        let rope_freqs = t.opt_vector("rope_freqs.weight", c.rope_dim / 2)?;
        let rope_short = t.opt_vector("rope_factors_short.weight", c.rope_dim / 2)?;
        let rope_long = t.opt_vector("rope_factors_long.weight", c.rope_dim / 2)?;
        // The count was checked against the tensors present (`check_layer_count`).
        let layers = (0..c.n_layers)
            .map(|i| t.layer(c, i))
            .collect::<Result<Vec<_>, _>>()?;
        let vectors = t.vectors;
        let model = Model {
            gguf,
            config,
            token_embd,
            output_norm,
            lm_head,
            rope_freqs,
            rope_short,
            rope_long,
            layers,
            vectors,
            pool: ThreadPool::global(),
            bounded_head: OnceLock::new(),
        };
        // Validate every matrix view now (sizes only; no data is read).
        for l in &model.layers {
            for m in [&l.wq, &l.wk, &l.wv] {
                model.matrix(m)?;
            }
            model.weight(&l.wo)?;
            model.ffn_weights(&l.ffn)?;
        }
        model.weight(&model.token_embd)?;
        model.weight(&model.lm_head)?;
        Ok(model)
    }

    /// The model's hyperparameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Threads the forward pass runs on (the caller's included).
    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Runs the forward pass on `n_threads` threads from now on, in a pool of this
    /// model's own; `0` returns to the process-wide pool (`NX_THREADS`, else every CPU).
    /// Logits are bit-identical for any thread count.
    pub fn set_threads(&mut self, n_threads: usize) {
        self.pool = if n_threads == 0 {
            ThreadPool::global()
        } else {
            Arc::new(ThreadPool::new(n_threads))
        };
    }

    /// Runs the forward pass on `pool` (shared with other models or work).
    pub fn set_pool(&mut self, pool: Arc<ThreadPool>) {
        self.pool = pool;
    }

    /// The pool the forward pass runs on.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// Views of every quantized matrix the forward pass multiplies by (the LM head
    /// included, the token embedding only when it is the head): what
    /// `nx_lazy_weight::tune::tune` times kernels on. No data is read.
    pub fn matmul_weights(&self) -> Vec<LazyWeight<'_>> {
        self.gguf
            .tensors()
            .iter()
            .filter(|t| t.ne.len() >= 2 && t.name != "token_embd.weight")
            .chain((self.lm_head.name == "token_embd.weight").then_some(&self.lm_head))
            .filter(|t| nx_lazy_weight::vec_dot_type(t.ggml_type).is_some())
            .filter_map(|t| self.weight(t).ok())
            .collect()
    }

    /// Weight bytes one decode step reads ([`crate::traffic::decode_bytes_per_token`]).
    pub fn decode_bytes_per_token(&self) -> u64 {
        crate::traffic::decode_bytes_per_token(
            self.gguf.tensors(),
            crate::traffic::active_experts(&self.gguf),
        )
    }

    /// The underlying file (metadata for the tokenizer, chat template, …).
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// A KV cache sized for this model (`n_ctx` positions).
    pub fn new_cache(&self, n_ctx: usize, dtype: KvDtype) -> Result<KvCache, StackError> {
        let c = &self.config;
        let _ = c;
        Ok(KvCache::with_layer_widths(n_ctx, &self.kv_widths(), dtype)?)
    }

    fn weight(&self, info: &TensorInfo) -> Result<LazyWeight<'_>, StackError> {
        Ok(LazyWeight::new(info, self.gguf.tensor_bytes(info))?)
    }

    fn ffn_weights(&self, f: &FfnTensors) -> Result<FfnWeights<'_>, StackError> {
        Ok(match f {
            FfnTensors::Dense { gate, up, down } => FfnWeights::Dense {
                gate: self.matrix(gate)?,
                up: self.matrix(up)?,
                down: self.weight(down)?,
            },
            FfnTensors::Experts {
                router,
                gate,
                up,
                down,
            } => {
                let moe = self.config.moe.ok_or_else(|| {
                    StackError::BadConfig("expert tensors without an expert count".into())
                })?;
                FfnWeights::Experts(MoeWeights {
                    router: self.weight(router)?,
                    gate: self.weight(gate)?,
                    up: self.weight(up)?,
                    down: self.weight(down)?,
                    n_used: moe.n_expert_used,
                    norm_weights: moe.norm_weights,
                })
            }
        })
    }

    fn matrix(&self, m: &Matrix) -> Result<LazyWeight<'_>, StackError> {
        let whole = self.weight(&m.info)?;
        Ok(match &m.rows {
            None => whole,
            Some(r) => whole.row_range(r.clone())?,
        })
    }

    /// The RoPE frequency factors of a pass whose cache holds up to `n_ctx` positions:
    /// Llama 3's `rope_freqs`, else LongRoPE's long factors past the original context
    /// and its short ones within it.
    fn rope_factors(&self, n_ctx: usize) -> Option<usize> {
        let long = n_ctx > self.config.rope_orig_ctx;
        self.rope_freqs.or(if long {
            self.rope_long
        } else {
            self.rope_short
        })
    }

    fn vector(&self, idx: usize) -> Result<&[f32], StackError> {
        let v = &self.vectors[idx];
        if let Some(values) = v.values.get() {
            return Ok(values);
        }
        let w = self.weight(&v.info)?;
        let mut values = vec![0f32; w.row_len() * w.n_rows()];
        for (r, out) in values.chunks_exact_mut(w.row_len().max(1)).enumerate() {
            w.dequantize_row(r, out)?;
        }
        Ok(v.values.get_or_init(|| values))
    }

    fn opt_vector(&self, idx: Option<usize>) -> Result<Option<&[f32]>, StackError> {
        idx.map(|i| self.vector(i)).transpose()
    }

    /// The per-layer view the block needs.
    pub fn layer_config(&self, layer: usize) -> LayerConfig {
        let c = &self.config;
        // Gemma scales Q and runs attention unscaled.
        let (q_scale, kq_scale) = if c.scale_q {
            (c.attn_scale, 1.0)
        } else {
            (1.0, c.attn_scale)
        };
        LayerConfig {
            n_embd: c.n_embd,
            n_ff: c.n_ff,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            value_dim: c.value_dim,
            rms_eps: c.rms_eps,
            use_rope: c.layer_has_rope.get(layer).copied().unwrap_or(true),
            rope_base: c.rope_base_of(layer),
            rope_freq_scale: c.rope_freq_scale,
            rope_attn_factor: c.rope_attn_factor,
            rope_yarn_orig_ctx: c.rope_yarn.then_some(c.rope_orig_ctx),
            rope_dim: c.rope_dim,
            rope_style: c.rope_style,
            window: c.window_of(layer),
            q_scale,
            kq_scale,
            attn_softcap: c.attn_softcap,
            residual_scale: c.residual_scale,
            ffn_activation: c.ffn_activation,
        }
    }

    fn layer_weights(
        &self,
        layer: usize,
        rope_factors: Option<usize>,
    ) -> Result<LayerWeights<'_>, StackError> {
        let l = &self.layers[layer];
        Ok(LayerWeights {
            attn_norm: self.opt_vector(l.attn_norm)?,
            wq: self.matrix(&l.wq)?,
            wk: self.matrix(&l.wk)?,
            wv: self.matrix(&l.wv)?,
            bq: self.opt_vector(l.bq)?,
            bk: self.opt_vector(l.bk)?,
            bv: self.opt_vector(l.bv)?,
            q_norm: self.opt_vector(l.q_norm)?,
            k_norm: self.opt_vector(l.k_norm)?,
            wo: self.weight(&l.wo)?,
            post_attn_norm: self.opt_vector(l.post_attn_norm)?,
            ffn_norm: self.opt_vector(l.ffn_norm)?,
            ffn: self.ffn_weights(&l.ffn)?,
            post_ffn_norm: self.opt_vector(l.post_ffn_norm)?,
            rope_freq_factors: self.opt_vector(rope_factors)?,
        })
    }

    /// Runs `tokens` (one chunk, at positions `pos..pos+n`) through the model, appending
    /// their K/V rows to `cache`, and writes into `logits` the LM-head logits of the chunk
    /// rows listed in `rows` (indices into the chunk): `logits` becomes
    /// `[rows.len(), n_vocab]`. Only those rows pay for the final norm and LM head.
    pub fn forward(
        &self,
        tokens: &[u32],
        pos: usize,
        cache: &mut KvCache,
        rows: &[usize],
        state: &mut ForwardState,
        logits: &mut Vec<f32>,
    ) -> Result<(), StackError> {
        let item = BatchItem {
            tokens,
            pos,
            logit_rows: rows,
            top_rows: &[],
            top: 1,
        };
        self.forward_batch(&[item], cache, state, logits)
    }

    /// Runs a batch of sequences through the model in one pass: item `i` is segment `i`
    /// of `kv`, its tokens at positions `pos..pos+n` right after the segment's committed
    /// rows. Every matmul takes all rows of the batch together (weights are read once per
    /// step); attention runs per sequence over its own rows. `logits` becomes
    /// `[Σ logit_rows, n_vocab]`: the requested rows of item 0, then item 1, …, then
    /// those `top_rows` whose [`HeadChoice`] is `Logits`; only those rows pay for the
    /// final norm and LM head. Each row's logits are bit-identical to running its
    /// sequence alone, in any chunking, on any thread count; so are each `top_rows`
    /// row's candidates and their logits.
    pub fn forward_batch(
        &self,
        items: &[BatchItem<'_>],
        kv: &mut dyn KvSegments,
        state: &mut ForwardState,
        logits: &mut Vec<f32>,
    ) -> Result<(), StackError> {
        let c = &self.config;
        self.check_batch(items, &*kv)?;
        // Not cleared: the LM head overwrites every value, and resizing an emptied buffer
        // would zero megabytes per step first (n_vocab floats a row).
        let segs: Vec<Segment> = items
            .iter()
            .map(|it| Segment {
                n: it.tokens.len(),
                pos: it.pos,
            })
            .collect();
        let n: usize = segs.iter().map(|g| g.n).sum();
        state.choices.clear();
        if n == 0 {
            logits.clear();
            return Ok(());
        }
        let tokens = items.iter().flat_map(|it| it.tokens.iter().copied());
        self.embed(tokens, n, &mut state.x)?; // [n, n_embd]
        let rope_factors = self.rope_factors(kv.n_ctx());
        for layer in 0..c.n_layers {
            let cfg = self.layer_config(layer);
            let w = self.layer_weights(layer, rope_factors)?;
            let result = nx_llama_block::forward_batch(
                &cfg,
                &w,
                layer,
                &mut state.x,
                &segs,
                kv,
                &mut state.block,
                &self.pool,
            );
            if let Err(e) = result {
                (0..items.len()).for_each(|i| kv.rollback(i));
                return Err(e.into());
            }
        }
        for (i, g) in segs.iter().enumerate() {
            kv.commit(i, g.n)?;
        }
        // Batch rows whose logits were asked for, in item order; then the top rows.
        let (mut rows, mut bounded) = (Vec::new(), Vec::new());
        let mut first = 0;
        for it in items {
            rows.extend(it.logit_rows.iter().map(|&r| first + r));
            bounded.extend(it.top_rows.iter().map(|&r| (first + r, it.top)));
            first += it.tokens.len();
        }
        // Top rows without a bound take full logits after the others.
        let mut full = self.head_choices(&bounded, rows.len(), state)?;
        rows.append(&mut full);
        self.lm_head(&rows, state, logits) // [rows, n_vocab]
    }

    /// Prepares the LM head for top rows now, when steps of `max_rows` rows can use it
    /// (at least [`min_bounded_tokens`] top rows; a head without logit scale or soft cap whose format and
    /// CPU have a bound kernel), instead of in the first step that does: its table of
    /// block terms takes a sweep of the head (about 21 MB and some tens of milliseconds
    /// for Gemma 3's 262 144 rows), which would otherwise land on one step's latency.
    /// Returns whether the bounded head is ready.
    pub fn prepare_bounded_head(&self, max_rows: usize) -> Result<bool, StackError> {
        let c = &self.config;
        if max_rows < min_bounded_tokens()
            || c.logit_scale.is_some()
            || c.final_logit_softcap.is_some()
        {
            return Ok(self.bounded_head_ready());
        }
        let head = self.weight(&self.lm_head)?;
        let prepared = self
            .bounded_head
            .get_or_init(|| BoundedHead::new(&head, &self.pool));
        Ok(prepared.is_some())
    }

    /// Whether the LM head is prepared for top rows ([`Model::prepare_bounded_head`]).
    pub fn bounded_head_ready(&self) -> bool {
        matches!(self.bounded_head.get(), Some(Some(_)))
    }

    /// The [`HeadChoice`]s of the batch rows `bounded` (each with its top count) into
    /// `state.choices`; returns the rows that need full logits, which will be logits rows
    /// `first_full..`.
    fn head_choices(
        &self,
        bounded: &[(usize, usize)],
        first_full: usize,
        state: &mut ForwardState,
    ) -> Result<Vec<usize>, StackError> {
        state.choices.clear();
        let c = &self.config;
        let head = self.weight(&self.lm_head)?;
        // The bound covers the head's own sums: scaled or capped logits can tie where
        // the sums do not, so those models take full logits.
        let prepared = if c.logit_scale.is_none()
            && c.final_logit_softcap.is_none()
            // Fewer top rows go through the full head, cheaper then.
            && bounded.len() >= min_bounded_tokens()
        {
            self.bounded_head
                .get_or_init(|| BoundedHead::new(&head, &self.pool))
                .as_ref()
        } else {
            None
        };
        let rows: Vec<usize> = bounded.iter().map(|b| b.0).collect();
        let Some(prepared) = prepared else {
            state
                .choices
                .extend((0..rows.len()).map(|j| HeadChoice::Logits(first_full + j)));
            return Ok(rows);
        };
        self.head_inputs(&rows, state)?;
        let top: Vec<usize> = bounded.iter().map(|b| b.1).collect();
        let per_row =
            prepared.candidates(&head, &state.head_in, &top, &mut state.bounded, &self.pool)?;
        let mut full = Vec::new();
        for (&row, cands) in rows.iter().zip(per_row) {
            state.choices.push(match cands {
                Some(cands) => HeadChoice::Candidates(cands),
                None => {
                    full.push(row);
                    HeadChoice::Logits(first_full + full.len() - 1)
                }
            });
        }
        Ok(full)
    }

    fn check_batch(&self, items: &[BatchItem<'_>], kv: &dyn KvSegments) -> Result<(), StackError> {
        if items.len() != kv.n_segments() {
            return Err(StackError::BatchShape {
                items: items.len(),
                segments: kv.n_segments(),
            });
        }
        for (i, it) in items.iter().enumerate() {
            let cache_len = kv.len(i)?;
            if it.pos != cache_len {
                return Err(StackError::PositionMismatch {
                    pos: it.pos,
                    cache_len,
                });
            }
            let n = it.tokens.len();
            if let Some(&row) = it.logit_rows.iter().chain(it.top_rows).find(|&&r| r >= n) {
                return Err(StackError::RowOutOfRange { row, n });
            }
            if let Some(&id) = it
                .tokens
                .iter()
                .find(|&&id| id as usize >= self.config.n_vocab)
            {
                return Err(StackError::TokenOutOfRange {
                    id,
                    n_vocab: self.config.n_vocab,
                });
            }
            kv.ensure_room(i, n)?;
        }
        Ok(())
    }

    /// Token embeddings (scaled where the architecture asks) into `x`: `[n, n_embd]`.
    fn embed(
        &self,
        tokens: impl Iterator<Item = u32>,
        n: usize,
        x: &mut Vec<f32>,
    ) -> Result<(), StackError> {
        let c = &self.config;
        let embd = self.weight(&self.token_embd)?;
        x.resize(n * c.n_embd, 0.0);
        for (t, id) in tokens.enumerate() {
            let row = &mut x[t * c.n_embd..(t + 1) * c.n_embd];
            embd.dequantize_row(id as usize, row)?;
            if let Some(s) = c.embed_scale {
                nx_f32::scale(row, s);
            }
        }
        Ok(())
    }

    /// The final norm of the batch rows `rows` of `state.x` into `state.head_in`.
    fn head_inputs(&self, rows: &[usize], state: &mut ForwardState) -> Result<(), StackError> {
        let c = &self.config;
        let norm = self.vector(self.output_norm)?;
        state.head_in.resize(rows.len() * c.n_embd, 0.0);
        for (i, &r) in rows.iter().enumerate() {
            nx_f32::rmsnorm(
                &mut state.head_in[i * c.n_embd..(i + 1) * c.n_embd],
                &state.x[r * c.n_embd..(r + 1) * c.n_embd],
                norm,
                c.rms_eps,
            );
        }
        Ok(())
    }

    /// Final norm and LM head for the batch rows `rows` of `state.x`.
    fn lm_head(
        &self,
        rows: &[usize],
        state: &mut ForwardState,
        logits: &mut Vec<f32>,
    ) -> Result<(), StackError> {
        let c = &self.config;
        if rows.is_empty() {
            logits.clear();
            return Ok(());
        }
        self.head_inputs(rows, state)?;
        let head = self.weight(&self.lm_head)?;
        logits.resize(rows.len() * c.n_vocab, 0.0);
        nx_lazy_weight::matmul_pool(
            &head,
            &state.head_in,
            rows.len(),
            logits,
            &mut state.head_acts,
            &self.pool,
        )?;
        if let Some(scale) = c.logit_scale {
            // As the reference: times the f32 inverse, not a division.
            nx_f32::scale(logits, 1.0f32 / scale);
        }
        if let Some(cap) = c.final_logit_softcap {
            for l in logits.iter_mut() {
                *l = (*l / cap).tanh() * cap;
            }
        }
        Ok(())
    }

    /// A KV block pool for this model: `max_bytes` of blocks of `block_size` positions,
    /// sequences of at most `n_ctx` positions.
    pub fn new_paged_cache(
        &self,
        n_ctx: usize,
        dtype: KvDtype,
        block_size: usize,
        max_bytes: u64,
    ) -> Result<PagedKv, StackError> {
        Ok(PagedKv::new(
            &self.kv_widths(),
            dtype,
            block_size,
            n_ctx,
            max_bytes,
        )?)
    }

    /// Bytes of K and V rows one position takes in every layer, stored as `dtype`.
    pub fn kv_bytes_per_position(&self, dtype: KvDtype) -> u64 {
        let c = &self.config;
        (c.k_dim() + c.v_dim()) as u64 * c.n_layers as u64 * dtype.size_bytes() as u64
    }

    fn kv_widths(&self) -> Vec<nx_kv_cache::LayerWidths> {
        let c = &self.config;
        vec![
            nx_kv_cache::LayerWidths {
                k: c.k_dim(),
                v: c.v_dim()
            };
            c.n_layers
        ]
    }

    /// Bytes of weights a decode step reads (every matrix once, plus one embedding row).
    pub fn weight_bytes_per_token(&self) -> u64 {
        let mut total = 0;
        for l in &self.layers {
            for m in [&l.wq, &l.wk, &l.wv] {
                total += m.n_bytes();
            }
            total += l.wo.n_bytes + l.ffn.bytes_per_token(&self.config);
        }
        total + self.lm_head.n_bytes
    }

    /// The token embedding's type (for reports).
    pub fn embedding_type(&self) -> GgmlType {
        self.token_embd.ggml_type
    }
}

/// Looks tensors up by name with their expected shapes while a model is built, keeping
/// the 1-D ones (norms, biases) in `vectors` for lazy dequantization.
struct TensorTable<'g> {
    gguf: &'g Gguf,
    vectors: Vec<Vector>,
}

impl TensorTable<'_> {
    /// A 1-D tensor of `len` values: its index in `vectors`.
    fn vector(&mut self, name: &str, len: usize) -> Result<usize, StackError> {
        let info = find(self.gguf, name)?;
        expect_shape(&info, &[len])?;
        self.vectors.push(Vector {
            info,
            values: OnceLock::new(),
        });
        Ok(self.vectors.len() - 1)
    }

    /// An optional 1-D tensor of `len` values.
    fn opt_vector(&mut self, name: &str, len: usize) -> Result<Option<usize>, StackError> {
        match self.gguf.tensor(name) {
            Some(_) => self.vector(name, len).map(Some),
            None => Ok(None),
        }
    }

    /// A `[k, n]` matrix.
    fn matrix(&self, name: &str, k: usize, n: usize) -> Result<TensorInfo, StackError> {
        let t = find(self.gguf, name)?;
        expect_shape(&t, &[k, n])?;
        Ok(t)
    }

    /// Consecutive `[k, n_i]` matrices: the tensor `fused` (`[k, Σ n_i]`) split by rows
    /// when it is named and the file has it, else the tensors `names`.
    fn matrices<const N: usize>(
        &self,
        fused: Option<&str>,
        names: [&str; N],
        k: usize,
        widths: [usize; N],
    ) -> Result<[Matrix; N], StackError> {
        let Some(info) = fused.and_then(|f| self.gguf.tensor(f)) else {
            let mut out = Vec::with_capacity(N);
            for (name, n) in names.iter().zip(widths) {
                out.push(Matrix::whole(self.matrix(name, k, n)?));
            }
            return Ok(out
                .try_into()
                .unwrap_or_else(|_| unreachable!("N matrices")));
        };
        expect_shape(info, &[k, widths.iter().sum()])?;
        let mut first = 0;
        Ok(widths.map(|n| {
            first += n;
            Matrix {
                info: info.clone(),
                rows: Some(first - n..first),
            }
        }))
    }

    /// The tensors of layer `i` (`blk.{i}.…`), the optional ones as the config asks.
    fn layer(&mut self, c: &ModelConfig, i: usize) -> Result<LayerTensors, StackError> {
        let name = |s: &str| format!("blk.{i}.{s}");
        let q_dim = c.q_dim();
        let (bq, bk, bv) = if self.gguf.tensor(&name("attn_q.bias")).is_some() {
            (
                Some(self.vector(&name("attn_q.bias"), q_dim)?),
                Some(self.vector(&name("attn_k.bias"), c.k_dim())?),
                Some(self.vector(&name("attn_v.bias"), c.v_dim())?),
            )
        } else {
            (None, None, None)
        };
        let (q_norm, k_norm) = match c.qk_norm {
            Some(span) => {
                let (q_len, k_len) = match span {
                    QkNormSpan::Head => (c.head_dim, c.head_dim),
                    QkNormSpan::Projection => (q_dim, c.k_dim()),
                };
                (
                    Some(self.vector(&name("attn_q_norm.weight"), q_len)?),
                    Some(self.vector(&name("attn_k_norm.weight"), k_len)?),
                )
            }
            None => (None, None),
        };
        let (attn_norm, ffn_norm) = if c.pre_norms {
            (
                Some(self.vector(&name("attn_norm.weight"), c.n_embd)?),
                Some(self.vector(&name("ffn_norm.weight"), c.n_embd)?),
            )
        } else {
            (None, None)
        };
        let (post_attn_norm, post_ffn_norm) = if c.post_norms {
            (
                Some(self.vector(&name("post_attention_norm.weight"), c.n_embd)?),
                Some(self.vector(&name("post_ffw_norm.weight"), c.n_embd)?),
            )
        } else {
            (None, None)
        };
        let [wq, wk, wv] = self.matrices(
            Some(&name("attn_qkv.weight")),
            [
                &name("attn_q.weight"),
                &name("attn_k.weight"),
                &name("attn_v.weight"),
            ],
            c.n_embd,
            [q_dim, c.k_dim(), c.v_dim()],
        )?;
        let ffn = self.ffn_tensors(c, i)?;
        Ok(LayerTensors {
            attn_norm,
            wq,
            wk,
            wv,
            bq,
            bk,
            bv,
            q_norm,
            k_norm,
            wo: self.matrix(
                &name("attn_output.weight"),
                c.n_head * c.value_dim,
                c.n_embd,
            )?,
            post_attn_norm,
            ffn_norm,
            ffn,
            post_ffn_norm,
        })
    }

    /// The FFN tensors of layer `i`: experts where the config has them, else gate, up
    /// and down.
    fn ffn_tensors(&self, c: &ModelConfig, i: usize) -> Result<FfnTensors, StackError> {
        let name = |s: &str| format!("blk.{i}.{s}");
        if let Some(m) = c.moe {
            let experts = |s: &str, k: usize, n: usize| -> Result<TensorInfo, StackError> {
                let t = find(self.gguf, &name(s))?;
                expect_shape(&t, &[k, n, m.n_expert])?;
                Ok(t)
            };
            return Ok(FfnTensors::Experts {
                router: self.matrix(&name("ffn_gate_inp.weight"), c.n_embd, m.n_expert)?,
                gate: experts("ffn_gate_exps.weight", c.n_embd, m.n_ff_exp)?,
                up: experts("ffn_up_exps.weight", c.n_embd, m.n_ff_exp)?,
                down: experts("ffn_down_exps.weight", m.n_ff_exp, c.n_embd)?,
            });
        }
        // Without ffn_gate, ffn_up holds gate and up one after the other (Phi-3).
        let up = name("ffn_up.weight");
        let fused_up = self
            .gguf
            .tensor(&name("ffn_gate.weight"))
            .is_none()
            .then_some(up.as_str());
        let [gate, up] = self.matrices(
            fused_up,
            [&name("ffn_gate.weight"), &up],
            c.n_embd,
            [c.n_ff, c.n_ff],
        )?;
        Ok(FfnTensors::Dense {
            gate,
            up,
            down: self.matrix(&name("ffn_down.weight"), c.n_ff, c.n_embd)?,
        })
    }
}

/// Checks the layer count against the tensors the file holds before anything is sized
/// by it: every layer has at least six tensors (Phi-3's fused layers have six), and the
/// last layer's output projection must exist.
fn check_layer_count(gguf: &Gguf, arch: &str) -> Result<(), StackError> {
    let key = format!("{arch}.block_count");
    let Ok(n_layers) = gguf.metadata().get_u32(&key) else {
        return Ok(()); // a missing or mistyped key is reported by the config
    };
    let most = gguf.tensors().len() / 6;
    if n_layers as usize > most {
        return Err(StackError::BadConfig(format!(
            "{key} = {n_layers}, but the file's {} tensors hold at most {most} layers",
            gguf.tensors().len()
        )));
    }
    if n_layers > 0 {
        let last = format!("blk.{}.attn_output.weight", n_layers - 1);
        if gguf.tensor(&last).is_none() {
            return Err(StackError::BadConfig(format!(
                "{key} = {n_layers}, but the file has no tensor {last:?}"
            )));
        }
    }
    Ok(())
}

fn find(gguf: &Gguf, name: &str) -> Result<TensorInfo, StackError> {
    gguf.tensor(name)
        .cloned()
        .ok_or_else(|| StackError::MissingTensor(name.to_string()))
}

fn expect_shape(t: &TensorInfo, dims: &[usize]) -> Result<(), StackError> {
    let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    if t.ne != want {
        return Err(StackError::TensorShape {
            name: t.name.clone(),
            ne: t.ne.clone(),
            expected: format!("{want:?}"),
        });
    }
    Ok(())
}
