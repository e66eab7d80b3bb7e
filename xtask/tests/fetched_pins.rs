//! Gate FETCH-PINS: the fetched files match their pins when hashed in full (stamps are not
//! consulted), and the test vectors next to the pinned vocabs are complete.

use xtask::fetch::{default_model_path, sha256_file, vocab_path, vocab_test_vectors};
use xtask::pins::{DEFAULT_MODEL, PINNED_VOCABS};

/// Cases per `.inp`/`.out` pair, as the reference notes state.
const CASES_PER_VECTOR_FILE: usize = 46;

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn default_model_matches_its_pin_and_is_gguf_v3() {
    let path = default_model_path();
    let (size, sha256) = sha256_file(&path).expect("hash the default model");
    assert_eq!(Some(size), DEFAULT_MODEL.size, "{}", path.display());
    assert_eq!(sha256, DEFAULT_MODEL.sha256, "{}", path.display());

    let mut header = [0u8; 8];
    use std::io::Read;
    std::fs::File::open(&path)
        .and_then(|mut f| f.read_exact(&mut header))
        .expect("read header");
    assert_eq!(&header[..4], b"GGUF");
    assert_eq!(u32::from_le_bytes(header[4..8].try_into().unwrap()), 3);
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn pinned_vocabs_match_and_their_vectors_are_complete() {
    for pin in PINNED_VOCABS {
        let path = vocab_path(pin.file_name);
        let (_, sha256) = sha256_file(&path).expect("hash vocab");
        assert_eq!(sha256, pin.sha256, "{}", path.display());

        let (inp, out) = vocab_test_vectors(pin.file_name);
        let inp_text = std::fs::read_to_string(&inp).expect("read .inp");
        let out_text = std::fs::read_to_string(&out).expect("read .out");
        let inp_cases = inp_text
            .lines()
            .filter(|l| *l == "__ggml_vocab_test__")
            .count();
        let out_cases = out_text.lines().count();
        assert_eq!(inp_cases, CASES_PER_VECTOR_FILE, "{}", inp.display());
        assert_eq!(out_cases, CASES_PER_VECTOR_FILE, "{}", out.display());
    }
}
