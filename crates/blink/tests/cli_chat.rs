//! `blink chat` on the real model: a scripted two-turn conversation through stdin. At
//! temperature 0 the first reply must equal `blink run`'s for the same message (the chat
//! template is applied the same way), and the second turn must build on the first. Input
//! is read as llama-cli reads it: backslashed lines, escapes, Ctrl-C stopping a reply, and
//! on a terminal (a pty here) a pasted message longer than the line discipline holds.

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

/// The replies of a scripted chat: the text between its `> ` prompts.
fn replies(text: &str) -> Vec<String> {
    text.split("> ").map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

#[test]
fn messages_continue_over_backslashed_lines_and_take_escapes() {
    let model = model_path();
    let model = model.to_str().unwrap();
    let greedy = ["--temp", "0", "-n", "8", "-t", THREADS];
    let run = blink(&[&["run", "-m", model, "-p", "Name a colour.\\nThen name a fruit."][..], &greedy].concat());
    ok(&run);
    let want = stdout(&run).trim().to_string();
    // As llama-cli: a trailing backslash continues the message, \n is a newline.
    for input in [&b"Name a colour.\\\nThen name a fruit.\n"[..], b"Name a colour.\\nThen name a fruit.\n"] {
        let out = blink_with_stdin(&[&["chat", "-m", model][..], &greedy].concat(), input);
        ok(&out);
        assert_eq!(replies(&stdout(&out)), std::slice::from_ref(&want), "{}", String::from_utf8_lossy(input));
    }
    let literal = blink(&[&["run", "-m", model, "--no-escape", "-p", "Name a colour.\\nThen name a fruit."][..], &greedy].concat());
    let out = blink_with_stdin(&[&["chat", "-m", model, "--no-escape"][..], &greedy].concat(), b"Name a colour.\\nThen name a fruit.\n");
    ok(&out);
    assert_eq!(replies(&stdout(&out)), [stdout(&literal).trim().to_string()]);
}

#[test]
fn ctrl_c_stops_a_reply_and_the_chat_goes_on() {
    use std::io::Read;
    let model = model_path();
    let args = ["chat", "-m", model.to_str().unwrap(), "--temp", "0", "-n", "600", "-t", THREADS];
    let story = b"Tell me a long story about a dragon.\n";
    let whole = blink_with_stdin(&args, story);
    ok(&whole);
    let whole = replies(&stdout(&whole)).remove(0);

    let mut child = Command::new(env!("CARGO_BIN_EXE_blink")).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    stdin.write_all(story).unwrap();
    // Wait for the reply to start streaming, then interrupt it.
    let mut seen = Vec::new();
    while String::from_utf8_lossy(&seen).split_once("> ").is_none_or(|(_, reply)| reply.len() <= 4) {
        let mut buf = [0u8; 256];
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "chat ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend(&buf[..n]);
    }
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    stdin.write_all(b"Hi\n").unwrap();
    drop(stdin);
    stdout.read_to_end(&mut seen).unwrap();
    let status = child.wait().unwrap();
    let text = String::from_utf8_lossy(&seen);
    assert!(status.success(), "{status:?}: {text}");
    let replies = replies(&text);
    assert_eq!(replies.len(), 2, "a cut reply, then a reply to the next message: {text}");
    assert!(whole.starts_with(&replies[0]) && replies[0].len() * 3 < whole.len(), "the reply was not cut short: {replies:?}, whole {whole:?}");
}

/// A pseudo-terminal: (master, slave), neither inherited by other tests' children.
fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two new descriptors, which the files then own.
    let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    for fd in [master, slave] {
        // SAFETY: fd is open and ours. Tests run in parallel: a child of another test
        // must not hold this terminal open.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }, 0);
    }
    unsafe { (std::fs::File::from_raw_fd(master), std::fs::File::from_raw_fd(slave)) }
}

#[test]
fn a_long_message_pasted_into_a_terminal_arrives_whole() {
    use std::io::Read;
    use std::sync::mpsc;
    let model = model_path();
    let (mut master, slave) = pty();
    let mut child = Command::new(env!("CARGO_BIN_EXE_blink"))
        .args(["chat", "-m", model.to_str().unwrap(), "--temp", "0", "-n", "2", "--verbose", "-t", THREADS])
        .env("TERM", "xterm")
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave)
        .spawn()
        .unwrap();
    // A stuck chat fails the test instead of hanging it: once it makes no progress (no
    // output, no CPU time) for `STUCK`, the watchdog kills it, which ends its output and any
    // write to the terminal. A busy machine only makes it slower: the long prompt may take
    // as long as it needs to compute.
    let watchdog = Watchdog::start(child.id());
    let (tx, rx) = mpsc::channel();
    let mut reader = master.try_clone().unwrap();
    let output = watchdog.output();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            output.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    // Waits until `what` appears after byte `from` of the output; returns where it ends.
    // The output ends only when the chat does (or the watchdog killed it).
    let wait_for = |what: &str, from: usize, seen: &mut String| loop {
        if let Some(at) = seen[from..].find(what) {
            return from + at + what.len();
        }
        let chunk = rx.recv().unwrap_or_else(|_| panic!("no {what:?} before the chat ended (stuck, killed: {}): {seen:?}", watchdog.fired()));
        seen.push_str(&String::from_utf8_lossy(&chunk));
    };
    // The prompt: the line editor has the terminal, in raw mode.
    let at = wait_for("> ", 0, &mut seen);
    // 6000 bytes, past the 4095 a terminal's own line discipline holds, pasted in pieces
    // between the bracketed-paste marks a terminal sends.
    let message = "ab ".repeat(2000);
    master.write_all(b"\x1b[200~").unwrap();
    for piece in message.as_bytes().chunks(512) {
        master.write_all(piece).unwrap();
    }
    master.write_all(b"\x1b[201~\r").unwrap();
    let at = wait_for("[prompt ", at, &mut seen);
    let at = wait_for(" tokens in", at, &mut seen);
    // End of input once the editor has the terminal again: a Ctrl-D typed while the reply
    // is written reaches a cooked terminal, which keeps it as an end-of-file mark that
    // raw mode then reads as a NUL byte.
    wait_for("> ", at, &mut seen);
    master.write_all(b"\x04").unwrap();
    // Reaped with the watchdog still on, which stops once the child is gone.
    let status = child.wait().unwrap();
    let fired = watchdog.fired();
    drop(watchdog);
    assert!(status.success() && !fired, "{status:?} (stuck, killed: {fired}): {seen}");
    let evaluated: usize = seen.rsplit("[prompt ").next().unwrap().split(' ').next().unwrap().parse().unwrap();
    // "ab" and " ab" are a token each: 2000 of them, and the template's own tokens.
    assert!(evaluated > 2000, "only {evaluated} prompt tokens arrived");
}
