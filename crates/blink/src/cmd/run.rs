//! `blink run`: complete one prompt, print only the generated text on stdout.

use std::io::Write;

use blink_engine::{GenerateParams, Generation, Session, Steps};
use blink_text::chat_template::ChatMessage;
use blink_text::{ChatTemplate, Tokenizer};

use crate::lora_args::LoraArgs;
use crate::common::{load_model, rate, CliResult, ComputeArgs, ModelArgs, PromptArgs, SamplingArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Use the prompt as is, without the chat template (the default for a model that has
    /// none); special tokens written in it (such as <|im_start|>) are parsed as tokens.
    #[arg(long)]
    raw: bool,
    /// System message (chat-template mode only).
    #[arg(long = "system", alias = "system-prompt", allow_hyphen_values = true)]
    system: Option<String>,
    /// Most tokens to generate (-1 or -2: until the end of generation or a full context).
    #[arg(short = 'n', long = "max-tokens", alias = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    max_tokens: i64,
    /// Stop before this text (repeatable; escapes processed as in the prompt; also
    /// llama.cpp's `-r`/`--reverse-prompt`).
    #[arg(short = 'r', long = "stop", alias = "reverse-prompt", allow_hyphen_values = true)]
    stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    ignore_eos: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    lora: LoraArgs,
    #[command(flatten)]
    compute: ComputeArgs,
    #[command(flatten)]
    ring: super::cluster::RingArgs,
}

pub fn main(args: Args) -> CliResult {
    let text = args.prompt.text()?;
    if let Some(path) = &args.ring.cluster {
        args.compute.kernel.apply()?;
        let head = super::cluster::start(path, &args.ring.shim, &args.model, &super::cluster::HeadSizes::of(&args.compute)?)?;
        let prompt = prompt_tokens(&args, &text, &head.tokenizer, head.template.as_ref())?;
        let adapters = args.lora.load(&head.model)?;
        let mut session = Session::over(head.ring, head.n_ctx, head.n_batch)?;
        session.set_adapter(adapters)?;
        return complete(&args, session, &head.tokenizer, &prompt, head.n_ctx);
    }
    let mut loaded = load_model(&args.model, Some(&args.compute))?;
    let prompt = prompt_tokens(&args, &text, &loaded.tokenizer, loaded.template.as_ref())?;
    let cfg = args.compute.session_config(&mut loaded.model)?;
    let mut session = Session::new(&loaded.model, &cfg)?;
    session.set_adapter(args.lora.load(&loaded.model)?)?;
    complete(&args, session, &loaded.tokenizer, &prompt, cfg.n_ctx)
}

/// The prompt's tokens: as is with `--raw` (or for a model without a chat template, as
/// llama-cli does: a base model completes the prompt), else the user's message (and the
/// system's) in the chat template.
fn prompt_tokens(args: &Args, text: &str, tokenizer: &Tokenizer, template: Option<&ChatTemplate>) -> CliResult<Vec<u32>> {
    let Some(template) = template.filter(|_| !args.raw) else {
        if !args.raw {
            eprintln!("blink: the model has no chat template: completing the prompt as is (as --raw)");
        }
        return Ok(tokenizer.encode(text, true, true));
    };
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system));
    }
    messages.push(ChatMessage::new("user", text));
    Ok(template.prompt_tokens(tokenizer, &messages)?)
}

/// Generate the completion of `prompt` on `session`, streaming it to stdout.
fn complete<S: Steps>(args: &Args, mut session: Session<S>, tokenizer: &Tokenizer, prompt: &[u32], n_ctx: usize) -> CliResult {
    let params = GenerateParams {
        max_tokens: crate::common::max_tokens(args.max_tokens)?,
        sampling: args.sampling.params(n_ctx)?,
        stop: args.stop.iter().map(|s| args.prompt.unescape("a stop text", s.clone())).collect::<CliResult<_>>()?,
        ignore_eos: args.ignore_eos,
        interrupt: None,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut write_err = None;
    let generation: Generation = session.generate(tokenizer, prompt, &params, &mut |text| {
        if write_err.is_none() {
            if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
                write_err = Some(e);
            }
        }
    })?;
    // (A reader that went away ended the process by SIGPIPE: see main.)
    if let Some(e) = write_err {
        return Err(e.into());
    }
    let _ = writeln!(out);
    if generation.context_full {
        eprintln!("blink: stopped: the context of {n_ctx} tokens is full");
    }
    eprintln!(
        "blink: prompt {}; generated {}; finish: {}",
        rate(generation.prompt_evaluated, generation.prompt_time),
        rate(generation.tokens.len(), generation.gen_time),
        generation.finish.as_str()
    );
    Ok(())
}
