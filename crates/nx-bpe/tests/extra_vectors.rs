//! More of llama.cpp's pinned tokenizer vectors, beyond the three the GOLD-TOK-VECTORS
//! gate counts: GPT-2's splitter (`gpt-2`, `mpt`) and another SentencePiece vocab
//! (`phi-3`). Needs the fetched llama.cpp tree, so it is ignored by default:
//! `cargo test -p nx-bpe --test extra_vectors -- --ignored`.

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
#[ignore = "needs the fetched llama.cpp tree"]
fn extra_vocab_vectors() {
    let mut budget = 8;
    let mut failed = Vec::new();
    for name in ["gpt-2", "mpt", "phi-3"] {
        let (p, t) = run_vocab(name, &mut budget);
        if p != t {
            failed.push(format!("{name}: {p}/{t}"));
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
}
