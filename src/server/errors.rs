//! Errors as each API spells them: Ollama's `{"error": "…"}`, OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` and A1111's
//! `{"error", "detail", "body", "errors"}`, with the HTTP status that goes with them.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which API a request came through, and so the shape of its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Ollama,
    OpenAi,
    /// AUTOMATIC1111's web UI API, under `/sdapi/v1/`.
    A1111,
}

impl Api {
    /// The API a path belongs to: OpenAI's live under `/v1/`.
    pub fn of_path(path: &str) -> Api {
        if path == "/v1" || path.starts_with("/v1/") {
            Api::OpenAi
        } else if path == "/sdapi"
            || path.starts_with("/sdapi/")
            || path.starts_with("/controlnet/")
        {
            Api::A1111
        } else {
            Api::Ollama
        }
    }
}

/// An error answer: one line saying what was wrong and what to do.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub api: Api,
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault (OpenAI's `param`), when one is.
    pub param: Option<&'static str>,
    /// Seconds after which the request may succeed (`Retry-After`), for a busy server.
    pub retry_after: Option<u32>,
}

/// The most bytes of an error message an answer carries: a message quotes what it refuses, and
/// a client that sent megabytes gets a line back, not its megabytes.
pub const MAX_MESSAGE_BYTES: usize = 1000;

impl ApiError {
    pub fn new(api: Api, status: StatusCode, message: impl Into<String>) -> ApiError {
        let message = crate::shown::escape_controls(&message.into());
        ApiError {
            api,
            status,
            message: crate::shown::cut(&message, MAX_MESSAGE_BYTES),
            param: None,
            retry_after: None,
        }
    }

    pub fn bad_request(api: Api, message: impl Into<String>) -> ApiError {
        ApiError::new(api, StatusCode::BAD_REQUEST, message)
    }

    pub fn with_param(mut self, param: &'static str) -> ApiError {
        self.param = Some(param);
        self
    }

    pub fn with_retry_after(mut self, seconds: u32) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    /// OpenAI's error `type` for a status.
    fn openai_type(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::SERVICE_UNAVAILABLE => "server_overloaded",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.api {
            Api::Ollama => json!({ "error": self.message }),
            Api::OpenAi => json!({
                "error": {
                    "message": self.message,
                    "type": self.openai_type(),
                    "param": self.param,
                    "code": null,
                }
            }),
            // Clients show `detail`, as FastAPI gives it; `error` names the kind, as A1111's
            // own handler does.
            Api::A1111 => json!({
                "error": self.status.canonical_reason().unwrap_or("error"),
                "detail": self.message,
                "body": "",
                "errors": self.message,
            }),
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}
