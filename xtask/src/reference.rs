//! `cargo xtask reference`: build the llama.cpp reference tools once, outside the source tree.
//!
//! The build lives in `$NX_CACHE/llama.cpp/build` (binaries in `build/bin`), with logs
//! `cmake.log` and `build.log` next to it. It is skipped when every tool already exists;
//! a lock file (`build.lock`) keeps two xtask processes from building at once.

use crate::fetch::{ensure_llama_src, llama_root_dir, lock_file};
use crate::pins;
use crate::util::{display_command, duration_text};
use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Default parallelism of the reference build (the dev machines have two cores).
pub const DEFAULT_JOBS: u32 = 2;

/// The CMake build directory of the reference engine.
pub fn build_dir() -> PathBuf {
    llama_root_dir().join("build")
}

/// Path of a built llama.cpp tool, e.g. `llama_bin("llama-server")`. It exists only after
/// [`ensure_reference`] (or `cargo xtask reference`) succeeded.
pub fn llama_bin(name: &str) -> PathBuf {
    build_dir().join("bin").join(name)
}

/// The pinned tools that are not built yet.
pub fn missing_tools() -> Vec<&'static str> {
    pins::LLAMA_TOOLS
        .into_iter()
        .filter(|name| !llama_bin(name).is_file())
        .collect()
}

/// Makes every tool in [`pins::LLAMA_TOOLS`] present, building with `jobs` parallel jobs.
pub fn ensure_reference(jobs: u32) -> Result<()> {
    if missing_tools().is_empty() {
        eprintln!(
            "reference: llama.cpp tools already built in {} ({})",
            build_dir().join("bin").display(),
            pins::LLAMA_TOOLS.join(", ")
        );
        return Ok(());
    }
    let source = ensure_llama_src()?;
    let root = llama_root_dir();
    let _lock = lock_file(&root.join("build.lock"))?;
    let missing = missing_tools();
    if missing.is_empty() {
        eprintln!("reference: built by another process meanwhile");
        return Ok(());
    }
    eprintln!("reference: missing {}; building", missing.join(", "));

    let build = build_dir();
    let started = Instant::now();
    cmake_build(&source, &build, &[], &pins::LLAMA_TOOLS, jobs, "")?;

    let still_missing = missing_tools();
    if !still_missing.is_empty() {
        bail!(
            "the build finished but {} are missing in {}",
            still_missing.join(", "),
            build.join("bin").display()
        );
    }
    eprintln!(
        "reference: built {} in {}",
        pins::LLAMA_TOOLS.join(", "),
        duration_text(started.elapsed())
    );
    Ok(())
}

/// The build without AMX (`-mno-amx-*` on top of the pinned flags), for the benches: on
/// machines that report AMX but fault in its kernels, the pinned build dies as soon as
/// weight repacking picks them; this one keeps repacking and every other fast path.
pub fn no_amx_build_dir() -> PathBuf {
    llama_root_dir().join("build-noamx")
}

/// `llama-bench` of [`no_amx_build_dir`], built (once, about five minutes) if missing.
pub fn ensure_no_amx_bench(jobs: u32) -> Result<PathBuf> {
    ensure_no_amx_tool("llama-bench", jobs)
}

/// `llama-server` of [`no_amx_build_dir`] (the load test's reference where the pinned
/// build faults), built if missing.
pub fn ensure_no_amx_server(jobs: u32) -> Result<PathBuf> {
    ensure_no_amx_tool("llama-server", jobs)
}

/// `llama-imatrix` of [`no_amx_build_dir`] (the synthetic grid files' importance matrix
/// where the pinned build faults), built if missing.
pub fn ensure_no_amx_imatrix(jobs: u32) -> Result<PathBuf> {
    ensure_no_amx_tool("llama-imatrix", jobs)
}

fn ensure_no_amx_tool(tool: &str, jobs: u32) -> Result<PathBuf> {
    ensure_extra_tool(
        &no_amx_build_dir(),
        &pins::LLAMA_NO_AMX_FLAGS,
        ("noamx-", "without AMX"),
        tool,
        jobs,
    )
}

/// The AVX2-only build (no AVX-512, VNNI or AMX; [`pins::LLAMA_AVX2_FLAGS`]), for
/// benches of nx's `NX_TIER=avx2` on CPUs without AVX-VNNI: llama.cpp as it runs at its
/// best on a CPU without AVX-512 or AVX-VNNI.
pub fn avx2_build_dir() -> PathBuf {
    llama_root_dir().join("build-avx2")
}

/// `llama-bench` for AVX2 (what `NX_TIER=avx2 cargo xtask bench` compares against), as
/// [`ensure_avx2_tool`] builds it.
pub fn ensure_avx2_bench(jobs: u32) -> Result<(PathBuf, Avx2Build)> {
    ensure_avx2_tool("llama-bench", jobs)
}

