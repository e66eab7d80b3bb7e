//! Request parsing and validation: JSON bodies to [`GenParams`], and [`GenParams`] plus
//! prompt ids to engine [`Request`]s.
//!
//! Validation walks a `serde_json::Value` by hand so that every error names the field
//! at fault (`temperature must be a number between 0 and 2, got "hot"`). Unknown fields
//! are ignored, and `null` counts as absent, as OpenAI's API does.
//!
//! Sampling defaults are nx's ([`SamplerConfig::default`]: temperature 0.8, top-k 40,
//! top-p 0.95, min-p 0.05, seed 0, penalties off), so a request that sets nothing
//! samples like `nx run` without flags; `temperature: 0` is greedy. `logit_bias` and the
//! penalties move the logits the token is chosen from; reported log-probabilities are the
//! model's own, before them (as llama-server reports them by default).
//!
//! nx extras: `top_k`, `min_p`, `repeat_penalty`, `ignore_eos`, `parse_special`
//! (completions), and `speculative` (`"ngram"`, `"draft"`, `"none"` or `false`) with
//! `draft_max`: speculative decoding chosen per request over the server's `--spec`
//! default ([`SpeculationChoice`]). It changes how fast an answer comes, never the answer.

use nx_run::{ChatMessage, DraftSource, Request, SamplerConfig, Speculation};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Most choices one request may ask for (`n`).
pub const MAX_N: usize = 16;
/// Most stop strings one request may give.
pub const MAX_STOP: usize = 16;
/// Most alternatives per token for chat completions (`top_logprobs`).
pub const MAX_TOP_LOGPROBS_CHAT: usize = 20;
/// Most alternatives per token for completions (`logprobs`).
pub const MAX_LOGPROBS_COMPLETION: usize = 5;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completion,
}

impl Endpoint {
    /// Prefix of response ids (`chatcmpl`, `cmpl`).
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        }
    }
}

/// What the model starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    /// A completion prompt text (encoded with BOS as the vocabulary asks).
    Text(String),
    /// A completion prompt as token ids (used as given).
    Ids(Vec<u32>),
    /// A chat conversation (rendered with the chat template).
    Messages(Vec<ChatMessage>),
}

/// A validated generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// `model`, if given.
    pub model: Option<String>,
    /// `messages` or `prompt`.
    pub prompt: PromptInput,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `max_completion_tokens` / `max_tokens` (`None`: up to the context).
    pub max_tokens: Option<usize>,
    /// Sampling settings; the seed is choice 0's (choice `i` uses `seed + i`).
    pub sampler: SamplerConfig,
    /// `stop` (as a list).
    pub stop: Vec<String>,
    /// `None`: no log-probabilities; `Some(k)`: each token's log-probability and its
    /// `k` most likely alternatives.
    pub logprobs: Option<usize>,
    /// `n`.
    pub n: usize,
    /// `ignore_eos` (nx extra).
    pub ignore_eos: bool,
    /// `parse_special` (nx extra, completions only): read special-token texts in the
    /// prompt as those tokens. Default `false`.
    pub parse_special: bool,
    /// `speculative` and `draft_max` (nx extras): this request's speculative decoding.
    pub speculation: SpeculationChoice,
    /// `response_format: {"type": "json_object"}`: JSON mode ([`nx_run::json_mode`]).
    pub json_object: bool,
}

/// Default draft length of a request that turns speculation on without `draft_max`
/// (as `nx run --spec`): the last token and seven guesses are eight rows, one narrow
/// tile of the matmul kernels, where eight guesses would take a sixteen-row one.
pub const DEFAULT_DRAFT_MAX: usize = 7;

/// What a request asks of speculative decoding. It never changes the answer, only how
/// fast it comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeculationChoice {
    /// No `speculative` field: the server's setting (`nx serve --spec`).
    ServerDefault,
    /// `"speculative": false` or `"none"`: one token per pass.
    Off,
    /// `"speculative": "ngram"` (prompt lookup) or `"draft"` (the server's draft model).
    On(Speculation),
}

