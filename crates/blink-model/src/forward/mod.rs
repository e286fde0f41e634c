//! The batched forward pass.
//!
//! A step ([`Step`]) is a list of rows, each one token of one sequence at one position,
//! over a range of layers; prefill chunks, decode tokens of many sequences, a ring
//! device's window and (later) fine-tuning rows are all just steps.
//! Every pool thread runs the whole pass (SPMD), splitting each phase by rows, heads or
//! output features and meeting at barriers; nothing is allocated while it runs.
//!
//! Each output value is reduced in the same order whatever else is in the batch, so a
//! sequence's result does not depend on its batch-mates.

mod pass;
mod scratch;
mod step;

use blink_kernels::gemm::RowForm;
use blink_runtime::numa::NodePool;
use thiserror::Error;

use std::ops::Range;
use std::time::Duration;

use crate::kv_cache::{KvBlocks, KvCache, KvError, KvType, SeqId};
use crate::Model;

pub use crate::parallel::tensor::MAX_PARTS;
pub use scratch::Scratch;
pub use step::{AdapterSlot, RowKind, Step, StepInput, StepOutput, StepRow, LLAMA_UBATCH};

/// Why a step could not run. Nothing has been computed when one is returned.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ForwardError {
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    BadToken { token: u32, vocab: usize },
    #[error("row {row} has no token, and the step's input is tokens")]
    MissingToken { row: usize },
    #[error("sequence {seq}: position {pos} given where {expected} was expected")]
    BadPosition { seq: SeqId, pos: usize, expected: usize },
    #[error("context full: position {pos} is beyond the context size of {n_ctx} tokens")]
    ContextFull { pos: usize, n_ctx: usize },
    #[error("step of {rows} rows ({logits} with logits) exceeds the scratch capacity of {max_rows} ({max_logits})")]
    TooManyRows { rows: usize, logits: usize, max_rows: usize, max_logits: usize },
    #[error("layers {layers:?} are not a window of the model's {n_layers} layers")]
    BadWindow { layers: Range<usize>, n_layers: usize },
    #[error("the step runs layers {layers:?}, some of which this process does not hold")]
    LayersNotHeld { layers: Range<usize> },
    #[error("the step runs layers {step:?} but the KV cache holds layers {cache:?}")]
    WindowNotCached { step: Range<usize>, cache: Range<usize> },
    #[error("{got} hidden-state values given for {rows} rows of {n_embd}")]
    BadHidden { got: usize, rows: usize, n_embd: usize },
    #[error("the KV cache or scratch was built for a different model shape or placement")]
    CacheMismatch,
    #[error("the thread pool does not match the model's placement or the scratch's size")]
    PoolMismatch,
    #[error("row {row} names adapter slot {slot}, but the step has {adapters} adapter mixes")]
    BadAdapterSlot { row: usize, slot: usize, adapters: usize },
    #[error("adapter mix {slot} holds an adapter placed for another model or placement")]
    AdapterMismatch { slot: usize },
    #[error("no memory for the adapters' activations ({bytes} bytes)")]
    AdapterMemory { bytes: usize },
    #[error(transparent)]
    Kv(#[from] KvError),
}

impl Model {
    /// Run `rows` through the whole model (tokens in, logits out). Each sequence's rows
    /// must continue it: positions `len, len+1, ...` where `len` is what the cache holds
    /// for it. Logits of the rows that asked for them are then in `scratch.logits(i)`, in
    /// row order.
    pub fn forward(&self, pool: &NodePool, kv: &mut KvCache, rows: &[StepRow], scratch: &mut Scratch) -> Result<(), ForwardError> {
        self.step(pool, kv, &Step::whole(rows, self.cfg.n_layers), scratch)
    }

    /// [`Model::forward`] with work beside it (see [`Model::step_beside`]).
    pub fn forward_beside<R>(
        &self,
        pool: &NodePool,
        kv: &mut KvCache,
        rows: &[StepRow],
        scratch: &mut Scratch,
        beside: impl FnOnce(&mut KvBlocks) -> R,
    ) -> Result<(R, Duration), ForwardError> {
        self.step_beside(pool, kv, &Step::whole(rows, self.cfg.n_layers), scratch, beside)
    }

    /// Run one step: its rows over its layers, from its input to its output. The cache
    /// must hold (at least) the step's layers; a window's cache holds only its own.
    pub fn step(&self, pool: &NodePool, kv: &mut KvCache, step: &Step, scratch: &mut Scratch) -> Result<(), ForwardError> {
        self.step_beside(pool, kv, step, scratch, |_| ()).map(|_| ())
    }

