//! Gate GOLD-TOK-VECTORS: llama.cpp's tokenizer test vectors for the qwen2, llama-bpe and
//! llama-spm vocabularies (46 cases each) must encode to exactly the recorded ids.
//!
//! Rules of llama.cpp's test-tokenizer-0: `add_special = false` (no BOS),
//! `parse_special = false`. For SentencePiece the tokenizer itself prefixes the space
//! (`add_space_prefix`, default true), so the inputs are passed unchanged.

mod common;

use nx_bpe::{EncodeOptions, Tokenizer};
use nx_gguf::Gguf;

/// Runs every case of one vocabulary; returns (passed, total) and prints mismatches.
fn run_vocab(name: &str, detail_budget: &mut usize) -> (usize, usize) {
    let path = common::vocab_path(name);
    let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{name}: {e}"));
    let cases = common::read_vectors(name);
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

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_tok_vectors() {
    let mut budget = 8;
    let mut passed = 0;
    let mut total = 0;
    for name in ["qwen2", "llama-bpe", "llama-spm"] {
        let (p, t) = run_vocab(name, &mut budget);
        passed += p;
        total += t;
    }
    println!("GOLD-TOK-VECTORS: {passed}/{total}");
    assert_eq!(total, 138, "expected 3 × 46 cases");
    assert_eq!(passed, total, "GOLD-TOK-VECTORS: {passed}/{total}");
}
