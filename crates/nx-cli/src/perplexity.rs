//! `nx perplexity`: a model's perplexity on a text file, computed like llama.cpp's
//! `llama-perplexity`.
//!
//! `nx perplexity [--model F] --file TEXT [-c 512] [--batch N] [--threads N] [--chunks N]
//! [--kv-type f16|f32]` tokenizes the whole file (BOS added as the vocabulary asks),
//! scores the second half of each non-overlapping window of `-c` tokens (see
//! `nx_run::perplexity` for the exact rules), prints llama.cpp's running estimate
//! `[1]12.3456,[2]…` on stderr as windows finish, and at the end
//! `Final estimate: PPL = X +/- Y` on stdout.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nx_bpe::Tokenizer;
use nx_run::perplexity::MIN_N_CTX;
use nx_run::{
    perplexity, ChunkProgress, KvDtype, Model, PerplexityConfig, PerplexityError, PerplexityReport,
};

use crate::models::resolve_model;

/// Storage type of the KV cache.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    /// Half precision (llama.cpp's default).
    F16,
    /// Full precision.
    F32,
}

/// Arguments of `nx perplexity`.
#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    /// GGUF model file (default: $NX_CACHE/models/gemma-3-270m-q4_k_m.gguf, when fetched).
    #[arg(long, short = 'm', value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// The text to score.
    #[arg(long = "file", short = 'f', value_name = "FILE")]
    pub file: PathBuf,
    /// Window length in tokens; the second half of each window is scored.
    #[arg(
        long = "ctx-size",
        short = 'c',
        value_name = "N",
        default_value_t = 512
    )]
    pub ctx_size: usize,
    /// Tokens per forward pass while filling a window (at most the window length).
    #[arg(long, short = 'b', value_name = "N", default_value_t = 512)]
    pub batch: usize,
    /// Worker threads (default: NX_THREADS, else every CPU).
    #[arg(long, short = 't', value_name = "N")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub weights: crate::weights::WeightsArgs,
    /// Score at most N windows (default: all that fit in the text).
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,
    /// KV cache storage type.
    #[arg(long, value_enum, value_name = "TYPE", default_value = "f16")]
    pub kv_type: KvType,
}

/// Runs `nx perplexity`.
pub fn run(args: &PerplexityArgs) -> Result<()> {
    check_args(args)?;
    // Read the text before loading the model, so a bad file fails fast.
    let text = read_text(&args.file)?;

    let path = resolve_model(args.model.as_deref(), crate::models::ModelUse::Text)?;
    let mut model = Model::open_placed(&path, args.weights.placement(&path).0)
        .with_context(|| format!("{}", path.display()))?;
    if let Some(n) = args.threads {
        model.set_threads(n);
    }
    let tokenizer = Tokenizer::from_gguf(model.gguf())
        .with_context(|| format!("{}: reading the tokenizer", path.display()))?;
    let config = PerplexityConfig {
        n_ctx: args.ctx_size,
        batch: args.batch,
        max_chunks: args.chunks,
        kv_dtype: match args.kv_type {
            KvType::F16 => KvDtype::F16,
            KvType::F32 => KvDtype::F32,
        },
    };
    let header = format!(
        "perplexity: {} on {}: windows of {} tokens, batch {}, {} threads, {} KV cache",
        path.display(),
        args.file.display(),
        config.n_ctx,
        config.batch.min(config.n_ctx),
        model.threads(),
        config.kv_dtype.name(),
    );

    let mut stderr = std::io::stderr();
    let model = std::sync::Arc::new(model);
    let report = perplexity(&model, &tokenizer, &text, &config, |p| {
        print_progress(&mut stderr, &header, p)
    })
    .with_context(|| format!("{}", args.file.display()))?;
    print_report(&report)
}

/// The flags' ranges, checked before anything is read.
fn check_args(args: &PerplexityArgs) -> Result<()> {
    if args.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    if args.ctx_size < MIN_N_CTX {
        bail!("--ctx-size must be at least {MIN_N_CTX}");
    }
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if args.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    Ok(())
}

/// One window's progress on stderr, as llama-perplexity prints it (`[k]ppl,`), with the
/// header and an estimate of the whole run's time after the first window: printed only
/// then, so that input the library rejects before any work (a text too short) leaves
/// only the error line.
fn print_progress(stderr: &mut std::io::Stderr, header: &str, p: &ChunkProgress) {
    if p.chunk == 0 {
        let eta = p.elapsed.as_secs_f64() * p.n_chunks as f64;
        let _ = writeln!(
            stderr,
            "{header}\nperplexity: {} windows, {:.2} s per window, ETA {:.1} s",
            p.n_chunks,
            p.elapsed.as_secs_f64(),
            eta
        );
    }
    let _ = write!(stderr, "[{}]{:.4},", p.chunk + 1, p.running_ppl);
    let _ = stderr.flush();
}

/// The closing lines: the counts and speed on stderr, the estimate on stdout.
fn print_report(report: &PerplexityReport) -> Result<()> {
    eprintln!();
    let secs = report.elapsed.as_secs_f64();
    eprintln!(
        "perplexity: {} tokens in the text, {} scored in {} windows, {:.2} s ({:.1} tokens/s evaluated)",
        report.n_tokens,
        report.count,
        report.n_chunks,
        secs,
        (report.n_chunks * report.n_ctx) as f64 / secs.max(1e-9),
    );
    let mut stdout = std::io::stdout().lock();
    match report.ppl_error {
        Some(err) => writeln!(
            stdout,
            "Final estimate: PPL = {:.4} +/- {:.5}",
            report.ppl, err
        )?,
        // llama.cpp prints no figure when the variance is not positive.
        None => writeln!(stdout, "Final estimate: PPL = {:.4}", report.ppl)?,
    }
    Ok(())
}

/// Reads the text file as bytes (like llama.cpp; the tokenizer judges the encoding) and
/// rejects an empty one before any model is loaded.
fn read_text(path: &Path) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    if bytes.strip_suffix(b"\n").unwrap_or(&bytes).is_empty() {
        return Err(PerplexityError::EmptyText).with_context(|| format!("{}", path.display()));
    }
    Ok(bytes)
}
