//! Sampling flags shared by `nx run` and `nx chat`.

use nx_sampler::SamplerConfig;

/// Sampling flags (defaults as llama.cpp's command-line tools).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(
        long,
        value_name = "T",
        default_value_t = 0.8,
        allow_negative_numbers = true
    )]
    pub temp: f32,
    /// Keep only the K most likely tokens (0: off).
    #[arg(long, value_name = "K", default_value_t = SamplerConfig::default().top_k)]
    pub top_k: usize,
    /// Nucleus sampling threshold in (0, 1] (1: off).
    #[arg(long, value_name = "P", default_value_t = SamplerConfig::default().top_p, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0: off).
    #[arg(long, value_name = "P", default_value_t = SamplerConfig::default().min_p, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Penalty on recently seen tokens (1: off).
    #[arg(long, value_name = "X", default_value_t = SamplerConfig::default().repeat_penalty, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// How many recent tokens (prompt or conversation included) the penalty looks at.
    #[arg(long, value_name = "N", default_value_t = SamplerConfig::default().penalty_last_n)]
    pub repeat_last_n: usize,
    /// Seed of the sampler's random generator.
    #[arg(long, value_name = "N", default_value_t = SamplerConfig::default().seed)]
    pub seed: u64,
}

impl SamplingArgs {
    /// The sampler configuration these flags describe (validated by the sampler).
    pub fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            penalty_last_n: self.repeat_last_n,
            seed: self.seed,
            ..SamplerConfig::default()
        }
    }
}