impl SpeculationChoice {
    /// The speculation a request runs with, given the server's setting.
    pub fn resolve(self, server: Option<Speculation>) -> Option<Speculation> {
        match self {
            SpeculationChoice::ServerDefault => server,
            SpeculationChoice::Off => None,
            SpeculationChoice::On(spec) => Some(spec),
        }
    }
}

/// Parses a request body (bytes) for `endpoint`.
pub fn parse_body(endpoint: Endpoint, body: &[u8]) -> Result<GenParams, ApiError> {
    let value = parse_json(body)?;
    parse_value(endpoint, &value)
}

/// Parses bytes as JSON; a syntax error is a 400 naming the line and column.
pub fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
            .with_code("invalid_json")
    })
}

/// OpenAI fields that would change the answer and that nx does not implement: a 400
/// naming the field, rather than an answer that silently ignores it. Their neutral
/// values (`echo: false`, `best_of: 1`, no tools) are accepted, and `response_format`
/// but for `json_schema` is [`parse_response_format`]'s.
fn reject_unsupported(obj: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    let neutral = |key: &str, v: &Value| match key {
        "echo" => v == &Value::Bool(false),
        "best_of" => v.as_u64() == Some(1),
        "tools" | "functions" => {
            v.is_null()
                || v.as_object().is_some_and(|o| o.is_empty())
                || v.as_array().is_some_and(|a| a.is_empty())
        }
        "response_format" => v
            .get("type")
            .and_then(Value::as_str)
            .is_none_or(|t| t != "json_schema"),
        _ => v.is_null(),
    };
    for key in [
        "echo",
        "best_of",
        "suffix",
        "tools",
        "functions",
        "response_format",
    ] {
        if let Some(v) = obj.get(key) {
            if !neutral(key, v) {
                let what = match key {
                    "response_format" => "response_format json_schema (json_object is)",
                    _ => key,
                };
                return Err(ApiError::invalid(
                    key,
                    format!("{what} is not supported by nx serve"),
                ));
            }
        }
    }
    Ok(())
}

/// Parses a JSON request for `endpoint`.
pub fn parse_value(endpoint: Endpoint, value: &Value) -> Result<GenParams, ApiError> {
    let obj = value.as_object().ok_or_else(|| {
        ApiError::bad_request(format!(
            "the request body must be a JSON object, got {}",
            type_name(value)
        ))
    })?;
    let f = Fields(obj);
    reject_unsupported(obj)?;
    let model = f.string("model")?.map(str::to_string);
    let prompt = match endpoint {
        Endpoint::Chat => PromptInput::Messages(parse_messages(&f)?),
        Endpoint::Completion => parse_prompt(&f)?,
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = parse_include_usage(&f)?;

    let max_tokens = match endpoint {
        Endpoint::Chat => match f.count("max_completion_tokens", 1, None)? {
            Some(n) => Some(n),
            None => f.count("max_tokens", 1, None)?,
        },
        Endpoint::Completion => f.count("max_tokens", 1, None)?,
    };

    let sampler = parse_sampler(&f)?;
    let stop = parse_stop(&f)?;
    let n = f.count("n", 1, Some(MAX_N))?.unwrap_or(1);
    let logprobs = parse_logprobs(endpoint, &f)?;
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let parse_special = match endpoint {
        Endpoint::Completion => f.bool("parse_special")?.unwrap_or(false),
        Endpoint::Chat => false,
    };
    let speculation = parse_speculation(&f)?;
    let json_object = parse_response_format(&f)?;
    Ok(GenParams {
        endpoint,
        model,
        prompt,
        stream,
        include_usage,
        max_tokens,
        sampler,
        stop,
        logprobs,
        n,
        ignore_eos,
        parse_special,
        speculation,
        json_object,
    })
}

/// `response_format`: `{"type": "text"}` (the default) or `{"type": "json_object"}`;
/// `json_schema` is refused by name ([`reject_unsupported`]).
fn parse_response_format(f: &Fields<'_>) -> Result<bool, ApiError> {
    let Some(v) = f.get("response_format") else {
        return Ok(false);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(false),
        Some("json_object") => Ok(true),
        _ => Err(ApiError::invalid(
            "response_format",
            format!(
                "response_format must be {{\"type\": \"text\"}} or {{\"type\": \"json_object\"}}, got {}",
                show(v)
            ),
        )),
    }
}

/// `stream_options.include_usage` (false when absent).
fn parse_include_usage(f: &Fields<'_>) -> Result<bool, ApiError> {
    Ok(match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o)
            .bool_named("include_usage", "stream_options.include_usage")?
            .unwrap_or(false),
        Some(v) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("stream_options must be an object, got {}", type_name(v)),
            ))
        }
    })
}