/// The AVX2 build with AVX-VNNI on ([`pins::LLAMA_AVX2_VNNI_FLAGS`]).
pub fn avx2_vnni_build_dir() -> PathBuf {
    llama_root_dir().join("build-avx2-vnni")
}

/// `llama-server` for AVX2 (the load test's reference under `NX_TIER=avx2`), as
/// [`ensure_avx2_tool`] builds it.
pub fn ensure_avx2_server(jobs: u32) -> Result<(PathBuf, Avx2Build)> {
    ensure_avx2_tool("llama-server", jobs)
}

/// Which AVX2 build of llama.cpp stands in for it on a CPU without AVX-512.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Avx2Build {
    /// [`pins::LLAMA_AVX2_VNNI_FLAGS`]: where the CPU has AVX-VNNI.
    Vnni,
    /// [`pins::LLAMA_AVX2_FLAGS`]: AVX2 only.
    Plain,
}

impl Avx2Build {
    /// The build in a few words, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Avx2Build::Vnni => "for AVX2 with AVX-VNNI, no AVX-512 or AMX",
            Avx2Build::Plain => "for AVX2 only, no AVX-512, VNNI or AMX",
        }
    }
}

/// `tool` built for AVX2, once, if missing: with AVX-VNNI where the CPU has it (nx's AVX2
/// tier then uses it too, so this is llama.cpp at its best on such a CPU without
/// AVX-512), else with [`avx2_build_dir`]'s flags.
pub fn ensure_avx2_tool(tool: &str, jobs: u32) -> Result<(PathBuf, Avx2Build)> {
    #[cfg(target_arch = "x86_64")]
    let vnni = std::arch::is_x86_feature_detected!("avxvnni");
    #[cfg(not(target_arch = "x86_64"))]
    let vnni = false;
    let (dir, flags, log_prefix, build) = if vnni {
        let what = ("avx2-vnni-", "for AVX2 with AVX-VNNI");
        (
            avx2_vnni_build_dir(),
            &pins::LLAMA_AVX2_VNNI_FLAGS,
            what,
            Avx2Build::Vnni,
        )
    } else {
        let what = ("avx2-", "for AVX2 only");
        (
            avx2_build_dir(),
            &pins::LLAMA_AVX2_FLAGS,
            what,
            Avx2Build::Plain,
        )
    };
    let bin = ensure_extra_tool(&dir, flags, log_prefix, tool, jobs)?;
    Ok((bin, build))
}

/// `tool` of a second build in `dir` with `flags` added to the pinned ones (logs
/// prefixed `log_prefix`, the build described as `what` in progress lines), built once
/// under the build lock if missing.
fn ensure_extra_tool(
    dir: &Path,
    flags: &[&str],
    (log_prefix, what): (&str, &str),
    tool: &str,
    jobs: u32,
) -> Result<PathBuf> {
    let bin = dir.join("bin").join(tool);
    if bin.is_file() {
        return Ok(bin);
    }
    let source = ensure_llama_src()?;
    let _lock = lock_file(&llama_root_dir().join("build.lock"))?;
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!("reference: building {tool} {what} in {}", dir.display());
    let started = Instant::now();
    cmake_build(&source, dir, flags, &[tool], jobs, log_prefix)?;
    if !bin.is_file() {
        bail!("the build finished but {} is missing", bin.display());
    }
    eprintln!(
        "reference: built {tool} {what} in {}",
        duration_text(started.elapsed())
    );
    Ok(bin)
}

/// Configures `build` from `source` with the pinned flags plus `extra` and builds
/// `tools`; logs go to `<prefix>cmake.log` and `<prefix>build.log` in the llama.cpp root.
fn cmake_build(
    source: &Path,
    build: &Path,
    extra: &[&str],
    tools: &[&str],
    jobs: u32,
    log_prefix: &str,
) -> Result<()> {
    let root = llama_root_dir();
    let cmake = find_or_install_cmake()?;
    let mut configure = Command::new(&cmake);
    configure
        .arg("-S")
        .arg(source)
        .arg("-B")
        .arg(build)
        .args(pins::LLAMA_CMAKE_FLAGS)
        .args(extra);
    run_logged(
        &mut configure,
        &root.join(format!("{log_prefix}cmake.log")),
        "configure",
    )?;
    let mut compile = Command::new(&cmake);
    compile
        .arg("--build")
        .arg(build)
        .arg(format!("-j{jobs}"))
        .arg("--target")
        .args(tools);
    run_logged(
        &mut compile,
        &root.join(format!("{log_prefix}build.log")),
        "build",
    )
}

