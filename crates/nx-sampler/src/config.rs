//! Sampler settings, their llama.cpp-like defaults, and validation.

/// A setting that cannot be used, named by field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// NaN or infinite value.
    #[error("sampler setting {field} is not a finite number ({value})")]
    NotFinite {
        /// Field name, as in [`SamplerConfig`].
        field: &'static str,
        /// The value given.
        value: f32,
    },
    /// `temperature < 0`.
    #[error("temperature {0} is negative (0 means greedy)")]
    NegativeTemperature(f32),
    /// `top_p` outside `(0, 1]`.
    #[error("top_p {0} is outside (0, 1] (1 disables it)")]
    TopPOutOfRange(f32),
    /// `min_p` outside `[0, 1]`.
    #[error("min_p {0} is outside [0, 1] (0 disables it)")]
    MinPOutOfRange(f32),
    /// `repeat_penalty <= 0`.
    #[error("repeat_penalty {0} must be positive (1 disables it)")]
    RepeatPenaltyNotPositive(f32),
}

/// How the next token is chosen from a row of logits.
///
/// The pipeline (see [`crate::Sampler::sample`]) is llama.cpp's default chain:
/// penalties → top-k → top-p → min-p → temperature → softmax → seeded draw.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Divides the logits before the draw; `0` means greedy argmax.
    pub temperature: f32,
    /// Keep only the `top_k` highest logits; `0` turns it off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`;
    /// `1.0` turns it off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `0` turns it off.
    pub min_p: f32,
    /// Repetition penalty on tokens in the recent window: positive logits are divided
    /// by it, others multiplied; `1.0` turns it off.
    pub repeat_penalty: f32,
    /// Subtracted once per occurrence in the recent window; `0` turns it off.
    pub frequency_penalty: f32,
    /// Subtracted once from every token present in the recent window; `0` turns it off.
    pub presence_penalty: f32,
    /// Size of the recent-token window the penalties look at; `0` turns penalties off.
    pub penalty_last_n: usize,
    /// Seed of the ChaCha20 generator. The same seed, settings, accepted tokens and
    /// logits give the same tokens.
    pub seed: u64,
    /// `(token id, bias)` pairs added to the logits before anything else (llama.cpp's
    /// `--logit-bias`, OpenAI's `logit_bias`): a large negative bias bans a token, a
    /// positive one favours it. A token listed twice gets both; ids beyond the row are
    /// ignored (callers check them against the vocabulary). Empty turns it off.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerConfig {
    /// llama.cpp's CLI defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
    /// penalties off with a 64-token window) with one difference: the seed is fixed
    /// at 0 instead of random, so runs are reproducible unless the caller picks a seed.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding: temperature 0, every filter and penalty off.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }

    /// `true` when sampling is argmax (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// `true` when some penalty would change a logit.
    pub fn penalties_enabled(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }

    /// `true` when something besides the model moves a logit before the choice (a
    /// penalty or a logit bias): the choice then needs the whole row.
    pub fn adjusts_logits(&self) -> bool {
        self.penalties_enabled() || !self.logit_bias.is_empty()
    }

    /// Checks every field; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let scalars = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repeat_penalty", self.repeat_penalty),
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ];
        let biases = self.logit_bias.iter().map(|&(_, b)| ("logit_bias", b));
        for (field, value) in scalars.into_iter().chain(biases) {
            if !value.is_finite() {
                return Err(ConfigError::NotFinite { field, value });
            }
        }
        if self.temperature < 0.0 {
            return Err(ConfigError::NegativeTemperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ConfigError::TopPOutOfRange(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(ConfigError::MinPOutOfRange(self.min_p));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(ConfigError::RepeatPenaltyNotPositive(self.repeat_penalty));
        }
        Ok(())
    }
}
