//! Gate FETCH-PINS: the fetched files match their pins when hashed in full (stamps are not
//! consulted), the test vectors next to the pinned vocabs are complete, and the `openai`
//! client's environment holds exactly the pinned versions.

use xtask::fetch::{
    chat_model_path, default_model_path, download_path, openai_env_dir, sha256_file, venv_python,
    vocab_path, vocab_test_vectors,
};
use xtask::pins::{PinnedFile, CHAT_MODEL, DEFAULT_MODEL, OPENAI_ENV, PINNED_VOCABS};

/// Cases per `.inp`/`.out` pair, as the reference notes state.
const CASES_PER_VECTOR_FILE: usize = 46;

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn default_model_matches_its_pin_and_is_gguf_v3() {
    check_model(&default_model_path(), &DEFAULT_MODEL);
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn chat_model_matches_its_pin_and_is_gguf_v3() {
    check_model(&chat_model_path(), &CHAT_MODEL);
}

fn check_model(path: &std::path::Path, pin: &PinnedFile) {
    let (size, sha256) = sha256_file(path).expect("hash the model");
    assert_eq!(Some(size), pin.size, "{}", path.display());
    assert_eq!(sha256, pin.sha256, "{}", path.display());

    let mut header = [0u8; 8];
    use std::io::Read;
    std::fs::File::open(path)
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

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn openai_wheels_match_and_the_env_has_their_versions() {
    for wheel in OPENAI_ENV.wheels {
        let path = download_path(wheel.file.file_name);
        let (size, sha256) = sha256_file(&path).expect("hash wheel");
        assert_eq!(Some(size), wheel.file.size, "{}", path.display());
        assert_eq!(sha256, wheel.file.sha256, "{}", path.display());
    }
    // Every installed distribution, as the environment's own pip metadata lists it.
    let python = venv_python(&openai_env_dir());
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            "import sys, importlib.metadata as md, openai\n\
             print('%d.%d' % sys.version_info[:2])\n\
             print(openai.__version__)\n\
             for d in md.distributions():\n    print(d.metadata['Name'], d.version)",
        ])
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(OPENAI_ENV.python_version));
    let (_, openai_version) = OPENAI_ENV.wheels[0].requirement.split_once("==").unwrap();
    assert_eq!(lines.next(), Some(openai_version));
    let normalize = |name: &str| name.to_ascii_lowercase().replace(['-', '.'], "_");
    let mut installed: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(' '))
        .map(|(n, v)| (normalize(n), v.to_string()))
        // pip and setuptools come with the virtual environment itself.
        .filter(|(n, _)| n != "pip" && n != "setuptools")
        .collect();
    let mut pinned: Vec<(String, String)> = OPENAI_ENV
        .wheels
        .iter()
        .map(|w| {
            let (n, v) = w.requirement.split_once("==").unwrap();
            (normalize(n), v.to_string())
        })
        .collect();
    installed.sort();
    pinned.sort();
    assert_eq!(installed, pinned, "installed vs pinned distributions");
}
