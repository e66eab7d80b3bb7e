//! Runner behaviour on a tiny in-memory model: stop rules (max tokens, byte cap, stop
//! strings with held-back text, end of generation, the callback), errors, logprobs
//! against an independent log-softmax of the model's own logits, conversations that
//! continue on the same cache, and BOS handling.

mod common;

use std::sync::Arc;

use common::{
    continue_with, expected_text, generate, generate_until, greedy, load, n_vocab, prompt_ids,
    runner, TinyOptions, BOS,
};
use nx_run::{KvDtype, Prompt, RunConfig, RunError, Runner, SamplerConfig, StopReason};

/// Log-softmax of the model's logits after `ids`, computed here in f64 from a plain
/// forward pass (no runner involved).
fn reference_log_softmax(ids: &[u32]) -> Vec<f64> {
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
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    logits.iter().map(|&x| x as f64 - lse).collect()
}

#[test]
fn max_tokens_stops_and_text_matches_decode() {
    let mut r = runner(greedy(12, 32));
    let run = generate(&mut r, Prompt::Ids(prompt_ids(10, 1))).unwrap();
    assert_eq!(run.completion.reason, StopReason::MaxTokens);
    assert_eq!(run.ids.len(), 12);
    assert_eq!(run.completion.tokens, run.ids);
    assert_eq!(run.completion.stats.generated_tokens, 12);
    assert_eq!(run.completion.stats.prompt_tokens, 10);
    // The last token is emitted but never fed to the model.
    assert_eq!(run.completion.stats.decode_steps, 11);
    assert_eq!(run.done_events, 1);
    // Streamed text equals the lossy decoding of all emitted ids at once.
    let tok = r.tokenizer().unwrap();
    let whole = expected_text(tok, &run.ids);
    assert_eq!(run.text(), whole);
    assert!(!whole.is_empty());
    // The sequence is the prompt, then the generated tokens.
    let mut expected = prompt_ids(10, 1);
    expected.extend(&run.ids);
    assert_eq!(r.tokens(), expected);
    assert_eq!(r.cached_len(), expected.len() - 1);
}

