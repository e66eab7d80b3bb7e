//! Shared helpers of the forward-pass gates: fixture paths, golden files, the
//! teacher-forced and free-running comparisons against llama.cpp's answers.

#![allow(dead_code)]

use std::path::PathBuf;

use nx_llama_stack::{ForwardState, KvDtype, Model};
use serde_json::Value;

/// Top-2 margin (nats) below which the reference's argmax is not a firm answer.
pub const MARGIN: f64 = 0.05;
/// Largest accepted difference between nx's and llama.cpp's log-probability.
pub const LOGPROB_TOLERANCE: f64 = 0.05;

pub fn cache_dir() -> PathBuf {
    match std::env::var_os("NX_CACHE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME or NX_CACHE")).join(".cache/nx"),
    }
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The synthetic fixtures of `cargo xtask synth` (its tiny shapes): three architectures
/// in a Q4_K_M mix, the tier-1 file types (Q4_1/Q5_1/IQ4_NL, Q3_K_M, Q2_K/IQ4_XS), the
/// seven grid formats (IQ1_S to IQ3_S), then
/// Granite, OLMo 2, SmolLM3, Gemma 2, Phi-3, a Llama with Llama 3.1 factors and linear
/// RoPE scaling, Qwen3-MoE and a Llama with YaRN; then the sixteen tier-1 file types of
/// llama-quantize (`llama-ft-*`: the tensor types it picks, nx's quantization).
pub const SYNTH_FIXTURES: [&str; 32] = [
    "qwen2-tiny",
    "llama-tiny",
    "qwen3-tiny",
    "llama-q4_1",
    "llama-q3_k_m",
    "llama-q2_k-iq4_xs",
    "llama-iq-grids",
    "granite-tiny",
    "olmo2-tiny",
    "smollm3-tiny",
    "gemma2-tiny",
    "phi3-tiny",
    "phi3-long",
    "llama-rope-scaled",
    "qwen3moe-tiny",
    "llama-yarn",
    "llama-ft-Q4_0",
    "llama-ft-Q4_1",
    "llama-ft-Q5_0",
    "llama-ft-Q5_1",
    "llama-ft-Q8_0",
    "llama-ft-Q2_K",
    "llama-ft-Q3_K_S",
    "llama-ft-Q3_K_M",
    "llama-ft-Q3_K_L",
    "llama-ft-Q4_K_S",
    "llama-ft-Q4_K_M",
    "llama-ft-Q5_K_S",
    "llama-ft-Q5_K_M",
    "llama-ft-Q6_K",
    "llama-ft-IQ4_NL",
    "llama-ft-IQ4_XS",
];

pub fn synth_model(name: &str) -> PathBuf {
    cache_dir().join("synth").join(format!("{name}.gguf"))
}

pub fn default_model() -> PathBuf {
    cache_dir().join("models/gemma-3-270m-q4_k_m.gguf")
}