    /// Run one step as [`Model::step`] does, and meanwhile run `beside` on the calling
    /// thread with the cache's bookkeeping: it may admit, grow or release sequences that
    /// are not in this step (the pass reads the block tables as they were when the step
    /// started). On a detached pool ([`NodePool::detached`]) the two overlap; otherwise
    /// `beside` runs first. Returns its result and the pass's duration. On an error
    /// nothing has run, `beside` included. Slot copies owed to sequences that attached a
    /// cached prefix are made first.
    pub fn step_beside<R>(
        &self,
        pool: &NodePool,
        kv: &mut KvCache,
        step: &Step,
        scratch: &mut Scratch,
        beside: impl FnOnce(&mut KvBlocks) -> R,
    ) -> Result<(R, Duration), ForwardError> {
        kv.apply_copies();
        if pool.n_nodes() != self.parts.len() || (0..pool.n_nodes()).any(|n| pool.threads_in_node(n).unwrap_or(0) > scratch.n_threads()) {
            return Err(ForwardError::PoolMismatch);
        }
        let shapes_match = kv.layouts().count() == self.parts.len() && kv.layouts().zip(&self.split.parts).all(|(l, p)| l.n_kv_heads == p.kv_heads.len());
        if !shapes_match || scratch.parts.len() != self.parts.len() {
            return Err(ForwardError::CacheMismatch);
        }
        self.check_window(kv, step)?;
        let ty = kv.kv_type();
        let (blocks, shards) = kv.parts_mut();
        self.check_and_reserve(blocks, step, scratch)?;
        if step.rows.is_empty() {
            return Ok((beside(blocks), Duration::ZERO));
        }
        let side = || beside(blocks);
        Ok(match ty {
            KvType::F16 => pass::Pass::<half::f16>::new(self, step, scratch, shards).run_beside(pool, side),
            KvType::F32 => pass::Pass::<f32>::new(self, step, scratch, shards).run_beside(pool, side),
        })
    }

    /// The step's layers are the model's, the cache holds them, and hidden states in come
    /// one row of `n_embd` per row.
    fn check_window(&self, kv: &KvCache, step: &Step) -> Result<(), ForwardError> {
        let n_layers = self.cfg.n_layers;
        let layers = step.layers.clone();
        if layers.start > layers.end || layers.end > n_layers {
            return Err(ForwardError::BadWindow { layers, n_layers });
        }
        if !self.parts.iter().all(|w| w.holds(layers.clone())) {
            return Err(ForwardError::LayersNotHeld { layers });
        }
        if let Some(cache) = kv.layouts().next().map(|l| l.layers()) {
            if !layers.is_empty() && (layers.start < cache.start || layers.end > cache.end) {
                return Err(ForwardError::WindowNotCached { step: layers, cache });
            }
        }
        if let StepInput::Hidden(states) = step.input {
            let (rows, n_embd) = (step.rows.len(), self.cfg.n_embd);
            if Some(states.len()) != rows.checked_mul(n_embd) {
                return Err(ForwardError::BadHidden { got: states.len(), rows, n_embd });
            }
        }
        Ok(())
    }

