//! More of llama.cpp's pinned tokenizer vectors, beyond the three the GOLD-TOK-VECTORS
//! gate counts: GPT-2's splitter (`gpt-2`, `mpt`) and another SentencePiece vocab
//! (`phi-3`). Needs the fetched llama.cpp tree, so it is ignored by default:
//! `cargo test -p nx-bpe --test extra_vectors -- --ignored`.

mod common;

#[test]
#[ignore = "needs the fetched llama.cpp tree"]
fn extra_vocab_vectors() {
    let mut budget = 8;
    let mut failed = Vec::new();
    for name in ["gpt-2", "mpt", "phi-3"] {
        let (p, t) = common::run_vocab(name, &mut budget);
        if p != t {
            failed.push(format!("{name}: {p}/{t}"));
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
}
