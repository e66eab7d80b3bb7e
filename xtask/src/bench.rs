//! `cargo xtask bench`: nx against llama.cpp's `llama-bench` on the same files and threads.
//!
//! For every model file the two engines run alternately, `--reps` times each, one process
//! per run, so neither gets a systematically warmer or quieter machine:
//!
//! - nx: `nx bench --model F -p P -n N --threads T --reps 1 --json` (release build);
//! - llama.cpp: `llama-bench -m F -t T -p P -n N -r 1 --repack 1 -o json` on the first
//!   build that runs with repacking on ([`choose_llama_bench`]: the pinned one, else a
//!   copy without AMX, for CPUs where its AMX kernels fault), and the same with
//!   `--repack 0` ([`llama_variants`]). Per file and test the faster of the two medians is
//!   compared ([`best_of`]): llama.cpp at its best, whichever way its repacked layouts
//!   fall on the CPU.
//!
//! Reported per engine: the median prompt-processing and generation speed (t/s), the
//! median peak RSS of the process (`/usr/bin/time -f %M` when present, else polling
//! `VmHWM`), and time to first token (TTFT). nx measures its TTFT itself; llama-bench does
//! not, so for llama.cpp it is *derived* as `P / pp_tps + 1 / tg_tps` (prefill plus one
//! decode step). A single-core and a `T`-thread read-bandwidth probe (summing a 1 GiB
//! buffer) put nx's effective decode bandwidth, weight bytes read per token times tg t/s,
//! in context.
//!
//! Output: a markdown table on stdout, JSON in `target/bench/bench-<date>.json`, and (except
//! with `--quick`) the table with its context in `docs/benchmarks.md`.

use crate::fetch::{default_model_path, ensure_model};
use crate::machine::{cpu_model, load_average, target_dir, utc_date_time, vm_hwm_kib};
use crate::reference::{ensure_reference, llama_bin, DEFAULT_JOBS};
use crate::synth;
use crate::util::{cargo_command, duration_text, run_checked, workspace_root};
use anyhow::{bail, Context, Result};
use nx_gguf::Gguf;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The files benched by default: the real default model, the two Qwen2.5-shaped
/// synthetic files and the 2 GB Qwen3-MoE one (`cargo xtask synth --shape ...`, run by
/// the bench for a file that is missing).
pub const DEFAULT_MODELS: [&str; 4] = ["default", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen3moe-2b"];
/// The files of `cargo xtask bench --formats`: the Qwen2.5-0.5B shapes in nx's Q4_K_M mix
/// (the bandwidth yardstick) and as llama-quantize makes five other file types of them,
/// and the Qwen2.5-1.5B shapes as it makes three grid file types (with an importance matrix)
/// and Q2_K.
pub const FORMAT_MODELS: [&str; 10] = [
    "qwen2.5-0.5b",
    "qwen2.5-0.5b-Q4_0",
    "qwen2.5-0.5b-Q8_0",
    "qwen2.5-0.5b-Q3_K_M",
    "qwen2.5-0.5b-Q5_K_M",
    "qwen2.5-0.5b-IQ4_XS",
    "qwen2.5-1.5b-IQ2_XXS",
    "qwen2.5-1.5b-IQ3_S",
    "qwen2.5-1.5b-IQ1_M",
    "qwen2.5-1.5b-Q2_K",
];
/// Default repetitions per engine and file.
pub const DEFAULT_REPS: usize = 3;
/// Default worker threads for both engines (the dev machines have two cores).
pub const DEFAULT_THREADS: usize = 2;
/// Size of the buffer the read-bandwidth probe sums: far larger than any cache.
pub const PROBE_BYTES: usize = nx_syscalls::PROBE_BYTES;

/// GNU time, used to read a child's peak RSS (`%M`, in KiB).
const TIME_BIN: &str = "/usr/bin/time";

/// What `cargo xtask bench` was asked to do.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// Runs per engine and file; each figure is the median.
    pub reps: usize,
    /// Smoke test: -p 128 -n 32, one rep, and `docs/benchmarks.md` left alone.
    pub quick: bool,
    /// `default` (the pinned Gemma 3 270M) or synth shape names.
    pub models: Vec<String>,
    /// Worker threads for both engines.
    pub threads: usize,
    /// Use the existing `target/release/nx` instead of building it first.
    pub no_build: bool,
    /// The file-type comparison ([`FORMAT_MODELS`]) into a section of its own.
    pub formats: bool,
}

/// The benchmark parameters that follow from [`BenchArgs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Settings {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub reps: usize,
    pub threads: usize,
}

impl Settings {
    pub fn from_args(args: &BenchArgs) -> Result<Settings> {
        if args.threads == 0 {
            bail!("--threads must be at least 1");
        }
        if args.quick {
            return Ok(Settings {
                n_prompt: 128,
                n_gen: 32,
                reps: 1,
                threads: args.threads,
            });
        }
        if args.reps == 0 {
            bail!("--reps must be at least 1");
        }
        Ok(Settings {
            n_prompt: 512,
            n_gen: 128,
            reps: args.reps,
            threads: args.threads,
        })
    }
}

/// One run of one engine on one file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub pp_tps: f64,
    pub tg_tps: f64,
    /// Measured by nx; `None` for llama.cpp (derived later from the medians).
    pub ttft_ms: Option<f64>,
    /// Peak RSS of the process as measured from outside (MB = 2^20 bytes).
    pub peak_rss_mb: Option<f64>,
    /// Peak RSS the process reported itself (nx only).
    pub self_reported_rss_mb: Option<f64>,
    /// Wall time of the whole process, load and warm-up included.
    pub wall_s: f64,
    /// llama.cpp's `--repack` setting of the run; `None` for nx.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llama_repack: Option<bool>,
}

/// Medians over one engine's samples on one file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineSummary {
    pub pp_tps: f64,
    pub tg_tps: f64,
    pub ttft_ms: f64,
    /// True when `ttft_ms` is computed from pp and tg speed rather than measured.
    pub ttft_derived: bool,
    pub peak_rss_mb: Option<f64>,
    pub samples: Vec<Sample>,
}

/// Everything measured on one file.
#[derive(Debug, Clone, Serialize)]
pub struct ModelResult {
    pub name: String,
    pub path: String,
    pub file_bytes: u64,
    /// Weight bytes one decode step reads (see [`decode_bytes_per_token`]).
    pub decode_bytes_per_token: u64,
    pub nx: EngineSummary,
    /// llama.cpp at its best: per test the faster of its configurations' medians.
    pub llama_cpp: EngineSummary,
    /// Each llama.cpp configuration's medians, in the order they ran.
    pub llama_cpp_configs: Vec<LlamaConfigResult>,
    /// The `--repack` setting whose median pp (and tg) is in `llama_cpp`.
    pub llama_cpp_pp_repack: bool,
    pub llama_cpp_tg_repack: bool,
    /// nx ÷ llama.cpp; above 1 means nx is faster.
    pub pp_ratio: f64,
    pub tg_ratio: f64,
    /// `decode_bytes_per_token × tg t/s`, in GB/s (10^9 bytes).
    pub nx_decode_gbs: f64,
    pub llama_cpp_decode_gbs: f64,
}

/// One llama.cpp configuration's medians on one file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlamaConfigResult {
    pub repack: bool,
    pub pp_tps: f64,
    pub tg_tps: f64,
    pub peak_rss_mb: Option<f64>,
}

/// The read-bandwidth probe's result (GB/s = 10^9 bytes per second, best of 3 passes).
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub buffer_bytes: usize,
    pub single_thread_gbs: f64,
    pub threads: usize,
    pub multi_thread_gbs: f64,
}

/// The whole report, as written to `target/bench/bench-<date>.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub command: String,
    pub date: String,
    pub time_utc: String,
    pub cpu: String,
    pub logical_cpus: usize,
    pub load_average_before: String,
    pub load_average_after: String,
    pub settings: Settings,
    pub quick: bool,
    pub nx_command: String,
    pub llama_cpp_command: String,
    /// Which llama.cpp configuration ran ([`choose_llama_bench`]), and the others beside
    /// it ([`llama_variants`]), in words.
    pub llama_cpp_config: String,
    pub rss_method: String,
    pub probe: Probe,
    pub models: Vec<ModelResult>,
}