/// `cmake` from PATH; else the one from `python3 -m pip install cmake`.
fn find_or_install_cmake() -> Result<OsString> {
    let on_path = OsString::from("cmake");
    if cmake_works(&on_path) {
        return Ok(on_path);
    }
    if let Some(from_pip) = pip_cmake() {
        return Ok(from_pip);
    }
    let python = std::env::var_os("NX_PYTHON")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| OsString::from("python3"));
    crate::fetch::check_pip(&python)?;
    eprintln!("reference: cmake not found; installing it with `python3 -m pip install cmake`");
    let mut install = Command::new(&python);
    install.args(["-m", "pip", "install", "cmake"]);
    crate::util::run_checked(&mut install)?;
    match pip_cmake() {
        Some(cmake) => Ok(cmake),
        None => bail!(
            "`{}` succeeded but no working cmake was found",
            display_command(&install)
        ),
    }
}

fn cmake_works(program: &OsString) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The cmake binary that the `cmake` Python package ships, if it is installed and works.
fn pip_cmake() -> Option<OsString> {
    let python = std::env::var_os("NX_PYTHON")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| OsString::from("python3"));
    let out = Command::new(python)
        .args(["-c", "import cmake; print(cmake.CMAKE_BIN_DIR)"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let cmake = Path::new(&dir).join("cmake").into_os_string();
    cmake_works(&cmake).then_some(cmake)
}

/// Runs `cmd` with its output going to `log`; prints a line at each new tenth of the
/// `[ NN%]` progress cmake reports, and the log's tail when the command fails.
fn run_logged(cmd: &mut Command, log: &Path, what: &str) -> Result<()> {
    eprintln!(
        "reference: {what}: {} (log: {})",
        display_command(cmd),
        log.display()
    );
    let started = Instant::now();
    let log_file = Arc::new(Mutex::new(
        File::create(log).with_context(|| format!("cannot create {}", log.display()))?,
    ));
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not run `{}`", display_command(cmd)))?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let stderr_log = Arc::clone(&log_file);
    let stderr_thread = std::thread::spawn(move || copy_lines(stderr, &stderr_log, |_| {}));
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut last_tenth = None;
    copy_lines(stdout, &log_file, |line| {
        if let Some(percent) = progress_percent(line) {
            let tenth = percent / 10;
            if last_tenth != Some(tenth) {
                last_tenth = Some(tenth);
                eprintln!(
                    "reference: {what}: {percent:3}% after {}",
                    duration_text(started.elapsed())
                );
            }
        }
    });
    let _ = stderr_thread.join();
    let status = child.wait().context("waiting for cmake")?;
    if !status.success() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "`{}` failed ({status}); last lines of {}:\n{}",
            display_command(cmd),
            log.display(),
            tail.join("\n")
        );
    }
    eprintln!(
        "reference: {what}: done in {}",
        duration_text(started.elapsed())
    );
    Ok(())
}

fn copy_lines(source: impl Read, log: &Mutex<File>, mut on_line: impl FnMut(&str)) {
    let reader = BufReader::new(source);
    for line in reader.split(b'\n') {
        let Ok(line) = line else { break };
        let text = String::from_utf8_lossy(&line);
        if let Ok(mut file) = log.lock() {
            let _ = writeln!(file, "{text}");
        }
        on_line(&text);
    }
}

/// `Some(92)` for a line starting with `[ 92%]`, as make's progress lines do.
fn progress_percent(line: &str) -> Option<u32> {
    let rest = line.trim_start().strip_prefix('[')?;
    let (number, _) = rest.split_once("%]")?;
    number.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_are_parsed() {
        assert_eq!(
            progress_percent("[ 92%] Building CXX object tools/server/x.o"),
            Some(92)
        );
        assert_eq!(
            progress_percent("[100%] Built target llama-server"),
            Some(100)
        );
        assert_eq!(progress_percent("[  0%] Generating build details"), Some(0));
        assert_eq!(progress_percent("-- Configuring done"), None);
        assert_eq!(progress_percent("[abc%] nope"), None);
    }

    #[test]
    fn logged_command_writes_both_streams_and_reports_failure_with_the_tail() {
        let dir = crate::util::TestDir::new("run-logged");
        let log = dir.path().join("build.log");
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo '[ 10%] one'; echo oops >&2; echo '[100%] done'"]);
        run_logged(&mut ok, &log, "build").unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        for line in ["[ 10%] one", "oops", "[100%] done"] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from {text:?}"
            );
        }

        let mut failing = Command::new("sh");
        failing.args(["-c", "echo 'last words'; exit 3"]);
        let err = run_logged(&mut failing, &log, "build")
            .unwrap_err()
            .to_string();
        assert!(err.contains("exit status: 3"), "{err}");
        assert!(err.contains("last words"), "{err}");
    }

    #[test]
    fn tool_paths_live_in_build_bin() {
        let server = llama_bin("llama-server");
        assert!(
            server.ends_with("llama.cpp/build/bin/llama-server"),
            "{server:?}"
        );
    }
}
