//! Which model a command opens and how it runs it: the defaults under `$NX_CACHE`, the
//! `--threads` flag and the `--prefill-chunk` flag, shared by every command.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use nx_run::{Model, RunConfig};

/// File name of the default model under `$NX_CACHE/models`.
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// File name of the default chat model under `$NX_CACHE/models` (an instruction-tuned
/// model with a chat template; the default model is a base model that never ends a turn).
pub const CHAT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// What the model is for when none is given: plain text continues with the default
/// model, conversations take the default chat model (falling back to the default model
/// when only that one is fetched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelUse {
    /// Completion, benchmarks, perplexity.
    Text,
    /// `nx chat`, `nx run --chat`, `nx serve`.
    Chat,
}

/// `$NX_CACHE`, or `~/.cache/nx`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("NX_CACHE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache").join("nx")
        }
    }
}

/// The model to open: the one given, or the default (chat) model for `purpose` when it
/// has been fetched.
pub fn resolve_model(given: Option<&Path>, purpose: ModelUse) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let models = cache_dir().join("models");
    let candidates: &[&str] = match purpose {
        ModelUse::Text => &[DEFAULT_MODEL_FILE],
        ModelUse::Chat => &[CHAT_MODEL_FILE, DEFAULT_MODEL_FILE],
    };
    match candidates
        .iter()
        .map(|f| models.join(f))
        .find(|p| p.is_file())
    {
        Some(path) => Ok(path),
        None => {
            bail!("no --model given and the default model is not fetched; run `cargo xtask fetch`")
        }
    }
}

/// Makes `--threads` reach the process-wide pool, which reads `NX_THREADS` when it is
/// first created. Called at the start of a command, before any thread exists.
pub fn apply_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        std::env::set_var("NX_THREADS", n.to_string());
    }
    Ok(())
}

/// `--prefill-chunk`, for the commands that read prompts.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct PrefillChunkArg {
    /// Most prompt tokens one forward pass processes (bounds prefill memory; the output
    /// is the same for any value) [default: 256, or 512 for a mixture-of-experts model]
    #[arg(long = "prefill-chunk", value_name = "N")]
    pub tokens: Option<usize>,
}

impl PrefillChunkArg {
    /// Refuses 0.
    pub fn check(&self) -> Result<()> {
        if self.tokens == Some(0) {
            bail!("--prefill-chunk must be at least 1");
        }
        Ok(())
    }

    /// The value given, or `model`'s default ([`RunConfig::default_prefill_chunk`]).
    pub fn for_model(&self, model: &Model) -> usize {
        self.tokens
            .unwrap_or_else(|| RunConfig::default_prefill_chunk(model.config()))
    }
}
