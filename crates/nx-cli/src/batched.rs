//! `nx bench --parallel 1,2,4,8,16`: aggregate speed of N sequences decoded together by
//! the engine, like `llama-batched-bench -npp P -ntg N -npl ...`.
//!
//! For each N, N requests with distinct `P`-token prompts and `N_GEN` tokens each
//! (greedy, no stop rule) are submitted at once to one engine (`--parallel` slots, a
//! pool big enough for all of them, no prefix cache). Reported per N: the prefill rate
//! (N·P tokens over the time until every sequence has its first token), the decode rate
//! (the tokens chosen after that, over the rest of the time: every sequence in every
//! step) and the whole run's rate, each the median over `--reps` rounds (a round runs
//! every N once), and each N's decode rate over the first N's, the median of the rounds'
//! ratios.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use nx_run::{Engine, EngineConfig, EngineEvent, KvDtype, Model, Request, SamplerConfig};

/// One level's figures.
pub struct Level {
    pub n_seqs: usize,
    pub pp_tps: f64,
    pub tg_tps: f64,
    pub total_tps: f64,
    /// The median, over rounds, of this level's decode rate over the first level's in
    /// the same round.
    pub tg_vs_first: f64,
}

/// One run's rates: prefill, decode, whole run (tokens per second).
struct Rates {
    pp: f64,
    tg: f64,
    total: f64,
}

/// Parses `1,2,4,8`.
pub fn parse_levels(list: &str) -> Result<Vec<usize>> {
    let levels: Vec<usize> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => Ok(n),
            _ => bail!("--parallel: {s:?} is not a sequence count in 1..=256"),
        })
        .collect::<Result<_>>()?;
    if levels.is_empty() {
        bail!("--parallel: no sequence counts given");
    }
    Ok(levels)
}

/// Runs every level `reps` times, in rounds (each round runs every level once, in the
/// given order), so that a slower minute of the machine weighs on one round of every
/// level rather than on all runs of one; each level's figures are its medians, and its
/// ratio to the first level the median of the rounds' ratios.
pub fn run_levels(
    model: &Arc<Model>,
    levels: &[Vec<Vec<u32>>],
    n_gen: usize,
    prefill_chunk: usize,
    reps: usize,
) -> Result<Vec<Level>> {
    let mut runs: Vec<Vec<Rates>> = levels.iter().map(|_| Vec::new()).collect();
    for round in 0..reps.max(1) {
        for (prompts, runs) in levels.iter().zip(&mut runs) {
            eprintln!(
                "bench: {} sequences, round {} of {} ...",
                prompts.len(),
                round + 1,
                reps.max(1)
            );
            runs.push(run_once(model, prompts, n_gen, prefill_chunk)?);
        }
    }
    let first: Vec<f64> = runs[0].iter().map(|r| r.tg).collect();
    let median = |v: Vec<f64>| crate::stats::median(v).unwrap_or(0.0);
    Ok(levels
        .iter()
        .zip(&runs)
        .map(|(prompts, runs)| Level {
            n_seqs: prompts.len(),
            pp_tps: median(runs.iter().map(|r| r.pp).collect()),
            tg_tps: median(runs.iter().map(|r| r.tg).collect()),
            total_tps: median(runs.iter().map(|r| r.total).collect()),
            tg_vs_first: median(runs.iter().zip(&first).map(|(r, f)| r.tg / f).collect()),
        })
        .collect())
}

/// One run of one level: every prompt submitted at once to a fresh engine, run to the
/// end.
fn run_once(
    model: &Arc<Model>,
    prompts: &[Vec<u32>],
    n_gen: usize,
    prefill_chunk: usize,
) -> Result<Rates> {
    let n_seqs = prompts.len();
    let n_prompt = prompts[0].len();
    let n_ctx = n_prompt + n_gen + 1;
    let per_seq = model.kv_bytes_per_position(KvDtype::F16) * (n_ctx as u64 + 32);
    let config = EngineConfig {
        n_ctx,
        kv_memory_bytes: per_seq * n_seqs as u64,
        max_running: n_seqs,
        step_tokens: prefill_chunk.max(n_seqs),
        prefill_chunk,
        prefix_cache: false,
        max_queue: n_seqs,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(model.clone(), None, config)?;
    for p in prompts {
        engine.submit(Request {
            prompt: p.clone(),
            max_tokens: n_gen,
            sampler: SamplerConfig::greedy(),
            // As a server client that asks for no log-probabilities.
            token_logprobs: false,
            ..Request::default()
        })?;
    }
    let start = Instant::now();
    // The sequences that have their first token: a sequence whose prompt ended in an
    // early step decodes while later prompts still prefill, so its second and later
    // tokens must not count as other sequences' first ones.
    let mut started = HashSet::new();
    let mut decode_start = None;
    let mut decoded = 0usize;
    while engine.has_work() {
        for event in engine.step()? {
            match event {
                EngineEvent::Token { .. } if decode_start.is_some() => decoded += 1,
                EngineEvent::Token { seq, .. } => {
                    started.insert(seq);
                    if started.len() == n_seqs {
                        decode_start = Some(Instant::now());
                    }
                }
                EngineEvent::Failed { error, .. } => bail!("a sequence failed: {error}"),
                _ => {}
            }
        }
    }
    let all = start.elapsed().as_secs_f64();
    let prefill = decode_start.map_or(all, |t| (t - start).as_secs_f64());
    Ok(Rates {
        pp: (n_seqs * n_prompt) as f64 / prefill,
        tg: decoded as f64 / (all - prefill).max(f64::EPSILON),
        total: (n_seqs * (n_prompt + n_gen)) as f64 / all,
    })
}
