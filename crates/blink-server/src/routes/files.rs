//! OpenAI's files endpoints, for fine-tuning data: `POST /v1/files` (multipart, `file` and
//! `purpose=fine-tune`; the JSONL is checked at upload and every bad line named),
//! `GET /v1/files`, `GET /v1/files/{id}`, `GET /v1/files/{id}/content` and
//! `DELETE /v1/files/{id}`. The store lives in `--state-dir`; its disk work runs on
//! tokio's blocking threads, never on the async ones or the engine's.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Path, Request, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use blink_train::store::{FileStore, StoreError};
use serde_json::json;

use super::json_response;
use crate::body::read_bytes;
use crate::error::ApiError;
use crate::state::App;

/// Room for the multipart framing and the `purpose` field around the file itself.
const FORM_OVERHEAD: usize = 64 << 10;

fn store(app: &App) -> Result<Arc<FileStore>, ApiError> {
    app.files.clone().ok_or_else(|| ApiError::forbidden("files and fine-tuning jobs need a state directory: start the server with --state-dir DIR"))
}

/// Runs a store operation on a blocking thread.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, StoreError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(format!("the file store failed: {e}")))?.map_err(ApiError::from)
}

pub async fn create(State(app): State<App>, req: Request) -> Result<Response, ApiError> {
    let files = store(&app)?;
    let limit = app.opts.max_upload_bytes;
    let (parts, body) = req.into_parts();
    let bytes = read_bytes(body, limit + FORM_OVERHEAD, app.opts.body_timeout).await.map_err(|e| if e.status == 413 { upload_too_large(limit) } else { e })?;
    let mut form = Multipart::from_request(Request::from_parts(parts, Body::from(bytes)), &())
        .await
        .map_err(|e| ApiError::invalid(format!("the upload must be a multipart/form-data body with 'file' and 'purpose' fields: {}", e.body_text())))?;
    let (mut purpose, mut file) = (None, None);
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(ApiError::invalid(format!("the multipart body is malformed: {}", e.body_text()))),
        };
        let name = field.name().unwrap_or_default().to_string();
        let filename = field.file_name().map(str::to_string);
        let data = field.bytes().await.map_err(|e| ApiError::invalid(format!("the multipart field '{name}' is malformed: {}", e.body_text())))?;
        match name.as_str() {
            "purpose" => purpose = Some(String::from_utf8_lossy(&data).trim().to_string()),
            "file" => file = Some((filename.unwrap_or_default(), data)),
            _ => {}
        }
    }
    let purpose = purpose.ok_or_else(|| ApiError::param("purpose", "the 'purpose' field is required (use 'fine-tune')"))?;
    let (filename, data) = file.ok_or_else(|| ApiError::param("file", "the 'file' field is required"))?;
    if data.len() > limit {
        return Err(upload_too_large(limit));
    }
    let record = blocking(move || files.create(&filename, &purpose, &data)).await?;
    Ok(json_response(&record.to_json()))
}

fn upload_too_large(limit: usize) -> ApiError {
    ApiError { message: format!("the upload is larger than the limit of {limit} bytes (--max-upload-bytes)"), ..ApiError::too_large(limit) }
}

pub async fn list(State(app): State<App>) -> Result<Response, ApiError> {
    let files = store(&app)?;
    let data: Vec<_> = files.list().iter().map(|r| r.to_json()).collect();
    Ok(json_response(&json!({"object": "list", "data": data, "has_more": false})))
}

pub async fn retrieve(State(app): State<App>, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(json_response(&store(&app)?.get(&id)?.to_json()))
}

pub async fn content(State(app): State<App>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let files = store(&app)?;
    let bytes = blocking(move || files.content(&id)).await?;
    let mut r = Response::new(Body::from(bytes));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    Ok(r.into_response())
}

pub async fn delete(State(app): State<App>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let files = store(&app)?;
    let deleted = id.clone();
    blocking(move || files.delete(&id)).await?;
    Ok(json_response(&json!({"id": deleted, "object": "file", "deleted": true})))
}
