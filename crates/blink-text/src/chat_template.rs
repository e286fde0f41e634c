//! Chat templates: turning a conversation into a prompt with the model's Jinja template
//! (`tokenizer.chat_template`), rendered the way Hugging Face transformers renders it.
//!
//! The environment matches transformers' `apply_chat_template`: `trim_blocks` and `lstrip_blocks`
//! on, trailing newline dropped (jinja2's default), Python string/dict methods (`.strip()`,
//! `.startswith()`, `.items()`, ...), `raise_exception(msg)`, `strftime_now(fmt)` and a `tojson`
//! filter that writes JSON as Python's `json.dumps` does. Templates see `messages`,
//! `add_generation_prompt`, `bos_token` and `eos_token`, and what llama.cpp's server adds:
//! `enable_thinking` (true) and `date_string` (today). `length` of an undefined value is 0
//! and transformers' `{% generation %}` marks are read as plain blocks, as jinja2 and
//! transformers do. A template that ignores a system message gets it at the head of the
//! first user message, as llama.cpp's server gives it.
//!
//! Like llama.cpp, a template loaded from a GGUF file drops a leading BOS text when the tokenizer
//! adds BOS itself (and a trailing EOS text when it adds EOS), so that the rendered prompt can be
//! tokenized with `add_special = true` without doubling them.
//!
//! A template is code from the model file, so rendering is bounded: [`RENDER_FUEL`] template
//! instructions, [`MAX_RENDERED`] bytes of output, and `tojson` refuses absurd indents and
//! nesting. A template that builds values that large by other means (a string doubled in a
//! loop, a list nested thousands deep and then printed) can still exhaust memory or stack.

use std::time::{SystemTime, UNIX_EPOCH};

use blink_gguf::GgufFile;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::tokenizer::{template_tokens, TokenizerError};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template does not parse.
    #[error("chat template syntax error: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`.
    #[error("chat template refused the conversation: {0}")]
    Raised(String),
    /// Any other rendering failure (undefined operation, bad argument, ...).
    #[error("chat template rendering failed: {0}")]
    Render(String),
    /// The GGUF metadata holding the template or its special tokens is malformed.
    #[error("chat template metadata: {0}")]
    Metadata(#[from] TokenizerError),
    #[error("chat template metadata: {0}")]
    Gguf(#[from] blink_gguf::GgufError),
}

/// The ChatML format, for models that ship no template.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + \
    message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ \
    '<|im_start|>assistant\n' }}{% endif %}";

