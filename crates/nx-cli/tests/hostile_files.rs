//! `nx run` on files that lie, under a 4 GiB address-space limit (`ulimit -v`): each ends
//! with exit code 2 and one line naming the problem — never an abort, a signal or an
//! allocation sized by the lie.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::tiny_model::{tiny_gguf, TinyOptions};

/// Address-space limit of the child, in KiB.
const LIMIT_KIB: u64 = 4 << 20;

fn tiny() -> Vec<u8> {
    tiny_gguf(TinyOptions::default())
}

/// Position of the value of metadata key `key` (after the key text and its type).
fn value_at(bytes: &[u8], key: &str) -> usize {
    let needle = key.as_bytes();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{key} in the tiny model"));
    at + needle.len() + 4
}

fn set_u32(mut bytes: Vec<u8>, key: &str, value: u32) -> Vec<u8> {
    let at = value_at(&bytes, key);
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    bytes
}

fn set_f32(mut bytes: Vec<u8>, key: &str, value: f32) -> Vec<u8> {
    let at = value_at(&bytes, key);
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    bytes
}

/// Runs `nx run` on `bytes` (written to a scratch file) with `args`, under the limit.
fn nx_run(name: &str, bytes: &[u8], args: &[&str]) -> Output {
    let path: PathBuf = common::scratch_dir("hostile").join(format!("{name}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {LIMIT_KIB} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_nx"))
        .arg("run")
        .arg("--model")
        .arg(&path)
        .args(["--prompt", "the cat sat"])
        .args(args)
        .output()
        .unwrap()
}

fn assert_one_line_error(case: &str, out: Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{case}: {:?} {stderr}",
        out.status
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{case}: {stderr}");
    assert!(!stderr.contains("panicked"), "{case}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{case}: want {needle:?} in {stderr}"
    );
}

#[test]
fn the_true_file_runs_under_the_limit() {
    let out = nx_run("true", &tiny(), &["-n", "4"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_billion_layers() {
    for n in [1_000_000_000, u32::MAX] {
        let out = nx_run("layers", &set_u32(tiny(), "llama.block_count", n), &[]);
        assert_one_line_error("block_count", out, "block_count");
    }
}

#[test]
fn a_billion_positions_of_context() {
    let bytes = set_u32(tiny(), "llama.context_length", 1_000_000_000);
    // The context is sized by the request, capped by --ctx: asking for it all is an
    // allocation error, not an abort.
    let out = nx_run("ctx", &bytes, &["--ctx", "1000000000", "-n", "999999000"]);
    assert_one_line_error("context_length", out, "error");
    // A prompt longer than the context says so.
    let out = nx_run("ctx", &bytes, &["--ctx", "2", "-n", "4"]);
    assert_one_line_error("prompt over context", out, "context");
}

#[test]
fn a_trillion_token_vocabulary() {
    let mut bytes = tiny();
    // tokenizer.ggml.tokens: array type (u32), element type (u32), count (u64).
    let at = value_at(&bytes, "tokenizer.ggml.tokens") - 4 + 8;
    bytes[at..at + 8].copy_from_slice(&1_000_000_000_000u64.to_le_bytes());
    let out = nx_run("vocab", &bytes, &[]);
    assert_one_line_error("token count", out, "tokenizer.ggml.tokens");
}

#[test]
fn config_that_disagrees_with_the_tensors() {
    let cases: [(&str, Vec<u8>, &str); 4] = [
        (
            "embd",
            set_u32(tiny(), "llama.embedding_length", 65),
            "error",
        ),
        (
            "heads",
            set_u32(tiny(), "llama.attention.head_count", 0),
            "head_count",
        ),
        (
            "kv-heads",
            set_u32(tiny(), "llama.attention.head_count_kv", 3),
            "head_count",
        ),
        (
            "rope",
            set_f32(tiny(), "llama.rope.freq_base", f32::NAN),
            "freq_base",
        ),
    ];
    for (name, bytes, needle) in cases {
        assert_one_line_error(name, nx_run(name, &bytes, &[]), needle);
    }
}

#[test]
fn a_tensor_type_nx_cannot_compute_with() {
    // blk.0.attn_q.weight's tensor info: name, n_dims (u32 = 2), two u64 dims, type id.
    // NVFP4 (id 40: 64 weights in 36 bytes) takes less room than Q8_0, so the data still
    // fits its extent, and the 64-wide rows are one whole block.
    let mut bytes = tiny();
    let name = b"blk.0.attn_q.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("attn_q in the tiny model")
        + name.len()
        + 4
        + 16;
    assert_eq!(&bytes[at..at + 4], &8u32.to_le_bytes(), "Q8_0 type id");
    bytes[at..at + 4].copy_from_slice(&40u32.to_le_bytes());
    let out = nx_run("nvfp4", &bytes, &[]);
    assert_one_line_error(
        "NVFP4 tensor",
        out,
        "tensor `blk.0.attn_q.weight` has ggml type NVFP4",
    );
}
