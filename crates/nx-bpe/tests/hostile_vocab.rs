//! Vocabularies that lie, from the bugs that bit other GGUF readers: byte tokens whose
//! hex is not hex (llama.cpp PR #25969) and token ids past the vocabulary in every id
//! key this crate reads. Each loads or fails with a typed error; none panics.

use nx_bpe::{EncodeOptions, Tokenizer};
use nx_gguf::{Gguf, GgufWriter, Value};

fn spm_file(tokens: &[&str], types: &[i32], extra: Vec<(&str, Value)>) -> Gguf {
    let mut w = GgufWriter::new();
    w.add_metadata("tokenizer.ggml.model", Value::String("llama".into()));
    w.add_metadata("tokenizer.ggml.tokens", Value::str_array(tokens));
    w.add_metadata("tokenizer.ggml.token_type", Value::i32_array(types));
    w.add_metadata(
        "tokenizer.ggml.scores",
        Value::f32_array(&vec![0.0; tokens.len()]),
    );
    for (k, v) in extra {
        w.add_metadata(k, v);
    }
    Gguf::from_bytes(w.to_bytes()).unwrap()
}

/// `<unk> <s> </s>`, the real byte token for 0x01, four fake ones (all typed BYTE) and
/// two ordinary pieces.
const TOKENS: [&str; 10] = [
    "<unk>", "<s>", "</s>", "<0x01>", "<0x-1>", "<0xZZ>", "<0x+1>", "<0x>", "▁", "a",
];
const TYPES: [i32; 10] = [2, 3, 3, 6, 6, 6, 6, 6, 1, 1];

#[test]
fn byte_tokens_with_bad_hex_are_plain_text() {
    let tok = Tokenizer::from_gguf(&spm_file(&TOKENS, &TYPES, Vec::new())).unwrap();
    // Each fake byte token decodes as its own text.
    for id in 4..8u32 {
        assert_eq!(tok.decode(&[id]).unwrap(), TOKENS[id as usize].as_bytes());
    }
    // The byte 0x01 falls back to the real byte token, never to `<0x+1>`.
    let opts = EncodeOptions {
        add_special: false,
        parse_special: false,
    };
    let ids = tok.encode("\u{1}", opts).unwrap();
    assert!(ids.contains(&3) && !ids.contains(&6), "{ids:?}");
    assert!(tok.decode(&ids).unwrap().ends_with(&[1]));
}

#[test]
fn token_ids_past_the_vocabulary_are_ignored_in_every_id_key() {
    let keys = [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ];
    let n = TOKENS.len() as u32;
    for key in keys {
        for bad in [n, n + 1, u32::MAX] {
            let gguf = spm_file(&TOKENS, &TYPES, vec![(key, Value::U32(bad))]);
            let tok = Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{key}={bad}: {e}"));
            let ids = [
                tok.bos_id(),
                tok.eos_id(),
                tok.unk_id(),
                tok.pad_id(),
                tok.eot_id(),
            ];
            for id in ids
                .into_iter()
                .flatten()
                .chain(tok.eog_ids().iter().copied())
            {
                assert!(id < n, "{key}={bad} left id {id} in use");
            }
            // Encoding with BOS/EOS added and decoding it back works.
            let ids = tok.encode("a", EncodeOptions::default()).unwrap();
            tok.decode(&ids).unwrap();
        }
        // A negative id (i32) is the wrong type: a typed error naming the key.
        let gguf = spm_file(&TOKENS, &TYPES, vec![(key, Value::I32(-1))]);
        match Tokenizer::from_gguf(&gguf) {
            Ok(tok) => assert!(tok.bos_id().is_none_or(|id| id < n)),
            Err(e) => assert!(e.to_string().contains(key), "{e}"),
        }
    }
}
