//! `nx inspect` end to end: good files print, bad files exit 2 with one line and no panic.

mod common;

use std::path::PathBuf;

use common::nx;
use nx_gguf::{GgmlType, GgufWriter, Value};

fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = common::scratch_dir("inspect");
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn small_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()));
    w.add_metadata("general.name", Value::String("tiny".into()));
    let tokens: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
    w.add_metadata("tokenizer.ggml.tokens", Value::str_array(&tokens));
    let vals: Vec<u8> = [1.5f32, -2.0, 0.25, 3.0, 4.0, 5.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    w.add_tensor("w", GgmlType::F32, vec![3, 2], vals);
    w.to_bytes()
}

/// Runs nx and checks the bad-input contract: exit code 2, one line on stderr, no panic.
fn assert_one_line_error(args: &[&std::ffi::OsStr], must_mention: &str) {
    let out = nx().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert!(
        stderr.contains(must_mention),
        "stderr should mention {must_mention:?}: {stderr}"
    );
}

#[test]
fn prints_metadata_tensors_and_totals() {
    let p = scratch("ok.gguf", &small_file());
    let out = nx().arg("inspect").arg(&p).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("architecture:  llama"));
    assert!(
        text.contains("(100 × string)"),
        "long arrays summarised: {text}"
    );
    assert!(text.contains("F32        1 tensors"));
    let out = nx().arg("inspect").arg(&p).arg("--json").output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tensors"][0]["shape"], serde_json::json!([3, 2]));
    assert_eq!(v["metadata"]["tokenizer.ggml.tokens"]["len"], 100);
}

#[test]
fn prints_dequantized_rows() {
    let p = scratch("rows.gguf", &small_file());
    let out = nx()
        .args(["inspect".as_ref(), p.as_os_str()])
        .args(["--tensor", "w", "--rows", "0..2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "1.5 -2 0.25\n3 4 5\n"
    );
    assert_one_line_error(
        &[
            "inspect".as_ref(),
            p.as_os_str(),
            "--tensor".as_ref(),
            "nope".as_ref(),
        ],
        "nope",
    );
    assert_one_line_error(
        &[
            "inspect".as_ref(),
            p.as_os_str(),
            "--tensor".as_ref(),
            "w".as_ref(),
            "--rows".as_ref(),
            "1..9".as_ref(),
        ],
        "rows",
    );
}

#[test]
fn bad_files_exit_2_with_one_line() {
    let missing = std::env::temp_dir().join("nx-definitely-missing.gguf");
    assert_one_line_error(&["inspect".as_ref(), missing.as_os_str()], "cannot open");
    let not_gguf = scratch("text.gguf", b"hello, this is not a gguf file");
    assert_one_line_error(
        &["inspect".as_ref(), not_gguf.as_os_str()],
        "not a GGUF file",
    );
    let good = small_file();
    // Truncated inside the metadata, bad version, tensor past the end.
    // Cut inside the metadata: the declared counts can no longer fit.
    let cut = scratch("cut.gguf", &good[..40]);
    assert_one_line_error(
        &["inspect".as_ref(), cut.as_os_str()],
        "cannot fit in the file",
    );
    // Cut inside a string of the metadata.
    let cut = scratch("cut2.gguf", &good[..good.len() / 2]);
    assert_one_line_error(&["inspect".as_ref(), cut.as_os_str()], "");
    let mut v = good.clone();
    v[4] = 9;
    let bad_version = scratch("ver.gguf", &v);
    assert_one_line_error(&["inspect".as_ref(), bad_version.as_os_str()], "version 9");
    let short = scratch("short.gguf", &good[..good.len() - 4]);
    assert_one_line_error(&["inspect".as_ref(), short.as_os_str()], "past the end");
    let dir = std::env::temp_dir();
    assert_one_line_error(&["inspect".as_ref(), dir.as_os_str()], "cannot open");
}

#[test]
fn unknown_flags_exit_2() {
    let out = nx().args(["inspect", "--bogus"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