const NAME: &str = "chat_template";
/// Template instructions one rendering may run: real templates need thousands per message;
/// this stops a runaway loop within about a second.
pub const RENDER_FUEL: u64 = 10_000_000;
/// Longest rendered prompt, in bytes: far past any context, short of exhausting memory.
pub const MAX_RENDERED: usize = 32 << 20;
/// Deepest value `tojson` writes, and its largest indent.
const MAX_JSON_DEPTH: usize = 128;
const MAX_JSON_INDENT: usize = 64;
/// Prefix marking errors raised by `raise_exception` (kept out of the final message).
const RAISED: &str = "\u{1}raise_exception\u{1}";

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    strip_bos: bool,
    strip_eos: bool,
    /// Whether the template writes a system message's text; if not, `render` moves it
    /// into the first user message.
    system_role: bool,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts templates see under those names.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, TemplateError> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("length", length);
        env.add_filter("count", length);
        let compiled = plain_generation_blocks(&join_continued_lines(&source));
        env.add_template_owned(NAME, compiled).map_err(|e| TemplateError::Syntax(describe(&e)))?;
        let mut tmpl = ChatTemplate {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            strip_bos: false,
            strip_eos: false,
            system_role: true,
        };
        // As llama.cpp probes it: a template that fails on a system message, or leaves its
        // text out, has no system role.
        const NEEDLE: &str = "<System Needle>";
        let probe = [ChatMessage::new("system", NEEDLE), ChatMessage::new("user", "Hey")];
        tmpl.system_role = tmpl.render_as_is(&probe, false).is_ok_and(|text| text.contains(NEEDLE));
        Ok(tmpl)
    }

    /// The template in `tokenizer.chat_template`, or `Ok(None)` when the file has none.
    ///
    /// BOS/EOS texts and the stripping flags come from the tokenizer metadata, with llama.cpp's
    /// defaults.
    pub fn from_gguf(file: &GgufFile) -> Result<Option<ChatTemplate>, TemplateError> {
        let Some(source) = file.opt_str("tokenizer.chat_template")? else {
            return Ok(None);
        };
        let t = template_tokens(file)?;
        let tmpl = ChatTemplate::new(source, t.bos, t.eos)?.strip_special(t.add_bos, t.add_eos);
        Ok(Some(tmpl))
    }

    /// As [`ChatTemplate::from_gguf`], but a template that does not compile gives ChatML and
    /// a warning saying so, as llama.cpp does (the model stays usable).
    pub fn from_gguf_or_chatml(file: &GgufFile) -> Result<(Option<ChatTemplate>, Option<String>), TemplateError> {
        match ChatTemplate::from_gguf(file) {
            Err(TemplateError::Syntax(e)) => Ok((Some(ChatTemplate::chatml()), Some(format!("the chat template does not compile ({e}); using ChatML")))),
            r => r.map(|t| (t, None)),
        }
    }

    /// What to tell a user whose model has no template, when chatting uses ChatML (as
    /// llama.cpp's server and `llama-cli -cnv` do).
    pub const MISSING: &str = "the model has no chat template; using ChatML";

    /// The ChatML template ([`CHATML`]).
    pub fn chatml() -> ChatTemplate {
        // CHATML is a fixed, valid template; this cannot fail, but stay panic-free regardless.
        ChatTemplate::new(CHATML, "", "").unwrap_or_else(|_| ChatTemplate {
            env: Environment::new(),
            source: String::new(),
            bos_token: String::new(),
            eos_token: String::new(),
            strip_bos: false,
            strip_eos: false,
            system_role: true,
        })
    }

    /// Whether to drop a leading BOS text / trailing EOS text from rendered prompts (set these to
    /// the tokenizer's `add_bos()`/`add_eos()`).
    pub fn strip_special(mut self, bos: bool, eos: bool) -> ChatTemplate {
        self.strip_bos = bos;
        self.strip_eos = eos;
        self
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// The prompt for a reply to `messages`: rendered with the generation prompt and
    /// tokenized as llama.cpp's server does (special tokens parsed, BOS added as the
    /// tokenizer asks; `render` already dropped a BOS text the template wrote itself).
    ///
    /// A final assistant message is continued, as llama.cpp's server prefills it: the
    /// messages before it are rendered with the generation prompt, and its text follows.
    pub fn prompt_tokens(&self, tok: &crate::tokenizer::Tokenizer, messages: &[ChatMessage]) -> Result<Vec<u32>, TemplateError> {
        let text = match messages.split_last() {
            Some((last, before)) if last.role == "assistant" => {
                if before.last().is_some_and(|m| m.role == "assistant") {
                    return Err(TemplateError::Render("two assistant messages end the conversation: only the last one can be continued".into()));
                }
                self.render(before, true)? + &last.content
            }
            _ => self.render(messages, true)?,
        };
        Ok(tok.encode(&text, true, true))
    }

    /// Renders `messages`; `add_generation_prompt` appends the opening of the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TemplateError> {
        if self.system_role {
            self.render_as_is(messages, add_generation_prompt)
        } else {
            self.render_as_is(&system_into_user(messages), add_generation_prompt)
        }
    }

    fn render_as_is(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TemplateError> {
        let tmpl = self.env.get_template(NAME).map_err(|e| TemplateError::Render(describe(&e)))?;
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            enable_thinking => true,
            date_string => strftime_now("%d %b %Y".into()),
        };
        let mut out = Capped(Vec::new());
        tmpl.render_captured_to(ctx, &mut out).map_err(|e| match e.kind() {
            ErrorKind::WriteFailure => TemplateError::Render(format!("the rendered prompt is longer than {} MiB", MAX_RENDERED >> 20)),
            _ => classify(e),
        })?;
        // minijinja writes whole strings, so the bytes are UTF-8.
        let mut out = String::from_utf8(out.0).map_err(|e| TemplateError::Render(e.to_string()))?;
        if self.strip_bos && !self.bos_token.is_empty() && out.starts_with(&self.bos_token) {
            out.drain(..self.bos_token.len());
        }
        if self.strip_eos && !self.eos_token.is_empty() && out.ends_with(&self.eos_token) {
            out.truncate(out.len() - self.eos_token.len());
        }
        Ok(out)
    }
}

