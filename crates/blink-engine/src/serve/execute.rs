//! Executing: a plan's rows run on the local pool (flat, or one part per NUMA node), with
//! the scheduler's work for the next step beside them. A ring of devices will be another
//! executor of the same plans.

use std::sync::Arc;
use std::time::Duration;

use blink_model::kv_cache::KvBlocks;
use blink_model::Model;

use super::plan::StepPlan;
use super::EngineConfig;
use crate::runner::{Runner, RunnerConfig};
use crate::EngineError;

/// Runs plans on the model's pool, cache and buffers.
pub(super) struct Executor {
    pub(super) runner: Runner<Arc<Model>>,
}

impl Executor {
    /// Buffers for steps of `step_tokens + max_running` rows (every running sequence's
    /// decode row, and a full prompt budget), on a detached pool.
    pub(super) fn new(model: Arc<Model>, cfg: &EngineConfig) -> Result<Executor, EngineError> {
        let mut runner = Runner::new(
            model,
            &RunnerConfig {
                threads: cfg.n_threads,
                kv_tokens: cfg.kv_tokens,
                kv_type: cfg.kv_type,
                max_rows: cfg.step_tokens.saturating_add(cfg.max_running),
                max_logit_rows: cfg.max_running,
                max_ctx: cfg.max_seq_len,
                detached: true,
            },
        )?;
        runner.kv_mut().limit_cached_tokens(cfg.cached_tokens_limit());
        Ok(Executor { runner })
    }

    /// Run `plan`'s step, and `beside` meanwhile with the cache's bookkeeping; returns its
    /// result and the pass's time.
    pub(super) fn execute<R>(&mut self, plan: &StepPlan, beside: impl FnOnce(&mut KvBlocks) -> R) -> Result<(R, Duration), EngineError> {
        self.runner.run_beside(&plan.rows, &plan.adapters, beside)
    }
}
