//! `ModelConfig`: hyperparameters per architecture, read from GGUF metadata.
//!
//! What differs between architectures is data: one [`ArchSpec`] row per architecture
//! says which optional steps its layers have (pre- and post-norms, Q/K norms and their
//! span, sliding-window pattern, layers without RoPE, Granite's multipliers), and
//! [`ModelConfig::from_metadata`] reads the keys those steps need. No architecture has a
//! code path of its own in the block.

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
    Qwen3Moe,
    Gemma2,
    Gemma3,
    Granite,
    Olmo2,
    Phi3,
    Smollm3,
}

/// Over how many values a Q/K RMSNorm runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNormSpan {
    /// Each head on its own (`head_dim` weights): Qwen3, Gemma 3.
    Head,
    /// The whole projection row (`n_head · head_dim` weights for Q): OLMo 2.
    Projection,
}

/// Where a local layer's RoPE base comes from when `rope.freq_base_swa` is absent.
#[derive(Debug, Clone, Copy, PartialEq)]
enum LocalRopeBase {
    /// This value (Gemma 3: 10 000).
    Fixed(f32),
    /// The global layers' base.
    Global,
}

/// What one architecture's layers compute: the table [`ModelConfig::from_metadata`]
/// reads (the facts come from the pinned llama.cpp's `src/models/*.cpp`).
#[derive(Debug, Clone, Copy)]
struct ArchSpec {
    arch: Arch,
    /// `general.architecture` and the metadata key prefix.
    name: &'static str,
    rope_style: RopeStyle,
    /// `rope.freq_base` when the key is absent.
    default_rope_base: f32,
    ffn_activation: FfnActivation,
    /// RMSNorm before attention and before the FFN (`attn_norm`, `ffn_norm`).
    pre_norms: bool,
    /// RMSNorm of the attention and FFN outputs before the residual adds.
    post_norms: bool,
    qk_norm: Option<QkNormSpan>,
    /// Embeddings times √n_embd (Gemma).
    embed_sqrt_n_embd: bool,
    /// Q is scaled after RoPE and attention runs unscaled (Gemma), instead of scaling
    /// the scores.
    scale_q: bool,
    /// With `attention.sliding_window` set: layer `i` is local when
    /// `i % pattern < pattern - 1` (`attention.sliding_window_pattern` overrides it).
    swa_pattern: Option<usize>,
    /// The window when `attention.sliding_window` is absent (Gemma 2: 4096).
    default_window: Option<usize>,
    local_rope_base: LocalRopeBase,
    /// Every this-many-th layer (1-based) has no RoPE (SmolLM3: 4; the reference fixes
    /// it, no key gives it).
    no_rope_every: Option<usize>,
    /// Granite's `embedding_scale`, `residual_scale`, `attention.scale` and the required
    /// `logit_scale`.
    multipliers: bool,
    /// Gemma 2's soft caps of the attention scores and of the logits, the defaults of
    /// `attn_logit_softcapping` and `final_logit_softcapping`.
    softcaps: Option<(f32, f32)>,
    /// The FFN is a mixture of experts (`expert_count`, `expert_used_count`, …).
    experts: bool,
}

impl ArchSpec {
    /// A llama-like row: pre-norms, SiLU FFN, nothing optional.
    const fn plain(arch: Arch, name: &'static str, rope_style: RopeStyle, base: f32) -> Self {
        ArchSpec {
            arch,
            name,
            rope_style,
            default_rope_base: base,
            ffn_activation: FfnActivation::Silu,
            pre_norms: true,
            post_norms: false,
            qk_norm: None,
            embed_sqrt_n_embd: false,
            scale_q: false,
            swa_pattern: None,
            default_window: None,
            local_rope_base: LocalRopeBase::Global,
            no_rope_every: None,
            multipliers: false,
            softcaps: None,
            experts: false,
        }
    }
}

