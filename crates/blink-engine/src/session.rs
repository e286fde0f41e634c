//! A single conversation with the model: its KV cache, prompt reuse and the generation loop.
//!
//! Used by `blink run` and `blink chat`. A new prompt that extends what the cache already
//! holds (the next chat turn) only evaluates the new tokens.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use blink_model::tokenizer::{StreamDecoder, Tokenizer};
use blink_model::{ForwardError, KvCache, KvType, Model, Scratch, SeqId, StepRow};
use blink_runtime::numa::NodePool;

use crate::sampling::{Sampler, SamplingParams};
use crate::stop::{StopMatcher, StopScan};
use crate::EngineError;

/// Sizes of a session.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Context size in tokens (prompt + generated).
    pub n_ctx: usize,
    /// Compute threads.
    pub n_threads: usize,
    /// Most prompt tokens evaluated per step.
    pub n_batch: usize,
    pub kv_type: KvType,
}

/// What to generate.
#[derive(Clone, Debug, Default)]
pub struct GenerateParams {
    /// Most tokens to generate; `None` runs until the context is full.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    /// Generation stops before the first occurrence of any of these.
    pub stop: Vec<String>,
    /// Keep generating through end-of-generation tokens.
    pub ignore_eos: bool,
    /// Generation stops (as at a stop string) once this is set, say by a Ctrl-C handler.
    pub interrupt: Option<&'static AtomicBool>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The token limit or the context size.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The result of one `generate` call.
#[derive(Clone, Debug)]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    /// True when generation stopped because the context was full.
    pub context_full: bool,
    pub prompt_tokens: usize,
    /// Prompt tokens actually evaluated (the rest came from the cache).
    pub prompt_evaluated: usize,
    pub prompt_time: Duration,
    pub gen_time: Duration,
}

/// One sequence's cache and compute resources.
pub struct Session<'m> {
    model: &'m Model,
    pool: NodePool,
    kv: KvCache,
    scratch: Scratch,
    seq: SeqId,
    /// Tokens whose keys and values are in the cache.
    tokens: Vec<u32>,
    /// Rows of the step being built (kept to avoid allocating per step).
    rows: Vec<StepRow>,
    n_ctx: usize,
    n_batch: usize,
}