pub fn load_golden(file: &str) -> Value {
    let path = repo_root().join("fixtures/golden").join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask golden`)", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One reference step: the token llama.cpp chose and its top-2 log-probabilities.
pub struct RefStep {
    pub id: u32,
    pub logprob: f64,
    pub top: Vec<(u32, f64)>,
    /// llama.cpp's log-probability of `id` on its batched path (prompt and earlier
    /// steps as one batch), which rounds differently from the one-token path `logprob`
    /// comes from; see `batched_logprob` in the golden generator. Information only.
    pub batched: Option<f64>,
}

impl RefStep {
    pub fn margin(&self) -> f64 {
        match self.top.as_slice() {
            [a, b, ..] => a.1 - b.1,
            _ => f64::INFINITY,
        }
    }
}

pub struct RefPrompt {
    pub name: String,
    pub prompt_ids: Vec<u32>,
    pub steps: Vec<RefStep>,
}

pub fn ref_prompts(golden: &Value) -> Vec<RefPrompt> {
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    golden["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| RefPrompt {
            name: p["name"].as_str().unwrap_or("?").to_string(),
            prompt_ids: ids(&p["prompt_ids"]),
            steps: p["steps"]
                .as_array()
                .expect("steps")
                .iter()
                .map(|s| RefStep {
                    id: s["id"].as_u64().expect("id") as u32,
                    logprob: s["logprob"].as_f64().expect("logprob"),
                    batched: s["batched_logprob"].as_f64(),
                    top: s["top"]
                        .as_array()
                        .expect("top")
                        .iter()
                        .map(|t| {
                            (
                                t["id"].as_u64().expect("id") as u32,
                                t["logprob"].as_f64().expect("logprob"),
                            )
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect()
}

/// log-softmax of one logits row, in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    logits.iter().map(|&x| x as f64 - lse).collect()
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// What one model's comparison found.
#[derive(Default, Debug)]
pub struct Tally {
    pub steps: usize,
    pub firm_steps: usize,
    pub skipped_small_margin: usize,
    pub top1_mismatches: Vec<String>,
    /// Steps further than [`LOGPROB_TOLERANCE`] from llama.cpp's log-probability.
    pub logprob_violations: Vec<String>,
    /// Steps whose log-probability differs from llama.cpp's at all (beyond 1e-4, the
    /// server's own f32 softmax rounding).
    pub inexact_steps: usize,
    /// Largest distance from llama.cpp's log-probability.
    pub max_logprob_diff: f64,
    /// Largest distance between llama.cpp's own one-token and batched paths.
    pub max_reference_spread: f64,
    pub sum_logprob_diff: f64,
    pub free_running_compared: usize,
    pub free_running_mismatches: Vec<String>,
}

/// Log-probability differences below this are the server's f32 softmax rounding.
pub const EXACT: f64 = 1e-4;

impl Tally {
    pub fn report(&self, label: &str) -> String {
        format!(
            "{label}: {} steps, {} firm (margin >= {MARGIN}), {} skipped for small margins, \
             top-1 mismatches {}, logprob beyond {LOGPROB_TOLERANCE}: {}, max |diff| {:.6}, \
             mean {:.6}, steps differing by more than {EXACT}: {}; llama.cpp's own \
             batched-vs-one-token spread (information) max {:.4}; free-running prompts \
             compared {} (mismatches {})",
            self.steps,
            self.firm_steps,
            self.skipped_small_margin,
            self.top1_mismatches.len(),
            self.logprob_violations.len(),
            self.max_logprob_diff,
            self.sum_logprob_diff / self.steps.max(1) as f64,
            self.inexact_steps,
            self.max_reference_spread,
            self.free_running_compared,
            self.free_running_mismatches.len()
        )
    }

    pub fn passed(&self) -> bool {
        self.top1_mismatches.is_empty()
            && self.logprob_violations.is_empty()
            && self.free_running_mismatches.is_empty()
    }
}

/// Both engines run with f32 KV caches here (see `SERVER_ARGS` in the golden generator).
///
/// Teacher-forced: feed the prompt plus the reference tokens in one prefill (chunks of
/// `chunk`), take the logits of every generated position, and compare each with the
/// reference step. Then, for prompts whose margins all clear `MARGIN`, generate greedily
/// and require the same ids.
pub fn compare_model(model: &Model, prompts: &[RefPrompt], chunk: usize) -> Tally {
    let mut tally = Tally::default();
    let n_vocab = model.config().n_vocab;
    for p in prompts {
        let n_prompt = p.prompt_ids.len();
        let n_steps = p.steps.len();
        let mut tokens = p.prompt_ids.clone();
        tokens.extend(p.steps.iter().take(n_steps.saturating_sub(1)).map(|s| s.id));
        // The cache holds the reference server's context (`-c`), so a LongRoPE model picks
        // its factors by the same context length as there.
        let n_ctx = REFERENCE_N_CTX.max(tokens.len() + 1);
        let logits = forward_rows_in(model, &tokens, n_prompt - 1, chunk, KvDtype::F32, n_ctx);
        for (k, step) in p.steps.iter().enumerate() {
            let row = &logits[k * n_vocab..(k + 1) * n_vocab];
            let lp = log_softmax(row);
            let ours = lp[step.id as usize];
            let diff = (ours - step.logprob).abs();
            tally.steps += 1;
            tally.sum_logprob_diff += diff;
            tally.max_logprob_diff = tally.max_logprob_diff.max(diff);
            if diff > EXACT {
                tally.inexact_steps += 1;
            }
            if let Some(b) = step.batched {
                tally.max_reference_spread =
                    tally.max_reference_spread.max((b - step.logprob).abs());
            }
            if diff > LOGPROB_TOLERANCE {
                tally.logprob_violations.push(format!(
                    "{} step {k}: token {} logprob nx {ours:.4} vs llama.cpp {:.4}",
                    p.name, step.id, step.logprob
                ));
            }
            if step.margin() >= MARGIN {
                tally.firm_steps += 1;
                let top = argmax(row);
                if top != step.id {
                    tally.top1_mismatches.push(format!(
                        "{} step {k}: nx top-1 {top} vs llama.cpp {} (margin {:.3})",
                        p.name,
                        step.id,
                        step.margin()
                    ));
                }
            } else {
                tally.skipped_small_margin += 1;
            }
        }
        if p.steps.iter().all(|s| s.margin() >= MARGIN) {
            tally.free_running_compared += 1;
            let ours = greedy(model, &p.prompt_ids, n_steps);
            let theirs: Vec<u32> = p.steps.iter().map(|s| s.id).collect();
            if ours != theirs {
                tally
                    .free_running_mismatches
                    .push(format!("{}: nx {ours:?} vs llama.cpp {theirs:?}", p.name));
            }
        }
    }
    tally
}

/// Logits rows `first_row..tokens.len()` of a prefill of `tokens` in chunks of `chunk`.
pub fn forward_rows(model: &Model, tokens: &[u32], first_row: usize, chunk: usize) -> Vec<f32> {
    forward_rows_kv(model, tokens, first_row, chunk, KvDtype::F32)
}

/// The context the reference server ran with when recording the forward goldens
/// (`SERVER_ARGS` of `xtask/src/golden/forward.rs`).
pub const REFERENCE_N_CTX: usize = 4096;

/// [`forward_rows`] with a chosen cache type.
pub fn forward_rows_kv(
    model: &Model,
    tokens: &[u32],
    first_row: usize,
    chunk: usize,
    kv: KvDtype,
) -> Vec<f32> {
    forward_rows_in(model, tokens, first_row, chunk, kv, tokens.len() + 1)
}

/// [`forward_rows_kv`] in a cache of `n_ctx` positions.
pub fn forward_rows_in(
    model: &Model,
    tokens: &[u32],
    first_row: usize,
    chunk: usize,
    kv: KvDtype,
    n_ctx: usize,
) -> Vec<f32> {
    let mut cache = model.new_cache(n_ctx, kv).expect("cache");
    let mut state = ForwardState::default();
    let mut out = Vec::new();
    let mut logits = Vec::new();
    let mut pos = 0;
    for piece in tokens.chunks(chunk.max(1)) {
        let rows: Vec<usize> = (0..piece.len()).filter(|&i| pos + i >= first_row).collect();
        model
            .forward(piece, pos, &mut cache, &rows, &mut state, &mut logits)
            .expect("forward");
        out.extend_from_slice(&logits);
        pos += piece.len();
    }
    out
}

/// Greedy generation of `n` tokens after `prompt` (one prefill, then one token a step), in
/// a cache of the reference server's context.
pub fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    // The reference server's context, as in `compare_model`.
    let n_ctx = REFERENCE_N_CTX.max(prompt.len() + n + 1);
    let mut cache = model.new_cache(n_ctx, KvDtype::F32).expect("cache");
    let mut state = ForwardState::default();
    let mut logits = Vec::new();
    model
        .forward(
            prompt,
            0,
            &mut cache,
            &[prompt.len() - 1],
            &mut state,
            &mut logits,
        )
        .expect("prefill");
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let next = argmax(&logits);
        out.push(next);
        if out.len() == n {
            break;
        }
        let pos = cache.len();
        model
            .forward(&[next], pos, &mut cache, &[0], &mut state, &mut logits)
            .expect("decode");
    }
    out
}

/// Loads `fixtures/golden/forward-NAME.json`, runs the teacher-forced and free-running
/// comparisons on the model at `path` and prints the tally under `gate`; `how_to_get`
/// is the command that makes a missing model file.
pub fn check_golden(gate: &str, name: &str, path: &std::path::Path, how_to_get: &str) -> Tally {
    let golden = load_golden(&format!("forward-{name}.json"));
    let prompts = ref_prompts(&golden);
    let model = Model::open(path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `{how_to_get}`)", path.display()));
    let tally = compare_model(&model, &prompts, 32);
    println!("{}", tally.report(&format!("{gate} {name}")));
    for m in tally
        .top1_mismatches
        .iter()
        .chain(&tally.logprob_violations)
        .chain(&tally.free_running_mismatches)
        .take(10)
    {
        println!("  {m}");
    }
    tally
}
