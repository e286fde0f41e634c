//! Perplexity, computed the way llama.cpp's `llama-perplexity` does so figures compare.
//!
//! The text's tokens are cut into `n_chunks = n_tokens / ctx` chunks of `ctx` tokens, each
//! evaluated from an empty cache; only the second half of each chunk is scored (token
//! `j + 1` from the logits at `j`, for `j` in `ctx/2 .. ctx-1`), and
//! PPL = exp(mean negative log-likelihood). For a model that adds BOS, each chunk's first
//! token is replaced by BOS, as llama.cpp does, so every chunk starts as a text would.

use std::sync::Arc;

use blink_model::lora::LoraMix;
use blink_model::{AdapterSlot, KvType, Model, StepRow};

use crate::runner::{Runner, RunnerConfig};
use crate::sampling::log_softmax_at;
use crate::EngineError;

/// The running and final result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Perplexity {
    pub ppl: f64,
    /// Standard error of the PPL estimate (llama.cpp's formula).
    pub stderr: f64,
    pub chunks: usize,
    pub scored_tokens: usize,
}

/// Options of a perplexity run.
#[derive(Clone, Debug)]
pub struct PerplexityConfig {
    pub ctx: usize,
    /// Rows per forward step.
    pub n_batch: usize,
    /// The micro-batch of llama.cpp's whose numerics the rows follow
    /// (`StepRow::in_batches_of`; llama-perplexity's `-ub`).
    pub ubatch: usize,
    pub n_threads: usize,
    pub kv_type: KvType,
    /// Keep every position of the sliding-window layers (the figures do not change).
    pub swa_full: bool,
    /// Evaluate at most this many chunks (`None`: all).
    pub max_chunks: Option<usize>,
    /// The BOS token, for a model that adds one: it replaces each chunk's first token.
    pub bos: Option<u32>,
    /// The adapters the text is scored with (`None`: the base model).
    pub adapter: Option<Arc<LoraMix>>,
}

/// How many chunks `perplexity` evaluates for a text of `n_tokens` tokens, or why it cannot.
pub fn chunk_count(n_tokens: usize, cfg: &PerplexityConfig) -> Result<usize, EngineError> {
    let ctx = cfg.ctx;
    if ctx < 4 {
        return Err(EngineError::BadParams(format!("context size {ctx} is too small for perplexity")));
    }
    if n_tokens / 2 < ctx {
        return Err(EngineError::BadParams(format!(
            "need at least {} tokens (2 × context) for perplexity, the text has {n_tokens}",
            ctx.saturating_mul(2)
        )));
    }
    if cfg.max_chunks == Some(0) {
        return Err(EngineError::BadParams("the number of chunks must be at least 1".into()));
    }
    Ok((n_tokens / ctx).min(cfg.max_chunks.unwrap_or(usize::MAX)))
}

/// Compute the perplexity of `tokens`; `on_chunk` sees the running estimate after each chunk.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    cfg: &PerplexityConfig,
    on_chunk: &mut dyn FnMut(usize, f64),
) -> Result<Perplexity, EngineError> {
    let n_chunks = chunk_count(tokens.len(), cfg)?;
    let ctx = cfg.ctx;
    let n_batch = cfg.n_batch.clamp(1, ctx);
    let first = ctx / 2;
    let runner_cfg = RunnerConfig { threads: cfg.n_threads, kv_tokens: ctx, kv_type: cfg.kv_type, max_rows: n_batch, max_logit_rows: n_batch, max_ctx: ctx, swa_full: cfg.swa_full, detached: false };
    let mut runner = Runner::new(model, &runner_cfg)?;
    let mut rows = Vec::with_capacity(n_batch);
    let adapters: Vec<Arc<LoraMix>> = cfg.adapter.iter().filter(|m| !m.is_empty()).cloned().collect();
    let slot = (!adapters.is_empty()).then_some(AdapterSlot(0));
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);

    for chunk in 0..n_chunks {
        let toks = &tokens[chunk * ctx..(chunk + 1) * ctx];
        let seq = runner.kv_mut().new_seq();
        for start in (0..ctx).step_by(n_batch) {
            let end = (start + n_batch).min(ctx);
            rows.clear();
            rows.extend((start..end).map(|pos| {
                let token = if pos == 0 { cfg.bos.unwrap_or(toks[0]) } else { toks[pos] };
                // As llama-perplexity: the chunk is one prompt, and every row of its second
                // half wants logits (the last one's go unused).
                StepRow::prompt(token, pos, seq).with_logits(pos >= first).with_adapter(slot).in_batches_of(ctx, cfg.ubatch)
            }));
            runner.run_with(&rows, &adapters)?;
            for (i, pos) in (start..end).filter(|&p| p >= first && p + 1 < ctx).enumerate() {
                let v = -log_softmax_at(runner.scratch().logits(i), toks[pos + 1] as usize);
                nll += v;
                nll2 += v * v;
                count += 1;
            }
        }
        runner.kv_mut().free_seq(seq);
        on_chunk(chunk + 1, (nll / count as f64).exp());
    }

    let mean = nll / count as f64;
    let var = nll2 / count as f64 - mean * mean;
    let ppl = mean.exp();
    let stderr = if var > 0.0 && count > 1 { (var / (count - 1) as f64).sqrt() * ppl } else { 0.0 };
    Ok(Perplexity { ppl, stderr, chunks: n_chunks, scored_tokens: count })
}
