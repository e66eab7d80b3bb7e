//! Gate GOLD-TOK-GEMMA: the default model's vocabulary (Gemma 3, SentencePiece, 262 144
//! tokens) must encode the committed texts exactly as llama.cpp's `llama-server`
//! `/tokenize` did (`fixtures/tokenizer/gemma_golden.json`, written by
//! `cargo xtask golden tokenizer` from `fixtures/tokenizer/gemma_texts.json`).

mod common;

use std::path::PathBuf;

use nx_bpe::{EncodeOptions, Tokenizer};
use nx_gguf::Gguf;
use serde::Deserialize;

#[derive(Debug, Deserialize, PartialEq)]
struct Text {
    note: String,
    text: String,
    add_special: bool,
    parse_special: bool,
}

#[derive(Debug, Deserialize)]
struct GoldenCase {
    note: String,
    text: String,
    add_special: bool,
    parse_special: bool,
    ids: Vec<u32>,
}

#[derive(Debug, Deserialize)]
struct Golden {
    cases: Vec<GoldenCase>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer")
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_tok_gemma() {
    let texts: Vec<Text> = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("gemma_texts.json")).unwrap(),
    )
    .unwrap();
    let golden: Golden = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("gemma_golden.json")).unwrap(),
    )
    .unwrap();
    let golden_inputs: Vec<Text> = golden
        .cases
        .iter()
        .map(|c| Text {
            note: c.note.clone(),
            text: c.text.clone(),
            add_special: c.add_special,
            parse_special: c.parse_special,
        })
        .collect();
    assert_eq!(
        texts, golden_inputs,
        "gemma_golden.json is stale: run `cargo xtask golden tokenizer` to regenerate"
    );
    assert!(golden.cases.len() >= 40);

    let path = common::gemma_path();
    let gguf = Gguf::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask fetch`)", path.display()));
    let tok = Tokenizer::from_gguf(&gguf).expect("gemma tokenizer");
    assert_eq!(tok.n_vocab(), 262_144);

    let mut passed = 0;
    let mut details = 8;
    for (i, case) in golden.cases.iter().enumerate() {
        let opts = EncodeOptions {
            add_special: case.add_special,
            parse_special: case.parse_special,
        };
        let got = tok.encode(&case.text, opts);
        match got {
            Ok(ref ids) if *ids == case.ids => passed += 1,
            _ => {
                if details > 0 {
                    details -= 1;
                    eprintln!(
                        "MISMATCH case {i} ({}): text {:?}\n  want {:?}\n  got  {got:?}",
                        case.note, case.text, case.ids
                    );
                } else {
                    eprintln!("MISMATCH case {i} ({})", case.note);
                }
            }
        }
    }
    println!("GOLD-TOK-GEMMA: {passed}/{}", golden.cases.len());
    assert_eq!(
        passed,
        golden.cases.len(),
        "GOLD-TOK-GEMMA: {passed}/{}",
        golden.cases.len()
    );
}