/// `cargo xtask bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let settings = Settings::from_args(args)?;
    if args.models.is_empty() {
        bail!("--models names no model");
    }
    let started = Instant::now();
    let load_before = load_average();

    // Resolve every file first, so a missing shape fails before minutes of benching.
    let mut files = Vec::new();
    for name in &args.models {
        let path = resolve_model(name)?;
        files.push((name.clone(), path));
    }
    let target_dir = target_dir()?;
    let nx = target_dir.join("release").join("nx");
    if args.no_build {
        if !nx.is_file() {
            bail!("--no-build: {} does not exist", nx.display());
        }
    } else {
        eprintln!("bench: building nx (release)");
        run_checked(cargo_command().args(["build", "--release", "-p", "nx-cli", "--bin", "nx"]))?;
    }
    let llama = choose_llama_bench(&files[0].1, settings.threads)?;
    let llamas = llama_variants(&llama);
    let llama_config = llama_config_text(&llamas);
    eprintln!("bench: llama.cpp configuration: {llama_config}");

    eprintln!(
        "bench: read-bandwidth probe ({} MiB, 1 and {} threads, best of 3)",
        PROBE_BYTES >> 20,
        settings.threads
    );
    let probe = read_bandwidth_probe(PROBE_BYTES, settings.threads);
    eprintln!(
        "bench: probe {:.1} GB/s (1 thread), {:.1} GB/s ({} threads)",
        probe.single_thread_gbs, probe.multi_thread_gbs, probe.threads
    );

    let mut models = Vec::new();
    for (name, path) in &files {
        models.push(bench_file(name, path, &nx, &llamas, &settings)?);
    }

    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (date, time_utc) = utc_date_time(now);
    let report = Report {
        command: command_line(args, &settings),
        date: date.clone(),
        time_utc,
        cpu: cpu_model(),
        logical_cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average_before: load_before,
        load_average_after: load_average(),
        settings,
        quick: args.quick,
        nx_command: nx_args(Path::new("F"), &settings).join(" "),
        llama_cpp_command: llama_args(Path::new("F"), &settings, llama.repack).join(" "),
        llama_cpp_config: llama_config,
        rss_method: rss_method().to_string(),
        probe,
        models,
    };

    let table = markdown_table(&report);
    println!("{}", summary_lines(&report));
    println!();
    println!("{table}{}", config_paragraph(&report));

    let bench_dir = target_dir.join("bench");
    write_json(&report, &bench_dir, &date, args.quick)?;
    if args.quick {
        eprintln!("bench: --quick leaves docs/benchmarks.md alone");
    } else {
        write_docs(&report, &table, args.formats)?;
    }
    eprintln!("bench: done in {}", duration_text(started.elapsed()));
    Ok(())
}

/// The report as JSON under `bench_dir` (`bench-DATE[-quick].json`).
fn write_json(report: &Report, bench_dir: &Path, date: &str, quick: bool) -> Result<()> {
    std::fs::create_dir_all(bench_dir)
        .with_context(|| format!("cannot create {}", bench_dir.display()))?;
    let suffix = if quick { "-quick" } else { "" };
    let json_path = bench_dir.join(format!("bench-{date}{suffix}.json"));
    let json = serde_json::to_string_pretty(report).context("cannot encode the report")?;
    std::fs::write(&json_path, json + "\n")
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    eprintln!("bench: wrote {}", json_path.display());
    Ok(())
}

/// Writes `docs/benchmarks.md`: the formats section (`--formats`), a variant's section
/// (a run pinned with `NX_TIER` or with other than [`DEFAULT_THREADS`] threads), or the
/// main table, keeping every other command's section.
fn write_docs(report: &Report, table: &str, formats: bool) -> Result<()> {
    let docs = workspace_root().join("docs").join("benchmarks.md");
    let old = std::fs::read_to_string(&docs).unwrap_or_default();
    if formats {
        return write_formats_section(&docs, &old, report, table);
    }
    let tier = crate::sections::pinned_tier()?;
    let threads = report.settings.threads;
    if tier.is_some() || threads != DEFAULT_THREADS {
        // A variant keeps the main table: it has a section of its own.
        let (begin, end) = variant_markers(tier, threads);
        let section = format!(
            "{begin}\n## {}\n\n\
             The same files and method as the main table; llama.cpp: {}.\n\n{}\n\n{table}{}{end}\n",
            variant_heading(tier, threads),
            report.llama_cpp_config,
            summary_lines(report),
            config_paragraph(report),
        );
        let text = crate::util::replace_doc_section(&old, &begin, &end, &section);
        std::fs::write(&docs, text).with_context(|| format!("cannot write {}", docs.display()))?;
        eprintln!("bench: wrote the section `{begin}` of {}", docs.display());
        return Ok(());
    }
    // Every marked section of the old file (the loadtest's, `--spec`'s, the variants' and
    // the file types') survives a new main table, in its old order.
    let mut text = benchmarks_doc(report, table);
    for (begin, end) in crate::util::doc_section_markers(&old) {
        if let Some(section) = crate::util::doc_section(&old, &begin, &end) {
            text = crate::util::replace_doc_section(&text, &begin, &end, section);
        }
    }
    std::fs::write(&docs, text).with_context(|| format!("cannot write {}", docs.display()))?;
    eprintln!("bench: wrote {}", docs.display());
    Ok(())
}

pub(crate) fn resolve_model(name: &str) -> Result<PathBuf> {
    if name == "default" {
        if !default_model_path().is_file() {
            eprintln!("bench: fetching the default model");
        }
        return ensure_model();
    }
    eprintln!("bench: making sure synth shape {name} is present (generates it if missing)");
    synth::ensure(name)
}

/// Runs both engines `reps` times on one file, alternating, and summarises.
fn bench_file(
    name: &str,
    path: &Path,
    nx: &Path,
    llamas: &[LlamaBench],
    settings: &Settings,
) -> Result<ModelResult> {
    let gguf = Gguf::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let decode_bytes = decode_bytes_per_token(gguf.tensors(), active_experts(&gguf));
    drop(gguf);
    let file_bytes = std::fs::metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();

    let (mut nx_samples, mut llama_samples) = (Vec::new(), Vec::new());
    for rep in 1..=settings.reps {
        let tag = format!("{name} rep {rep}/{}", settings.reps);
        eprintln!("bench: [{tag}] nx ...");
        let s = run_nx(nx, path, settings)?;
        eprintln!("bench: [{tag}] nx        {}", sample_text(&s, settings));
        nx_samples.push(s);
        for llama in llamas {
            let repack = u8::from(llama.repack);
            eprintln!("bench: [{tag}] llama.cpp --repack {repack} ...");
            let s = run_llama(llama, path, settings)?;
            eprintln!("bench: [{tag}] llama.cpp {}", sample_text(&s, settings));
            llama_samples.push(s);
        }
    }
    let nx_summary = summarize(nx_samples, settings.n_prompt)?;
    let best = best_of(llamas, llama_samples, settings.n_prompt)?;
    let llama_summary = best.summary;
    let gbs = |tps: f64| decode_bytes as f64 * tps / 1e9;
    Ok(ModelResult {
        name: name.to_string(),
        path: path.display().to_string(),
        file_bytes,
        decode_bytes_per_token: decode_bytes,
        pp_ratio: nx_summary.pp_tps / llama_summary.pp_tps,
        tg_ratio: nx_summary.tg_tps / llama_summary.tg_tps,
        nx_decode_gbs: gbs(nx_summary.tg_tps),
        llama_cpp_decode_gbs: gbs(llama_summary.tg_tps),
        nx: nx_summary,
        llama_cpp: llama_summary,
        llama_cpp_configs: best.configs,
        llama_cpp_pp_repack: best.pp_repack,
        llama_cpp_tg_repack: best.tg_repack,
    })
}

/// llama.cpp's configurations on one file, and the best of them per test.
#[derive(Debug)]
pub struct BestOf {
    /// Per test the faster configuration's median; TTFT derived from those two, peak
    /// RSS the decode winner's.
    pub summary: EngineSummary,
    pub configs: Vec<LlamaConfigResult>,
    pub pp_repack: bool,
    pub tg_repack: bool,
}