/// One row per architecture, in [`Arch::ALL`] order.
const ARCH_SPECS: [ArchSpec; 10] = [
    ArchSpec::plain(Arch::Llama, "llama", RopeStyle::Normal, 10_000.0),
    ArchSpec::plain(Arch::Qwen2, "qwen2", RopeStyle::Neox, 1_000_000.0),
    ArchSpec {
        qk_norm: Some(QkNormSpan::Head),
        ..ArchSpec::plain(Arch::Qwen3, "qwen3", RopeStyle::Neox, 1_000_000.0)
    },
    ArchSpec {
        qk_norm: Some(QkNormSpan::Head),
        experts: true,
        ..ArchSpec::plain(Arch::Qwen3Moe, "qwen3moe", RopeStyle::Neox, 1_000_000.0)
    },
    ArchSpec {
        ffn_activation: FfnActivation::GeluTanh,
        post_norms: true,
        embed_sqrt_n_embd: true,
        scale_q: true,
        swa_pattern: Some(2),
        default_window: Some(4096),
        softcaps: Some((50.0, 30.0)),
        ..ArchSpec::plain(Arch::Gemma2, "gemma2", RopeStyle::Neox, 10_000.0)
    },
    ArchSpec {
        ffn_activation: FfnActivation::GeluTanh,
        post_norms: true,
        qk_norm: Some(QkNormSpan::Head),
        embed_sqrt_n_embd: true,
        scale_q: true,
        swa_pattern: Some(6),
        local_rope_base: LocalRopeBase::Fixed(10_000.0),
        ..ArchSpec::plain(Arch::Gemma3, "gemma3", RopeStyle::Neox, 1_000_000.0)
    },
    ArchSpec {
        multipliers: true,
        ..ArchSpec::plain(Arch::Granite, "granite", RopeStyle::Normal, 10_000.0)
    },
    ArchSpec {
        pre_norms: false,
        post_norms: true,
        qk_norm: Some(QkNormSpan::Projection),
        swa_pattern: Some(4),
        ..ArchSpec::plain(Arch::Olmo2, "olmo2", RopeStyle::Neox, 10_000.0)
    },
    // Phi-3's fused attn_qkv and gate/up are found by the tensor table (any row may
    // have them); its sliding window the reference ignores, and so do we.
    ArchSpec {
        scale_q: true,
        ..ArchSpec::plain(Arch::Phi3, "phi3", RopeStyle::Neox, 10_000.0)
    },
    ArchSpec {
        no_rope_every: Some(4),
        ..ArchSpec::plain(Arch::Smollm3, "smollm3", RopeStyle::Normal, 10_000.0)
    },
];

impl Arch {
    /// Every architecture nx runs (the README's list is checked against it).
    pub const ALL: [Arch; 10] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::Granite,
        Arch::Olmo2,
        Arch::Phi3,
        Arch::Smollm3,
    ];

    /// Parses `general.architecture`.
    pub fn from_name(name: &str) -> Result<Arch, StackError> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| StackError::UnsupportedArch(name.to_string()))
    }

    /// The metadata key prefix (`qwen2.block_count`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    fn spec(self) -> &'static ArchSpec {
        ARCH_SPECS
            .iter()
            .find(|s| s.arch == self)
            .expect("every Arch has a row in ARCH_SPECS")
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
    /// Linear position interpolation: every RoPE angle times this (`1 / rope.scaling.factor`;
    /// 1.0 without scaling).
    pub rope_freq_scale: f32,
    /// Every RoPE cosine and sine times this (`rope.scaling.attn_factor`, and for YaRN
    /// the reference's magnitude correction; 1.0 without).
    pub rope_attn_factor: f32,
    /// YaRN scaling (`rope.scaling.type = yarn`): angles blended over
    /// [`ModelConfig::rope_orig_ctx`]'s correction range.
    pub rope_yarn: bool,
    /// The context the RoPE factors were trained for
    /// (`rope.scaling.original_context_length`, else the training context): a LongRoPE
    /// model runs longer contexts with its long factors, as the reference.
    pub rope_orig_ctx: usize,
    /// Dimensions of a head that RoPE rotates.
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    /// Per layer: whether it applies RoPE (SmolLM3 leaves every fourth layer without).
    pub layer_has_rope: Vec<bool>,
    /// Sliding window (tokens a query may look back, itself included) for local layers.
    pub sliding_window: Option<usize>,
    /// Per layer: true when the layer uses the sliding window.
    pub layer_is_local: Vec<bool>,
    /// Embeddings are multiplied by this (Gemma: √n_embd; Granite: `embedding_scale`).
    pub embed_scale: Option<f32>,
    /// Multiplier of the attention scores (or of Q, when [`ModelConfig::scale_q`]).
    pub attn_scale: f32,
    /// Gemma scales Q after RoPE by `attn_scale` and runs attention unscaled.
    pub scale_q: bool,
    pub ffn_activation: FfnActivation,
    /// RMSNorm before attention and before the FFN (all but OLMo 2).
    pub pre_norms: bool,
    /// Extra norms after attention and after the FFN (Gemma, OLMo 2).
    pub post_norms: bool,
    /// RMSNorm of Q and K, per head (Qwen3, Gemma 3) or over the projection (OLMo 2).
    pub qk_norm: Option<QkNormSpan>,
    /// Granite's multiplier of each block output before its residual add.
    pub residual_scale: Option<f32>,
    /// Granite's `logit_scale`: logits are multiplied by its inverse.
    pub logit_scale: Option<f32>,
    /// Soft cap of the attention scores (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// The experts of a mixture-of-experts FFN (Qwen3-MoE); `None` for a dense FFN.
    pub moe: Option<MoeConfig>,
    pub final_logit_softcap: Option<f32>,
}