/// The sampling fields: OpenAI's `temperature`, `top_p`, `presence_penalty`,
/// `frequency_penalty`, `seed`, `logit_bias`, and nx's `top_k`, `min_p`, `repeat_penalty`,
/// `repeat_last_n`; the defaults of [`SamplerConfig`] for those absent.
fn parse_sampler(f: &Fields<'_>) -> Result<SamplerConfig, ApiError> {
    let mut sampler = SamplerConfig::default();
    if let Some(t) = f.number("temperature", 0.0, 2.0, true)? {
        sampler.temperature = t as f32;
    }
    if let Some(p) = f.number("top_p", 0.0, 1.0, false)? {
        sampler.top_p = p as f32;
    }
    if let Some(k) = f.count("top_k", 0, None)? {
        sampler.top_k = k;
    }
    if let Some(p) = f.number("min_p", 0.0, 1.0, true)? {
        sampler.min_p = p as f32;
    }
    if let Some(p) = f.number("presence_penalty", -2.0, 2.0, true)? {
        sampler.presence_penalty = p as f32;
    }
    if let Some(p) = f.number("frequency_penalty", -2.0, 2.0, true)? {
        sampler.frequency_penalty = p as f32;
    }
    if let Some(p) = f.get("repeat_penalty") {
        let x = p
            .as_f64()
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| {
                ApiError::invalid(
                    "repeat_penalty",
                    format!("repeat_penalty must be a number above 0, got {}", show(p)),
                )
            })?;
        sampler.repeat_penalty = x as f32;
    }
    if let Some(n) = f.count("repeat_last_n", 0, None)? {
        sampler.penalty_last_n = n;
    }
    if let Some(v) = f.get("seed") {
        let seed = match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => u,
            // Negative seeds (OpenAI allows any integer) wrap to their two's complement.
            (None, Some(i)) => i as u64,
            _ => {
                return Err(ApiError::invalid(
                    "seed",
                    format!("seed must be an integer, got {}", show(v)),
                ))
            }
        };
        sampler.seed = seed;
    }
    sampler.logit_bias = parse_logit_bias(f)?;
    Ok(sampler)
}

/// Most entries one `logit_bias` may have (OpenAI's limit).
pub const MAX_LOGIT_BIAS: usize = 300;

/// `logit_bias`: an object from token ids (decimal strings) to biases in [-100, 100],
/// as OpenAI takes it; the ids are checked against the vocabulary with the prompt
/// ([`build_requests`]). Entries in id order, so the same map gives the same sampler.
fn parse_logit_bias(f: &Fields<'_>) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = match f.get("logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(v) => {
            return Err(ApiError::invalid(
                "logit_bias",
                format!(
                    "logit_bias must be an object from token ids to numbers, got {}",
                    type_name(v)
                ),
            ))
        }
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "logit_bias has {} entries, more than the {MAX_LOGIT_BIAS} allowed",
                map.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(map.len());
    for (key, v) in map {
        let id: u32 = key.parse().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!("logit_bias key {key:?} is not a token id"),
            )
        })?;
        let bias = v
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                ApiError::invalid(
                    "logit_bias",
                    format!(
                        "logit_bias[{key:?}] must be a number between -100 and 100, got {}",
                        show(v)
                    ),
                )
            })?;
        out.push((id, bias as f32));
    }
    out.sort_by_key(|&(id, _)| id);
    Ok(out)
}