/// The best of llama.cpp's configurations (`llamas`, each with its samples in
/// `samples`) per test: the higher median prompt speed, and the higher median decode
/// speed, each possibly from a different configuration.
pub fn best_of(llamas: &[LlamaBench], samples: Vec<Sample>, n_prompt: usize) -> Result<BestOf> {
    let mut configs = Vec::new();
    for llama in llamas {
        let own: Vec<Sample> = samples
            .iter()
            .filter(|s| s.llama_repack == Some(llama.repack))
            .cloned()
            .collect();
        let s = summarize(own, n_prompt)?;
        configs.push(LlamaConfigResult {
            repack: llama.repack,
            pp_tps: s.pp_tps,
            tg_tps: s.tg_tps,
            peak_rss_mb: s.peak_rss_mb,
        });
    }
    let fastest = |speed: fn(&LlamaConfigResult) -> f64| {
        configs
            .iter()
            .max_by(|a, b| speed(a).total_cmp(&speed(b)))
            .cloned()
            .context("no llama.cpp configuration ran")
    };
    let pp = fastest(|c| c.pp_tps)?;
    let tg = fastest(|c| c.tg_tps)?;
    Ok(BestOf {
        summary: EngineSummary {
            pp_tps: pp.pp_tps,
            tg_tps: tg.tg_tps,
            ttft_ms: derived_ttft_ms(n_prompt, pp.pp_tps, tg.tg_tps),
            ttft_derived: true,
            peak_rss_mb: tg.peak_rss_mb,
            samples,
        },
        configs,
        pp_repack: pp.repack,
        tg_repack: tg.repack,
    })
}

fn sample_text(s: &Sample, settings: &Settings) -> String {
    let rss = s
        .peak_rss_mb
        .map_or_else(|| "-".to_string(), |v| format!("{v:.0} MB"));
    format!(
        "pp{} {:.1} t/s, tg{} {:.2} t/s, peak RSS {rss} ({:.1} s)",
        settings.n_prompt, s.pp_tps, settings.n_gen, s.tg_tps, s.wall_s
    )
}

/// `nx bench` arguments for one run of file `model`.
pub fn nx_args(model: &Path, s: &Settings) -> Vec<String> {
    vec![
        "bench".into(),
        "--model".into(),
        model.display().to_string(),
        "-p".into(),
        s.n_prompt.to_string(),
        "-n".into(),
        s.n_gen.to_string(),
        "--threads".into(),
        s.threads.to_string(),
        "--reps".into(),
        "1".into(),
        "--json".into(),
        // The bench probes the read bandwidth once for all runs.
        "--no-probe".into(),
    ]
}

/// The llama.cpp configuration a bench runs: the fastest that runs on this machine.
#[derive(Debug, Clone)]
pub struct LlamaBench {
    /// The `llama-bench` binary.
    pub bin: PathBuf,
    /// Whether weight repacking (its interleaved layouts and AMX kernels) is on.
    pub repack: bool,
    /// In words, for the report.
    pub config: &'static str,
}

/// Picks llama.cpp's fastest configuration that runs here, trying each on `model`
/// (a 16-token prompt and two generated tokens): the pinned build with weight repacking
/// on; else the build without AMX (built on first need), repacking on; else the pinned
/// build with repacking off. The first two are the reference at its best; the last is
/// only used where both others fail, and the report says so.
pub fn choose_llama_bench(model: &Path, threads: usize) -> Result<LlamaBench> {
    let pinned = llama_bin("llama-bench");
    if !pinned.is_file() {
        ensure_reference(DEFAULT_JOBS)?;
    }
    if crate::sections::pinned_tier()? == Some("avx2") {
        // nx pinned to AVX2 stands in for a CPU without AVX-512: llama.cpp's best there
        // is its AVX2 build.
        let (bin, build) = crate::reference::ensure_avx2_bench(DEFAULT_JOBS)?;
        let config = if build == crate::reference::Avx2Build::Vnni {
            "the pinned source built for AVX2 with AVX-VNNI (GGML_NATIVE=OFF with AVX, AVX2, \
             FMA, F16C, BMI2 and AVX-VNNI; no AVX-512 or AMX), weight repacking on: llama.cpp \
             at its best on a CPU with AVX-VNNI and without AVX-512"
        } else {
            "the pinned source built for AVX2 only (GGML_NATIVE=OFF with AVX, AVX2, FMA, F16C \
             and BMI2; no AVX-512, VNNI or AMX), weight repacking on: llama.cpp at its best on \
             a CPU without AVX-512"
        };
        return Ok(LlamaBench {
            bin,
            repack: true,
            config,
        });
    }
    let runs = |bin: &Path, repack: bool| -> bool {
        let mut cmd = Command::new(bin);
        cmd.arg("-m")
            .arg(model)
            .args(["-t", &threads.to_string(), "-p", "16", "-n", "2", "-r", "1"])
            .args(["--repack", if repack { "1" } else { "0" }])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd.status().map(|s| s.success()).unwrap_or(false)
    };
    if runs(&pinned, true) {
        return Ok(LlamaBench {
            bin: pinned,
            repack: true,
            config: "the pinned build (GGML_NATIVE), weight repacking on",
        });
    }
    eprintln!("bench: the pinned llama.cpp build fails with weight repacking on; trying the build without AMX");
    if let Ok(no_amx) = crate::reference::ensure_no_amx_bench(DEFAULT_JOBS) {
        if runs(&no_amx, true) {
            return Ok(LlamaBench {
                bin: no_amx,
                repack: true,
                config: "the pinned build without AMX (`-mno-amx-*`; the pinned build faults in \
                         its AMX kernels here), weight repacking on",
            });
        }
    }
    eprintln!("bench: falling back to llama.cpp with weight repacking off");
    Ok(LlamaBench {
        bin: pinned,
        repack: false,
        config: "the pinned build with weight repacking off (both builds with repacking \
                 failed here)",
    })
}

/// The llama.cpp configurations every file runs under: `best` and, when `best` repacks
/// its weights, the same build with repacking off. Repacking is llama.cpp's default and
/// usually its fastest, but not for every format, test and CPU; running both and keeping
/// the faster median per test ([`best_of`]) compares nx with llama.cpp at its best.
pub fn llama_variants(best: &LlamaBench) -> Vec<LlamaBench> {
    let mut variants = vec![best.clone()];
    if best.repack {
        variants.push(LlamaBench {
            bin: best.bin.clone(),
            repack: false,
            config: "the same build with weight repacking off",
        });
    }
    variants
}

/// The llama.cpp configurations of a run, in words, for the report.
pub fn llama_config_text(llamas: &[LlamaBench]) -> String {
    match llamas {
        [only] => only.config.to_string(),
        [first, rest @ ..] => {
            let others: Vec<&str> = rest.iter().map(|l| l.config).collect();
            format!(
                "{}, and {} (per file and test the faster median of the two, marked * \
                 where it is repacking off's)",
                first.config,
                others.join(", and ")
            )
        }
        [] => String::new(),
    }
}

/// `llama-bench` arguments for one run of file `model`.
pub fn llama_args(model: &Path, s: &Settings, repack: bool) -> Vec<String> {
    vec![
        "-m".into(),
        model.display().to_string(),
        "-t".into(),
        s.threads.to_string(),
        "-p".into(),
        s.n_prompt.to_string(),
        "-n".into(),
        s.n_gen.to_string(),
        "-r".into(),
        "1".into(),
        "--repack".into(),
        if repack { "1" } else { "0" }.into(),
        "-o".into(),
        "json".into(),
    ]
}

fn run_nx(nx: &Path, model: &Path, settings: &Settings) -> Result<Sample> {
    let out = run_measured(nx, &nx_args(model, settings))?;
    if !out.status.success() {
        bail!(
            "nx bench on {} failed ({}): {}",
            model.display(),
            out.status,
            tail(&out.stderr)
        );
    }
    let report = parse_nx_json(&out.stdout)?;
    Ok(Sample {
        pp_tps: report.pp_tps,
        tg_tps: report.tg_tps,
        ttft_ms: report.ttft_ms,
        peak_rss_mb: out
            .peak_rss_kib
            .map(|kib| kib as f64 / 1024.0)
            .or(report.peak_rss_mb),
        self_reported_rss_mb: report.peak_rss_mb,
        wall_s: out.wall.as_secs_f64(),
        llama_repack: None,
    })
}

