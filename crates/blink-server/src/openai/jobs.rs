//! OpenAI's fine-tuning job requests: the body of `POST /v1/fine_tuning/jobs` read into a
//! `JobSpec` (the hyperparameters under `method.supervised`, or at the top level as the
//! older API has them; each a number or `"auto"`, resolved to `blink_train::jobs::AUTO_*`),
//! and the `after`/`limit` cursor of the list endpoints. Every refusal names its field.
//! Whether the model and files exist is the handler's to check.

use blink_train::jobs::{AUTO_BATCH_SIZE, AUTO_EPOCHS, AUTO_LR_MULTIPLIER};
use blink_train::store::{Hyperparameters, JobSpec};
use serde_json::{Map, Value};

use super::fields::{type_name, Fields};
use crate::error::ApiError;

/// OpenAI's bounds on the hyperparameters (its multiplier has none stated; past this one
/// the default rate only diverges).
pub const MAX_EPOCHS: u64 = 50;
pub const MAX_BATCH_SIZE: u64 = 256;
pub const MAX_LR_MULTIPLIER: f64 = 100.0;
/// Longest `suffix` (OpenAI's limit).
pub const MAX_SUFFIX: usize = 64;
/// Most items a list page holds.
pub const MAX_LIMIT: usize = 100;

/// Where a request's hyperparameters sit, with each field's name as errors give it.
struct Place {
    at: &'static str,
    n_epochs: &'static str,
    batch_size: &'static str,
    lr: &'static str,
}

const TOP: Place = Place {
    at: "hyperparameters",
    n_epochs: "hyperparameters.n_epochs",
    batch_size: "hyperparameters.batch_size",
    lr: "hyperparameters.learning_rate_multiplier",
};

const SUPERVISED: Place = Place {
    at: "method.supervised.hyperparameters",
    n_epochs: "method.supervised.hyperparameters.n_epochs",
    batch_size: "method.supervised.hyperparameters.batch_size",
    lr: "method.supervised.hyperparameters.learning_rate_multiplier",
};

/// The job a create request asks for; `random_seed` gives the seed when none is.
pub fn parse_create(map: &Map<String, Value>, random_seed: impl FnOnce() -> u64) -> Result<JobSpec, ApiError> {
    let f = Fields(map);
    let model = required(&f, "model", "the base model to fine-tune")?;
    let training_file = required(&f, "training_file", "the id of an uploaded file with purpose 'fine-tune'")?;
    let validation_file = f.str("validation_file")?.filter(|s| !s.is_empty()).map(str::to_owned);
    let suffix = match f.str("suffix")? {
        None | Some("") => None,
        Some(s) => Some(check_suffix(s)?),
    };
    let seed = match f.int("seed", 0, i64::MAX)? {
        Some(s) => s as u64,
        None => random_seed(),
    };
    f.unsupported("integrations", "integrations are")?;
    let hyperparameters = hyperparameters(&f)?;
    Ok(JobSpec { model, training_file, validation_file, suffix, seed, hyperparameters })
}

fn required(f: &Fields<'_>, name: &'static str, what: &str) -> Result<String, ApiError> {
    match f.str(name)? {
        Some(s) if !s.is_empty() => Ok(s.to_owned()),
        _ => Err(ApiError::param(name, format!("{name} is required: {what}"))),
    }
}

/// A suffix goes into the model's name `ft:<base>:<suffix>:<job id>`.
fn check_suffix(s: &str) -> Result<String, ApiError> {
    if s.chars().count() > MAX_SUFFIX || s.chars().any(|c| c == ':' || c.is_control() || c.is_whitespace()) {
        return Err(ApiError::param("suffix", format!("suffix must be at most {MAX_SUFFIX} characters, without ':', spaces or control characters")));
    }
    Ok(s.to_owned())
}

