//! OpenAI's fine-tuning jobs endpoints, over `blink_train::jobs::JobService` (with
//! `--state-dir`): `POST /v1/fine_tuning/jobs` (create), `GET /v1/fine_tuning/jobs` (cursor
//! paging), `GET .../{id}`, `GET .../{id}/events`, `GET .../{id}/checkpoints`, and
//! `POST .../{id}/cancel`, `.../pause`, `.../resume`.
//!
//! Errors: a body that names a model or file this server lacks is a 400 naming the field
//! (as OpenAI answers), an unknown job in the path a 404, and a move the job's state
//! forbids (pausing a finished job) a 409. The service's disk work runs on tokio's
//! blocking threads.

use std::hash::{BuildHasher, Hasher};

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use blink_train::jobs::JobService;
use blink_train::store::{FileStore, StoreError, PURPOSE_FINE_TUNE};
use serde_json::{json, Value};

use super::json_response;
use crate::body::read_json;
use crate::error::ApiError;
use crate::openai::jobs::{parse_create, parse_page, query_pairs, Page};
use crate::state::{App, Ready};

/// Default page sizes, as OpenAI's.
const JOBS_PAGE: usize = 20;
const EVENTS_PAGE: usize = 20;
const CHECKPOINTS_PAGE: usize = 10;

/// A store error of the jobs endpoints in OpenAI's shape: 404 for an unknown job, 409 for
/// a move its state forbids.
fn job_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Conflict(m) => ApiError::conflict(m),
        StoreError::Invalid(m) => ApiError::invalid(m),
        e => ApiError::from(e),
    }
}

/// Runs `f` on the job service on a blocking thread.
async fn blocking<T: Send + 'static>(app: &App, f: impl FnOnce(&JobService) -> Result<T, StoreError> + Send + 'static) -> Result<T, ApiError> {
    let jobs = app.jobs()?;
    tokio::task::spawn_blocking(move || f(&jobs.service).map_err(job_error))
        .await
        .map_err(|e| ApiError::internal(format!("the fine-tuning jobs store failed: {e}")))?
}

fn page(query: Option<String>, default_limit: usize) -> Result<Page, ApiError> {
    parse_page(&query_pairs(query.as_deref().unwrap_or("")), default_limit)
}

fn list_json(data: Vec<Value>, has_more: bool) -> Value {
    json!({"object": "list", "data": data, "has_more": has_more})
}

/// A seed for a job that gives none: random, 31 bits (as OpenAI's), recorded in the job.
fn random_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish() & 0x7fff_ffff
}

/// The base model's id, for any of its names; 400 for an adapter or an unknown model.
fn base_model(ready: &Ready, model: &str) -> Result<String, ApiError> {
    if ready.is_base(Some(model)) {
        return Ok(ready.model_id.clone());
    }
    let base = &ready.model_id;
    let message = if ready.adapters.contains(model) {
        format!("the model '{model}' is an adapter; fine-tuning here starts from the base model '{base}'")
    } else {
        format!("the model '{model}' does not exist here; fine-tuning takes the base model this server serves, '{base}'")
    };
    Err(ApiError { code: Some("model_not_found"), ..ApiError::param("model", message) })
}

/// 400 unless `id` is an uploaded fine-tuning file.
fn check_file(files: &FileStore, field: &'static str, id: &str) -> Result<(), ApiError> {
    match files.get(id) {
        Ok(f) if f.purpose == PURPOSE_FINE_TUNE => Ok(()),
        Ok(f) => Err(ApiError::param(field, format!("{field} '{id}' has purpose '{}'; fine-tuning takes files uploaded with purpose '{PURPOSE_FINE_TUNE}'", f.purpose))),
        Err(_) => Err(ApiError::param(field, format!("{field} '{id}' is not an uploaded file (upload it with POST /v1/files, purpose '{PURPOSE_FINE_TUNE}')"))),
    }
}

pub async fn create(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    app.jobs()?;
    let ready = app.ready()?;
    let map = read_json(body, app.opts.max_body, app.opts.body_timeout).await?;
    let mut spec = parse_create(&map, random_seed)?;
    spec.model = base_model(&ready, &spec.model)?;
    let files = app.files.as_deref().ok_or_else(|| ApiError::internal("the file store is missing"))?;
    check_file(files, "training_file", &spec.training_file)?;
    if let Some(v) = &spec.validation_file {
        check_file(files, "validation_file", v)?;
    }
    // A file deleted since the check is still a reference to nothing: 400, as above.
    let record = blocking(&app, move |jobs| jobs.create(spec).map_err(|e| if let StoreError::NotFound { .. } = e { StoreError::Invalid(e.to_string()) } else { e })).await?;
    Ok(json_response(&record.to_json()))
}

pub async fn list(State(app): State<App>, RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    let page = page(query, JOBS_PAGE)?;
    let after = page.after.clone();
    let (jobs, has_more) = blocking(&app, move |jobs| jobs.list(page.after.as_deref(), page.limit)).await.map_err(|e| match (e.status.as_u16(), after) {
        (404, Some(after)) => ApiError::param("after", format!("after '{after}' is not the id of a fine-tuning job")),
        (_, _) => e,
    })?;
    Ok(json_response(&list_json(jobs.iter().map(|j| j.to_json()).collect(), has_more)))
}

pub async fn retrieve(State(app): State<App>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let job = blocking(&app, move |jobs| jobs.get(&id)).await?;
    Ok(json_response(&job.to_json()))
}

pub async fn events(State(app): State<App>, Path(id): Path<String>, RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    let page = page(query, EVENTS_PAGE)?;
    let (events, has_more) = blocking(&app, move |jobs| jobs.events(&id, page.after.as_deref(), page.limit)).await?;
    Ok(json_response(&list_json(events.iter().map(|e| e.to_json()).collect(), has_more)))
}

pub async fn checkpoints(State(app): State<App>, Path(id): Path<String>, RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    let page = page(query, CHECKPOINTS_PAGE)?;
    let (items, has_more) = blocking(&app, move |jobs| jobs.checkpoints(&id, page.after.as_deref(), page.limit)).await?;
    let mut body = list_json(items.iter().map(|c| c.to_json()).collect(), has_more);
    body["first_id"] = json!(items.first().map(|c| &c.id));
    body["last_id"] = json!(items.last().map(|c| &c.id));
    Ok(json_response(&body))
}

pub async fn cancel(State(app): State<App>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let job = blocking(&app, move |jobs| jobs.cancel(&id)).await?;
    Ok(json_response(&job.to_json()))
}

pub async fn pause(State(app): State<App>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let job = blocking(&app, move |jobs| jobs.pause(&id)).await?;
    Ok(json_response(&job.to_json()))
}

pub async fn resume(State(app): State<App>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let job = blocking(&app, move |jobs| jobs.resume(&id)).await?;
    Ok(json_response(&job.to_json()))
}
