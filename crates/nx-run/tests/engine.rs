//! The engine on the tiny model: every scenario of EQUIV-3 (alone, batched, joining,
//! prefix cache, preemption), cancellation, and the errors `submit` gives.

mod common;
#[path = "common/equiv3.rs"]
mod equiv3;

use std::sync::Arc;

use common::{load, prompt_ids, TinyOptions};
use equiv3::{check_all_scenarios, engine_config, request, serve, Schedule};
use nx_run::{Engine, EngineConfig, EngineEvent, Request, RunError};

#[test]
fn engine_answers_equal_plain_decoding_in_every_scenario() {
    let (model, tok) = load(TinyOptions::default());
    let tok = Some(tok);
    let n_vocab = model.config().n_vocab;
    let reqs: Vec<Request> = equiv3::prompts(10, n_vocab, 6, 7)
        .into_iter()
        .enumerate()
        .map(|(i, p)| request(p, 10, i % 3 != 0, 100 + i as u64))
        .collect();
    let compared = check_all_scenarios(&model, &tok, &reqs);
    assert_eq!(compared, 5 * reqs.len());
}

/// Requests with a logit bias (which need every logit of a row) batched with greedy ones
/// without (whose rows the LM head may bound): every scenario still gives plain
/// decoding's bits, and the bias changes the answer it should.
#[test]
fn logit_bias_requests_equal_plain_decoding_beside_unbiased_ones() {
    let (model, tok) = load(TinyOptions::default());
    let tok = Some(tok);
    let n_vocab = model.config().n_vocab;
    let prompts = equiv3::prompts(6, n_vocab, 6, 11);
    let plain = equiv3::reference(&model, &tok, &request(prompts[0].clone(), 6, false, 0));
    let banned = plain.ids[0];
    let reqs: Vec<Request> = prompts
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = request(p, 6, i % 3 == 2, 200 + i as u64);
            // Without log-probabilities a row may be bounded rather than computed.
            r.logprobs = if i < 4 { 0 } else { 2 };
            if i % 2 == 0 {
                r.sampler.logit_bias = vec![(banned, -100.0), (i as u32 % 7, 3.5)];
            }
            r
        })
        .collect();
    let biased = equiv3::reference(&model, &tok, &reqs[0]);
    assert_ne!(biased.ids[0], banned, "the bias did not ban the token");
    let compared = check_all_scenarios(&model, &tok, &reqs);
    assert_eq!(compared, 5 * reqs.len());
}

/// JSON mode on a vocabulary that cannot write JSON (the tiny model has no `{`): the
/// request fails with an error that says so, and the engine goes on serving the others.
#[test]
fn json_mode_without_a_json_token_fails_cleanly() {
    let mut e = tiny_engine(EngineConfig::default());
    let mut json = request(prompt_ids(6, 1), 40, false, 0);
    json.json_object = true;
    let a = e.submit(json).unwrap();
    let b = e.submit(request(prompt_ids(6, 2), 4, false, 0)).unwrap();
    let (mut failed, mut done) = (None, Vec::new());
    while e.has_work() {
        for ev in e.step().unwrap() {
            match ev {
                EngineEvent::Failed { seq, error } => failed = Some((seq, error.to_string())),
                EngineEvent::Done { seq, .. } => done.push(seq),
                _ => {}
            }
        }
    }
    let (seq, error) = failed.expect("the JSON request failed");
    assert_eq!(seq, a);
    assert!(error.contains("JSON mode"), "{error}");
    assert_eq!(done, [b]);
}

#[test]
fn two_threads_give_the_same_answers() {
    let (model, tok) = load(TinyOptions::default());
    let mut one = Arc::try_unwrap(model).ok().expect("sole owner");
    one.set_threads(2);
    let model = Arc::new(one);
    let reqs: Vec<Request> = (0..4)
        .map(|i| request(prompt_ids(20 + 9 * i, i as u32), 8, i % 2 == 1, i as u64))
        .collect();
    check_all_scenarios(&model, &Some(tok), &reqs);
}

fn tiny_engine(config: EngineConfig) -> Engine {
    let (model, tok) = load(TinyOptions::default());
    Engine::new(model, Some(tok), config).expect("engine")
}

