//! Parsing and validating the bodies of `/v1/chat/completions` and `/v1/completions`.
//!
//! The result holds plain values; tokenization and the context-length check happen later
//! (they need the model). Sampling defaults are llama.cpp's server defaults (temperature 0.8,
//! top-k 40, top-p 0.95, min-p 0.05); whatever the client sends wins.

use blink_engine::SamplingParams;
use blink_text::ChatMessage;
use serde_json::{Map, Value};

use super::fields::{type_name, wrong_type, Fields};
use crate::error::ApiError;

/// Most stop strings per request (OpenAI's limit).
pub const MAX_STOPS: usize = 4;
/// Most alternatives per token for chat `top_logprobs` (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: i64 = 20;
/// Most alternatives per token for completions `logprobs`.
pub const MAX_COMPLETION_LOGPROBS: i64 = 20;

/// Fields shared by both generation endpoints.
#[derive(Clone, Debug)]
pub struct Common {
    pub model: Option<String>,
    /// `None`: generate until the end of generation or the context limit.
    pub max_tokens: Option<usize>,
    /// The field `max_tokens` came from (`max_completion_tokens` or `max_tokens`), for errors.
    pub max_tokens_field: &'static str,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    /// Alternatives per token when log-probabilities were asked for.
    pub logprobs: Option<usize>,
    /// llama.cpp's per-request adapters: ids and scales (`None`: not given).
    pub lora: Option<Vec<(u64, f32)>>,
}

/// A parsed chat completion request.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    pub common: Common,
    pub messages: Vec<ChatMessage>,
}

/// A completion prompt: text, or token ids.
#[derive(Clone, Debug)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// A parsed text completion request.
#[derive(Clone, Debug)]
pub struct CompletionRequest {
    pub common: Common,
    pub prompt: Prompt,
}

/// Parse a `/v1/chat/completions` body.
pub fn parse_chat(body: &Map<String, Value>) -> Result<ChatRequest, ApiError> {
    let f = Fields(body);
    let mut common = parse_common(&f)?;
    f.unsupported("tools", "tools are")?;
    f.unsupported("functions", "functions are")?;
    // Without tools, only the choices that call none mean anything (OpenAI refuses the rest).
    match f.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(c)) if c == "none" || c == "auto" => {}
        Some(_) => return Err(ApiError::param("tool_choice", "tool_choice needs tools, which this server does not support")),
    }
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top = f.int("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
    if top.is_some() && !logprobs {
        return Err(ApiError::param("top_logprobs", "top_logprobs requires logprobs to be true"));
    }
    common.logprobs = logprobs.then(|| top.unwrap_or(0) as usize);
    let messages = parse_messages(f.get("messages"))?;
    Ok(ChatRequest { common, messages })
}

/// Parse a `/v1/completions` body.
pub fn parse_completion(body: &Map<String, Value>) -> Result<CompletionRequest, ApiError> {
    let f = Fields(body);
    let mut common = parse_common(&f)?;
    common.logprobs = f.int("logprobs", 0, MAX_COMPLETION_LOGPROBS)?.map(|n| n as usize);
    f.unsupported("echo", "echo is")?;
    f.unsupported("suffix", "suffix is")?;
    if let Some(b) = f.int("best_of", i64::MIN, i64::MAX)? {
        if b != 1 {
            return Err(ApiError::param("best_of", format!("best_of must be 1 (this server returns one choice), got {b}")));
        }
    }
    let prompt = parse_prompt(f.get("prompt"))?;
    Ok(CompletionRequest { common, prompt })
}

