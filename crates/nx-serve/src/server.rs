//! The HTTP side: [`AppState`], the [`router`] and its handlers, streaming bodies, and
//! [`serve`] with graceful shutdown.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use nx_bpe::{EncodeOptions, Tokenizer};
use nx_run::{ChatTemplate, EngineEvent, EngineMetrics, SeqId, Usage};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::backend::{EngineHandle, EngineStatus};
use crate::error::{json_response, ApiError};
use crate::params::{self, Endpoint, GenParams, PromptInput};
use crate::response::{self, Envelope, TokenLogprob, SSE_DONE};
use crate::ServeConfig;

/// Longest a client may take to send its request body.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Everything the handlers share (cheap to clone).
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    config: ServeConfig,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    engine: EngineHandle,
    next_id: AtomicU64,
    created: u64,
    http_errors: Mutex<BTreeMap<u16, u64>>,
    http_requests: AtomicU64,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("model_id", &self.0.config.model_id)
            .field("engine", &self.0.engine)
            .finish_non_exhaustive()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl AppState {
    /// The state of a server for `config`, encoding with `tokenizer` and rendering chat
    /// prompts with `template`, generating on `engine`.
    pub fn new(
        config: ServeConfig,
        tokenizer: Arc<Tokenizer>,
        template: ChatTemplate,
        engine: EngineHandle,
    ) -> AppState {
        AppState(Arc::new(Inner {
            config,
            tokenizer,
            template,
            engine,
            next_id: AtomicU64::new(1),
            created: unix_now(),
            http_errors: Mutex::new(BTreeMap::new()),
            http_requests: AtomicU64::new(0),
        }))
    }

    /// The engine thread's handle.
    pub fn engine(&self) -> &EngineHandle {
        &self.0.engine
    }

    /// The configuration.
    pub fn config(&self) -> &ServeConfig {
        &self.0.config
    }

    /// Where the chat template came from (`the GGUF file`, `built-in gemma`, a path).
    pub fn template_origin(&self) -> &str {
        self.0.template.origin()
    }

    fn serves(&self, model: &str) -> bool {
        let c = &self.0.config;
        model == c.model_id || c.model_aliases.iter().any(|a| a == model)
    }

    fn count_status(&self, status: StatusCode) {
        self.0.http_requests.fetch_add(1, Ordering::Relaxed);
        if status.as_u16() >= 400 {
            if let Ok(mut m) = self.0.http_errors.lock() {
                *m.entry(status.as_u16()).or_insert(0) += 1;
            }
        }
    }
}

/// The routes of the server, with JSON answers for unknown routes (404) and wrong
/// methods (405), and per-status error counting for `/metrics`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}

/// Serves `router(state)` on `listener` until `shutdown` completes; then stops
/// accepting, lets running requests finish for [`ServeConfig::shutdown_grace`], cancels
/// what still runs, and returns once every connection has closed. The engine thread
/// keeps running (see [`EngineHandle::shutdown`]).
pub async fn serve<F>(listener: TcpListener, state: AppState, shutdown: F) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let app = router(state.clone());
    let grace = state.config().shutdown_grace;
    let signal = async move {
        shutdown.await;
        let st = state.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            st.engine().cancel_all();
        });
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .await
}

async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    state.count_status(status);
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if status == StatusCode::METHOD_NOT_ALLOWED && !is_json {
        let allow = response.headers().get(header::ALLOW).cloned();
        let mut r = ApiError::new(
            status,
            format!(
                "method not allowed{}",
                allow
                    .as_ref()
                    .and_then(|a| a.to_str().ok())
                    .map(|a| format!("; this route accepts {a}"))
                    .unwrap_or_default()
            ),
        )
        .with_code("method_not_allowed")
        .into_response();
        if let Some(a) = allow {
            r.headers_mut().insert(header::ALLOW, a);
        }
        return r;
    }
    response
}

async fn not_found(req: Request) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
    .with_code("not_found")
    .into_response()
}

/// Reads a request body of at most `limit` bytes (413 beyond it).
async fn read_body(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the limit of {limit} bytes"),
        )
        .with_code("request_too_large")
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(req.into_body(), limit)).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time",
        )),
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            let inner = e.into_inner();
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(inner.as_ref());
            while let Some(c) = cause {
                if c.is::<http_body_util::LengthLimitError>() {
                    return Err(too_large());
                }
                cause = c.source();
            }
            Err(ApiError::bad_request(format!(
                "reading the request body: {inner}"
            )))
        }
    }
}

