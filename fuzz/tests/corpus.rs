//! The gate's fuzz smoke (`FUZZ-SMOKE`): every target over its seeds, the committed
//! regressions (`fuzz/regressions/TARGET/`, every crash a fuzzer found), the committed
//! edge-covering corpus of the long runs (`fuzz/corpus-min/TARGET/`) and a fixed number
//! of seeded mutations of each, on stable. The long coverage-guided runs are
//! `cargo xtask fuzz TARGET --seconds N`.

use std::path::PathBuf;

use nx_fuzz::{run_target, seeds::seeds, TARGETS};

/// Mutated inputs per target (a smoke, not a search: the fuzzer does the searching).
const MUTATIONS: usize = 400;

/// The committed inputs of `target` under `fuzz/KIND/` (`regressions` or `corpus-min`),
/// sorted by name.
fn committed(kind: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(kind)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .map(|e| e.expect("readable regressions directory").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).expect("readable regression input");
            (p.display().to_string(), bytes)
        })
        .collect()
}

/// SplitMix64, so every run mutates the same way.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values that break size arithmetic when they land on a length or count.
const INTERESTING_U64: [u64; 7] = [
    0,
    1,
    u64::MAX,
    i64::MAX as u64,
    (1 << 42) + 1,
    1 << 32,
    536_870_913,
];

/// One to four random edits of `input`.
fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = v.len();
        match rng.below(6) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = [0, 0xff, 0x7f, 0x80, b'{', b'}', 0][rng.below(7)];
            }
            2 if len >= 8 => {
                let i = rng.below(len - 7);
                let x = INTERESTING_U64[rng.below(INTERESTING_U64.len())];
                v[i..i + 8].copy_from_slice(&x.to_le_bytes());
            }
            3 if len > 0 => {
                let at = rng.below(len);
                v.truncate(at);
            }
            4 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(64)).min(len);
                let piece = v[start..end].to_vec();
                let at = rng.below(len);
                v.splice(at..at, piece);
            }
            _ => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(at..at, bytes);
            }
        }
    }
    v
}

fn smoke(target: &str) {
    let mut inputs: Vec<(String, Vec<u8>)> = seeds(target)
        .into_iter()
        .enumerate()
        .map(|(i, s)| (format!("seed {i}"), s))
        .collect();
    assert!(!inputs.is_empty(), "{target} has no seeds");
    inputs.extend(committed("regressions", target));
    inputs.extend(committed("corpus-min", target));
    for (name, input) in &inputs {
        // Name the input that broke (the panic's own message follows on stderr).
        let ran = std::panic::catch_unwind(|| run_target(target, input));
        assert!(matches!(ran, Ok(true)), "{target}: {name} failed");
    }
    let mut rng = Rng(0x5eed ^ target.len() as u64);
    for _ in 0..MUTATIONS {
        let (_, base) = &inputs[rng.below(inputs.len())];
        let input = mutate(&mut rng, base);
        run_target(target, &input);
    }
}

#[test]
fn targets_are_listed() {
    for t in TARGETS {
        assert!(!seeds(t).is_empty(), "{t}");
    }
    assert!(!run_target("no_such_target", b""));
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gguf_header() {
    smoke("gguf_header");
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn model_open() {
    smoke("model_open");
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn tokenizer() {
    smoke("tokenizer");
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn chat_template() {
    smoke("chat_template");
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn sampler() {
    smoke("sampler");
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn api_request() {
    smoke("api_request");
}
