//! Reading OpenAI's chat fine-tuning JSONL: one `{"messages": [...]}` object a line, each
//! message a `role` (system, user or assistant), a string `content` and, on assistant messages
//! only, an optional `weight` of 0 or 1 (0: not learned from).
//!
//! Validation is strict and complete: every bad line is reported (number and reason) and the
//! whole file is refused, so nothing is silently skipped. Blank lines are refused between
//! examples (OpenAI refuses them); blank lines after the last example are ignored. A UTF-8
//! byte-order mark opening the file is ignored; Windows line ends are read as line ends.

use std::path::Path;

use serde_json::{Map, Value};

use super::error::{refuse_lines, DataError, LineError};

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    /// The role's name as chat templates see it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }

    fn parse(name: &str) -> Option<Role> {
        match name {
            "system" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            _ => None,
        }
    }
}

/// One message of a training conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainMessage {
    pub role: Role,
    pub content: String,
    /// Whether the model learns to write this message: an assistant message without
    /// `weight` or with weight 1. Never true for other roles.
    pub learn: bool,
}

/// One example: the conversation on line `line` (1-based) of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversation {
    pub line: usize,
    pub messages: Vec<TrainMessage>,
}

/// Reads and validates the JSONL file at `path`.
pub fn read_jsonl(path: impl AsRef<Path>) -> Result<Vec<Conversation>, DataError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.to_owned(), source })?;
    parse_jsonl(&bytes)
}

/// Parses and validates JSONL text; every bad line is listed in the error.
pub fn parse_jsonl(bytes: &[u8]) -> Result<Vec<Conversation>, DataError> {
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
    let lines: Vec<&[u8]> = bytes
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .collect();
    let last_example = lines.iter().rposition(|l| !is_blank(l));
    let Some(last_example) = last_example else {
        return Err(DataError::Empty);
    };
    let mut conversations = Vec::with_capacity(last_example + 1);
    let mut errors = Vec::new();
    for (i, raw) in lines[..=last_example].iter().enumerate() {
        let line = i + 1;
        match parse_line(raw) {
            Ok(messages) => conversations.push(Conversation { line, messages }),
            Err(reason) => errors.push(LineError::new(line, reason)),
        }
    }
    refuse_lines(errors)?;
    Ok(conversations)
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// One line's messages, or why the line is refused.
fn parse_line(raw: &[u8]) -> Result<Vec<TrainMessage>, String> {
    if is_blank(raw) {
        return Err("blank line between examples (the format has one example on every line)".into());
    }
    let text = std::str::from_utf8(raw).map_err(|e| format!("not UTF-8 (at byte {})", e.valid_up_to()))?;
    let value: Value = serde_json::from_str(text).map_err(json_syntax)?;
    let Value::Object(obj) = value else {
        return Err(format!("expected a JSON object with a `messages` array, found {}", kind(&value)));
    };
    if let Some(key) = obj.keys().find(|k| *k != "messages") {
        return Err(format!("unsupported field `{key}` (only `messages` is read)"));
    }
    let messages = match obj.get("messages") {
        None => return Err("no `messages` field".into()),
        Some(Value::Array(a)) => a,
        Some(other) => return Err(format!("`messages` must be an array, not {}", kind(other))),
    };
    if messages.is_empty() {
        return Err("`messages` is empty".into());
    }
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    if !messages.iter().any(|m| m.role == Role::Assistant) {
        return Err("no assistant message: nothing to learn".into());
    }
    if !messages.iter().any(|m| m.learn) {
        return Err("every assistant message has weight 0: nothing to learn".into());
    }
    Ok(messages)
}

fn parse_message(i: usize, value: &Value) -> Result<TrainMessage, String> {
    let Value::Object(m) = value else {
        return Err(format!("messages[{i}] must be an object, not {}", kind(value)));
    };
    if let Some(key) = m.keys().find(|k| !matches!(k.as_str(), "role" | "content" | "weight")) {
        return Err(format!("messages[{i}] has unsupported field `{key}` (only role, content and weight are read)"));
    }
    let role = match m.get("role") {
        None => return Err(format!("messages[{i}] has no `role`")),
        Some(Value::String(r)) => Role::parse(r).ok_or_else(|| {
            format!("messages[{i}] has role `{r}`: only system, user and assistant are supported")
        })?,
        Some(other) => return Err(format!("messages[{i}].role must be a string, not {}", kind(other))),
    };
    let content = match m.get("content") {
        None => return Err(format!("messages[{i}] has no `content`")),
        Some(Value::String(c)) => c.clone(),
        Some(other) => return Err(format!("messages[{i}].content must be a string, not {}", kind(other))),
    };
    let learn = weight(i, m, role)?;
    Ok(TrainMessage { role, content, learn })
}

/// Whether an assistant message is learned from (its `weight`, 1 when absent); false for
/// other roles, which must not carry a weight.
fn weight(i: usize, m: &Map<String, Value>, role: Role) -> Result<bool, String> {
    let Some(w) = m.get("weight") else {
        return Ok(role == Role::Assistant);
    };
    if role != Role::Assistant {
        return Err(format!(
            "messages[{i}].weight is only allowed on assistant messages (this one is `{}`)",
            role.as_str()
        ));
    }
    match w.as_u64() {
        Some(0) => Ok(false),
        Some(1) => Ok(true),
        _ => Err(format!("messages[{i}].weight must be 0 or 1, not {w}")),
    }
}

/// A serde_json syntax error without its "at line 1" (the line is the file's, given apart).
fn json_syntax(e: serde_json::Error) -> String {
    let mut msg = e.to_string();
    if let Some(at) = msg.rfind(" at line ") {
        msg.truncate(at);
    }
    format!("invalid JSON at column {}: {msg}", e.column())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
