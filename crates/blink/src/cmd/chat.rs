//! `blink chat`: an interactive conversation on the terminal, streamed token by token.
//!
//! Each turn re-renders the whole conversation with the chat template; the session reuses
//! the cached prefix, as llama.cpp's server does, so only the new turn is evaluated (from
//! the last reply on, when its text tokenizes otherwise than it was generated).
//!
//! Input follows llama-cli: a line ending in `\` continues on the next, escapes such as
//! `\n` are processed (`--no-escape` keeps them), and Ctrl-C stops a streaming reply while
//! the chat goes on (at the prompt it ends the program).

use std::io::{self, BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use blink_engine::{GenerateParams, Session, SessionConfig};
use blink_model::chat_template::{ChatMessage, ChatTemplate};

use crate::common::{chat_prompt, process_escapes, rate, CliResult, ComputeArgs, Loaded, ModelArgs, SamplingArgs};

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
    compute: ComputeArgs,
}

pub fn main(args: Args) -> CliResult {
    let mut loaded = Loaded::load_with(&args.model, Some(&args.compute))?;
    if loaded.template.is_none() {
        eprintln!("blink: warning: {}", ChatTemplate::MISSING);
        loaded.template = Some(ChatTemplate::chatml());
    }
    let cfg = SessionConfig {
        n_ctx: args.compute.ctx(&loaded.model),
        n_threads: args.compute.threads()?,
        n_batch: args.compute.batch_size,
        kv_type: args.compute.cache_type,
    };
    let mut session = Session::new(&loaded.model, &cfg)?;
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
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let stdout = std::io::stdout();
    loop {
        {
            let mut out = stdout.lock();
            write!(out, "\n> ")?;
            out.flush()?;
        }
        let message = match read_message(&mut lines, !args.no_escape)? {
            Input::End => break,
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

/// What the user typed next.
enum Input {
    Message(String),
    /// A message that could not be read as text; it was reported and dropped.
    Skipped,
    End,
}

/// The next message: a line, joined with the lines after it while it ends in a backslash (as
/// llama-cli reads multi-line input), its escapes processed when `escapes` is set.
fn read_message(lines: &mut impl Iterator<Item = io::Result<String>>, escapes: bool) -> io::Result<Input> {
    let mut text = String::new();
    loop {
        match lines.next() {
            None if text.is_empty() => return Ok(Input::End),
            None => break,
            Some(Ok(line)) => match line.strip_suffix('\\') {
                Some(part) => {
                    text.push_str(part);
                    text.push('\n');
                }
                None => {
                    text.push_str(&line);
                    break;
                }
            },
            // The reader has consumed the line: say so, and go on with the next message.
            Some(Err(e)) if e.kind() == io::ErrorKind::InvalidData => {
                eprintln!("error: that line is not UTF-8 text; it was ignored");
                return Ok(Input::Skipped);
            }
            Some(Err(e)) => return Err(e),
        }
    }
    if !escapes {
        return Ok(Input::Message(text));
    }
    match String::from_utf8(process_escapes(&text)) {
        Ok(text) => Ok(Input::Message(text)),
        Err(_) => {
            eprintln!("error: that message is not UTF-8 once its escapes are processed; it was ignored (--no-escape takes them literally)");
            Ok(Input::Skipped)
        }
    }
}
