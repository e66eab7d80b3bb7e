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
    for fixture in ["qwen2-tiny", "llama-tiny", "qwen3-tiny"] {
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
