//! `cargo xtask fuzz`: coverage-guided runs of the `fuzz/` targets under libFuzzer
//! (`cargo +nightly fuzz run`), with the seeds written first and a summary per target.
//!
//! The corpus lives in `target/fuzz/corpus/TARGET` (kept between runs, never committed;
//! its edge-covering subset, `-set_cover_merge=1 -use_counters=0`, is committed in
//! `fuzz/corpus-min/TARGET` and read as a second corpus);
//! a crash leaves its input in `target/fuzz/artifacts/TARGET/`, and the fix starts by
//! copying it into `fuzz/regressions/TARGET/`, which the gate's FUZZ-SMOKE replays.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::util::{cargo_command, display_command, workspace_root};

/// Targets, as in `fuzz/Cargo.toml`.
pub const TARGETS: [&str; 6] = [
    "gguf_header",
    "model_open",
    "tokenizer",
    "chat_template",
    "sampler",
    "api_request",
];

/// Options of `cargo xtask fuzz`.
#[derive(clap::Args, Debug)]
pub struct FuzzArgs {
    /// Targets to run, one after the other (default: all).
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    pub targets: Vec<String>,
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Per-input time limit in seconds (a slower input counts as a hang).
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    /// Memory limit in MiB (an input that needs more counts as a crash).
    #[arg(long, default_value_t = 2048)]
    pub rss_limit_mb: u64,
}

/// What one run printed at its end.
#[derive(Debug, Default)]
struct Summary {
    runs: Option<u64>,
    cov: Option<u64>,
    features: Option<u64>,
    corpus: Option<u64>,
}

/// Reads libFuzzer's last status line (`#N ... cov: C ft: F corp: K/...`) and its
/// `Done N runs in S second(s)` line.
fn summarize(log: &str) -> Summary {
    let mut s = Summary::default();
    let field = |line: &str, key: &str| -> Option<u64> {
        let rest = line.split(key).nth(1)?;
        rest.split(|c: char| !c.is_ascii_digit())
            .find(|t| !t.is_empty())?
            .parse()
            .ok()
    };
    for line in log.lines() {
        if line.starts_with('#') && line.contains("cov: ") {
            s.cov = field(line, "cov: ").or(s.cov);
            s.features = field(line, "ft: ").or(s.features);
            s.corpus = field(line, "corp: ").or(s.corpus);
            s.runs = field(line, "#").or(s.runs);
        }
        if let Some(rest) = line.strip_prefix("Done ") {
            s.runs = rest
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .or(s.runs);
        }
    }
    s
}

