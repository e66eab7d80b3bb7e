//! An OpenAI-compatible HTTP server over the nx [`Engine`] (`nx serve`).
//!
//! ## Design: one engine thread, an async front
//! The model runs on one dedicated `std::thread` that owns the [`Engine`] (see
//! [`backend`]); nothing else touches it. The async side (tokio + axum) only reads,
//! validates and encodes requests, queues them on the engine thread's command channel,
//! and streams back what the engine reports. Each request gets an event channel; the
//! engine thread routes every [`nx_run::EngineEvent`] of a sequence to it, and a send
//! that fails (the client went away) cancels the sequence. A handler whose future or
//! response body is dropped cancels its sequences too. So the forward passes of every
//! client are batched by the engine's continuous batching, and no HTTP work ever waits
//! on a forward pass or the other way round.
//!
//! ## Endpoints
//! - `POST /v1/chat/completions`, `POST /v1/completions`: OpenAI's request and response
//!   shapes, streamed as server-sent events with `stream: true` (see [`params`] for the
//!   fields and their defaults, [`response`] for the shapes).
//! - `GET /v1/models`, `GET /health` (503 `loading` until the engine is ready),
//!   `POST /tokenize`, `POST /detokenize`, `GET /metrics` (Prometheus text, `nx_*`).
//!
//! Errors are OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`): 400
//! for a malformed body or field (the message names it), 404 for an unknown model or
//! route, 405 for a wrong method, 413 for a body over [`ServeConfig::max_body_bytes`],
//! 429 when the engine's queue is full, 503 while loading.
//!
//! ## Prompts
//! Chat prompts are rendered with the model's [`ChatTemplate`] and encoded exactly as
//! `nx chat` does ([`ChatTemplate::encode`]); completion prompts get BOS as the
//! vocabulary asks, with special-token texts left as plain text unless the request sets
//! `parse_special`. A list of token ids is used as given.

#![warn(missing_docs)]

pub mod backend;
pub mod error;
pub mod params;
pub mod response;
pub mod server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nx_bpe::Tokenizer;
use nx_run::{ChatTemplate, Engine, EngineConfig, Model, Speculation};
use tokio::net::TcpListener;

pub use backend::{Backend, EngineHandle, EngineStatus};
pub use error::{ApiError, ServeError};
pub use params::{Endpoint, GenParams, PromptInput};
pub use server::{router, serve, AppState};

/// Default cap on a request body: 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// How the server listens and what it serves.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// Address to listen on (`127.0.0.1`).
    pub host: String,
    /// Port (`8080`; `0` picks a free one).
    pub port: u16,
    /// The model's id in responses and `/v1/models`; requests may name it or an alias.
    pub model_id: String,
    /// Other names requests may use for the model.
    pub model_aliases: Vec<String>,
    /// Largest request body accepted (413 beyond it).
    pub max_body_bytes: usize,
    /// The engine's settings (`n_ctx` is the context every request must fit in).
    pub engine: EngineConfig,
    /// After a shutdown signal, how long running requests may go on before they are
    /// cancelled.
    pub shutdown_grace: Duration,
    /// Log one line per generation request to stderr.
    pub log_requests: bool,
    /// Speculative decoding for every request (`None`: off). Never changes an answer;
    /// a draft-model source needs an engine built with a draft model.
    pub speculation: Option<Speculation>,
}

impl Default for ServeConfig {
    /// `127.0.0.1:8080`, model id `nx`, 4 MiB bodies, the engine's defaults, 5 s of
    /// grace at shutdown, request logging on, no speculation.
    fn default() -> Self {
        ServeConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            model_id: "nx".into(),
            model_aliases: Vec::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            engine: EngineConfig::default(),
            shutdown_grace: Duration::from_secs(5),
            log_requests: true,
            speculation: None,
        }
    }
}

/// Starts the engine thread over a real [`Engine`] for `model`, with `draft` as its
/// draft model when given (the engine is created on that thread; until it is ready
/// `/health` answers 503).
pub fn spawn_engine(
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    draft: Option<Arc<Model>>,
) -> std::io::Result<EngineHandle> {
    EngineHandle::spawn(move || {
        let engine = Engine::new(model, Some(tokenizer), config).map_err(|e| e.to_string())?;
        match draft {
            Some(d) => engine
                .with_draft_model(d)
                .map_err(|e| format!("draft model: {e}")),
            None => Ok(engine),
        }
    })
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Serves `model` until SIGINT or SIGTERM (blocking): listens on `host:port`, starts the
/// engine, logs a startup line and one line per request to stderr, and on a signal stops
/// accepting, lets running requests finish (up to [`ServeConfig::shutdown_grace`]) and
/// returns `Ok`. An engine that cannot be created is an error. `draft` is the draft
/// model for [`ServeConfig::speculation`] with a draft-model source.
pub fn run(
    config: ServeConfig,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    draft: Option<Arc<Model>>,
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("nx-http")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", config.host, config.port);
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|source| ServeError::Bind {
                addr: addr.clone(),
                source,
            })?;
        let local = listener.local_addr()?;
        let weights = model.gguf().placement().name();
        let engine = spawn_engine(model, Arc::clone(&tokenizer), config.engine.clone(), draft)?;
        let engine_config = config.engine.clone();
        let model_id = config.model_id.clone();
        let state = AppState::new(config, tokenizer, template, engine);
        eprintln!(
            "nx serve: listening on http://{local} (model {model_id:?}, weights {weights}, \
             context {}, parallel {}, chat template {})",
            engine_config.n_ctx,
            engine_config.max_running,
            state_template_origin(&state),
        );
        let failed: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let watch = {
            let state = state.clone();
            let failed = Arc::clone(&failed);
            async move {
                match state.engine().wait_ready().await {
                    Ok(()) => {
                        eprintln!("nx serve: ready");
                        std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        if let Ok(mut f) = failed.lock() {
                            *f = Some(e);
                        }
                    }
                }
            }
        };
        let stop = async move {
            tokio::select! {
                _ = shutdown_signal() => eprintln!("nx serve: shutting down"),
                _ = watch => {}
            }
        };
        serve(listener, state.clone(), stop).await?;
        let engine_state = state.clone();
        let _ = tokio::task::spawn_blocking(move || engine_state.engine().shutdown()).await;
        let failure = failed.lock().ok().and_then(|f| f.clone());
        match failure {
            Some(e) => Err(ServeError::Engine(e)),
            None => Ok(()),
        }
    })
}

fn state_template_origin(state: &AppState) -> String {
    state.template_origin().to_string()
}
