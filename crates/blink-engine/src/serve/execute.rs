//! Executing: a plan's rows run on the local pool (flat, or one part per NUMA node), or
//! leave this process for a ring of devices ([`RemoteSteps`]), with the scheduler's work
//! for the next step beside them either way.
//!
//! A remote executor keeps the cache's bookkeeping here (a cache of no layers: block
//! accounting for admission, nothing else) and tells the devices which sequences the
//! scheduler let go of: a sequence no longer in the bookkeeping, or one starting again
//! at position 0 under a number it had before, is released on the devices with the next
//! step. It may keep several steps in flight (its depth): the step loop then launches
//! steps of different sequences and lands them as they come back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blink_model::kv_cache::KvBlocks;
use blink_model::{KvCache, Model, Scratch, SeqId, StepRow};
use blink_runtime::numa::NodePool;

use super::plan::StepPlan;
use super::EngineConfig;
use crate::runner::Runner;
use crate::EngineError;

/// Where steps run when they leave this process (a ring's head implements it). A step's
/// rows number their sequences as the engine's bookkeeping does.
pub trait RemoteSteps: Send {
    /// Start a step of `rows`, after forgetting the sequences `released` on every device;
    /// returns the step's number. `idle`: no sequence the devices hold is live (every row
    /// starts a sequence), so the devices may change under the step.
    fn start(&mut self, rows: &[StepRow], released: &[SeqId], idle: bool) -> Result<u64, EngineError>;
    /// Wait for a step in flight to come back and return its number; the logits of its
    /// rows that asked for them are then in [`RemoteSteps::scratch`] (until the next
    /// call). An error fails every step in flight.
    fn finish_one(&mut self) -> Result<u64, EngineError>;
    fn scratch(&mut self) -> &mut Scratch;
    /// A way to ask, from any thread, whether the devices can run steps now (`Err` with
    /// the reason when they cannot), for a server's `/health`; `None`: always.
    fn health(&self) -> Option<RemoteHealth> {
        None
    }
}

/// Whether a remote executor's devices can run steps now, askable from any thread.
pub type RemoteHealth = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Runs plans on the model's pool, cache and buffers, or on a remote executor.
pub(super) enum Executor {
    Local(Runner<Arc<Model>>),
    Remote(Remote),
}

/// A remote executor and the bookkeeping kept here.
pub(super) struct Remote {
    kv: KvCache,
    steps: Box<dyn RemoteSteps>,
    /// Most steps in flight at once.
    depth: usize,
    /// Sequences the devices hold, and those to release with the next step.
    sent: Vec<SeqId>,
    released: Vec<SeqId>,
}

impl Executor {
    /// The engine's runner ([`EngineConfig::runner_config`]), on a detached pool.
    pub(super) fn new(model: Arc<Model>, cfg: &EngineConfig) -> Result<Executor, EngineError> {
        let mut runner = Runner::new(model, &cfg.runner_config(true))?;
        runner.kv_mut().limit_cached_tokens(cfg.cached_tokens_limit());
        Ok(Executor::Local(runner))
    }

    /// Plans run on `steps`, up to `depth` at once; `model` (the head's share) gives the
    /// bookkeeping's shape.
    pub(super) fn remote(model: &Model, cfg: &EngineConfig, steps: Box<dyn RemoteSteps>, depth: usize) -> Result<Executor, EngineError> {
        let kv = model.try_new_kv_cache_for(0..0, cfg.kv_tokens.max(1), cfg.kv_type).map_err(EngineError::no_memory("the cache's bookkeeping", cfg.kv_tokens))?;
        Ok(Executor::Remote(Remote { kv, steps, depth: depth.max(1), sent: Vec::new(), released: Vec::new() }))
    }

    /// Most steps in flight at once (1 on the local pool).
    pub(super) fn depth(&self) -> usize {
        match self {
            Executor::Local(_) => 1,
            Executor::Remote(r) => r.depth,
        }
    }

    /// Start `plan`'s step on the remote executor, as one of several in flight; returns
    /// its number.
    pub(super) fn launch(&mut self, plan: &StepPlan) -> Result<u64, EngineError> {
        match self {
            Executor::Local(_) => Err(EngineError::BadParams("steps in flight are for a remote executor".into())),
            Executor::Remote(r) => r.launch(plan),
        }
    }

    /// Wait for a launched step to come back (its logits then in the scratch); its number.
    pub(super) fn land(&mut self) -> Result<u64, EngineError> {
        match self {
            Executor::Local(_) => Err(EngineError::BadParams("no step is in flight".into())),
            Executor::Remote(r) => r.steps.finish_one(),
        }
    }

    pub(super) fn kv(&self) -> &KvCache {
        match self {
            Executor::Local(r) => r.kv(),
            Executor::Remote(r) => &r.kv,
        }
    }

    pub(super) fn kv_mut(&mut self) -> &mut KvCache {
        match self {
            Executor::Local(r) => r.kv_mut(),
            Executor::Remote(r) => &mut r.kv,
        }
    }

    /// The local pool (co-served training runs on it); `None` for a remote executor.
    pub(super) fn pool(&self) -> Option<&NodePool> {
        match self {
            Executor::Local(r) => Some(r.pool()),
            Executor::Remote(_) => None,
        }
    }

    /// The cache and the last step's buffers (its logits).
    pub(super) fn kv_and_scratch(&mut self) -> (&mut KvCache, &mut Scratch) {
        match self {
            Executor::Local(r) => r.kv_and_scratch(),
            Executor::Remote(r) => (&mut r.kv, r.steps.scratch()),
        }
    }

    /// Run `plan`'s step, and `beside` meanwhile with the cache's bookkeeping; returns its
    /// result and the pass's time.
    pub(super) fn execute<R>(&mut self, plan: &StepPlan, beside: impl FnOnce(&mut KvBlocks) -> R) -> Result<(R, Duration), EngineError> {
        match self {
            Executor::Local(r) => r.run_beside(&plan.rows, &plan.adapters, beside),
            Executor::Remote(r) => r.execute(plan, beside),
        }
    }
}

impl Remote {
    fn execute<R>(&mut self, plan: &StepPlan, beside: impl FnOnce(&mut KvBlocks) -> R) -> Result<(R, Duration), EngineError> {
        let started = Instant::now();
        let id = self.launch(plan)?;
        let out = beside(&mut self.kv);
        let landed = self.steps.finish_one()?;
        debug_assert_eq!(landed, id, "the one step in flight");
        Ok((out, started.elapsed()))
    }

    fn launch(&mut self, plan: &StepPlan) -> Result<u64, EngineError> {
        if !plan.adapters.is_empty() {
            return Err(EngineError::BadParams("adapters are not served on a ring yet".into()));
        }
        // Grow the bookkeeping as a local pass would (positions checked, blocks taken).
        for row in &plan.rows {
            self.kv.grow(row.seq, row.pos + 1)?;
        }
        self.released.clear();
        let kv = &self.kv;
        let restarted = |s: SeqId| plan.rows.iter().any(|r| r.seq == s && r.pos == 0);
        self.sent.retain(|&s| {
            let gone = kv.seq_len(s).is_err() || restarted(s);
            if gone {
                self.released.push(s);
            }
            !gone
        });
        // Nothing left on the devices: every row starts a sequence (no prefix is shared).
        let idle = self.sent.is_empty();
        for row in &plan.rows {
            if !self.sent.contains(&row.seq) {
                self.sent.push(row.seq);
            }
        }
        self.steps.start(&plan.rows, &self.released, idle)
    }
}