/// `messages` for a template without a system role, as llama.cpp's server passes them:
/// system texts join (by newlines) the head of the next user message, or become a user
/// message of their own when another role or the end comes first.
fn system_into_user(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(messages.len());
    let mut pending: Option<String> = None;
    for m in messages {
        if m.role == "system" {
            match &mut pending {
                Some(p) => {
                    p.push('\n');
                    p.push_str(&m.content);
                }
                None => pending = Some(m.content.clone()),
            }
            continue;
        }
        let mut m = m.clone();
        if let Some(system) = pending.take() {
            if m.role == "user" {
                m.content = if m.content.is_empty() { system } else { format!("{system}\n{}", m.content) };
            } else {
                out.push(ChatMessage::new("user", system));
            }
        }
        out.push(m);
    }
    out.extend(pending.map(|system| ChatMessage::new("user", system)));
    out
}

/// `source` with transformers' `{% generation %}`/`{% endgeneration %}` marks (which flag
/// the assistant's text for training masks) turned into a block that always renders, as
/// transformers renders them; their whitespace-control signs are kept.
fn plain_generation_blocks(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_string();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = tag[2..end].trim_start_matches(['-', '+']).trim_end_matches(['-', '+']).trim();
        let keep = |word: &str| tag[..end + 2].replacen(inner, word, 1);
        match inner {
            "generation" => out.push_str(&keep("if true")),
            "endgeneration" => out.push_str(&keep("endif")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// `length` (and `count`), with jinja2's 0 for an undefined value.
fn length(v: Value) -> Result<usize, Error> {
    if v.is_undefined() {
        return Ok(0);
    }
    minijinja::filters::length(&v)
}

/// `source` with every backslash-newline inside a string literal of a tag removed: jinja2
/// reads string literals with Python's escapes, where that pair continues the line, while
/// minijinja keeps both characters (Mistral's templates write long system prompts so).
fn join_continued_lines(source: &str) -> String {
    if !source.contains("\\\n") {
        return source.to_string();
    }
    let b = source.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let (mut i, mut in_tag, mut quote) = (0, false, None::<u8>);
    while i < b.len() {
        let (c, next) = (b[i], b.get(i + 1).copied());
        match quote {
            Some(q) => {
                if c == b'\\' && next == Some(b'\n') {
                    i += 2;
                    continue;
                }
                if c == b'\\' {
                    out.push(c);
                    out.extend(next);
                    i += 2;
                    continue;
                }
                if c == q {
                    quote = None;
                }
            }
            None if in_tag => match (c, next) {
                (b'\'' | b'"', _) => quote = Some(c),
                (b'}' | b'%', Some(b'}')) => {
                    in_tag = false;
                    out.extend([c, b'}']);
                    i += 2;
                    continue;
                }
                _ => {}
            },
            None => {
                if let (b'{', Some(open @ (b'{' | b'%'))) = (c, next) {
                    in_tag = true;
                    out.extend([c, open]);
                    i += 2;
                    continue;
                }
            }
        }
        out.push(c);
        i += 1;
    }
    // Only ASCII pairs were removed, so the text is still UTF-8.
    String::from_utf8(out).unwrap_or_else(|_| source.to_string())
}

/// Rendered output, refused past [`MAX_RENDERED`] bytes.
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED {
            return Err(std::io::Error::other("rendered prompt too long"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The error's own message plus where it happened.
fn describe(e: &Error) -> String {
    let mut s = match e.detail() {
        Some(d) => format!("{}: {}", e.kind(), d.strip_prefix(RAISED).unwrap_or(d)),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        s.push_str(&format!(" (line {line})"));
    }
    s
}

fn classify(e: Error) -> TemplateError {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = cur {
        if let Some(me) = err.downcast_ref::<Error>() {
            if let Some(msg) = me.detail().and_then(|d| d.strip_prefix(RAISED)) {
                return TemplateError::Raised(msg.to_owned());
            }
        }
        cur = err.source();
    }
    match e.kind() {
        ErrorKind::SyntaxError => TemplateError::Syntax(describe(&e)),
        _ => TemplateError::Render(describe(&e)),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{message}")))
}

/// Python's `datetime.now().strftime(fmt)`, in UTC.
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    strftime(secs, &format)
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift the epoch to 0000-03-01 so that leap days end each 400-year era's years.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Formats a Unix time with the common `strftime` codes (C locale); unknown codes stay as written.
fn strftime(unix_secs: u64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
        "November", "December",
    ];
    const DAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(year) + 1;
    let month_name = MONTHS[(month as usize).saturating_sub(1) % 12];
    let h12 = if h % 12 == 0 { 12 } else { h % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut code = chars.next();
        // glibc's `%-d` etc.: no padding.
        let unpadded = code == Some('-');
        if unpadded {
            code = chars.next();
        }
        let num = |v: u64, width: usize| if unpadded { v.to_string() } else { format!("{v:0width$}") };
        let piece = match code {
            Some('Y') => year.to_string(),
            Some('y') => num(year.rem_euclid(100) as u64, 2),
            Some('m') => num(u64::from(month), 2),
            Some('d') => num(u64::from(day), 2),
            Some('e') => format!("{day:>2}"),
            Some('H') => num(h, 2),
            Some('I') => num(h12, 2),
            Some('M') => num(m, 2),
            Some('S') => num(s, 2),
            Some('j') => num(yday as u64, 3),
            Some('p') => (if h < 12 { "AM" } else { "PM" }).to_owned(),
            Some('b') | Some('h') => month_name[..3].to_owned(),
            Some('B') => month_name.to_owned(),
            Some('a') => DAYS[weekday][..3].to_owned(),
            Some('A') => DAYS[weekday].to_owned(),
            Some('%') => "%".to_owned(),
            Some(other) => format!("%{}{other}", if unpadded { "-" } else { "" }),
            None => "%".to_owned(),
        };
        out.push_str(&piece);
    }
    out
}

/// Days from 1970-01-01 to January 1st of `year`.
fn days_from_civil(year: i64) -> i64 {
    let y = year - 1;
    let leap_days = |y: i64| y.div_euclid(4) - y.div_euclid(100) + y.div_euclid(400);
    365 * (year - 1970) + leap_days(y) - leap_days(1969)
}

/// `tojson` as in transformers: `json.dumps(value, ensure_ascii=False, indent=indent,
/// sort_keys=sort_keys)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    if indent.is_some_and(|n| n > MAX_JSON_INDENT) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: an indent above {MAX_JSON_INDENT}")));
    }
    // Python's defaults: (", ", ": "), or ("," ": ") with an indent.
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let (item_sep, key_sep) = match separators.as_deref() {
        None => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
    };
    let style = JsonStyle {
        indent,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        item_sep,
        key_sep,
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&value, &style, 0, &mut out)?;
    Ok(Value::from(out))
}

/// How `tojson` writes, as Python's `json.dumps` arguments say.
struct JsonStyle {
    indent: Option<usize>,
    sort_keys: bool,
    /// `ensure_ascii`: non-ASCII characters as `\uXXXX` escapes (off by default, as in
    /// transformers).
    ascii: bool,
    item_sep: String,
    key_sep: String,
}

fn write_json(v: &Value, style: &JsonStyle, depth: usize, out: &mut String) -> Result<(), Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: a value nested deeper than {MAX_JSON_DEPTH}")));
    }
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = style.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let item_sep = style.item_sep.as_str();
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => match v.as_i64() {
            Some(i) if v.is_integer() => out.push_str(&i.to_string()),
            _ => match f64::try_from(v.clone()) {
                Ok(f) if f.is_nan() => out.push_str("NaN"),
                Ok(f) if f.is_infinite() => out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" }),
                Ok(f) if f.fract() == 0.0 && f.abs() < 1e16 => out.push_str(&format!("{f:.1}")),
                Ok(f) => out.push_str(&format!("{f:?}")),
                Err(_) => out.push_str(&v.to_string()),
            },
        },
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, style, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if style.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                let name = key.as_str().map(str::to_owned).unwrap_or_else(|| key.to_string());
                write_json_str(&name, style.ascii, out);
                out.push_str(&style.key_sep);
                write_json(&v.get_item(key)?, style, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => write_json_str(&v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string()), style.ascii, out),
    }
    Ok(())
}

/// A JSON string literal; non-ASCII characters are kept unless `ascii` (`ensure_ascii`)
/// asks for escapes (UTF-16 units, as Python writes them).
fn write_json_str(s: &str, ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ascii && !c.is_ascii() => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn strftime_codes() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 19_782 * 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(strftime(t, "%d %b %Y"), "29 Feb 2024");
        assert_eq!(strftime(t, "%A %B %-d, %H:%M:%S %p %I %j %y %%"), "Thursday February 29, 13:05:09 PM 01 060 24 %");
        assert_eq!(strftime(0, "%Y-%m-%d %a %Q"), "1970-01-01 Thu %Q");
    }
}
