//! Round-trip properties on the real vocabularies (the pinned llama.cpp vocab files and
//! the default model): byte-level BPE reproduces any text exactly; SentencePiece does
//! too, apart from the one leading space `add_space_prefix` adds (llama-spm) and the
//! U+2581 character, which SentencePiece reserves for spaces.
//! Needs the fetched files, so it is ignored by default:
//! `cargo test -p nx-bpe --test roundtrip_real -- --ignored`.

mod common;

use std::path::Path;
use std::sync::OnceLock;

use nx_bpe::{EncodeOptions, Tokenizer};
use nx_gguf::Gguf;
use proptest::prelude::*;

fn load(path: &Path) -> Tokenizer {
    let gguf = Gguf::open(path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask fetch`)", path.display()));
    Tokenizer::from_gguf(&gguf).unwrap()
}

fn qwen2() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load(&common::vocab_path("qwen2")))
}
fn llama_bpe() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load(&common::vocab_path("llama-bpe")))
}
fn llama_spm() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load(&common::vocab_path("llama-spm")))
}
fn gemma() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load(&common::gemma_path()))
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ a-zA-Z0-9'\t\n\r.,;:!?<>|_\\-éжк中🦀\u{200d}\u{3000}]{0,60}",
        "(<\\|im_start\\|>|<start_of_turn>|<end_of_turn>|<bos>|  |\n\n|\t| |x|é){0,12}",
    ]
    .prop_filter("U+2581 is SentencePiece's space", |s| {
        !s.contains('\u{2581}')
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    #[ignore = "needs the fetched vocab files"]
    fn byte_level_bpe_round_trip(s in text(), parse_special in any::<bool>()) {
        let opts = EncodeOptions { add_special: false, parse_special };
        for tok in [qwen2(), llama_bpe()] {
            let ids = tok.encode(&s, opts).unwrap();
            prop_assert_eq!(tok.decode(&ids).unwrap(), s.as_bytes().to_vec());
        }
    }

    #[test]
    #[ignore = "needs the fetched vocab files"]
    fn sentencepiece_round_trip(s in text(), parse_special in any::<bool>()) {
        let opts = EncodeOptions { add_special: false, parse_special };
        // Gemma: no space prefix, so exact.
        let ids = gemma().encode(&s, opts).unwrap();
        prop_assert_eq!(gemma().decode(&ids).unwrap(), s.as_bytes().to_vec());
        // llama-spm: one leading space (it has no user-defined tokens; without
        // parse_special no control token splits the text).
        let ids = llama_spm().encode(&s, EncodeOptions::default()).unwrap();
        let want = if s.is_empty() { String::new() } else { format!(" {s}") };
        prop_assert_eq!(llama_spm().decode(&ids).unwrap(), want.into_bytes());
    }
}
