//! Gate GOLD-PPL: nx's perplexity of the default model on the text recorded in
//! `fixtures/golden/ppl-gemma3-270m.json` (written by `cargo xtask golden ppl` from
//! llama.cpp's `llama-perplexity` with an f32 KV cache) must be within 0.5% of
//! llama.cpp's final estimate. The text must still be the recorded one (SHA-256).
//!
//! The fixture is read with a small extractor for its few flat fields, and the SHA-256
//! is computed here (checked against the FIPS 180-2 test vectors first), because this
//! crate's dev-dependencies have no JSON or hashing crate.

use std::path::PathBuf;
use std::time::Instant;

use nx_bpe::Tokenizer;
use nx_llama_stack::{KvDtype, Model};
use nx_run::{perplexity, PerplexityConfig};

/// Largest accepted |nx − llama.cpp| / llama.cpp of the final PPL.
const MAX_RELATIVE_DIFF: f64 = 0.005;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cache_dir() -> PathBuf {
    match std::env::var_os("NX_CACHE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME or NX_CACHE")).join(".cache/nx"),
    }
}

/// The text after `"key":` in the fixture (up to the next comma or newline at depth 0).
fn raw_field<'a>(json: &'a str, key: &str) -> &'a str {
    let pat = format!("\"{key}\":");
    let start = json
        .find(&pat)
        .unwrap_or_else(|| panic!("fixture has no {key:?}"))
        + pat.len();
    let rest = json[start..].trim_start();
    if let Some(inner) = rest.strip_prefix('[') {
        return &inner[..inner.find(']').expect("unterminated array")];
    }
    if let Some(inner) = rest.strip_prefix('"') {
        return &inner[..inner.find('"').expect("unterminated string")];
    }
    let end = rest.find([',', '\n', '}']).unwrap_or(rest.len());
    rest[..end].trim()
}

fn num_field(json: &str, key: &str) -> f64 {
    let raw = raw_field(json, key);
    raw.parse()
        .unwrap_or_else(|_| panic!("fixture {key:?} is not a number: {raw:?}"))
}

fn list_field(json: &str, key: &str) -> Vec<f64> {
    raw_field(json, key)
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .unwrap_or_else(|_| panic!("{key}: bad number {s:?}"))
        })
        .collect()
}

/// SHA-256 (FIPS 180-4), lower-case hex.
fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    // Padding: 0x80, zeros to 56 mod 64, then the bit length big-endian.
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[test]
fn sha256_matches_the_fips_test_vectors() {
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_ppl_gemma3_270m() {
    let golden_path = repo_root().join("fixtures/golden/ppl-gemma3-270m.json");
    let json = std::fs::read_to_string(&golden_path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run `cargo xtask golden ppl`)",
            golden_path.display()
        )
    });
    let text_path = PathBuf::from(raw_field(&json, "text_path"));
    let text_sha256 = raw_field(&json, "text_sha256");
    let n_ctx = num_field(&json, "n_ctx") as usize;
    let n_chunks = num_field(&json, "n_chunks") as usize;
    let ref_ppl = num_field(&json, "ppl");
    let ref_error = num_field(&json, "ppl_error");
    let ref_running = list_field(&json, "running_ppl");
    assert_eq!(ref_running.len(), n_chunks, "fixture is inconsistent");

    let text = std::fs::read(&text_path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; GOLD-PPL needs the text llama.cpp was run on",
            text_path.display()
        )
    });
    let actual_sha256 = sha256_hex(&text);
    assert_eq!(
        actual_sha256,
        text_sha256,
        "{} is not the text the reference figures were recorded on: its SHA-256 differs \
         from the recorded one; run `cargo xtask golden ppl` to regenerate",
        text_path.display()
    );

    let model_path = cache_dir().join("models/gemma-3-270m-q4_k_m.gguf");
    let mut model = Model::open(&model_path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask fetch`)", model_path.display()));
    model.set_threads(2);
    let tokenizer = Tokenizer::from_gguf(model.gguf()).expect("tokenizer");
    let config = PerplexityConfig {
        n_ctx,
        batch: n_ctx,
        max_chunks: None,
        kv_dtype: KvDtype::F32,
    };
    let started = Instant::now();
    let model = std::sync::Arc::new(model);
    let report = perplexity(&model, &tokenizer, &text, &config, |p| {
        println!(
            "  [{}] nx {:.4}  llama.cpp {:.4}  ({:.2} s)",
            p.chunk + 1,
            p.running_ppl,
            ref_running.get(p.chunk).copied().unwrap_or(f64::NAN),
            p.elapsed.as_secs_f64()
        );
    })
    .expect("perplexity");
    let elapsed = started.elapsed();

    let rel = (report.ppl - ref_ppl).abs() / ref_ppl;
    println!(
        "GOLD-PPL {}: {} tokens, {} windows of {}, {} threads, {:.1} s",
        text_path.display(),
        report.n_tokens,
        report.n_chunks,
        n_ctx,
        model.threads(),
        elapsed.as_secs_f64()
    );
    println!(
        "GOLD-PPL nx PPL = {:.4} +/- {:.5}; llama.cpp PPL = {ref_ppl:.4} +/- {ref_error:.5}; \
         relative difference {:.4}% (limit {:.1}%)",
        report.ppl,
        report.ppl_error.unwrap_or(f64::NAN),
        rel * 100.0,
        MAX_RELATIVE_DIFF * 100.0
    );
    assert_eq!(
        report.n_chunks, n_chunks,
        "nx cut the text into a different number of windows than llama.cpp"
    );
    assert!(
        rel <= MAX_RELATIVE_DIFF,
        "nx PPL {:.4} is {:.3}% away from llama.cpp's {ref_ppl:.4} (limit {:.1}%)",
        report.ppl,
        rel * 100.0,
        MAX_RELATIVE_DIFF * 100.0
    );
}