fn parse_common(f: &Fields) -> Result<Common, ApiError> {
    let model = f.str("model")?.map(str::to_owned);
    f.str("user")?;
    if let Some(n) = f.int("n", i64::MIN, i64::MAX)? {
        if n != 1 {
            return Err(ApiError::param("n", format!("n must be 1 (this server returns one choice), got {n}")));
        }
    }
    let max_tokens = match f.int("max_completion_tokens", i64::MIN, i64::MAX)? {
        Some(n) => Some(("max_completion_tokens", n)),
        None => f.int("max_tokens", i64::MIN, i64::MAX)?.map(|n| ("max_tokens", n)),
    };
    let max_tokens_field = max_tokens.map_or("max_tokens", |(name, _)| name);
    let max_tokens = match max_tokens {
        None => None,
        Some((name, n)) if n < 1 => return Err(ApiError::param(name, format!("{name} must be at least 1, got {n}"))),
        Some((_, n)) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };

    let d = SamplingParams::default();
    let sampling = SamplingParams {
        temperature: f.num("temperature", 0.0, 2.0)?.unwrap_or(d.temperature),
        // As llama.cpp and vLLM: a top-k of 0 or less (vLLM's -1) is off.
        top_k: f.int("top_k", i64::MIN, i64::from(u32::MAX))?.map_or(d.top_k, |k| k.max(0) as usize),
        top_p: f.num("top_p", 0.0, 1.0)?.unwrap_or(d.top_p),
        min_p: f.num("min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        // llama.cpp's name, then vLLM's.
        repeat_penalty: match f.num("repeat_penalty", 1e-3, 100.0)? {
            Some(p) => p,
            None => f.num("repetition_penalty", 1e-3, 100.0)?.unwrap_or(d.repeat_penalty),
        },
        // -1 is llama.cpp's whole context; the window is capped at the context on submission.
        repeat_last_n: f.int("repeat_last_n", -1, blink_engine::MAX_REPEAT_LAST_N as i64)?
            .map_or(d.repeat_last_n, |n| usize::try_from(n).unwrap_or(blink_engine::MAX_REPEAT_LAST_N)),
        frequency_penalty: f.num("frequency_penalty", -2.0, 2.0)?.unwrap_or(d.frequency_penalty),
        presence_penalty: f.num("presence_penalty", -2.0, 2.0)?.unwrap_or(d.presence_penalty),
        seed: f.seed("seed")?,
    };
    sampling.validate().map_err(ApiError::invalid)?;

    let stop = parse_stop(f.get("stop"))?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(_) if !stream => return Err(ApiError::param("stream_options", "stream_options is only allowed when stream is true")),
        Some(o) => o.bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    f.unsupported("logit_bias", "logit_bias is")?;
    if let Some(rf) = f.object("response_format")? {
        match rf.str("type")? {
            None | Some("text") => {}
            Some(other) => {
                return Err(ApiError::param("response_format", format!("response_format '{other}' is not supported by this server")))
            }
        }
    }
    let lora = f.get("lora").map(|v| parse_lora_list("lora", v)).transpose()?;
    Ok(Common { model, max_tokens, max_tokens_field, sampling, stop, stream, include_usage, ignore_eos, logprobs: None, lora })
}

/// llama.cpp's adapter list, `[{"id": N, "scale": S}, ...]` (a missing scale is 1).
pub fn parse_lora_list(field: &'static str, v: &Value) -> Result<Vec<(u64, f32)>, ApiError> {
    let Value::Array(items) = v else { return Err(wrong_type(field, "an array of {id, scale} objects", v)) };
    items
        .iter()
        .map(|item| {
            let Value::Object(map) = item else { return Err(wrong_type(field, "an array of {id, scale} objects", item)) };
            let f = Fields(map);
            let id = f.int("id", 0, i64::MAX)?.ok_or_else(|| ApiError::param(field, "every adapter needs an id"))?;
            let scale = match f.get("scale") {
                None => 1.0,
                Some(s) => s.as_f64().ok_or_else(|| wrong_type(field, "a number as each scale", s))? as f32,
            };
            if !scale.is_finite() {
                return Err(ApiError::param(field, format!("the scale of adapter {id} must be a finite number")));
            }
            Ok((id as u64, scale))
        })
        .collect()
}

fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let stops = match v {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(s) => out.push(s.clone()),
                    other => return Err(wrong_type("stop", "a string or an array of strings", other)),
                }
            }
            out
        }
        Some(other) => return Err(wrong_type("stop", "a string or an array of strings", other)),
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::param("stop", format!("at most {MAX_STOPS} stop strings are allowed, got {}", stops.len())));
    }
    Ok(stops)
}

fn parse_messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match v {
        None => return Err(ApiError::param("messages", "messages is required")),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(wrong_type("messages", "an array of messages", other)),
    };
    if items.is_empty() {
        return Err(ApiError::param("messages", "messages must not be empty"));
    }
    items.iter().enumerate().map(|(i, m)| parse_message(i, m)).collect()
}

