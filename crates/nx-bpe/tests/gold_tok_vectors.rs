//! Gate GOLD-TOK-VECTORS: llama.cpp's tokenizer test vectors for the qwen2, llama-bpe and
//! llama-spm vocabularies (46 cases each) must encode to exactly the recorded ids.
//!
//! Rules of llama.cpp's test-tokenizer-0: `add_special = false` (no BOS),
//! `parse_special = false`. For SentencePiece the tokenizer itself prefixes the space
//! (`add_space_prefix`, default true), so the inputs are passed unchanged.

mod common;

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_tok_vectors() {
    let mut budget = 8;
    let mut passed = 0;
    let mut total = 0;
    for name in ["qwen2", "llama-bpe", "llama-spm"] {
        let (p, t) = common::run_vocab(name, &mut budget);
        passed += p;
        total += t;
    }
    println!("GOLD-TOK-VECTORS: {passed}/{total}");
    assert_eq!(total, 138, "expected 3 × 46 cases");
    assert_eq!(passed, total, "GOLD-TOK-VECTORS: {passed}/{total}");
}
