//! EQUIV-3: every request the engine serves gets the token ids, log-probs and
//! alternatives of plain decoding (one contiguous cache, one token per pass) bit for bit, whatever runs
//! beside it: alone; batched with up to 15 others of different lengths; joining while
//! others decode; after preemption and recomputation; with its prefix from the cache
//! and computed fresh; on 1 and 2 threads; greedy and sampled. The gate runs it on the
//! avx512, avx2 and scalar tiers (`NX_TIER`), over the synthetic fixtures and the
//! default model.

#[path = "common/equiv3.rs"]
mod equiv3;

use equiv3::{cache_dir, check_all_scenarios, open, request};
use nx_run::{Request, SamplerConfig};

fn requests(n: usize, n_vocab: usize, max_tokens: usize, salt: u32) -> Vec<Request> {
    // Ids from 300 on: ordinary tokens in every fixture vocabulary.
    equiv3::prompts(n, n_vocab, 300, salt)
        .into_iter()
        .enumerate()
        .map(|(i, p)| request(p, max_tokens, i % 2 == 1, 1000 + i as u64))
        .collect()
}

/// Requests without log-probabilities or penalties, greedy and (every other one) top-k
/// sampled: their tokens depend only on each row's few largest logits, so batched
/// steps with enough of them bound the LM head's rows instead of computing every logit
/// (`HeadChoice`); the answers must not change.
fn top_rows_requests(n: usize, n_vocab: usize, max_tokens: usize, salt: u32) -> Vec<Request> {
    equiv3::prompts(n, n_vocab, 300, salt)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let sampler = if i % 2 == 1 {
                SamplerConfig {
                    temperature: 0.9,
                    top_k: [40, 5][i / 2 % 2],
                    top_p: 0.95,
                    min_p: 0.02,
                    seed: 500 + i as u64,
                    ..SamplerConfig::default()
                }
            } else {
                SamplerConfig::greedy()
            };
            Request {
                logprobs: 0,
                token_logprobs: false,
                sampler,
                ..request(p, max_tokens, false, 0)
            }
        })
        .collect()
}

/// The tier the gate runs on (`NX_TIER`); the default is the machine's best.
fn tier() -> String {
    std::env::var("NX_TIER").unwrap_or_default()
}

/// Thread counts and (requests, tokens each) for `tier`: everything on the default tier,
/// less on the lower ones, whose kernels are slower but must give the same bits (the
/// scalar tier runs the portable kernels only).
fn sizes(tier: &str, fixture: (usize, usize)) -> (&'static [usize], usize, usize) {
    match tier {
        "scalar" => (&[2], fixture.0.min(4), fixture.1.min(4)),
        "avx2" => (&[1, 2], fixture.0.min(8), fixture.1.min(8)),
        _ => (&[1, 2], fixture.0, fixture.1),
    }
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn equiv3_synthetic_fixtures() {
    for fixture in ["qwen2-tiny", "llama-tiny", "qwen3-tiny"] {
        let (threads_list, n, max_tokens) = sizes(&tier(), (16, 12));
        for &threads in threads_list {
            let (model, tok) = open(
                cache_dir().join("synth").join(format!("{fixture}.gguf")),
                threads,
            );
            let n_vocab = model.config().n_vocab;
            let reqs = requests(n, n_vocab, max_tokens, threads as u32);
            let compared = check_all_scenarios(&model, &tok, &reqs);
            eprintln!("EQUIV-3 {fixture}, {threads} threads: {compared} answers identical");
        }
    }
}

/// JSON mode (greedy and sampled, beside requests without it) on a byte-level BPE fixture
/// and the default model: the engine's answers are plain decoding's with the same mask in
/// every scenario, and every answer is a prefix of one JSON object (a whole one where
/// it ended by end-of-generation).
#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn equiv3_json_mode() {
    let (threads_list, n, max_tokens) = sizes(&tier(), (6, 12));
    let fixtures = [
        cache_dir().join("synth/qwen2-tiny.gguf"),
        cache_dir().join("models/gemma-3-270m-q4_k_m.gguf"),
    ];
    for path in fixtures {
        let (model, tok) = open(path.clone(), *threads_list.last().unwrap());
        let n_vocab = model.config().n_vocab;
        let reqs: Vec<Request> = requests(n, n_vocab, max_tokens, 77)
            .into_iter()
            .enumerate()
            .map(|(i, mut r)| {
                r.json_object = i % 3 != 2;
                r.logprobs = if i < n / 2 { 0 } else { 2 };
                r.token_logprobs = r.logprobs > 0;
                r
            })
            .collect();
        let compared = check_all_scenarios(&model, &tok, &reqs);
        let t = tok.as_ref().expect("a tokenizer");
        let vocab = nx_run::JsonVocab::new(t);
        for (k, r) in reqs.iter().filter(|r| r.json_object).enumerate() {
            let answer = equiv3::reference(&model, &tok, r);
            if k == 0 {
                mask_equals_allows(&vocab, t, &answer.ids, model.config().n_vocab);
            }
            let text = t.decode(&answer.ids).unwrap();
            let shown = String::from_utf8_lossy(&text);
            let mut json = nx_run::JsonObject::new();
            assert!(json.feed(&text), "{}: {shown:?}", path.display());
            let first = text.trim_ascii_start().first();
            assert!(first.is_none_or(|&b| b == b'{'), "{shown:?}");
            if answer.ids.len() < r.max_tokens {
                assert!(json.is_complete(), "{shown:?}");
            }
        }
        eprintln!(
            "EQUIV-3 JSON mode, {}: {compared} answers identical",
            path.display()
        );
    }
}

