//! `ModelConfig`: hyperparameters per architecture, read from GGUF metadata.

use nx_gguf::Metadata;

use crate::StackError;

/// The names of [`Arch::ALL`], comma-separated (for messages).
pub fn arch_names() -> String {
    Arch::ALL.map(Arch::name).join(", ")
}

/// The architectures nx runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
}

impl Arch {
    /// Every architecture nx runs (the README's list is checked against it).
    pub const ALL: [Arch; 4] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3];

    /// Parses `general.architecture`.
    pub fn from_name(name: &str) -> Result<Arch, StackError> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| StackError::UnsupportedArch(name.to_string()))
    }

    /// The metadata key prefix (`qwen2.block_count`).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
        }
    }
}

/// How RoPE pairs the dimensions of a head.
pub use nx_f32::RopeStyle;
pub use nx_llama_block::FfnActivation;

/// Everything the forward pass needs to know about a model's shape, per architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Key (and query) head width.
    pub head_dim: usize,
    /// Value head width.
    pub value_dim: usize,
    pub n_vocab: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    /// RoPE base of global layers.
    pub rope_base: f32,
    /// RoPE base of sliding-window layers (Gemma 3: 10 000).
    pub rope_base_local: f32,
    /// Dimensions of a head that RoPE rotates.
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    /// Sliding window (tokens a query may look back, itself included) for local layers.
    pub sliding_window: Option<usize>,
    /// Per layer: true when the layer uses the sliding window.
    pub layer_is_local: Vec<bool>,
    /// Embeddings are multiplied by this (Gemma: √n_embd).
    pub embed_scale: Option<f32>,
    /// Multiplier applied to Q before attention; attention then uses no further scale.
    pub attn_scale: f32,
    pub ffn_activation: FfnActivation,
    /// Gemma's extra norms after attention and after the FFN.
    pub post_norms: bool,
    /// Qwen3 / Gemma 3 per-head RMSNorm of Q and K.
    pub qk_norm: bool,
    /// `tokenizer.ggml.bos_token_id` etc. are the tokenizer's business; the stack only
    /// needs to know whether the LM head is tied to the embeddings, decided by the tensors.
    pub final_logit_softcap: Option<f32>,
}