/// `logprobs` / `top_logprobs` (chat: a flag and a count; completions: a count):
/// `None` for no log-probabilities, else how many alternatives per token.
fn parse_logprobs(endpoint: Endpoint, f: &Fields<'_>) -> Result<Option<usize>, ApiError> {
    Ok(match endpoint {
        Endpoint::Chat => {
            let wanted = f.bool("logprobs")?.unwrap_or(false);
            let top = f.count("top_logprobs", 0, Some(MAX_TOP_LOGPROBS_CHAT))?;
            match (wanted, top) {
                (true, top) => Some(top.unwrap_or(0)),
                (false, None) => None,
                (false, Some(_)) => {
                    return Err(ApiError::invalid(
                        "top_logprobs",
                        "top_logprobs needs logprobs: true",
                    ))
                }
            }
        }
        Endpoint::Completion => match f.get("logprobs") {
            // Some clients send `logprobs: false` for "none".
            Some(Value::Bool(false)) => None,
            _ => f.count("logprobs", 0, Some(MAX_LOGPROBS_COMPLETION))?,
        },
    })
}

/// `speculative`: absent (the server's setting), `false` or `"none"` (off), `"ngram"` or
/// `"draft"`; `draft_max` (1-32) sets the draft length of an explicit choice.
fn parse_speculation(f: &Fields<'_>) -> Result<SpeculationChoice, ApiError> {
    let draft_max = f.count("draft_max", 1, Some(nx_run::spec::MAX_DRAFT))?;
    let source = match f.get("speculative") {
        None => None,
        Some(Value::Bool(false)) => Some(None),
        Some(Value::String(s)) if s == "none" => Some(None),
        Some(Value::String(s)) => match DraftSource::from_name(s) {
            Some(src) => Some(Some(src)),
            None => {
                return Err(ApiError::invalid(
                    "speculative",
                    format!(
                        "speculative must be \"ngram\", \"draft\", \"none\" or false, got {s:?}"
                    ),
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::invalid(
                "speculative",
                format!(
                    "speculative must be \"ngram\", \"draft\", \"none\" or false, got {}",
                    type_name(v)
                ),
            ))
        }
    };
    Ok(match source {
        None if draft_max.is_some() => {
            return Err(ApiError::invalid(
                "draft_max",
                "draft_max needs speculative: \"ngram\" or \"draft\"",
            ))
        }
        None => SpeculationChoice::ServerDefault,
        Some(None) => SpeculationChoice::Off,
        Some(Some(source)) => SpeculationChoice::On(Speculation {
            source,
            draft_max: draft_max.unwrap_or(DEFAULT_DRAFT_MAX),
        }),
    })
}

/// The engine requests for `params` over `prompt` ids, one per choice (choice `i` with
/// seed `seed + i`), checked against a context of `n_ctx` positions.
pub fn build_requests(
    params: &GenParams,
    prompt: &[u32],
    n_ctx: usize,
    n_vocab: usize,
) -> Result<Vec<Request>, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            prompt_field(params.endpoint),
            "the prompt has no tokens",
        ));
    }
    if let Some((i, &id)) = prompt
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= n_vocab)
    {
        return Err(ApiError::invalid(
            "prompt",
            format!("prompt[{i}]: token id {id} is outside the vocabulary of {n_vocab} tokens"),
        ));
    }
    if let Some(&(id, _)) = params
        .sampler
        .logit_bias
        .iter()
        .find(|b| b.0 as usize >= n_vocab)
    {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("logit_bias: token id {id} is outside the vocabulary of {n_vocab} tokens"),
        ));
    }
    let field = match params.endpoint {
        Endpoint::Chat => "max_completion_tokens",
        Endpoint::Completion => "max_tokens",
    };
    let max_tokens = match params.max_tokens {
        Some(m) => {
            if prompt.len().saturating_add(m) > n_ctx {
                return Err(ApiError::bad_request(format!(
                    "the prompt ({} tokens) plus {field} ({m}) is {} tokens, more than the \
                     context of {n_ctx} tokens",
                    prompt.len(),
                    prompt.len().saturating_add(m),
                ))
                .with_param(field)
                .with_code("context_length_exceeded"));
            }
            m
        }
        None => {
            if prompt.len() >= n_ctx {
                return Err(ApiError::bad_request(format!(
                    "the prompt ({} tokens) leaves no room to generate in the context of \
                     {n_ctx} tokens",
                    prompt.len()
                ))
                .with_param(prompt_field(params.endpoint))
                .with_code("context_length_exceeded"));
            }
            n_ctx - prompt.len()
        }
    };
    Ok((0..params.n)
        .map(|i| Request {
            prompt: prompt.to_vec(),
            max_tokens,
            sampler: SamplerConfig {
                seed: params.sampler.seed.wrapping_add(i as u64),
                ..params.sampler.clone()
            },
            stop_strings: params.stop.clone(),
            logprobs: params.logprobs.unwrap_or(0),
            token_logprobs: params.logprobs.is_some(),
            ignore_eos: params.ignore_eos,
            max_bytes: None,
            json_object: params.json_object,
            ..Request::default()
        })
        .collect())
}