fn run_llama(llama: &LlamaBench, model: &Path, settings: &Settings) -> Result<Sample> {
    let out = run_measured(&llama.bin, &llama_args(model, settings, llama.repack))?;
    if !out.status.success() {
        bail!(
            "llama-bench on {} failed ({}): {}",
            model.display(),
            out.status,
            tail(&out.stderr)
        );
    }
    let (pp_tps, tg_tps) = parse_llama_json(&out.stdout)?;
    Ok(Sample {
        pp_tps,
        tg_tps,
        ttft_ms: None,
        peak_rss_mb: out.peak_rss_kib.map(|kib| kib as f64 / 1024.0),
        self_reported_rss_mb: None,
        wall_s: out.wall.as_secs_f64(),
        llama_repack: Some(llama.repack),
    })
}

/// The last few lines of a tool's stderr, for error messages.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// The fields of `nx bench --json` this harness uses.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NxBenchJson {
    pub pp_tps: f64,
    pub tg_tps: f64,
    pub ttft_ms: Option<f64>,
    pub peak_rss_mb: Option<f64>,
}

/// Parses the JSON object `nx bench --json` prints (the last `{...}` line of stdout).
pub fn parse_nx_json(stdout: &str) -> Result<NxBenchJson> {
    let line = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('{'))
        .context("nx bench printed no JSON object")?;
    serde_json::from_str(line).with_context(|| format!("unexpected nx bench output: {line}"))
}

/// Parses `llama-bench -o json`: returns (pp t/s, tg t/s), from the test with only a
/// prompt and the test with only generation.
pub fn parse_llama_json(stdout: &str) -> Result<(f64, f64)> {
    let tests: Vec<serde_json::Value> =
        serde_json::from_str(stdout.trim()).context("llama-bench printed invalid JSON")?;
    let find = |want_prompt: bool| {
        tests.iter().find_map(|t| {
            let n_prompt = t["n_prompt"].as_u64()?;
            let n_gen = t["n_gen"].as_u64()?;
            let is_pp = n_prompt > 0 && n_gen == 0;
            let is_tg = n_gen > 0 && n_prompt == 0;
            if (want_prompt && is_pp) || (!want_prompt && is_tg) {
                t["avg_ts"].as_f64()
            } else {
                None
            }
        })
    };
    let pp = find(true).context("llama-bench JSON has no prompt-processing test")?;
    let tg = find(false).context("llama-bench JSON has no generation test")?;
    Ok((pp, tg))
}

/// Medians of one engine's samples. TTFT is the median measured value, or, when the
/// engine measures none, `n_prompt / pp + 1 / tg` from the median speeds.
pub fn summarize(samples: Vec<Sample>, n_prompt: usize) -> Result<EngineSummary> {
    let pp = median(samples.iter().map(|s| s.pp_tps).collect()).context("no samples")?;
    let tg = median(samples.iter().map(|s| s.tg_tps).collect()).context("no samples")?;
    let measured_ttft = median(samples.iter().filter_map(|s| s.ttft_ms).collect());
    let (ttft_ms, ttft_derived) = match measured_ttft {
        Some(t) => (t, false),
        None => (derived_ttft_ms(n_prompt, pp, tg), true),
    };
    Ok(EngineSummary {
        pp_tps: pp,
        tg_tps: tg,
        ttft_ms,
        ttft_derived,
        peak_rss_mb: median(samples.iter().filter_map(|s| s.peak_rss_mb).collect()),
        samples,
    })
}

/// Time to first token from throughput: prefill `n_prompt` tokens, then one decode step.
pub fn derived_ttft_ms(n_prompt: usize, pp_tps: f64, tg_tps: f64) -> f64 {
    n_prompt as f64 / pp_tps * 1000.0 + 1000.0 / tg_tps
}

/// The median (mean of the middle two for an even count); `None` when empty.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

pub use nx_llama_stack::traffic::{active_experts, decode_bytes_per_token};

/// A finished child process with its output, peak RSS and wall time.
struct Measured {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    peak_rss_kib: Option<u64>,
    wall: Duration,
}

fn rss_method() -> &'static str {
    if Path::new(TIME_BIN).is_file() {
        "/usr/bin/time -f %M (max RSS of the process)"
    } else {
        "polling VmHWM in /proc/<pid>/status every 20 ms"
    }
}

/// Runs `program args`, capturing stdout and stderr, and measures its peak RSS: under
/// GNU time when it is installed, else by polling the child's `VmHWM` (a high-water mark,
/// so polling loses at most the last interval's growth).
fn run_measured(program: &Path, args: &[String]) -> Result<Measured> {
    let time_bin = Path::new(TIME_BIN);
    run_measured_with(program, args, time_bin.is_file().then_some(time_bin))
}

