//! `nx_run::perplexity` on the tiny random-weight model: agreement with a brute-force
//! recomputation, BOS handling, chunking and thread invariance, and the typed errors.

use std::sync::Arc;

#[path = "common/tiny_model.rs"]
mod tiny_model;

use nx_bpe::Tokenizer;
use nx_gguf::Gguf;
use nx_llama_stack::{ForwardState, KvDtype, Model};
use nx_run::perplexity::{perplexity_of_tokens, token_nll, tokenize_text};
use nx_run::{perplexity, PerplexityConfig, PerplexityError, PerplexityReport};
use tiny_model::{TinyOptions, BOS};

fn load(opts: TinyOptions) -> (Arc<Model>, Tokenizer) {
    let gguf = Gguf::from_bytes(tiny_model::tiny_gguf(opts)).expect("tiny GGUF parses");
    let tokenizer = Tokenizer::from_gguf(&gguf).expect("tiny tokenizer");
    (
        Arc::new(Model::from_gguf(gguf).expect("tiny model")),
        tokenizer,
    )
}

/// A text of a few hundred tokens in the tiny vocabulary.
fn text() -> String {
    let words = [
        "the cat sat on the mat",
        "and then it ran far away",
        "the dog was good",
        "blue sky and sun",
        "moon and star",
        "it was a good day.",
    ];
    let mut s = String::new();
    for i in 0..40 {
        s.push_str(words[(i * 7 + 3) % words.len()]);
        s.push_str(if i % 5 == 4 { "\n" } else { " " });
    }
    s
}

fn config(n_ctx: usize, batch: usize) -> PerplexityConfig {
    PerplexityConfig {
        n_ctx,
        batch,
        max_chunks: None,
        kv_dtype: KvDtype::F32,
    }
}

fn run(
    model: &Arc<Model>,
    tok: &Tokenizer,
    text: &[u8],
    cfg: &PerplexityConfig,
) -> PerplexityReport {
    perplexity(model, tok, text, cfg, |_| {}).expect("perplexity")
}

/// The same quantity computed the slow way: every scored position gets its own forward
/// pass from an empty cache over the window's prefix, and the log-softmax is a plain
/// `ln(exp(l_t) / Σ exp(l))` with no max shift.
fn brute_force(model: &Model, tokens: &[u32], bos: Option<u32>, n_ctx: usize) -> (f64, Vec<f64>) {
    let n_chunks = tokens.len() / n_ctx;
    let first = n_ctx / 2;
    let mut nlls = Vec::new();
    let mut running = Vec::new();
    let mut state = ForwardState::default();
    let mut logits = Vec::new();
    for c in 0..n_chunks {
        let mut window = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        for i in first..n_ctx - 1 {
            let mut cache = model.new_cache(n_ctx, KvDtype::F32).unwrap();
            model
                .forward(&window[..=i], 0, &mut cache, &[i], &mut state, &mut logits)
                .unwrap();
            let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
            let p = (logits[window[i + 1] as usize] as f64).exp() / z;
            nlls.push(-p.ln());
        }
        running.push((nlls.iter().sum::<f64>() / nlls.len() as f64).exp());
    }
    (*running.last().unwrap(), running)
}

#[test]
fn matches_a_brute_force_recomputation() {
    let (model, tok) = load(TinyOptions::default());
    let text = text();
    let tokens = tokenize_text(&tok, text.as_bytes()).unwrap();
    assert_eq!(tokens[0], BOS);
    let n_ctx = 24;
    assert!(tokens.len() >= 4 * n_ctx, "{} tokens", tokens.len());
    let report = run(&model, &tok, text.as_bytes(), &config(n_ctx, 512));
    let (ppl, running) = brute_force(&model, &tokens, Some(BOS), n_ctx);
    assert_eq!(report.n_chunks, tokens.len() / n_ctx);
    assert_eq!(report.count, report.n_chunks * (n_ctx - n_ctx / 2 - 1));
    assert_eq!(report.running_ppl.len(), running.len());
    for (k, (a, b)) in report.running_ppl.iter().zip(&running).enumerate() {
        assert!((a - b).abs() <= 1e-9 * b, "window {k}: {a} vs {b}");
    }
    assert!(
        (report.ppl - ppl).abs() <= 1e-9 * ppl,
        "{} vs {ppl}",
        report.ppl
    );
    assert_eq!(*report.running_ppl.last().unwrap(), report.ppl);
    // A random-weight model is much worse than perfect and not absurdly bad.
    let n_vocab = tiny_model::n_vocab() as f64;
    assert!(
        report.ppl > 1.5 && report.ppl < 20.0 * n_vocab,
        "{}",
        report.ppl
    );
    assert!(report.ppl_error.unwrap() > 0.0);
}

#[test]
fn every_window_starts_with_bos_when_the_vocab_adds_it() {
    let (model, tok) = load(TinyOptions::default());
    let tokens = tokenize_text(&tok, text().as_bytes()).unwrap();
    let n_ctx = 16;
    let cfg = config(n_ctx, 512);
    let base = perplexity_of_tokens(&model, &tokens, Some(BOS), &cfg, |_| {}).unwrap();
    // Overwriting the first token of every window changes nothing: it is replaced.
    let mut changed = tokens.clone();
    for c in 0..changed.len() / n_ctx {
        changed[c * n_ctx] = 10;
    }
    let same = perplexity_of_tokens(&model, &changed, Some(BOS), &cfg, |_| {}).unwrap();
    assert_eq!(base.running_ppl, same.running_ppl);
    // Without BOS replacement the first tokens are evaluated as given.
    let raw = perplexity_of_tokens(&model, &changed, None, &cfg, |_| {}).unwrap();
    assert_ne!(base.running_ppl, raw.running_ppl);
    let (brute, _) = brute_force(&model, &changed, None, n_ctx);
    assert!((raw.ppl - brute).abs() <= 1e-9 * brute);
}

