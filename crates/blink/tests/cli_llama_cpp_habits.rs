//! What a llama.cpp user types works here too: backslash escapes in prompts, values that
//! start with `-`, `-ngl` and `-sys`, `--top-k -1`, `-c` past the trained context, and
//! llama-tokenize's rule for BOS and EOS and its flags, escapes in stop texts and `-r`,
//! a model without a chat template, and perplexity on standard input.

mod support;

use blink_gguf::{GgufFile, GgufWriter, Value};
use support::*;

fn ids(out: &std::process::Output) -> Vec<u64> {
    ok(out);
    serde_json::from_str(stdout(out).trim()).expect("a JSON array of ids")
}

#[test]
fn escapes_in_a_prompt_stand_for_their_characters() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let mut checked = 0;
    for case in golden()["tokenize"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        if text.contains('\\') || !(text.contains('\n') || text.contains('\t')) {
            continue;
        }
        let want: Vec<u64> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        // Newlines and tabs written as escapes, the first character as \xNN when ASCII.
        let mut escaped = text.replace('\n', "\\n").replace('\t', "\\t");
        if let Some(c) = text.chars().next().filter(char::is_ascii) {
            escaped = format!("\\x{:02x}{}", c as u32, &escaped[1..]);
        }
        assert_eq!(ids(&blink(&["tokenize", "-m", model, "-p", &escaped])), want, "tokenize {escaped:?}");
        // Taken literally, they are backslashes.
        assert_ne!(ids(&blink(&["tokenize", "-m", model, "--no-escape", "-p", &escaped])), want, "tokenize --no-escape {escaped:?}");
        checked += 1;
    }
    assert!(checked > 0, "no golden text with a newline or tab");
    // An escape that makes invalid UTF-8 is a clear error.
    let out = blink(&["tokenize", "-m", model, "-p", "a\\xff"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not UTF-8 once its escapes are processed"), "{}", stderr(&out));
}

#[test]
fn values_starting_with_a_dash_are_values() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let file = std::env::temp_dir().join(format!("blink-dash-{}.txt", std::process::id()));
    std::fs::write(&file, "- item one\n- item two").unwrap();
    let from_file = ids(&blink(&["tokenize", "-m", model, "-f", file.to_str().unwrap()]));
    let _ = std::fs::remove_file(&file);
    assert_eq!(ids(&blink(&["tokenize", "-m", model, "-p", "- item one\\n- item two"])), from_file);
    let out = blink(&["run", "-m", model, "-p", "-5 degrees", "--system", "-be brief", "--stop", "-x", "-n", "2", "-t", THREADS]);
    ok(&out);
}

#[test]
fn llama_cpp_spellings_are_understood() {
    let model = model_path();
    let model = model.to_str().unwrap();
    // -ngl is dropped with a note (a CPU engine), -sys is --system, top-k -1 is off.
    let out = blink(&["run", "-m", model, "-p", "hi", "-n", "2", "-ngl", "99", "-sys", "Be brief.", "--top-k", "-1", "-t", THREADS]);
    ok(&out);
    assert!(stderr(&out).contains("-ngl ignored"), "{}", stderr(&out));
    // -c past the trained context runs, with llama.cpp's warning; -c 0 is the trained one.
    let out = blink(&["run", "-m", model, "-p", "hi", "-n", "1", "-c", "9000", "-t", THREADS]);
    ok(&out);
    assert!(stderr(&out).contains("exceeds the 8192 this model was trained with"), "{}", stderr(&out));
    let out = blink(&["run", "-m", model, "-p", "hi", "-n", "1", "-c", "0", "-t", THREADS]);
    ok(&out);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

/// The default model's tokenizer metadata with `add_bos_token` and `add_eos_token` set, and
/// no tensors (tokenizing needs none).
fn tokenizer_with(add_bos: bool, add_eos: bool) -> std::path::PathBuf {
    let file = GgufFile::open(model_path()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        if k.starts_with("tokenizer.") || k == "general.architecture" {
            w.add(k.as_str(), v.clone()).unwrap();
        }
    }
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(add_bos)).unwrap();
    w.set("tokenizer.ggml.add_eos_token", Value::Bool(add_eos)).unwrap();
    let path = std::env::temp_dir().join(format!("blink-specials-{}-{add_bos}-{add_eos}.gguf", std::process::id()));
    w.write(&path).unwrap();
    path
}

#[test]
fn tokenize_adds_bos_and_eos_as_llama_tokenize_does() {
    let plain = ids(&blink(&["tokenize", "-m", model_path().to_str().unwrap(), "-p", "Hello world"]));
    let (bos, eos) = (1u64, 2u64);
    for (add_bos, add_eos, no_bos, want) in [
        (true, true, false, [vec![bos], plain.clone(), vec![eos]].concat()),
        (true, true, true, plain.clone()),
        (true, false, false, [vec![bos], plain.clone()].concat()),
        // llama-tokenize adds the specials only when the model asks for BOS.
        (false, true, false, plain.clone()),
    ] {
        let path = tokenizer_with(add_bos, add_eos);
        let mut args = vec!["tokenize", "-m", path.to_str().unwrap(), "-p", "Hello world"];
        if no_bos {
            args.push("--no-bos");
        }
        let got = ids(&blink(&args));
        let _ = std::fs::remove_file(&path);
        assert_eq!(got, want, "add_bos {add_bos}, add_eos {add_eos}, --no-bos {no_bos}");
    }
}