async fn read_json(req: Request, limit: usize) -> Result<Value, ApiError> {
    let body = read_body(req, limit).await?;
    params::parse_json(&body)
}

async fn health(State(state): State<AppState>) -> Response {
    match state.engine().status() {
        EngineStatus::Ready => json_response(StatusCode::OK, &json!({"status": "ok"})),
        EngineStatus::Loading => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "loading"}),
        ),
        EngineStatus::Failed(e) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "error", "error": e}),
        ),
    }
}

async fn models(State(state): State<AppState>) -> Response {
    let c = state.config();
    let mut ids = vec![c.model_id.clone()];
    ids.extend(c.model_aliases.iter().cloned());
    let data: Vec<Value> = ids
        .iter()
        .map(|id| {
            json!({
                "id": id,
                "object": "model",
                "created": state.0.created,
                "owned_by": "nx",
                "meta": {
                    "n_ctx": c.engine.n_ctx,
                    "n_vocab": state.0.tokenizer.n_vocab(),
                },
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

async fn tokenize(State(state): State<AppState>, req: Request) -> Response {
    let result = async {
        let v = read_json(req, state.config().max_body_bytes).await?;
        let obj = v
            .as_object()
            .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
        let content = match obj.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(ApiError::invalid("content", "content must be a string")),
            None => return Err(ApiError::invalid("content", "content is required")),
        };
        let flag = |name: &str, default: bool| match obj.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ApiError::invalid(name, format!("{name} must be a boolean"))),
        };
        // Defaults as llama-server's /tokenize: no BOS, special-token texts parsed.
        let opts = EncodeOptions {
            add_special: flag("add_special", false)?,
            parse_special: flag("parse_special", true)?,
        };
        let tok = Arc::clone(&state.0.tokenizer);
        let ids = tokio::task::spawn_blocking(move || tok.encode(&content, opts))
            .await
            .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?
            .map_err(|e| ApiError::invalid("content", format!("content: {e}")))?;
        Ok(json_response(StatusCode::OK, &json!({"tokens": ids})))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn detokenize(State(state): State<AppState>, req: Request) -> Response {
    let result = async {
        let v = read_json(req, state.config().max_body_bytes).await?;
        let list = match v.get("tokens") {
            Some(Value::Array(a)) => a,
            Some(_) => {
                return Err(ApiError::invalid(
                    "tokens",
                    "tokens must be an array of token ids",
                ))
            }
            None => return Err(ApiError::invalid("tokens", "tokens is required")),
        };
        let n_vocab = state.0.tokenizer.n_vocab();
        let mut ids = Vec::with_capacity(list.len());
        for (i, t) in list.iter().enumerate() {
            match t.as_u64() {
                Some(id) if (id as usize) < n_vocab => ids.push(id as u32),
                _ => {
                    return Err(ApiError::invalid(
                        "tokens",
                        format!("tokens[{i}] ({t}) is not a token id below {n_vocab}"),
                    ))
                }
            }
        }
        let bytes = state
            .0
            .tokenizer
            .decode(&ids)
            .map_err(|e| ApiError::invalid("tokens", format!("tokens: {e}")))?;
        Ok(json_response(
            StatusCode::OK,
            &json!({"content": String::from_utf8_lossy(&bytes)}),
        ))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = render_metrics(&state);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

/// `/metrics` in the Prometheus text format.
fn render_metrics(state: &AppState) -> String {
    use std::fmt::Write;
    let http_requests = state.0.http_requests.load(Ordering::Relaxed);
    let metrics = metric_table(&state.engine().metrics(), http_requests);
    let mut out = String::new();
    for (name, kind, help, value) in metrics {
        let kind = match kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
        };
        let _ = writeln!(out, "# HELP nx_{name} {help}");
        let _ = writeln!(out, "# TYPE nx_{name} {kind}");
        let _ = writeln!(out, "nx_{name} {value}");
    }
    let _ = writeln!(
        out,
        "# HELP nx_http_errors_total HTTP error responses by status."
    );
    let _ = writeln!(out, "# TYPE nx_http_errors_total counter");
    if let Ok(errors) = state.0.http_errors.lock() {
        for (status, n) in errors.iter() {
            let _ = writeln!(out, "nx_http_errors_total{{status=\"{status}\"}} {n}");
        }
    }
    out
}

/// A Prometheus metric type.
#[derive(Clone, Copy)]
enum MetricKind {
    Counter,
    Gauge,
}

/// Every plain metric of `/metrics`: (name without the `nx_` prefix, type, help, value).
fn metric_table(
    m: &EngineMetrics,
    http_requests: u64,
) -> [(&'static str, MetricKind, &'static str, u64); 17] {
    [
        (
            "requests_total",
            MetricKind::Counter,
            "Requests submitted to the engine.",
            m.requests_total,
        ),
        (
            "prompt_tokens_total",
            MetricKind::Counter,
            "Prompt tokens submitted.",
            m.prompt_tokens_total,
        ),
        (
            "generated_tokens_total",
            MetricKind::Counter,
            "Tokens generated.",
            m.generated_tokens_total,
        ),
        (
            "prefix_cache_hit_tokens_total",
            MetricKind::Counter,
            "Prompt tokens served from the prefix cache.",
            m.prefix_hit_tokens_total,
        ),
        (
            "preemptions_total",
            MetricKind::Counter,
            "Sequences preempted and recomputed.",
            m.preemptions_total,
        ),
        (
            "steps_total",
            MetricKind::Counter,
            "Engine forward steps.",
            m.steps_total,
        ),
        (
            "drafted_tokens_total",
            MetricKind::Counter,
            "Draft tokens verified (speculative decoding).",
            m.drafted_tokens_total,
        ),
        (
            "accepted_tokens_total",
            MetricKind::Counter,
            "Draft tokens accepted (speculative decoding).",
            m.accepted_tokens_total,
        ),
        (
            "draft_model_tokens_total",
            MetricKind::Counter,
            "Tokens the draft model read (prompt chunks, catching up, guessing).",
            m.draft_model_tokens_total,
        ),
        (
            "requests_waiting",
            MetricKind::Gauge,
            "Requests waiting for admission.",
            m.waiting as u64,
        ),
        (
            "requests_running",
            MetricKind::Gauge,
            "Sequences admitted (prefilling or decoding).",
            m.running as u64,
        ),
        (
            "kv_blocks_used",
            MetricKind::Gauge,
            "KV blocks referenced by sequences.",
            m.kv_blocks_used as u64,
        ),
        (
            "kv_blocks_free",
            MetricKind::Gauge,
            "KV blocks free or held only by the prefix cache.",
            m.kv_blocks_free as u64,
        ),
        (
            "kv_blocks_total",
            MetricKind::Gauge,
            "KV blocks in the pool.",
            m.kv_blocks_total as u64,
        ),
        (
            "batch_tokens",
            MetricKind::Gauge,
            "Rows of the last step's forward pass.",
            m.last_batch_tokens as u64,
        ),
        (
            "batch_sequences",
            MetricKind::Gauge,
            "Sequences in the last step's forward pass.",
            m.last_batch_seqs as u64,
        ),
        (
            "http_requests_total",
            MetricKind::Counter,
            "HTTP requests answered.",
            http_requests,
        ),
    ]
}

async fn chat_completions(State(state): State<AppState>, req: Request) -> Response {
    generate(state, Endpoint::Chat, req)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(state): State<AppState>, req: Request) -> Response {
    generate(state, Endpoint::Completion, req)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The prompt ids of `params`: the chat template for messages, the tokenizer (BOS as the
/// vocabulary asks) for a text, ids as given.
fn encode_prompt(state: &AppState, params: &GenParams) -> Result<Vec<u32>, ApiError> {
    let tok = &state.0.tokenizer;
    match &params.prompt {
        PromptInput::Messages(messages) => state
            .0
            .template
            .encode(tok, messages, true)
            .map_err(|e| ApiError::invalid("messages", format!("messages: {e}"))),
        PromptInput::Text(text) => tok
            .encode(
                text,
                EncodeOptions {
                    add_special: true,
                    parse_special: params.parse_special,
                },
            )
            .map_err(|e| ApiError::invalid("prompt", format!("prompt: {e}"))),
        PromptInput::Ids(ids) => Ok(ids.clone()),
    }
}

async fn generate(state: AppState, endpoint: Endpoint, req: Request) -> Result<Response, ApiError> {
    let body = read_body(req, state.config().max_body_bytes).await?;
    let params = params::parse_body(endpoint, &body)?;
    if let Some(m) = &params.model {
        if !state.serves(m) {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model {m:?} does not exist; this server serves {:?}",
                    state.config().model_id
                ),
            )
            .with_param("model")
            .with_code("model_not_found"));
        }
    }
    match state.engine().status() {
        EngineStatus::Ready => {}
        EngineStatus::Loading => return Err(ApiError::unavailable("the model is still loading")),
        EngineStatus::Failed(e) => {
            return Err(ApiError::unavailable(format!(
                "the engine is not running: {e}"
            )))
        }
    }
    let (st, p) = (state.clone(), params.clone());
    let prompt = tokio::task::spawn_blocking(move || encode_prompt(&st, &p))
        .await
        .map_err(|e| ApiError::internal(format!("encoding the prompt failed: {e}")))??;
    let mut requests = params::build_requests(
        &params,
        &prompt,
        state.config().engine.n_ctx,
        state.0.tokenizer.n_vocab(),
    )?;
    for r in &mut requests {
        r.speculation = params.speculation.resolve(state.config().speculation);
    }
    let id = format!(
        "{}-{}",
        endpoint.id_prefix(),
        state.0.next_id.fetch_add(1, Ordering::Relaxed)
    );
    let envelope = Envelope {
        id,
        created: unix_now(),
        model: state.config().model_id.clone(),
        endpoint,
    };
    let (tx, rx) = unbounded_channel();
    let mut generation = Generation::new(state.clone(), envelope, &params, prompt.len());
    for request in requests {
        // A refusal drops `generation`, which cancels the choices already queued.
        let seq = state.engine().submit(request, tx.clone()).await?;
        generation.add_choice(seq);
    }
    drop(tx);
    if params.stream {
        let stream = EventStream {
            rx,
            generation,
            pending: VecDeque::new(),
            finished: false,
        };
        let mut response = Response::new(Body::from_stream(stream));
        let h = response.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        Ok(response)
    } else {
        collect(rx, generation).await
    }
}

/// One choice of a request as its events arrive.
#[derive(Default)]
struct ChoiceState {
    seq: SeqId,
    text: String,
    tokens: Vec<TokenLogprob>,
    finish: Option<&'static str>,
    usage: Option<Usage>,
    error: Option<String>,
    sent_role: bool,
    /// Bytes of text already streamed (completion log-probability offsets).
    streamed_bytes: usize,
    /// Tokens received so far (the log line's count for a choice that never finished).
    received_tokens: usize,
    /// Milliseconds from the request's start to this choice's first token, as the server
    /// saw it (the log line's time to first token for a choice that never finished).
    first_token_ms: Option<f64>,
}

impl ChoiceState {
    fn ended(&self) -> bool {
        self.finish.is_some() || self.error.is_some()
    }
}

/// A request's choices; dropping it cancels those still running and logs the request.
struct Generation {
    state: AppState,
    envelope: Envelope,
    choices: Vec<ChoiceState>,
    index_of: HashMap<SeqId, usize>,
    prompt_tokens: usize,
    logprobs: Option<usize>,
    include_usage: bool,
    start: Instant,
}

impl Generation {
    fn new(
        state: AppState,
        envelope: Envelope,
        params: &GenParams,
        prompt_tokens: usize,
    ) -> Generation {
        Generation {
            state,
            envelope,
            choices: Vec::with_capacity(params.n),
            index_of: HashMap::new(),
            prompt_tokens,
            logprobs: params.logprobs,
            include_usage: params.include_usage,
            start: Instant::now(),
        }
    }

    fn add_choice(&mut self, seq: SeqId) {
        self.index_of.insert(seq, self.choices.len());
        self.choices.push(ChoiceState {
            seq,
            ..ChoiceState::default()
        });
    }

    fn all_ended(&self) -> bool {
        self.choices.iter().all(ChoiceState::ended)
    }

    /// The channel closed with choices unfinished (cancelled at shutdown, or the engine
    /// stopped).
    /// Returns the message given to them.
    fn close(&mut self) -> String {
        let message = match self.state.engine().status() {
            EngineStatus::Failed(e) => format!("the engine stopped: {e}"),
            _ => "the generation was cancelled (the server is shutting down)".to_string(),
        };
        for c in &mut self.choices {
            if !c.ended() {
                c.error = Some(message.clone());
            }
        }
        message
    }

    /// Records `event`; returns the choice index and what the stream should send.
    fn absorb(&mut self, event: EngineEvent) -> Option<(usize, Update)> {
        let seq = match &event {
            EngineEvent::Token { seq, .. }
            | EngineEvent::Done { seq, .. }
            | EngineEvent::Failed { seq, .. } => *seq,
            // The server never asks the engine to score prompts.
            EngineEvent::PromptScores { .. } => return None,
        };
        let index = *self.index_of.get(&seq)?;
        let want_logprobs = self.logprobs.is_some();
        let c = &mut self.choices[index];
        match event {
            EngineEvent::Token {
                id,
                text,
                logprob,
                top,
                ..
            } => {
                c.text.push_str(&text);
                c.received_tokens += 1;
                if c.first_token_ms.is_none() {
                    c.first_token_ms = Some(self.start.elapsed().as_secs_f64() * 1e3);
                }
                let lp = want_logprobs.then_some(TokenLogprob { id, logprob, top });
                if let Some(lp) = &lp {
                    c.tokens.push(lp.clone());
                }
                Some((index, Update::Token { text, logprob: lp }))
            }
            EngineEvent::Done {
                reason,
                usage,
                flushed,
                ..
            } => {
                c.text.push_str(&flushed);
                let finish = response::finish_reason(reason);
                c.finish = Some(finish);
                c.usage = Some(usage);
                Some((index, Update::Done { flushed, finish }))
            }
            EngineEvent::Failed { error, .. } => {
                c.error = Some(error.clone());
                Some((index, Update::Failed(error)))
            }
            EngineEvent::PromptScores { .. } => None,
        }
    }

    fn usage(&self) -> Value {
        let usages: Vec<Usage> = self.choices.iter().filter_map(|c| c.usage).collect();
        response::combined_usage(self.prompt_tokens, &usages)
    }

    fn logprobs_value(&self, tokens: &[TokenLogprob], first_offset: usize) -> Value {
        let tok = &self.state.0.tokenizer;
        match (self.logprobs, self.envelope.endpoint) {
            (None, _) => Value::Null,
            (Some(_), Endpoint::Chat) => response::chat_logprobs(tok, tokens),
            (Some(k), Endpoint::Completion) => {
                response::completion_logprobs(tok, tokens, k, first_offset)
            }
        }
    }

    /// The stream events for one update of choice `index`.
    fn stream_update(&mut self, index: usize, update: Update, out: &mut VecDeque<String>) {
        let env = &self.envelope;
        let include_usage = self.include_usage;
        let chat = env.endpoint == Endpoint::Chat;
        match update {
            Update::Token { text, logprob } => {
                if text.is_empty() && logprob.is_none() {
                    return;
                }
                let offset = self.choices[index].streamed_bytes;
                let lp = match &logprob {
                    Some(t) => self.logprobs_value(std::slice::from_ref(t), offset),
                    None => Value::Null,
                };
                let c = &mut self.choices[index];
                let first = chat && !c.sent_role;
                c.sent_role = true;
                c.streamed_bytes += text.len();
                let chunk = self
                    .envelope
                    .chunk(index, Some(&text), first, lp, None, include_usage);
                out.push_back(response::sse_data(&chunk));
            }
            Update::Done { flushed, finish } => {
                let c = &mut self.choices[index];
                let first = chat && !c.sent_role;
                c.sent_role = true;
                if !flushed.is_empty() || first {
                    c.streamed_bytes += flushed.len();
                    let chunk = env.chunk(
                        index,
                        Some(&flushed),
                        first,
                        Value::Null,
                        None,
                        include_usage,
                    );
                    out.push_back(response::sse_data(&chunk));
                }
                let text = if chat { None } else { Some("") };
                let chunk = env.chunk(index, text, false, Value::Null, Some(finish), include_usage);
                out.push_back(response::sse_data(&chunk));
            }
            Update::Failed(error) => {
                out.push_back(response::sse_data(&stream_error(&error)));
            }
        }
    }

    fn finish_stream(&self, out: &mut VecDeque<String>) {
        if self.include_usage {
            out.push_back(response::sse_data(&self.envelope.usage_chunk(self.usage())));
        }
        out.push_back(SSE_DONE.to_string());
    }

    /// The non-streamed answer.
    fn full_response(&self) -> Result<Response, ApiError> {
        if let Some(e) = self.choices.iter().find_map(|c| c.error.clone()) {
            return Err(
                if e.contains("shutting down") || e.starts_with("the engine stopped") {
                    ApiError::unavailable(e)
                } else {
                    ApiError::internal(e)
                },
            );
        }
        let choices: Vec<Value> = self
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                self.envelope.choice(
                    i,
                    &c.text,
                    self.logprobs_value(&c.tokens, 0),
                    c.finish.unwrap_or("stop"),
                )
            })
            .collect();
        Ok(json_response(
            StatusCode::OK,
            &self.envelope.full(choices, self.usage()),
        ))
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        for c in &self.choices {
            if !c.ended() {
                self.state.engine().cancel(c.seq);
            }
        }
        if !self.state.config().log_requests || self.choices.is_empty() {
            return;
        }
        let usages: Vec<Usage> = self.choices.iter().filter_map(|c| c.usage).collect();
        let generated: usize = self
            .choices
            .iter()
            .map(|c| c.usage.map_or(c.received_tokens, |u| u.generated_tokens))
            .sum();
        let cached = usages
            .iter()
            .map(|u| u.cached_prompt_tokens)
            .min()
            .unwrap_or(0);
        let ttft =
            first_token_ms(&self.choices).map_or("none".to_string(), |ms| format!("{ms:.1}"));
        let finish: Vec<&str> = self
            .choices
            .iter()
            .map(|c| match (c.finish, &c.error) {
                (Some(f), _) => f,
                (None, Some(_)) => "error",
                (None, None) => "cancelled",
            })
            .collect();
        eprintln!(
            "{} prompt_tokens={} cached_tokens={} generated_tokens={} ttft_ms={} \
             total_ms={:.1} finish={}",
            self.envelope.id,
            self.prompt_tokens,
            cached,
            generated,
            ttft,
            self.start.elapsed().as_secs_f64() * 1000.0,
            finish.join(",")
        );
    }
}

/// The request's time to first token in milliseconds: the earliest over its choices, `None`
/// when no choice produced a token.
///
/// A finished choice reports the engine's own time; one cancelled before it finished (its
/// client went away) has only the time its first token reached the server.
fn first_token_ms(choices: &[ChoiceState]) -> Option<f64> {
    choices
        .iter()
        .filter_map(|c| {
            c.usage
                .filter(|u| u.generated_tokens > 0)
                .map(|u| u.ttft_ms)
                .or(c.first_token_ms)
        })
        .reduce(f64::min)
}

/// What one event changes for its choice.
enum Update {
    Token {
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done {
        flushed: String,
        finish: &'static str,
    },
    Failed(String),
}

fn stream_error(message: &str) -> Value {
    json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}})
}

