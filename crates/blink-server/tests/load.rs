//! Load: 32 concurrent streaming clients send 256 greedy chat requests with mixed prompt
//! lengths. Every stream must be well-formed (each event JSON, one id, role first, finish
//! reason, usage, `[DONE]` last), its usage must equal the tokens delivered, and its text
//! must equal what the same prompt gets when served alone (batch invariance end to end).

mod support;

use std::sync::Arc;
use std::time::Instant;

use blink_server::client::Client;
use serde_json::{json, Value};
use support::*;

const CLIENTS: usize = 32;
const REQUESTS: usize = 256;

/// Sixteen prompts from a few tokens to a few hundred, each with its own max_tokens.
fn prompts() -> Vec<(String, usize)> {
    let topics = ["rivers", "volcanoes", "bees", "trains", "glaciers", "comets", "forests", "bridges"];
    let mut out = Vec::new();
    for (i, topic) in topics.iter().enumerate() {
        out.push((format!("Tell me one fact about {topic}."), 4 + 3 * i));
        let notes: String = (0..(2 + 3 * i)).map(|k| format!("Note {k}: {topic} matter to people for reason number {k}. ")).collect();
        out.push((format!("Read these notes and summarise them in one sentence.\n{notes}"), 24 - 2 * i));
    }
    out
}

/// What one streamed request delivered.
#[derive(Debug, PartialEq)]
struct Outcome {
    text: String,
    finish: String,
    prompt_tokens: u64,
    completion_tokens: u64,
}

async fn stream_one(client: &Client, prompt: &str, max_tokens: usize) -> Result<Outcome, String> {
    let body = json!({
        "model": "",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "logprobs": true,
    });
    let mut s = client.stream("/v1/chat/completions", &body).await?;
    let mut events: Vec<Value> = Vec::new();
    let mut done = false;
    while let Some(data) = s.next_event().await? {
        if done {
            return Err(format!("an event after [DONE]: {data}"));
        }
        if data == "[DONE]" {
            done = true;
            continue;
        }
        events.push(serde_json::from_str(&data).map_err(|e| format!("an event is not JSON ({e}): {data}"))?);
    }
    if !done {
        return Err("the stream did not end with [DONE]".into());
    }
    let id = events.first().and_then(|e| e["id"].as_str()).ok_or("no events")?.to_owned();
    if !id.starts_with("chatcmpl-") {
        return Err(format!("bad id {id}"));
    }
    let (usage_event, chunks) = events.split_last().ok_or("no events")?;
    if usage_event["choices"] != json!([]) || !usage_event["usage"].is_object() {
        return Err(format!("the last event is not the usage chunk: {usage_event}"));
    }
    if chunks.first().map(|c| c["choices"][0]["delta"]["role"].clone()) != Some(json!("assistant")) {
        return Err("the first chunk does not carry the role".into());
    }
    let (mut text, mut finish, mut delivered) = (String::new(), None, 0u64);
    for c in chunks {
        if c["id"] != json!(id) || c["object"] != json!("chat.completion.chunk") {
            return Err(format!("a chunk of another stream or kind: {c}"));
        }
        if !c["usage"].is_null() {
            return Err(format!("usage before the end: {c}"));
        }
        let choice = &c["choices"][0];
        text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        delivered += choice["logprobs"]["content"].as_array().map_or(0, |a| a.len() as u64);
        if let Some(f) = choice["finish_reason"].as_str() {
            if finish.replace(f.to_owned()).is_some() {
                return Err("two finish reasons".into());
            }
        }
    }
    let usage = &usage_event["usage"];
    let completion_tokens = usage["completion_tokens"].as_u64().ok_or("no completion_tokens")?;
    let prompt_tokens = usage["prompt_tokens"].as_u64().ok_or("no prompt_tokens")?;
    if completion_tokens != delivered {
        return Err(format!("usage says {completion_tokens} tokens but {delivered} were delivered"));
    }
    if usage["total_tokens"].as_u64() != Some(prompt_tokens + completion_tokens) {
        return Err(format!("total_tokens is not the sum: {usage}"));
    }
    Ok(Outcome { text, finish: finish.ok_or("no finish reason")?, prompt_tokens, completion_tokens })
}

#[test]
fn thirty_two_clients_get_well_formed_streams_equal_to_solo_runs() {
    let server = shared();
    let prompts = Arc::new(prompts());
    let client = server.client();

    // Each prompt served alone first.
    let t0 = Instant::now();
    let solo: Vec<Outcome> = block_on(async {
        let mut out = Vec::new();
        for (p, n) in prompts.iter() {
            out.push(stream_one(&client, p, *n).await.unwrap_or_else(|e| panic!("solo request failed: {e}")));
        }
        out
    });
    let t_solo = t0.elapsed();
    server.wait_idle();

    // Then all at once.
    let t1 = Instant::now();
    let results: Vec<(usize, Result<Outcome, String>)> = block_on(async {
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..CLIENTS {
            let (client, prompts, next) = (client.clone(), prompts.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= REQUESTS {
                        return out;
                    }
                    let k = (i * 7) % prompts.len();
                    let (p, n) = &prompts[k];
                    out.push((k, stream_one(&client, p, *n).await));
                }
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("client task"));
        }
        all
    });
    let t_load = t1.elapsed();
    assert_eq!(results.len(), REQUESTS);
    let mut failures = Vec::new();
    for (k, r) in &results {
        match r {
            Err(e) => failures.push(format!("prompt {k}: {e}")),
            Ok(o) if *o != solo[*k] => failures.push(format!("prompt {k}: got {o:?}\n  alone: {:?}", solo[*k])),
            Ok(_) => {}
        }
    }
    assert!(failures.is_empty(), "{} of {REQUESTS} requests failed:\n{}", failures.len(), failures.join("\n"));
    let idle = server.wait_idle();
    let tokens: u64 = results.iter().map(|(k, _)| solo[*k].completion_tokens).sum();
    println!(
        "solo: {} requests in {:.1} s; load: {REQUESTS} requests from {CLIENTS} clients in {:.1} s ({:.0} tok/s); engine {idle:?}",
        solo.len(),
        t_solo.as_secs_f64(),
        t_load.as_secs_f64(),
        tokens as f64 / t_load.as_secs_f64()
    );
}
