//! `blink tokenize`: print a text's token ids as a JSON array.

use blink_text::tokenizer::Tokenizer;

use crate::common::{CliResult, ModelArgs, PromptArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Add no BOS (nor EOS) even if the model's metadata asks for them.
    #[arg(long = "no-bos")]
    no_bos: bool,
    /// Treat special-token texts such as <|im_start|> as plain text.
    #[arg(long = "no-parse-special")]
    no_parse_special: bool,
    /// Also print `Total number of tokens: N`, as llama-tokenize does.
    #[arg(long = "show-count")]
    show_count: bool,
    /// Accepted for llama-tokenize's habits: ids are what this prints anyway.
    #[arg(long = "ids")]
    ids: bool,
    /// Accepted for llama-tokenize's habits: this prints no log.
    #[arg(long = "log-disable")]
    log_disable: bool,
}

pub fn main(args: Args) -> CliResult {
    let text = args.prompt.text()?;
    let path = args.model.path()?;
    let file = args.model.open()?;
    let tok = Tokenizer::from_gguf(&file).map_err(|e| format!("{}: {e}", path.display()))?;
    // As llama-tokenize: the model's BOS and EOS are added together, only when it asks for
    // BOS and `--no-bos` is not given.
    let ids = tok.encode(&text, tok.add_bos() && !args.no_bos, !args.no_parse_special);
    outln!("{}", serde_json::to_string(&ids)?)?;
    if args.show_count {
        outln!("Total number of tokens: {}", ids.len())?;
    }
    Ok(())
}
