//! `cargo xtask golden ppl`: llama.cpp's `llama-perplexity` on the default model and a
//! public English text, recorded for the GOLD-PPL gate.
//!
//! Runs `llama-perplexity -m MODEL -f TEXT -c 512` with [`PPL_ARGS`] and writes
//! `fixtures/golden/ppl-gemma3-270m.json` (schema: [`PplGolden`]): the text's path, size
//! and SHA-256, the window length, the number of windows, the final `PPL` and its `+/-`,
//! and the running estimate after each window. `--check` runs the reference again and
//! fails if any figure moved by more than [`RELATIVE_TOLERANCE`] or the text changed.

use crate::fetch::{ensure_model, sha256_file};
use crate::pins;
use crate::reference::{ensure_reference, llama_bin, DEFAULT_JOBS};
use crate::synth::TEXT_PATH;
use crate::util::{display_command, duration_text, workspace_root};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
/// Window length (`-c`).
pub const N_CTX: usize = 512;
/// Committed golden file, relative to the workspace root.
pub const GOLDEN_PATH: &str = "fixtures/golden/ppl-gemma3-270m.json";
/// `--check` accepts figures this far (relative) from the committed ones.
pub const RELATIVE_TOLERANCE: f64 = 1e-4;

/// Flags that affect the numbers (besides `-m`, `-f` and `-c`); see
/// [`super::forward::SERVER_ARGS`] for why each is there:
/// - `-fa off -ctk f32 -ctv f32`: plain attention over an f32 cache (with an f16 cache
///   the batched path computes `K·Q` with another kernel than one-token decoding).
/// - `--no-repack`: ggml's standard kernels (the repacked/AMX ones differ per CPU, and
///   SIGILL on machines that report AMX without enabling it).
/// - `-t 2`: the dev machines' core count.
pub const PPL_ARGS: [&str; 9] = [
    "-t",
    "2",
    "-fa",
    "off",
    "--no-repack",
    "-ctk",
    "f32",
    "-ctv",
    "f32",
];

/// Content of `fixtures/golden/ppl-gemma3-270m.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PplGolden {
    /// The model file name (the default model).
    pub model: String,
    /// Its pinned SHA-256.
    pub model_sha256: String,
    /// llama.cpp version of the reference.
    pub llama_cpp: String,
    /// Absolute path of the text.
    pub text_path: String,
    /// Size of the text in bytes.
    pub text_bytes: u64,
    /// SHA-256 of the text; the gate refuses to compare if it differs.
    pub text_sha256: String,
    /// Window length.
    pub n_ctx: usize,
    /// Windows scored (all that fit in the text).
    pub n_chunks: usize,
    /// Reference flags besides `-m`, `-f` and `-c`.
    pub args: Vec<String>,
    /// llama.cpp's `Final estimate: PPL = X`.
    pub ppl: f64,
    /// llama.cpp's `+/- Y`.
    pub ppl_error: f64,
    /// llama.cpp's `[k]value` running estimates, one per window.
    pub running_ppl: Vec<f64>,
}

/// Path of the committed golden file.
pub fn golden_path() -> PathBuf {
    workspace_root().join(GOLDEN_PATH)
}

/// Entry point (see the module docs).
pub fn run(check: bool) -> Result<()> {
    let text = Path::new(TEXT_PATH);
    if !text.is_file() {
        bail!("{TEXT_PATH} is missing (Debian's base-files package ships it)");
    }
    let model = ensure_model()?;
    ensure_reference(DEFAULT_JOBS)?;
    let golden = generate(&model, text)?;
    eprintln!(
        "golden ppl: llama.cpp: PPL = {:.4} +/- {:.5} over {} windows of {}",
        golden.ppl, golden.ppl_error, golden.n_chunks, golden.n_ctx
    );
    let path = golden_path();
    if check {
        let text =
            fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let committed: PplGolden = serde_json::from_str(&text)
            .with_context(|| format!("cannot parse {}", path.display()))?;
        let diffs = compare(&committed, &golden);
        if !diffs.is_empty() {
            for d in &diffs {
                eprintln!("golden ppl: {d}");
            }
            bail!(
                "{} differs from llama.cpp ({} differences); run `cargo xtask golden ppl` to regenerate",
                path.display(),
                diffs.len()
            );
        }
        eprintln!("golden ppl: matches {}", path.display());
    } else {
        let dir = path.parent().context("golden path without a directory")?;
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut json = serde_json::to_string_pretty(&golden)?;
        json.push('\n');
        let temp = path.with_extension(format!("json.tmp-{}", crate::util::unique_suffix()));
        fs::write(&temp, json).with_context(|| format!("cannot write {}", temp.display()))?;
        fs::rename(&temp, &path).with_context(|| format!("cannot rename to {}", path.display()))?;
        eprintln!("golden ppl: wrote {}", path.display());
    }
    Ok(())
}