#[test]
fn batch_size_and_threads_do_not_change_the_result() {
    let (mut model, tok) = load(TinyOptions::default());
    let text = text();
    let n_ctx = 20;
    let reference = run(&model, &tok, text.as_bytes(), &config(n_ctx, 512));
    for batch in [1, 3, 7, 10, 11, 19, 20] {
        let r = run(&model, &tok, text.as_bytes(), &config(n_ctx, batch));
        assert_eq!(r.running_ppl, reference.running_ppl, "batch {batch}");
        assert_eq!(r.ppl_error, reference.ppl_error, "batch {batch}");
    }
    for threads in [1, 2, 3] {
        let mut m = Arc::try_unwrap(model).ok().expect("sole owner");
        m.set_threads(threads);
        model = Arc::new(m);
        let r = run(&model, &tok, text.as_bytes(), &config(n_ctx, 7));
        assert_eq!(r.running_ppl, reference.running_ppl, "{threads} threads");
    }
}

#[test]
fn max_chunks_scores_a_prefix_of_the_windows() {
    let (model, tok) = load(TinyOptions::default());
    let text = text();
    let all = run(&model, &tok, text.as_bytes(), &config(16, 512));
    assert!(all.n_chunks > 3);
    let mut progress = Vec::new();
    let two = perplexity(
        &model,
        &tok,
        text.as_bytes(),
        &PerplexityConfig {
            max_chunks: Some(2),
            ..config(16, 512)
        },
        |p| progress.push((p.chunk, p.n_chunks, p.running_ppl)),
    )
    .unwrap();
    assert_eq!(two.n_chunks, 2);
    assert_eq!(two.running_ppl, all.running_ppl[..2]);
    assert_eq!(
        progress,
        vec![(0, 2, all.running_ppl[0]), (1, 2, all.running_ppl[1])]
    );
    // More chunks than the text has: all of them.
    let many = PerplexityConfig {
        max_chunks: Some(10_000),
        ..config(16, 512)
    };
    assert_eq!(
        run(&model, &tok, text.as_bytes(), &many).running_ppl,
        all.running_ppl
    );
}

#[test]
fn one_trailing_newline_is_dropped_like_llama_cpp() {
    let (_, tok) = load(TinyOptions::default());
    let a = tokenize_text(&tok, b"the cat sat").unwrap();
    let b = tokenize_text(&tok, b"the cat sat\n").unwrap();
    let c = tokenize_text(&tok, b"the cat sat\n\n").unwrap();
    assert_eq!(a, b);
    assert_eq!(c.len(), a.len() + 1);
}

#[test]
fn typed_errors_for_bad_input() {
    let (model, tok) = load(TinyOptions::default());
    let cfg = config(16, 512);
    for empty in [&b""[..], b"\n"] {
        let err = perplexity(&model, &tok, empty, &cfg, |_| {}).unwrap_err();
        assert!(matches!(err, PerplexityError::EmptyText), "{err}");
    }
    let err = perplexity(&model, &tok, b"the cat sat on the mat", &cfg, |_| {}).unwrap_err();
    match &err {
        PerplexityError::TooFewTokens {
            n_tokens,
            needed: 32,
            n_ctx: 16,
        } => assert!(*n_tokens < 32),
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("at least 32 tokens"), "{err}");

    let tokens = tokenize_text(&tok, text().as_bytes()).unwrap();
    let mut bad = tokens.clone();
    bad[40] = 100_000;
    let err = perplexity_of_tokens(&model, &bad, Some(BOS), &cfg, |_| {}).unwrap_err();
    assert!(matches!(
        err,
        PerplexityError::TokenOutOfRange { id: 100_000, .. }
    ));

    let bad_cfg = PerplexityConfig { n_ctx: 2, ..cfg };
    let err = perplexity(&model, &tok, text().as_bytes(), &bad_cfg, |_| {}).unwrap_err();
    assert!(matches!(err, PerplexityError::InvalidConfig(_)));
}

#[test]
fn a_nan_logit_is_an_error_not_a_number() {
    let (model, tok) = load(TinyOptions {
        nan_output_row: Some(12),
        ..TinyOptions::default()
    });
    let err = perplexity(&model, &tok, text().as_bytes(), &config(16, 512), |_| {}).unwrap_err();
    assert!(
        matches!(
            err,
            PerplexityError::NonFiniteLogits {
                chunk: 0,
                position: 8,
                token: 12,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn token_nll_agrees_with_the_brute_force_formula() {
    let logits: Vec<f32> = (0..50)
        .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.7)
        .collect();
    let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
    for t in [0u32, 7, 49] {
        let want = -((logits[t as usize] as f64).exp() / z).ln();
        assert!((token_nll(&logits, t) - want).abs() < 1e-12);
    }
}
