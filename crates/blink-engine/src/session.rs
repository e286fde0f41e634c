//! A single conversation with the model: its KV cache, prompt reuse and the generation loop.
//!
//! Used by `blink run` and `blink chat`. A new prompt that extends what the cache already
//! holds (the next chat turn) only evaluates the new tokens.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blink_model::lora::LoraMix;
use blink_model::{AdapterSlot, KvType, Model, RowKind, SeqId, StepRow};
use blink_text::{TextStream, Tokenizer};

use crate::runner::{Runner, RunnerConfig, Steps};
use crate::sampling::{Sampler, SamplingParams};
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
    /// Keep every position of the sliding-window layers, as llama.cpp's `--swa-full` does
    /// (otherwise blocks a whole window back give their pages there back to the OS).
    pub swa_full: bool,
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

/// One sequence's cache and compute resources: a runner of this process
/// ([`Session::new`]), or any other place steps run ([`Session::over`]).
pub struct Session<S: Steps> {
    runner: S,
    seq: SeqId,
    /// Tokens whose keys and values are in the cache.
    tokens: Vec<u32>,
    /// Rows of the step being built (kept to avoid allocating per step).
    rows: Vec<StepRow>,
    n_ctx: usize,
    n_batch: usize,
    /// The adapters every row runs with: empty, or the one mix of slot 0.
    adapters: Vec<Arc<LoraMix>>,
}

impl<'m> Session<Runner<&'m Model>> {
    /// A session with its own cache of `cfg.n_ctx` tokens; fails if there is no memory for
    /// it.
    pub fn new(model: &'m Model, cfg: &SessionConfig) -> Result<Session<Runner<&'m Model>>, EngineError> {
        let n_ctx = cfg.n_ctx.max(1);
        let n_batch = cfg.n_batch.clamp(1, n_ctx);
        let runner_cfg = RunnerConfig {
            threads: cfg.n_threads,
            kv_tokens: n_ctx,
            kv_type: cfg.kv_type,
            max_rows: n_batch,
            max_logit_rows: 1,
            max_ctx: n_ctx,
            swa_full: cfg.swa_full,
            detached: false,
        };
        // The one sequence owns the whole cache.
        Session::over(Runner::new(model, &runner_cfg)?, n_ctx, n_batch)
    }
}

impl<S: Steps> Session<S> {
    /// A session of `n_ctx` tokens whose steps, of at most `n_batch` prompt tokens, run
    /// on `runner`.
    pub fn over(mut runner: S, n_ctx: usize, n_batch: usize) -> Result<Session<S>, EngineError> {
        let n_ctx = n_ctx.max(1);
        let n_batch = n_batch.clamp(1, n_ctx);
        let seq = runner.new_seq(n_ctx)?;
        Ok(Session {
            runner,
            seq,
            tokens: Vec::with_capacity(n_ctx),
            rows: Vec::with_capacity(n_batch),
            n_ctx,
            n_batch,
            adapters: Vec::new(),
        })
    }

    /// Run from now on with the adapters in `mix` (`None`: the base model). The cache was
    /// computed under the old ones, so it is emptied when they change.
    pub fn set_adapter(&mut self, mix: Option<Arc<LoraMix>>) -> Result<(), EngineError> {
        let mix = mix.filter(|m| !m.is_empty());
        let same = match (self.adapters.first(), &mix) {
            (None, None) => true,
            (Some(a), Some(b)) => a.same(b),
            _ => false,
        };
        if !same {
            self.runner.truncate(self.seq, 0)?;
            self.tokens.clear();
            self.adapters = mix.into_iter().collect();
        }
        Ok(())
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Tokens currently in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Logits after the last evaluated token.
    pub fn logits(&mut self) -> &[f32] {
        self.runner.logits_mut(0)
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
        let keep = self.runner.truncate(self.seq, common.min(prompt.len() - 1))?;
        self.tokens.truncate(keep);
        let rest = &prompt[keep..];
        for chunk in rest.chunks(self.n_batch) {
            let last = self.tokens.len() + chunk.len() == prompt.len();
            self.eval(chunk, last, RowKind::Prompt, prompt.len())?;
        }
        Ok(rest.len())
    }

    /// Evaluate one generated token, leaving its logits ready.
    pub fn decode(&mut self, token: u32) -> Result<(), EngineError> {
        if self.tokens.len() >= self.n_ctx {
            return Err(EngineError::ContextFull { n_ctx: self.n_ctx });
        }
        self.eval(&[token], true, RowKind::Decode, 0)
    }

    /// Evaluate `tokens` (of a prompt of `prompt_len` tokens, 0 for a decoded token).
    fn eval(&mut self, tokens: &[u32], logits_for_last: bool, kind: RowKind, prompt_len: usize) -> Result<(), EngineError> {
        let start = self.tokens.len();
        let (seq, n) = (self.seq, tokens.len());
        self.rows.clear();
        let slot = (!self.adapters.is_empty()).then_some(AdapterSlot(0));
        let row = |i: usize, token: u32| StepRow::prompt(token, start + i, seq).with_logits(logits_for_last && i + 1 == n).with_kind(kind).with_adapter(slot).in_prompt_of(prompt_len);
        self.rows.extend(tokens.iter().enumerate().map(|(i, &token)| row(i, token)));
        self.runner.run_with(&self.rows, &self.adapters)?;
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
        let mut stream = TextStream::new(&params.stop);
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
            let token = sampler.sample(self.runner.logits_mut(0));
            sampler.accept(token);
            if tok.is_eog(token) && !params.ignore_eos {
                finish = FinishReason::Stop;
                break;
            }
            tokens.push(token);
            let released = stream.push(tok, token);
            text.push_str(released.text);
            on_text(released.text);
            if released.stopped {
                finish = FinishReason::Stop;
                break;
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
            let rest = stream.finish();
            text.push_str(rest.text);
            on_text(rest.text);
            if rest.stopped {
                finish = FinishReason::Stop;
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
