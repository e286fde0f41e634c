//! Response bodies in the shapes OpenAI's API returns (and its client libraries parse):
//! whole responses, streamed chunks, usage and log-probabilities.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use blink_engine::serve::Usage;
use blink_text::{TextOffset, Tokenizer};
use serde_json::{json, Map, Value};

/// One generated token, for log-probability reports.
#[derive(Clone, Debug)]
pub struct TokenOut {
    pub id: u32,
    /// Where its text starts in the completion.
    pub start: TextOffset,
    pub logprob: f32,
    /// The most likely alternatives, best first.
    pub top: Vec<(u32, f32)>,
}

/// Reported as `system_fingerprint`.
pub const FINGERPRINT: &str = concat!("blink-", env!("CARGO_PKG_VERSION"));

/// A fresh response id: `prefix` then 24 hex digits.
pub fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{prefix}{:016x}{:08x}", h.finish(), COUNTER.load(Ordering::Relaxed) as u32)
}

/// What every response of one request repeats.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Meta {
    fn head(&self, object: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(object));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("system_fingerprint".into(), json!(FINGERPRINT));
        m
    }
}

/// `usage`, with the prompt tokens served from the prefix cache.
pub fn usage(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// A token's text for log-probability reports (special tokens shown by name) and its bytes.
fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id, true).into_owned();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// A token as the legacy completions API names it: its text, or `bytes:\xNN…` when its
/// bytes are not whole UTF-8 characters (part of a character split over tokens), so that
/// such tokens stay distinct keys of `top_logprobs`.
fn completion_token_text(tok: &Tokenizer, id: u32) -> String {
    let bytes = tok.token_bytes(id, true);
    match std::str::from_utf8(&bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => bytes.iter().fold(String::from("bytes:"), |mut s, b| {
            s.push_str(&format!("\\x{b:02x}"));
            s
        }),
    }
}

/// Chat log-probability entries: `[{token, logprob, bytes, top_logprobs: [...]}]`.
pub fn chat_logprobs(tok: &Tokenizer, tokens: &[TokenOut]) -> Vec<Value> {
    tokens
        .iter()
        .map(|t| {
            let (text, bytes) = token_text(tok, t.id);
            let top: Vec<Value> = t
                .top
                .iter()
                .map(|&(id, lp)| {
                    let (text, bytes) = token_text(tok, id);
                    json!({"token": text, "logprob": lp, "bytes": bytes})
                })
                .collect();
            json!({"token": text, "logprob": t.logprob, "bytes": bytes, "top_logprobs": top})
        })
        .collect()
}

/// Completion log-probabilities: `{tokens, token_logprobs, top_logprobs, text_offset}`.
pub fn completion_logprobs(tok: &Tokenizer, tokens: &[TokenOut]) -> Value {
    let mut texts = Vec::with_capacity(tokens.len());
    let mut lps = Vec::with_capacity(tokens.len());
    let mut tops = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        texts.push(json!(completion_token_text(tok, t.id)));
        lps.push(json!(t.logprob));
        let mut top = Map::new();
        for &(id, lp) in &t.top {
            top.entry(completion_token_text(tok, id)).or_insert(json!(lp));
        }
        tops.push(Value::Object(top));
        offsets.push(json!(t.start.chars));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// A whole chat completion.
pub fn chat_completion(meta: &Meta, text: &str, finish: &str, u: &Usage, logprobs: Option<Vec<Value>>) -> Value {
    let mut m = meta.head("chat.completion");
    let logprobs = logprobs.map_or(Value::Null, |c| json!({"content": c, "refusal": null}));
    m.insert(
        "choices".into(),
        json!([{
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": null},
            "logprobs": logprobs,
            "finish_reason": finish,
        }]),
    );
    m.insert("usage".into(), usage(u));
    Value::Object(m)
}

/// One streamed chat chunk. `usage_field`: add `"usage": null` (the client asked for usage,
/// which comes in a last chunk of its own).
pub fn chat_chunk(meta: &Meta, delta: Value, logprobs: Option<Vec<Value>>, finish: Option<&str>, usage_field: bool) -> Value {
    let mut m = meta.head("chat.completion.chunk");
    let logprobs = logprobs.map_or(Value::Null, |c| json!({"content": c, "refusal": null}));
    m.insert("choices".into(), json!([{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]));
    if usage_field {
        m.insert("usage".into(), Value::Null);
    }
    Value::Object(m)
}

/// The last streamed chunk when usage was asked for: no choices, the usage.
pub fn usage_chunk(meta: &Meta, object: &str, u: &Usage) -> Value {
    let mut m = meta.head(object);
    m.insert("choices".into(), json!([]));
    m.insert("usage".into(), usage(u));
    Value::Object(m)
}

/// A whole text completion, or (`streamed`) one chunk of one.
pub fn completion(meta: &Meta, text: &str, finish: Option<&str>, logprobs: Option<Value>, u: Option<&Usage>, usage_field: bool) -> Value {
    let mut m = meta.head("text_completion");
    m.insert(
        "choices".into(),
        json!([{"index": 0, "text": text, "logprobs": logprobs.unwrap_or(Value::Null), "finish_reason": finish}]),
    );
    match u {
        Some(u) => {
            m.insert("usage".into(), usage(u));
        }
        None if usage_field => {
            m.insert("usage".into(), Value::Null);
        }
        None => {}
    }
    Value::Object(m)
}

/// A server-sent event carrying `v`.
pub fn sse(v: &Value) -> bytes::Bytes {
    let mut s = String::with_capacity(256);
    s.push_str("data: ");
    s.push_str(&v.to_string());
    s.push_str("\n\n");
    bytes::Bytes::from(s)
}

/// The stream's terminator.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";
