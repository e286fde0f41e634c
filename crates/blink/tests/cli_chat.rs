//! `blink chat` on the real model: a scripted two-turn conversation through stdin. At
//! temperature 0 the first reply must equal `blink run`'s for the same message (the chat
//! template is applied the same way), and the second turn must build on the first.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use support::*;

#[test]
fn chat_streams_replies_and_keeps_the_conversation() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_blink"))
        .args(["chat", "-m", model, "--temp", "0", "-n", "12", "-t", THREADS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"What is the capital of Italy?\nAnd of France?\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "chat failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    // Three prompts: two turns, then end of input.
    let replies: Vec<&str> = text.split("> ").map(str::trim).filter(|s| !s.is_empty()).collect();
    assert_eq!(replies.len(), 2, "expected two replies, got {text:?}");

    let run = blink(&["run", "-m", model, "--temp", "0", "-n", "12", "-t", THREADS, "-p", "What is the capital of Italy?"]);
    ok(&run);
    assert_eq!(replies[0], stdout(&run).trim(), "the first chat reply differs from `blink run`");
    assert_ne!(replies[1], replies[0]);
}

#[test]
fn a_line_that_is_not_utf8_is_skipped_and_the_chat_goes_on() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let out = blink_with_stdin(&["chat", "-m", model, "--temp", "0", "-n", "4", "-t", THREADS], b"Hi\n\xff\xfe\nWhat is the capital of Italy?\n");
    let err = stderr(&out);
    assert!(out.status.success(), "chat failed: {err}");
    assert!(err.contains("not UTF-8"), "{err}");
    let text = stdout(&out);
    let replies: Vec<&str> = text.split("> ").map(str::trim).filter(|s| !s.is_empty()).collect();
    assert_eq!(replies.len(), 2, "expected replies to both good lines, got {text:?}");
}

#[test]
fn bad_sampling_options_fail_before_the_first_message() {
    let model = model_path();
    let out = blink_with_stdin(&["chat", "-m", model.to_str().unwrap(), "--top-p", "2"], b"");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("top_p must be in [0, 1]"), "{}", stderr(&out));
}