/// From `method.supervised.hyperparameters` or the top-level `hyperparameters` (not both).
fn hyperparameters(f: &Fields<'_>) -> Result<Hyperparameters, ApiError> {
    let top = object(f.get("hyperparameters"), TOP.at)?;
    let method = object(f.get("method"), "method")?;
    let supervised = match method {
        None => None,
        Some(m) => {
            match m.get("type").filter(|v| !v.is_null()) {
                Some(Value::String(t)) if t == "supervised" => {}
                Some(Value::String(t)) => return Err(ApiError::param("method.type", format!("method.type '{t}' is not supported: this server fine-tunes with 'supervised' only"))),
                Some(v) => return Err(ApiError::param("method.type", format!("method.type must be a string ('supervised'), got {}", type_name(v)))),
                None => return Err(ApiError::param("method.type", "method.type is required ('supervised')")),
            }
            let s = object(m.get("supervised"), "method.supervised")?;
            s.map(|s| object(s.get("hyperparameters"), SUPERVISED.at)).transpose()?.flatten()
        }
    };
    let given = |h: &Option<&Map<String, Value>>| h.is_some_and(|h| !h.is_empty());
    if given(&top) && given(&supervised) {
        return Err(ApiError::param("hyperparameters", "give the hyperparameters in method.supervised.hyperparameters or at the top level, not both"));
    }
    let (map, place) = if given(&top) { (top, &TOP) } else { (supervised, &SUPERVISED) };
    let empty = Map::new();
    let h = map.unwrap_or(&empty);
    if let Some(k) = h.keys().find(|k| !matches!(k.as_str(), "n_epochs" | "batch_size" | "learning_rate_multiplier")) {
        return Err(ApiError::param(place.at, format!("{}.{k} is not a supervised hyperparameter (n_epochs, batch_size, learning_rate_multiplier)", place.at)));
    }
    Ok(Hyperparameters {
        n_epochs: int_or_auto(h.get("n_epochs"), place.n_epochs, MAX_EPOCHS, AUTO_EPOCHS)?,
        batch_size: int_or_auto(h.get("batch_size"), place.batch_size, MAX_BATCH_SIZE, AUTO_BATCH_SIZE)?,
        learning_rate_multiplier: multiplier_or_auto(h.get("learning_rate_multiplier"), place.lr)?,
    })
}

fn object<'a>(v: Option<&'a Value>, name: &'static str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(v) => Err(ApiError::param(name, format!("{name} must be an object, got {}", type_name(v)))),
    }
}

/// A value as an error message shows it.
fn shown(v: &Value) -> String {
    match v {
        Value::Number(_) | Value::String(_) | Value::Bool(_) => v.to_string(),
        _ => type_name(v).to_string(),
    }
}

fn is_auto(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s == "auto",
        _ => false,
    }
}

/// An integer from 1 to `max` (a whole float too), or "auto".
fn int_or_auto(v: Option<&Value>, name: &'static str, max: u64, auto: u64) -> Result<u64, ApiError> {
    if is_auto(v) {
        return Ok(auto);
    }
    let n = match v {
        Some(Value::Number(n)) => Some(n),
        _ => None,
    };
    let x = n.and_then(|n| n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64).map(|f| f as u64)));
    match x.filter(|x| (1..=max).contains(x)) {
        Some(x) => Ok(x),
        None => Err(ApiError::param(name, format!("{name} must be an integer from 1 to {max} or \"auto\", got {}", v.map_or_else(String::new, shown)))),
    }
}

/// A positive number up to [`MAX_LR_MULTIPLIER`], or "auto".
fn multiplier_or_auto(v: Option<&Value>, name: &'static str) -> Result<f64, ApiError> {
    if is_auto(v) {
        return Ok(AUTO_LR_MULTIPLIER);
    }
    match v.and_then(Value::as_f64).filter(|x| x.is_finite() && *x > 0.0 && *x <= MAX_LR_MULTIPLIER) {
        Some(x) => Ok(x),
        None => Err(ApiError::param(name, format!("{name} must be a number above 0 and at most {MAX_LR_MULTIPLIER}, or \"auto\", got {}", v.map_or_else(String::new, shown)))),
    }
}

/// A list endpoint's cursor: items after the one with id `after`, at most `limit`.
#[derive(Clone, Debug, PartialEq)]
pub struct Page {
    pub after: Option<String>,
    pub limit: usize,
}

/// A query string's `key=value` pairs, percent-decoded (`+` is a space).
pub fn query_pairs(raw: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                },
                c => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    raw.split('&').filter(|p| !p.is_empty()).map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        (decode(k), decode(v))
    }).collect()
}

