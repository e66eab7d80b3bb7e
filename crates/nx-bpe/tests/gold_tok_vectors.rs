//! Gate GOLD-TOK-VECTORS: llama.cpp's tokenizer test vectors (46 or 50 cases each) must encode
//! to exactly the recorded ids, for every vocabulary of the pinned tree nx reads: byte-level
//! BPE with the qwen2, qwen35, llama3 (`llama-bpe`), GPT-2 (`gpt-2`, `mpt`) and digits-then-GPT-2
//! (`starcoder`, `refact`, `command-r`) and Falcon splitters, Gemma 4's SentencePiece-style BPE
//! (`gemma-4`), and SentencePiece (`llama-spm`, `phi-3`).
//!
//! Rules of llama.cpp's test-tokenizer-0: `add_special = false` (no BOS),
//! `parse_special = false`. For SentencePiece the tokenizer itself prefixes the space
//! (`add_space_prefix`, default true), so the inputs are passed unchanged.

mod common;

/// Each vocabulary with the number of cases its `.inp`/`.out` pair holds.
const VOCABS: [(&str, usize); 14] = [
    ("qwen2", 46),
    ("llama-bpe", 46),
    ("llama-spm", 46),
    ("gpt-2", 46),
    ("mpt", 46),
    ("phi-3", 46),
    ("starcoder", 46),
    ("refact", 46),
    ("command-r", 46),
    ("falcon", 46),
    ("qwen35", 50),
    ("deepseek-coder", 46),
    ("deepseek-llm", 46),
    ("gemma-4", 46),
];

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_tok_vectors() {
    let mut budget = 8;
    let mut passed = 0;
    let mut total = 0;
    for (name, cases) in VOCABS {
        let (p, t) = common::run_vocab(name, &mut budget);
        assert_eq!(t, cases, "{name}: expected {cases} cases");
        passed += p;
        total += t;
    }
    println!("GOLD-TOK-VECTORS: {passed}/{total}");
    assert_eq!(passed, total, "GOLD-TOK-VECTORS: {passed}/{total}");
}