/// [`run_measured`] with GNU time at `time_bin`, or polling when `None`.
fn run_measured_with(program: &Path, args: &[String], time_bin: Option<&Path>) -> Result<Measured> {
    let use_time = time_bin.is_some();
    let rss_file =
        std::env::temp_dir().join(format!("nx-bench-rss-{}.txt", crate::util::unique_suffix()));
    let mut cmd = if let Some(time_bin) = time_bin {
        let mut cmd = Command::new(time_bin);
        cmd.arg("-f")
            .arg("%M")
            .arg("-o")
            .arg(&rss_file)
            .arg(program);
        cmd
    } else {
        Command::new(program)
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start {}", program.display()))?;
    // Drain both pipes on their own threads so a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
            text
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let mut polled_kib = None;
    let status = if use_time {
        child.wait().context("waiting for the benchmark process")?
    } else {
        let status_path = format!("/proc/{}/status", child.id());
        loop {
            if let Some(status) = child.try_wait().context("waiting for the process")? {
                break status;
            }
            if let Some(kib) = std::fs::read_to_string(&status_path)
                .ok()
                .and_then(|s| vm_hwm_kib(&s))
            {
                polled_kib = Some(polled_kib.map_or(kib, |p: u64| p.max(kib)));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let wall = started.elapsed();
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let peak_rss_kib = if use_time {
        let text = std::fs::read_to_string(&rss_file).unwrap_or_default();
        let _ = std::fs::remove_file(&rss_file);
        parse_time_max_rss(&text)
    } else {
        polled_kib
    };
    Ok(Measured {
        status,
        stdout,
        stderr,
        peak_rss_kib,
        wall,
    })
}

/// The `%M` figure GNU time wrote: the last line that is a number (a failed command adds
/// a "Command exited with non-zero status" line before it).
pub fn parse_time_max_rss(text: &str) -> Option<u64> {
    text.lines().rev().find_map(|l| l.trim().parse().ok())
}

/// Sums a `bytes`-byte buffer with 1 and with `threads` threads (best of 3 each).
pub fn read_bandwidth_probe(bytes: usize, threads: usize) -> Probe {
    let r = nx_syscalls::read_bandwidth(bytes, threads);
    Probe {
        buffer_bytes: r.buffer_bytes,
        single_thread_gbs: r.single_thread_gbs,
        threads: r.threads,
        multi_thread_gbs: r.multi_thread_gbs,
    }
}

/// The `cargo xtask bench` command line that reproduces this run.
fn command_line(args: &BenchArgs, settings: &Settings) -> String {
    let mut text = String::from("cargo xtask bench");
    if args.quick {
        text.push_str(" --quick");
    } else {
        text.push_str(&format!(" --reps {}", settings.reps));
    }
    text.push_str(&format!(" --threads {}", settings.threads));
    text.push_str(&format!(" --models {}", args.models.join(",")));
    text
}

fn opt_mb(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.0} MB"))
}

/// The results table in markdown.
pub fn markdown_table(report: &Report) -> String {
    let (p, n) = (report.settings.n_prompt, report.settings.n_gen);
    let mut out = format!(
        "| file | nx pp{p} | llama.cpp pp{p} | ratio | nx tg{n} | llama.cpp tg{n} | ratio \
         | nx GB/s (decode) | nx peak RSS | llama.cpp peak RSS | nx TTFT | llama.cpp TTFT |\n"
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for m in &report.models {
        let file = Path::new(&m.path)
            .file_name()
            .map_or_else(|| m.path.clone(), |f| f.to_string_lossy().into_owned());
        let ttft = |e: &EngineSummary| {
            format!(
                "{:.0} ms{}",
                e.ttft_ms,
                if e.ttft_derived { " (derived)" } else { "" }
            )
        };
        // A llama.cpp figure from repacking off is marked, where both ran.
        let mark = |repack: bool| match m.llama_cpp_configs.len() > 1 && !repack {
            true => "*",
            false => "",
        };
        out.push_str(&format!(
            "| {file} | {:.1} | {:.1}{} | {:.2} | {:.2} | {:.2}{} | {:.2} | {:.1} | {} | {} | {} | {} |\n",
            m.nx.pp_tps,
            m.llama_cpp.pp_tps,
            mark(m.llama_cpp_pp_repack),
            m.pp_ratio,
            m.nx.tg_tps,
            m.llama_cpp.tg_tps,
            mark(m.llama_cpp_tg_repack),
            m.tg_ratio,
            m.nx_decode_gbs,
            opt_mb(m.nx.peak_rss_mb),
            opt_mb(m.llama_cpp.peak_rss_mb),
            ttft(&m.nx),
            ttft(&m.llama_cpp),
        ));
    }
    out
}

/// The lines printed above the table: machine, settings and the probe.
fn summary_lines(report: &Report) -> String {
    let probe = &report.probe;
    let multi = match probe.threads {
        1 => String::new(),
        n => format!(", {:.1} GB/s with {n} threads", probe.multi_thread_gbs),
    };
    format!(
        "CPU: {} ({} logical CPUs)\ndate: {} {} UTC (end of run)\nthreads: {}   reps: {}   \
         load average before/after: {} / {}\nread-bandwidth probe ({} MiB of u64, best of 3): \
         {:.1} GB/s with 1 thread{multi}",
        report.cpu,
        report.logical_cpus,
        report.date,
        report.time_utc,
        report.settings.threads,
        report.settings.reps,
        report.load_average_before,
        report.load_average_after,
        probe.buffer_bytes >> 20,
        probe.single_thread_gbs,
    )
}

/// Every sample of every engine, in the order they ran, as a markdown table.
pub fn runs_table(report: &Report) -> String {
    let (p, n) = (report.settings.n_prompt, report.settings.n_gen);
    let mut out = format!(
        "| file | run | engine | pp{p} t/s | tg{n} t/s | peak RSS | wall |\n\
         |---|---:|---|---:|---:|---:|---:|\n"
    );
    for m in &report.models {
        // Each rep ran nx once, then every llama.cpp configuration once.
        let per_rep = m.llama_cpp_configs.len().max(1);
        let llama_runs = m.llama_cpp.samples.chunks(per_rep);
        for (i, (nx, llamas)) in m.nx.samples.iter().zip(llama_runs).enumerate() {
            let llamas = llamas.iter().map(|s| match s.llama_repack {
                Some(false) => ("llama.cpp --repack 0", s),
                _ => ("llama.cpp", s),
            });
            for (engine, s) in std::iter::once(("nx", nx)).chain(llamas) {
                out.push_str(&format!(
                    "| {} | {} | {engine} | {:.1} | {:.2} | {} | {:.1} s |\n",
                    m.name,
                    i + 1,
                    s.pp_tps,
                    s.tg_tps,
                    opt_mb(s.peak_rss_mb),
                    s.wall_s
                ));
            }
        }
    }
    out
}

/// Each llama.cpp configuration's medians per file, where more than one ran.
pub fn llama_config_lines(report: &Report) -> String {
    let (p, n) = (report.settings.n_prompt, report.settings.n_gen);
    let mut out = String::new();
    for m in report
        .models
        .iter()
        .filter(|m| m.llama_cpp_configs.len() > 1)
    {
        let figures: Vec<String> = m
            .llama_cpp_configs
            .iter()
            .map(|c| {
                format!(
                    "`--repack {}` pp{p} {:.1}, tg{n} {:.2}",
                    u8::from(c.repack),
                    c.pp_tps,
                    c.tg_tps
                )
            })
            .collect();
        out.push_str(&format!("- `{}`: {}.\n", m.name, figures.join("; ")));
    }
    out
}

/// [`llama_config_lines`] under a heading line, or nothing when one configuration ran.
fn config_paragraph(report: &Report) -> String {
    match llama_config_lines(report) {
        lines if lines.is_empty() => String::new(),
        lines => format!("\nEach llama.cpp configuration's medians:\n\n{lines}"),
    }
}

/// The markers of the section `cargo xtask bench --formats` writes (one per tier).
fn formats_markers(tier: Option<&str>) -> (String, String) {
    let (key, env) = match tier {
        Some(t) => (format!("formats-{t}"), format!("NX_TIER={t} NX_AMX=0 ")),
        None => ("formats".to_string(), String::new()),
    };
    (
        format!("<!-- bench-{key}:begin (written by `{env}cargo xtask bench --formats`) -->"),
        format!("<!-- bench-{key}:end -->"),
    )
}

/// Each file's decode bandwidth as a share of the first file's (the Q4_K_M yardstick):
/// how close a file type comes to the bandwidth bound Q4_K reaches.
fn decode_share_lines(report: &Report) -> String {
    let Some(base) = report.models.first() else {
        return String::new();
    };
    let mut out = String::new();
    for m in &report.models {
        let share = if base.nx_decode_gbs > 0.0 {
            m.nx_decode_gbs / base.nx_decode_gbs
        } else {
            0.0
        };
        out.push_str(&format!(
            "- `{}`: {:.1} MB read per decode step, nx decodes at {:.1} GB/s = {:.2} of `{}`'s \
             {:.1} GB/s; llama.cpp at {:.1} GB/s.\n",
            m.name,
            m.decode_bytes_per_token as f64 / 1e6,
            m.nx_decode_gbs,
            share,
            base.name,
            base.nx_decode_gbs,
            m.llama_cpp_decode_gbs,
        ));
    }
    out
}

/// Writes (or replaces) the `--formats` section of `docs/benchmarks.md`.
fn write_formats_section(docs: &Path, old: &str, report: &Report, table: &str) -> Result<()> {
    let tier = crate::sections::pinned_tier()?;
    let (begin, end) = formats_markers(tier);
    let (heading, env) = match tier {
        Some(t) => (
            format!(" (nx on its {t} tier)"),
            format!("NX_TIER={t} NX_AMX=0 "),
        ),
        None => (String::new(), String::new()),
    };
    let section = format!(
        "{begin}\n## File types{heading}: `{env}cargo xtask bench --formats`\n\n\
         The Qwen2.5-0.5B shapes (synthetic weights) in nx's own Q4_K_M mix, and as the pinned \
         `llama-quantize` makes five other file types of them from an all-Q8_0 source (its own \
         choice of type per tensor, fallbacks included), and the Qwen2.5-1.5B shapes (no \
         fallbacks at their widths) as it makes three grid file types with an importance \
         matrix from `llama-imatrix`. Same method as the main table; \
         llama.cpp: {}.\n\n{}\n\n{table}\nDecode bandwidth (weight bytes one decode step \
         reads × tg t/s) beside the Q4_K_M file's:\n\n{}{}{end}\n",
        report.llama_cpp_config,
        summary_lines(report),
        decode_share_lines(report),
        config_paragraph(report),
    );
    let text = crate::util::replace_doc_section(old, &begin, &end, &section);
    std::fs::write(docs, text).with_context(|| format!("cannot write {}", docs.display()))?;
    eprintln!("bench: wrote the file-type section of {}", docs.display());
    Ok(())
}

/// The command of a variant run: pinned with `NX_TIER` = `tier`, on `threads` threads.
fn variant_command(tier: Option<&str>, threads: usize) -> String {
    let env = tier.map_or(String::new(), |t| format!("NX_TIER={t} NX_AMX=0 "));
    let flag = match threads {
        DEFAULT_THREADS => String::new(),
        n => format!(" --threads {n}"),
    };
    format!("{env}cargo xtask bench{flag}")
}

/// The markers of the section a variant run writes (see [`variant_command`]; the main
/// table's [`DEFAULT_THREADS`] add nothing to the key).
fn variant_markers(tier: Option<&str>, threads: usize) -> (String, String) {
    let tier_key = tier.map_or(String::new(), |t| format!("-{t}"));
    let threads_key = match threads {
        DEFAULT_THREADS => String::new(),
        n => format!("-threads{n}"),
    };
    let key = format!("bench{tier_key}{threads_key}");
    let command = variant_command(tier, threads);
    (
        format!("<!-- {key}:begin (written by `{command}`) -->"),
        format!("<!-- {key}:end -->"),
    )
}

/// The heading of a variant's section.
fn variant_heading(tier: Option<&str>, threads: usize) -> String {
    let who = tier.map_or("nx on its best tier".to_string(), |t| {
        format!("nx on its {t} tier")
    });
    let threads_text = match threads {
        1 => ", one thread".to_string(),
        DEFAULT_THREADS => String::new(),
        n => format!(", {n} threads"),
    };
    format!("{who}{threads_text}: `{}`", variant_command(tier, threads))
}

/// The text of `docs/benchmarks.md`.
/// One line per file: the weight bytes a decode step reads, the file's size and
/// llama.cpp's decode bandwidth at that count.
fn decode_bytes_lines(report: &Report) -> String {
    let mut lines = String::new();
    for m in &report.models {
        lines.push_str(&format!(
            "- `{}` ({}): {:.1} MB of weights read per decode step ({} bytes); file {:.1} MB. \
             llama.cpp's decode at the same count: {:.1} GB/s.\n",
            m.name,
            Path::new(&m.path)
                .file_name()
                .map_or_else(|| m.path.clone(), |f| f.to_string_lossy().into_owned()),
            m.decode_bytes_per_token as f64 / 1e6,
            m.decode_bytes_per_token,
            m.file_bytes as f64 / 1e6,
            m.llama_cpp_decode_gbs,
        ));
    }
    lines
}

/// The whole of `docs/benchmarks.md` for `report`, with `table` as its summary table.
fn benchmarks_doc(report: &Report, table: &str) -> String {
    let s = &report.settings;
    format!(
        "# Benchmarks: nx vs llama.cpp\n\n\
         Generated by `cargo xtask bench` (this file is overwritten on every full run; raw \
         samples are in `target/bench/bench-{date}.json`).\n\n\
         Command:\n\n```sh\n{command}\n```\n\n\
         {summary}\n\n\
         {table}\n\
         Columns: pp{p} and tg{n} are tokens per second (median of {reps} runs per engine); \
         ratio is nx ÷ llama.cpp (above 1: nx faster). nx GB/s (decode) is the weight bytes \
         one decode step reads times nx's tg t/s (GB = 10^9 bytes). Peak RSS is the \
         process's maximum resident set (MB = 2^20 bytes), measured with {rss}; it includes \
         the memory-mapped model pages that were touched. nx TTFT is measured by `nx bench` \
         (prefill of a {p}-token prompt plus choosing the first token); llama-bench reports no \
         TTFT, so llama.cpp's is **derived**: {p} / pp t/s + 1 / tg t/s.\n\n\
         ## Method\n\n\
         For each file the engines run alternately, one process per run, {reps} times each:\n\n\
         - nx: `target/release/nx {nx_cmd}`\n\
         - llama.cpp: `llama-bench {llama_cmd}`{and_off}\n\n\
         llama.cpp runs as {llama_config}. Repacking on is tried first: the pinned build, \
         then (if that faults) a build without AMX; the build that runs serves both settings. \
         {config_lines}nx's prefill uses AMX-INT8 tiles for Q4_K and Q6_K \
         weights where the CPU has them and the kernel grants tile data (`NX_AMX=0` turns \
         that off); its outputs are the same bits either way. Everything else is llama-bench's default (f16 KV cache, \
         flash attention `auto`, micro-batch 512, one untimed warm-up run per test). `nx bench` \
         also keeps an f16 KV cache, prefills in chunks of 256 (512 for the mixture of experts: `nx bench`'s \
         defaults) and does \
         llama-bench's warm-up runs (an untimed prompt of the same length and one generated \
         token), so neither engine's figures include the first touch of the model's pages. \
         Both engines use {threads} threads and the same prompt \
         length; the prompt tokens themselves differ (llama-bench uses random ids, nx a fixed \
         spread of ordinary ids), which does not change the amount of work.\n\n\
         Weight bytes per decode step: every tensor in full except the token embedding, of \
         which one row is read, plus the LM head (the tied embedding table in full when the \
         file has no `output.weight`); of a mixture of experts' expert tensors, the share of \
         the experts one token is routed to:\n\n\
         {per_token}\n\
         The read-bandwidth probe sums a {probe_mib} MiB buffer of `u64` (best of 3 passes), \
         once on one thread and once split over {threads} threads; decode speed is bounded by \
         roughly that bandwidth divided by the bytes per step.\n\n\
         **These numbers are noisy.** The dev machine is a shared VM with {cpus} logical CPUs \
         that other jobs (builds, tests) use at the same time; the load average was {load_before} \
         before the run and {load_after} after. llama.cpp's worker threads spin while waiting \
         (`--poll 50`), which suffers more than nx from a busy machine. Compare ratios within \
         one run rather than absolute figures across runs, and rerun on an idle machine before \
         drawing conclusions.\n\n\
         The `qwen2.5-*` files are synthetic: the Qwen2.5 0.5B and 1.5B shapes and quantization \
         mix with deterministic random weights (`cargo xtask synth --shape NAME`), so their \
         speed is representative and their text output is not.\n\n\
         ## Every run\n\n\
         In the order they ran (nx and llama.cpp alternate). Wall time is the whole process: \
         loading, llama-bench's warm-up runs, and both tests.\n\n\
         {runs}",
        runs = runs_table(report),
        per_token = decode_bytes_lines(report),
        date = report.date,
        command = report.command,
        summary = summary_lines(report),
        p = s.n_prompt,
        n = s.n_gen,
        reps = s.reps,
        rss = report.rss_method,
        nx_cmd = report.nx_command,
        llama_cmd = report.llama_cpp_command,
        llama_config = report.llama_cpp_config,
        config_lines = match llama_config_lines(report) {
            lines if lines.is_empty() => String::new(),
            lines => format!("Each configuration's medians:\n\n{lines}\n"),
        },
        and_off = match report.models.iter().any(|m| m.llama_cpp_configs.len() > 1) {
            true => ", and the same with `--repack 0`",
            false => "",
        },
        threads = s.threads,
        probe_mib = report.probe.buffer_bytes >> 20,
        cpus = report.logical_cpus,
        load_before = report.load_average_before,
        load_after = report.load_average_after,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use nx_gguf::{GgmlType, GgufWriter};

    fn args(quick: bool, reps: usize) -> BenchArgs {
        BenchArgs {
            reps,
            quick,
            models: DEFAULT_MODELS.iter().map(|s| s.to_string()).collect(),
            threads: 2,
            no_build: false,
            formats: false,
        }
    }

    #[test]
    fn settings_follow_quick_and_reject_zero() {
        let full = Settings::from_args(&args(false, 3)).unwrap();
        assert_eq!((full.n_prompt, full.n_gen, full.reps), (512, 128, 3));
        let quick = Settings::from_args(&args(true, 3)).unwrap();
        assert_eq!((quick.n_prompt, quick.n_gen, quick.reps), (128, 32, 1));
        assert!(Settings::from_args(&args(false, 0)).is_err());
        let mut no_threads = args(false, 3);
        no_threads.threads = 0;
        assert!(Settings::from_args(&no_threads).is_err());
    }

    #[test]
    fn median_handles_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }

    // Shape of llama-bench's `-o json` output, trimmed from a real run of this build on
    // the default model (`-p 128 -n 32 -r 1 --repack 0`).
    const LLAMA_JSON: &str = r#"[
      {"model_type": "gemma3 270M Q4_K - Medium", "n_threads": 2, "repack": false,
       "n_prompt": 128, "n_gen": 0, "n_depth": 0, "avg_ns": 2335850255,
       "avg_ts": 54.798033, "stddev_ts": 0.000000, "samples_ts": [ 54.798 ]},
      {"model_type": "gemma3 270M Q4_K - Medium", "n_threads": 2, "repack": false,
       "n_prompt": 0, "n_gen": 32, "n_depth": 0, "avg_ns": 16606090762,
       "avg_ts": 1.927004, "stddev_ts": 0.000000, "samples_ts": [ 1.927 ]}
    ]"#;

    #[test]
    fn llama_json_gives_pp_and_tg() {
        assert_eq!(parse_llama_json(LLAMA_JSON).unwrap(), (54.798033, 1.927004));
        // Order does not matter; a missing test is an error.
        let v: Vec<serde_json::Value> = serde_json::from_str(LLAMA_JSON).unwrap();
        let swapped = serde_json::to_string(&vec![v[1].clone(), v[0].clone()]).unwrap();
        assert_eq!(parse_llama_json(&swapped).unwrap(), (54.798033, 1.927004));
        let only_pp = serde_json::to_string(&vec![v[0].clone()]).unwrap();
        assert!(parse_llama_json(&only_pp).is_err());
        assert!(parse_llama_json("not json").is_err());
    }

    #[test]
    fn nx_json_is_the_last_object_line() {
        // A line as printed by `nx bench --json` in this tree.
        let out = "some log line\n{\"model\":\"m.gguf\",\"peak_rss_mb\":299.3,\"pp_tokens\":128,\
                   \"pp_tps\":104.7,\"reps\":1,\"tg_tokens\":32,\"tg_tps\":15.8,\"threads\":2,\
                   \"ttft_ms\":1225.2}\n";
        let parsed = parse_nx_json(out).unwrap();
        assert_eq!(
            parsed,
            NxBenchJson {
                pp_tps: 104.7,
                tg_tps: 15.8,
                ttft_ms: Some(1225.2),
                peak_rss_mb: Some(299.3)
            }
        );
        assert!(parse_nx_json("no json here\n").is_err());
        // pp_tps is null when -p 0: the harness needs both figures.
        assert!(parse_nx_json("{\"pp_tps\":null,\"tg_tps\":1.0}").is_err());
    }

    #[test]
    fn time_max_rss_parsing() {
        assert_eq!(parse_time_max_rss("310332\n"), Some(310332));
        assert_eq!(
            parse_time_max_rss("Command exited with non-zero status 1\n4242\n"),
            Some(4242)
        );
        assert_eq!(parse_time_max_rss(""), None);
    }

    #[test]
    fn measured_run_reports_output_and_rss_both_ways() {
        // The sleep gives the polling path time to read the child's status at least once.
        let script = [
            "-c".to_string(),
            "echo out; echo err >&2; sleep 0.3; exit 3".to_string(),
        ];
        let time_bin = Path::new(TIME_BIN);
        let mut ways = vec![None];
        if time_bin.is_file() {
            ways.push(Some(time_bin));
        }
        for way in ways {
            let out = run_measured_with(Path::new("/bin/sh"), &script, way).unwrap();
            assert_eq!(out.stdout, "out\n", "{way:?}");
            assert!(out.stderr.contains("err"), "{way:?}: {}", out.stderr);
            assert_eq!(out.status.code(), Some(3), "{way:?}");
            // Any running process has a non-zero resident set.
            assert!(
                out.peak_rss_kib.is_some_and(|k| k > 0),
                "{way:?}: {:?}",
                out.peak_rss_kib
            );
            assert!(out.wall >= Duration::from_millis(300), "{way:?}");
        }
    }

    #[test]
    fn summary_uses_measured_ttft_or_derives_it() {
        let sample = |pp: f64, tg: f64, ttft: Option<f64>| Sample {
            pp_tps: pp,
            tg_tps: tg,
            ttft_ms: ttft,
            peak_rss_mb: Some(pp),
            self_reported_rss_mb: None,
            wall_s: 1.0,
            llama_repack: None,
        };
        let nx = summarize(
            vec![
                sample(100.0, 10.0, Some(900.0)),
                sample(50.0, 30.0, Some(1100.0)),
                sample(80.0, 20.0, Some(1000.0)),
            ],
            512,
        )
        .unwrap();
        assert_eq!((nx.pp_tps, nx.tg_tps, nx.ttft_ms), (80.0, 20.0, 1000.0));
        assert!(!nx.ttft_derived);
        assert_eq!(nx.peak_rss_mb, Some(80.0));
        let llama = summarize(vec![sample(256.0, 4.0, None)], 512).unwrap();
        assert!(llama.ttft_derived);
        // 512 tokens at 256 t/s = 2000 ms, one step at 4 t/s = 250 ms.
        assert_eq!(llama.ttft_ms, 2250.0);
        assert!(summarize(vec![], 512).is_err());
    }

    fn tensor_bytes(t: GgmlType, ne: &[u64]) -> u64 {
        t.row_bytes(ne[0]).unwrap() * ne[1..].iter().product::<u64>()
    }

    fn gguf_with(tied: bool) -> Gguf {
        let mut w = GgufWriter::new();
        let mut add = |name: &str, t: GgmlType, ne: Vec<u64>| {
            let n = tensor_bytes(t, &ne) as usize;
            w.add_tensor(name, t, ne, vec![0u8; n]);
        };
        add("token_embd.weight", GgmlType::Q8_0, vec![64, 100]);
        add("blk.0.attn_norm.weight", GgmlType::F32, vec![64]);
        add("blk.0.ffn_up.weight", GgmlType::Q4_K, vec![256, 64]);
        if !tied {
            add("output.weight", GgmlType::Q6_K, vec![256, 100]);
        }
        Gguf::from_bytes(w.to_bytes()).unwrap()
    }

    #[test]
    fn decode_bytes_count_the_lm_head_once_and_one_embedding_row() {
        // Q8_0: 34 bytes per 32 values; Q4_K: 144 per 256; Q6_K: 210 per 256.
        let embd_row = 2 * 34;
        let norm = 64 * 4;
        let ffn = 144 * 64;
        let tied = gguf_with(true);
        assert_eq!(
            decode_bytes_per_token(tied.tensors(), None),
            (norm + ffn + embd_row + 100 * embd_row) as u64
        );
        let untied = gguf_with(false);
        assert_eq!(
            decode_bytes_per_token(untied.tensors(), None),
            (norm + ffn + embd_row + 210 * 100) as u64
        );
    }

    #[test]
    fn decode_bytes_count_only_the_routed_share_of_the_experts() {
        let mut w = GgufWriter::new();
        let mut add = |name: &str, t: GgmlType, ne: Vec<u64>| {
            let n = tensor_bytes(t, &ne) as usize;
            w.add_tensor(name, t, ne, vec![0u8; n]);
        };
        add("token_embd.weight", GgmlType::Q8_0, vec![64, 100]);
        add("output.weight", GgmlType::Q8_0, vec![64, 100]);
        // Eight experts of 64 × 256 Q4_K each: 144 · 64 bytes per expert.
        add("blk.0.ffn_up_exps.weight", GgmlType::Q4_K, vec![256, 64, 8]);
        let gguf = Gguf::from_bytes(w.to_bytes()).unwrap();
        let embd_row = 2 * 34;
        let head = 100 * embd_row;
        let expert = 144 * 64;
        assert_eq!(
            decode_bytes_per_token(gguf.tensors(), Some((2, 8))),
            (embd_row + head + 2 * expert) as u64
        );
        assert_eq!(
            decode_bytes_per_token(gguf.tensors(), None),
            (embd_row + head + 8 * expert) as u64
        );
    }

    #[test]
    fn probe_reports_positive_bandwidth() {
        let probe = read_bandwidth_probe(8 << 20, 2);
        assert_eq!(probe.buffer_bytes, 8 << 20);
        assert!(probe.single_thread_gbs > 0.0 && probe.single_thread_gbs.is_finite());
        assert!(probe.multi_thread_gbs > 0.0 && probe.multi_thread_gbs.is_finite());
    }

    #[test]
    fn engine_arguments_pin_threads_sizes_and_repack() {
        let s = Settings {
            n_prompt: 512,
            n_gen: 128,
            reps: 3,
            threads: 2,
        };
        assert_eq!(
            llama_args(Path::new("m.gguf"), &s, false).join(" "),
            "-m m.gguf -t 2 -p 512 -n 128 -r 1 --repack 0 -o json"
        );
        assert_eq!(
            nx_args(Path::new("m.gguf"), &s).join(" "),
            "bench --model m.gguf -p 512 -n 128 --threads 2 --reps 1 --json --no-probe"
        );
    }

    fn summary(pp: f64, tg: f64, derived: bool) -> EngineSummary {
        EngineSummary {
            pp_tps: pp,
            tg_tps: tg,
            ttft_ms: 1234.0,
            ttft_derived: derived,
            peak_rss_mb: Some(300.0),
            samples: vec![Sample {
                pp_tps: pp,
                tg_tps: tg,
                ttft_ms: None,
                peak_rss_mb: Some(300.0),
                self_reported_rss_mb: None,
                wall_s: 1.0,
                llama_repack: None,
            }],
        }
    }

    fn model_result(name: &str, nx_decode_gbs: f64) -> ModelResult {
        ModelResult {
            name: name.into(),
            path: "/cache/models/gemma.gguf".into(),
            file_bytes: 1,
            decode_bytes_per_token: 1,
            nx: summary(100.0, 20.0, false),
            llama_cpp: summary(50.0, 10.0, true),
            llama_cpp_configs: Vec::new(),
            llama_cpp_pp_repack: true,
            llama_cpp_tg_repack: true,
            pp_ratio: 2.0,
            tg_ratio: 2.0,
            nx_decode_gbs,
            llama_cpp_decode_gbs: 2.5,
        }
    }

    #[test]
    fn variants_have_their_own_markers_and_keep_the_tier_sections_names() {
        // The avx2 section's markers are the ones earlier runs wrote into the docs.
        assert_eq!(
            variant_markers(Some("avx2"), DEFAULT_THREADS),
            (
                "<!-- bench-avx2:begin (written by `NX_TIER=avx2 NX_AMX=0 cargo xtask bench`) -->"
                    .to_string(),
                "<!-- bench-avx2:end -->".to_string()
            )
        );
        let one = variant_markers(None, 1);
        assert_eq!(
            one.0,
            "<!-- bench-threads1:begin (written by `cargo xtask bench --threads 1`) -->"
        );
        assert_eq!(one.1, "<!-- bench-threads1:end -->");
        let avx2_one = variant_markers(Some("avx2"), 1);
        assert!(
            avx2_one.0.contains("bench-avx2-threads1:begin"),
            "{}",
            avx2_one.0
        );
        assert!(avx2_one
            .0
            .contains("`NX_TIER=avx2 NX_AMX=0 cargo xtask bench --threads 1`"));
        assert_eq!(
            variant_heading(Some("avx2"), 1),
            "nx on its avx2 tier, one thread: `NX_TIER=avx2 NX_AMX=0 cargo xtask bench --threads 1`"
        );
        assert_eq!(
            variant_heading(None, 4),
            "nx on its best tier, 4 threads: `cargo xtask bench --threads 4`"
        );
        // Every variant's markers are found again by the main table's rewrite.
        let doc = format!("# T\n{}\nx\n{}\n", one.0, one.1);
        assert_eq!(crate::util::doc_section_markers(&doc), [one]);
    }

    #[test]
    fn decode_shares_are_against_the_first_file_and_sections_have_own_markers() {
        let report = report_of(vec![model_result("q4km", 20.0), model_result("q8", 15.0)]);
        let lines = decode_share_lines(&report);
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].contains("= 1.00 of `q4km`'s"), "{}", lines[0]);
        assert!(
            lines[1].contains("15.0 GB/s = 0.75 of `q4km`'s 20.0 GB/s"),
            "{}",
            lines[1]
        );
        let (native, avx2) = (formats_markers(None), formats_markers(Some("avx2")));
        assert_ne!(native.0, avx2.0);
        assert_ne!(native.0, variant_markers(Some("avx2"), DEFAULT_THREADS).0);
        assert!(avx2.0.contains("NX_TIER=avx2") && avx2.1.contains("formats-avx2"));
    }

    fn report_of(models: Vec<ModelResult>) -> Report {
        Report {
            command: "cargo xtask bench".into(),
            date: "2026-11-30".into(),
            time_utc: "00:00".into(),
            cpu: "cpu".into(),
            logical_cpus: 2,
            load_average_before: "1 1 1".into(),
            load_average_after: "1 1 1".into(),
            settings: Settings {
                n_prompt: 512,
                n_gen: 128,
                reps: 3,
                threads: 2,
            },
            quick: false,
            nx_command: String::new(),
            llama_cpp_command: String::new(),
            llama_cpp_config: String::new(),
            rss_method: String::new(),
            probe: Probe {
                buffer_bytes: 1 << 30,
                single_thread_gbs: 10.0,
                threads: 2,
                multi_thread_gbs: 15.0,
            },
            models,
        }
    }

    #[test]
    fn table_has_one_row_per_file_and_marks_derived_ttft() {
        let model = model_result("default", 5.0);
        let report = report_of(vec![model.clone(), model]);
        let table = markdown_table(&report);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[0].starts_with("| file | nx pp512 | llama.cpp pp512 | ratio | nx tg128"));
        assert_eq!(lines[0].matches('|').count(), lines[2].matches('|').count());
        assert!(lines[2].starts_with("| gemma.gguf | 100.0 | 50.0 | 2.00 | 20.00 | 10.00 |"));
        assert!(
            lines[2].ends_with("| 1234 ms | 1234 ms (derived) |"),
            "{}",
            lines[2]
        );
        let doc = benchmarks_doc(&report, &table);
        assert!(doc.contains("cargo xtask bench"));
        assert!(doc.contains(&table));
        // Two files with one nx and one llama.cpp run each: four rows under the header.
        let runs = runs_table(&report);
        assert_eq!(runs.lines().count(), 2 + 4, "{runs}");
        assert!(runs.contains("| default | 1 | llama.cpp | 50.0 | 10.00 | 300 MB | 1.0 s |"));
        assert!(doc.contains(&runs));
    }

    #[test]
    fn best_of_takes_each_tests_faster_configuration_and_marks_repack_off() {
        let on = LlamaBench {
            bin: PathBuf::from("llama-bench"),
            repack: true,
            config: "the pinned build",
        };
        let llamas = llama_variants(&on);
        assert_eq!(llamas.len(), 2);
        assert!(!llamas[1].repack && llamas[1].bin == on.bin);
        assert_eq!(
            llama_variants(&llamas[1]).len(),
            1,
            "repack off has no variant"
        );
        let run = |repack: bool, pp: f64, tg: f64| Sample {
            pp_tps: pp,
            tg_tps: tg,
            ttft_ms: None,
            peak_rss_mb: Some(if repack { 400.0 } else { 300.0 }),
            self_reported_rss_mb: None,
            wall_s: 1.0,
            llama_repack: Some(repack),
        };
        // Repacking wins prefill, loses decode: each test keeps its faster median.
        let samples = vec![
            run(true, 700.0, 70.0),
            run(false, 600.0, 80.0),
            run(true, 710.0, 72.0),
            run(false, 610.0, 79.0),
            run(true, 690.0, 71.0),
            run(false, 590.0, 81.0),
        ];
        let best = best_of(&llamas, samples, 512).unwrap();
        assert_eq!((best.summary.pp_tps, best.summary.tg_tps), (700.0, 80.0));
        assert!(best.pp_repack && !best.tg_repack);
        assert_eq!(best.summary.peak_rss_mb, Some(300.0), "the decode winner's");
        assert_eq!(best.summary.ttft_ms, derived_ttft_ms(512, 700.0, 80.0));
        assert_eq!(best.configs.len(), 2);
        assert_eq!(best.configs[1].tg_tps, 80.0);
        assert!(best_of(&llamas, Vec::new(), 512).is_err());

        let mut model = model_result("default", 5.0);
        model.llama_cpp = best.summary;
        model.llama_cpp_configs = best.configs;
        model.llama_cpp_pp_repack = best.pp_repack;
        model.llama_cpp_tg_repack = best.tg_repack;
        model.nx.samples = (0..3).map(|_| model.nx.samples[0].clone()).collect();
        let report = report_of(vec![model]);
        let table = markdown_table(&report);
        let row = table.lines().nth(2).unwrap();
        assert!(
            row.contains("| 700.0 | 2.00 |") && row.contains("| 80.00* |"),
            "{row}"
        );
        let lines = llama_config_lines(&report);
        assert!(
            lines.contains(
                "`--repack 1` pp512 700.0, tg128 71.00; `--repack 0` pp512 600.0, tg128 80.00"
            ),
            "{lines}"
        );
        let runs = runs_table(&report);
        assert_eq!(runs.lines().count(), 2 + 9, "{runs}");
        assert!(
            runs.contains("| default | 3 | llama.cpp --repack 0 | 590.0 | 81.00 |"),
            "{runs}"
        );
        let doc = benchmarks_doc(&report, &table);
        assert!(doc.contains("and the same with `--repack 0`") && doc.contains(&lines));
    }
}