/// `?after=ID&limit=N` (other parameters are ignored).
pub fn parse_page(query: &[(String, String)], default_limit: usize) -> Result<Page, ApiError> {
    let mut page = Page { after: None, limit: default_limit };
    for (k, v) in query {
        match k.as_str() {
            "after" if !v.is_empty() => page.after = Some(v.clone()),
            "limit" => {
                page.limit = v.parse().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| ApiError::param("limit", format!("limit must be an integer from 1 to {MAX_LIMIT}, got '{v}'")))?;
            }
            _ => {}
        }
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<JobSpec, ApiError> {
        parse_create(v.as_object().unwrap(), || 99)
    }

    fn base() -> Value {
        json!({"model": "m", "training_file": "file-1"})
    }

    fn with(extra: Value) -> Value {
        let mut v = base();
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        v
    }

    #[test]
    fn both_shapes_of_hyperparameters_and_auto_values_resolve() {
        let h = |v| parse(v).unwrap().hyperparameters;
        let auto = Hyperparameters { n_epochs: AUTO_EPOCHS, batch_size: AUTO_BATCH_SIZE, learning_rate_multiplier: AUTO_LR_MULTIPLIER };
        assert_eq!(h(base()), auto);
        let set = json!({"n_epochs": 2, "batch_size": 1.0, "learning_rate_multiplier": 0.5});
        let want = Hyperparameters { n_epochs: 2, batch_size: 1, learning_rate_multiplier: 0.5 };
        assert_eq!(h(with(json!({"hyperparameters": set}))), want);
        assert_eq!(h(with(json!({"method": {"type": "supervised", "supervised": {"hyperparameters": set}}}))), want);
        let mixed = json!({"method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": "auto", "batch_size": 4}}}});
        assert_eq!(h(with(mixed)), Hyperparameters { batch_size: 4, ..auto.clone() });
        assert_eq!(h(with(json!({"method": {"type": "supervised"}}))), auto);
        let spec = parse(with(json!({"seed": 5, "suffix": "zorb", "validation_file": "file-2"}))).unwrap();
        assert_eq!((spec.seed, spec.suffix.as_deref(), spec.validation_file.as_deref()), (5, Some("zorb"), Some("file-2")));
        assert_eq!(parse(base()).unwrap().seed, 99);
    }

    #[test]
    fn bad_requests_name_their_field() {
        let param = |v| parse(v).unwrap_err().param.unwrap();
        assert_eq!(param(json!({"training_file": "f"})), "model");
        assert_eq!(param(json!({"model": "m"})), "training_file");
        assert_eq!(param(json!({"model": "m", "training_file": 3})), "training_file");
        assert_eq!(param(with(json!({"suffix": "a:b"}))), "suffix");
        assert_eq!(param(with(json!({"suffix": "x".repeat(65)}))), "suffix");
        assert_eq!(param(with(json!({"seed": -3}))), "seed");
        assert_eq!(param(with(json!({"seed": "7"}))), "seed");
        assert_eq!(param(with(json!({"method": {"type": "dpo"}}))), "method.type");
        assert_eq!(param(with(json!({"method": {"supervised": {}}}))), "method.type");
        assert_eq!(param(with(json!({"method": "supervised"}))), "method");
        assert_eq!(param(with(json!({"hyperparameters": {"n_epochs": 0}}))), "hyperparameters.n_epochs");
        assert_eq!(param(with(json!({"hyperparameters": {"n_epochs": 1.5}}))), "hyperparameters.n_epochs");
        assert_eq!(param(with(json!({"hyperparameters": {"n_epochs": 51}}))), "hyperparameters.n_epochs");
        assert_eq!(param(with(json!({"hyperparameters": {"batch_size": "big"}}))), "hyperparameters.batch_size");
        let lr = |x: Value| param(with(json!({"method": {"type": "supervised", "supervised": {"hyperparameters": {"learning_rate_multiplier": x}}}})));
        for x in [json!(0), json!(-1), json!(1000), json!("fast"), json!([1])] {
            assert_eq!(lr(x), "method.supervised.hyperparameters.learning_rate_multiplier");
        }
        assert_eq!(param(with(json!({"hyperparameters": {"beta": 0.1}}))), "hyperparameters");
        let both = with(json!({"hyperparameters": {"n_epochs": 1}, "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}}));
        assert_eq!(param(both), "hyperparameters");
        assert_eq!(param(with(json!({"integrations": [{"type": "wandb"}]}))), "integrations");
        let e = parse(with(json!({"hyperparameters": {"n_epochs": "many"}}))).unwrap_err();
        assert!(e.message.contains("from 1 to 50") && e.message.contains("\"many\""), "{}", e.message);
    }

    #[test]
    fn pages_read_after_and_limit() {
        let q = |pairs: &[(&str, &str)]| parse_page(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>(), 20);
        assert_eq!(query_pairs("after=ft%3Ax+y&limit=3&&flag&bad=%zz%4"), [("after", "ft:x y"), ("limit", "3"), ("flag", ""), ("bad", "%zz%4")].map(|(k, v)| (k.to_string(), v.to_string())));
        assert_eq!(q(&[]).unwrap(), Page { after: None, limit: 20 });
        assert_eq!(q(&[("after", "ftjob-1"), ("limit", "3"), ("metadata[k]", "v")]).unwrap(), Page { after: Some("ftjob-1".into()), limit: 3 });
        for bad in ["0", "101", "-1", "x", ""] {
            assert_eq!(q(&[("limit", bad)]).unwrap_err().param, Some("limit"));
        }
    }
}
