//! `cargo xtask miri`: the unsafe-code and parser tests under Miri (`cargo +nightly
//! miri test`), which reports undefined behaviour: out-of-bounds or misaligned access,
//! use after free, data races, invalid values.
//!
//! Miri runs code thousands of times slower than native, so the runs are chosen: the
//! crates whose inputs come from strangers (nx-gguf, nx-bpe, nx-sampler) and the ones
//! with unsafe code (nx-kv-cache's block pool, nx-syscalls' buffers and thread pool,
//! nx-lazy-weight's and nx-f32's scalar kernels; the SIMD tiers are not Miri's to run,
//! and under Miri tier detection finds none, so the dispatchers pick the scalar kernels
//! as they would on a baseline x86-64 CPU). Proptests run 4 cases under Miri. What
//! is skipped says why in its `#[cfg_attr(miri, ignore = "…")]`. The gate runs
//! [`QUICK`]; `cargo xtask miri` runs [`FULL`] (with [`FULL_FLAGS`]).

use std::process::Command;

use anyhow::{bail, Result};

use crate::util::{display_command, duration_text};

/// One `cargo miri test` invocation.
#[derive(Debug, Clone, Copy)]
pub struct MiriRun {
    /// Package.
    pub package: &'static str,
    /// Arguments after `-p PACKAGE` (test targets, then `--` and filters).
    pub args: &'static [&'static str],
}

const fn run(package: &'static str, args: &'static [&'static str]) -> MiriRun {
    MiriRun { package, args }
}

/// The gate's subset (a few minutes): the GGUF reader's known-bug files, the byte-token
/// file, the paged KV block pool, aligned buffers and the worker pool's hand-out.
pub const QUICK: &[MiriRun] = &[
    run("nx-gguf", &["--lib", "--test", "known_bugs"]),
    run("nx-bpe", &["--test", "hostile_vocab", "--", "byte_tokens"]),
    run("nx-kv-cache", &["--test", "paged"]),
    run(
        "nx-syscalls",
        &["--lib", "--", "aligned", "every_item_runs_exactly_once"],
    ),
];

/// `MIRIFLAGS` of the gate's subset: tests read `$NX_CACHE` and write temporary files.
pub const QUICK_FLAGS: &str = "-Zmiri-disable-isolation";

/// `MIRIFLAGS` of the full run: also deterministic floats. Miri otherwise adds a random
/// error of a few ulps to `exp`, `sin`, `cos`, `tanh` …, which the f32 kernels' tests
/// (bit-identical RoPE tables, GELU tables, softmax) rightly reject; with it Miri still
/// reports every undefined behaviour, and the libm results are the host's.
pub const FULL_FLAGS: &str = "-Zmiri-disable-isolation -Zmiri-deterministic-floats";

/// Everything Miri can run in reasonable time.
pub const FULL: &[MiriRun] = &[
    run("nx-gguf", &["--lib", "--tests"]),
    run("nx-bpe", &["--lib", "--tests"]),
    run("nx-kv-cache", &["--lib", "--tests"]),
    // The statistical tests draw tens of thousands of tokens over large vocabularies:
    // hours under Miri, and no unsafe code of nx's own to reach.
    run(
        "nx-sampler",
        &[
            "--lib",
            "--tests",
            "--",
            "--skip",
            "different_seeds",
            "--skip",
            "follow",
            "--skip",
            "large_vocabulary",
        ],
    ),
    run("nx-syscalls", &["--lib", "--tests"]),
    run("nx-f32", &["--lib", "--test", "kernels"]),
    // The quantize/dequantize and dot-product tests on small rows; the matmul and
    // thread-invariance tests multiply model-sized matrices (hours under Miri) with the
    // same kernels.
    run(
        "nx-lazy-weight",
        &[
            "--lib",
            "--test",
            "roundtrip",
            "--test",
            "gguf_views",
            "--test",
            "dequant_golden",
            "--test",
            "dot_proptest",
            "--test",
            "dot_reference",
        ],
    ),
];

/// Whether `cargo +nightly miri` runs; if not, tries to add the component once.
fn miri_available() -> Result<(), String> {
    let works = || {
        Command::new("cargo")
            .args(["+nightly", "miri", "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works() {
        return Ok(());
    }
    eprintln!(
        "miri: not installed; trying `rustup component add --toolchain nightly miri rust-src`"
    );
    let added = Command::new("rustup")
        .args([
            "component",
            "add",
            "--toolchain",
            "nightly",
            "miri",
            "rust-src",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if added && works() {
        Ok(())
    } else {
        Err("no nightly toolchain with the miri component (and it could not be added)".into())
    }
}

/// Runs `runs` under Miri; fails on any report or test failure. Without a Miri to run
/// (no nightly toolchain, no way to add the component) it says so and skips.
pub fn run_all(runs: &[MiriRun], flags: &str) -> Result<()> {
    if let Err(why) = miri_available() {
        eprintln!("miri: SKIPPED: {why}");
        return Ok(());
    }
    let mut failed = Vec::new();
    for r in runs {
        let mut cmd = Command::new("cargo");
        cmd.args([
            "+nightly",
            "miri",
            "test",
            "--no-fail-fast",
            "-p",
            r.package,
        ])
        .args(r.args)
        .env("MIRIFLAGS", flags);
        eprintln!("$ MIRIFLAGS={flags:?} {}", display_command(&cmd));
        let start = std::time::Instant::now();
        let ok = cmd.status().is_ok_and(|s| s.success());
        eprintln!(
            "miri {} {}: {} in {}",
            r.package,
            r.args.join(" "),
            if ok { "ok" } else { "FAILED" },
            duration_text(start.elapsed())
        );
        if !ok {
            failed.push(r.package);
        }
    }
    if !failed.is_empty() {
        bail!("Miri failed in {}", failed.join(", "));
    }
    Ok(())
}
