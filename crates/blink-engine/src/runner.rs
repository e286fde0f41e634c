//! The one runner: a model's compute pool, KV cache and step buffers, with one mapping of
//! forward errors. Sessions (`run`, `chat`), perplexity, the serving engine and `bench`
//! all run their steps through it.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use blink_runtime::numa::NodePool;
use blink_model::kv_cache::KvBlocks;
use blink_model::lora::LoraMix;
use blink_model::{ForwardError, KvCache, KvType, Model, Scratch, SeqId, Step, StepRow};

use crate::EngineError;

/// Where a sequence's steps run: this process's [`Runner`], or a ring of devices (a
/// cluster's head). Sessions run on either, and give the same tokens.
pub trait Steps {
    /// A new, empty sequence with `tokens` tokens of room.
    fn new_seq(&mut self, tokens: usize) -> Result<SeqId, EngineError>;
    /// Keep the first `len` tokens of `seq`; returns how many were kept: `len`, or 0 where
    /// a sliding-window layer already gave back part of the window before `len`.
    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<usize, EngineError>;
    /// Run `rows` through the whole model, the rows' adapter slots indexing `adapters`.
    fn run_with(&mut self, rows: &[StepRow], adapters: &[Arc<LoraMix>]) -> Result<(), EngineError>;
    /// Logits of the `i`-th row of the last step that asked for them.
    fn logits_mut(&mut self, i: usize) -> &mut [f32];
}

impl<M: Deref<Target = Model>> Steps for Runner<M> {
    fn new_seq(&mut self, tokens: usize) -> Result<SeqId, EngineError> {
        let seq = self.kv.new_seq();
        // Taking the blocks now keeps the steps free of allocations (the memory itself is
        // still touched lazily).
        self.kv.reserve(seq, tokens)?;
        Ok(seq)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<usize, EngineError> {
        Ok(self.kv.truncate(seq, len)?)
    }

    fn run_with(&mut self, rows: &[StepRow], adapters: &[Arc<LoraMix>]) -> Result<(), EngineError> {
        Runner::run_with(self, rows, adapters)
    }

    fn logits_mut(&mut self, i: usize) -> &mut [f32] {
        self.scratch.logits_mut(i)
    }
}

/// Sizes of a runner.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// Compute threads (a tensor-parallel model's placement may raise them).
    pub threads: usize,
    /// Tokens the KV cache holds over all its sequences.
    pub kv_tokens: usize,
    pub kv_type: KvType,
    /// Most rows in one step, and of those most with logits.
    pub max_rows: usize,
    pub max_logit_rows: usize,
    /// Positions stay below this.
    pub max_ctx: usize,
    /// Keep every position of the sliding-window layers, as llama.cpp's `--swa-full` does
    /// (otherwise blocks a whole window back give their pages there back to the OS).
    pub swa_full: bool,
    /// Give the pool threads of its own only, so the caller works beside each step
    /// ([`Runner::run_beside`] overlaps); otherwise the caller is one of the threads.
    pub detached: bool,
}

/// A model with the pool, cache and buffers its steps run on. `M` is how the model is
/// held: borrowed (`&Model`) or shared (`Arc<Model>`).
pub struct Runner<M: Deref<Target = Model>> {
    model: M,
    pool: NodePool,
    kv: KvCache,
    scratch: Scratch,
}

impl From<ForwardError> for EngineError {
    fn from(e: ForwardError) -> EngineError {
        match e {
            ForwardError::BadToken { token, vocab } => EngineError::BadToken { token, vocab },
            other => EngineError::Forward(other),
        }
    }
}

impl<M: Deref<Target = Model>> Runner<M> {
    /// Allocate the cache and buffers `cfg` asks for and start the pool; a size the
    /// machine cannot hold is an error naming it.
    pub fn new(model: M, cfg: &RunnerConfig) -> Result<Runner<M>, EngineError> {
        let threads = cfg.threads.max(1);
        let mut kv = model.try_new_kv_cache(cfg.kv_tokens.max(1), cfg.kv_type).map_err(EngineError::no_memory("a KV cache", cfg.kv_tokens))?;
        kv.release_slid_out(!cfg.swa_full);
        let scratch = Scratch::try_new(&model, cfg.max_rows, cfg.max_logit_rows, cfg.max_ctx.max(1), threads)
            .map_err(EngineError::no_memory("step buffers", cfg.max_rows))?;
        let pool = if cfg.detached { model.detached_pool(threads) } else { model.pool(threads) }.map_err(EngineError::Threads)?;
        Ok(Runner { model, pool, kv, scratch })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn pool(&self) -> &NodePool {
        &self.pool
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    pub fn kv_mut(&mut self) -> &mut KvCache {
        &mut self.kv
    }

    pub fn scratch(&self) -> &Scratch {
        &self.scratch
    }

    /// The cache and the buffers at once (say, to sample from the logits and publish a
    /// prefix in one go).
    pub fn kv_and_scratch(&mut self) -> (&mut KvCache, &mut Scratch) {
        (&mut self.kv, &mut self.scratch)
    }

    /// Run `rows` through the whole model; logits are then in [`Runner::scratch`].
    pub fn run(&mut self, rows: &[StepRow]) -> Result<(), EngineError> {
        self.run_with(rows, &[])
    }

    /// As `run`, the rows' adapter slots indexing `adapters`. Beside the pass, memory the
    /// cache no longer needs goes back to the OS once a batch of it is due.
    pub fn run_with(&mut self, rows: &[StepRow], adapters: &[Arc<LoraMix>]) -> Result<(), EngineError> {
        self.run_beside(rows, adapters, KvBlocks::return_free_memory_if_due).map(|_| ())
    }

    /// As `run_with`, with `beside` on the calling thread meanwhile, given the cache's
    /// bookkeeping (see [`Model::step_beside`]). Returns its result and the pass's time.
    pub fn run_beside<R>(&mut self, rows: &[StepRow], adapters: &[Arc<LoraMix>], beside: impl FnOnce(&mut KvBlocks) -> R) -> Result<(R, Duration), EngineError> {
        let step = Step::whole(rows, self.model.cfg.n_layers).with_adapters(adapters);
        Ok(self.model.step_beside(&self.pool, &mut self.kv, &step, &mut self.scratch, beside)?)
    }
}
