//! `cargo xtask bench --spec`: nx with prompt-lookup speculation, nx without, and
//! llama.cpp's plain decode, on the same file and threads in one run, as ratios.
//!
//! Each prompt runs `nx run -f PROMPT --temp 0 -n N -t T` with and without
//! `--spec ngram`, alternating, `--reps` times; the generated text of every speculative
//! run must equal the plain one byte for byte (else the bench fails: speculation must
//! never change an answer). llama.cpp's plain decode is `llama-bench -n N` on the same
//! file, in the configuration `cargo xtask bench` uses. Grounded prompts (copy a list, a
//! passage, a piece of code) are where drafts come true; ordinary ones show what
//! speculation costs where they mostly do not. The table goes to its own section of
//! `docs/benchmarks.md`.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::bench::{llama_args, median, parse_llama_json, LlamaBench, Settings};
use crate::reference::llama_bin;
use crate::sections::{pinned_tier, spec_markers};
use crate::util::{cargo_command, duration_text, run_checked, workspace_root};

/// Tokens generated per run.
const N_GEN: usize = 128;

/// A prompt of the bench: a name, whether its answer is in the prompt, the text.
struct Prompt {
    name: &'static str,
    grounded: bool,
    text: String,
}

fn prompts() -> Vec<Prompt> {
    let items = [
        "apples",
        "bread",
        "carrots",
        "dates",
        "eggs",
        "flour",
        "grapes",
        "honey",
        "ice cream",
        "jam",
        "kale",
        "lemons",
        "milk",
        "noodles",
    ];
    let list: String = items
        .iter()
        .enumerate()
        .map(|(i, x)| format!("{}. {x}\n", i + 1))
        .collect();
    let passage = "The printing press, developed by Johannes Gutenberg around 1440, \
        changed how knowledge spread across Europe. Before it, books were copied by hand, \
        a slow and costly task that kept them in the hands of a few. With movable metal \
        type, a workshop could print hundreds of pages a day, and within fifty years \
        presses were running in more than two hundred cities. Cheaper books meant more \
        readers, and more readers meant that new ideas in science, religion and politics \
        travelled faster than ever before.";
    let code = "def moving_average(values, n):\n    if n <= 0:\n        raise ValueError(\"n must be positive\")\n    out = []\n    total = 0.0\n    for i, v in enumerate(values):\n        total += v\n        if i >= n:\n            total -= values[i - n]\n        if i >= n - 1:\n            out.append(total / n)\n    return out\n";
    vec![
        Prompt {
            name: "grounded: repeat a 14-item list",
            grounded: true,
            text: format!(
                "Repeat the list exactly.\n\nList:\n{list}\nRepeated list:\n{list}\nRepeated list again:\n"
            ),
        },
        Prompt {
            name: "grounded: copy a 100-word passage",
            grounded: true,
            text: format!("Copy the passage word for word.\n\nPassage:\n{passage}\n\nCopy:\n"),
        },
        Prompt {
            name: "grounded: rewrite a function with one name changed",
            grounded: true,
            text: format!(
                "Rewrite the function with `values` renamed to `xs`, changing nothing else.\n\n```python\n{code}```\n\nRewritten:\n```python\n"
            ),
        },
        Prompt {
            name: "ordinary: a story",
            grounded: false,
            text: "Once upon a time, in a small village by the sea, there lived".to_string(),
        },
        Prompt {
            name: "ordinary: an essay",
            grounded: false,
            text: "The history of the bicycle begins".to_string(),
        },
    ]
}

/// What one `nx run` printed.
struct NxRun {
    text: Vec<u8>,
    tg_tps: f64,
    drafts: Option<(u64, u64)>,
}

/// `generation: 128 tokens, 56.7 tok/s` and `drafts: 103 of 109 accepted` from the
/// statistics line of `nx run`.
pub fn parse_stats(stderr: &str) -> Option<(f64, Option<(u64, u64)>)> {
    let line = stderr.lines().rev().find(|l| l.contains("generation:"))?;
    let after = line.split("generation:").nth(1)?;
    let mut speed = after.split(',').nth(1)?.split_whitespace();
    let tg = speed.next()?.parse().ok()?;
    if speed.next()? != "tok/s" {
        return None;
    }
    let drafts = line.split("drafts:").nth(1).and_then(|d| {
        let mut words = d.split_whitespace();
        let kept = words.next()?.parse().ok()?;
        let _of = words.next()?;
        let drafted = words.next()?.parse().ok()?;
        Some((kept, drafted))
    });
    Some((tg, drafts))
}

