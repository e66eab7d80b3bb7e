//! Behaviour of the public API on small synthetic vocabularies built in memory: merge
//! order, special tokens, byte fallback, streaming decode, bad input and bad metadata,
//! and round-trip properties (proptest).

use nx_bpe::{EncodeOptions, PreTokenizer, TokenType, Tokenizer, TokenizerError, TokenizerKind};
use nx_gguf::{ArrayValue, Gguf, GgufWriter, Value, ValueType};
use proptest::prelude::*;

fn str_array(v: &[String]) -> Value {
    Value::Array(ArrayValue {
        elem_type: ValueType::String,
        values: v.iter().map(|s| Value::String(s.clone())).collect(),
    })
}

fn i32_array(v: &[i32]) -> Value {
    Value::Array(ArrayValue {
        elem_type: ValueType::I32,
        values: v.iter().map(|&x| Value::I32(x)).collect(),
    })
}

fn f32_array(v: &[f32]) -> Value {
    Value::Array(ArrayValue {
        elem_type: ValueType::F32,
        values: v.iter().map(|&x| Value::F32(x)).collect(),
    })
}

fn gguf(meta: Vec<(&str, Value)>) -> Gguf {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add_metadata(k, v);
    }
    Gguf::from_bytes(w.to_bytes()).expect("synthetic GGUF parses")
}

/// GPT-2's byte alphabet, computed independently of the crate: printable Latin-1 bytes map
/// to themselves, the rest to U+0100.. in order.
fn byte_char(b: u8) -> char {
    let printable = |c: u32| {
        (0x21..=0x7E).contains(&c) || (0xA1..=0xAC).contains(&c) || (0xAE..=0xFF).contains(&c)
    };
    if printable(b as u32) {
        return char::from_u32(b as u32).unwrap();
    }
    let rank = (0..b as u32).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).unwrap()
}

fn alphabet(s: &str) -> String {
    s.bytes().map(byte_char).collect()
}

/// A byte-level BPE vocabulary: the 256 byte symbols (id = byte), a few merges, one
/// control token and one user-defined token.
struct Bpe {
    gguf: Gguf,
    tokens: Vec<String>,
}

fn bpe_vocab(pre: &str) -> Bpe {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut types = vec![1; 256];
    let merges: Vec<(&str, &str)> = vec![
        (" ", "t"),
        ("h", "e"),
        (" t", "he"),
        ("a", "b"),
        ("b", "c"),
        ("i", "n"),
    ];
    let mut merge_lines = Vec::new();
    for (l, r) in &merges {
        let merged = alphabet(&format!("{l}{r}"));
        if !tokens.contains(&merged) {
            tokens.push(merged);
            types.push(1);
        }
        merge_lines.push(format!("{} {}", alphabet(l), alphabet(r)));
    }
    tokens.push("<|end|>".into());
    types.push(3);
    tokens.push("<tag>".into());
    types.push(4);
    let g = gguf(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        ("tokenizer.ggml.tokens", str_array(&tokens)),
        ("tokenizer.ggml.token_type", i32_array(&types)),
        ("tokenizer.ggml.merges", str_array(&merge_lines)),
        (
            "tokenizer.ggml.bos_token_id",
            Value::U32(tokens.len() as u32 - 2),
        ),
        (
            "tokenizer.ggml.eos_token_id",
            Value::U32(tokens.len() as u32 - 2),
        ),
    ]);
    Bpe { gguf: g, tokens }
}

impl Bpe {
    fn id(&self, text: &str) -> u32 {
        self.tokens.iter().position(|t| t == text).unwrap() as u32
    }
}

/// A SentencePiece vocabulary: unk/bos/eos, 256 byte tokens, a few scored pieces.
struct Spm {
    gguf: Gguf,
    tokens: Vec<String>,
}

