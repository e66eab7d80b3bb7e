//! Gate GOLD-TOK-VECTORS: llama.cpp's tokenizer test vectors (46 cases each) must encode
//! to exactly the recorded ids, for every vocabulary of the pinned tree nx reads: byte-level
//! BPE with the qwen2, llama3 (`llama-bpe`), GPT-2 (`gpt-2`, `mpt`) and digits-then-GPT-2
//! (`starcoder`, `refact`, `command-r`) and Falcon splitters, and SentencePiece (`llama-spm`, `phi-3`).
//!
//! Rules of llama.cpp's test-tokenizer-0: `add_special = false` (no BOS),
//! `parse_special = false`. For SentencePiece the tokenizer itself prefixes the space
//! (`add_space_prefix`, default true), so the inputs are passed unchanged.

mod common;

const VOCABS: [&str; 10] = [
    "qwen2",
    "llama-bpe",
    "llama-spm",
    "gpt-2",
    "mpt",
    "phi-3",
    "starcoder",
    "refact",
    "command-r",
    "falcon",
];

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_tok_vectors() {
    let mut budget = 8;
    let mut passed = 0;
    let mut total = 0;
    for name in VOCABS {
        let (p, t) = common::run_vocab(name, &mut budget);
        passed += p;
        total += t;
    }
    println!("GOLD-TOK-VECTORS: {passed}/{total}");
    assert_eq!(total, 46 * VOCABS.len(), "expected 46 cases per vocabulary");
    assert_eq!(passed, total, "GOLD-TOK-VECTORS: {passed}/{total}");
}
