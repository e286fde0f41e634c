//! The adapter options of the commands (`--lora PATH`, `--lora-scaled PATH SCALE`) on the
//! real model with the golden PEFT adapter and its llama.cpp GGUF: what they change in
//! `run` and `perplexity`, that scales 0 and 1 mean what they say, and that every bad
//! adapter or scale is a one-line error naming it, exit code 1. (`bench --lora N`, the
//! random adapters of a benchmark, is in `cli_bench.rs`.)

mod support;

use std::path::PathBuf;

use support::*;

/// The golden r=8 adapter on all seven projections: the PEFT directory and its GGUF.
fn adapter_r8() -> (String, String) {
    let dir = repo_root().join("testdata/golden/lora");
    let peft = dir.join("adapter-r8");
    let gguf = dir.join("gguf/adapter-r8.f32.gguf");
    (peft.to_str().unwrap().to_string(), gguf.to_str().unwrap().to_string())
}

/// `blink run`'s greedy completion of a chat prompt with `extra` arguments.
fn run(extra: &[&str]) -> String {
    let model = model_path();
    // Greedy, so any difference is the adapter's. The adapter changes this completion's
    // eighth token ("Elena" becomes "Aria").
    let args = ["run", "-m", model.to_str().unwrap(), "-t", THREADS, "-p", "Tell me a story.", "-n", "12", "--temp", "0"];
    let out = blink(&[&args[..], extra].concat());
    ok(&out);
    stdout(&out)
}

#[test]
fn run_with_the_adapter_differs_from_the_base_and_its_peft_and_gguf_files_agree() {
    let (peft, gguf) = adapter_r8();
    let base = run(&[]);
    let with_peft = run(&["--lora", &peft]);
    let with_gguf = run(&["--lora", &gguf]);
    assert!(!base.trim().is_empty(), "the base completion is empty");
    assert_ne!(with_peft, base, "the adapter changed nothing");
    assert_eq!(with_gguf, with_peft, "the GGUF of the adapter runs differently from its PEFT directory");
}

#[test]
fn run_describes_the_adapter_it_loaded() {
    let (peft, _) = adapter_r8();
    let model = model_path();
    let out = blink(&["run", "-m", model.to_str().unwrap(), "-t", THREADS, "-p", "Hi", "-n", "1", "--temp", "0", "--lora", &peft]);
    ok(&out);
    let err = stderr(&out);
    assert!(err.contains(&format!("adapter {peft}: rank 8, alpha 16, scale 1")), "{err}");
}

#[test]
fn lora_scaled_zero_is_the_base_and_one_is_plain_lora() {
    let (peft, _) = adapter_r8();
    let base = run(&[]);
    let lora = run(&["--lora", &peft]);
    assert_ne!(lora, base, "the adapter changed nothing");
    assert_eq!(run(&["--lora-scaled", &peft, "0"]), base, "scale 0 is not the base model");
    assert_eq!(run(&["--lora-scaled", &peft, "1"]), lora, "scale 1 is not --lora");
}

/// `blink run` with `extra` fails with exit code 1 and one line on stderr holding every
/// one of `want`.
fn fails_naming(extra: &[&str], want: &[&str]) {
    let model = model_path();
    let args = ["run", "-m", model.to_str().unwrap(), "-t", THREADS, "-p", "hi", "-n", "2", "--temp", "0"];
    let out = blink(&[&args[..], extra].concat());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{extra:?}: want exit code 1, got {}: {err}", out.status);
    assert!(stdout(&out).is_empty(), "{extra:?}: printed {:?}", stdout(&out));
    let line = err.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("{extra:?}: no error line in {err:?}"));
    for w in want {
        assert!(line.contains(w), "{extra:?}: the error does not name {w:?}: {line}");
    }
    assert!(!err.contains("panicked"), "{extra:?}: {err}");
}

/// A scratch file of this test binary's, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, contents: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("blink-cli-lora-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_missing_adapter_is_an_error_naming_it() {
    let missing = repo_root().join("testdata/golden/lora/no-such-adapter");
    let missing = missing.to_str().unwrap();
    fails_naming(&["--lora", missing], &["--lora", missing, "No such file"]);
    fails_naming(&["--lora-scaled", missing, "0.5"], &[missing]);
}

#[test]
fn a_file_that_is_not_an_adapter_is_an_error_naming_it() {
    // The base model itself: a GGUF, but a model's.
    let model = model_path();
    let model = model.to_str().unwrap();
    fails_naming(&["--lora", model], &["--lora", model, "not a LoRA adapter"]);
    let text = TempFile::new("notes.txt", b"not an adapter\n");
    fails_naming(&["--lora", text.path()], &["--lora", text.path(), "neither a PEFT adapter directory"]);
    // An adapter's directory without its files.
    let empty = repo_root().join("testdata/golden");
    fails_naming(&["--lora", empty.to_str().unwrap()], &["--lora", "adapter_config.json"]);
}

#[test]
fn a_bad_scale_is_an_error_naming_the_adapter_and_the_scale() {
    let (peft, _) = adapter_r8();
    fails_naming(&["--lora-scaled", &peft, "abc"], &["--lora-scaled", &peft, "'abc' is not a number"]);
    // (`-inf` is not reached: clap takes it for an option, a usage error of exit code 2.)
    for scale in ["inf", "nan"] {
        fails_naming(&["--lora-scaled", &peft, scale], &["--lora-scaled", &peft, "must be finite", scale]);
    }
}

/// `blink perplexity`'s final estimate over a short text, with `extra` arguments.
fn perplexity(extra: &[&str]) -> f64 {
    let model = model_path();
    let file = repo_root().join("testdata/golden/gpl-3-excerpt.txt");
    let args = ["perplexity", "-m", model.to_str().unwrap(), "-f", file.to_str().unwrap(), "-c", "128", "--chunks", "2", "-t", THREADS];
    let out = blink(&[&args[..], extra].concat());
    ok(&out);
    let text = stdout(&out);
    text.lines()
        .find_map(|l| l.strip_prefix("Final estimate: PPL = "))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no final estimate in {text:?}"))
}

#[test]
fn perplexity_with_the_adapter_differs_from_the_base_and_its_files_agree() {
    let (peft, gguf) = adapter_r8();
    let base = perplexity(&[]);
    let with_peft = perplexity(&["--lora", &peft]);
    assert!(base.is_finite() && with_peft.is_finite(), "base {base}, adapter {with_peft}");
    assert!((with_peft - base).abs() > 1e-3 * base, "the adapter left the perplexity at {base}: {with_peft}");
    assert_eq!(perplexity(&["--lora", &gguf]), with_peft, "the GGUF scores differently from the PEFT directory");
    assert_eq!(perplexity(&["--lora-scaled", &peft, "0"]), base, "scale 0 is not the base model");
}