/// A mixture-of-experts FFN's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts per layer.
    pub n_expert: usize,
    /// Experts each token uses.
    pub n_expert_used: usize,
    /// Hidden width of one expert.
    pub n_ff_exp: usize,
    /// The chosen experts' weights are divided by their sum.
    pub norm_weights: bool,
}

/// The reference's limit on experts per layer.
const MAX_EXPERTS: usize = 512;

/// The expert counts of a mixture-of-experts architecture.
fn read_moe(k: &Keys<'_>, n_ff: usize) -> Result<MoeConfig, StackError> {
    let n_expert = k.u32("expert_count")?;
    let n_expert_used = k.u32("expert_used_count")?;
    if n_expert == 0 || n_expert > MAX_EXPERTS || n_expert_used == 0 || n_expert_used > n_expert {
        return bad(format!(
            "{} = {n_expert} and {} = {n_expert_used}: need 1 ≤ used ≤ experts ≤ {MAX_EXPERTS}",
            k.key("expert_count"),
            k.key("expert_used_count")
        ));
    }
    let n_ff_exp = k
        .opt_u32("expert_feed_forward_length")?
        .unwrap_or(n_ff / n_expert_used);
    if n_ff_exp == 0 {
        return bad(format!("{} is 0", k.key("expert_feed_forward_length")));
    }
    Ok(MoeConfig {
        n_expert,
        n_expert_used,
        n_ff_exp,
        norm_weights: true,
    })
}

/// Reads `{arch}.KEY` values, naming the full key in every error.
struct Keys<'m> {
    m: &'m Metadata,
    prefix: &'static str,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.prefix)
    }

    fn u32(&self, k: &str) -> Result<usize, StackError> {
        Ok(self.m.get_u32(&self.key(k))? as usize)
    }

    fn opt_u32(&self, k: &str) -> Result<Option<usize>, StackError> {
        Ok(opt_u32(self.m, &self.key(k))?.map(|v| v as usize))
    }

    fn opt_f32(&self, k: &str) -> Result<Option<f32>, StackError> {
        opt_f32(self.m, &self.key(k))
    }

    /// An optional multiplier: absent or 0 (the reference's "unset") is `None`; it must
    /// be finite and positive otherwise.
    fn multiplier(&self, k: &str) -> Result<Option<f32>, StackError> {
        match self.opt_f32(k)? {
            None => Ok(None),
            Some(0.0) => Ok(None),
            Some(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
            Some(v) => Err(StackError::BadConfig(format!(
                "{} = {v} must be finite and positive",
                self.key(k)
            ))),
        }
    }
}

fn bad<T>(msg: String) -> Result<T, StackError> {
    Err(StackError::BadConfig(msg))
}

/// Head counts and widths: `(n_head, n_head_kv, head_dim, value_dim)`.
fn read_heads(k: &Keys<'_>, n_embd: usize) -> Result<(usize, usize, usize, usize), StackError> {
    let n_head = k.u32("attention.head_count")?;
    let n_head_kv = k.opt_u32("attention.head_count_kv")?.unwrap_or(n_head);
    if n_head == 0 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
        return bad(format!(
            "{} = {n_head} and {} = {n_head_kv}: both must be non-zero, the second \
             dividing the first",
            k.key("attention.head_count"),
            k.key("attention.head_count_kv")
        ));
    }
    let head_dim = k
        .opt_u32("attention.key_length")?
        .unwrap_or(n_embd / n_head);
    let value_dim = k.opt_u32("attention.value_length")?.unwrap_or(head_dim);
    if head_dim == 0 || head_dim % 2 != 0 || value_dim == 0 {
        return bad(format!(
            "head width {head_dim} (value width {value_dim}) must be even and non-zero \
             (from {} or {} / {})",
            k.key("attention.key_length"),
            k.key("embedding_length"),
            k.key("attention.head_count")
        ));
    }
    Ok((n_head, n_head_kv, head_dim, value_dim))
}