/// At every state along `ids`, the mask (which feeds only the tokens that can fit)
/// refuses exactly the tokens `JsonObject::allows` refuses, one by one.
fn mask_equals_allows(vocab: &nx_run::JsonVocab, t: &nx_run::Tokenizer, ids: &[u32], n: usize) {
    let mut state = nx_run::JsonObject::new();
    for &id in ids {
        let mut row = vec![0.0f32; n];
        state.mask(vocab, t, &mut row);
        for (other, &logit) in row.iter().enumerate() {
            let allowed = state.allows(t, other as u32);
            assert_eq!(logit == 0.0, allowed, "token {other} at state {state:?}");
        }
        state.accept(t, id);
    }
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn equiv3_default_model() {
    // The portable kernels are slow on a 253 MB model: fewer, shorter requests there.
    let (threads_list, n, max_tokens) = sizes(&tier(), (8, 8));
    let (n, max_tokens) = if tier() == "scalar" {
        (2, 3)
    } else {
        (n, max_tokens)
    };
    for &threads in threads_list {
        let (model, tok) = open(cache_dir().join("models/gemma-3-270m-q4_k_m.gguf"), threads);
        let n_vocab = model.config().n_vocab;
        let reqs = requests(n, n_vocab, max_tokens, 40 + threads as u32);
        let compared = check_all_scenarios(&model, &tok, &reqs);
        eprintln!("EQUIV-3 default model, {threads} threads: {compared} answers identical");
    }
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn equiv3_top_rows() {
    // qwen2-tiny's and the default model's LM heads are Q8_0, which has the bound
    // kernel (on the avx512 tier; the other tiers compute every logit).
    let models = [
        ("synth/qwen2-tiny.gguf", (12, 10)),
        ("models/gemma-3-270m-q4_k_m.gguf", (8, 6)),
    ];
    for (path, sizes_here) in models {
        let (threads_list, n, max_tokens) = sizes(&tier(), sizes_here);
        let (n, max_tokens) = if tier() == "scalar" && path.starts_with("models") {
            (2, 3)
        } else {
            (n, max_tokens)
        };
        for &threads in threads_list {
            let (model, tok) = open(cache_dir().join(path), threads);
            let n_vocab = model.config().n_vocab;
            let reqs = top_rows_requests(n, n_vocab, max_tokens, 70 + threads as u32);
            let compared = check_all_scenarios(&model, &tok, &reqs);
            eprintln!("EQUIV-3 top rows, {path}, {threads} threads: {compared} answers identical");
        }
    }
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn an_engine_that_can_fill_the_bounded_head_prepares_it_up_front() {
    // qwen2-tiny's LM head is Q8_0, which has the bound kernel on the avx512 tier and, where
    // the CPU has AVX-VNNI, on the avx2 tier.
    let (model, tok) = open(cache_dir().join("synth/qwen2-tiny.gguf"), 1);
    let config = |max_running| nx_run::EngineConfig {
        max_running,
        ..nx_run::EngineConfig::default()
    };
    // The head pays from this many top rows per step on this tier (three on AVX-512, two
    // on AVX2).
    let min = nx_lazy_weight::min_bounded_tokens();
    nx_run::Engine::new(model.clone(), tok.clone(), config(min - 1)).expect("engine");
    assert!(
        !model.bounded_head_ready(),
        "{} sequences never make a step of {min} top rows",
        min - 1
    );
    nx_run::Engine::new(model.clone(), tok, config(min)).expect("engine");
    let has_kernel = match nx_lazy_weight::active_tier().expect("tier") {
        nx_lazy_weight::CpuTier::Avx512Vnni => true,
        #[cfg(target_arch = "x86_64")]
        nx_lazy_weight::CpuTier::Avx2 => std::arch::is_x86_feature_detected!("avxvnni"),
        _ => false,
    };
    assert_eq!(model.bounded_head_ready(), has_kernel, "{min} sequences");
}