impl<'m> Session<'m> {
    /// A session with its own cache of `cfg.n_ctx` tokens; fails if there is no memory for
    /// it.
    pub fn new(model: &'m Model, cfg: &SessionConfig) -> Result<Session<'m>, EngineError> {
        let n_ctx = cfg.n_ctx.max(1);
        let n_batch = cfg.n_batch.clamp(1, n_ctx);
        let mut kv = model.try_new_kv_cache(n_ctx, cfg.kv_type).map_err(EngineError::no_memory("a KV cache", n_ctx))?;
        let scratch = Scratch::try_new(model, n_batch, 1, n_ctx, cfg.n_threads).map_err(EngineError::no_memory("step buffers", n_ctx))?;
        let seq = kv.new_seq();
        // The one sequence owns the whole cache; taking its blocks now keeps decoding
        // free of allocations (the memory itself is still touched lazily).
        kv.reserve(seq, n_ctx).expect("a fresh cache holds its own size");
        Ok(Session {
            model,
            pool: model.pool(cfg.n_threads).map_err(EngineError::Threads)?,
            scratch,
            kv,
            seq,
            tokens: Vec::with_capacity(n_ctx),
            rows: Vec::with_capacity(n_batch),
            n_ctx,
            n_batch,
        })
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Tokens currently in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Logits after the last evaluated token.
    pub fn logits(&self) -> &[f32] {
        self.scratch.logits(0)
    }

    /// Make the cache hold exactly `prompt`, reusing its longest common prefix, and leave
    /// the logits of the prompt's last token ready. Returns how many tokens were evaluated.
    pub fn load_prompt(&mut self, prompt: &[u32]) -> Result<usize, EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() > self.n_ctx {
            return Err(EngineError::PromptTooLong { tokens: prompt.len(), n_ctx: self.n_ctx });
        }
        let common = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        // The last prompt token is always evaluated, to produce fresh logits.
        let keep = common.min(prompt.len() - 1);
        self.kv.truncate(self.seq, keep)?;
        self.tokens.truncate(keep);
        let rest = &prompt[keep..];
        for chunk in rest.chunks(self.n_batch) {
            let last = self.tokens.len() + chunk.len() == prompt.len();
            self.eval(chunk, last)?;
        }
        Ok(rest.len())
    }

    /// Evaluate one generated token, leaving its logits ready.
    pub fn decode(&mut self, token: u32) -> Result<(), EngineError> {
        if self.tokens.len() >= self.n_ctx {
            return Err(EngineError::ContextFull { n_ctx: self.n_ctx });
        }
        self.eval(&[token], true)
    }

    fn eval(&mut self, tokens: &[u32], logits_for_last: bool) -> Result<(), EngineError> {
        let start = self.tokens.len();
        let (seq, n) = (self.seq, tokens.len());
        self.rows.clear();
        self.rows.extend(tokens.iter().enumerate().map(|(i, &token)| StepRow::prompt(token, start + i, seq).with_logits(logits_for_last && i + 1 == n)));
        self.model.forward(&self.pool, &mut self.kv, &self.rows, &mut self.scratch).map_err(|e| match e {
            ForwardError::BadToken { token, vocab } => EngineError::BadToken { token, vocab },
            other => EngineError::Forward(other),
        })?;
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Generate a completion of `prompt`, streaming text pieces to `on_text` as they become
    /// final (never a broken UTF-8 character, never part of a stop string).
    pub fn generate(
        &mut self,
        tok: &Tokenizer,
        prompt: &[u32],
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, EngineError> {
        params.sampling.validate().map_err(EngineError::BadParams)?;
        let t0 = Instant::now();
        let evaluated = self.load_prompt(prompt)?;
        let prompt_time = t0.elapsed();

        let mut sampler = Sampler::new(params.sampling.clone());
        for &t in prompt {
            sampler.accept(t);
        }
        let mut decoder = StreamDecoder::new(false);
        let mut stops = StopMatcher::new(&params.stop);
        let mut text = String::new();
        let mut tokens = Vec::new();
        let mut finish = FinishReason::Length;
        let mut context_full = false;
        let t1 = Instant::now();
        let max = params.max_tokens.unwrap_or(usize::MAX);

        while tokens.len() < max {
            if params.interrupt.is_some_and(|f| f.load(Ordering::Relaxed)) {
                finish = FinishReason::Stop;
                break;
            }
            let token = sampler.sample(self.scratch.logits_mut(0));
            sampler.accept(token);
            if tok.is_eog(token) && !params.ignore_eos {
                finish = FinishReason::Stop;
                break;
            }
            tokens.push(token);
            let piece = decoder.push(tok, token);
            match stops.push(piece) {
                StopScan::Continue(t) => {
                    text.push_str(t);
                    on_text(t);
                }
                StopScan::Stopped(t) => {
                    text.push_str(t);
                    on_text(t);
                    finish = FinishReason::Stop;
                    break;
                }
            }
            if tokens.len() >= max {
                break;
            }
            if self.tokens.len() >= self.n_ctx {
                context_full = true;
                break;
            }
            self.decode(token)?;
        }
        if finish == FinishReason::Length {
            let tail = decoder.finish();
            let flushed = match stops.push(&tail) {
                StopScan::Continue(t) => t.to_string(),
                StopScan::Stopped(t) => {
                    finish = FinishReason::Stop;
                    t.to_string()
                }
            };
            let rest = if finish == FinishReason::Length { stops.finish() } else { String::new() };
            for piece in [flushed, rest] {
                text.push_str(&piece);
                on_text(&piece);
            }
        }
        // The last sampled token is not yet in the cache; a following turn re-evaluates it.
        Ok(Generation {
            text,
            tokens,
            finish,
            context_full,
            prompt_tokens: prompt.len(),
            prompt_evaluated: evaluated,
            prompt_time,
            gen_time: t1.elapsed(),
        })
    }
}
