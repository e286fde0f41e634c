//! What the fine-tuning jobs tests share: a server with a state directory and an API key,
//! training tiny jobs; uploads, job requests, waiting on a job by its progress, reading its
//! whole event log, and chats.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use blink_server::client::{Client, HttpResponse};
use blink_server::{FinetuneOptions, ServerOptions};
use blink_train::jobs::JobSettings;
use serde_json::{json, Value};

use crate::support::*;

pub const KEY: &str = "jobs-test-key";

/// A server training on `state` with the default settings, one trainer thread.
pub fn jobs_server(state: &Path) -> TestServer {
    let settings = JobSettings::default();
    let opts = ServerOptions {
        api_key: Some(KEY.into()),
        state_dir: Some(state.to_path_buf()),
        finetune: FinetuneOptions { threads: 1, settings, ..FinetuneOptions::default() },
        ..ServerOptions::default()
    };
    TestServer::start(opts, model_options())
}

pub fn client(s: &TestServer) -> Client {
    s.client().with_api_key(Some(KEY.into()))
}

pub fn get(s: &TestServer, path: &str) -> HttpResponse {
    block_on(client(s).get(path)).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

pub fn post(s: &TestServer, path: &str, body: &Value) -> HttpResponse {
    block_on(client(s).post_json(path, body)).unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

/// The JSON of a 200 answer.
pub fn ok(r: HttpResponse) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()
}

/// Assert an OpenAI-shaped error with `status`; returns the `error` object.
pub fn error(r: &HttpResponse, status: u16) -> Value {
    assert_eq!(r.status, status, "body: {}", r.text());
    let e = r.json().expect("a JSON error body")["error"].clone();
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()) && e["type"].is_string(), "{e}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{e}");
    e
}

/// The first `n` Zorbania training examples, as JSONL.
pub fn zorbania(n: usize) -> String {
    let all = std::fs::read_to_string(repo_root().join("testdata/finetune/zorbania-train.jsonl")).unwrap();
    all.lines().take(n).map(|l| format!("{l}\n")).collect()
}

/// Upload `content` as a fine-tuning file; its id.
pub fn upload(s: &TestServer, name: &str, content: &str) -> String {
    let r = block_on(client(s).upload_file(name, content.as_bytes())).unwrap();
    ok(r)["id"].as_str().unwrap().to_string()
}

pub fn create(s: &TestServer, body: Value) -> Value {
    ok(post(s, "/v1/fine_tuning/jobs", &body))
}

pub fn job(s: &TestServer, id: &str) -> Value {
    ok(get(s, &format!("/v1/fine_tuning/jobs/{id}")))
}

/// Every event of the job, oldest first, read a page of 7 at a time.
pub fn events(s: &TestServer, id: &str) -> Vec<Value> {
    let mut all: Vec<Value> = Vec::new();
    loop {
        let after = all.last().map(|e| format!("&after={}", e["id"].as_str().unwrap())).unwrap_or_default();
        let page = ok(get(s, &format!("/v1/fine_tuning/jobs/{id}/events?limit=7{after}")));
        all.extend(page["data"].as_array().unwrap().iter().cloned());
        if !page["has_more"].as_bool().unwrap() {
            break;
        }
    }
    all.reverse();
    all
}

/// The steps of the job's metrics events, in log order.
pub fn metric_steps(events: &[Value]) -> Vec<u64> {
    events.iter().filter(|e| e["type"] == "metrics").map(|e| e["data"]["step"].as_u64().unwrap()).collect()
}

/// Wait until `done` holds for the job; fails only when the job makes no progress at all
/// (no new status, no new event) for [`STUCK`].
pub fn wait_for(s: &TestServer, id: &str, what: &str, done: impl Fn(&Value, &[Value]) -> bool) -> Value {
    let mut last = (String::new(), 0);
    let mut since = Instant::now();
    loop {
        let j = job(s, id);
        let ev = events(s, id);
        if done(&j, &ev) {
            return j;
        }
        let now = (j["status"].as_str().unwrap().to_string(), ev.len());
        if now != last {
            (last, since) = (now, Instant::now());
        }
        assert!(since.elapsed() < STUCK, "job {id} made no progress towards {what} in {STUCK:?}: {j}\n{ev:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn wait_final(s: &TestServer, id: &str) -> Value {
    wait_for(s, id, "an end", |j, _| matches!(j["status"].as_str(), Some("succeeded" | "failed" | "cancelled")))
}

/// A greedy chat answer of `model` to `question`.
pub fn answer(s: &TestServer, model: &str, question: &str) -> String {
    let body = json!({"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 24, "temperature": 0});
    let v = ok(post(s, "/v1/chat/completions", &body));
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

/// A sample of `/metrics` (`name` with its labels, if any).
pub fn job_metric(s: &TestServer, name: &str) -> f64 {
    let text = get(s, "/metrics").text();
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' '))).and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}
