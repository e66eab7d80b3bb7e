//! Response shapes: OpenAI's completion and chat-completion objects, their stream chunks,
//! log-probabilities, usage, and server-sent-event framing.

use nx_bpe::Tokenizer;
use nx_run::{StopReason, Usage};
use serde_json::{json, Map, Value};

use crate::params::Endpoint;

/// The last event of a stream.
pub const SSE_DONE: &str = "data: [DONE]\n\n";

/// One server-sent event carrying `value` as JSON: `data: {json}\n\n`.
pub fn sse_data(value: &Value) -> String {
    // serde_json never writes a raw newline inside a value, so one `data:` line suffices.
    format!("data: {value}\n\n")
}

/// OpenAI's `finish_reason`: `stop` for an end-of-generation token or a stop string,
/// `length` for the token or byte cap.
pub fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::MaxTokens | StopReason::MaxBytes => "length",
        StopReason::Eos | StopReason::StopString | StopReason::Callback => "stop",
    }
}

/// The `usage` object.
pub fn usage_json(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": { "cached_tokens": cached_tokens },
    })
}

/// `usage` of a request whose choices ended with `usages`: the prompt counted once, the
/// generated tokens summed, cached tokens the fewest any choice had.
pub fn combined_usage(prompt_tokens: usize, usages: &[Usage]) -> Value {
    let completion: usize = usages.iter().map(|u| u.generated_tokens).sum();
    let cached = usages
        .iter()
        .map(|u| u.cached_prompt_tokens)
        .min()
        .unwrap_or(0);
    usage_json(prompt_tokens, completion, cached)
}

/// One generated token with its log-probability and alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// Token id.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives `(id, logprob)`.
    pub top: Vec<(u32, f32)>,
}

/// The bytes token `id` adds to the output text: empty for a control token (BOS, turn
/// markers), which the generated text leaves out as `nx run` does, and for an unknown id.
/// So the log-probability tokens spell the text and its offsets point into it.
fn piece(tokenizer: &Tokenizer, id: u32) -> &[u8] {
    if tokenizer.is_control(id).unwrap_or(true) {
        return &[];
    }
    tokenizer.token_to_piece(id).unwrap_or(&[])
}

/// A JSON log-probability: finite, or a very negative number (JSON has no −∞).
fn lp(x: f32) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        json!(-9999.0)
    }
}

fn chat_top_entry(tokenizer: &Tokenizer, id: u32, logprob: f32) -> Value {
    let bytes = piece(tokenizer, id);
    json!({
        "token": String::from_utf8_lossy(bytes),
        "logprob": lp(logprob),
        "bytes": bytes,
    })
}

/// A chat `logprobs.content[]` entry: `{token, logprob, bytes, top_logprobs: [...]}`.
pub fn chat_logprob_entry(tokenizer: &Tokenizer, t: &TokenLogprob) -> Value {
    let mut entry = chat_top_entry(tokenizer, t.id, t.logprob);
    let top: Vec<Value> = t
        .top
        .iter()
        .map(|&(id, l)| chat_top_entry(tokenizer, id, l))
        .collect();
    entry["top_logprobs"] = Value::Array(top);
    entry
}

/// A chat choice's `logprobs` object: `{content: [...], refusal: null}`.
pub fn chat_logprobs(tokenizer: &Tokenizer, tokens: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| chat_logprob_entry(tokenizer, t))
        .collect();
    json!({ "content": content, "refusal": null })
}

/// A completion choice's `logprobs` object: `{tokens, token_logprobs, top_logprobs,
/// text_offset}`; `top_logprobs` entries map token text to log-probability (`null`
/// when no alternatives were asked for). `first_offset` is the text offset of the first
/// token. nx adds `token_ids`, the ids of `tokens`.
pub fn completion_logprobs(
    tokenizer: &Tokenizer,
    tokens: &[TokenLogprob],
    k: usize,
    first_offset: usize,
) -> Value {
    let mut texts = Vec::with_capacity(tokens.len());
    let mut logprobs = Vec::with_capacity(tokens.len());
    let mut tops = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    let mut offset = first_offset;
    for t in tokens {
        let text = String::from_utf8_lossy(piece(tokenizer, t.id)).into_owned();
        offsets.push(offset);
        offset += text.len();
        texts.push(Value::String(text));
        logprobs.push(lp(t.logprob));
        if k == 0 {
            tops.push(Value::Null);
        } else {
            let mut map = Map::new();
            for &(id, l) in &t.top {
                // Map keys: the vocabulary text, so alternatives never collide.
                let raw = tokenizer.token_to_piece(id).unwrap_or(&[]);
                let text = String::from_utf8_lossy(raw).into_owned();
                map.entry(text).or_insert(lp(l));
            }
            tops.push(Value::Object(map));
        }
    }
    json!({
        "tokens": texts,
        "token_logprobs": logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
        "token_ids": tokens.iter().map(|t| t.id).collect::<Vec<u32>>(),
    })
}

/// What every response object of one request shares.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// `chatcmpl-7`, `cmpl-7`.
    pub id: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// The served model's id.
    pub model: String,
    /// The endpoint.
    pub endpoint: Endpoint,
}

/// The `system_fingerprint` of every response.
pub fn system_fingerprint() -> String {
    format!("nx-{}", env!("CARGO_PKG_VERSION"))
}

impl Envelope {
    fn object(&self, stream: bool) -> &'static str {
        match (self.endpoint, stream) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn base(&self, stream: bool, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(stream),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(),
            "choices": choices,
        })
    }

    /// A stream chunk with one choice. For chat, `text` is the delta's content (and
    /// `role` is added when `first`); `finish` ends the choice (with an empty delta
    /// for chat). `logprobs` is the choice's `logprobs` value (`null` when not asked).
    pub fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        first: bool,
        logprobs: Value,
        finish: Option<&str>,
        include_usage: bool,
    ) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({
                    "index": index,
                    "delta": Value::Object(delta),
                    "logprobs": logprobs,
                    "finish_reason": finish,
                })
            }
            Endpoint::Completion => json!({
                "index": index,
                "text": text.unwrap_or(""),
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        };
        let mut v = self.base(true, vec![choice]);
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// The last chunk of a stream with `include_usage`: empty `choices` and `usage`.
    pub fn usage_chunk(&self, usage: Value) -> Value {
        let mut v = self.base(true, Vec::new());
        v["usage"] = usage;
        v
    }

    /// A non-streamed response with `choices` (see [`Envelope::choice`]) and `usage`.
    pub fn full(&self, choices: Vec<Value>, usage: Value) -> Value {
        let mut v = self.base(false, choices);
        v["usage"] = usage;
        v
    }

    /// One choice of a non-streamed response.
    pub fn choice(&self, index: usize, text: &str, logprobs: Value, finish: &str) -> Value {
        match self.endpoint {
            Endpoint::Chat => json!({
                "index": index,
                "message": { "role": "assistant", "content": text, "refusal": null },
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            Endpoint::Completion => json!({
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        }
    }
}
