//! `blink`: the command-line front end.
//!
//! One binary with llama.cpp-style subcommands. Each subcommand lives in its own module
//! under `cmd/`; this file only parses arguments and turns errors into one line and a
//! non-zero exit code.

mod cmd;
mod common;

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
    /// Show a model's architecture, hyper-parameters, tensor types and tokenizer.
    Info(cmd::info::Args),
}

fn main() {
    // llama.cpp's servers spell --parallel `-np`; clap's short flags are one letter.
    let args: Vec<_> = std::env::args_os().collect();
    let serving = args.get(1).is_some_and(|c| c == "serve" || c == "bench-serve");
    if !serving {
        // Like other command-line tools, end quietly when the reader of our output goes
        // away (`blink info | head`): Rust ignores SIGPIPE, which turns every later print
        // into a panic, and a `run` would keep generating for nobody. A server keeps
        // ignoring it (its sockets report errors per client instead).
        // SAFETY: restoring a signal's default action, before any other thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let cli = Cli::parse_from(args.into_iter().map(|a| if serving && a == "-np" { "--parallel".into() } else { a }));
    let result = match cli.command {
        Command::Run(a) => cmd::run::main(a),
        Command::Chat(a) => cmd::chat::main(a),
        Command::Tokenize(a) => cmd::tokenize::main(a),
        Command::Perplexity(a) => cmd::perplexity::main(a),
        Command::Info(a) => cmd::info::main(a),
        Command::Bench(a) => cmd::bench::main(a),
        Command::Serve(a) => cmd::serve::main(a),
        Command::BenchServe(a) => cmd::bench_serve::main(a),
    };
    if let Err(e) = result {
        // One line, whatever the error chain.
        let msg = e.to_string().replace('\n', " ");
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
