//! What blink-text's tests on the default model share: finding the model (fetched on first
//! use) and the golden outputs. blink-text comes before blink-model in the workspace's
//! dependency order, dev dependencies included, so the tests compile blink-model's own
//! `fetch` module instead of depending on the crate.

#![allow(dead_code)]

use std::path::PathBuf;

#[path = "../../../blink-model/src/fetch.rs"]
pub mod fetch;

/// `$BLINK_MODEL`, else the default model (fetched on first use).
pub fn model_path() -> PathBuf {
    match std::env::var_os("BLINK_MODEL").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => fetch::ensure_default_model().expect("fetching the default model"),
    }
}

/// `$BLINK_GOLDEN_DIR`, else the repository's `testdata/golden`.
pub fn golden_dir() -> PathBuf {
    match std::env::var_os("BLINK_GOLDEN_DIR").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden"),
    }
}