/// Runs the reference on `text` and collects the golden data.
pub fn generate(model: &Path, text: &Path) -> Result<PplGolden> {
    let (text_bytes, text_sha256) = sha256_file(text)?;
    let mut cmd = Command::new(llama_bin("llama-perplexity"));
    cmd.arg("-m")
        .arg(model)
        .arg("-f")
        .arg(text)
        .arg("-c")
        .arg(N_CTX.to_string())
        .args(PPL_ARGS);
    eprintln!("golden ppl: running {}", display_command(&cmd));
    let started = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {}", display_command(&cmd)))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!(
            "llama-perplexity failed ({}): {}",
            out.status,
            tail(&stderr, 2000)
        );
    }
    eprintln!(
        "golden ppl: llama-perplexity took {}",
        duration_text(started.elapsed())
    );
    // llama.cpp logs the running estimates without a level (stdout) and the final line at
    // info level (stderr); read both streams so neither routing matters.
    let all = format!("{stdout}\n{stderr}");
    let running_ppl = parse_running(&all);
    let (ppl, ppl_error) = parse_final(&all).with_context(|| {
        format!(
            "no `Final estimate: PPL = X +/- Y` in llama-perplexity's output: {}",
            tail(&all, 2000)
        )
    })?;
    let n_chunks = parse_chunk_count(&all)
        .context("no `calculating perplexity over N chunks` in llama-perplexity's output")?;
    if running_ppl.len() != n_chunks {
        bail!(
            "llama-perplexity announced {n_chunks} chunks but printed {} running estimates",
            running_ppl.len()
        );
    }
    let last = *running_ppl.last().context("no running estimates")?;
    if (last - ppl).abs() > 1e-4 * ppl {
        bail!("the last running estimate {last} is not the final PPL {ppl}");
    }
    Ok(PplGolden {
        model: pins::DEFAULT_MODEL.file_name.to_string(),
        model_sha256: pins::DEFAULT_MODEL.sha256.to_string(),
        llama_cpp: llama_cpp_version(),
        text_path: text.display().to_string(),
        text_bytes,
        text_sha256,
        n_ctx: N_CTX,
        n_chunks,
        args: PPL_ARGS.iter().map(|s| s.to_string()).collect(),
        ppl,
        ppl_error,
        running_ppl,
    })
}

fn llama_cpp_version() -> String {
    let req = pins::LLAMA_SDIST.requirement;
    req.split_once("==").map_or(req, |(_, v)| v).to_string()
}

/// Every `[k]value,` figure in order, checking `k` counts 1, 2, 3, …
pub fn parse_running(out: &str) -> Vec<f64> {
    let mut values = Vec::new();
    let mut rest = out;
    while let Some(open) = rest.find('[') {
        rest = &rest[open + 1..];
        let Some(close) = rest.find(']') else { break };
        let Ok(k) = rest[..close].parse::<usize>() else {
            continue;
        };
        let after = &rest[close + 1..];
        let Some(comma) = after.find(',') else { break };
        let Ok(v) = after[..comma].parse::<f64>() else {
            continue;
        };
        if k == values.len() + 1 {
            values.push(v);
        }
        rest = &after[comma..];
    }
    values
}

/// `(ppl, error)` from `Final estimate: PPL = X +/- Y`.
pub fn parse_final(out: &str) -> Option<(f64, f64)> {
    let key = "Final estimate: PPL = ";
    let start = out.find(key)? + key.len();
    let line = out[start..].lines().next()?;
    let (ppl, err) = line.split_once("+/-")?;
    Some((ppl.trim().parse().ok()?, err.trim().parse().ok()?))
}

/// `N` from `calculating perplexity over N chunks`.
pub fn parse_chunk_count(out: &str) -> Option<usize> {
    let key = "calculating perplexity over ";
    let start = out.find(key)? + key.len();
    out[start..].split_whitespace().next()?.parse().ok()
}

