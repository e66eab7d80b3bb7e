//! `nx bench`: prompt-processing and generation speed, like `llama-bench -p P -n N`.
//!
//! - **pp**: prompt tokens per second prefilling a `P`-token prompt into an empty cache,
//!   in chunks of `--prefill-chunk` (default [`nx_run::RunConfig::default_prefill_chunk`]:
//!   256, or 512 for a mixture of experts; llama-bench's micro-batch is 512), with
//!   logits for the last row only. The same run gives **ttft_ms**: prefill plus the
//!   choice of the first token.
//! - **tg**: tokens per second generating `N` tokens greedily after a 1-token prompt,
//!   counting only the `N` single-token decode steps (forward pass and sampling), as
//!   llama-bench's `tg` measures generation alone.
//!
//! The prompt is a fixed sequence of ordinary (non-special) token ids, so runs are
//! comparable. Each figure is the median over `--reps` repetitions; the runner is
//! reset between runs and no stop rule other than the token count applies. Before the
//! timed runs come llama-bench's warm-up runs (one untimed prompt of `P` tokens and
//! one generated token; `--no-warmup` skips them), so that neither engine's figures
//! include the first touch of the model's pages. Peak RSS is the process's high-water
//! mark (`VmHWM`).

use std::path::PathBuf;

use anyhow::{bail, Result};
use nx_bpe::{TokenType, Tokenizer};
use nx_run::{Prompt, RunConfig, Runner, SamplerConfig};
use serde_json::json;

use crate::models::{apply_threads, resolve_model};
use crate::stats::median;
use crate::weights::open_model_with_plan;

/// Arguments of `nx bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// GGUF model file (default: $NX_CACHE/models/gemma-3-270m-q4_k_m.gguf, when fetched).
    #[arg(long, short = 'm', value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Prompt tokens for the prompt-processing test (0 skips it).
    #[arg(
        long = "n-prompt",
        short = 'p',
        value_name = "P",
        default_value_t = 512
    )]
    pub n_prompt: usize,
    /// Tokens to generate for the generation test (0 skips it).
    #[arg(long = "n-gen", short = 'n', value_name = "N", default_value_t = 128)]
    pub n_gen: usize,
    /// Worker threads (passed on as NX_THREADS to the process-wide thread pool).
    #[arg(long, short = 't', value_name = "N")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub weights: crate::weights::WeightsArgs,
    /// Repetitions; each figure is the median.
    #[arg(long, short = 'r', value_name = "R", default_value_t = 3)]
    pub reps: usize,
    #[command(flatten)]
    pub prefill_chunk: crate::models::PrefillChunkArg,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Skip the untimed warm-up runs (a `P`-token prompt and one generated token, as
    /// llama-bench's) that come before the timed ones: the first run then also pays for
    /// mapping the model's pages.
    #[arg(long)]
    pub no_warmup: bool,
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
    /// Batched mode: decode N sequences together for each N in the list (e.g.
    /// `1,2,4,8,16`), each with a P-token prompt and N_GEN tokens, and report the
    /// aggregate prefill and decode rates (like llama-batched-bench). The levels take
    /// turns, one run each per round (`--reps` rounds); "tg vs" is the median of the
    /// rounds' decode-rate ratios to the first level.
    #[arg(long, value_name = "N,N,...")]
    pub parallel: Option<String>,
    /// Print the kernel plan (which bit-identical kernel runs each weight format's decode
    /// and prefill matmuls, and where it came from) before measuring; with -p 0 -n 0,
    /// print it only. `NX_PLAN=retune` times the candidates again.
    #[arg(long)]
    pub show_plan: bool,
    /// Skip the plain-read bandwidth probe (a 1 GiB buffer summed on 1 and on --threads
    /// threads after the runs) that decode's bandwidth is set beside.
    #[arg(long)]
    pub no_probe: bool,
}

/// `n` ordinary token ids spread over the vocabulary (deterministic).
fn bench_ids(n: usize, n_vocab: usize, tokenizer: Option<&Tokenizer>) -> Vec<u32> {
    let ordinary = |id: u32| match tokenizer {
        Some(t) => matches!(t.token_type(id), Ok(TokenType::Normal)) && !t.is_eog(id),
        None => true,
    };
    let mut ids = Vec::with_capacity(n);
    // A stride coprime with most vocabulary sizes walks the whole vocabulary.
    let mut id = 1000 % n_vocab as u64;
    let mut tried = 0usize;
    while ids.len() < n {
        if ordinary(id as u32) || tried > 4 * n_vocab {
            ids.push(id as u32);
        }
        tried += 1;
        id = (id + 7919) % n_vocab as u64;
    }
    ids
}

/// Peak resident set size in MB (`VmHWM`), if the platform reports it.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

