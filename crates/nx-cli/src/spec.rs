//! `--spec`, `--draft-model`, `--draft-max`: speculative decoding flags of `nx run` and
//! `nx bench`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use nx_run::{DraftSource, Runner, Speculation};

/// Speculative decoding flags. The output is the same with and without them.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Speculative decoding: `ngram` (prompt lookup: copies what followed the latest
    /// earlier occurrence of the last tokens) or `draft` (a smaller model with the same
    /// vocabulary guesses, see --draft-model). The target checks every guess in one
    /// forward pass; the output is bit-identical to decoding without it.
    #[arg(long, value_name = "ngram|draft")]
    pub spec: Option<String>,
    /// The draft model of `--spec draft` (a GGUF with the target's vocabulary).
    #[arg(long, value_name = "FILE")]
    pub draft_model: Option<PathBuf>,
    /// Most draft tokens checked per forward pass (1-32; the length adapts below it).
    /// Passes of 2, 4, 8 or 16 rows (K = 1, 3, 7, 15) fill the matmul's token tiles.
    #[arg(long, value_name = "K", default_value_t = nx_serve::params::DEFAULT_DRAFT_MAX)]
    pub draft_max: usize,
}

impl SpecArgs {
    /// The speculation the flags ask for (`None` without `--spec`).
    pub fn speculation(&self) -> Result<Option<Speculation>> {
        let Some(name) = &self.spec else {
            if self.draft_model.is_some() {
                bail!("--draft-model needs --spec draft");
            }
            return Ok(None);
        };
        let Some(source) = DraftSource::from_name(name) else {
            bail!("--spec {name:?}: expected `ngram` or `draft`");
        };
        match (source, &self.draft_model) {
            (DraftSource::Model, None) => bail!("--spec draft needs --draft-model FILE"),
            (DraftSource::Ngram, Some(_)) => bail!("--draft-model is only for --spec draft"),
            _ => {}
        }
        let spec = Speculation {
            source,
            draft_max: self.draft_max,
        };
        spec.validate().context("--draft-max")?;
        Ok(Some(spec))
    }

    /// `runner` with the draft model attached, when `--spec draft` asks for one.
    pub fn attach(&self, runner: Runner, weights: &crate::weights::WeightsArgs) -> Result<Runner> {
        match &self.draft_model {
            Some(path) => {
                let draft = crate::weights::open_model(path, weights)?;
                runner
                    .with_draft_model(draft)
                    .with_context(|| format!("draft model {}", path.display()))
            }
            None => Ok(runner),
        }
    }
}