/// Differences between the committed and the fresh golden data, one line each.
pub fn compare(committed: &PplGolden, fresh: &PplGolden) -> Vec<String> {
    let mut diffs = Vec::new();
    let same = |a: f64, b: f64| (a - b).abs() <= RELATIVE_TOLERANCE * a.abs().max(b.abs());
    if committed.text_sha256 != fresh.text_sha256 {
        diffs.push(format!(
            "{}: SHA-256 {} now, {} when recorded",
            fresh.text_path, fresh.text_sha256, committed.text_sha256
        ));
    }
    for (name, a, b) in [
        ("model_sha256", &committed.model_sha256, &fresh.model_sha256),
        ("text_path", &committed.text_path, &fresh.text_path),
        ("llama_cpp", &committed.llama_cpp, &fresh.llama_cpp),
    ] {
        if a != b {
            diffs.push(format!("{name}: committed {a}, now {b}"));
        }
    }
    if committed.args != fresh.args {
        diffs.push(format!(
            "args: committed {:?}, now {:?}",
            committed.args, fresh.args
        ));
    }
    if committed.n_ctx != fresh.n_ctx || committed.n_chunks != fresh.n_chunks {
        diffs.push(format!(
            "windows: committed {} of {}, now {} of {}",
            committed.n_chunks, committed.n_ctx, fresh.n_chunks, fresh.n_ctx
        ));
    }
    if !same(committed.ppl, fresh.ppl) {
        diffs.push(format!(
            "PPL: committed {}, now {}",
            committed.ppl, fresh.ppl
        ));
    }
    if !same(committed.ppl_error, fresh.ppl_error) {
        diffs.push(format!(
            "PPL error: committed {}, now {}",
            committed.ppl_error, fresh.ppl_error
        ));
    }
    for (k, (a, b)) in committed
        .running_ppl
        .iter()
        .zip(&fresh.running_ppl)
        .enumerate()
    {
        if !same(*a, *b) {
            diffs.push(format!("[{}]: committed {a}, now {b}", k + 1));
        }
    }
    diffs
}

fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    // Output shaped like llama-perplexity's (stdout then stderr, interleaved logging).
    const SAMPLE: &str =
        "perplexity: calculating perplexity over 3 chunks, n_ctx=512, batch_size=2048, n_seq=4\n\
        perplexity: 57.98 seconds per pass - ETA 3.37 minutes\n\
        [1]12.9110,[2]13.8597,[3]13.7620,\n\
        0.03.36.808.625 I Final estimate: PPL = 13.7620 +/- 0.64587\n";

    #[test]
    fn parses_llama_perplexity_output() {
        assert_eq!(parse_running(SAMPLE), vec![12.9110, 13.8597, 13.7620]);
        assert_eq!(parse_final(SAMPLE), Some((13.7620, 0.64587)));
        assert_eq!(parse_chunk_count(SAMPLE), Some(3));
        assert_eq!(parse_final("no estimate"), None);
        // Bracketed text that is not an estimate is skipped; a gap stops the count.
        assert_eq!(parse_running("[x]1.0,[1]2.5,[3]4.0,"), vec![2.5]);
    }

    fn golden() -> PplGolden {
        PplGolden {
            model: "m".into(),
            model_sha256: "a".into(),
            llama_cpp: "1".into(),
            text_path: TEXT_PATH.into(),
            text_bytes: 10,
            text_sha256: "b".into(),
            n_ctx: 512,
            n_chunks: 2,
            args: vec!["-t".into()],
            ppl: 10.0,
            ppl_error: 0.5,
            running_ppl: vec![9.0, 10.0],
        }
    }

    #[test]
    fn compare_tolerates_rounding_and_reports_real_changes() {
        let a = golden();
        let mut b = golden();
        b.ppl = 10.0005; // 5e-5 relative
        assert!(compare(&a, &b).is_empty());
        b.running_ppl[0] = 9.1;
        b.text_sha256 = "c".into();
        let diffs = compare(&a, &b);
        assert_eq!(diffs.len(), 2, "{diffs:?}");
        assert!(diffs.iter().any(|d| d.contains("SHA-256")));
        assert!(diffs.iter().any(|d| d.starts_with("[1]")));
    }
}
