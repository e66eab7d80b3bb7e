//! Helpers of the runner tests: the tiny model, runners over it, and event collection.

#![allow(dead_code)]

pub mod tiny_model;

use std::ops::ControlFlow;
use std::sync::Arc;

use nx_bpe::Tokenizer;
use nx_gguf::Gguf;
use nx_run::{Completion, Event, Model, Prompt, RunConfig, RunError, Runner, SamplerConfig};

#[allow(unused_imports)]
pub use tiny_model::{n_vocab, tiny_gguf, TinyOptions, BOS};

/// The tiny model and its tokenizer.
pub fn load(opts: TinyOptions) -> (Arc<Model>, Arc<Tokenizer>) {
    let gguf = Gguf::from_bytes(tiny_gguf(opts)).expect("tiny GGUF parses");
    let tokenizer = Tokenizer::from_gguf(&gguf).expect("tiny tokenizer");
    let model = Model::from_gguf(gguf).expect("tiny model loads");
    (Arc::new(model), Arc::new(tokenizer))
}

/// A greedy config with `max_tokens` and `prefill_chunk`.
pub fn greedy(max_tokens: usize, prefill_chunk: usize) -> RunConfig {
    RunConfig {
        prefill_chunk,
        n_ctx: 256,
        max_tokens,
        sampler: SamplerConfig::greedy(),
        ..RunConfig::default()
    }
}

/// A runner over the default tiny model.
pub fn runner(config: RunConfig) -> Runner {
    let (model, tok) = load(TinyOptions::default());
    Runner::new(model, Some(tok), config).expect("runner")
}

/// What one generation reported.
#[derive(Debug, Clone)]
pub struct Run {
    pub completion: Completion,
    pub ids: Vec<u32>,
    pub texts: Vec<String>,
    pub logprobs: Vec<f32>,
    pub tops: Vec<Vec<(u32, f32)>>,
    pub flushed: String,
    pub done_events: usize,
}

impl Run {
    /// All output text: every token's text, then the flushed tail.
    pub fn text(&self) -> String {
        let mut s: String = self.texts.concat();
        s.push_str(&self.flushed);
        s
    }
}

fn collect(
    f: impl FnOnce(&mut dyn FnMut(Event) -> ControlFlow<()>) -> Result<Completion, RunError>,
    stop_after: Option<usize>,
) -> Result<Run, RunError> {
    let mut ids = Vec::new();
    let mut texts = Vec::new();
    let mut logprobs = Vec::new();
    let mut tops = Vec::new();
    let mut flushed = String::new();
    let mut done_events = 0;
    let completion = f(&mut |e| match e {
        Event::Token {
            id,
            text,
            logprob,
            top,
        } => {
            assert_eq!(done_events, 0, "token event after Done");
            ids.push(id);
            texts.push(text);
            logprobs.push(logprob);
            tops.push(top);
            match stop_after {
                Some(n) if ids.len() >= n => ControlFlow::Break(()),
                _ => ControlFlow::Continue(()),
            }
        }
        Event::Done { flushed: tail, .. } => {
            done_events += 1;
            flushed = tail;
            ControlFlow::Continue(())
        }
    })?;
    Ok(Run {
        completion,
        ids,
        texts,
        logprobs,
        tops,
        flushed,
        done_events,
    })
}

/// `runner.generate(prompt)`, collecting the events.
pub fn generate(runner: &mut Runner, prompt: Prompt) -> Result<Run, RunError> {
    collect(|cb| runner.generate(prompt, cb), None)
}

/// `runner.generate(prompt)`, asking to stop after `n` token events.
pub fn generate_until(runner: &mut Runner, prompt: Prompt, n: usize) -> Result<Run, RunError> {
    collect(|cb| runner.generate(prompt, cb), Some(n))
}

/// `runner.continue_with(prompt)`, collecting the events.
pub fn continue_with(runner: &mut Runner, prompt: Prompt) -> Result<Run, RunError> {
    collect(|cb| runner.continue_with(prompt, cb), None)
}

/// The output text expected for `ids`: the pieces of the non-control tokens, decoded
/// as a whole (invalid UTF-8 becomes U+FFFD).
pub fn expected_text(tok: &Tokenizer, ids: &[u32]) -> String {
    let visible: Vec<u32> = ids
        .iter()
        .copied()
        .filter(|&id| !tok.is_control(id).unwrap())
        .collect();
    String::from_utf8_lossy(&tok.decode(&visible).unwrap()).into_owned()
}

/// A deterministic prompt of `n` ordinary token ids (no control or byte tokens).
pub fn prompt_ids(n: usize, salt: u32) -> Vec<u32> {
    let first_normal = 6u32; // after <unk>, <s>, </s> and the three byte tokens
    let span = n_vocab() as u32 - first_normal;
    (0..n as u32)
        .map(|i| first_normal + (i.wrapping_mul(7).wrapping_add(salt.wrapping_mul(13)) % span))
        .collect()
}