fn prompt_field(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completion => "prompt",
    }
}

fn parse_messages(f: &Fields<'_>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match f.get("messages") {
        None => return Err(ApiError::invalid("messages", "messages is required")),
        Some(Value::Array(list)) => list,
        Some(v) => {
            return Err(ApiError::invalid(
                "messages",
                format!("messages must be an array, got {}", type_name(v)),
            ))
        }
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must have at least one message",
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let field = format!("messages[{i}]");
        let obj = m.as_object().ok_or_else(|| {
            ApiError::invalid(
                &field,
                format!("{field} must be an object, got {}", type_name(m)),
            )
        })?;
        let role = match obj.get("role") {
            Some(Value::String(r)) if !r.is_empty() => r.clone(),
            Some(v) => {
                return Err(ApiError::invalid(
                    &format!("{field}.role"),
                    format!("{field}.role must be a non-empty string, got {}", show(v)),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    &format!("{field}.role"),
                    format!("{field}.role is required"),
                ))
            }
        };
        let content = message_content(obj.get("content"), &field)?;
        out.push(ChatMessage::new(role, content));
    }
    Ok(out)
}

/// A message's `content` (of message `field`): absent or null (empty), a string, or an
/// array of `{"type": "text", "text": …}` parts joined.
fn message_content(content: Option<&Value>, field: &str) -> Result<String, ApiError> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Array(parts)) => parts,
        Some(v) => {
            return Err(ApiError::invalid(
                &format!("{field}.content"),
                format!(
                    "{field}.content must be a string or an array of text parts, got {}",
                    type_name(v)
                ),
            ))
        }
    };
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let pf = format!("{field}.content[{j}]");
        let kind = part.get("type").and_then(Value::as_str);
        match (kind, part.get("text")) {
            (Some("text"), Some(Value::String(t))) => text.push_str(t),
            (Some("text"), _) => {
                return Err(ApiError::invalid(
                    &format!("{pf}.text"),
                    format!("{pf}.text must be a string"),
                ))
            }
            (Some(other), _) => {
                return Err(ApiError::invalid(
                    &format!("{pf}.type"),
                    format!("{pf}.type {other:?} is not supported (only \"text\")"),
                ))
            }
            (None, _) => {
                return Err(ApiError::invalid(
                    &format!("{pf}.type"),
                    format!("{pf} must be an object with \"type\": \"text\""),
                ))
            }
        }
    }
    Ok(text)
}

