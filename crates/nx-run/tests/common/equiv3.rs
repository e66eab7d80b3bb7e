//! EQUIV-3's scenarios: every request served by the `Engine` gives the ids, log-probs and
//! alternatives of plain decoding bit for bit, whatever runs beside it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;

use nx_gguf::Gguf;
use nx_llama_stack::ForwardState;
use nx_run::{
    Engine, EngineConfig, EngineEvent, JsonObject, JsonVocab, KvDtype, Model, Request, Sampler,
    SamplerConfig, SeqId, Tokenizer,
};
use nx_sampler::{log_prob, log_softmax_top};

/// `$NX_CACHE`, or `~/.cache/nx`.
pub fn cache_dir() -> std::path::PathBuf {
    match std::env::var_os("NX_CACHE") {
        Some(p) if !p.is_empty() => std::path::PathBuf::from(p),
        _ => std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME or NX_CACHE"))
            .join(".cache/nx"),
    }
}

/// A fetched or synthesized model with its tokenizer, on `threads` threads.
pub fn open(path: std::path::PathBuf, threads: usize) -> (Arc<Model>, Option<Arc<Tokenizer>>) {
    let gguf = Gguf::open(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run `cargo xtask fetch` and `cargo xtask synth`)",
            path.display()
        )
    });
    let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    let mut model = Model::from_gguf(gguf).expect("model");
    model.set_threads(threads);
    (Arc::new(model), Some(Arc::new(tok)))
}

/// What one request produced, as raw bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub ids: Vec<u32>,
    pub logprob_bits: Vec<u32>,
    pub top_bits: Vec<Vec<(u32, u32)>>,
}

/// A greedy or a sampled request over `prompt`.
pub fn request(prompt: Vec<u32>, max_tokens: usize, sampled: bool, seed: u64) -> Request {
    let sampler = if sampled {
        SamplerConfig {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.02,
            repeat_penalty: 1.1,
            presence_penalty: 0.1,
            penalty_last_n: 64,
            seed,
            ..SamplerConfig::default()
        }
    } else {
        SamplerConfig::greedy()
    };
    Request {
        prompt,
        max_tokens,
        sampler,
        logprobs: 2,
        ..Request::default()
    }
}

/// The answer of plain decoding, written out here independently of the engine: one
/// contiguous `KvCache`, the prompt in one forward pass, then one token per pass, the
/// sampler drawing at each token's position.
pub fn reference(model: &Arc<Model>, tok: &Option<Arc<Tokenizer>>, req: &Request) -> Answer {
    let mut cache = model
        .new_cache(req.prompt.len() + req.max_tokens + 1, KvDtype::F16)
        .unwrap();
    let mut state = ForwardState::default();
    let mut logits = Vec::new();
    let mut sampler = Sampler::new(req.sampler.clone()).unwrap();
    sampler.accept_all(&req.prompt);
    let mut answer = empty();
    let last = [req.prompt.len() - 1];
    model
        .forward(&req.prompt, 0, &mut cache, &last, &mut state, &mut logits)
        .unwrap();
    let mut position = req.prompt.len();
    let mut json = req.json_object.then(JsonObject::new);
    let vocab = tok
        .as_ref()
        .filter(|_| req.json_object)
        .map(|t| JsonVocab::new(t));
    while answer.ids.len() < req.max_tokens {
        let top = log_softmax_top(&logits, req.logprobs);
        let mut buf = logits.clone();
        if let (Some(json), Some(tok), Some(vocab)) = (&json, tok, &vocab) {
            json.mask(vocab, tok, &mut buf);
        }
        let id = sampler.sample_at(&mut buf, position as u64).unwrap();
        if let (Some(json), Some(tok)) = (&mut json, tok) {
            json.accept(tok, id);
        }
        sampler.accept(id);
        if tok.as_ref().is_some_and(|t| t.is_eog(id)) {
            break;
        }
        // The engine reports NaN when log-probabilities are off.
        let logprob = if req.token_logprobs || req.logprobs > 0 {
            log_prob(&logits, id).unwrap()
        } else {
            f32::NAN
        };
        push(&mut answer, id, "", logprob, &top);
        model
            .forward(&[id], position, &mut cache, &[0], &mut state, &mut logits)
            .unwrap();
        position += 1;
    }
    answer
}

