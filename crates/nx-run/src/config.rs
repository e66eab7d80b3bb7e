//! `RunConfig` (how a runner generates) and `Prompt` (what it starts from).

use nx_kv_cache::KvDtype;
use nx_llama_stack::ModelConfig;
use nx_sampler::SamplerConfig;

use crate::RunError;

/// What generation starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text, encoded with the runner's tokenizer. BOS is added when
    /// [`RunConfig::add_special`] is set, the vocabulary asks for it, and the cache is
    /// empty (a continuation never gets a second BOS).
    Text(String),
    /// Token ids, used exactly as given (no BOS is added).
    Ids(Vec<u32>),
}

/// How a [`crate::Runner`] generates.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    /// Most tokens one prefill forward pass processes. Bounds prefill memory; the
    /// generated tokens do not depend on it.
    pub prefill_chunk: usize,
    /// Positions the KV cache holds (prompt, history and generated tokens together).
    pub n_ctx: usize,
    /// KV cache element type.
    pub kv_dtype: KvDtype,
    /// Most tokens one generation emits (0: prefill only).
    pub max_tokens: usize,
    /// Cap on the bytes of output text one generation emits (`None`: no cap).
    pub max_bytes: Option<usize>,
    /// Generation stops before the first occurrence of any of these (non-empty) strings.
    pub stop_strings: Vec<String>,
    /// How many most likely alternatives each [`crate::Event::Token`] reports (0: none).
    pub logprobs: usize,
    /// Whether each [`crate::Event::Token`] reports its token's log-probability (off: NaN).
    /// It costs a pass over the vocabulary per token (1.6 % of the default model's
    /// decode, whose vocabulary has 262144 entries); the tokens are the same either way.
    pub token_logprobs: bool,
    /// How tokens are chosen.
    pub sampler: SamplerConfig,
    /// Add BOS (and EOS) to text prompts as the vocabulary asks.
    pub add_special: bool,
    /// Read special-token texts in a text prompt (e.g. `<start_of_turn>`) as those
    /// tokens; without it they are plain text.
    pub parse_special: bool,
    /// Reuse the KV rows of earlier generations whose tokens start the same way (whole
    /// blocks of 16). Off only for measurements (`nx bench`); answers are the same.
    pub prefix_cache: bool,
    /// Speculative decoding (`None`: one token per forward pass). The answer is the same
    /// with and without it.
    pub speculation: Option<crate::Speculation>,
    /// JSON mode: each answer is (a prefix of) one JSON object ([`crate::json_mode`]).
    pub json_object: bool,
}

impl Default for RunConfig {
    /// Chunks of 256, 4096 positions of f16 cache, 128 tokens, no byte cap or stop
    /// strings, no alternatives, each token's log-probability, the sampler's defaults, BOS added, special-token texts
    /// in prompts left as plain text, prefix cache on, no speculation, no JSON mode.
    fn default() -> Self {
        RunConfig {
            prefill_chunk: 256,
            n_ctx: 4096,
            kv_dtype: KvDtype::F16,
            max_tokens: 128,
            max_bytes: None,
            stop_strings: Vec::new(),
            logprobs: 0,
            token_logprobs: true,
            sampler: SamplerConfig::default(),
            add_special: true,
            parse_special: false,
            prefix_cache: true,
            speculation: None,
            json_object: false,
        }
    }
}

impl RunConfig {
    /// The prefill chunk a model runs its prompts fastest with: 256 tokens, and 512
    /// for a mixture of experts. Each expert multiplies only the chunk's tokens that
    /// chose it (a Qwen3-MoE expert, 8 of 64, about 32 of 256), and its unpacked weight
    /// rows serve those tokens' tile groups alone, so twice the chunk halves the
    /// unpacking per token and leaves fewer tokens over for the four-token kernel
    /// (`nx bench -p 512` on the Qwen3-MoE shapes, AVX-512, 2 threads, three
    /// alternating pairs on AMD EPYC family 25 model 17: 286, 287, 285 t/s at 256;
    /// 318, 321, 309 at 512). A dense model gains little from 512 (1.5B shapes +2 %,
    /// 0.5B +1 %, AVX2 0.5B −4 %) for twice the activation memory.
    pub fn default_prefill_chunk(model: &ModelConfig) -> usize {
        match model.moe {
            Some(_) => 512,
            None => 256,
        }
    }

    /// Checks the runner's own fields (the sampler checks its settings itself).
    pub fn validate(&self) -> Result<(), RunError> {
        if self.prefill_chunk == 0 {
            return Err(RunError::InvalidConfig(
                "prefill_chunk must be at least 1".into(),
            ));
        }
        if self.n_ctx == 0 {
            return Err(RunError::InvalidConfig("n_ctx must be at least 1".into()));
        }
        if self.max_bytes == Some(0) {
            return Err(RunError::InvalidConfig(
                "max_bytes must be at least 1 (leave it unset for no cap)".into(),
            ));
        }
        if self.stop_strings.iter().any(|s| s.is_empty()) {
            return Err(RunError::InvalidConfig("a stop string is empty".into()));
        }
        self.sampler.validate()?;
        if let Some(spec) = &self.speculation {
            spec.validate()?;
        }
        Ok(())
    }
}