#[test]
fn stop_texts_take_escapes_and_llama_cpp_spellings() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-m", model, "--raw", "-p", "The capital of France is", "-n", "32", "--temp", "0", "-t", THREADS];
        args.extend(extra);
        let out = blink(&args);
        ok(&out);
        let text = stdout(&out);
        text.strip_suffix('\n').unwrap_or(&text).to_string()
    };
    let full = run(&[]);
    let line = full.split('\n').next().unwrap();
    assert!(line.len() < full.len(), "the reply should run past its first line: {full:?}");
    for stop in [["--stop", "\\n"], ["-r", "\\n"], ["--reverse-prompt", "\\n"]] {
        assert_eq!(run(&stop), line, "{stop:?}");
    }
    // Taken literally, a backslash and an n never come.
    assert_eq!(run(&["--no-escape", "--stop", "\\n"]), full);
}

#[test]
fn tokenize_takes_llama_tokenize_flags() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let plain = ids(&blink(&["tokenize", "-m", model, "-p", "Hello world"]));
    let out = blink(&["tokenize", "-m", model, "-p", "Hello world", "--ids", "--log-disable", "--show-count"]);
    ok(&out);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(serde_json::from_str::<Vec<u64>>(lines[0]).unwrap(), plain);
    assert_eq!(lines[1..], [format!("Total number of tokens: {}", plain.len())]);
    assert_eq!(ids(&blink_with_stdin(&["tokenize", "-m", model, "--stdin"], b"Hello world\n")), plain);
}

/// A copy of the default model whose chat template key is renamed away. Removed on drop.
struct NoTemplate(std::path::PathBuf);

impl NoTemplate {
    fn new() -> NoTemplate {
        let mut bytes = std::fs::read(model_path()).unwrap();
        let key = b"tokenizer.chat_template";
        let at = bytes.windows(key.len()).position(|w| w == key).unwrap();
        bytes[at + key.len() - 1] = b'X';
        let path = std::env::temp_dir().join(format!("blink-no-template-{}.gguf", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        NoTemplate(path)
    }
}

impl Drop for NoTemplate {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_model_without_a_chat_template_completes_and_chats_in_chatml() {
    let model = model_path();
    let copy = NoTemplate::new();
    let copy_path = copy.0.to_str().unwrap();
    let greedy = ["-n", "8", "--temp", "0", "-t", THREADS];
    // `run` completes the prompt as it is, as llama-cli does for a base model.
    let out = blink(&[&["run", "-m", copy_path, "-p", "The capital of France is"][..], &greedy].concat());
    ok(&out);
    assert!(stderr(&out).contains("no chat template"), "{}", stderr(&out));
    let raw = blink(&[&["run", "-m", model.to_str().unwrap(), "--raw", "-p", "The capital of France is"][..], &greedy].concat());
    assert_eq!(stdout(&out), stdout(&raw));
    // `chat` uses ChatML, as llama.cpp's server and `llama-cli -cnv` do.
    let chatml = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
    let want = blink(&[&["run", "-m", model.to_str().unwrap(), "--raw", "-p", chatml][..], &greedy].concat());
    ok(&want);
    let out = blink_with_stdin(&[&["chat", "-m", copy_path][..], &greedy].concat(), b"What is 2+2?\n");
    ok(&out);
    assert!(stderr(&out).contains("using ChatML"), "{}", stderr(&out));
    let reply = stdout(&want);
    assert!(stdout(&out).contains(reply.trim_end()), "chat said {:?}, ChatML gives {reply:?}", stdout(&out));
}

#[test]
fn perplexity_reads_standard_input() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let text = std::fs::read(repo_root().join("testdata/golden/gpl-3-excerpt.txt")).unwrap();
    let args = ["perplexity", "-m", model, "-c", "128", "--chunks", "2", "-t", THREADS, "-f", "-"];
    let from_stdin = blink_with_stdin(&args, &text);
    ok(&from_stdin);
    let path = repo_root().join("testdata/golden/gpl-3-excerpt.txt");
    let from_file = blink(&[&args[..args.len() - 1], &[path.to_str().unwrap()]].concat());
    assert_eq!(stdout(&from_stdin), stdout(&from_file));
    assert!(stdout(&from_file).starts_with("Final estimate: PPL = "), "{}", stdout(&from_file));
    // Too short a text: the error alone, without a header counting chunks.
    let out = blink_with_stdin(&args, b"Too short.");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).starts_with("error: invalid parameter: need at least 256 tokens"), "{}", stderr(&out));
}