fn empty() -> Answer {
    Answer {
        ids: Vec::new(),
        logprob_bits: Vec::new(),
        top_bits: Vec::new(),
    }
}

fn push(a: &mut Answer, id: u32, _text: &str, logprob: f32, top: &[(u32, f32)]) {
    a.ids.push(id);
    a.logprob_bits.push(logprob.to_bits());
    a.top_bits
        .push(top.iter().map(|&(t, l)| (t, l.to_bits())).collect());
}

/// When each request joins: before step `join_at[i]`.
pub struct Schedule {
    pub join_at: Vec<usize>,
}

/// Serves `reqs` on `engine` (request `i` submitted before step `join_at[i]`); the
/// answers in request order.
pub fn serve(engine: &mut Engine, reqs: &[Request], schedule: &Schedule) -> Vec<Answer> {
    let mut ids: Vec<Option<SeqId>> = vec![None; reqs.len()];
    let mut answers: HashMap<SeqId, Answer> = HashMap::new();
    let mut done = 0;
    let mut step = 0;
    while done < reqs.len() {
        for (i, r) in reqs.iter().enumerate() {
            if ids[i].is_none() && schedule.join_at[i] <= step {
                let id = engine.submit(r.clone()).expect("submit");
                ids[i] = Some(id);
                answers.insert(id, empty());
            }
        }
        for e in engine.step().expect("step") {
            match e {
                EngineEvent::Token {
                    seq,
                    id,
                    text,
                    logprob,
                    top,
                } => push(answers.get_mut(&seq).unwrap(), id, &text, logprob, &top),
                EngineEvent::Done { .. } => done += 1,
                EngineEvent::PromptScores { .. } => panic!("no request asked for scores"),
                EngineEvent::Failed { seq, error } => panic!("sequence {seq} failed: {error}"),
            }
        }
        step += 1;
        assert!(step < 100_000, "the engine does not finish");
    }
    assert!(!engine.has_work());
    let m = engine.metrics();
    assert_eq!(
        m.kv_blocks_used, 0,
        "blocks still referenced after all finished"
    );
    ids.iter()
        .map(|id| answers.remove(&id.unwrap()).unwrap())
        .collect()
}

/// Prompts of different lengths over `n_vocab`, the even ones sharing a 40-token prefix.
pub fn prompts(n: usize, n_vocab: usize, first_id: u32, seed: u32) -> Vec<Vec<u32>> {
    let span = n_vocab as u32 - first_id;
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        first_id + state % span
    };
    let shared: Vec<u32> = (0..40).map(|_| next()).collect();
    (0..n)
        .map(|i| {
            let len = 3 + (i * 37) % 90;
            let mut p = if i % 2 == 0 {
                shared.clone()
            } else {
                Vec::new()
            };
            p.extend((0..len).map(|_| next()));
            p
        })
        .collect()
}

/// The engine settings of a scenario.
pub fn engine_config(n_ctx: usize, kv_memory_bytes: u64) -> EngineConfig {
    EngineConfig {
        n_ctx,
        kv_memory_bytes,
        max_running: 16,
        ..EngineConfig::default()
    }
}

