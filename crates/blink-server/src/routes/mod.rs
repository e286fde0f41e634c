//! The router: endpoints, the API-key check, CORS, and per-request metrics.

mod chat;
mod completions;
mod files;
mod jobs;
mod lora;
mod misc;
mod stream;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use serde_json::Value;

use crate::error::ApiError;
use crate::state::App;

/// Every endpoint.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/", get(misc::index))
        .route("/health", get(misc::health))
        .route("/metrics", get(misc::metrics))
        .route("/v1/models", get(misc::models))
        .route("/v1/models/{id}", get(misc::model))
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/completions", post(completions::completions))
        // Without the `/v1` prefix too, as llama.cpp's server has them, for clients whose
        // base URL lacks it.
        .route("/models", get(misc::models))
        .route("/chat/completions", post(chat::chat))
        .route("/completions", post(completions::completions))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route("/v1/load_lora_adapter", post(lora::load))
        .route("/v1/unload_lora_adapter", post(lora::unload))
        .route("/lora-adapters", get(lora::list).post(lora::set_scales))
        // Uploads are read under --max-upload-bytes by the handler itself.
        .route("/v1/files", get(files::list).post(files::create).layer(DefaultBodyLimit::disable()))
        .route("/v1/files/{id}", get(files::retrieve).delete(files::delete))
        .route("/v1/files/{id}/content", get(files::content))
        .route("/v1/fine_tuning/jobs", get(jobs::list).post(jobs::create))
        .route("/v1/fine_tuning/jobs/{id}", get(jobs::retrieve))
        .route("/v1/fine_tuning/jobs/{id}/events", get(jobs::events))
        .route("/v1/fine_tuning/jobs/{id}/checkpoints", get(jobs::checkpoints))
        .route("/v1/fine_tuning/jobs/{id}/cancel", post(jobs::cancel))
        .route("/v1/fine_tuning/jobs/{id}/pause", post(jobs::pause))
        .route("/v1/fine_tuning/jobs/{id}/resume", post(jobs::resume))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

/// The metrics label of a path (unknown paths share one label).
fn endpoint(path: &str) -> &'static str {
    match path {
        "/" => "/",
        "/health" => "/health",
        "/metrics" => "/metrics",
        "/v1/models" | "/models" => "/v1/models",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        "/v1/chat/completions" | "/chat/completions" => "/v1/chat/completions",
        "/v1/completions" | "/completions" => "/v1/completions",
        "/tokenize" => "/tokenize",
        "/detokenize" => "/detokenize",
        "/v1/load_lora_adapter" => "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter" => "/v1/unload_lora_adapter",
        "/lora-adapters" => "/lora-adapters",
        "/v1/files" => "/v1/files",
        p if p.starts_with("/v1/files/") && p.ends_with("/content") => "/v1/files/{id}/content",
        p if p.starts_with("/v1/files/") => "/v1/files/{id}",
        "/v1/fine_tuning/jobs" => "/v1/fine_tuning/jobs",
        p if p.starts_with("/v1/fine_tuning/jobs/") => job_endpoint(p),
        _ => "other",
    }
}

/// The label of a path under `/v1/fine_tuning/jobs/`.
fn job_endpoint(path: &str) -> &'static str {
    let rest = &path["/v1/fine_tuning/jobs/".len()..];
    match rest.split_once('/').map(|(_, action)| action) {
        None => "/v1/fine_tuning/jobs/{id}",
        Some("events") => "/v1/fine_tuning/jobs/{id}/events",
        Some("checkpoints") => "/v1/fine_tuning/jobs/{id}/checkpoints",
        Some("cancel") => "/v1/fine_tuning/jobs/{id}/cancel",
        Some("pause") => "/v1/fine_tuning/jobs/{id}/pause",
        Some("resume") => "/v1/fine_tuning/jobs/{id}/resume",
        Some(_) => "other",
    }
}

/// Answer browsers' CORS preflights, check the API key (all but `/health` and the page need
/// it), let pages on any origin read the answer (as llama.cpp's and vLLM's servers do), and
/// count the request.
async fn guard(State(app): State<App>, req: Request, next: Next) -> Response {
    let label = endpoint(req.uri().path());
    let mut count = Count { app: app.clone(), label, status: CLIENT_CLOSED };
    let open = matches!(label, "/health" | "/");
    let mut resp = if req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        // A preflight never carries the key.
        preflight(req.headers())
    } else {
        match &app.opts.api_key {
            Some(key) if !open && !authorized(req.headers(), key) => ApiError::unauthorized().into_response(),
            _ => next.run(req).await,
        }
    };
    resp.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    count.status = resp.status().as_u16();
    resp
}

/// The status counted for a request whose client left before the answer (nginx's 499).
const CLIENT_CLOSED: u16 = 499;

/// Counts one request when dropped: with its answer's status, or as [`CLIENT_CLOSED`] when
/// the client went away and the handler was dropped mid-way.
struct Count {
    app: App,
    label: &'static str,
    status: u16,
}

impl Drop for Count {
    fn drop(&mut self) {
        self.app.metrics.request(self.label, self.status);
    }
}

/// 204 allowing the methods and the headers the preflight asks for.
fn preflight(headers: &HeaderMap) -> Response {
    let asked = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
    let mut resp = axum::http::StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.unwrap_or(HeaderValue::from_static("authorization, content-type")));
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("86400"));
    resp
}

/// Whether `Authorization: Bearer KEY` carries `key` (compared in constant time).
fn authorized(headers: &HeaderMap, key: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
    else {
        return false;
    };
    let (a, b) = (given.trim().as_bytes(), key.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A JSON response.
pub(crate) fn json_response(v: &Value) -> Response {
    let mut r = Response::new(axum::body::Body::from(v.to_string()));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::endpoint;

    #[test]
    fn job_paths_have_their_own_labels() {
        assert_eq!(endpoint("/v1/fine_tuning/jobs"), "/v1/fine_tuning/jobs");
        assert_eq!(endpoint("/v1/fine_tuning/jobs/ftjob-1"), "/v1/fine_tuning/jobs/{id}");
        for action in ["events", "checkpoints", "cancel", "pause", "resume"] {
            assert_eq!(endpoint(&format!("/v1/fine_tuning/jobs/ftjob-1/{action}")), format!("/v1/fine_tuning/jobs/{{id}}/{action}"));
        }
        assert_eq!(endpoint("/v1/fine_tuning/jobs/ftjob-1/explode"), "other");
        assert_eq!(endpoint("/v1/fine_tuning/jobs/ftjob-1/events/x"), "other");
    }
}
