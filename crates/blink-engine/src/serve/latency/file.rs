//! The coefficient file: `Coefficients` as JSON (format tag, version, both parts'
//! coefficients, the setup they were measured on, the calibration's fit report), written
//! atomically and checked on reading, where every fault is an error value.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

use super::coefficients::{Coefficients, FitReport, PassCoefficients, UnitCoefficients};

/// The file's `format` field.
pub const FORMAT: &str = "blink-latency-model";
/// The version this build writes and reads.
pub const VERSION: u64 = 2;

/// Why a coefficient file could not be read or written.
#[derive(Debug, Error)]
pub enum LatencyFileError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// Not JSON, truncated, not a latency model file, or a field missing or of the wrong
    /// type.
    #[error("{}: not a usable latency model file: {reason}", path.display())]
    Malformed { path: PathBuf, reason: String },
    #[error("{}: latency model file version {found}, this build reads version {VERSION}; run blink calibrate again", path.display())]
    Version { path: PathBuf, found: u64 },
    /// A coefficient that is not a finite number ≥ 0 (read, or about to be written).
    #[error("{}: {field} = {value} is not a finite number ≥ 0", path.display())]
    BadValue { path: PathBuf, field: &'static str, value: f64 },
}

#[derive(Serialize, Deserialize)]
struct FileV1 {
    format: String,
    version: u64,
    pass: PassCoefficients,
    unit: UnitCoefficients,
    setup: Map<String, Value>,
    fit: FitReport,
}

impl Coefficients {
    /// Writes the coefficients to `path` atomically: to a temporary file beside it, synced,
    /// renamed over `path`, and the directory synced, so `path` holds the old file or the
    /// whole new one even after a crash. Refuses coefficients that are not finite and ≥ 0
    /// (they could not be read back).
    pub fn save(&self, path: &Path) -> Result<(), LatencyFileError> {
        if let Some((field, value)) = self.first_invalid() {
            return Err(LatencyFileError::BadValue { path: path.to_path_buf(), field, value });
        }
        let file = FileV1 {
            format: FORMAT.into(),
            version: VERSION,
            pass: self.pass,
            unit: self.unit,
            setup: self.setup.clone(),
            fit: self.fit.clone(),
        };
        let mut bytes = serde_json::to_vec_pretty(&file)
            .map_err(|e| LatencyFileError::Malformed { path: path.to_path_buf(), reason: e.to_string() })?;
        bytes.push(b'\n');
        replace_file(path, &bytes).map_err(|source| LatencyFileError::Io { path: path.to_path_buf(), source })
    }

    /// Reads coefficients written by [`Coefficients::save`].
    pub fn load(path: &Path) -> Result<Coefficients, LatencyFileError> {
        let bytes = fs::read(path).map_err(|source| LatencyFileError::Io { path: path.to_path_buf(), source })?;
        Coefficients::from_json(path, &bytes)
    }

    /// Parses and checks a file's bytes (`path` names it in errors).
    fn from_json(path: &Path, bytes: &[u8]) -> Result<Coefficients, LatencyFileError> {
        let malformed = |reason: String| LatencyFileError::Malformed { path: path.to_path_buf(), reason };
        let value: Value = serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
        let Value::Object(object) = &value else {
            return Err(malformed("the file holds no JSON object".into()));
        };
        match object.get("format") {
            Some(Value::String(f)) if f == FORMAT => {}
            Some(f) => return Err(malformed(format!("format is {f}, expected \"{FORMAT}\""))),
            None => return Err(malformed("it has no format field".into())),
        }
        match object.get("version") {
            Some(v) if v.as_u64() == Some(VERSION) => {}
            Some(v) => match v.as_u64() {
                Some(found) => return Err(LatencyFileError::Version { path: path.to_path_buf(), found }),
                None => return Err(malformed(format!("version is {v}, expected a whole number"))),
            },
            None => return Err(malformed("it has no version field".into())),
        }
        let file: FileV1 = serde_json::from_value(value).map_err(|e| malformed(e.to_string()))?;
        let coefficients = Coefficients { pass: file.pass, unit: file.unit, setup: file.setup, fit: file.fit };
        if let Some((field, value)) = coefficients.first_invalid() {
            return Err(LatencyFileError::BadValue { path: path.to_path_buf(), field, value });
        }
        Ok(coefficients)
    }
}

/// Replaces `path` with `bytes` atomically (see [`Coefficients::save`]); a failure removes
/// the temporary file.
fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let tmp = dir.join(tmp_name);
    let written = (|| {
        let mut f = File::options().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_what_is_wrong() {
        let p = Path::new("x.json");
        let err = |s: &str| Coefficients::from_json(p, s.as_bytes()).unwrap_err().to_string();
        assert!(err("[1, 2]").contains("no JSON object"));
        assert!(err("{}").contains("no format field"));
        assert!(err(r#"{"format": "other"}"#).contains("format is \"other\""));
        assert!(err(r#"{"format": "blink-latency-model"}"#).contains("no version field"));
        assert!(err(r#"{"format": "blink-latency-model", "version": "1"}"#).contains("expected a whole number"));
        assert!(err(r#"{"format": "blink-latency-model", "version": 1}"#).contains("version 1, this build reads version 2"));
        assert!(err(r#"{"format": "blink-latency-model", "version": 2}"#).contains("missing field"));
    }
}