fn parse_message(i: usize, v: &Value) -> Result<ChatMessage, ApiError> {
    let Value::Object(m) = v else {
        return Err(ApiError::param("messages", format!("messages[{i}] must be an object, got {}", type_name(v))));
    };
    let role = match m.get("role") {
        Some(Value::String(r)) => r.as_str(),
        Some(other) => return Err(ApiError::param("messages", format!("messages[{i}].role must be a string, got {}", type_name(other)))),
        None => return Err(ApiError::param("messages", format!("messages[{i}].role is required"))),
    };
    let role = match role {
        "system" | "user" | "assistant" => role,
        // OpenAI's newer name for system instructions.
        "developer" => "system",
        "tool" | "function" => {
            return Err(ApiError::param("messages", format!("messages[{i}]: {role} messages are not supported by this server")))
        }
        other => {
            return Err(ApiError::param(
                "messages",
                format!("messages[{i}].role must be system, developer, user or assistant, got '{other}'"),
            ))
        }
    };
    let content = match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(i, parts)?,
        None | Some(Value::Null) if role == "assistant" => String::new(),
        None | Some(Value::Null) => return Err(ApiError::param("messages", format!("messages[{i}].content is required"))),
        Some(other) => {
            return Err(ApiError::param(
                "messages",
                format!("messages[{i}].content must be a string or an array of text parts, got {}", type_name(other)),
            ))
        }
    };
    Ok(ChatMessage::new(role, content))
}

/// Join the text parts of a multi-part content (`[{"type": "text", "text": ...}]`).
fn text_parts(i: usize, parts: &[Value]) -> Result<String, ApiError> {
    let mut out = String::new();
    for part in parts {
        let text = match part {
            Value::Object(p) => match (p.get("type"), p.get("text")) {
                (Some(Value::String(t)), Some(Value::String(text))) if t == "text" => text,
                (Some(Value::String(t)), _) if t != "text" => {
                    return Err(ApiError::param("messages", format!("messages[{i}]: content parts of type '{t}' are not supported")))
                }
                _ => return Err(ApiError::param("messages", format!("messages[{i}]: a text part needs a string 'text'"))),
            },
            other => {
                return Err(ApiError::param("messages", format!("messages[{i}]: content parts must be objects, got {}", type_name(other))))
            }
        };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(text);
    }
    Ok(out)
}

fn parse_prompt(v: Option<&Value>) -> Result<Prompt, ApiError> {
    const WANT: &str = "a string, an array of one string, or an array of token ids";
    match v {
        None => Err(ApiError::param("prompt", "prompt is required")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => Ok(Prompt::Text(s.clone())),
            [Value::Array(inner)] => token_ids(inner),
            [] => Err(ApiError::param("prompt", "prompt must not be empty")),
            items if items.iter().all(Value::is_number) => token_ids(items),
            _ if items.len() > 1 => Err(ApiError::param("prompt", "only one prompt per request is supported")),
            _ => Err(wrong_type("prompt", WANT, &items[0])),
        },
        Some(other) => Err(wrong_type("prompt", WANT, other)),
    }
}

