//! `blink tokenize`: print a text's token ids as a JSON array.

use blink_model::tokenizer::Tokenizer;

use crate::common::{CliResult, ModelArgs, PromptArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Do not add BOS even if the model's metadata asks for it.
    #[arg(long = "no-bos")]
    no_bos: bool,
    /// Treat special-token texts such as <|im_start|> as plain text.
    #[arg(long = "no-parse-special")]
    no_parse_special: bool,
}

pub fn main(args: Args) -> CliResult {
    let text = args.prompt.text()?;
    let path = args.model.path()?;
    let file = args.model.open()?;
    let tok = Tokenizer::from_gguf(&file).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut ids = tok.encode(&text, false, !args.no_parse_special);
    if !args.no_bos && tok.add_bos() {
        if let Some(bos) = tok.bos() {
            ids.insert(0, bos);
        }
    }
    if tok.add_eos() {
        if let Some(eos) = tok.eos() {
            ids.push(eos);
        }
    }
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
