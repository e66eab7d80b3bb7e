//! `nx perplexity` end to end on the tiny random-weight model written to a temp dir: the
//! printed figures are the library's, `--chunks` bounds the windows, and bad input
//! (missing or empty file, a text too short, bad flags) exits 2 with one line.

mod common;

use common::nx;

use std::path::PathBuf;
use std::process::Output;

use nx_bpe::Tokenizer;
use nx_gguf::Gguf;
use nx_llama_stack::Model;
use nx_run::{perplexity, KvDtype, PerplexityConfig};

fn scratch_dir() -> PathBuf {
    common::scratch_dir("ppl")
}

/// The tiny model, written once per test process.
fn model_path() -> &'static PathBuf {
    common::tiny_model_path("ppl")
}

/// A text of a few hundred tokens in the tiny vocabulary, written to `name`.
fn text_file(name: &str) -> PathBuf {
    let words = [
        "the cat sat on the mat",
        "and then it ran far away",
        "the dog was good",
        "blue sky and sun",
        "moon and star",
    ];
    let mut s = String::new();
    for i in 0..30 {
        s.push_str(words[(i * 3 + 1) % words.len()]);
        s.push_str(if i % 4 == 3 { "\n" } else { " " });
    }
    let p = scratch_dir().join(name);
    std::fs::write(&p, s).unwrap();
    p
}

fn ppl(args: &[&str]) -> Output {
    nx().arg("perplexity")
        .arg("--model")
        .arg(model_path())
        .args(args)
        .output()
        .unwrap()
}

/// Exit code 2, exactly one line on stderr, no panic, and the line mentions `needle`.
fn assert_one_line_error(out: Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert!(
        stderr.contains(needle),
        "stderr should mention {needle:?}: {stderr}"
    );
}

#[test]
fn prints_the_library_figures() {
    let text = text_file("text.txt");
    let out = ppl(&[
        "-f",
        text.to_str().unwrap(),
        "-c",
        "16",
        "--batch",
        "5",
        "--kv-type",
        "f32",
        "-t",
        "2",
    ]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");

    let gguf = Gguf::open(model_path()).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    let model = std::sync::Arc::new(Model::from_gguf(gguf).unwrap());
    let cfg = PerplexityConfig {
        n_ctx: 16,
        batch: 16,
        max_chunks: None,
        kv_dtype: KvDtype::F32,
    };
    let bytes = std::fs::read(&text).unwrap();
    let report = perplexity(&model, &tokenizer, &bytes, &cfg, |_| {}).unwrap();
    assert!(report.n_chunks >= 3);

    let want = format!(
        "Final estimate: PPL = {:.4} +/- {:.5}\n",
        report.ppl,
        report.ppl_error.unwrap()
    );
    assert_eq!(stdout, want);
    let running: String = report
        .running_ppl
        .iter()
        .enumerate()
        .map(|(k, v)| format!("[{}]{v:.4},", k + 1))
        .collect();
    assert!(stderr.contains(&running), "{running} not in {stderr}");
}

#[test]
fn chunks_bounds_the_windows() {
    let text = text_file("text-chunks.txt");
    let out = ppl(&["-f", text.to_str().unwrap(), "-c", "16", "--chunks", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("[2]") && !stderr.contains("[3]"),
        "{stderr}"
    );
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .starts_with("Final estimate: PPL = "));
}

#[test]
fn missing_file_is_one_line() {
    let missing = scratch_dir().join("no-such-file.txt");
    let out = ppl(&["-f", missing.to_str().unwrap()]);
    assert_one_line_error(out, "no-such-file.txt");
}

#[test]
fn empty_file_is_one_line() {
    for (name, content) in [("empty.txt", ""), ("newline.txt", "\n")] {
        let p = scratch_dir().join(name);
        std::fs::write(&p, content).unwrap();
        // No model is needed to reject it.
        let out = nx()
            .args(["perplexity", "-f", p.to_str().unwrap()])
            .env("NX_CACHE", scratch_dir().join("no-cache"))
            .output()
            .unwrap();
        assert_one_line_error(out, "the text is empty");
    }
}

#[test]
fn short_text_says_how_many_tokens_are_needed() {
    let p = scratch_dir().join("short.txt");
    std::fs::write(&p, "the cat sat on the mat").unwrap();
    let out = ppl(&["-f", p.to_str().unwrap(), "-c", "64"]);
    assert_one_line_error(out, "you need at least 128 tokens");
}

#[test]
fn bad_flags_are_one_line() {
    let text = text_file("text-flags.txt");
    let t = text.to_str().unwrap();
    assert_one_line_error(ppl(&["-f", t, "-c", "2"]), "--ctx-size");
    assert_one_line_error(ppl(&["-f", t, "--batch", "0"]), "--batch");
    assert_one_line_error(ppl(&["-f", t, "--threads", "0"]), "--threads");
    assert_one_line_error(ppl(&["-f", t, "--chunks", "0"]), "--chunks");
    // clap's own errors print a usage block; only the exit code is ours to check.
    let out = ppl(&["-f", t, "--kv-type", "q8"]);
    assert_eq!(out.status.code(), Some(2));
    let out = nx().args(["perplexity"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
