//! The state directory of a server that runs fine-tuning jobs (`blink serve --state-dir`):
//! uploaded files (`files`) and fine-tuning jobs with their events (`jobs`). Everything
//! in it is written through [`crate::durable`], so a kill -9 at any moment leaves each
//! record either as it was or as it became, never half-written.

pub mod files;
pub mod jobs;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use thiserror::Error;

use crate::data::DataError;
use crate::durable;

pub use files::{FileRecord, FileStore, PURPOSE_FINE_TUNE};
pub use jobs::{Hyperparameters, JobEvent, JobRecord, JobSpec, JobStatus, JobStore};

/// Why the store refused or failed an operation.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("{0}")]
    Invalid(String),
    #[error("the file is not valid fine-tuning data: {0}")]
    BadData(DataError),
    #[error("no {what} with id '{id}'")]
    NotFound { what: &'static str, id: String },
    /// A request the record's state does not allow (cancelling a finished job, ...).
    #[error("{0}")]
    Conflict(String),
    #[error("no space left on the device for {}", .0.display())]
    NoSpace(PathBuf),
    #[error("{action} {}: {source}", path.display())]
    Io { path: PathBuf, action: &'static str, source: std::io::Error },
}

impl StoreError {
    fn io(path: &Path, action: &'static str, source: std::io::Error) -> StoreError {
        if durable::is_no_space(&source) {
            StoreError::NoSpace(path.to_path_buf())
        } else {
            StoreError::Io { path: path.to_path_buf(), action, source }
        }
    }
}

/// One page of `all` (newest first) in OpenAI's cursor paging: up to `limit` items after
/// the one whose id is `after` (from the start when `after` is unknown), and whether more
/// follow.
pub(crate) fn page<T: Clone>(all: &[T], id: impl Fn(&T) -> &str, after: Option<&str>, limit: usize) -> (Vec<T>, bool) {
    let start = after.map_or(0, |a| all.iter().position(|x| id(x) == a).map_or(all.len(), |p| p + 1));
    let rest = &all[start..];
    (rest.iter().take(limit).cloned().collect(), rest.len() > limit)
}

/// Seconds since the Unix epoch, as OpenAI's `created_at`.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A fresh id: `prefix` and 24 hex digits: the clock in microseconds (14 digits, kept
/// increasing within the process), then 10 digits of the clock, the process and a counter,
/// mixed. Ids thus sort in the order they were made, which lists made within one second
/// (their `created_at`) page in.
fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static LAST_MICROS: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let micros = nanos / 1000;
    let prev = LAST_MICROS.fetch_max(micros, Ordering::Relaxed);
    let micros = if prev >= micros { LAST_MICROS.fetch_add(1, Ordering::Relaxed) + 1 } else { micros };
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mix = blink_model::train::mix64;
    let lo = mix(n ^ mix(nanos.rotate_left(17) ^ mix(u64::from(std::process::id()))));
    format!("{prefix}{:014x}{:010x}", micros & ((1 << 56) - 1), lo & ((1 << 40) - 1))
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_sort_in_the_order_they_were_made() {
        let ids: Vec<String> = (0..1000).map(|_| super::new_id("ftjob-")).collect();
        assert!(ids.iter().all(|id| id.len() == "ftjob-".len() + 24 && id[6..].chars().all(|c| c.is_ascii_hexdigit())), "{ids:?}");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    }
}
