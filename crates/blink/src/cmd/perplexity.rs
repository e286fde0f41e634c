//! `blink perplexity`: llama.cpp-comparable perplexity of a text file.

use std::io::Write;

use blink_engine::perplexity::{chunk_count, perplexity, PerplexityConfig};

use crate::lora_args::LoraArgs;
use crate::common::{load_model, read_input, CliResult, ComputeArgs, ModelArgs};

#[derive(clap::Args)]
#[command(mut_arg("ctx_size", |a| a.help("Context size in tokens of each chunk (default: 512, as llama.cpp's perplexity)")))]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to evaluate (`-`: standard input).
    #[arg(short = 'f', long = "file")]
    file: std::path::PathBuf,
    /// Evaluate at most this many chunks (at least 1).
    #[arg(long = "chunks", value_parser = clap::value_parser!(u64).range(1..))]
    chunks: Option<u64>,
    /// The micro-batch size whose numerics the rows follow, as llama-perplexity's `-ub`,
    /// (llama.cpp computes some products differently in micro-batches of fewer than
    /// eight rows, and by fours); it does not change how many rows a step takes (`-b`).
    #[arg(long = "ubatch-size", default_value_t = blink_model::LLAMA_UBATCH, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    ubatch: usize,
    #[command(flatten)]
    lora: LoraArgs,
    #[command(flatten)]
    compute: ComputeArgs,
}

pub fn main(args: Args) -> CliResult {
    let text = read_input(&args.file)?;
    let text = String::from_utf8_lossy(&text);
    let mut loaded = load_model(&args.model, Some(&args.compute))?;
    let tokens = loaded.tokenizer.encode(&text, true, false);
    let ctx = args.compute.ctx_size.filter(|&c| c > 0).unwrap_or(512);
    loaded.model.fit_context(ctx);
    if let Some(w) = loaded.model.cfg.context_warning(ctx) {
        eprintln!("blink: warning: {w}");
    }
    let cfg = PerplexityConfig {
        ctx,
        n_batch: args.compute.batch_size.min(ctx),
        ubatch: args.ubatch,
        n_threads: args.compute.threads()?,
        kv_type: args.compute.cache_type,
        swa_full: args.compute.swa_full,
        max_chunks: args.chunks.map(|c| usize::try_from(c).unwrap_or(usize::MAX)),
        bos: loaded.tokenizer.add_bos().then(|| loaded.tokenizer.bos()).flatten(),
        adapter: args.lora.load(&loaded.model)?,
    };
    let chunks = chunk_count(tokens.len(), &cfg)?;
    eprintln!("blink: {} tokens, {chunks} chunks of {ctx}", tokens.len());
    let started = std::time::Instant::now();
    let mut err = std::io::stderr();
    let result = perplexity(&loaded.model, &tokens, &cfg, &mut |chunk, ppl| {
        let _ = write!(err, "[{chunk}]{ppl:.4},");
        let _ = err.flush();
    })?;
    eprintln!();
    eprintln!("blink: {} tokens scored in {:.2} s", result.scored_tokens, started.elapsed().as_secs_f64());
    outln!("Final estimate: PPL = {:.4} +/- {:.5}", result.ppl, result.stderr)?;
    Ok(())
}