pub fn run(args: &BenchArgs) -> Result<()> {
    apply_threads(args.threads)?;
    check_args(args)?;
    let path = resolve_model(args.model.as_deref(), crate::models::ModelUse::Text)?;
    let opened = std::time::Instant::now();
    let (model, plan) = open_model_with_plan(&path, &args.weights)?;
    let open_s = opened.elapsed().as_secs_f64();
    let weights = model.gguf().placement().name();
    if args.show_plan {
        print!("{}", crate::kernel_plan::describe(&plan));
        if args.n_prompt == 0 && args.n_gen == 0 {
            return Ok(());
        }
    }
    if let Some(list) = &args.parallel {
        return run_batched(args, &path, &model, &crate::batched::parse_levels(list)?);
    }
    let n_vocab = model.config().n_vocab;
    // The tokenizer only helps pick ordinary ids; a model without one still benches.
    let tokenizer = Tokenizer::from_gguf(model.gguf()).ok();
    let prompt = bench_ids(args.n_prompt.max(1), n_vocab, tokenizer.as_ref());
    // Without a tokenizer the runner knows no end-of-generation token: only the token
    // count stops a run, as in llama-bench.
    let prefill_chunk = args.prefill_chunk.for_model(&model);
    let config = RunConfig {
        prefill_chunk,
        n_ctx: (args.n_prompt + 1).max(args.n_gen + 2),
        max_tokens: 1,
        // llama-bench computes no log-probabilities either.
        token_logprobs: false,
        sampler: SamplerConfig::greedy(),
        // Every repetition computes its prompt: no rows from the previous one.
        prefix_cache: false,
        speculation: args.spec.speculation()?,
        ..RunConfig::default()
    };
    let mut runner = args
        .spec
        .attach(Runner::new(model, None, config)?, &args.weights)?;
    let (pp, ttft, tg) = measure(&mut runner, &prompt, args)?;
    // Before the probe, whose buffer would count in the high-water mark.
    let peak_rss = peak_rss_mb();
    let threads = args.threads.unwrap_or_else(nx_syscalls::threads_from_env);
    let decode_bytes = runner.model().decode_bytes_per_token();
    let probe = (tg.is_some() && !args.no_probe)
        .then(|| nx_syscalls::read_bandwidth(nx_syscalls::PROBE_BYTES, threads));
    let report = Report {
        model: path.display().to_string(),
        threads,
        prefill_chunk,
        pp,
        ttft,
        tg,
        peak_rss,
        decode_bytes,
        decode_gbs: tg.map(|t| decode_bytes as f64 * t / 1e9),
        probe,
        kernel_plan: plan.plan.to_spec(),
        weights,
        open_s,
    };
    if args.json {
        println!("{}", report.json(args));
    } else {
        report.print(args);
    }
    Ok(())
}

fn check_args(args: &BenchArgs) -> Result<()> {
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    args.prefill_chunk.check()?;
    if args.n_prompt == 0 && args.n_gen == 0 && !args.show_plan {
        bail!("nothing to measure: -p and -n are both 0");
    }
    Ok(())
}

/// The medians of prompt tok/s, TTFT (ms) and generation tok/s over `--reps` runs, after
/// one untimed warm-up of each (unless `--no-warmup`).
fn measure(
    runner: &mut Runner,
    prompt: &[u32],
    args: &BenchArgs,
) -> Result<(Option<f64>, Option<f64>, Option<f64>)> {
    let ignore = |_| std::ops::ControlFlow::Continue(());
    if !args.no_warmup {
        if args.n_prompt > 0 {
            runner.set_max_tokens(1);
            runner.generate(Prompt::Ids(prompt[..args.n_prompt].to_vec()), ignore)?;
        }
        if args.n_gen > 0 {
            runner.set_max_tokens(2);
            runner.generate(Prompt::Ids(vec![prompt[0]]), ignore)?;
        }
    }
    let (mut pp, mut ttft, mut tg) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.reps {
        if args.n_prompt > 0 {
            runner.set_max_tokens(1);
            let c = runner.generate(Prompt::Ids(prompt[..args.n_prompt].to_vec()), ignore)?;
            pp.push(c.stats.prompt_tps);
            ttft.push(c.stats.ttft_ms);
        }
        if args.n_gen > 0 {
            // The first token comes from the prompt's logits; the N after it are timed.
            runner.set_max_tokens(args.n_gen + 1);
            let c = runner.generate(Prompt::Ids(vec![prompt[0]]), ignore)?;
            tg.push(c.stats.gen_tps);
        }
    }
    Ok((median(pp), median(ttft), median(tg)))
}

/// What one `nx bench` run measured.
struct Report {
    model: String,
    threads: usize,
    prefill_chunk: usize,
    pp: Option<f64>,
    ttft: Option<f64>,
    tg: Option<f64>,
    peak_rss: Option<f64>,
    decode_bytes: u64,
    decode_gbs: Option<f64>,
    probe: Option<nx_syscalls::ReadBandwidth>,
    kernel_plan: String,
    weights: &'static str,
    open_s: f64,
}