    /// Validate a step, grow the cache of every sequence in it and copy their block tables
    /// into `scratch`; on error nothing changes.
    fn check_and_reserve(&self, kv: &mut KvBlocks, step: &Step, scratch: &mut Scratch) -> Result<(), ForwardError> {
        let (vocab, rows) = (self.cfg.vocab_size, step.rows);
        let tokens_in = matches!(step.input, StepInput::Tokens);
        let logits_out = step.output == StepOutput::Logits;
        scratch.logit_rows.clear();
        scratch.tables.clear();
        for (i, r) in rows.iter().enumerate() {
            match r.token {
                None if tokens_in => return Err(ForwardError::MissingToken { row: i }),
                Some(token) if tokens_in && token as usize >= vocab => return Err(ForwardError::BadToken { token, vocab }),
                _ => {}
            }
            if r.pos >= scratch.max_ctx() {
                return Err(ForwardError::ContextFull { pos: r.pos, n_ctx: scratch.max_ctx() });
            }
            if r.logits && logits_out {
                scratch.logit_rows.push(i);
            }
        }
        if rows.len() > scratch.max_rows() || scratch.logit_rows.len() > scratch.max_logit_rows() {
            let err = ForwardError::TooManyRows {
                rows: rows.len(),
                logits: scratch.logit_rows.len(),
                max_rows: scratch.max_rows(),
                max_logits: scratch.max_logit_rows(),
            };
            scratch.logit_rows.clear();
            return Err(err);
        }
        if let Err(e) = self.group_adapter_rows(step, scratch) {
            scratch.logit_rows.clear();
            return Err(e);
        }
        Self::group_rows(rows, scratch);

        // Positions must continue each sequence; `next` tracks the expected one.
        let next = &mut scratch.next_pos;
        for r in rows {
            if next.len() <= r.seq {
                next.resize(r.seq + 1, usize::MAX);
            }
            next[r.seq] = kv.seq_len(r.seq)?;
        }
        let mut result = Ok(());
        for r in rows {
            if r.pos != next[r.seq] {
                result = Err(ForwardError::BadPosition { seq: r.seq, pos: r.pos, expected: next[r.seq] });
                break;
            }
            next[r.seq] += 1;
        }
        // Grow every sequence to its new length (repeat calls are no-ops). On failure, cut
        // each sequence back to its first row's position, which is where it stood before.
        if result.is_ok() {
            for (i, r) in rows.iter().enumerate() {
                if let Err(e) = kv.grow(r.seq, next[r.seq]) {
                    for p in &rows[..i] {
                        let _ = kv.truncate(p.seq, p.pos);
                    }
                    result = Err(e.into());
                    break;
                }
            }
        }
        // Each sequence's rows start at its first row's position: what lies a whole
        // sliding window before it is dead in the local layers.
        for r in rows {
            if result.is_ok() && next[r.seq] != usize::MAX {
                kv.slide(r.seq, r.pos);
            }
            next[r.seq] = usize::MAX;
        }
        if result.is_ok() {
            for r in rows {
                scratch.tables.take(kv, r.seq)?;
            }
        } else {
            scratch.logit_rows.clear();
            scratch.lora_rows.clear();
            scratch.lora_groups.clear();
        }
        result
    }

    /// Mark how llama.cpp computes each row's products (see [`Scratch`]'s `row_forms`).
    /// Rows of the same sequence that want logits are counted in step order.
    fn group_rows(rows: &[StepRow], scratch: &mut Scratch) {
        scratch.row_forms.clear();
        scratch.row_forms.extend(rows.iter().map(|r| RowForm { grouped: r.grouped, tiled: r.tiled }));
        scratch.out_forms.clear();
        for (i, r) in rows.iter().enumerate() {
            let form = if r.logits {
                let same = |o: &&StepRow| o.logits && o.seq == r.seq;
                let (before, m) = (rows[..i].iter().filter(same).count(), rows.iter().filter(same).count());
                RowForm { grouped: before < m - m % 4, tiled: r.tiled && m >= 8 }
            } else {
                RowForm::default()
            };
            scratch.out_forms.push(form);
        }
        scratch.logit_forms.clear();
        let out = &scratch.out_forms;
        scratch.logit_forms.extend(scratch.logit_rows.iter().map(|&i| out[i]));
    }

    /// Check the rows' adapter slots and group the rows that run with an adapter by slot
    /// (rows with an empty mix run the base model, as rows without a slot do).
    fn group_adapter_rows(&self, step: &Step, scratch: &mut Scratch) -> Result<(), ForwardError> {
        scratch.lora_rows.clear();
        scratch.lora_groups.clear();
        let mixes = step.adapters;
        let mut stacked_rank = 0;
        for (slot, mix) in mixes.iter().enumerate() {
            if mix.adapters().iter().any(|(a, _)| !a.fits(self)) {
                return Err(ForwardError::AdapterMismatch { slot });
            }
            stacked_rank = stacked_rank.max(mix.stacked_rank());
        }
        for (i, r) in step.rows.iter().enumerate() {
            if let Some(AdapterSlot(slot)) = r.adapter {
                let slot = usize::from(slot);
                let mix = mixes.get(slot).ok_or(ForwardError::BadAdapterSlot { row: i, slot, adapters: mixes.len() })?;
                if !mix.is_empty() {
                    scratch.lora_rows.push(i);
                }
            }
        }
        if scratch.lora_rows.is_empty() {
            return Ok(());
        }
        let slot_of = |i: usize| step.rows[i].adapter.map_or(0, |s| s.0);
        // Stable within a slot: rows keep their step order (no allocation: sorted in place).
        scratch.lora_rows.sort_unstable_by_key(|&i| (slot_of(i), i));
        let mut start = 0;
        for k in 1..=scratch.lora_rows.len() {
            let slot = slot_of(scratch.lora_rows[start]);
            if k == scratch.lora_rows.len() || slot_of(scratch.lora_rows[k]) != slot {
                scratch.lora_groups.push((usize::from(slot), start..k));
                start = k;
            }
        }
        scratch.reserve_lora(self, stacked_rank).map_err(|bytes| ForwardError::AdapterMemory { bytes })
    }
}