#[test]
fn cancel_frees_the_blocks_of_a_running_sequence() {
    let mut e = tiny_engine(EngineConfig::default());
    let a = e.submit(request(prompt_ids(50, 1), 100, false, 0)).unwrap();
    let b = e.submit(request(prompt_ids(30, 2), 5, false, 0)).unwrap();
    e.step().unwrap();
    e.step().unwrap();
    assert_eq!(e.metrics().running, 2);
    assert!(e.metrics().kv_blocks_used > 0);
    assert!(e.cancel(a));
    assert!(!e.cancel(a), "a second cancel finds nothing");
    let mut done = Vec::new();
    while e.has_work() {
        for ev in e.step().unwrap() {
            if let EngineEvent::Done { seq, .. } = ev {
                done.push(seq);
            }
            if let EngineEvent::Token { seq, .. } = ev {
                assert_ne!(seq, a, "a cancelled sequence emitted a token");
            }
        }
    }
    assert_eq!(done, vec![b]);
    assert_eq!(e.metrics().kv_blocks_used, 0);
}

#[test]
fn a_shared_prefix_is_computed_once() {
    let mut e = tiny_engine(EngineConfig::default());
    let system = prompt_ids(64, 5);
    let with = |tail: u32| {
        let mut p = system.clone();
        p.extend(prompt_ids(5, tail));
        request(p, 3, false, 0)
    };
    let first = serve(&mut e, &[with(1)], &Schedule { join_at: vec![0] });
    assert_eq!(e.metrics().prefix_hit_tokens_total, 0);
    let id = e.submit(with(2)).unwrap();
    let mut cached = None;
    while e.has_work() {
        for ev in e.step().unwrap() {
            if let EngineEvent::Done { seq, usage, .. } = ev {
                assert_eq!(seq, id);
                cached = Some(usage.cached_prompt_tokens);
            }
        }
    }
    assert_eq!(
        cached,
        Some(64),
        "the 64-token system prompt is four whole blocks"
    );
    assert_eq!(first.len(), 1);
}

#[test]
fn submit_refuses_bad_requests_and_keeps_nothing() {
    let mut cfg = EngineConfig {
        n_ctx: 64,
        max_queue: 1,
        ..EngineConfig::default()
    };
    cfg.kv_memory_bytes = 1 << 20;
    let mut e = tiny_engine(cfg);
    let n_vocab = e.model().config().n_vocab as u32;
    assert!(matches!(
        e.submit(request(vec![], 4, false, 0)),
        Err(RunError::EmptyPrompt)
    ));
    assert!(matches!(
        e.submit(request(vec![n_vocab], 4, false, 0)),
        Err(RunError::TokenOutOfRange { .. })
    ));
    match e.submit(request(prompt_ids(60, 0), 10, false, 0)) {
        Err(RunError::ContextOverflow {
            prompt_tokens: 60,
            max_tokens: 10,
            n_ctx: 64,
            ..
        }) => {}
        other => panic!("expected a context overflow, got {other:?}"),
    }
    let mut bad = request(prompt_ids(4, 0), 4, true, 0);
    bad.sampler.top_p = 2.0;
    assert!(e.submit(bad).is_err());
    let mut stop = request(prompt_ids(4, 0), 4, false, 0);
    stop.stop_strings = vec![String::new()];
    assert!(e.submit(stop).is_err());
    let mut bias = request(prompt_ids(4, 0), 4, false, 0);
    bias.sampler.logit_bias = vec![(n_vocab, -100.0)];
    match e.submit(bias) {
        Err(RunError::InvalidConfig(m)) => assert!(m.contains("logit bias"), "{m}"),
        other => panic!("expected a bad logit bias, got {other:?}"),
    }
    assert!(!e.has_work(), "a refused request was queued");
    e.submit(request(prompt_ids(4, 0), 4, false, 0)).unwrap();
    assert!(matches!(
        e.submit(request(prompt_ids(4, 0), 4, false, 0)),
        Err(RunError::QueueFull { max_queue: 1 })
    ));
}

#[test]
fn a_pool_too_small_for_a_request_is_an_error_at_submit() {
    let (model, tok) = load(TinyOptions::default());
    let c = model.config();
    let block_bytes = (c.k_dim() + c.v_dim()) as u64 * 2 * c.n_layers as u64 * 16;
    let cfg = engine_config(256, block_bytes * 2); // two blocks: 32 positions
    let mut e = Engine::new(model, Some(tok), cfg).unwrap();
    assert!(matches!(
        e.submit(request(prompt_ids(30, 0), 8, false, 0)),
        Err(RunError::Cache(_))
    ));
    e.submit(request(prompt_ids(20, 0), 8, false, 0)).unwrap();
}

