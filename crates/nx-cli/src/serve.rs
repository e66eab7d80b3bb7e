//! `nx serve`: an OpenAI-compatible HTTP server (see the `nx-serve` crate).
//!
//! `nx serve [--model F] [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N]
//! [--kv-memory SIZE] [--max-queue N] [--threads N] [--prefill-chunk N] [--block-size N]
//! [--no-prefix-cache] [--chat-template NAME|FILE] [--model-alias NAME]... [--spec
//! ngram|draft [--draft-model F] [--draft-max K]]` opens the model (the default one in `$NX_CACHE` without `--model`, as `nx run`), starts the
//! engine on its own thread and serves `/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`, `/health`, `/tokenize`, `/detokenize` and `/metrics` until SIGINT or
//! SIGTERM, then exits 0 after the running requests finish (or, after a few seconds,
//! are cancelled). It logs a startup line and one line per request to stderr.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use nx_bpe::Tokenizer;
use nx_run::{ChatTemplate, EngineConfig, TemplateChoice};
use nx_serve::ServeConfig;

use crate::models::{apply_threads, resolve_model};
use crate::weights::open_model;

/// Arguments of `nx serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// GGUF model file (default: $NX_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf, the
    /// default chat model, else $NX_CACHE/models/gemma-3-270m-q4_k_m.gguf, when fetched).
    #[arg(long, short = 'm', value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, value_name = "N", default_value_t = 8080)]
    pub port: u16,
    /// Most sequences generating at once (continuous batching); more wait in the queue.
    #[arg(long, short = 'P', value_name = "N", default_value_t = EngineConfig::default().max_running)]
    pub parallel: usize,
    /// Most positions one request may use (prompt + generated tokens), capped by the
    /// model's trained context.
    #[arg(long, short = 'c', value_name = "N", default_value_t = EngineConfig::default().n_ctx)]
    pub ctx: usize,
    /// Memory for the KV cache shared by all sequences: bytes, or with a K, M or G
    /// suffix (powers of 1024), e.g. 512M, 2G.
    #[arg(long, value_name = "SIZE", default_value = "256M")]
    pub kv_memory: String,
    /// Most requests waiting for a free slot; beyond it requests get 429.
    #[arg(long, value_name = "N", default_value_t = EngineConfig::default().max_queue)]
    pub max_queue: usize,
    #[command(flatten)]
    pub weights: crate::weights::WeightsArgs,
    /// Worker threads of the forward pass (passed on as NX_THREADS).
    #[arg(long, short = 't', value_name = "N")]
    pub threads: Option<usize>,
    /// Most prompt tokens of one request prefilled per step (bounds prefill memory and
    /// how long a long prompt holds up the others).
    #[arg(long, value_name = "N", default_value_t = EngineConfig::default().prefill_chunk)]
    pub prefill_chunk: usize,
    /// Most tokens one step's forward pass processes, decode and prefill together.
    #[arg(long, value_name = "N", default_value_t = EngineConfig::default().step_tokens)]
    pub step_tokens: usize,
    /// Positions per KV block (16 or 32).
    #[arg(long, value_name = "N", default_value_t = EngineConfig::default().block_size)]
    pub block_size: usize,
    /// Don't reuse the KV blocks of earlier requests that share a prompt prefix.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Chat template for /v1/chat/completions: chatml, llama3, gemma, or a Jinja file
    /// (default: the model's own, else the built-in one for its architecture).
    #[arg(long, value_name = "NAME|FILE")]
    pub chat_template: Option<String>,
    /// Another name requests may give as `model` (repeatable); the first one is the id
    /// reported (default id: the model file's name without .gguf).
    #[arg(long = "model-alias", short = 'a', value_name = "NAME")]
    pub model_alias: Vec<String>,
    /// Largest request body accepted, as for --kv-memory.
    #[arg(long, value_name = "SIZE", default_value = "4M")]
    pub max_body: String,
    /// Don't log one line per request to stderr.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
}

/// Parses `1073741824`, `512K`, `512M`, `2G` (also `512MiB`, `2GB`: powers of 1024).
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => bail!("{text:?} is not a size (e.g. 512M, 2G, 1073741824)"),
    };
    let value: f64 = num
        .parse()
        .map_err(|_| anyhow!("{text:?} is not a size (e.g. 512M, 2G, 1073741824)"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        bail!("{text:?} is not a usable size");
    }
    Ok(bytes as u64)
}

fn model_id(path: &Path, aliases: &[String]) -> String {
    if let Some(a) = aliases.first() {
        return a.clone();
    }
    path.file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "nx".to_string())
}

pub fn run(args: &ServeArgs) -> Result<()> {
    apply_threads(args.threads)?;
    let kv_memory = parse_size(&args.kv_memory).context("--kv-memory")?;
    let max_body = parse_size(&args.max_body).context("--max-body")?;
    for (name, v) in [
        ("--parallel", args.parallel),
        ("--ctx", args.ctx),
        ("--prefill-chunk", args.prefill_chunk),
        ("--step-tokens", args.step_tokens),
    ] {
        if v == 0 {
            bail!("{name} must be at least 1");
        }
    }
    if args.block_size != 16 && args.block_size != 32 {
        bail!("--block-size must be 16 or 32");
    }
    let speculation = args.spec.speculation()?;
    let choice = args
        .chat_template
        .as_deref()
        .map(TemplateChoice::parse)
        .transpose()?;

    let path = resolve_model(args.model.as_deref(), crate::models::ModelUse::Chat)?;
    let model = open_model(&path, &args.weights)?;
    let draft = match &args.spec.draft_model {
        Some(p) => Some(open_model(p, &args.weights)?),
        None => None,
    };
    let tokenizer = Arc::new(
        Tokenizer::from_gguf(model.gguf())
            .with_context(|| format!("tokenizer of {}", path.display()))?,
    );
    let template = ChatTemplate::for_model(model.gguf().metadata(), &tokenizer, choice.as_ref())?;
    let n_ctx = args.ctx.min(model.config().n_ctx_train.max(1));
    let engine = EngineConfig {
        n_ctx,
        kv_memory_bytes: kv_memory,
        block_size: args.block_size,
        max_running: args.parallel,
        step_tokens: args.step_tokens,
        prefill_chunk: args.prefill_chunk,
        prefix_cache: !args.no_prefix_cache,
        max_queue: args.max_queue,
        ..EngineConfig::default()
    };
    let id = model_id(&path, &args.model_alias);
    let mut aliases: Vec<String> = args.model_alias.iter().skip(1).cloned().collect();
    let stem = model_id(&path, &[]);
    if stem != id {
        aliases.push(stem);
    }
    let config = ServeConfig {
        host: args.host.clone(),
        port: args.port,
        model_id: id,
        model_aliases: aliases,
        max_body_bytes: usize::try_from(max_body).unwrap_or(usize::MAX),
        engine,
        log_requests: !args.quiet,
        speculation,
        ..ServeConfig::default()
    };
    nx_serve::run(config, model, tokenizer, template, draft)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1073741824").unwrap(), 1 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("5X").is_err());
    }
}
