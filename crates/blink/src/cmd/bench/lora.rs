//! `blink bench --lora N`: the same tests with the rows spread over N random adapters.
//!
//! The adapters are random rank-`R` ones on all seven projections of every layer, placed
//! on the model that runs (a tensor-parallel placement splits them as it splits the
//! weights). A test's rows run as serving runs them: one step, each row with its slot in
//! a list of single-adapter mixes (`Runner::run_with`), sequence `i` on adapter `i % N`.
//! After the table, each adapter row is related to its base row.

use std::sync::Arc;

use blink_model::lora::{LoraMix, LoraTarget, LoraTensors};
use blink_model::{AdapterSlot, Model};

use super::Row;
use crate::common::CliResult;

/// The bound of `B`'s uniform values: the size of PEFT-trained adapters' entries (the
/// golden ones are N(0, 0.02)); only the shape matters to speed.
const B_BOUND: f32 = 0.02;

/// `n` random adapters placed on one model, each alone in its mix.
pub(super) struct Adapters {
    pub mixes: Vec<Arc<LoraMix>>,
    pub rank: usize,
    /// Bytes one adapter holds in memory (all parts).
    pub held_bytes: usize,
}

impl Adapters {
    /// Adapter `i` is drawn from seed `i + 1`, so every placement gets the same weights.
    pub fn place(model: &Model, n: usize, rank: usize) -> CliResult<Adapters> {
        if rank == 0 {
            return Err("--lora-rank must be at least 1".into());
        }
        if n > usize::from(u16::MAX) + 1 {
            return Err(format!("--lora {n}: a step takes at most {} adapters", usize::from(u16::MAX) + 1).into());
        }
        let mut mixes = Vec::with_capacity(n);
        let mut held_bytes = 0;
        for i in 0..n {
            let tensors = LoraTensors::random(&model.cfg, rank, 2.0 * rank as f32, &LoraTarget::ALL, B_BOUND, i as u64 + 1);
            let adapter = model.place_lora(&tensors).map_err(|e| format!("--lora: cannot place random adapter {i} of rank {rank}: {e}"))?;
            held_bytes = adapter.held_bytes();
            mixes.push(Arc::new(LoraMix::single(Arc::new(adapter))));
        }
        Ok(Adapters { mixes, rank, held_bytes })
    }

    /// The mixes a test of `seqs` sequences uses: one per sequence, up to all of them.
    pub fn for_seqs(&self, seqs: usize) -> &[Arc<LoraMix>] {
        &self.mixes[..self.mixes.len().min(seqs)]
    }

    pub fn describe(&self) -> String {
        format!(
            "adapters: {} random, rank {}, on all seven projections of every layer, {:.1} MB each",
            self.mixes.len(),
            self.rank,
            self.held_bytes as f64 / 1e6
        )
    }
}

/// Sequence `i`'s slot among `mixes`: round robin; none without adapters.
pub(crate) fn slot(i: usize, mixes: &[Arc<LoraMix>]) -> Option<AdapterSlot> {
    // `Adapters::place` keeps the count within a slot's range.
    (!mixes.is_empty()).then(|| AdapterSlot((i % mixes.len()) as u16))
}

/// A table's name for a test: `tg128`, `tg128 + 8 lora r8`, `pp512 + 1 lora r8 @ d512`.
pub(super) fn label(r: &Row) -> String {
    let lora = if r.loras > 0 { format!(" + {} lora r{}", r.loras, r.lora_rank) } else { String::new() };
    let at = if r.depth > 0 { format!(" @ d{}", r.depth) } else { String::new() };
    format!("{}{lora}{at}", r.test)
}

/// One line per adapter row: its speed as a share of the same test's base row.
pub(super) fn ratios(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .filter(|r| r.loras > 0)
        .filter_map(|r| {
            let base = rows.iter().find(|b| b.loras == 0 && (b.test.as_str(), b.depth, b.threads, b.batch) == (r.test.as_str(), r.depth, r.threads, r.batch))?;
            let at = if r.depth > 0 { format!(" @ d{}", r.depth) } else { String::new() };
            let over = if r.loras == 1 { "with 1 adapter".to_string() } else { format!("over {} adapters", r.loras) };
            let share = 100.0 * r.tok_s / base.tok_s;
            Some(format!(
                "lora: {}{at} at {} thread(s), batch {} {over} (r{}) runs at {share:.1}% of the base ({:.2} vs {:.2} tok/s; costs {:.1}%)",
                r.test,
                r.threads,
                r.batch,
                r.lora_rank,
                r.tok_s,
                base.tok_s,
                100.0 - share
            ))
        })
        .collect()
}
