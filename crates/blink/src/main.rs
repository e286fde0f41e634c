//! `blink`: the command-line front end.
//!
//! One binary with llama.cpp-style subcommands. Each subcommand lives in its own module
//! under `cmd/`; this file only parses arguments and turns errors into one line and a
//! non-zero exit code.

/// `println!` that hands back a failed write (stdout on a full disk) as an error, for `?`,
/// instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err(|e| format!("cannot write the output: {e}"))
    }};
}

/// Shadows std's `eprintln!` in this crate: a diagnostic that cannot be written (stderr on
/// a full disk) is lost, rather than ending the run in a panic.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod cmd;
mod common;
mod lora_args;

use clap::{Parser, Subcommand};

/// Fast LLM inference on the CPUs you already have.
#[derive(Parser)]
#[command(name = "blink", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Complete a prompt and print the generated text.
    Run(cmd::run::Args),
    /// Chat interactively, streaming the replies.
    Chat(cmd::chat::Args),
    /// Print the token ids of a text as a JSON array.
    Tokenize(cmd::tokenize::Args),
    /// Measure perplexity over a text file (llama.cpp's method).
    Perplexity(cmd::perplexity::Args),
    /// Measure prompt and generation speed (llama-bench style).
    Bench(cmd::bench::Args),
    /// Serve the model over an OpenAI-compatible HTTP API, with a chat page.
    Serve(cmd::serve::Args),
    /// Load-test a server with concurrent streaming clients.
    BenchServe(cmd::bench_serve::Args),
    /// Replay a request trace open-loop against a server: latency against SLO targets.
    Replay(Box<cmd::replay::Args>),
    /// Fine-tune a LoRA adapter on chat JSONL, on the frozen quantized model.
    Finetune(cmd::finetune::Args),
    /// Measure this machine's step times and fit the latency model (for `serve --latency`).
    Calibrate(cmd::calibrate::Args),
    /// Show a model's architecture, hyper-parameters, tensor types and tokenizer.
    Info(cmd::info::Args),
    /// Measure this device for the ring planner (JSON): products, memory, disk.
    Profile(cmd::profile::Args),
    /// Plan a ring of devices for a model (cluster.toml): windows, rounds, time per token.
    Plan(cmd::plan::Args),
    /// Serve as one device of a ring: hold the layers a head assigns and run its steps.
    Node(cmd::node::Args),
}

/// llama.cpp's multi-letter short options that mean something here, in clap's spelling
/// (its short options are one letter): `-np` (servers), `-sys` and `-ub`. Its GPU-offload option
/// `-ngl N` is dropped with a note, as llama.cpp's CPU builds do. A value given to a text
/// option (`-p -sys`) is left alone.
fn llama_cpp_spellings(args: Vec<std::ffi::OsString>, serving: bool) -> Vec<std::ffi::OsString> {
    const TEXT_OPTIONS: [&str; 10] = ["-p", "--prompt", "--system", "--system-prompt", "--stop", "-r", "--reverse-prompt", "-f", "--file", "-m"];
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.into_iter().peekable();
    while let Some(a) = it.next() {
        let after_text_option = out.last().is_some_and(|p: &std::ffi::OsString| TEXT_OPTIONS.iter().any(|o| p == o));
        match a.to_str() {
            _ if after_text_option => out.push(a),
            Some("-np") if serving => out.push("--parallel".into()),
            Some("-sys") => out.push("--system".into()),
            Some("-ub") => out.push("--ubatch-size".into()),
            Some("-ngl" | "--n-gpu-layers" | "--gpu-layers") => {
                it.next_if(|v| v.to_str().is_some_and(|v| v.parse::<i64>().is_ok() || v == "auto" || v == "all"));
                eprintln!("blink: runs on the CPU; {} ignored", a.to_string_lossy());
            }
            _ => out.push(a),
        }
    }
    out
}

fn main() {
    let args: Vec<_> = std::env::args_os().collect();
    let serving = args.get(1).is_some_and(|c| c == "serve" || c == "bench-serve" || c == "replay" || c == "node");
    if !serving {
        // Like other command-line tools, end quietly when the reader of our output goes
        // away (`blink info | head`): Rust ignores SIGPIPE, which turns every later print
        // into a panic, and a `run` would keep generating for nobody. A server keeps
        // ignoring it (its sockets report errors per client instead).
        // SAFETY: restoring a signal's default action, before any other thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let cli = Cli::parse_from(llama_cpp_spellings(args, serving));
    let result = match cli.command {
        Command::Run(a) => cmd::run::main(a),
        Command::Chat(a) => cmd::chat::main(a),
        Command::Tokenize(a) => cmd::tokenize::main(a),
        Command::Perplexity(a) => cmd::perplexity::main(a),
        Command::Info(a) => cmd::info::main(a),
        Command::Profile(a) => cmd::profile::main(a),
        Command::Plan(a) => cmd::plan::main(a),
        Command::Node(a) => cmd::node::main(a),
        Command::Finetune(a) => cmd::finetune::main(a),
        Command::Calibrate(a) => cmd::calibrate::main(a),
        Command::Bench(a) => cmd::bench::main(a),
        Command::Serve(a) => cmd::serve::main(a),
        Command::BenchServe(a) => cmd::bench_serve::main(a),
        Command::Replay(a) => cmd::replay::main(*a),
    };
    if let Err(e) = result {
        // One line, whatever the error chain.
        let msg = e.to_string().replace('\n', " ");
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