/// How a run speculates: not at all, prompt lookup, or with a draft model.
#[derive(Clone, Copy)]
enum Spec<'a> {
    Plain,
    Ngram,
    Draft(&'a Path),
}

fn run_nx(
    nx: &Path,
    model: &Path,
    prompt: &Path,
    (threads, tier): (usize, Option<&str>),
    spec: Spec<'_>,
) -> Result<NxRun> {
    let mut cmd = Command::new(nx);
    if tier.is_some() {
        // A pinned tier is measured without the AMX tiles of the top tier as well.
        cmd.env("NX_AMX", "0");
    }
    cmd.arg("run")
        .arg("--model")
        .arg(model)
        .arg("-f")
        .arg(prompt);
    cmd.args([
        "--temp",
        "0",
        "-n",
        &N_GEN.to_string(),
        "-t",
        &threads.to_string(),
    ]);
    match spec {
        Spec::Plain => {}
        Spec::Ngram => {
            cmd.args(["--spec", "ngram"]);
        }
        Spec::Draft(draft) => {
            cmd.args(["--spec", "draft", "--draft-model"]).arg(draft);
        }
    }
    let out = cmd
        .output()
        .with_context(|| format!("could not run {}", nx.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("nx run failed ({}): {}", out.status, stderr.trim());
    }
    let (tg_tps, drafts) =
        parse_stats(&stderr).with_context(|| format!("no statistics line in: {stderr}"))?;
    Ok(NxRun {
        text: out.stdout,
        tg_tps,
        drafts,
    })
}

/// One prompt's medians.
struct Row {
    name: &'static str,
    grounded: bool,
    plain: f64,
    spec: f64,
    kept: u64,
    drafted: u64,
}

/// `cargo xtask bench --spec`.
pub fn run(reps: usize, threads: usize, no_build: bool) -> Result<()> {
    if reps == 0 || threads == 0 {
        bail!("--reps and --threads must be at least 1");
    }
    let started = Instant::now();
    let tier = pinned_tier()?;
    let model = crate::bench::resolve_model("default")?;
    let target = crate::machine::target_dir()?;
    let nx = target.join("release").join("nx");
    if !no_build {
        eprintln!("bench --spec: building nx (release)");
        run_checked(cargo_command().args(["build", "--release", "-p", "nx-cli", "--bin", "nx"]))?;
    }
    let llama = crate::bench::choose_llama_bench(&model, threads)?;
    let llamas = crate::bench::llama_variants(&llama);
    eprintln!(
        "bench --spec: llama.cpp configuration: {}",
        crate::bench::llama_config_text(&llamas)
    );
    let dir = target.join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;

    let llama_tg = llama_decode(&llamas, &model, reps, threads)?;
    let pinned = (threads, tier);
    let rows = measure(&nx, &model, Spec::Ngram, &dir, reps, pinned)?;
    let mut section = section(&rows, llama_tg, reps, threads, tier);

    // The draft pair: a dearer target and a cheaper draft with the same vocabulary,
    // both made from the default model by the pinned llama-quantize.
    let target_file = requantized(&model, "Q8_0")?;
    let draft_file = requantized(&model, "Q4_0")?;
    let pair_llama_tg = llama_decode(&llamas, &target_file, reps, threads)?;
    let pair_rows = measure(
        &nx,
        &target_file,
        Spec::Draft(&draft_file),
        &dir,
        reps,
        pinned,
    )?;
    section.push_str(&draft_section(
        &pair_rows,
        pair_llama_tg,
        reps,
        threads,
        tier,
    ));
    let (begin, end) = spec_markers(tier);
    let section = format!("{begin}\n{section}{end}\n");
    println!("{section}");
    let docs = workspace_root().join("docs").join("benchmarks.md");
    let old = std::fs::read_to_string(&docs).unwrap_or_default();
    let text = crate::util::replace_doc_section(&old, &begin, &end, &section);
    std::fs::write(&docs, text).with_context(|| format!("cannot write {}", docs.display()))?;
    eprintln!(
        "bench --spec: wrote {} in {}",
        docs.display(),
        duration_text(started.elapsed())
    );
    Ok(())
}

/// llama.cpp's plain decode of `model`: the median of `reps` runs of `llama-bench -n N`.
fn llama_decode(llamas: &[LlamaBench], model: &Path, reps: usize, threads: usize) -> Result<f64> {
    let settings = Settings {
        n_prompt: 16,
        n_gen: N_GEN,
        reps: 1,
        threads,
    };
    // Per configuration (repacking on and off) its median; the faster one counts.
    let mut best: Option<f64> = None;
    for llama in llamas {
        let mut tg = Vec::new();
        for rep in 0..reps {
            eprintln!(
                "bench --spec: llama-bench -n {N_GEN} --repack {} on {} ({}/{reps})",
                u8::from(llama.repack),
                file_name(model),
                rep + 1
            );
            let out = Command::new(&llama.bin)
                .args(llama_args(model, &settings, llama.repack))
                .output()
                .with_context(|| format!("could not run {}", llama.bin.display()))?;
            if !out.status.success() {
                bail!("llama-bench failed ({})", out.status);
            }
            tg.push(parse_llama_json(&String::from_utf8_lossy(&out.stdout))?.1);
        }
        let own = median(tg).context("no llama-bench run")?;
        best = Some(best.map_or(own, |b: f64| b.max(own)));
    }
    best.context("no llama.cpp configuration")
}

/// Every prompt on `model`, plain and with `spec`, alternating, `reps` times: the
/// medians. Fails when a speculative text differs from the plain one.
fn measure(
    nx: &Path,
    model: &Path,
    spec: Spec<'_>,
    dir: &Path,
    reps: usize,
    pinned: (usize, Option<&str>),
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for p in prompts() {
        let file: PathBuf = dir.join("spec-prompt.txt");
        std::fs::write(&file, &p.text)
            .with_context(|| format!("cannot write {}", file.display()))?;
        let (mut plain, mut fast, mut kept, mut drafted) = (Vec::new(), Vec::new(), 0, 0);
        for rep in 0..reps {
            eprintln!(
                "bench --spec: {} on {} ({}/{reps})",
                p.name,
                file_name(model),
                rep + 1
            );
            let a = run_nx(nx, model, &file, pinned, Spec::Plain)?;
            let b = run_nx(nx, model, &file, pinned, spec)?;
            if a.text != b.text {
                bail!(
                    "{}: the text with speculation differs from the text without it",
                    p.name
                );
            }
            plain.push(a.tg_tps);
            fast.push(b.tg_tps);
            if let Some((k, d)) = b.drafts {
                (kept, drafted) = (kept + k, drafted + d);
            }
        }
        rows.push(Row {
            name: p.name,
            grounded: p.grounded,
            plain: median(plain).context("no run")?,
            spec: median(fast).context("no run")?,
            kept,
            drafted,
        });
    }
    Ok(rows)
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The default model with every tensor requantized to `ftype` by the pinned
/// `llama-quantize --allow-requantize --pure` (made once into `$NX_CACHE/derived/`,
/// renamed into place when complete). Derived locally, never downloaded.
fn requantized(model: &Path, ftype: &str) -> Result<PathBuf> {
    let dir = crate::fetch::cache_dir().join("derived");
    let stem = model
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    let out = dir.join(format!("{stem}.pure-{}.gguf", ftype.to_ascii_lowercase()));
    if out.is_file() {
        return Ok(out);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let quantize = llama_bin("llama-quantize");
    if !quantize.is_file() {
        crate::reference::ensure_reference(crate::reference::DEFAULT_JOBS)?;
    }
    let partial = dir.join(format!(
        ".{}.{}",
        file_name(&out),
        crate::util::unique_suffix()
    ));
    eprintln!("bench --spec: making {} with llama-quantize", out.display());
    let status = Command::new(&quantize)
        .args(["--allow-requantize", "--pure"])
        .arg(model)
        .arg(&partial)
        .arg(ftype)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .with_context(|| format!("could not run {}", quantize.display()))?;
    if !status.success() {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "llama-quantize {ftype} of {} failed ({status})",
            model.display()
        );
    }
    std::fs::rename(&partial, &out)
        .with_context(|| format!("cannot rename {} into place", partial.display()))?;
    Ok(out)
}

fn section(rows: &[Row], llama_tg: f64, reps: usize, threads: usize, tier: Option<&str>) -> String {
    let (title, tier_text) = tier_texts(tier);
    let mut out = format!(
        "## Speculative decoding{title}: nx --spec ngram vs nx plain vs llama.cpp plain\n\n\
         CPU: `{}`; {tier_text}default model; {threads} threads; greedy, {N_GEN} tokens; medians of {reps} \
         alternating runs of `nx run -f PROMPT --temp 0 -n {N_GEN} -t {threads} [--spec ngram]`; \
         every speculative text was byte-identical to the plain one. llama.cpp: `llama-bench -n \
         {N_GEN}`, the faster median of `--repack 1` and `--repack 0`: {llama_tg:.1} tok/s.\n\n",
        crate::machine::cpu_model()
    );
    out.push_str(&table(rows, llama_tg));
    out
}

fn draft_section(
    rows: &[Row],
    llama_tg: f64,
    reps: usize,
    threads: usize,
    tier: Option<&str>,
) -> String {
    let (title, tier_text) = tier_texts(tier);
    let mut out = format!(
        "\n## Speculative decoding with a draft model{title}: nx --spec draft vs nx plain vs llama.cpp plain\n\n\
         CPU: `{}`; {tier_text}target: the default model requantized to Q8_0 (every tensor), \
         draft: the same requantized to Q4_0 (every tensor), both by the pinned \
         `llama-quantize --allow-requantize --pure`; {threads} threads; greedy, {N_GEN} tokens; \
         medians of {reps} alternating runs of `nx run --model TARGET -f PROMPT --temp 0 -n \
         {N_GEN} -t {threads} [--spec draft --draft-model DRAFT]`; every speculative text was \
         byte-identical to the plain one. llama.cpp: `llama-bench -n {N_GEN}` on the target, \
         the faster median of `--repack 1` and `--repack 0`: {llama_tg:.1} tok/s. The draft length weighs the draft's measured pass time against a \
         plain step; where no length pays, drafting pauses.\n\n",
        crate::machine::cpu_model()
    );
    out.push_str(&table(rows, llama_tg));
    out
}

fn tier_texts(tier: Option<&str>) -> (String, String) {
    match tier {
        None => (String::new(), String::new()),
        Some(t) => (
            format!(" (nx on its {t} tier)"),
            format!("nx pinned with `NX_TIER={t}` (AMX off with it); "),
        ),
    }
}

/// The per-prompt table and the medians line.
fn table(rows: &[Row], llama_tg: f64) -> String {
    let mut out = String::from(
        "| prompt | nx plain tok/s | nx --spec tok/s | spec / plain | spec / llama.cpp | drafts kept |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2}× | {:.2}× | {} of {} |\n",
            r.name,
            r.plain,
            r.spec,
            r.spec / r.plain,
            r.spec / llama_tg,
            r.kept,
            r.drafted
        ));
    }
    let ratio = |grounded: bool| {
        let v: Vec<f64> = rows
            .iter()
            .filter(|r| r.grounded == grounded)
            .map(|r| r.spec / r.plain)
            .collect();
        median(v).unwrap_or(f64::NAN)
    };
    out.push_str(&format!(
        "\nMedian spec / plain: grounded {:.2}× (target ≥ 2×), ordinary {:.2}× (target ≥ 0.97×).\n",
        ratio(true),
        ratio(false)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statistics_line_gives_speed_and_drafts() {
        let line = "prompt: 145 tokens in 0.62 s (234.3 tok/s) | generation: 128 tokens, \
                    56.7 tok/s | ttft 619 ms | drafts: 103 of 109 accepted (94 %) | stop: \
                    max_tokens";
        assert_eq!(parse_stats(line), Some((56.7, Some((103, 109)))));
        let plain = "prompt: 1 tokens in 0.1 s (10.0 tok/s) | generation: 4 tokens, 23.1 tok/s";
        assert_eq!(parse_stats(plain), Some((23.1, None)));
        assert_eq!(parse_stats("nothing"), None);
    }

    #[test]
    fn every_prompt_is_distinct_and_both_kinds_are_there() {
        let p = prompts();
        assert!(p.iter().any(|p| p.grounded) && p.iter().any(|p| !p.grounded));
        for (i, a) in p.iter().enumerate() {
            assert!(p[i + 1..]
                .iter()
                .all(|b| b.text != a.text && b.name != a.name));
        }
    }
}
