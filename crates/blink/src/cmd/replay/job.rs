//! A fine-tuning job trained while the trace plays (`--finetune FILE`): uploaded and
//! created through OpenAI's files and fine-tuning endpoints before the first request
//! (so any server with that API can be measured the same way), waited for until it
//! runs, and cancelled after the last request unless asked to keep it.

use std::path::Path;
use std::time::{Duration, Instant};

use blink_server::client::Client;
use serde_json::{json, Value};

use crate::common::CliResult;

/// How long a job may take to validate its file and start.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Upload `file` and create a job on `model` of `epochs` epochs (enough that it outlasts
/// the trace); returns its id once it runs.
pub async fn start(client: &Client, file: &Path, model: &str, epochs: u64, seed: u64) -> CliResult<String> {
    let content = std::fs::read(file).map_err(|e| format!("--finetune: cannot read {}: {e}", file.display()))?;
    let name = file.file_name().map_or("train.jsonl".into(), |n| n.to_string_lossy().into_owned());
    let up = client.upload_file(&name, &content).await?;
    let up: Value = ok(up, "uploading the fine-tuning file")?;
    let file_id = up["id"].as_str().ok_or("the server's file object has no id")?;
    let body = json!({"model": model, "training_file": file_id, "seed": seed, "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": epochs}}}});
    let job: Value = ok(client.post_json("/v1/fine_tuning/jobs", &body).await?, "creating the fine-tuning job")?;
    let id = job["id"].as_str().ok_or("the server's job object has no id")?.to_string();
    let started = Instant::now();
    loop {
        let j: Value = ok(client.get(&format!("/v1/fine_tuning/jobs/{id}")).await?, "reading the fine-tuning job")?;
        match j["status"].as_str() {
            Some("running") => return Ok(id),
            Some("failed" | "cancelled" | "succeeded") => return Err(format!("the fine-tuning job ended before the trace began: {}", j["error"]).into()),
            _ if started.elapsed() > START_TIMEOUT => return Err(format!("the fine-tuning job did not start within {START_TIMEOUT:?}").into()),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Cancel the job (it would otherwise go on training after the trace).
pub async fn cancel(client: &Client, id: &str) -> CliResult {
    ok(client.post_json(&format!("/v1/fine_tuning/jobs/{id}/cancel"), &json!({})).await?, "cancelling the fine-tuning job").map(|_| ())
}

fn ok(r: blink_server::client::HttpResponse, what: &str) -> CliResult<Value> {
    if r.status != 200 {
        return Err(format!("{what}: HTTP {}: {}", r.status, r.text()).into());
    }
    Ok(r.json()?)
}
