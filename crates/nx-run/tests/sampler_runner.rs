//! Part of the SAMPLER gate: generation through the runner does not depend on the
//! prefill chunk size (greedy tokens and their log-probabilities are identical for
//! chunks of 1, 7, 32 and the whole prompt), a seeded sampling run repeats exactly and
//! is the same across chunk sizes, a different seed gives a different run, and the
//! prompt enters the repetition-penalty window.

mod common;

use common::{generate, greedy, load, prompt_ids, runner, TinyOptions};
use nx_run::{KvDtype, Prompt, RunConfig, SamplerConfig, StopReason};

const PROMPT_LEN: usize = 40;
const CHUNKS: [usize; 4] = [1, 7, 32, PROMPT_LEN];

fn sampling(seed: u64, prefill_chunk: usize) -> RunConfig {
    RunConfig {
        prefill_chunk,
        n_ctx: 128,
        max_tokens: 24,
        logprobs: 3,
        sampler: SamplerConfig {
            temperature: 1.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.02,
            repeat_penalty: 1.1,
            penalty_last_n: 64,
            seed,
            ..SamplerConfig::default()
        },
        ..RunConfig::default()
    }
}

#[test]
fn greedy_generation_is_independent_of_the_prefill_chunk() {
    let prompt = prompt_ids(PROMPT_LEN, 11);
    let runs: Vec<_> = CHUNKS
        .iter()
        .map(|&chunk| {
            let mut r = runner(RunConfig {
                logprobs: 4,
                ..greedy(16, chunk)
            });
            generate(&mut r, Prompt::Ids(prompt.clone())).unwrap()
        })
        .collect();
    for (run, chunk) in runs.iter().zip(CHUNKS).skip(1) {
        assert_eq!(run.ids, runs[0].ids, "chunk {chunk}");
        // Bit-identical logits give bit-identical log-probabilities.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&run.logprobs),
            bits(&runs[0].logprobs),
            "chunk {chunk}"
        );
        assert_eq!(run.tops, runs[0].tops, "chunk {chunk}");
        assert_eq!(run.text(), runs[0].text(), "chunk {chunk}");
    }
    assert_eq!(runs[0].ids.len(), 16);
}

#[test]
fn seeded_sampling_repeats_and_is_independent_of_the_prefill_chunk() {
    let prompt = prompt_ids(PROMPT_LEN, 12);
    let run = |seed: u64, chunk: usize| {
        let mut r = runner(sampling(seed, chunk));
        generate(&mut r, Prompt::Ids(prompt.clone())).unwrap()
    };
    let first = run(1234, 32);
    let again = run(1234, 32);
    assert_eq!(first.completion.reason, StopReason::MaxTokens);
    assert_eq!(first.ids.len(), 24);
    assert_eq!(again.ids, first.ids, "same seed, same tokens");
    assert_eq!(again.logprobs, first.logprobs);
    for chunk in [1, 7, PROMPT_LEN] {
        let other = run(1234, chunk);
        assert_eq!(other.ids, first.ids, "chunk {chunk}");
        assert_eq!(other.text(), first.text(), "chunk {chunk}");
    }

    // The same runner, reset between runs, repeats too.
    let mut r = runner(sampling(1234, 7));
    let a = generate(&mut r, Prompt::Ids(prompt.clone())).unwrap();
    let b = generate(&mut r, Prompt::Ids(prompt.clone())).unwrap();
    assert_eq!(a.ids, first.ids);
    assert_eq!(b.ids, first.ids);

    // Sampling really samples: another seed departs, and so does greedy decoding.
    assert_ne!(run(4321, 32).ids, first.ids);
    let mut g = runner(greedy(24, 32));
    assert_ne!(
        generate(&mut g, Prompt::Ids(prompt.clone())).unwrap().ids,
        first.ids
    );
}

/// Greedy next token after `ids`, straight from the model.
fn argmax_after(ids: &[u32]) -> u32 {
    let (model, _) = load(TinyOptions::default());
    let mut cache = model.new_cache(ids.len(), KvDtype::F16).unwrap();
    let mut state = nx_llama_stack::ForwardState::default();
    let mut logits = Vec::new();
    model
        .forward(
            ids,
            0,
            &mut cache,
            &[ids.len() - 1],
            &mut state,
            &mut logits,
        )
        .unwrap();
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn prompt_tokens_enter_the_penalty_window() {
    // Find a prompt whose unpenalised greedy continuation repeats one of its tokens.
    let (prompt, repeated) = (0..50)
        .map(|salt| prompt_ids(12, 100 + salt))
        .find_map(|p| {
            let next = argmax_after(&p);
            p.contains(&next).then_some((p, next))
        })
        .expect("some prompt whose argmax continuation is a prompt token");
    let penalised = SamplerConfig {
        repeat_penalty: 1000.0,
        penalty_last_n: 64,
        ..SamplerConfig::greedy()
    };
    let mut r = runner(RunConfig {
        sampler: penalised,
        ..greedy(6, 5)
    });
    let run = generate(&mut r, Prompt::Ids(prompt.clone())).unwrap();
    assert_ne!(run.ids[0], repeated, "the prompt token must be penalised");
    for (k, id) in run.ids.iter().enumerate() {
        assert!(
            !prompt.contains(id),
            "step {k}: {id} repeats a prompt token"
        );
        assert!(
            !run.ids[..k].contains(id),
            "step {k}: {id} repeats a generated token"
        );
    }
}
