//! Typed reading of a JSON request object, field by field.
//!
//! OpenAI clients send fields this server does not know; those are ignored. A known field of
//! the wrong type or out of range is a 400 that names the field. `null` reads as absent.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// The fields of one request object.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl<'a> Fields<'a> {
    /// The field's value, `None` if absent or `null`.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    pub fn bool(&self, name: &'static str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(name, "a boolean", v)),
        }
    }

    pub fn str(&self, name: &'static str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(name, "a string", v)),
        }
    }

    /// A number within `[lo, hi]`.
    pub fn num(&self, name: &'static str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if !(lo..=hi).contains(&x) {
                    return Err(ApiError::param(name, format!("{name} must be between {lo} and {hi}, got {n}")));
                }
                Ok(Some(x as f32))
            }
            Some(v) => Err(wrong_type(name, "a number", v)),
        }
    }

    /// An integer (a JSON number with no fractional part) within `[lo, hi]`.
    pub fn int(&self, name: &'static str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v @ Value::Number(n)) => {
                let x = match (n.as_i64(), n.as_u64(), n.as_f64()) {
                    (Some(i), _, _) => i,
                    (None, Some(_), _) => i64::MAX,
                    (None, None, Some(f)) if f.fract() == 0.0 && f.is_finite() => {
                        if f < i64::MIN as f64 {
                            i64::MIN
                        } else if f > i64::MAX as f64 {
                            i64::MAX
                        } else {
                            f as i64
                        }
                    }
                    _ => return Err(wrong_type(name, "an integer", v)),
                };
                if !(lo..=hi).contains(&x) {
                    return Err(ApiError::param(name, format!("{name} must be between {lo} and {hi}, got {n}")));
                }
                Ok(Some(x))
            }
            Some(v) => Err(wrong_type(name, "an integer", v)),
        }
    }

    /// A seed: an integer of 64 bits, signed or not (negative ones are taken modulo 2^64),
    /// also written as a whole float (`1.0`), as `int` takes them. -1 is llama.cpp's
    /// "random": `None`, as when absent.
    pub fn seed(&self, name: &'static str) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_f64() == Some(-1.0) => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
            Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64().map(|i| i as u64)),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && (i64::MIN as f64..u64::MAX as f64).contains(&f) => Ok(Some(if f < 0.0 { f as i64 as u64 } else { f as u64 })),
                Some(f) if f.fract() == 0.0 => Err(ApiError::param(name, format!("{name} must fit in 64 bits, got {n}"))),
                _ => Err(wrong_type(name, "an integer", &Value::Number(n.clone()))),
            },
            Some(v) => Err(wrong_type(name, "an integer", v)),
        }
    }

    pub fn object(&self, name: &'static str) -> Result<Option<Fields<'a>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(Fields(m))),
            Some(v) => Err(wrong_type(name, "an object", v)),
        }
    }

    /// Refuse a feature this server lacks when the field is present with a non-empty value.
    pub fn unsupported(&self, name: &'static str, what: &str) -> Result<(), ApiError> {
        let present = match self.get(name) {
            None => false,
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Bool(b)) => *b,
            Some(_) => true,
        };
        if present {
            return Err(ApiError::param(name, format!("{what} not supported by this server")));
        }
        Ok(())
    }
}

/// 400 for a field of the wrong JSON type.
pub fn wrong_type(name: &'static str, expected: &str, got: &Value) -> ApiError {
    ApiError::param(name, format!("{name} must be {expected}, got {}", type_name(got)))
}

/// JSON's name for a value's type.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