/// What [`read_rope`] finds.
struct RopeSetup {
    base: f32,
    freq_scale: f32,
    attn_factor: f32,
    yarn: bool,
    rope_dim: usize,
}

/// The attention factor llama.cpp's context derives for YaRN with factor `1/freq_scale`
/// (`get_mscale`, then the division that cancels the kernel's own correction), in plain
/// f32 operations as its build computes them.
fn yarn_attn_factor(freq_scale: f32) -> f32 {
    let factor = 1.0f32 / freq_scale;
    let mscale = if factor <= 1.0 {
        1.0
    } else {
        0.1f32 * 1.0 * factor.ln() + 1.0
    };
    mscale * (1.0f32 / (1.0f32 + 0.1f32 * factor.ln()))
}

/// RoPE base, frequency scale, attention factor, YaRN and rotated width.
fn read_rope(k: &Keys<'_>, spec: &ArchSpec, head_dim: usize) -> Result<RopeSetup, StackError> {
    let rope_dim = k.opt_u32("rope.dimension_count")?.unwrap_or(head_dim);
    if rope_dim > head_dim || rope_dim % 2 != 0 {
        return bad(format!(
            "{} = {rope_dim} exceeds the head width {head_dim} or is odd",
            k.key("rope.dimension_count")
        ));
    }
    let base = k
        .opt_f32("rope.freq_base")?
        .unwrap_or(spec.default_rope_base);
    if !(base.is_finite() && base > 0.0) {
        return bad(format!(
            "{} = {base} must be positive",
            k.key("rope.freq_base")
        ));
    }
    // As the reference: the type defaults to linear, the factor to none, and the
    // scale is the factor's f32 inverse.
    let kind = match k.m.get_str(&k.key("rope.scaling.type")) {
        Ok(s) => s.to_string(),
        Err(nx_gguf::GgufError::MissingKey { .. }) => "linear".to_string(),
        Err(e) => return Err(e.into()),
    };
    let factor = match k.multiplier("rope.scaling.factor")? {
        Some(f) => Some(f),
        None => k.multiplier("rope.scale_linear")?,
    };
    // "llama3" files carry their factors in rope_freqs.weight (the reference itself
    // knows no such type); "longrope" ones in rope_factors_long/short.weight.
    let freq_scale = match kind.as_str() {
        "none" => 1.0,
        "linear" | "longrope" | "llama3" | "yarn" => factor.map_or(1.0, |f| 1.0f32 / f),
        other => {
            return bad(format!(
                "{} = {other:?}: nx applies RoPE scaling \"none\", \"linear\", \"yarn\", \
                 \"llama3\" and \"longrope\"",
                k.key("rope.scaling.type")
            ))
        }
    };
    let yarn = kind == "yarn";
    let file_factor = k.multiplier("rope.scaling.attn_factor")?.unwrap_or(1.0);
    let attn_factor = if yarn {
        yarn_attn_factor(freq_scale) * file_factor
    } else {
        file_factor
    };
    Ok(RopeSetup {
        base,
        freq_scale,
        attn_factor,
        yarn,
        rope_dim,
    })
}

