//! Executing: a plan's rows run on the local pool (flat, or one part per NUMA node), or
//! leave this process for a ring of devices ([`RemoteSteps`]), with the scheduler's work
//! for the next step beside them either way.
//!
//! A remote executor keeps the cache's bookkeeping here (a cache of no layers: block
//! accounting for admission, and the prefix cache) and the devices' caches follow its
//! block tables: each step carries the changes to its sequences' tables since the last
//! ([`TableSync`]) and the slot copies a reused prefix owes, so a block the prefix cache
//! shares holds the same values on every device. A sequence no longer in the
//! bookkeeping, or one starting again at position 0 under a number it had before, is
//! released on the devices with the next step. When the devices' caches are emptied (a
//! ring joined afresh) the prefix cache is forgotten: new sequences that reused it start
//! again, running ones fail.
//!
//! A remote executor may keep several steps in flight (its depth): the step loop then
//! launches steps of different sequences and lands them as they come back.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blink_model::kv_cache::KvBlocks;
use blink_model::lora::LoraMix;
use blink_model::{KvCache, Model, Scratch, SeqId, StepRow};
use blink_runtime::numa::NodePool;

use super::plan::StepPlan;
use super::EngineConfig;
use crate::runner::Runner;
use crate::EngineError;

/// A change the devices' caches make to follow the bookkeeping's block tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableSync {
    /// Keep the first `blocks` blocks of `seq`'s table (starting the sequence if new).
    Cut { seq: SeqId, blocks: usize },
    /// `block` is the next of `seq`'s table.
    Block { seq: SeqId, block: u32 },
    /// Copy the first `slots` positions of block `src` into block `dst`.
    Copy { src: u32, dst: u32, slots: usize },
}

/// Where steps run when they leave this process (a ring's head implements it). A step's
/// rows number their sequences as the engine's bookkeeping does, and the devices' caches
/// follow its block tables.
pub trait RemoteSteps: Send {
    /// Before a step: join the devices again if they were lost and, when `may_change`
    /// (nothing the devices hold is live), go back to the planned devices if they answer.
    /// Returns whether the devices' caches were emptied meanwhile (new devices joined).
    fn prepare(&mut self, may_change: bool) -> Result<bool, EngineError>;
    /// Start a step of `rows` (their adapter slots indexing `adapters`), after forgetting
    /// the sequences `released` on every device and applying `sync` to their caches;
    /// returns the step's number.
    fn start(&mut self, rows: &[StepRow], adapters: &[Arc<LoraMix>], released: &[SeqId], sync: &[TableSync]) -> Result<u64, EngineError>;
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
// One per engine, made once and never moved on the hot path: its variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
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
    /// The block tables the devices hold, by sequence.
    tables: HashMap<SeqId, Vec<u32>>,
    /// Sequences whose values were on devices that left (until they are released).
    lost: Vec<SeqId>,
    /// The next step's table changes.
    sync: Vec<TableSync>,
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
        let mut kv = model.try_new_kv_cache_for(0..0, cfg.kv_tokens.max(1), cfg.kv_type).map_err(EngineError::no_memory("the cache's bookkeeping", cfg.kv_tokens))?;
        kv.limit_cached_tokens(cfg.cached_tokens_limit());
        Ok(Executor::Remote(Remote { kv, steps, depth: depth.max(1), sent: Vec::new(), released: Vec::new(), tables: HashMap::new(), lost: Vec::new(), sync: Vec::new() }))
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
        // Grow the bookkeeping as a local pass would (positions checked, blocks taken).
        for row in &plan.rows {
            self.kv.grow(row.seq, row.pos + 1)?;
        }
        self.released.clear();
        let kv = &self.kv;
        // A number the devices hold that names a new sequence now (admitted in this
        // plan, perhaps on a cached prefix, or starting at 0): the old one goes first.
        let restarted = |s: SeqId| plan.admitted.contains(&s) || plan.rows.iter().any(|r| r.seq == s && r.pos == 0);
        self.sent.retain(|&s| {
            let gone = kv.seq_len(s).is_err() || restarted(s);
            if gone {
                self.released.push(s);
            }
            !gone
        });
        for s in &self.released {
            self.tables.remove(s);
        }
        // Nothing left on the devices: they may change under the step.
        let idle = self.sent.is_empty();
        if self.steps.prepare(idle)? {
            // New devices, empty caches: what the bookkeeping knew of their values is gone
            // (the copies owed from it too), and the sequences they held cannot go on.
            self.kv.forget_prefixes();
            self.kv.apply_copies();
            self.lost.append(&mut self.sent);
            self.released.clear();
            self.tables.clear();
            if plan.rows.iter().any(|r| r.pos > 0) {
                // New sequences that reused a cached prefix start again; running ones fail.
                return Err(if idle { EngineError::CachesEmptied } else { EngineError::Remote("the ring changed, and the values this step's sequences had on it are gone".into()) });
            }
        }
        let kv = &self.kv;
        self.lost.retain(|&s| kv.seq_len(s).is_ok() && !restarted(s));
        if plan.rows.iter().any(|r| self.lost.contains(&r.seq)) {
            return Err(EngineError::Remote("the ring changed, and the values of sequences running on it are gone".into()));
        }
        for row in &plan.rows {
            if !self.sent.contains(&row.seq) {
                self.sent.push(row.seq);
            }
        }
        self.sync_tables(plan)?;
        self.steps.start(&plan.rows, &plan.adapters, &self.released, &self.sync)
    }

    /// The table changes and slot copies the devices need before `plan`'s step: each
    /// sequence's table from the first block that differs from what they hold.
    fn sync_tables(&mut self, plan: &StepPlan) -> Result<(), EngineError> {
        self.sync.clear();
        for c in self.kv.pending_copies() {
            self.sync.push(TableSync::Copy { src: c.src, dst: c.dst, slots: c.slots });
        }
        // The bookkeeping has no values: this only settles the copies' accounts.
        self.kv.apply_copies();
        for row in &plan.rows {
            let table = self.kv.block_table(row.seq)?;
            let held = self.tables.entry(row.seq).or_insert_with(|| Vec::with_capacity(table.len()));
            let same = held.iter().zip(table).take_while(|(a, b)| a == b).count();
            if same == held.len() && same == table.len() && same > 0 {
                continue;
            }
            self.sync.push(TableSync::Cut { seq: row.seq, blocks: same });
            self.sync.extend(table[same..].iter().map(|&block| TableSync::Block { seq: row.seq, block }));
            held.truncate(same);
            held.extend_from_slice(&table[same..]);
        }
        Ok(())
    }
}