#[test]
fn greedy_tokens_and_logprobs_match_an_independent_forward_pass() {
    let mut r = runner(RunConfig {
        logprobs: 5,
        ..greedy(4, 3)
    });
    let prompt = prompt_ids(9, 2);
    let run = generate(&mut r, Prompt::Ids(prompt.clone())).unwrap();
    let mut seq = prompt.clone();
    for (k, &id) in run.ids.iter().enumerate() {
        let lp = reference_log_softmax(&seq);
        let best = (0..lp.len())
            .max_by(|&a, &b| lp[a].total_cmp(&lp[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        assert_eq!(id, best, "step {k}: greedy must pick the argmax");
        assert!(
            (run.logprobs[k] as f64 - lp[id as usize]).abs() < 1e-4,
            "step {k}"
        );
        let top = &run.tops[k];
        assert_eq!(top.len(), 5);
        assert_eq!(top[0].0, id);
        for w in top.windows(2) {
            assert!(w[0].1 >= w[1].1, "top is sorted best first: {top:?}");
        }
        for &(t, l) in top {
            assert!((l as f64 - lp[t as usize]).abs() < 1e-4, "step {k} alt {t}");
        }
        seq.push(id);
    }
}

#[test]
fn byte_cap_cuts_output_at_the_cap() {
    let mut r = runner(greedy(24, 32));
    let full = generate(&mut r, Prompt::Ids(prompt_ids(8, 3)))
        .unwrap()
        .text();
    assert!(full.len() >= 8, "need some text to cap: {full:?}");
    for cap in [1, full.len() / 3, full.len() / 2 + 1, full.len() - 1] {
        let mut r = runner(RunConfig {
            max_bytes: Some(cap),
            ..greedy(24, 32)
        });
        let run = generate(&mut r, Prompt::Ids(prompt_ids(8, 3))).unwrap();
        let out = run.text();
        assert_eq!(run.completion.reason, StopReason::MaxBytes, "cap {cap}");
        assert!(out.len() <= cap, "cap {cap}: {} bytes", out.len());
        assert!(out.len() + 4 > cap, "cut only to a character boundary");
        assert!(
            full.starts_with(&out),
            "cap {cap}: {out:?} not a prefix of {full:?}"
        );
    }
}

/// The text of each token in a greedy run, decoded one token at a time.
fn token_texts(r: &Runner, ids: &[u32]) -> Vec<String> {
    let tok = r.tokenizer().unwrap();
    ids.iter().map(|&id| expected_text(tok, &[id])).collect()
}

#[test]
fn stop_string_is_cut_and_held_back_across_tokens() {
    let prompt = prompt_ids(8, 4);
    let mut r = runner(greedy(24, 32));
    let reference = generate(&mut r, Prompt::Ids(prompt.clone())).unwrap();
    let full = reference.text();
    let pieces = token_texts(&r, &reference.ids);
    // A stop string that spans the boundary between two non-empty ASCII token texts in
    // the middle of the output.
    let j = (pieces.len() / 2..pieces.len() - 1)
        .find(|&j| {
            let (a, b) = (&pieces[j], &pieces[j + 1]);
            !a.is_empty() && !b.is_empty() && a.is_ascii() && b.is_ascii()
        })
        .expect("two adjacent ASCII tokens");
    let stop = format!(
        "{}{}",
        &pieces[j][pieces[j].len() - 1..],
        &pieces[j + 1][..1]
    );
    let expected = &full[..full.find(&stop).unwrap()];

    let mut r = runner(RunConfig {
        stop_strings: vec!["never-generated-QQ".into(), stop.clone()],
        ..greedy(24, 32)
    });
    let run = generate(&mut r, Prompt::Ids(prompt.clone())).unwrap();
    assert_eq!(run.completion.reason, StopReason::StopString);
    assert_eq!(run.text(), expected, "stop {stop:?} in {full:?}");
    assert!(run.flushed.is_empty());
    // Generation stopped at the token that completed the stop string.
    let n = run.ids.len();
    assert_eq!(run.ids[..], reference.ids[..n]);
    assert!(n <= j + 2);
    // The stop string's first character was held back: no event ever released it, even
    // the event of the token that produced it.
    let released: String = run.texts.concat();
    assert!(!released.ends_with(&stop[..1]) || expected.ends_with(&stop[..1]));
}

#[test]
fn possible_stop_prefix_is_held_then_released() {
    let prompt = prompt_ids(8, 4);
    let mut r = runner(greedy(16, 32));
    let reference = generate(&mut r, Prompt::Ids(prompt.clone())).unwrap();
    let full = reference.text();
    let pieces = token_texts(&r, &reference.ids);
    // Every ASCII character the output ends a token with starts a stop string that
    // cannot occur ('Q' is not in the vocabulary): each is held, then released.
    let stops: Vec<String> = pieces
        .iter()
        .filter_map(|p| p.chars().last())
        .map(|c| format!("{c}QQ"))
        .collect();
    let mut r = runner(RunConfig {
        stop_strings: stops,
        ..greedy(16, 32)
    });
    let run = generate(&mut r, Prompt::Ids(prompt)).unwrap();
    assert_eq!(run.completion.reason, StopReason::MaxTokens);
    assert_eq!(run.ids, reference.ids);
    assert_eq!(run.text(), full);
    // Some token's own last character was held back into a later event.
    let held = run
        .texts
        .iter()
        .zip(&pieces)
        .take(run.texts.len() - 1)
        .any(|(t, p)| !p.is_empty() && !t.ends_with(p.as_str()));
    assert!(held, "texts {:?} pieces {pieces:?}", run.texts);
}

#[test]
fn end_of_generation_token_stops_without_text() {
    let prompt = prompt_ids(8, 5);
    let mut r = runner(greedy(12, 32));
    let reference = generate(&mut r, Prompt::Ids(prompt.clone())).unwrap();
    // Make the first token that did not occur before position 3 the EOS token of the
    // same weights: generation must stop right before it.
    let k = (3..reference.ids.len())
        .find(|&k| !reference.ids[..k].contains(&reference.ids[k]))
        .expect("a new token after position 3");
    let eos = reference.ids[k];
    let (model, tok) = load(TinyOptions {
        eos_id: eos,
        ..TinyOptions::default()
    });
    assert!(tok.is_eog(eos));
    let mut r = Runner::new(model, Some(tok.clone()), greedy(12, 32)).unwrap();
    let run = generate(&mut r, Prompt::Ids(prompt)).unwrap();
    assert_eq!(run.completion.reason, StopReason::Eos);
    assert_eq!(run.ids, reference.ids[..k]);
    assert_eq!(run.completion.stats.generated_tokens, k);
    let expected = expected_text(&tok, &reference.ids[..k]);
    assert_eq!(run.text(), expected);
    // The EOG token is not part of the sequence; the last emitted one is pending.
    assert_eq!(*r.tokens().last().unwrap(), reference.ids[k - 1]);
}

#[test]
fn callback_can_stop_and_the_conversation_continues() {
    let prompt = prompt_ids(8, 6);
    let mut r = runner(greedy(10, 32));
    let run = generate_until(&mut r, Prompt::Ids(prompt.clone()), 3).unwrap();
    assert_eq!(run.completion.reason, StopReason::Callback);
    assert_eq!(run.ids.len(), 3);
    // Continuing with no new tokens feeds the pending token and goes on as if the first
    // generation had never stopped.
    let more = continue_with(&mut r, Prompt::Ids(vec![])).unwrap();
    assert_eq!(more.completion.stats.prompt_tokens, 1);
    let mut whole = runner(greedy(13, 32));
    let reference = generate(&mut whole, Prompt::Ids(prompt)).unwrap();
    let mut joined = run.ids.clone();
    joined.extend(&more.ids);
    assert_eq!(joined, reference.ids);
}

#[test]
fn continuation_reuses_the_cache_and_matches_a_fresh_run() {
    let a = prompt_ids(9, 7);
    let b = prompt_ids(5, 8);
    let mut r = runner(greedy(6, 4));
    let first = generate(&mut r, Prompt::Ids(a.clone())).unwrap();
    let cached_before = r.cached_len();
    assert_eq!(cached_before, a.len() + 5);
    let second = continue_with(&mut r, Prompt::Ids(b.clone())).unwrap();
    // Only the pending token and the new ones were prefilled.
    assert_eq!(second.completion.stats.prompt_tokens, b.len() + 1);

    let mut all = a.clone();
    all.extend(&first.ids);
    all.extend(&b);
    let mut fresh = runner(greedy(6, 32));
    let reference = generate(&mut fresh, Prompt::Ids(all.clone())).unwrap();
    assert_eq!(second.ids, reference.ids);
    assert_eq!(second.logprobs, reference.logprobs);
    all.extend(&second.ids);
    assert_eq!(r.tokens(), all);

    // reset forgets everything: the same prompt gives the first answer again.
    r.reset();
    assert_eq!(r.cached_len(), 0);
    let again = generate(&mut r, Prompt::Ids(a)).unwrap();
    assert_eq!(again.ids, first.ids);
}

#[test]
fn truncate_rolls_back_to_a_prefix() {
    let a = prompt_ids(10, 9);
    let mut r = runner(greedy(5, 32));
    let first = generate(&mut r, Prompt::Ids(a.clone())).unwrap();
    r.truncate(a.len());
    assert_eq!(r.tokens(), a);
    // Continuing with the last prompt token removed and re-added reproduces the answer.
    r.truncate(a.len() - 1);
    let again = continue_with(&mut r, Prompt::Ids(vec![*a.last().unwrap()])).unwrap();
    assert_eq!(again.ids, first.ids);
}

#[test]
fn text_prompts_get_bos_once() {
    let mut r = runner(greedy(2, 32));
    generate(&mut r, Prompt::Text("the cat".into())).unwrap();
    let tokens = r.tokens();
    assert_eq!(tokens[0], BOS);
    assert_eq!(tokens[1..3], r.encode("the cat", false).unwrap()[..2]);
    let n = tokens.len();
    // The continuation is encoded without BOS: the sequence grows by exactly its
    // tokens, then the generated ones.
    let more = continue_with(&mut r, Prompt::Text(" sat".into())).unwrap();
    let encoded = r.encode(" sat", false).unwrap();
    assert_ne!(encoded[0], BOS);
    let after = r.tokens();
    assert_eq!(after[n..n + encoded.len()], encoded[..]);
    assert_eq!(after[n + encoded.len()..], more.ids[..]);

    let mut r = runner(RunConfig {
        add_special: false,
        ..greedy(2, 32)
    });
    generate(&mut r, Prompt::Text("the cat".into())).unwrap();
    assert_ne!(r.tokens()[0], BOS);
}

#[test]
fn prefill_only_with_zero_max_tokens() {
    let mut r = runner(greedy(0, 4));
    let run = generate(&mut r, Prompt::Ids(prompt_ids(10, 10))).unwrap();
    assert_eq!(run.completion.reason, StopReason::MaxTokens);
    assert!(run.ids.is_empty());
    assert_eq!(r.cached_len(), 10);
    assert_eq!(run.done_events, 1);
}

#[test]
fn empty_prompt_is_an_error() {
    let mut r = runner(greedy(4, 32));
    assert!(matches!(
        generate(&mut r, Prompt::Ids(vec![])),
        Err(RunError::EmptyPrompt)
    ));
    let mut r = runner(RunConfig {
        add_special: false,
        ..greedy(4, 32)
    });
    assert!(matches!(
        generate(&mut r, Prompt::Text(String::new())),
        Err(RunError::EmptyPrompt)
    ));
    // Nothing pending after a prefill-only run: an empty continuation has no logits.
    let mut r = runner(greedy(0, 32));
    generate(&mut r, Prompt::Ids(prompt_ids(3, 0))).unwrap();
    assert!(matches!(
        continue_with(&mut r, Prompt::Ids(vec![])),
        Err(RunError::EmptyPrompt)
    ));
}

#[test]
fn context_overflow_names_the_numbers() {
    let config = RunConfig {
        n_ctx: 32,
        ..greedy(13, 8)
    };
    let mut r = runner(config.clone());
    let err = generate(&mut r, Prompt::Ids(prompt_ids(20, 0))).unwrap_err();
    assert!(matches!(err, RunError::ContextOverflow { .. }), "{err}");
    let msg = err.to_string();
    for n in ["20", "13", "32"] {
        assert!(msg.contains(n), "{msg}");
    }
    // Exactly full is fine.
    let mut r = runner(RunConfig {
        max_tokens: 12,
        ..config
    });
    let run = generate(&mut r, Prompt::Ids(prompt_ids(20, 0))).unwrap();
    assert_eq!(run.ids.len(), 12);
    // A continuation counts the cached tokens too.
    let err = continue_with(&mut r, Prompt::Ids(vec![7])).unwrap_err();
    assert!(err.to_string().contains("31 cached"), "{err}");
}

#[test]
fn token_id_outside_the_vocabulary_is_an_error() {
    let mut r = runner(greedy(4, 32));
    let bad = n_vocab() as u32;
    match generate(&mut r, Prompt::Ids(vec![5, bad, 6])) {
        Err(RunError::TokenOutOfRange { id, n_vocab: n }) => {
            assert_eq!(id, bad);
            assert_eq!(n, n_vocab());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.cached_len(), 0, "nothing was run");
}

#[test]
fn text_prompt_without_tokenizer_is_an_error() {
    let (model, _) = load(TinyOptions::default());
    let mut r = Runner::new(model, None, greedy(3, 32)).unwrap();
    assert!(matches!(
        generate(&mut r, Prompt::Text("the".into())),
        Err(RunError::NoTokenizer)
    ));
    // Ids still work; there is no text.
    let run = generate(&mut r, Prompt::Ids(prompt_ids(4, 0))).unwrap();
    assert_eq!(run.ids.len(), 3);
    assert_eq!(run.text(), "");
}

#[test]
fn non_finite_logits_are_a_typed_error() {
    let (model, tok) = load(TinyOptions {
        nan_output_row: Some(9),
        ..TinyOptions::default()
    });
    let mut r = Runner::new(model, Some(tok), greedy(3, 32)).unwrap();
    match generate(&mut r, Prompt::Ids(prompt_ids(4, 0))) {
        Err(RunError::NonFiniteLogits { token, value, .. }) => {
            assert_eq!(token, 9);
            assert!(value.is_nan());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_settings_are_rejected_up_front() {
    let (model, tok) = load(TinyOptions::default());
    let new = |config: RunConfig| Runner::new(Arc::clone(&model), Some(Arc::clone(&tok)), config);
    assert!(matches!(
        new(RunConfig {
            prefill_chunk: 0,
            ..RunConfig::default()
        }),
        Err(RunError::InvalidConfig(_))
    ));
    assert!(matches!(
        new(RunConfig {
            stop_strings: vec![String::new()],
            ..RunConfig::default()
        }),
        Err(RunError::InvalidConfig(_))
    ));
    assert!(matches!(
        new(RunConfig {
            max_bytes: Some(0),
            ..RunConfig::default()
        }),
        Err(RunError::InvalidConfig(_))
    ));
    let err = new(RunConfig {
        sampler: SamplerConfig {
            temperature: -1.0,
            ..SamplerConfig::default()
        },
        ..RunConfig::default()
    })
    .err()
    .expect("negative temperature");
    assert!(err.to_string().contains("temperature"), "{err}");
}

#[test]
fn generated_control_tokens_have_no_text() {
    // Find a prompt after which greedy decoding produces BOS (a control token).
    let found = (0..40).find_map(|salt| {
        let mut r = runner(greedy(24, 32));
        let run = generate(&mut r, Prompt::Ids(prompt_ids(6, 200 + salt))).unwrap();
        run.ids.iter().position(|&id| id == BOS).map(|k| (run, k))
    });
    let (run, k) = found.expect("some prompt makes the tiny model generate BOS");
    assert_eq!(run.texts[k], "", "BOS renders as nothing");
    assert!(!run.text().contains("<s>"));
    assert_eq!(
        run.completion.tokens[k], BOS,
        "but it is still a generated token"
    );
}

#[test]
fn a_mixture_of_experts_prefills_in_chunks_twice_as_long() {
    let (model, _) = load(TinyOptions::default());
    let mut config = model.config().clone();
    assert_eq!(config.moe, None);
    assert_eq!(RunConfig::default_prefill_chunk(&config), 256);
    config.moe = Some(nx_llama_stack::MoeConfig {
        n_expert: 64,
        n_expert_used: 8,
        n_ff_exp: 1024,
        norm_weights: true,
    });
    assert_eq!(RunConfig::default_prefill_chunk(&config), 512);
}
