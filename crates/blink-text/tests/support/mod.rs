//! What blink-text's tests on the default model share: finding the model (fetched on first
//! use). blink-text comes before blink-model in the workspace's dependency order, dev
//! dependencies included, so the tests compile blink-model's own `fetch` module instead of
//! depending on the crate.

#[allow(dead_code)]
#[path = "../../../blink-model/src/fetch.rs"]
pub mod fetch;