fn token_ids(items: &[Value]) -> Result<Prompt, ApiError> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect::<Option<Vec<u32>>>()
        .map(Prompt::Tokens)
        .ok_or_else(|| ApiError::param("prompt", "token ids must be non-negative integers below 2^32"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chat(v: Value) -> Result<ChatRequest, ApiError> {
        parse_chat(v.as_object().expect("an object"))
    }

    fn msgs() -> Value {
        json!([{"role": "user", "content": "hi"}])
    }

    #[test]
    fn defaults_are_llama_cpp_server_defaults() {
        let r = chat(json!({"messages": msgs()})).unwrap();
        let s = &r.common.sampling;
        assert_eq!((s.temperature, s.top_k, s.top_p, s.min_p), (0.8, 40, 0.95, 0.05));
        assert_eq!(r.common.max_tokens, None);
        assert!(!r.common.stream && r.common.logprobs.is_none() && r.common.stop.is_empty());
    }

    #[test]
    fn client_values_win_and_nulls_read_as_absent() {
        let r = chat(json!({
            "messages": msgs(), "temperature": 0, "top_k": 5, "seed": -1, "stop": "x", "max_tokens": null,
            "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 3, "stream": true,
            "stream_options": {"include_usage": true}, "n": 1, "response_format": {"type": "text"}, "tools": [],
        }))
        .unwrap();
        let c = &r.common;
        // -1 is llama.cpp's random seed.
        assert_eq!((c.sampling.temperature, c.sampling.top_k, c.sampling.seed), (0.0, 5, None));
        assert_eq!((c.max_tokens, c.logprobs, c.stop.clone()), (Some(7), Some(3), vec!["x".to_string()]));
        assert_eq!(c.max_tokens_field, "max_completion_tokens");
        assert!(c.stream && c.include_usage);
    }

    #[test]
    fn seeds_are_64_bit_integers_however_written() {
        let seed = |v: Value| chat(json!({"messages": msgs(), "seed": v})).map(|r| r.common.sampling.seed);
        assert_eq!(seed(json!(7.0)).unwrap(), Some(7));
        assert_eq!(seed(json!(-2)).unwrap(), Some(u64::MAX - 1));
        assert_eq!(seed(json!(u64::MAX)).unwrap(), Some(u64::MAX));
        let big: Value = serde_json::from_str("18446744073709551616").unwrap();
        assert!(seed(big).unwrap_err().message.contains("must fit in 64 bits"));
        assert!(seed(json!(1.5)).unwrap_err().message.contains("must be an integer"));
        assert_eq!(seed(json!(-1)).unwrap(), None);
        assert_eq!(seed(json!(-1.0)).unwrap(), None);
    }

    #[test]
    fn llama_cpp_and_vllm_off_values_are_taken() {
        let sampling = |extra: Value| {
            let mut body = json!({"messages": msgs()});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            chat(body).map(|r| r.common.sampling)
        };
        assert_eq!(sampling(json!({"top_k": -1})).unwrap().top_k, 0);
        assert_eq!(sampling(json!({"repetition_penalty": 1.3})).unwrap().repeat_penalty, 1.3);
        assert_eq!(sampling(json!({"repetition_penalty": 1.3, "repeat_penalty": 1.1})).unwrap().repeat_penalty, 1.1);
        assert_eq!(sampling(json!({"repeat_last_n": -1})).unwrap().repeat_last_n, blink_engine::MAX_REPEAT_LAST_N);
        assert!(sampling(json!({"repeat_last_n": -2})).is_err());
        // What this server cannot do is refused, not ignored.
        assert_eq!(sampling(json!({"tool_choice": "required"})).unwrap_err().param, Some("tool_choice"));
        assert_eq!(sampling(json!({"tool_choice": {"type": "function", "function": {"name": "f"}}})).unwrap_err().param, Some("tool_choice"));
        assert!(sampling(json!({"tool_choice": "auto"})).is_ok() && sampling(json!({"tool_choice": "none"})).is_ok());
        assert_eq!(sampling(json!({"stream_options": {"include_usage": true}})).unwrap_err().param, Some("stream_options"));
    }

    #[test]
    fn message_shapes() {
        let r = chat(json!({"messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null},
        ]}))
        .unwrap();
        let got: Vec<(&str, &str)> = r.messages.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect();
        assert_eq!(got, [("system", "be brief"), ("user", "a\nb"), ("assistant", "")]);
        for bad in [
            json!([{"role": "user"}]),
            json!([{"role": "tool", "content": "x"}]),
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            json!(["hi"]),
        ] {
            assert_eq!(chat(json!({"messages": bad})).unwrap_err().param, Some("messages"), "{bad}");
        }
    }

    #[test]
    fn bad_values_name_their_parameter() {
        for (field, v) in [
            ("temperature", json!(3)),
            ("top_k", json!(1u64 << 32)),
            ("max_tokens", json!(0)),
            ("max_tokens", json!(2.5)),
            ("n", json!(3)),
            ("stop", json!([1])),
            ("frequency_penalty", json!(-2.5)),
            ("logit_bias", json!({"1": 5})),
        ] {
            let mut body = json!({"messages": msgs()});
            body[field] = v.clone();
            let e = chat(body).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param), (400, Some(field)), "{field} = {v}: {}", e.message);
        }
    }

    #[test]
    fn completion_prompts() {
        let p = |v: Value| parse_completion(json!({"prompt": v}).as_object().unwrap()).map(|r| r.prompt);
        assert!(matches!(p(json!("abc")), Ok(Prompt::Text(t)) if t == "abc"));
        assert!(matches!(p(json!(["abc"])), Ok(Prompt::Text(t)) if t == "abc"));
        assert!(matches!(p(json!([1, 2, 3])), Ok(Prompt::Tokens(t)) if t == [1, 2, 3]));
        assert!(matches!(p(json!([[4, 5]])), Ok(Prompt::Tokens(t)) if t == [4, 5]));
        for bad in [json!(["a", "b"]), json!([]), json!([-1]), json!(5), json!({"a": 1})] {
            assert!(p(bad.clone()).is_err(), "{bad}");
        }
        let lp = parse_completion(json!({"prompt": "x", "logprobs": 2}).as_object().unwrap()).unwrap();
        assert_eq!(lp.common.logprobs, Some(2));
        assert!(parse_completion(json!({"prompt": "x", "echo": true}).as_object().unwrap()).is_err());
    }
}
