//! `ApiError` (an OpenAI-shaped HTTP error) and `ServeError` (why the server could not run).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use nx_run::RunError;
use serde_json::json;

/// An error answered to a client as OpenAI does:
/// `{"error": {"message", "type", "param", "code"}}` with an HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status of the answer.
    pub status: StatusCode,
    /// What went wrong, naming the field when one is at fault.
    pub message: String,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A short machine-readable code (`model_not_found`, `context_length_exceeded`, …).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// An error with `status` and `message`, no field or code.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A 400 about request field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_string()),
            code: Some("invalid_value"),
        }
    }

    /// A 400 with no particular field.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// Sets the code.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// Sets the field.
    pub fn with_param(mut self, param: &str) -> ApiError {
        self.param = Some(param.to_string());
        self
    }

    /// 503: the engine is not (or no longer) running.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// OpenAI's error `type` for this status.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            413 => "invalid_request_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            503 => "unavailable_error",
            _ => "server_error",
        }
    }

    /// The JSON body (`{"error": {...}}`).
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// The error a failed [`nx_run::Engine::submit`] answers with: 429 for a full queue,
    /// 400 for a request the engine refuses, 500 otherwise.
    pub fn from_submit(e: &RunError) -> ApiError {
        match e {
            RunError::QueueFull { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()).with_code("queue_full")
            }
            RunError::ContextOverflow { .. } => ApiError::bad_request(e.to_string())
                .with_code("context_length_exceeded")
                .with_param("max_tokens"),
            RunError::EmptyPrompt | RunError::TokenOutOfRange { .. } => {
                ApiError::invalid("prompt", e.to_string())
            }
            RunError::SamplerConfig(_) | RunError::InvalidConfig(_) => {
                ApiError::bad_request(e.to_string()).with_code("invalid_value")
            }
            _ => ApiError::internal(e.to_string()),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for ApiError {}

/// Seconds a client told 429 (queue full) should wait before retrying: about one
/// request's worth of decoding on a small model.
pub const RETRY_AFTER_SECS: u32 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json_response(self.status, &self.body());
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(RETRY_AFTER_SECS),
            );
        }
        response
    }
}

/// A response with a JSON body and `content-type: application/json`.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Why [`crate::run`] could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// `host:port` asked for.
        addr: String,
        /// The operating system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The engine could not be created (e.g. the KV pool does not fit).
    #[error("starting the engine: {0}")]
    Engine(String),
    /// The async runtime or the server failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