/// The sliding window, which layers use it, and their RoPE base.
fn read_windows(
    k: &Keys<'_>,
    spec: &ArchSpec,
    n_layers: usize,
    rope_base: f32,
) -> Result<(Option<usize>, Vec<bool>, f32), StackError> {
    let global = (None, vec![false; n_layers], rope_base);
    let Some(default_pattern) = spec.swa_pattern else {
        return Ok(global);
    };
    let window = match k
        .opt_u32("attention.sliding_window")?
        .or(spec.default_window)
    {
        Some(w) if w > 0 => w,
        _ => return Ok(global),
    };
    let key = k.key("attention.sliding_window_pattern");
    let local: Vec<bool> = match k.m.get(&key) {
        None => pattern_layers(default_pattern, n_layers),
        Some(v) => match (v.as_u64(), v.as_array()) {
            (Some(p), _) if p > 0 => pattern_layers(p as usize, n_layers),
            (_, Some(a)) if a.values.len() == n_layers => a
                .values
                .iter()
                .map(|x| x.as_bool())
                .collect::<Option<_>>()
                .ok_or_else(|| StackError::BadConfig(format!("{key} must hold booleans")))?,
            _ => {
                return bad(format!(
                    "{key} must be a positive integer or one boolean per layer ({n_layers})"
                ))
            }
        },
    };
    let base = match k.opt_f32("rope.freq_base_swa")? {
        Some(b) => b,
        None => match spec.local_rope_base {
            LocalRopeBase::Fixed(b) => b,
            LocalRopeBase::Global => rope_base,
        },
    };
    if !(base.is_finite() && base > 0.0) {
        return bad(format!(
            "{} = {base} must be positive",
            k.key("rope.freq_base_swa")
        ));
    }
    Ok((Some(window), local, base))
}

/// `attention.layer_norm_rms_epsilon`, a finite non-negative number.
fn read_rms_eps(k: &Keys<'_>) -> Result<f32, StackError> {
    let key = k.key("attention.layer_norm_rms_epsilon");
    let rms_eps = k.m.get_f32(&key)?;
    if !(rms_eps.is_finite() && rms_eps >= 0.0) {
        return bad(format!(
            "{key} = {rms_eps} must be a finite non-negative number"
        ));
    }
    Ok(rms_eps)
}

/// The scales [`read_scales`] reads (see [`ModelConfig`]'s fields of those names).
struct Scales {
    embed: Option<f32>,
    attn: f32,
    residual: Option<f32>,
    logit: Option<f32>,
}

/// The input embedding, attention, residual and logit scales: the architecture's
/// multipliers where it has them (a logit scale is then required), else `√n_embd` on
/// the embeddings where the architecture scales them, `1/√head_dim` on the scores and
/// no residual or logit scale.
fn read_scales(
    k: &Keys<'_>,
    arch: Arch,
    n_layers: usize,
    (n_embd, n_head, head_dim): (usize, usize, usize),
) -> Result<Scales, StackError> {
    let spec = arch.spec();
    // Gemma 2 27B (46 layers) scales by n_embd / n_head, as the reference decides.
    let gemma2_27b = arch == Arch::Gemma2 && n_layers == 46;
    let default_attn_scale = if gemma2_27b {
        1.0 / ((n_embd / n_head) as f32).sqrt()
    } else {
        1.0 / (head_dim as f32).sqrt()
    };
    if !spec.multipliers {
        return Ok(Scales {
            embed: spec.embed_sqrt_n_embd.then(|| (n_embd as f32).sqrt()),
            attn: default_attn_scale,
            residual: None,
            logit: None,
        });
    }
    let logit_scale = k.multiplier("logit_scale")?.ok_or_else(|| {
        StackError::BadConfig(format!("{} is missing or 0", k.key("logit_scale")))
    })?;
    Ok(Scales {
        embed: k.multiplier("embedding_scale")?,
        attn: k
            .multiplier("attention.scale")?
            .unwrap_or(default_attn_scale),
        residual: k.multiplier("residual_scale")?,
        logit: Some(logit_scale),
    })
}

/// The attention and final-logit soft caps (a cap of 0 or less is none).
fn read_softcaps(k: &Keys<'_>, spec: &ArchSpec) -> Result<(Option<f32>, Option<f32>), StackError> {
    let attn = match spec.softcaps {
        Some((default, _)) => Some(k.opt_f32("attn_logit_softcapping")?.unwrap_or(default)),
        None => None,
    };
    let last = k
        .opt_f32("final_logit_softcapping")?
        .or(spec.softcaps.map(|(_, default)| default));
    for (name, cap) in [
        ("attn_logit_softcapping", attn),
        ("final_logit_softcapping", last),
    ] {
        if cap.is_some_and(|c| !c.is_finite()) {
            return bad(format!(
                "{} = {} must be finite",
                k.key(name),
                cap.unwrap_or(0.0)
            ));
        }
    }
    let positive = |c: Option<f32>| c.filter(|&c| c > 0.0);
    Ok((positive(attn), positive(last)))
}