fn spm_vocab(add_space_prefix: Option<bool>) -> Spm {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    let pieces: &[(&str, f32)] = &[
        ("▁", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        ("c", -2.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("x", -2.0),
        ("ab", -5.0),
        ("bc", -4.0),
        ("he", -3.0),
        ("ll", -3.0),
        ("llo", -3.5),
        ("hello", -3.0),
        ("▁hello", -2.5),
        ("▁▁", -6.0),
    ];
    for (p, s) in pieces {
        tokens.push((*p).into());
        types.push(1);
        scores.push(*s);
    }
    tokens.push("<start>".into());
    types.push(3);
    scores.push(0.0);
    tokens.push("<ud>".into());
    types.push(4);
    scores.push(0.0);
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", str_array(&tokens)),
        ("tokenizer.ggml.token_type", i32_array(&types)),
        ("tokenizer.ggml.scores", f32_array(&scores)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
    ];
    if let Some(p) = add_space_prefix {
        meta.push(("tokenizer.ggml.add_space_prefix", Value::Bool(p)));
    }
    Spm {
        gguf: gguf(meta),
        tokens,
    }
}

impl Spm {
    fn id(&self, text: &str) -> u32 {
        self.tokens.iter().position(|t| t == text).unwrap() as u32
    }
    fn byte(&self, b: u8) -> u32 {
        3 + b as u32
    }
}

const PLAIN: EncodeOptions = EncodeOptions {
    add_special: false,
    parse_special: false,
};

#[test]
fn bpe_merges_lowest_rank_first() {
    let v = bpe_vocab("qwen2");
    let tok = Tokenizer::from_gguf(&v.gguf).unwrap();
    assert_eq!(tok.kind(), TokenizerKind::ByteLevelBpe(PreTokenizer::Qwen2));
    // " the": " t" (rank 0), "he" (rank 1), then " t"+"he" (rank 2).
    assert_eq!(
        tok.encode("a the", PLAIN).unwrap(),
        vec![b'a' as u32, v.id(&alphabet(" the"))]
    );
    // "abc": "ab" has the lower rank, so "bc" never forms.
    assert_eq!(
        tok.encode("abc", PLAIN).unwrap(),
        vec![v.id("ab"), b'c' as u32]
    );
    // The pieces are "a" and " b"; no rule merges " " and "b", so their bytes remain.
    assert_eq!(
        tok.encode("a b", PLAIN).unwrap(),
        vec![b'a' as u32, b' ' as u32, b'b' as u32]
    );
}

#[test]
fn bpe_special_tokens_need_parse_special_but_user_defined_do_not() {
    let v = bpe_vocab("qwen2");
    let tok = Tokenizer::from_gguf(&v.gguf).unwrap();
    let end = v.id("<|end|>");
    let tag = v.id("<tag>");
    let parsed = tok
        .encode(
            "x<|end|>y",
            EncodeOptions {
                add_special: false,
                parse_special: true,
            },
        )
        .unwrap();
    assert_eq!(parsed, vec![b'x' as u32, end, b'y' as u32]);
    let plain = tok.encode("x<|end|>y", PLAIN).unwrap();
    assert!(!plain.contains(&end));
    assert_eq!(tok.decode(&plain).unwrap(), b"x<|end|>y");
    assert_eq!(tok.encode("<tag>", PLAIN).unwrap(), vec![tag]);
    assert_eq!(tok.token_type(end).unwrap(), TokenType::Control);
    assert_eq!(tok.token_type(tag).unwrap(), TokenType::UserDefined);
}

#[test]
fn bpe_add_special_follows_metadata() {
    let v = bpe_vocab("qwen2");
    let tok = Tokenizer::from_gguf(&v.gguf).unwrap();
    // qwen2 adds no BOS unless the file says so.
    let with = tok
        .encode(
            "ab",
            EncodeOptions {
                add_special: true,
                parse_special: false,
            },
        )
        .unwrap();
    assert_eq!(with, vec![v.id("ab")]);
    let v = bpe_vocab("llama-bpe");
    let tok = Tokenizer::from_gguf(&v.gguf).unwrap();
    let with = tok
        .encode(
            "ab",
            EncodeOptions {
                add_special: true,
                parse_special: false,
            },
        )
        .unwrap();
    assert_eq!(with, vec![v.id("<|end|>"), v.id("ab")]);
}

#[test]
fn spm_merges_by_score_with_space_prefix_and_byte_fallback() {
    let v = spm_vocab(None);
    let tok = Tokenizer::from_gguf(&v.gguf).unwrap();
    assert_eq!(tok.kind(), TokenizerKind::SentencePiece);
    assert!(tok.add_space_prefix());
    // "bc" (-4) beats "ab" (-5).
    assert_eq!(
        tok.encode("abc", PLAIN).unwrap(),
        vec![v.id("▁"), v.id("a"), v.id("bc")]
    );
    assert_eq!(tok.encode("hello", PLAIN).unwrap(), vec![v.id("▁hello")]);
    // "é" is not in the vocabulary: its two UTF-8 bytes.
    assert_eq!(
        tok.encode("é", PLAIN).unwrap(),
        vec![v.id("▁"), v.byte(0xC3), v.byte(0xA9)]
    );
    let bos = tok
        .encode(
            "",
            EncodeOptions {
                add_special: true,
                parse_special: false,
            },
        )
        .unwrap();
    assert_eq!(bos, vec![1]);
}

#[test]
fn spm_space_prefix_after_special_tokens_and_metadata_off() {
    let v = spm_vocab(None);
    let tok = Tokenizer::from_gguf(&v.gguf).unwrap();
    let opts = EncodeOptions {
        add_special: false,
        parse_special: true,
    };
    // The prefix space comes back after each special token.
    assert_eq!(
        tok.encode("a<start>a", opts).unwrap(),
        vec![v.id("▁"), v.id("a"), v.id("<start>"), v.id("▁"), v.id("a")]
    );
    let v = spm_vocab(Some(false));
    let tok = Tokenizer::from_gguf(&v.gguf).unwrap();
    assert!(!tok.add_space_prefix());
    assert_eq!(
        tok.encode("a<ud>a", PLAIN).unwrap(),
        vec![v.id("a"), v.id("<ud>"), v.id("a")]
    );
}

#[test]
fn empty_input_gives_no_ids() {
    let b = Tokenizer::from_gguf(&bpe_vocab("gpt-2").gguf).unwrap();
    let s = Tokenizer::from_gguf(&spm_vocab(None).gguf).unwrap();
    for tok in [&b, &s] {
        assert!(tok.encode("", PLAIN).unwrap().is_empty());
        assert!(tok.encode_bytes(b"", PLAIN).unwrap().is_empty());
        assert!(tok.decode(&[]).unwrap().is_empty());
    }
}

#[test]
fn invalid_utf8_is_encoded_by_bpe_and_reported_by_spm() {
    let b = Tokenizer::from_gguf(&bpe_vocab("llama-bpe").gguf).unwrap();
    let bytes = b"ab\xFF\xC3 in\xE2\x82";
    let ids = b.encode_bytes(bytes, PLAIN).unwrap();
    assert_eq!(b.decode(&ids).unwrap(), bytes.to_vec());

    let s = Tokenizer::from_gguf(&spm_vocab(None).gguf).unwrap();
    match s.encode_bytes(b"hello\xFFx", PLAIN) {
        Err(TokenizerError::InvalidUtf8 { offset }) => assert_eq!(offset, 5),
        other => panic!("expected InvalidUtf8, got {other:?}"),
    }
}

#[test]
fn unknown_ids_are_errors() {
    let s = Tokenizer::from_gguf(&spm_vocab(None).gguf).unwrap();
    let n = s.n_vocab() as u32;
    assert!(matches!(s.decode(&[1, n]), Err(TokenizerError::UnknownTokenId { id, .. }) if id == n));
    assert!(s.token_to_piece(u32::MAX).is_err());
    assert!(s.token_type(n).is_err());
    assert!(s.stream_decoder().push(n).is_err());
    let msg = s.decode(&[n]).unwrap_err().to_string();
    assert!(msg.contains(&n.to_string()), "{msg}");
}

#[test]
fn pieces_unescape_spaces_bytes_and_keep_control_text() {
    let v = spm_vocab(None);
    let s = Tokenizer::from_gguf(&v.gguf).unwrap();
    assert_eq!(s.token_to_piece(v.id("▁hello")).unwrap(), b" hello");
    assert_eq!(s.token_to_piece(v.byte(0x0A)).unwrap(), b"\n");
    assert_eq!(s.token_to_piece(v.id("<start>")).unwrap(), b"<start>");
    let v = bpe_vocab("qwen2");
    let b = Tokenizer::from_gguf(&v.gguf).unwrap();
    assert_eq!(b.token_to_piece(v.id(&alphabet(" the"))).unwrap(), b" the");
    assert_eq!(b.token_to_piece(0x0A).unwrap(), b"\n");
}

#[test]
fn stream_decoder_holds_back_split_characters() {
    let v = spm_vocab(None);
    let s = Tokenizer::from_gguf(&v.gguf).unwrap();
    let mut d = s.stream_decoder();
    // "é" = C3 A9 arrives as two byte tokens.
    assert_eq!(d.push(v.id("a")).unwrap(), "a");
    assert_eq!(d.push(v.byte(0xC3)).unwrap(), "");
    assert_eq!(d.pending_bytes(), &[0xC3]);
    assert_eq!(d.push(v.byte(0xA9)).unwrap(), "é");
    // A four-byte emoji split three ways.
    let crab = "🦀".as_bytes();
    assert_eq!(d.push(v.byte(crab[0])).unwrap(), "");
    assert_eq!(d.push(v.byte(crab[1])).unwrap(), "");
    assert_eq!(d.push(v.byte(crab[2])).unwrap(), "");
    assert_eq!(d.push(v.byte(crab[3])).unwrap(), "🦀");
    // A byte that can never start a character is replaced at once.
    assert_eq!(d.push(v.byte(0xFF)).unwrap(), "\u{FFFD}");
    // An incomplete tail at the end becomes one replacement character.
    assert_eq!(d.push(v.byte(0xE2)).unwrap(), "");
    assert_eq!(d.push(v.id("a")).unwrap(), "\u{FFFD}a");
    assert_eq!(d.push(v.byte(0xE2)).unwrap(), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    assert_eq!(d.finish(), "");

    // Byte-level BPE: "€" (E2 82 AC) as three byte symbols.
    let b = Tokenizer::from_gguf(&bpe_vocab("qwen2").gguf).unwrap();
    let ids = b.encode("€", PLAIN).unwrap();
    assert_eq!(ids, vec![0xE2, 0x82, 0xAC]);
    let mut d = b.stream_decoder();
    let out: Vec<String> = ids.iter().map(|&id| d.push(id).unwrap()).collect();
    assert_eq!(out, ["", "", "€"]);
}

fn err_of(meta: Vec<(&str, Value)>) -> String {
    Tokenizer::from_gguf(&gguf(meta)).unwrap_err().to_string()
}

#[test]
fn missing_or_bad_metadata_names_the_key() {
    let e = err_of(vec![(
        "general.architecture",
        Value::String("llama".into()),
    )]);
    assert!(e.contains("tokenizer.ggml.model"), "{e}");
    let e = err_of(vec![(
        "tokenizer.ggml.model",
        Value::String("llama".into()),
    )]);
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
    let e = err_of(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("qwen2".into())),
        ("tokenizer.ggml.tokens", str_array(&["a".into()])),
    ]);
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");
    let e = err_of(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("bogus-pre".into())),
        ("tokenizer.ggml.tokens", str_array(&["a".into()])),
        ("tokenizer.ggml.merges", str_array(&[])),
    ]);
    assert!(
        e.contains("bogus-pre") && e.contains("tokenizer.ggml.pre"),
        "{e}"
    );
    let e = err_of(vec![("tokenizer.ggml.model", Value::String("t5".into()))]);
    assert!(e.contains("\"t5\""), "{e}");
    let e = err_of(vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            str_array(&["a".into(), "b".into()]),
        ),
        ("tokenizer.ggml.scores", f32_array(&[0.0])),
    ]);
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");
    let e = err_of(vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            Value::String("not an array".into()),
        ),
    ]);
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
}

