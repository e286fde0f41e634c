//! The adapter endpoints: vLLM's `POST /v1/load_lora_adapter` and
//! `POST /v1/unload_lora_adapter`, and llama.cpp's `GET /lora-adapters` (every adapter
//! with its id and default scale) and `POST /lora-adapters` (set the default scales).

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::json_response;
use crate::adapters::AdapterInfo;
use crate::body::read_json;
use crate::error::ApiError;
use crate::openai::fields::Fields;
use crate::openai::request::parse_lora_list;
use crate::state::App;

fn info_json(a: &AdapterInfo) -> Value {
    json!({"id": a.id, "name": a.name, "path": a.path.display().to_string(), "scale": a.scale, "rank": a.rank, "alpha": a.alpha, "resident": a.resident})
}

/// `{"lora_name", "lora_path", "load_inplace"}`: read the adapter (inside `--lora-dir`) and
/// serve it as `lora_name`.
pub async fn load(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let ready = app.ready()?;
    let map = read_json(body, app.opts.max_body, app.opts.body_timeout).await?;
    let f = Fields(&map);
    let name = f.str("lora_name")?.ok_or_else(|| ApiError::param("lora_name", "lora_name is required"))?;
    let path = f.str("lora_path")?.ok_or_else(|| ApiError::param("lora_path", "lora_path is required"))?;
    let inplace = f.bool("load_inplace")?.unwrap_or(false);
    let info = ready.adapters.load(name, path, inplace, &ready.base_names()).await?;
    Ok(json_response(&json!({"object": "lora_adapter", "status": "loaded", "adapter": info_json(&info)})).into_response())
}

/// `{"lora_name"}`: stop serving it. Requests already running on it finish on it.
pub async fn unload(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let ready = app.ready()?;
    let map = read_json(body, app.opts.max_body, app.opts.body_timeout).await?;
    let name = Fields(&map).str("lora_name")?.ok_or_else(|| ApiError::param("lora_name", "lora_name is required"))?;
    ready.adapters.unload(name)?;
    Ok(json_response(&json!({"object": "lora_adapter", "status": "unloaded", "name": name})).into_response())
}

/// llama.cpp's list: `[{"id", "path", "scale", ...}]`.
pub async fn list(State(app): State<App>) -> Result<Response, ApiError> {
    let ready = app.ready()?;
    let items: Vec<Value> = ready.adapters.list().iter().map(info_json).collect();
    Ok(json_response(&Value::Array(items)).into_response())
}

/// llama.cpp's `[{"id", "scale"}]`: the scales requests that name no adapter run with;
/// adapters left out get 0.
pub async fn set_scales(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let ready = app.ready()?;
    let bytes = crate::body::read_bytes(body, app.opts.max_body, app.opts.body_timeout).await?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?;
    ready.adapters.set_scales(&parse_lora_list("lora", &v)?)?;
    Ok(json_response(&json!({"success": true})).into_response())
}
