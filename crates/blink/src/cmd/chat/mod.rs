//! `blink chat`: an interactive conversation on the terminal, streamed token by token.
//!
//! Each turn re-renders the whole conversation with the chat template; the session reuses
//! the cached prefix, as llama.cpp's server does, so only the new turn is evaluated (from
//! the last reply on, when its text tokenizes otherwise than it was generated).
//!
//! Input follows llama-cli (see `input`), and Ctrl-C stops a streaming reply while the
//! chat goes on (at the prompt it ends the program).

mod input;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use blink_engine::{GenerateParams, Session};
use blink_text::chat_template::ChatMessage;

use crate::lora_args::LoraArgs;
use crate::common::{chat_prompt, load_model, rate, CliResult, ComputeArgs, ModelArgs, SamplingArgs};
use input::{Input, Reader};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// System message opening the conversation.
    #[arg(long = "system", alias = "system-prompt", allow_hyphen_values = true)]
    system: Option<String>,
    /// Most tokens per reply (-1 or -2: until the end of the turn or a full context).
    #[arg(short = 'n', long = "max-tokens", alias = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    max_tokens: i64,
    /// Print speed after each reply.
    #[arg(long)]
    verbose: bool,
    /// Take backslash escapes in messages literally.
    #[arg(long = "no-escape")]
    no_escape: bool,

    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    lora: LoraArgs,
    #[command(flatten)]
    compute: ComputeArgs,
}

pub fn main(args: Args) -> CliResult {
    let mut loaded = load_model(&args.model, Some(&args.compute))?;
    if let Some(w) = loaded.chatml_if_missing() {
        eprintln!("blink: warning: {w}");
    }
    let cfg = args.compute.session_config(&mut loaded.model)?;
    let mut session = Session::new(&loaded.model, &cfg)?;
    session.set_adapter(args.lora.load(&loaded.model)?)?;
    let mut messages: Vec<ChatMessage> = args.system.iter().map(|s| ChatMessage::new("system", s)).collect();
    let params = GenerateParams {
        max_tokens: crate::common::max_tokens(args.max_tokens)?,
        sampling: args.sampling.params(cfg.n_ctx)?,
        stop: Vec::new(),
        ignore_eos: false,
        interrupt: Some(&INTERRUPTED),
    };
    // SAFETY: the handler only touches atomics and calls the async-signal-safe `_exit`.
    unsafe { libc::signal(libc::SIGINT, on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    eprintln!("blink chat: {} — type a message, /reset to start over, Ctrl-D to quit", loaded.model.cfg.name);
    let mut reader = Reader::new();
    let stdout = std::io::stdout();
    loop {
        let message = match reader.message(!args.no_escape)? {
            Input::End => break,
            // As a shell does, and llama-cli: Ctrl-C at the prompt ends the program.
            Input::Interrupted => std::process::exit(130),
            Input::Skipped => continue,
            Input::Message(m) => m,
        };
        let input = message.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m| m.role == "system");
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", input));
        let prompt = chat_prompt(&loaded, &messages)?;
        if prompt.len() >= cfg.n_ctx {
            messages.pop();
            eprintln!("error: the conversation ({} tokens) no longer fits the context of {}; /reset to start over", prompt.len(), cfg.n_ctx);
            continue;
        }
        let mut out = stdout.lock();
        INTERRUPTED.store(false, Ordering::SeqCst);
        REPLYING.store(true, Ordering::SeqCst);
        let g = session.generate(&loaded.tokenizer, &prompt, &params, &mut |t| {
            let _ = out.write_all(t.as_bytes());
            let _ = out.flush();
        });
        REPLYING.store(false, Ordering::SeqCst);
        let g = g?;
        writeln!(out)?;
        drop(out);
        if args.verbose {
            eprintln!("[prompt {}; reply {}]", rate(g.prompt_evaluated, g.prompt_time), rate(g.tokens.len(), g.gen_time));
        }
        if g.context_full {
            eprintln!("(the context is full; /reset to start over)");
        }
        messages.push(ChatMessage::new("assistant", &g.text));
    }
    Ok(())
}

/// Set while a reply streams: Ctrl-C then stops the reply instead of the program.
static REPLYING: AtomicBool = AtomicBool::new(false);
/// Set by Ctrl-C during a reply; generation stops at the next token.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    if REPLYING.load(Ordering::SeqCst) {
        INTERRUPTED.store(true, Ordering::SeqCst);
    } else {
        // SAFETY: `_exit` is async-signal-safe; 130 is a shell's code for an interrupt.
        unsafe { libc::_exit(130) };
    }
}
