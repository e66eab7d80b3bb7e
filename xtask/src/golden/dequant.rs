//! `cargo xtask golden dequant`: bit-exact dequantization fixtures from an independent oracle.
//!
//! Runs `xtask/scripts/dequant_golden.py` (Python `gguf` 0.19.0, `gguf.quants`) on the
//! default model into a temporary directory, then either installs the JSON files into
//! `fixtures/dequant/` or, with `--check`, compares them with the committed ones. The
//! Rust side (`crates/nx-lazy-weight/tests/dequant_golden.rs`) reads only the JSON.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::fetch::default_model_path;
use crate::util::{display_command, run_checked, unique_suffix, workspace_root};

/// The pinned oracle version (the fixtures record it; a different one may differ).
const GGUF_PIN: &str = "gguf==0.19.0";

/// Where the fixtures live, relative to the workspace root.
const FIXTURE_DIR: &str = "fixtures/dequant";

/// Regenerates (or, with `check`, verifies) the dequant golden files.
pub fn run(check: bool) -> Result<()> {
    let model = default_model_path();
    if !model.is_file() {
        bail!(
            "default model not found at {} (run `cargo xtask fetch --model` first)",
            model.display()
        );
    }
    let python = python_program();
    ensure_gguf(&python)?;

    let tmp = TempDir::new("dequant-golden")?;
    let script = workspace_root().join("xtask/scripts/dequant_golden.py");
    let mut cmd = Command::new(&python);
    cmd.arg(&script).arg(&model).arg(tmp.path());
    run_checked(&mut cmd)?;

    let fixtures = workspace_root().join(FIXTURE_DIR);
    let generated = json_files(tmp.path())?;
    if generated.is_empty() {
        bail!("{} wrote no JSON files", script.display());
    }
    if check {
        compare(&generated, tmp.path(), &fixtures)
    } else {
        std::fs::create_dir_all(&fixtures)
            .with_context(|| format!("create {}", fixtures.display()))?;
        for name in &generated {
            let from = tmp.path().join(name);
            let to = fixtures.join(name);
            std::fs::copy(&from, &to)
                .with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
        }
        eprintln!(
            "golden dequant: wrote {} files to {}",
            generated.len(),
            fixtures.display()
        );
        Ok(())
    }
}

/// Compares generated files with the committed ones as parsed JSON (formatting aside).
fn compare(generated: &[String], tmp: &Path, fixtures: &Path) -> Result<()> {
    const REGEN: &str = "run `cargo xtask golden dequant` to regenerate";
    let committed = if fixtures.is_dir() {
        json_files(fixtures)?
    } else {
        Vec::new()
    };
    let mut problems = Vec::new();
    for name in generated {
        let fresh = read_json(&tmp.join(name))?;
        let path = fixtures.join(name);
        if !path.is_file() {
            problems.push(format!("{name}: missing from {}", fixtures.display()));
            continue;
        }
        let old = read_json(&path)?;
        if let Some(diff) = first_difference(&old, &fresh, name) {
            problems.push(diff);
        }
    }
    for name in &committed {
        if !generated.contains(name) {
            problems.push(format!("{name}: committed but no longer generated"));
        }
    }
    if !problems.is_empty() {
        bail!(
            "fixtures/dequant is stale:\n  {}\n{REGEN}",
            problems.join("\n  ")
        );
    }
    eprintln!(
        "golden dequant: {} files match {}",
        generated.len(),
        fixtures.display()
    );
    Ok(())
}

/// A short description of where two JSON values first differ, if they do.
fn first_difference(old: &serde_json::Value, new: &serde_json::Value, at: &str) -> Option<String> {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, av) in a {
                match b.get(key) {
                    None => return Some(format!("{at}.{key}: removed")),
                    Some(bv) => {
                        if let Some(d) = first_difference(av, bv, &format!("{at}.{key}")) {
                            return Some(d);
                        }
                    }
                }
            }
            b.keys()
                .find(|k| !a.contains_key(*k))
                .map(|k| format!("{at}.{k}: added"))
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                return Some(format!("{at}: length {} -> {}", a.len(), b.len()));
            }
            a.iter()
                .zip(b)
                .enumerate()
                .find_map(|(i, (x, y))| first_difference(x, y, &format!("{at}[{i}]")))
        }
        _ if old == new => None,
        _ => {
            let short = |v: &Value| {
                let s = v.to_string();
                if s.len() > 40 {
                    format!("{}…", &s[..40])
                } else {
                    s
                }
            };
            Some(format!("{at}: {} -> {}", short(old), short(new)))
        }
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
}

/// Sorted names of the `*.json` files in `dir`.
fn json_files(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The Python to use: `$NX_PYTHON`, default `python3`.
fn python_program() -> OsString {
    std::env::var_os("NX_PYTHON")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| OsString::from("python3"))
}

/// Installs the pinned `gguf` package with pip when `import gguf` fails.
fn ensure_gguf(python: &OsString) -> Result<()> {
    let mut probe = Command::new(python);
    probe.args(["-c", "import gguf, numpy"]);
    let ok = probe
        .output()
        .map(|o| o.status.success())
        .with_context(|| format!("could not run `{}`", display_command(&probe)))?;
    if ok {
        return Ok(());
    }
    eprintln!("golden dequant: installing {GGUF_PIN} with pip");
    let mut install = Command::new(python);
    install.args(["-m", "pip", "install", GGUF_PIN]);
    run_checked(&mut install)
}

/// A directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(label: &str) -> Result<TempDir> {
        let dir = std::env::temp_dir().join(format!("nx-{label}-{}", unique_suffix()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(TempDir(dir))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn difference_names_the_path() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"rows":[{"v":["00","01"]},{"v":["02"]}]}"#).unwrap();
        let b: serde_json::Value =
            serde_json::from_str(r#"{"rows":[{"v":["00","01"]},{"v":["03"]}]}"#).unwrap();
        assert_eq!(first_difference(&a, &a, "f"), None);
        let d = first_difference(&a, &b, "f").unwrap();
        assert_eq!(d, r#"f.rows[1].v[0]: "02" -> "03""#);
    }
}
