//! The small endpoints: health, models, tokenize/detokenize, metrics and the chat page.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde_json::{json, Value};

use super::json_response;
use crate::body::read_json;
use crate::error::ApiError;
use crate::openai::fields::{wrong_type, Fields};
use crate::adapters::AdapterInfo;
use crate::state::{App, Ready};

/// The web chat page.
const INDEX_HTML: &str = include_str!("../web/index.html");

pub async fn index() -> Html<&'static str> {
    Html(INDEX_HTML)
}

/// 200 `{"status": "ok"}` once the model is loaded, 503 `{"status": "loading"}` before, and
/// 503 `{"status": "error"}` if the engine thread has stopped (a bug: requests then fail)
/// or the ring it runs on is down (until the head joins a ring again), with the reason.
pub async fn health(State(app): State<App>) -> Response {
    let (status, body) = match app.try_ready() {
        Some(ready) if ready.engine.is_running() => match ready.engine.remote_health() {
            Ok(()) => (StatusCode::OK, json!({"status": "ok"})),
            Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "error", "error": format!("the ring is down: {reason}")})),
        },
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "error", "error": "the engine has stopped"})),
        None => (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "loading"})),
    };
    let mut r = json_response(&body).into_response();
    *r.status_mut() = status;
    r
}

fn model_entry(ready: &Ready) -> Value {
    let cfg = ready.engine.config();
    json!({
        "id": ready.model_id,
        "object": "model",
        "created": ready.created,
        "owned_by": "blink",
        "meta": {
            "n_ctx": cfg.max_seq_len,
            "n_vocab": ready.tokenizer.vocab_size(),
            "kv_tokens": cfg.kv_tokens,
            "max_running": cfg.max_running,
        },
    })
}

/// An adapter as vLLM lists it: its name, `parent` the base model, `root` its path.
fn adapter_entry(ready: &Ready, a: &AdapterInfo) -> Value {
    json!({
        "id": a.name,
        "object": "model",
        "created": a.created,
        "owned_by": "blink",
        "root": a.path.display().to_string(),
        "parent": ready.model_id,
        "meta": {"lora_id": a.id, "rank": a.rank, "alpha": a.alpha, "resident": a.resident},
    })
}

/// The base model, then every adapter.
pub async fn models(State(app): State<App>) -> Result<Response, ApiError> {
    let ready = app.ready()?;
    let data: Vec<Value> = std::iter::once(model_entry(&ready)).chain(ready.adapters.list().iter().map(|a| adapter_entry(&ready, a))).collect();
    Ok(json_response(&json!({"object": "list", "data": data})).into_response())
}

pub async fn model(State(app): State<App>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let ready = app.ready()?;
    if ready.is_base(Some(&id)) {
        return Ok(json_response(&model_entry(&ready)).into_response());
    }
    match ready.adapters.list().iter().find(|a| a.name == id) {
        Some(a) => Ok(json_response(&adapter_entry(&ready, a)).into_response()),
        None => Err(ApiError::model_not_found(&id, &ready.model_id)),
    }
}

/// `{"content": TEXT, "add_special": bool, "parse_special": bool, "with_pieces": bool}` →
/// `{"tokens": [...]}`: ids, or with `with_pieces` (as llama.cpp's server) objects
/// `{"id", "piece"}` whose piece is its text, or its bytes when they are not UTF-8.
pub async fn tokenize(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let ready = app.ready()?;
    let map = read_json(body, app.opts.max_body, app.opts.body_timeout).await?;
    let f = Fields(&map);
    let content = f.str("content")?.ok_or_else(|| ApiError::param("content", "content is required"))?;
    let add_special = f.bool("add_special")?.unwrap_or(false);
    let parse_special = f.bool("parse_special")?.unwrap_or(true);
    let with_pieces = f.bool("with_pieces")?.unwrap_or(false);
    let tokens = ready.tokenizer.encode(content, add_special, parse_special);
    if !with_pieces {
        return Ok(json_response(&json!({"tokens": tokens})).into_response());
    }
    let pieces: Vec<Value> = tokens
        .iter()
        .map(|&id| {
            let bytes = ready.tokenizer.token_bytes(id, true);
            let piece = match std::str::from_utf8(&bytes) {
                Ok(text) => json!(text),
                Err(_) => json!(bytes.as_ref()),
            };
            json!({"id": id, "piece": piece})
        })
        .collect();
    Ok(json_response(&json!({"tokens": pieces})).into_response())
}

/// `{"tokens": [...]}` → `{"content": TEXT}`, special tokens written out (as llama.cpp's
/// server).
pub async fn detokenize(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let ready = app.ready()?;
    let map = read_json(body, app.opts.max_body, app.opts.body_timeout).await?;
    let f = Fields(&map);
    let items = match f.get("tokens") {
        None => return Err(ApiError::param("tokens", "tokens is required")),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(wrong_type("tokens", "an array of token ids", other)),
    };
    let vocab = ready.tokenizer.vocab_size();
    let mut ids = Vec::with_capacity(items.len());
    for v in items {
        match v.as_u64().and_then(|n| u32::try_from(n).ok()).filter(|&n| (n as usize) < vocab) {
            Some(id) => ids.push(id),
            None => return Err(ApiError::param("tokens", format!("tokens must be ids below the vocabulary size {vocab}, got {v}"))),
        }
    }
    let content = ready.tokenizer.decode(&ids, true);
    Ok(json_response(&json!({"content": content})).into_response())
}

/// Prometheus text exposition.
pub async fn metrics(State(app): State<App>) -> Response {
    let stats = app.try_ready().map(|r| (r.engine.stats(), r.adapters.stats()));
    let mut text = app.metrics.render(stats.as_ref().map(|(e, _)| e), stats.as_ref().map(|(_, a)| a));
    if let Some(jobs) = app.fine_tuning() {
        crate::metrics::render_finetune(&mut text, &jobs.stats());
    }
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    r
}