fn parse_prompt(f: &Fields<'_>) -> Result<PromptInput, ApiError> {
    match f.get("prompt") {
        None => Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(s)) => Ok(PromptInput::Text(s.clone())),
        Some(Value::Array(list)) => {
            if list.is_empty() {
                return Err(ApiError::invalid("prompt", "prompt must not be empty"));
            }
            if list.iter().all(Value::is_string) {
                return match list.as_slice() {
                    [Value::String(s)] => Ok(PromptInput::Text(s.clone())),
                    _ => Err(ApiError::invalid(
                        "prompt",
                        format!(
                            "prompt has {} strings; one prompt per request is supported \
                             (use n for several choices)",
                            list.len()
                        ),
                    )),
                };
            }
            let mut ids = Vec::with_capacity(list.len());
            for (i, v) in list.iter().enumerate() {
                let id = v
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "prompt",
                            format!(
                                "prompt must be a string or an array of token ids; prompt[{i}] \
                                 is {}",
                                show(v)
                            ),
                        )
                    })?;
                ids.push(id);
            }
            Ok(PromptInput::Ids(ids))
        }
        Some(v) => Err(ApiError::invalid(
            "prompt",
            format!(
                "prompt must be a string or an array of token ids, got {}",
                type_name(v)
            ),
        )),
    }
}

fn parse_stop(f: &Fields<'_>) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            if items.len() > MAX_STOP {
                return Err(ApiError::invalid(
                    "stop",
                    format!(
                        "stop has {} strings, more than the {MAX_STOP} allowed",
                        items.len()
                    ),
                ));
            }
            let mut out = Vec::with_capacity(items.len());
            for (i, v) in items.iter().enumerate() {
                match v {
                    Value::String(s) => out.push(s.clone()),
                    _ => {
                        return Err(ApiError::invalid(
                            "stop",
                            format!("stop[{i}] must be a string, got {}", type_name(v)),
                        ))
                    }
                }
            }
            out
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "stop must be a string or an array of strings, got {}",
                    type_name(v)
                ),
            ))
        }
    };
    if let Some(i) = list.iter().position(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            format!("stop[{i}] is empty; stop strings must not be empty"),
        ));
    }
    Ok(list)
}

/// Typed lookups in a JSON object whose errors name the field.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    /// The field, `null` counting as absent.
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn string(&self, name: &str) -> Result<Option<&str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::invalid(
                name,
                format!("{name} must be a string, got {}", type_name(v)),
            )),
        }
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.bool_named(name, name)
    }

    fn bool_named(&self, name: &str, shown: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::invalid(
                shown,
                format!("{shown} must be a boolean, got {}", show(v)),
            )),
        }
    }

    /// A number in `[lo, hi]` (`(lo, hi]` when `!lo_inclusive`).
    fn number(
        &self,
        name: &str,
        lo: f64,
        hi: f64,
        lo_inclusive: bool,
    ) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let ok = |x: f64| x.is_finite() && x <= hi && (x > lo || (lo_inclusive && x == lo));
        match v.as_f64() {
            Some(x) if ok(x) => Ok(Some(x)),
            _ => {
                let range = if lo_inclusive {
                    format!("between {lo} and {hi}")
                } else {
                    format!("above {lo} and at most {hi}")
                };
                Err(ApiError::invalid(
                    name,
                    format!("{name} must be a number {range}, got {}", show(v)),
                ))
            }
        }
    }

    /// A non-negative integer in `[lo, hi]` (no upper bound when `hi` is `None`).
    /// Integral floats (`4.0`) are accepted.
    fn count(&self, name: &str, lo: usize, hi: Option<usize>) -> Result<Option<usize>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let as_int = v.as_u64().or_else(|| {
            v.as_f64()
                .filter(|x| x.fract() == 0.0 && *x >= 0.0 && *x < 1.8e19)
                .map(|x| x as u64)
        });
        let value = as_int.map(|x| usize::try_from(x).unwrap_or(usize::MAX));
        match value {
            Some(x) if x >= lo && hi.is_none_or(|h| x <= h) => Ok(Some(x)),
            _ => {
                let range = match hi {
                    Some(h) => format!("an integer between {lo} and {h}"),
                    None => format!("an integer of at least {lo}"),
                };
                Err(ApiError::invalid(
                    name,
                    format!("{name} must be {range}, got {}", show(v)),
                ))
            }
        }
    }
}

/// The JSON type of `v`, for messages.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `v` for a message: short values as JSON, long ones by type.
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 40 {
        s
    } else {
        type_name(v).to_string()
    }
}