fn text_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        proptest::collection::vec(
            prop_oneof![
                Just(' '),
                Just('\n'),
                Just('\t'),
                Just('\''),
                Just('<'),
                Just('>'),
                Just('|'),
                proptest::char::range('a', 'z'),
                proptest::char::range('A', 'Z'),
                proptest::char::range('0', '9'),
                Just('é'),
                Just('ж'),
                Just('中'),
                Just('🦀'),
                Just('\u{200d}'),
            ],
            0..40
        )
        .prop_map(|v| v.into_iter().collect()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]

    #[test]
    fn bpe_round_trip(s in text_strategy(), parse_special in any::<bool>(), pre in prop_oneof![Just("qwen2"), Just("llama-bpe"), Just("gpt-2"), Just("default")]) {
        let tok = Tokenizer::from_gguf(&bpe_vocab(pre).gguf).unwrap();
        let ids = tok.encode(&s, EncodeOptions { add_special: false, parse_special }).unwrap();
        prop_assert_eq!(tok.decode(&ids).unwrap(), s.as_bytes().to_vec());
    }

    #[test]
    fn bpe_round_trip_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let tok = Tokenizer::from_gguf(&bpe_vocab("qwen2").gguf).unwrap();
        let ids = tok.encode_bytes(&bytes, PLAIN).unwrap();
        prop_assert_eq!(tok.decode(&ids).unwrap(), bytes);
    }

    #[test]
    fn spm_round_trip_adds_one_leading_space(s in text_strategy().prop_filter("no user-defined token, no U+2581", |s| !s.contains("<ud>") && !s.contains('\u{2581}'))) {
        let v = spm_vocab(None);
        let tok = Tokenizer::from_gguf(&v.gguf).unwrap();
        let ids = tok.encode(&s, PLAIN).unwrap();
        let want = if s.is_empty() { String::new() } else { format!(" {s}") };
        prop_assert_eq!(tok.decode(&ids).unwrap(), want.into_bytes());
    }

    #[test]
    fn spm_round_trip_without_prefix_is_exact(s in text_strategy().prop_filter("no U+2581", |s| !s.contains('\u{2581}'))) {
        let tok = Tokenizer::from_gguf(&spm_vocab(Some(false)).gguf).unwrap();
        let ids = tok.encode(&s, PLAIN).unwrap();
        prop_assert_eq!(tok.decode(&ids).unwrap(), s.into_bytes());
    }

    #[test]
    fn stream_decoding_equals_whole_decoding(s in text_strategy().prop_filter("no U+2581", |s| !s.contains('\u{2581}'))) {
        let tok = Tokenizer::from_gguf(&spm_vocab(Some(false)).gguf).unwrap();
        let ids = tok.encode(&s, PLAIN).unwrap();
        let mut d = tok.stream_decoder();
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&d.push(id).unwrap());
        }
        streamed.push_str(&d.finish());
        prop_assert_eq!(streamed, s);
    }
}
