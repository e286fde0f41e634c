//! `blink chat`: an interactive conversation on the terminal, streamed token by token.
//!
//! Each turn re-renders the whole conversation with the chat template; the session reuses
//! the cached prefix, so only the new turn is evaluated.

use std::io::{BufRead, Write};

use blink_engine::{GenerateParams, Session, SessionConfig};
use blink_model::chat_template::{ChatMessage, ChatTemplate};

use crate::common::{chat_prompt, rate, CliResult, ComputeArgs, Loaded, ModelArgs, SamplingArgs};

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
    };
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
        let line = match lines.next() {
            None => break,
            Some(Ok(line)) => line,
            // The reader has consumed the line: say so, and go on with the next one.
            Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                eprintln!("error: that line is not UTF-8 text; it was ignored");
                continue;
            }
            Some(Err(e)) => return Err(e.into()),
        };
        let input = line.trim();
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
        let g = session.generate(&loaded.tokenizer, &prompt, &params, &mut |t| {
            let _ = out.write_all(t.as_bytes());
            let _ = out.flush();
        })?;
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
