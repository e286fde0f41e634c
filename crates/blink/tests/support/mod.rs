//! Shared helpers of the CLI tests: the real model, the golden data, and running `blink`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The default model, fetched on first use exactly as `blink` does.
pub fn model_path() -> PathBuf {
    blink_model::fetch::ensure_default_model().expect("the default model is needed for these tests")
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// llama.cpp's reference outputs for the default model.
pub fn golden() -> serde_json::Value {
    let path = repo_root().join("testdata/golden/smollm2-135m-instruct-q4_1.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden JSON parses")
}

/// Run the `blink` binary with `args`.
pub fn blink(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blink"))
        .args(args)
        .env("BLINK_LOG", "")
        .output()
        .expect("blink runs")
}

/// Run the `blink` binary with `args`, `input` on its standard input.
pub fn blink_with_stdin(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_blink"))
        .args(args)
        .env("BLINK_LOG", "")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("blink runs");
    child.stdin.take().unwrap().write_all(input).expect("blink reads its input");
    child.wait_with_output().expect("blink runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Assert `blink` succeeded, showing its stderr if not.
pub fn ok(o: &Output) {
    assert!(o.status.success(), "blink failed ({}): {}", o.status, stderr(o));
}

/// Threads for tests: two, the size of the machines this runs on.
pub const THREADS: &str = "2";