async fn collect(
    mut rx: UnboundedReceiver<EngineEvent>,
    mut generation: Generation,
) -> Result<Response, ApiError> {
    while !generation.all_ended() {
        match rx.recv().await {
            Some(event) => {
                generation.absorb(event);
            }
            None => {
                generation.close();
            }
        }
    }
    generation.full_response()
}

/// The SSE body of a streamed request. Dropping it (the client went away) drops the
/// [`Generation`], which cancels the choices still running.
struct EventStream {
    rx: UnboundedReceiver<EngineEvent>,
    generation: Generation,
    pending: VecDeque<String>,
    finished: bool,
}

impl futures_core::Stream for EventStream {
    type Item = Result<String, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(s) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(s)));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            if this.generation.all_ended() {
                this.generation.finish_stream(&mut this.pending);
                this.finished = true;
                continue;
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(event)) => {
                    if let Some((index, update)) = this.generation.absorb(event) {
                        this.generation
                            .stream_update(index, update, &mut this.pending);
                    }
                }
                Poll::Ready(None) => {
                    let message = this.generation.close();
                    this.pending
                        .push_back(response::sse_data(&stream_error(&message)));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_to_first_token_of_finished_and_cancelled_choices() {
        let finished = |ttft_ms, generated_tokens| ChoiceState {
            usage: Some(Usage {
                ttft_ms,
                generated_tokens,
                ..Usage::default()
            }),
            ..ChoiceState::default()
        };
        let cancelled = |first| ChoiceState {
            first_token_ms: first,
            ..ChoiceState::default()
        };
        assert_eq!(first_token_ms(&[]), None);
        // Cancelled before any token: no time, not 0.
        assert_eq!(first_token_ms(&[cancelled(None)]), None);
        // Cancelled mid-stream: the server's arrival time.
        assert_eq!(first_token_ms(&[cancelled(Some(42.5))]), Some(42.5));
        // The engine's time wins for a finished choice; the earliest choice counts.
        let mut both = finished(30.0, 4);
        both.first_token_ms = Some(31.0);
        assert_eq!(first_token_ms(&[cancelled(Some(50.0)), both]), Some(30.0));
        // A finished choice that generated nothing reports no time.
        assert_eq!(first_token_ms(&[finished(0.0, 0)]), None);
    }
}