impl ModelConfig {
    /// Reads the config of a supported architecture from metadata. `n_vocab` comes from the
    /// token embedding's shape, which the caller knows.
    pub fn from_metadata(m: &Metadata, n_vocab: usize) -> Result<ModelConfig, StackError> {
        let arch = Arch::from_name(m.get_str("general.architecture")?)?;
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let n_layers = m.get_u32(&key("block_count"))? as usize;
        let n_embd = m.get_u32(&key("embedding_length"))? as usize;
        let n_ff = m.get_u32(&key("feed_forward_length"))? as usize;
        let n_head = m.get_u32(&key("attention.head_count"))? as usize;
        let n_head_kv = match m.get_u32(&key("attention.head_count_kv")) {
            Ok(v) => v as usize,
            Err(nx_gguf::GgufError::MissingKey { .. }) => n_head,
            Err(e) => return Err(e.into()),
        };
        let bad = |msg: String| Err(StackError::BadConfig(msg));
        if n_layers == 0 {
            return bad(format!("{} is 0", key("block_count")));
        }
        if n_head == 0 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
            return bad(format!(
                "{} = {n_head} and {} = {n_head_kv}: both must be non-zero, the second \
                 dividing the first",
                key("attention.head_count"),
                key("attention.head_count_kv")
            ));
        }
        let head_dim = opt_u32(m, &key("attention.key_length"))?
            .map(|v| v as usize)
            .unwrap_or(n_embd / n_head);
        let value_dim = opt_u32(m, &key("attention.value_length"))?
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        if head_dim == 0 || head_dim % 2 != 0 || value_dim == 0 {
            return bad(format!(
                "head width {head_dim} (value width {value_dim}) must be even and non-zero \
                 (from {} or {} / {})",
                key("attention.key_length"),
                key("embedding_length"),
                key("attention.head_count")
            ));
        }
        let rope_dim = opt_u32(m, &key("rope.dimension_count"))?
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return bad(format!(
                "{} = {rope_dim} exceeds the head width {head_dim} or is odd",
                key("rope.dimension_count")
            ));
        }
        let n_ctx_train = opt_u32(m, &key("context_length"))?.unwrap_or(4096) as usize;
        let rms_eps = m.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let default_base = match arch {
            Arch::Llama => 10_000.0,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => 1_000_000.0,
        };
        let rope_base = opt_f32(m, &key("rope.freq_base"))?.unwrap_or(default_base);
        if !(rope_base.is_finite() && rope_base > 0.0) {
            return bad(format!(
                "{} = {rope_base} must be positive",
                key("rope.freq_base")
            ));
        }
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return bad(format!(
                "{} = {rms_eps} must be a finite non-negative number",
                key("attention.layer_norm_rms_epsilon")
            ));
        }
        let rope_style = match arch {
            Arch::Llama => RopeStyle::Normal,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => RopeStyle::Neox,
        };
        let (sliding_window, layer_is_local, rope_base_local) = match arch {
            Arch::Gemma3 => match opt_u32(m, &key("attention.sliding_window"))? {
                Some(w) if w > 0 => {
                    // Five local layers to every global one: layer i is local unless
                    // i % 6 == 5.
                    let local = (0..n_layers).map(|i| i % 6 < 5).collect();
                    let base = opt_f32(m, &key("rope.freq_base_swa"))?.unwrap_or(10_000.0);
                    (Some(w as usize), local, base)
                }
                _ => (None, vec![false; n_layers], rope_base),
            },
            _ => (None, vec![false; n_layers], rope_base),
        };
        let (embed_scale, attn_scale, ffn_activation, post_norms, qk_norm) = match arch {
            Arch::Gemma3 => (
                Some((n_embd as f32).sqrt()),
                1.0 / (head_dim as f32).sqrt(),
                FfnActivation::GeluTanh,
                true,
                true,
            ),
            Arch::Qwen3 => (
                None,
                1.0 / (head_dim as f32).sqrt(),
                FfnActivation::Silu,
                false,
                true,
            ),
            Arch::Llama | Arch::Qwen2 => (
                None,
                1.0 / (head_dim as f32).sqrt(),
                FfnActivation::Silu,
                false,
                false,
            ),
        };
        let final_logit_softcap = opt_f32(m, &key("final_logit_softcapping"))?.filter(|&c| c > 0.0);
        Ok(ModelConfig {
            arch,
            n_layers,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            value_dim,
            n_vocab,
            n_ctx_train,
            rms_eps,
            rope_base,
            rope_base_local,
            rope_dim,
            rope_style,
            sliding_window,
            layer_is_local,
            embed_scale,
            attn_scale,
            ffn_activation,
            post_norms,
            qk_norm,
            final_logit_softcap,
        })
    }

    /// Width of Q rows (`n_head · head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of K rows in the cache.
    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of V rows in the cache.
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.value_dim
    }

    /// The sliding window of `layer`, if it is a local layer.
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        if self.layer_is_local.get(layer).copied().unwrap_or(false) {
            self.sliding_window
        } else {
            None
        }
    }

    /// The RoPE base of `layer`.
    pub fn rope_base_of(&self, layer: usize) -> f32 {
        if self.window_of(layer).is_some() {
            self.rope_base_local
        } else {
            self.rope_base
        }
    }
}

fn opt_u32(m: &Metadata, key: &str) -> Result<Option<u32>, StackError> {
    match m.get_u32(key) {
        Ok(v) => Ok(Some(v)),
        Err(nx_gguf::GgufError::MissingKey { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn opt_f32(m: &Metadata, key: &str) -> Result<Option<f32>, StackError> {
    match m.get_f32(key) {
        Ok(v) => Ok(Some(v)),
        Err(nx_gguf::GgufError::MissingKey { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
