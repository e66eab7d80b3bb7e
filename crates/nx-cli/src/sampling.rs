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
    /// Add BIAS to token ID's logit before sampling, as llama.cpp's flag does (repeat
    /// for more tokens): `15043+1` favours token 15043, `15043-100` all but bans it.
    #[arg(long, short = 'l', value_name = "ID(+|-)BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// JSON mode: only tokens that keep the answer a prefix of one JSON object may be
    /// chosen (an end-of-generation token only once the object is closed), as the
    /// server's `response_format: {"type": "json_object"}`.
    #[arg(long)]
    pub json_object: bool,
}

/// `ID+BIAS` or `ID-BIAS` (llama.cpp's form) as `(id, ±bias)`.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let split = s
        .find(['+', '-'])
        .filter(|&at| at > 0)
        .ok_or_else(|| format!("`{s}` is not ID+BIAS or ID-BIAS (for example 15043-100)"))?;
    let (id, bias) = s.split_at(split);
    let id: u32 = id
        .parse()
        .map_err(|_| format!("`{id}` in `{s}` is not a token id"))?;
    let bias: f32 = bias
        .strip_prefix('+')
        .unwrap_or(bias)
        .parse()
        .map_err(|_| format!("`{bias}` in `{s}` is not a number"))?;
    if !bias.is_finite() {
        return Err(format!(
            "the bias in `{s}` is not finite (use -100 to ban a token)"
        ));
    }
    Ok((id, bias))
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
            logit_bias: self.logit_bias.clone(),
            ..SamplerConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_logit_bias;

    #[test]
    fn logit_bias_flags_parse_as_llama_cpp_writes_them() {
        assert_eq!(parse_logit_bias("15043+1"), Ok((15043, 1.0)));
        assert_eq!(parse_logit_bias("15043-100"), Ok((15043, -100.0)));
        assert_eq!(parse_logit_bias("7+0.5"), Ok((7, 0.5)));
        for bad in [
            "15043", "-5+1", "+1", "x+1", "15043+", "15043+x", "1-inf", "1+NaN",
        ] {
            assert!(parse_logit_bias(bad).is_err(), "{bad}");
        }
    }
}
