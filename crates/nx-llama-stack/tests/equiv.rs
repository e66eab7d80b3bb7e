//! EQUIV-1: the logits of every prompt position are bit-identical whatever the prefill
//! chunk size (1, 7, 32, whole prompt) and whatever the thread count.

mod common;

use common::*;
use nx_llama_stack::Model;

/// Every row of a prefill of `tokens` in chunks of `chunk`, as raw bits.
fn all_logit_bits(model: &Model, tokens: &[u32], chunk: usize) -> Vec<u32> {
    // The default f16 cache: invariance must hold for what users run.
    forward_rows_kv(model, tokens, 0, chunk, nx_llama_stack::KvDtype::F16)
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn long_prompt(fixture: &str) -> Vec<u32> {
    let golden = load_golden(&format!("forward-{fixture}.json"));
    let prompts = ref_prompts(&golden);
    let p = prompts
        .iter()
        .max_by_key(|p| p.prompt_ids.len())
        .expect("prompts");
    let mut ids = p.prompt_ids.clone();
    ids.extend(p.steps.iter().map(|s| s.id));
    // The sixteen file-type fixtures share one shape and differ in weight types only:
    // 100 positions (six whole token tiles and four after them) cover each type's
    // kernels at half the cost of the whole prompt, which on the scalar tier is minutes.
    if fixture.starts_with("llama-ft-") {
        ids.truncate(100);
    }
    assert!(
        ids.len() >= 100,
        "EQUIV-1 needs >= 100 tokens, have {}",
        ids.len()
    );
    ids
}

fn first_difference(a: &[u32], b: &[u32], n_vocab: usize) -> Option<(usize, usize)> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .map(|i| (i / n_vocab, i % n_vocab))
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn equiv_chunk_sizes_and_threads() {
    for fixture in SYNTH_FIXTURES {
        let path = synth_model(fixture);
        let mut model = Model::open(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask synth`)", path.display()));
        let tokens = long_prompt(fixture);
        let n_vocab = model.config().n_vocab;
        model.set_threads(1);
        let reference = all_logit_bits(&model, &tokens, tokens.len());
        let mut checked = 0;
        for threads in [1, 2] {
            model.set_threads(threads);
            for chunk in [1, 7, 32, tokens.len()] {
                let got = all_logit_bits(&model, &tokens, chunk);
                assert_eq!(got.len(), reference.len());
                if let Some((row, col)) = first_difference(&got, &reference, n_vocab) {
                    panic!(
                        "{fixture}: chunk {chunk}, {threads} threads: logits of position {row} \
                         differ at token {col} from the whole-prompt single-thread run"
                    );
                }
                checked += 1;
            }
        }
        println!(
            "EQUIV-1 {fixture}: {} positions × {n_vocab} logits bit-identical across {checked} \
             runs (chunk 1, 7, 32, {}; threads 1, 2)",
            tokens.len(),
            tokens.len()
        );
    }
}

/// FNV-1a over the bits of one logits row: rows are compared by hash so that 650 rows of
/// a 262 144-token vocabulary need not be held in memory.
fn row_hash(row: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for x in row {
        for b in x.to_bits().to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Hashes of the logits rows at `wanted` positions of a prefill of `tokens` in chunks.
fn hashed_rows(model: &Model, tokens: &[u32], wanted: &[usize], chunk: usize) -> Vec<u64> {
    use nx_llama_stack::{ForwardState, KvDtype};
    let mut cache = model.new_cache(tokens.len(), KvDtype::F16).expect("cache");
    let mut state = ForwardState::default();
    let mut logits = Vec::new();
    let n_vocab = model.config().n_vocab;
    let mut hashes = Vec::new();
    let mut pos = 0;
    for piece in tokens.chunks(chunk) {
        let rows: Vec<usize> = wanted
            .iter()
            .filter(|&&p| p >= pos && p < pos + piece.len())
            .map(|&p| p - pos)
            .collect();
        model
            .forward(piece, pos, &mut cache, &rows, &mut state, &mut logits)
            .expect("forward");
        hashes.extend(logits.chunks_exact(n_vocab).map(row_hash));
        pos += piece.len();
    }
    hashes
}

/// EQUIV-1 on the default model with a prompt longer than Gemma 3's 512-token sliding
/// window, so local and global layers see different rows: bit-identical logits for
/// prefill chunks 7, 32 and the whole prompt, on 1 and 2 threads.
#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn equiv_default_model_past_the_sliding_window() {
    let path = default_model();
    let mut model = Model::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask fetch`)", path.display()));
    let window = model
        .config()
        .sliding_window
        .expect("gemma3 has a sliding window");
    let n = 650;
    assert!(n > window + 100);
    // BOS, then deterministic ordinary-vocabulary ids.
    let mut tokens = vec![2u32];
    let mut state = 12345u64;
    while tokens.len() < n {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        tokens.push(1000 + ((state >> 33) % 200_000) as u32);
    }
    // Every 16th position, and every position of the last 40 (all past the window).
    let wanted: Vec<usize> = (0..n).filter(|&p| p % 16 == 0 || p >= n - 40).collect();
    model.set_threads(1);
    let reference = hashed_rows(&model, &tokens, &wanted, n);
    let mut runs = 0;
    for threads in [1, 2] {
        model.set_threads(threads);
        for chunk in [7, 32, n] {
            if (threads, chunk) == (1, n) {
                // That is the reference run itself.
                continue;
            }
            let got = hashed_rows(&model, &tokens, &wanted, chunk);
            if let Some(i) = got.iter().zip(&reference).position(|(a, b)| a != b) {
                panic!(
                    "default model: chunk {chunk}, {threads} threads: logits of position {} \
                     differ from the whole-prompt single-thread run",
                    wanted[i]
                );
            }
            runs += 1;
        }
    }
    println!(
        "EQUIV-1 default model: {} logits rows (positions up to {}, window {window}) \
         bit-identical to the whole-prompt 1-thread run across {runs} runs (chunk 7, 32, {n}; \
         threads 1, 2)",
        wanted.len(),
        n - 1
    );
}