#[test]
fn speculation_never_changes_the_answer() {
    let (model, tok) = load(TinyOptions::default());
    let tok = Some(tok);
    // Grounded prompts (a passage said twice, so lookup finds it) and random ones.
    let reqs: Vec<Request> = (0..6)
        .map(|i| {
            let mut p = prompt_ids(12 + 5 * i, i as u32);
            if i % 2 == 0 {
                let again = p.clone();
                p.extend(again);
            }
            request(p, 12, i % 3 == 1, 7 + i as u64)
        })
        .collect();
    // The target as its own draft model: the same vocabulary, drafts often right.
    let (drafted, accepted) = equiv3::check_speculation(&model, Some(&model), &tok, &reqs);
    assert!(
        drafted > 0 && accepted > 0,
        "drafted {drafted}, accepted {accepted}"
    );
    assert!(
        accepted < drafted,
        "some drafts must be wrong to test rejection"
    );
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let (model, tok) = load(TinyOptions::default());
    let (other, _) = load(TinyOptions {
        eos_id: 0,
        ..TinyOptions::default()
    });
    let e = Engine::new(model, Some(tok), EngineConfig::default()).unwrap();
    let err = e
        .with_draft_model(other)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("eos_token_id"), "{err}");
}

#[test]
fn the_draft_model_reads_the_prompt_with_the_target() {
    use nx_run::{DraftSource, Speculation};
    let (model, tok) = load(TinyOptions::default());
    let config = EngineConfig {
        prefill_chunk: 16,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(model.clone(), Some(tok), config)
        .expect("engine")
        .with_draft_model(model)
        .expect("same vocabulary");
    let prompt_len = 40;
    let mut req = request(prompt_ids(prompt_len, 3), 6, false, 0);
    req.speculation = Some(Speculation {
        source: DraftSource::Model,
        draft_max: 3,
    });
    e.submit(req).unwrap();
    // Chunks of 16, 16 and 8: the draft reads each in the same step, short of the
    // prompt's last token (its first guessing pass reads that one).
    let mut steps = 0;
    loop {
        let events = e.step().unwrap();
        steps += 1;
        let read = e.metrics().draft_model_tokens_total;
        assert_eq!(
            read,
            (16 * steps).min(prompt_len as u64 - 1),
            "step {steps}"
        );
        if events
            .iter()
            .any(|ev| matches!(ev, EngineEvent::Token { .. }))
        {
            break;
        }
    }
    assert_eq!(
        steps, 3,
        "three prompt chunks, the first token with the last"
    );
    // Then one pass of one token catches up and guesses; later guesses read one each.
    e.step().unwrap();
    assert!(e.metrics().draft_model_tokens_total > prompt_len as u64 - 1);
    while e.has_work() {
        e.step().unwrap();
    }
}

#[test]
fn without_token_logprobs_the_tokens_stay_and_the_logprob_is_nan() {
    let (model, tok) = load(TinyOptions::default());
    let tok = Some(tok);
    let reqs: Vec<Request> = (0..3)
        .map(|i| request(prompt_ids(12 + 5 * i, i as u32), 6, i == 1, 40 + i as u64))
        .collect();
    let quiet: Vec<Request> = reqs
        .iter()
        .map(|r| Request {
            token_logprobs: false,
            logprobs: 0,
            ..r.clone()
        })
        .collect();
    let schedule = Schedule {
        join_at: vec![0; reqs.len()],
    };
    let mut e = Engine::new(model.clone(), tok.clone(), engine_config(256, 1 << 20)).unwrap();
    let with = serve(&mut e, &reqs, &schedule);
    let mut e = Engine::new(model, tok, engine_config(256, 1 << 20)).unwrap();
    let without = serve(&mut e, &quiet, &schedule);
    for (a, b) in with.iter().zip(&without) {
        assert_eq!(a.ids, b.ids, "the answer changed");
        assert!(a
            .logprob_bits
            .iter()
            .all(|&l| f32::from_bits(l).is_finite()));
        assert!(b.logprob_bits.iter().all(|&l| f32::from_bits(l).is_nan()));
    }
}