/// Runs every scenario for `reqs` on `model` and checks each answer against the
/// reference; returns how many (scenario, request) pairs were compared.
pub fn check_all_scenarios(
    model: &Arc<Model>,
    tok: &Option<Arc<Tokenizer>>,
    reqs: &[Request],
) -> usize {
    let expected: Vec<Answer> = reqs.iter().map(|r| reference(model, tok, r)).collect();
    let n_ctx = reqs
        .iter()
        .map(|r| r.prompt.len() + r.max_tokens)
        .max()
        .unwrap()
        + 1;
    let bytes_per_position = {
        let c = model.config();
        (c.k_dim() + c.v_dim()) as u64 * 2 * c.n_layers as u64
    };
    let total_positions: u64 = reqs
        .iter()
        .map(|r| (r.prompt.len() + r.max_tokens + 32) as u64)
        .sum();
    let roomy = total_positions * bytes_per_position * 2;
    let tight = (n_ctx as u64 + 32) * bytes_per_position;
    let mut compared = 0;
    let mut compare = |what: &str, got: Vec<Answer>| {
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, e, "{what}: request {i} differs from plain decoding");
        }
        compared += got.len();
    };

    // Alone, one engine per request.
    let alone: Vec<Answer> = reqs
        .iter()
        .map(|r| {
            let mut e =
                Engine::new(model.clone(), tok.clone(), engine_config(n_ctx, roomy)).unwrap();
            serve(
                &mut e,
                std::slice::from_ref(r),
                &Schedule { join_at: vec![0] },
            )
            .remove(0)
        })
        .collect();
    compare("alone", alone);

    // All at once, then again on the same engine (prefixes now from the cache).
    let mut e = Engine::new(model.clone(), tok.clone(), engine_config(n_ctx, roomy)).unwrap();
    let together = Schedule {
        join_at: vec![0; reqs.len()],
    };
    compare("batched together", serve(&mut e, reqs, &together));
    let hits_before = e.metrics().prefix_hit_tokens_total;
    compare("prefix from the cache", serve(&mut e, reqs, &together));
    assert!(
        e.metrics().prefix_hit_tokens_total > hits_before,
        "the second pass found no cached prefix"
    );

    // Joining while others decode, with small steps and chunks, prefix cache off.
    let staggered = Schedule {
        join_at: (0..reqs.len()).map(|i| (i * 3) % 11).collect(),
    };
    let mut cfg = engine_config(n_ctx, roomy);
    cfg.step_tokens = 19;
    cfg.prefill_chunk = 7;
    cfg.prefix_cache = false;
    let mut e = Engine::new(model.clone(), tok.clone(), cfg).unwrap();
    compare(
        "joining while others decode",
        serve(&mut e, reqs, &staggered),
    );

    // A pool too small for all of them: preemption and recomputation.
    let mut cfg = engine_config(n_ctx, tight);
    cfg.block_size = 16;
    let mut e = Engine::new(model.clone(), tok.clone(), cfg).unwrap();
    compare("under preemption", serve(&mut e, reqs, &together));
    if reqs.len() > 2 {
        assert!(
            e.metrics().preemptions_total > 0,
            "the tight pool preempted nothing"
        );
    }
    compared
}

/// EQUIV-4: the same requests with speculation (prompt lookup, and the draft model when
/// given) for draft lengths 1 to 8 and two prefill chunkings, batched together, give
/// the plain-decoding answers bit for bit. Returns (drafted, accepted) over all runs.
pub fn check_speculation(
    model: &Arc<Model>,
    draft: Option<&Arc<Model>>,
    tok: &Option<Arc<Tokenizer>>,
    reqs: &[Request],
) -> (u64, u64) {
    use nx_run::{DraftSource, Speculation};
    let expected: Vec<Answer> = reqs.iter().map(|r| reference(model, tok, r)).collect();
    let n_ctx = reqs
        .iter()
        .map(|r| r.prompt.len() + r.max_tokens)
        .max()
        .unwrap()
        + 1;
    let mut sources = vec![DraftSource::Ngram];
    if draft.is_some() {
        sources.push(DraftSource::Model);
    }
    let (mut drafted, mut accepted) = (0, 0);
    for source in sources {
        for (draft_max, prefill_chunk) in [(1, 256), (2, 7), (3, 256), (5, 16), (8, 256), (8, 5)] {
            let spec_reqs: Vec<Request> = reqs
                .iter()
                .map(|r| Request {
                    speculation: Some(Speculation { source, draft_max }),
                    ..r.clone()
                })
                .collect();
            let mut cfg = engine_config(n_ctx, 64 << 20);
            cfg.prefill_chunk = prefill_chunk;
            // Draft lengths from the acceptance rate alone, not from timings.
            cfg.weigh_draft_cost = false;
            let mut e = Engine::new(model.clone(), tok.clone(), cfg).unwrap();
            if let Some(d) = draft {
                e = e.with_draft_model(d.clone()).unwrap();
            }
            let got = serve(
                &mut e,
                &spec_reqs,
                &Schedule {
                    join_at: (0..reqs.len()).map(|i| i % 3).collect(),
                },
            );
            for (i, (g, x)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(
                    g,
                    x,
                    "{} drafts, draft_max {draft_max}, chunk {prefill_chunk}: request {i} \
                     differs from plain decoding",
                    source.name()
                );
            }
            let m = e.metrics();
            drafted += m.drafted_tokens_total;
            accepted += m.accepted_tokens_total;
        }
    }
    (drafted, accepted)
}
