//! Gate GOLD-TOK-PRE: for every `tokenizer.ggml.pre` name nx reads, and for every vocab
//! file of the pinned tree, nx-bpe must give the reference's token ids, `add_bos` and
//! end-of-generation set. The answers are `fixtures/tokenizer/pretok_golden.json`, recorded
//! by `cargo xtask golden pretok` from llama.cpp's own tokenizer on derived vocab-only
//! files; this test derives the same metadata in memory (the recipe is in the file).

mod common;

use nx_bpe::{EncodeOptions, Tokenizer, PRE_TOKENIZER_NAMES};
use nx_gguf::{Gguf, GgufWriter, Value};
use serde_json::Value as Json;

fn golden() -> Json {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/tokenizer/pretok_golden.json"
    );
    let text = std::fs::read_to_string(path).expect("pretok golden");
    serde_json::from_str(&text).expect("pretok golden is JSON")
}

/// The tokenizer of one recipe: the base vocab's metadata with the recipe's changes.
fn derive(recipe: &Json) -> Tokenizer {
    let base = recipe["base"].as_str().unwrap();
    let path = common::vocab_path(base);
    let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let md = gguf.metadata();
    let mut writer = GgufWriter::new();
    for (key, value) in md.iter() {
        writer.add_metadata(key, value.clone());
    }
    for pair in recipe["set_str"].as_array().unwrap() {
        let (key, value) = (pair[0].as_str().unwrap(), pair[1].as_str().unwrap());
        writer.add_metadata(key, Value::String(value.to_string()));
    }
    let append = recipe["append"].as_array().unwrap();
    if !append.is_empty() {
        let mut tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap();
        let mut types = md.get_i32_array("tokenizer.ggml.token_type").unwrap();
        for pair in append {
            tokens.push(pair[0].as_str().unwrap());
            types.push(pair[1].as_i64().unwrap() as i32);
        }
        writer.add_metadata("tokenizer.ggml.tokens", Value::str_array(&tokens));
        writer.add_metadata("tokenizer.ggml.token_type", Value::i32_array(&types));
        assert!(
            !md.contains("tokenizer.ggml.scores"),
            "recipe base with scores"
        );
    }
    let derived = Gguf::from_bytes(writer.to_bytes()).expect("derived vocab parses");
    Tokenizer::from_gguf(&derived).unwrap_or_else(|e| panic!("{}: {e}", recipe["name"]))
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_tok_pre() {
    let doc = golden();
    let all_cases = doc["all_cases"].as_array().unwrap();
    let special_cases = doc["special_cases"].as_array().unwrap();
    let vocabs = doc["vocabs"].as_array().unwrap();
    // Every name nx reads has a recipe (a new table row needs `cargo xtask golden pretok`).
    for config in PRE_TOKENIZER_NAMES {
        let name = format!("pre:{}", config.name);
        assert!(
            vocabs.iter().any(|v| v["name"] == name.as_str()),
            "{name} has no golden; run `cargo xtask golden pretok`"
        );
    }
    let (mut passed, mut total, mut budget) = (0, 0, 12);
    let mut failed_vocabs = Vec::new();
    for recipe in vocabs {
        let name = recipe["name"].as_str().unwrap();
        if name.starts_with("file:bert") {
            continue;
        }
        let tok = derive(recipe);
        let mut ok = true;
        let want_eog: Vec<u32> = recipe["eog"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        if tok.eog_ids() != want_eog.as_slice() {
            eprintln!(
                "MISMATCH {name}: eog want {want_eog:?} got {:?}",
                tok.eog_ids()
            );
            ok = false;
        }
        if tok.add_bos() != recipe["add_bos"].as_bool().unwrap() {
            eprintln!("MISMATCH {name}: add_bos got {}", tok.add_bos());
            ok = false;
        }
        let cases = if recipe["all_texts"].as_bool().unwrap() {
            all_cases
        } else {
            special_cases
        };
        let ids = recipe["ids"].as_array().unwrap();
        assert_eq!(ids.len(), cases.len(), "{name}: answers per case");
        for (case, want) in cases.iter().zip(ids) {
            let opts = EncodeOptions {
                add_special: case[0].as_bool().unwrap(),
                parse_special: case[1].as_bool().unwrap(),
            };
            let text = case[2].as_str().unwrap();
            let want: Vec<u32> = want
                .as_str()
                .unwrap()
                .split_whitespace()
                .map(|t| t.parse().unwrap())
                .collect();
            total += 1;
            match tok.encode(text, opts) {
                Ok(got) if got == want => passed += 1,
                got => {
                    ok = false;
                    if budget > 0 {
                        budget -= 1;
                        eprintln!("MISMATCH {name}: {text:?}\n  want {want:?}\n  got  {got:?}");
                    }
                }
            }
        }
        if !ok {
            failed_vocabs.push(name);
        }
    }
    println!(
        "GOLD-TOK-PRE: {passed}/{total} texts over {} vocabularies; failing: {failed_vocabs:?}",
        vocabs.len()
    );
    assert!(failed_vocabs.is_empty(), "GOLD-TOK-PRE: {failed_vocabs:?}");
}