/// Layer `i` is local when `i % pattern < pattern - 1` (the last of each group is global).
fn pattern_layers(pattern: usize, n_layers: usize) -> Vec<bool> {
    (0..n_layers).map(|i| i % pattern < pattern - 1).collect()
}

/// Which layers apply RoPE.
fn read_rope_layers(
    k: &Keys<'_>,
    spec: &ArchSpec,
    n_layers: usize,
) -> Result<Vec<bool>, StackError> {
    // Granite uses `rope.scaling.finetuned` as a switch for RoPE in every layer.
    if spec.multipliers {
        if let Ok(false) = k.m.get_bool(&k.key("rope.scaling.finetuned")) {
            return Ok(vec![false; n_layers]);
        }
    }
    Ok(match spec.no_rope_every {
        Some(every) => (0..n_layers).map(|i| (i + 1) % every != 0).collect(),
        None => vec![true; n_layers],
    })
}

impl ModelConfig {
    /// Reads the config of a supported architecture from metadata. `n_vocab` comes from the
    /// token embedding's shape, which the caller knows.
    pub fn from_metadata(m: &Metadata, n_vocab: usize) -> Result<ModelConfig, StackError> {
        let arch = Arch::from_name(m.get_str("general.architecture")?)?;
        let spec = arch.spec();
        let k = Keys {
            m,
            prefix: spec.name,
        };
        let n_layers = k.u32("block_count")?;
        let n_embd = k.u32("embedding_length")?;
        let n_ff = k.u32("feed_forward_length")?;
        if n_layers == 0 {
            return bad(format!("{} is 0", k.key("block_count")));
        }
        let (n_head, n_head_kv, head_dim, value_dim) = read_heads(&k, n_embd)?;
        let RopeSetup {
            base: rope_base,
            freq_scale: rope_freq_scale,
            attn_factor: rope_attn_factor,
            yarn: rope_yarn,
            rope_dim,
        } = read_rope(&k, spec, head_dim)?;
        let n_ctx_train = k.opt_u32("context_length")?.unwrap_or(4096);
        let rope_orig_ctx = k
            .opt_u32("rope.scaling.original_context_length")?
            .unwrap_or(n_ctx_train);
        let rms_eps = read_rms_eps(&k)?;
        let (sliding_window, layer_is_local, rope_base_local) =
            read_windows(&k, spec, n_layers, rope_base)?;
        let Scales {
            embed: embed_scale,
            attn: attn_scale,
            residual: residual_scale,
            logit: logit_scale,
        } = read_scales(&k, arch, n_layers, (n_embd, n_head, head_dim))?;
        let (attn_softcap, final_logit_softcap) = read_softcaps(&k, spec)?;
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
            rope_freq_scale,
            rope_attn_factor,
            rope_yarn,
            rope_orig_ctx,
            rope_dim,
            rope_style: spec.rope_style,
            layer_has_rope: read_rope_layers(&k, spec, n_layers)?,
            sliding_window,
            layer_is_local,
            embed_scale,
            attn_scale,
            scale_q: spec.scale_q,
            ffn_activation: spec.ffn_activation,
            pre_norms: spec.pre_norms,
            post_norms: spec.post_norms,
            qk_norm: spec.qk_norm,
            residual_scale,
            logit_scale,
            attn_softcap,
            moe: if spec.experts {
                Some(read_moe(&k, n_ff)?)
            } else {
                None
            },
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

#[cfg(test)]
mod tests {
    use super::*;
    use nx_gguf::{Gguf, GgufWriter, Value};

    /// The metadata of a small model of `arch` plus `extra` pairs (keys without the
    /// architecture prefix).
    fn config(arch: &str, extra: &[(&str, Value)]) -> Result<ModelConfig, StackError> {
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", Value::String(arch.into()));
        let base = [
            ("block_count", Value::U32(8)),
            ("embedding_length", Value::U32(256)),
            ("feed_forward_length", Value::U32(512)),
            ("attention.head_count", Value::U32(4)),
            ("attention.head_count_kv", Value::U32(2)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ];
        for (k, v) in base.into_iter().chain(extra.iter().cloned()) {
            w.add_metadata(format!("{arch}.{k}"), v);
        }
        let gguf = Gguf::from_bytes(w.to_bytes()).expect("parses");
        ModelConfig::from_metadata(gguf.metadata(), 100)
    }

    #[test]
    fn every_arch_has_one_spec_row_in_order() {
        assert_eq!(ARCH_SPECS.len(), Arch::ALL.len());
        for (spec, arch) in ARCH_SPECS.iter().zip(Arch::ALL) {
            assert_eq!(spec.arch, arch);
            assert_eq!(Arch::from_name(spec.name).unwrap(), arch);
        }
    }

    #[test]
    fn granite_reads_its_multipliers_and_needs_the_logit_scale() {
        let c = config(
            "granite",
            &[
                ("logit_scale", Value::F32(8.0)),
                ("residual_scale", Value::F32(0.22)),
                ("embedding_scale", Value::F32(12.0)),
                ("attention.scale", Value::F32(0.015625)),
            ],
        )
        .unwrap();
        assert_eq!(c.logit_scale, Some(8.0));
        assert_eq!(c.residual_scale, Some(0.22));
        assert_eq!(c.embed_scale, Some(12.0));
        assert_eq!(c.attn_scale, 0.015625);
        let err = config("granite", &[]).unwrap_err().to_string();
        assert!(err.contains("granite.logit_scale"), "{err}");
        let err = config("granite", &[("logit_scale", Value::F32(f32::NAN))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("granite.logit_scale = NaN"), "{err}");
        // Unset multipliers (absent or 0, as the reference treats them) stay off.
        let c = config(
            "granite",
            &[
                ("logit_scale", Value::F32(1.0)),
                ("residual_scale", Value::F32(0.0)),
            ],
        )
        .unwrap();
        assert_eq!((c.residual_scale, c.embed_scale), (None, None));
        assert_eq!(c.attn_scale, 1.0 / 64f32.sqrt());
    }

    #[test]
    fn smollm3_leaves_every_fourth_layer_without_rope() {
        let c = config("smollm3", &[]).unwrap();
        let expected = [true, true, true, false, true, true, true, false];
        assert_eq!(c.layer_has_rope, expected);
        assert!(config("llama", &[])
            .unwrap()
            .layer_has_rope
            .iter()
            .all(|&r| r));
    }

    #[test]
    fn olmo2_has_post_norms_and_projection_wide_qk_norms() {
        let c = config("olmo2", &[]).unwrap();
        assert!(!c.pre_norms && c.post_norms);
        assert_eq!(c.qk_norm, Some(QkNormSpan::Projection));
        assert_eq!(c.rope_style, RopeStyle::Neox);
        // With a window, every fourth layer is global unless the file says otherwise.
        let c = config("olmo2", &[("attention.sliding_window", Value::U32(64))]).unwrap();
        assert_eq!(c.sliding_window, Some(64));
        let expected = [true, true, true, false, true, true, true, false];
        assert_eq!(c.layer_is_local, expected);
        assert_eq!(c.rope_base_local, c.rope_base);
        let c = config(
            "olmo2",
            &[
                ("attention.sliding_window", Value::U32(64)),
                ("attention.sliding_window_pattern", Value::U32(2)),
            ],
        )
        .unwrap();
        assert_eq!(c.layer_is_local, [true, false].repeat(4));
    }

    #[test]
    fn gemma2_defaults_to_the_reference_window_and_soft_caps() {
        let c = config("gemma2", &[]).unwrap();
        assert_eq!(c.sliding_window, Some(4096));
        assert_eq!(c.layer_is_local, [true, false].repeat(4));
        assert_eq!(
            (c.attn_softcap, c.final_logit_softcap),
            (Some(50.0), Some(30.0))
        );
        assert_eq!(c.embed_scale, Some(16.0));
        assert!(c.scale_q && c.pre_norms && c.post_norms && c.qk_norm.is_none());
        let c = config(
            "gemma2",
            &[
                ("attn_logit_softcapping", Value::F32(5.0)),
                ("final_logit_softcapping", Value::F32(0.0)),
                ("attention.sliding_window", Value::U32(32)),
            ],
        )
        .unwrap();
        assert_eq!((c.attn_softcap, c.final_logit_softcap), (Some(5.0), None));
        assert_eq!(c.sliding_window, Some(32));
        // Other architectures have no attention cap whatever the file says.
        let c = config("llama", &[("attn_logit_softcapping", Value::F32(5.0))]).unwrap();
        assert_eq!(c.attn_softcap, None);
        let err = config(
            "gemma2",
            &[("attn_logit_softcapping", Value::F32(f32::INFINITY))],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("gemma2.attn_logit_softcapping"), "{err}");
    }

    #[test]
    fn phi3_reads_its_long_rope_setup() {
        let c = config(
            "phi3",
            &[
                ("context_length", Value::U32(131072)),
                ("rope.scaling.original_context_length", Value::U32(4096)),
                ("rope.scaling.attn_factor", Value::F32(1.19)),
            ],
        )
        .unwrap();
        assert_eq!((c.n_ctx_train, c.rope_orig_ctx), (131072, 4096));
        assert_eq!(c.rope_attn_factor, 1.19);
        assert!(c.scale_q && c.sliding_window.is_none());
        // Without the key the factors were trained for the whole context.
        let c = config("phi3", &[("context_length", Value::U32(4096))]).unwrap();
        assert_eq!((c.rope_orig_ctx, c.rope_attn_factor), (4096, 1.0));
        let err = config("phi3", &[("rope.scaling.attn_factor", Value::F32(-2.0))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("phi3.rope.scaling.attn_factor"), "{err}");
    }

    #[test]
    fn qwen3moe_reads_its_experts_and_refuses_impossible_counts() {
        let experts = |n: u32, used: u32| {
            config(
                "qwen3moe",
                &[
                    ("expert_count", Value::U32(n)),
                    ("expert_used_count", Value::U32(used)),
                    ("expert_feed_forward_length", Value::U32(768)),
                ],
            )
        };
        let m = experts(128, 8).unwrap().moe.unwrap();
        assert_eq!((m.n_expert, m.n_expert_used, m.n_ff_exp), (128, 8, 768));
        assert!(m.norm_weights);
        for (n, used) in [(0, 0), (8, 0), (8, 9), (100_000, 2)] {
            let err = experts(n, used).unwrap_err().to_string();
            assert!(err.contains("qwen3moe.expert_count"), "{err}");
        }
        let err = config("qwen3moe", &[]).unwrap_err().to_string();
        assert!(err.contains("qwen3moe.expert_count"), "{err}");
        assert!(config("qwen3", &[]).unwrap().moe.is_none());
    }

    #[test]
    fn linear_rope_scaling_is_read_and_other_kinds_are_refused() {
        let c = config("llama", &[("rope.scaling.factor", Value::F32(4.0))]).unwrap();
        assert_eq!(c.rope_freq_scale, 0.25);
        let c = config("llama", &[("rope.scale_linear", Value::F32(2.0))]).unwrap();
        assert_eq!(c.rope_freq_scale, 0.5);
        let c = config(
            "llama",
            &[
                ("rope.scaling.type", Value::String("none".into())),
                ("rope.scaling.factor", Value::F32(4.0)),
            ],
        )
        .unwrap();
        assert_eq!(c.rope_freq_scale, 1.0);
        assert_eq!(config("llama", &[]).unwrap().rope_freq_scale, 1.0);
        let c = config(
            "llama",
            &[
                ("rope.scaling.type", Value::String("yarn".into())),
                ("rope.scaling.factor", Value::F32(4.0)),
                ("rope.scaling.original_context_length", Value::U32(1024)),
            ],
        )
        .unwrap();
        assert!(c.rope_yarn);
        assert_eq!((c.rope_freq_scale, c.rope_orig_ctx), (0.25, 1024));
        // The reference's context: get_mscale(4) / (1 + 0.1·ln 4), a hair from 1.
        let ln4 = 4f32.ln();
        assert_eq!(
            c.rope_attn_factor,
            (0.1 * ln4 + 1.0) * (1.0 / (1.0 + 0.1 * ln4))
        );
        assert!(!config("llama", &[]).unwrap().rope_yarn);
        for kind in ["dynamic", "su"] {
            let err = config(
                "llama",
                &[("rope.scaling.type", Value::String(kind.into()))],
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("llama.rope.scaling.type") && err.contains(kind),
                "{err}"
            );
        }
        let err = config("llama", &[("rope.scaling.factor", Value::F32(-1.0))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("llama.rope.scaling.factor = -1"), "{err}");
    }
}
