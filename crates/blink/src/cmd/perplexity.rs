//! `blink perplexity`: llama.cpp-comparable perplexity of a text file.

use std::io::Write;

use blink_engine::perplexity::{perplexity, PerplexityConfig};

use crate::common::{CliResult, ComputeArgs, Loaded, ModelArgs};

#[derive(clap::Args)]
#[command(mut_arg("ctx_size", |a| a.help("Context size in tokens of each chunk (default: 512, as llama.cpp's perplexity)")))]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to evaluate.
    #[arg(short = 'f', long = "file")]
    file: std::path::PathBuf,
    /// Evaluate at most this many chunks (at least 1).
    #[arg(long = "chunks", value_parser = clap::value_parser!(u64).range(1..))]
    chunks: Option<u64>,
    #[command(flatten)]
    compute: ComputeArgs,
}

pub fn main(args: Args) -> CliResult {
    let text = std::fs::read(&args.file).map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let text = String::from_utf8_lossy(&text);
    let loaded = Loaded::load_with(&args.model, Some(&args.compute))?;
    let tokens = loaded.tokenizer.encode(&text, true, false);
    let ctx = args.compute.ctx_size.filter(|&c| c > 0).unwrap_or(512);
    let cfg = PerplexityConfig {
        ctx,
        n_batch: args.compute.batch_size.min(ctx),
        n_threads: args.compute.threads()?,
        kv_type: args.compute.cache_type,
        max_chunks: args.chunks.map(|c| usize::try_from(c).unwrap_or(usize::MAX)),
    };
    let chunks = (tokens.len() / ctx).min(cfg.max_chunks.unwrap_or(usize::MAX));
    eprintln!("blink: {} tokens, {chunks} chunks of {ctx}", tokens.len());
    let started = std::time::Instant::now();
    let mut err = std::io::stderr();
    let result = perplexity(&loaded.model, &tokens, &cfg, &mut |chunk, ppl| {
        let _ = write!(err, "[{chunk}]{ppl:.4},");
        let _ = err.flush();
    })?;
    eprintln!();
    eprintln!("blink: {} tokens scored in {:.2} s", result.scored_tokens, started.elapsed().as_secs_f64());
    println!("Final estimate: PPL = {:.4} +/- {:.5}", result.ppl, result.stderr);
    Ok(())
}
