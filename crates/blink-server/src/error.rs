//! API errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`.
//!
//! Every handler returns `Result<_, ApiError>`; the status code and the error's `type` follow
//! what OpenAI's own API (and so its client libraries) use for the same situation.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error response.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Close the connection after answering (the request body was not read to its end).
    pub close: bool,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None, close: false }
    }

    /// 400: a request the server cannot accept as written.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending parameter.
    pub fn param(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param), ..ApiError::invalid(message) }
    }

    /// 400 `context_length_exceeded`.
    pub fn context_length(param: Option<&'static str>, message: impl Into<String>) -> ApiError {
        ApiError { code: Some("context_length_exceeded"), param, ..ApiError::invalid(message) }
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "invalid or missing API key")
        }
    }

    /// 404 for a model this server does not serve.
    pub fn model_not_found(name: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model"),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model '{name}' does not exist; this server serves '{served}' and the adapters /v1/models lists"),
            )
        }
    }

    /// 404 for an adapter name this server does not serve (vLLM's unload of an unknown name).
    pub fn adapter_not_found(name: &str) -> ApiError {
        ApiError {
            param: Some("lora_name"),
            code: Some("model_not_found"),
            ..ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", format!("no adapter named '{name}' is loaded"))
        }
    }

    /// 403 for something this server was not started to allow.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError { code: Some("permission_denied"), ..ApiError::new(StatusCode::FORBIDDEN, "invalid_request_error", message) }
    }

    /// 409 for a request the resource's state forbids (pausing a finished job).
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError { code: Some("conflict"), ..ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message) }
    }

    /// 404 for an unknown path.
    pub fn no_route(method: &str, path: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", format!("no such endpoint: {method} {path}"))
    }

    /// 405 for a known path with the wrong method.
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "method not allowed for this endpoint")
    }

    /// 413 for a body over the size cap.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            close: true,
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body is larger than the limit of {limit} bytes"),
            )
        }
    }

    /// 408 for a body that did not arrive in time.
    pub fn body_timeout() -> ApiError {
        ApiError {
            close: true,
            ..ApiError::new(StatusCode::REQUEST_TIMEOUT, "invalid_request_error", "the request body did not arrive in time")
        }
    }

    /// 503 while the model is still loading.
    pub fn loading() -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "the model is still loading")
    }

    /// 503 when the engine's queue is full.
    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError { code: Some("server_busy"), ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message) }
    }

    /// 500 for a failure inside the server or engine.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body: `{"error": {...}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut resp = (self.status, body).into_response();
        let headers = resp.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

impl From<blink_train::store::StoreError> for ApiError {
    fn from(e: blink_train::store::StoreError) -> ApiError {
        use blink_train::store::StoreError;
        match e {
            StoreError::Conflict(_) => ApiError::invalid(e.to_string()),
            StoreError::NotFound { .. } => ApiError { code: Some("not_found"), ..ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", e.to_string()) },
            StoreError::Invalid(_) => ApiError::param("purpose", e.to_string()),
            StoreError::BadData(_) => ApiError { code: Some("invalid_file"), ..ApiError::param("file", e.to_string()) },
            StoreError::NoSpace(_) => ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "server_error", e.to_string()),
            StoreError::Io { .. } => ApiError::internal(e.to_string()),
        }
    }
}

impl From<blink_engine::serve::SubmitError> for ApiError {
    fn from(e: blink_engine::serve::SubmitError) -> ApiError {
        use blink_engine::serve::SubmitError;
        match e {
            SubmitError::QueueFull(_) => ApiError::busy(e.to_string()),
            SubmitError::TooLarge { .. } => ApiError::context_length(None, e.to_string()),
            SubmitError::Invalid(_) => ApiError::invalid(e.to_string()),
            SubmitError::Stopped => ApiError::internal(e.to_string()),
        }
    }
}