fn show(v: Option<u64>) -> String {
    v.map_or_else(|| "?".into(), |n| n.to_string())
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    let root = workspace_root();
    check_cargo_fuzz()?;
    let corpus_root = root.join("target/fuzz/corpus");
    write_seeds(&corpus_root)?;
    let targets: Vec<&str> = if args.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        args.targets.iter().map(String::as_str).collect()
    };
    let mut failed = Vec::new();
    for target in targets {
        if !fuzz_target(args, &root, &corpus_root, target)? {
            failed.push(target);
        }
    }
    if !failed.is_empty() {
        bail!("fuzz targets failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Fails with how to install `cargo fuzz` when `cargo +nightly fuzz` does not run.
fn check_cargo_fuzz() -> Result<()> {
    let have_fuzz = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_fuzz {
        bail!(
            "`cargo +nightly fuzz` is not available: install it with `cargo install cargo-fuzz` \
             (and a nightly toolchain with `rustup toolchain install nightly`)"
        );
    }
    Ok(())
}

/// Writes the seed corpus (built from the synthetic fixtures) under `corpus_root`.
fn write_seeds(corpus_root: &Path) -> Result<()> {
    let mut seeds = cargo_command();
    seeds.args([
        "run",
        "--release",
        "-q",
        "-p",
        "nx-fuzz",
        "--bin",
        "nx-fuzz-seeds",
        "--",
    ]);
    seeds.arg(corpus_root);
    eprintln!("== {}", display_command(&seeds));
    if !seeds.status().context("running nx-fuzz-seeds")?.success() {
        bail!("writing the seed corpus failed");
    }
    Ok(())
}

/// Fuzzes one target for `args.seconds` and prints a summary line; `Ok(false)` when it
/// found a crashing input (kept under `target/fuzz/artifacts`).
fn fuzz_target(args: &FuzzArgs, root: &Path, corpus_root: &Path, target: &str) -> Result<bool> {
    let corpus = corpus_root.join(target);
    let regressions = root.join("fuzz/regressions").join(target);
    let corpus_min = root.join("fuzz/corpus-min").join(target);
    let artifacts = root.join("target/fuzz/artifacts").join(target);
    std::fs::create_dir_all(&artifacts)?;
    std::fs::create_dir_all(&regressions)?;
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        .args(["+nightly", "fuzz", "run", "--features", "libfuzzer", target])
        .arg(&corpus)
        .arg(&regressions)
        .args(corpus_min.is_dir().then_some(&corpus_min))
        .arg("--")
        .arg(format!("-max_total_time={}", args.seconds))
        .arg(format!("-timeout={}", args.timeout))
        .arg(format!("-rss_limit_mb={}", args.rss_limit_mb))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1");
    eprintln!("== {}", display_command(&cmd));
    let started = std::time::Instant::now();
    let output = cmd
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting cargo fuzz")?
        .wait_with_output()?;
    let log = String::from_utf8_lossy(&output.stderr);
    let log_path = root.join(format!("target/fuzz/{target}.log"));
    std::fs::write(&log_path, log.as_bytes())?;
    let s = summarize(&log);
    let verdict = if output.status.success() {
        "0 crashes".to_string()
    } else {
        format!(
            "FAILED ({}); the input is in {} — copy it into {} and fix",
            output.status,
            artifacts.display(),
            regressions.display()
        )
    };
    println!(
        "fuzz {target}: {} runs in {} s, cov {}, ft {}, corpus {}: {verdict} (log {})",
        show(s.runs),
        started.elapsed().as_secs(),
        show(s.cov),
        show(s.features),
        show(s.corpus),
        log_path.display()
    );
    Ok(output.status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_the_fuzz_crates_binaries_and_its_own_list() {
        // The names live in three places (this list, fuzz/Cargo.toml's [[bin]]s and
        // nx_fuzz::TARGETS); this keeps them one list.
        let root = crate::util::workspace_root();
        let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).unwrap();
        let mut bins = Vec::new();
        let mut in_bin = false;
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                in_bin = line == "[[bin]]";
            } else if in_bin {
                if let Some(name) = line.strip_prefix("name = ") {
                    bins.push(name.trim_matches('"').to_string());
                }
            }
        }
        assert_eq!(bins, TARGETS, "fuzz/Cargo.toml [[bin]] names");
        let lib = std::fs::read_to_string(root.join("fuzz/src/lib.rs")).unwrap();
        for t in TARGETS {
            assert!(
                lib.contains(&format!("\"{t}\"")),
                "{t} missing from nx_fuzz::TARGETS"
            );
        }
    }

    #[test]
    fn summary_reads_the_last_status_line() {
        let log = "#2\tINITED cov: 10 ft: 11 corp: 3/40b exec/s: 0 rss: 30Mb\n\
                   #1024\tpulse  cov: 120 ft: 300 corp: 50/2Kb lim: 80 exec/s: 512 rss: 40Mb\n\
                   Done 99999 runs in 1201 second(s)\n";
        let s = summarize(log);
        assert_eq!(s.cov, Some(120));
        assert_eq!(s.features, Some(300));
        assert_eq!(s.corpus, Some(50));
        assert_eq!(s.runs, Some(99999));
        assert!(summarize("nothing").cov.is_none());
    }
}