impl Report {
    /// `--json`: one object.
    fn json(&self, args: &BenchArgs) -> serde_json::Value {
        json!({
            "model": self.model,
            "threads": self.threads,
            "prefill_chunk": self.prefill_chunk,
            "pp_tokens": args.n_prompt,
            "tg_tokens": args.n_gen,
            "pp_tps": self.pp,
            "tg_tps": self.tg,
            "ttft_ms": self.ttft,
            "peak_rss_mb": self.peak_rss,
            "reps": args.reps,
            "warmup": !args.no_warmup,
            "decode_bytes_per_token": self.decode_bytes,
            "decode_gbs": self.decode_gbs,
            "read_gbs_1_thread": self.probe.map(|p| p.single_thread_gbs),
            "read_gbs": self.probe.map(|p| p.multi_thread_gbs),
            "kernel_plan": self.kernel_plan,
            "weights": self.weights,
            "open_s": self.open_s,
        })
    }

    /// The table llama-bench users know, then memory and bandwidth.
    fn print(&self, args: &BenchArgs) {
        let fmt = |x: Option<f64>, digits: usize| match x {
            Some(v) => format!("{v:.digits$}"),
            None => "-".to_string(),
        };
        let threads = self.threads;
        println!("model: {}", self.model);
        println!(
            "threads: {threads}   reps: {}   prefill chunk: {}   warm-up: {}",
            args.reps,
            self.prefill_chunk,
            if args.no_warmup { "no" } else { "yes" }
        );
        println!(
            "weights: {}   model opened in {:.2} s",
            self.weights, self.open_s
        );
        println!("{:<10} {:>12}", "test", "t/s (median)");
        if args.n_prompt > 0 {
            println!(
                "{:<10} {:>12}",
                format!("pp{}", args.n_prompt),
                fmt(self.pp, 2)
            );
        }
        if args.n_gen > 0 {
            println!(
                "{:<10} {:>12}",
                format!("tg{}", args.n_gen),
                fmt(self.tg, 2)
            );
        }
        if args.n_prompt > 0 {
            println!("ttft:      {} ms", fmt(self.ttft, 1));
        }
        println!("peak RSS:  {} MB", fmt(self.peak_rss, 1));
        if let Some(gbs) = self.decode_gbs {
            println!(
                "decode:    {:.1} MB per token, {gbs:.1} GB/s",
                self.decode_bytes as f64 / 1e6
            );
        }
        if let (Some(p), Some(gbs)) = (self.probe, self.decode_gbs) {
            println!(
                "plain read ({} MiB): {:.1} GB/s on 1 thread, {:.1} GB/s on {threads}: decode at {:.0} %",
                p.buffer_bytes >> 20,
                p.single_thread_gbs,
                p.multi_thread_gbs,
                100.0 * gbs / p.multi_thread_gbs
            );
        }
    }
}

/// `--parallel`: the batched table.
fn run_batched(
    args: &BenchArgs,
    path: &std::path::Path,
    model: &std::sync::Arc<nx_run::Model>,
    levels: &[usize],
) -> Result<()> {
    if args.n_prompt == 0 || args.n_gen == 0 {
        bail!("--parallel needs -p and -n above 0");
    }
    let n_vocab = model.config().n_vocab;
    let tokenizer = Tokenizer::from_gguf(model.gguf()).ok();
    let max = levels.iter().copied().max().unwrap_or(1);
    let all = bench_ids(args.n_prompt * max + max, n_vocab, tokenizer.as_ref());
    let threads = args.threads.unwrap_or_else(nx_syscalls::threads_from_env);
    // Distinct prompts: shifted windows of one long id sequence.
    let prompts: Vec<Vec<Vec<u32>>> = levels
        .iter()
        .map(|&n| {
            (0..n)
                .map(|i| all[i * args.n_prompt + i..(i + 1) * args.n_prompt + i].to_vec())
                .collect()
        })
        .collect();
    let rows = crate::batched::run_levels(
        model,
        &prompts,
        args.n_gen,
        args.prefill_chunk.for_model(model),
        args.reps,
    )?;
    if args.json {
        let levels: Vec<_> = rows
            .iter()
            .map(|l| json!({"n_seqs": l.n_seqs, "pp_tps": l.pp_tps, "tg_tps": l.tg_tps, "total_tps": l.total_tps, "tg_vs_first": l.tg_vs_first}))
            .collect();
        println!(
            "{}",
            json!({"model": path.display().to_string(), "threads": threads, "pp_tokens": args.n_prompt, "tg_tokens": args.n_gen, "reps": args.reps, "levels": levels})
        );
        return Ok(());
    }
    println!("model: {}", path.display());
    println!(
        "threads: {threads}   reps: {}   prompt: {} tokens   generation: {} tokens per sequence",
        args.reps, args.n_prompt, args.n_gen
    );
    println!(
        "{:>6} {:>12} {:>12} {:>12} {:>10}",
        "seqs",
        "pp t/s",
        "tg t/s",
        "total t/s",
        format!("tg vs {}", levels[0])
    );
    for l in &rows {
        println!(
            "{:>6} {:>12.1} {:>12.1} {:>12.1} {:>9.2}x",
            l.n_seqs, l.pp_tps, l.tg_tps, l.total_tps, l.tg_vs_first
        );
    }
    Ok(())
}
