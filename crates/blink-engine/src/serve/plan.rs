//! A step's plan, as plain data: what the scheduler decided, for the executor to run and
//! for the update to fold back. It also carries what a latency model needs to predict the
//! step's time. Its lists keep their capacity from step to step, so planning allocates
//! nothing once the engine runs.

use std::sync::Arc;

use blink_model::lora::LoraMix;
use blink_model::{AdapterSlot, RowKind, SeqId, StepRow};

/// A chunk of one sequence's prompt in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub seq: SeqId,
    /// Position of its first token.
    pub start: usize,
    pub len: usize,
}

/// What a step costs, in the terms a latency model is fitted on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCost {
    /// Prompt tokens evaluated.
    pub prompt_tokens: usize,
    /// Σ len² over the prompt chunks (attention within a chunk grows with its square).
    pub chunk_tokens_squared: usize,
    /// Decode rows.
    pub decode_rows: usize,
    /// Cached positions attention reads, over all rows.
    pub context_tokens: usize,
    /// Distinct adapter mixes among the rows (each costs a pass over its weights).
    pub adapters: usize,
}

impl StepCost {
    /// The cost of a step of `rows` (prompt rows in runs of one sequence each, as a plan
    /// lays its chunks out) over `adapters` distinct adapter mixes: what a plan's cost
    /// would be for them, for steps built outside the scheduler (`blink calibrate`).
    pub fn of_rows(rows: &[StepRow], adapters: usize) -> StepCost {
        let mut c = StepCost { adapters, ..StepCost::default() };
        let mut run: Option<(blink_model::SeqId, usize)> = None;
        let close = |run: &mut Option<(blink_model::SeqId, usize)>, c: &mut StepCost| {
            if let Some((_, len)) = run.take() {
                c.chunk_tokens_squared += len * len;
            }
        };
        for r in rows {
            c.context_tokens += r.pos + 1;
            if r.kind == RowKind::Decode {
                c.decode_rows += 1;
                close(&mut run, &mut c);
                continue;
            }
            c.prompt_tokens += 1;
            match &mut run {
                Some((seq, len)) if *seq == r.seq => *len += 1,
                _ => {
                    close(&mut run, &mut c);
                    run = Some((r.seq, 1));
                }
            }
        }
        close(&mut run, &mut c);
        c
    }
}

/// One step's plan.
#[derive(Default)]
pub struct StepPlan {
    /// Sequences admitted for this step (by cache id).
    pub admitted: Vec<SeqId>,
    /// Sequences released before it (finished or cancelled in earlier steps).
    pub released: Vec<SeqId>,
    /// Prompt chunks, in row order after the decode rows.
    pub chunks: Vec<Chunk>,
    /// Sequences with a decode row, in row order.
    pub decodes: Vec<SeqId>,
    /// The rows: one per decode, then each chunk's tokens (complete once sealed).
    pub rows: Vec<StepRow>,
    /// The chunks' rows, planned before the decode rows are known.
    prompt_rows: Vec<StepRow>,
    /// The adapter mixes the rows' slots index (at most `--max-loras`).
    pub adapters: Vec<Arc<LoraMix>>,
    pub cost: StepCost,
}

impl StepPlan {
    /// A plan whose lists hold a step of up to `max_rows` rows over `max_running`
    /// sequences and `max_loras` adapter mixes without growing.
    pub fn with_capacity(max_rows: usize, max_running: usize, max_loras: usize) -> StepPlan {
        StepPlan {
            admitted: Vec::with_capacity(max_running),
            released: Vec::with_capacity(max_running),
            chunks: Vec::with_capacity(max_running),
            decodes: Vec::with_capacity(max_running),
            rows: Vec::with_capacity(max_rows),
            prompt_rows: Vec::with_capacity(max_rows),
            adapters: Vec::with_capacity(max_loras),
            cost: StepCost::default(),
        }
    }

    pub fn clear(&mut self) {
        self.admitted.clear();
        self.released.clear();
        self.chunks.clear();
        self.decodes.clear();
        self.rows.clear();
        self.prompt_rows.clear();
        self.adapters.clear();
        self.cost = StepCost::default();
    }

    /// Rows wanting logits (decode rows and the prompts' last tokens).
    pub fn logit_rows(&self) -> usize {
        self.rows.iter().filter(|r| r.logits).count()
    }

    /// The slot of `mix` in this step, taking a new one if fewer than `max_loras` are
    /// taken; `None` when the step has no room for another mix (its rows wait). The base
    /// model (`None`) always has room.
    pub(super) fn slot_for(&mut self, mix: Option<&Arc<LoraMix>>, max_loras: usize) -> Option<Option<AdapterSlot>> {
        let Some(mix) = mix else { return Some(None) };
        let slot = match self.adapters.iter().position(|m| Arc::ptr_eq(m, mix) || m.same(mix)) {
            Some(i) => i,
            None if self.adapters.len() < max_loras.min(usize::from(u16::MAX)) => {
                self.adapters.push(mix.clone());
                self.cost.adapters = self.adapters.len();
                self.adapters.len() - 1
            }
            None => return None,
        };
        Some(Some(AdapterSlot(slot as u16)))
    }

    /// Add a decode row (they go ahead of the chunks' rows).
    pub(super) fn push_decode(&mut self, row: StepRow) {
        self.decodes.push(row.seq);
        self.cost.decode_rows += 1;
        self.cost.context_tokens += row.pos + 1;
        self.rows.push(row);
    }

    /// Add a chunk of `tokens` at `start` of sequence `seq`, whose prompt has `n_prompt`
    /// tokens (its last one wants logits), run with the adapters in `adapter`.
    pub(super) fn push_chunk(&mut self, seq: SeqId, start: usize, tokens: &[u32], n_prompt: usize, adapter: Option<AdapterSlot>) {
        let len = tokens.len();
        self.chunks.push(Chunk { seq, start, len });
        let row = |i: usize, t: u32| StepRow::prompt(t, start + i, seq).with_logits(start + i + 1 == n_prompt).with_adapter(adapter).in_prompt_of(n_prompt);
        self.prompt_rows.extend(tokens.iter().enumerate().map(|(i, &t)| row(i, t)));
        let c = &mut self.cost;
        c.prompt_tokens += len;
        c.chunk_tokens_squared += len * len;
        // Row i of the chunk attends start + i + 1 positions.
        c.context_tokens += len * start + len * (len + 1) / 2;
    }

    /// The rows are complete: the chunks' rows follow the decode rows.
    pub(super) fn seal(&mut self) {
        self.rows.extend_from_slice(&self.prompt_rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_from_rows_is_the_plans() {
        let mut plan = StepPlan::with_capacity(64, 8, 2);
        let tokens = [7u32; 20];
        plan.push_chunk(3, 0, &tokens[..12], 30, None);
        plan.push_chunk(5, 40, &tokens[..8], 60, None);
        plan.push_decode(StepRow::decode(1, 99, 1));
        plan.push_decode(StepRow::decode(1, 7, 2));
        plan.seal();
        assert_eq!(StepCost::of_rows(&plan.rows, 0), plan.cost);
        assert_eq!(plan.cost, StepCost { prompt_tokens: 20, chunk_tokens_squared: 144 + 64, decode_rows: 2, context_tokens: 78 + 8 * 40 + 36 + 100 + 8, adapters: 0 });
    }
}
