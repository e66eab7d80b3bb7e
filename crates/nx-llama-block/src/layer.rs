//! What one layer is, apart from how it runs: its configuration, its weights (dense or
//! experts), the batch segments it runs over and its errors.
//!
//! Its own module so that the forward pass ([`crate::block`]), the expert FFN
//! ([`crate::moe`]) and the RoPE rows ([`crate::rope_rows`]) share these types without
//! importing one another.

use nx_f32::RopeStyle;
use nx_kv_cache::KvError;
use nx_lazy_weight::{LazyWeight, LazyWeightError};

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
    /// Whether the layer rotates Q and K at all (SmolLM3 leaves some layers without).
    pub use_rope: bool,
    pub rope_base: f32,
    /// Linear position interpolation: every angle times this (1.0 = none).
    pub rope_freq_scale: f32,
    /// Every cosine and sine times this (LongRoPE's `attn_factor`; 1.0 = none).
    pub rope_attn_factor: f32,
    /// YaRN with the original context it was trained for (`None`: no YaRN).
    pub rope_yarn_orig_ctx: Option<usize>,
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    /// Look-back of a local layer, the query's own row included.
    pub window: Option<usize>,
    /// Multiplier applied to Q after RoPE (Gemma scales Q instead of the scores).
    pub q_scale: f32,
    /// Multiplier applied to the scores `q·k`.
    pub kq_scale: f32,
    /// Soft cap of the raw scores, `tanh(s/cap)·cap` (Gemma 2), applied before `kq_scale`.
    pub attn_softcap: Option<f32>,
    /// Multiplier of the attention and FFN outputs before their residual adds (Granite).
    pub residual_scale: Option<f32>,
    pub ffn_activation: FfnActivation,
}

/// The tensors of one layer. Norms and biases arrive as f32 vectors; matrices stay
/// quantized views into the mapping.
pub struct LayerWeights<'a> {
    /// RMSNorm weights before attention (OLMo 2 has none).
    pub attn_norm: Option<&'a [f32]>,
    pub wq: LazyWeight<'a>,
    pub wk: LazyWeight<'a>,
    pub wv: LazyWeight<'a>,
    pub bq: Option<&'a [f32]>,
    pub bk: Option<&'a [f32]>,
    pub bv: Option<&'a [f32]>,
    /// RMSNorm weights of Q and K: `head_dim` values normalise each head on its own
    /// (Qwen3, Gemma 3); a whole row's worth normalises the projection at once (OLMo 2).
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    pub wo: LazyWeight<'a>,
    /// Norm of the attention output before the residual add (Gemma, OLMo 2).
    pub post_attn_norm: Option<&'a [f32]>,
    /// RMSNorm weights before the FFN (OLMo 2 has none).
    pub ffn_norm: Option<&'a [f32]>,
    pub ffn: FfnWeights<'a>,
    /// Norm of the FFN output before the residual add (Gemma, OLMo 2).
    pub post_ffn_norm: Option<&'a [f32]>,
    /// Llama 3.1 `rope_freqs.weight`.
    pub rope_freq_factors: Option<&'a [f32]>,
}

/// The FFN's matrices: one gated FFN, or experts behind a router.
pub enum FfnWeights<'a> {
    /// `down(act(gate·x)·(up·x))`.
    Dense {
        gate: LazyWeight<'a>,
        up: LazyWeight<'a>,
        down: LazyWeight<'a>,
    },
    /// A mixture of experts ([`MoeWeights`]).
    Experts(MoeWeights<'a>),
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

/// One layer's experts: the router and the three 3-D expert tensors
/// (`[n_embd, n_ff_exp, n_expert]` for gate and up, `[n_ff_exp, n_embd, n_expert]` for
/// down), viewed per expert without a copy.
pub struct MoeWeights<'a> {
    /// `[n_embd, n_expert]`.
    pub router: LazyWeight<'a>,
    pub gate: LazyWeight<'a>,
    pub up: LazyWeight<'a>,
    pub down: LazyWeight<'a>,
    /// Experts per token.
    pub n_used: usize,
    /// Divide the chosen experts' weights by their sum (Qwen3-MoE's `norm_topk_prob`).
    pub norm_weights: bool,
}

impl MoeWeights<'_> {
    pub(crate) fn n_expert(&self) -> usize {
        self.router.n_rows()
    }
}

/// One sequence's rows in a batch: `n` tokens at positions `pos..pos+n`, segment `i` of
/// the batch being sequence `i` of the [`nx_kv_cache::KvSegments`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Tokens of this sequence in the batch.
    pub n: usize,
    /// Position of the first of them.
    pub pos: usize,
}

/// The first `len` values of `buf`, grown with defaults when shorter (scratch buffers
/// that grow to the largest chunk seen and never shrink).
pub(crate) fn sized<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    &mut buf[..len]
}
