//! A device's windows of layers and the steps it runs over them.
//!
//! Each window has its own KV cache (a device holds non-consecutive windows when the ring
//! has several rounds, and a cache holds consecutive layers). Sequences are named by the
//! head's numbers on the wire; each cache keeps its own numbering, and the map between
//! them. The head runs its entry (the embedding: tokens in, hidden states out, over no
//! layer) and exit (hidden states in, logits out) as windows of no layers here too.
//!
//! A sequence's blocks are this device's own choice, or, when the head keeps the block
//! tables (the serving engine's bookkeeping, whose prefix cache shares blocks between
//! sequences), the head's: such a sequence is mirrored (`CacheOp::Cut`, `Block`, `Copy`),
//! every window's cache holding it in the very blocks the head's tables name.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use blink_model::kv_cache::{SeqId, BLOCK_TOKENS};
use blink_model::lora::LoraMix;
use blink_model::{AdapterSlot, KvCache, Model, Scratch, Step, StepInput, StepOutput, StepRow};
use blink_engine::RunnerConfig;
use blink_runtime::numa::NodePool;

use crate::wire::{CacheOp, StepFrame};

struct Window {
    layers: Range<usize>,
    kv: KvCache,
    /// The head's sequence numbers to this cache's.
    seqs: HashMap<u32, Local>,
}

/// A sequence in a window's cache.
#[derive(Clone, Copy)]
struct Local {
    id: SeqId,
    /// Its block table follows the head's.
    mirrored: bool,
}

/// A model holding some windows, their caches, the pool and buffers.
pub struct Windows {
    model: Arc<Model>,
    pool: NodePool,
    scratch: Scratch,
    windows: Vec<Window>,
    rows: Vec<StepRow>,
}

impl Window {
    fn apply(&mut self, op: &CacheOp) -> Result<(), String> {
        let kv = &mut self.kv;
        let at = |seq: u32| move |e: blink_model::kv_cache::KvError| format!("sequence {seq}: {e}");
        match *op {
            CacheOp::Truncate { seq, len } => match self.seqs.get(&seq) {
                Some(l) if l.mirrored => kv.mirror_len(l.id, len as usize).map_err(at(seq))?,
                // A window's cache keeps every position, so it keeps `len`.
                Some(l) => {
                    kv.truncate(l.id, len as usize).map_err(at(seq))?;
                }
                None => {}
            },
            CacheOp::Release { seq } => match self.seqs.remove(&seq) {
                Some(l) if l.mirrored => kv.forget_mirrored(l.id),
                Some(l) => kv.free_seq(l.id),
                None => {}
            },
            CacheOp::Cut { seq, blocks } => {
                let local = *self.seqs.entry(seq).or_insert_with(|| Local { id: kv.new_seq(), mirrored: true });
                if !local.mirrored {
                    return Err(format!("sequence {seq} holds blocks of this device's choosing: its table cannot follow the head's"));
                }
                kv.mirror_cut(local.id, blocks as usize).map_err(at(seq))?;
            }
            CacheOp::Block { seq, block } => match self.seqs.get(&seq) {
                Some(l) if l.mirrored => kv.mirror_push(l.id, block).map_err(at(seq))?,
                _ => return Err(format!("a block for sequence {seq}, whose table the head has not started")),
            },
            CacheOp::Copy { src, dst, slots } => kv.copy_slots(src, dst, slots as usize).map_err(|e| format!("copying a prefix's slots: {e}"))?,
        }
        Ok(())
    }
}

impl Windows {
    /// Caches of `sizes.kv_tokens` each for `windows` (which `model` must hold), buffers and
    /// a pool as `sizes` says (its pool is never detached: the caller waits for each step).
    pub fn new(model: Arc<Model>, windows: &[Range<usize>], sizes: &RunnerConfig) -> Result<Windows, String> {
        let threads = sizes.threads.max(1);
        let windows = windows
            .iter()
            .map(|w| {
                let mut kv = model.try_new_kv_cache_for(w.clone(), sizes.kv_tokens.max(1), sizes.kv_type).map_err(|e| format!("a KV cache for layers {w:?}: {e}"))?;
                // Sequences grow here a block at a time, as steps or the head's commands
                // come: their tables start with room for the longest.
                kv.set_table_room(sizes.max_ctx);
                Ok(Window { layers: w.clone(), kv, seqs: HashMap::new() })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let scratch = Scratch::try_new(&model, sizes.max_rows, sizes.max_logit_rows, sizes.max_ctx, threads).map_err(|e| format!("step buffers: {e}"))?;
        let pool = model.pool(threads).map_err(|e| e.to_string())?;
        Ok(Windows { model, pool, scratch, windows, rows: Vec::with_capacity(sizes.max_rows) })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn model_arc(&self) -> Arc<Model> {
        self.model.clone()
    }

    /// The windows, in the order the device runs them.
    pub fn layers(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.windows.iter().map(|w| w.layers.clone())
    }

    /// Apply cache commands to every window.
    pub fn apply(&mut self, ops: &[CacheOp]) -> Result<(), String> {
        for w in &mut self.windows {
            for op in ops {
                w.apply(op)?;
            }
        }
        Ok(())
    }

    /// The window of layers that starts at layer `first` (windows of no layers, the
    /// head's entry and exit, are run by index only).
    pub fn find(&self, first: usize) -> Option<usize> {
        self.windows.iter().position(|w| w.layers.start == first && !w.layers.is_empty())
    }

    /// Run window `index` over `rows` (their `seq` the head's numbers, their adapter slots
    /// indexing `adapters`), from `input` to `output`. Returns the window's layers.
    pub fn step(&mut self, index: usize, rows: impl Iterator<Item = StepRow>, io: (StepInput, StepOutput), adapters: &[Arc<LoraMix>]) -> Result<Range<usize>, String> {
        let (input, output) = io;
        let w = &mut self.windows[index];
        self.rows.clear();
        let mut last = None;
        for r in rows {
            let ring_seq = r.seq as u32;
            let local = *w.seqs.entry(ring_seq).or_insert_with(|| Local { id: w.kv.new_seq(), mirrored: false });
            if local.mirrored {
                if w.kv.block_table(local.id).map_or(0, |t| t.len()) * BLOCK_TOKENS <= r.pos {
                    return Err(format!("the head named no block for position {} of sequence {ring_seq}", r.pos));
                }
                // A sequence's first row in a step starts where the head says: past what
                // this cache computed when the head attached a cached prefix (its tables
                // name the values), or before it when the head reused the number for a
                // new sequence.
                if last != Some(ring_seq) && w.kv.seq_len(local.id).is_ok_and(|len| len != r.pos) {
                    w.kv.mirror_len(local.id, r.pos).map_err(|e| format!("sequence {ring_seq}: {e}"))?;
                }
            }
            last = Some(ring_seq);
            self.rows.push(StepRow { seq: local.id, ..r });
        }
        let step = Step { rows: &self.rows, layers: w.layers.clone(), input, output, adapters };
        self.model.step(&self.pool, &mut w.kv, &step, &mut self.scratch).map_err(|e| e.to_string())?;
        Ok(w.layers.clone())
    }

    /// Run the window a travelling step enters, replacing its hidden states with the
    /// window's and moving it on to the window's end; `adapters` are the frame's mixes.
    /// Returns the window's index.
    pub fn run_frame(&mut self, frame: &mut StepFrame, adapters: &[Arc<LoraMix>]) -> Result<usize, String> {
        let n_embd = self.model.cfg.n_embd;
        if frame.hidden.len() != frame.rows.len() * n_embd {
            return Err(format!("{} hidden values for {} rows of {n_embd}", frame.hidden.len(), frame.rows.len()));
        }
        if frame.rows.len() > self.scratch.max_rows() {
            return Err(format!("a step of {} rows, beyond the {} this device was sized for", frame.rows.len(), self.scratch.max_rows()));
        }
        let first = frame.first_layer as usize;
        let index = self.find(first).ok_or_else(|| format!("no window of this device starts at layer {first}"))?;
        let rows = frame.rows.iter().map(|r| StepRow::hidden(r.pos as usize, r.seq as SeqId, r.kind).with_adapter(r.adapter.map(AdapterSlot)).with_logits(r.logits).with_grouped(r.grouped).with_tiled(r.tiled));
        let layers = self.step(index, rows, (StepInput::Hidden(&frame.hidden), StepOutput::Hidden), adapters)?;
        // The output has the input's size: overwrite it in place.
        for (i, out) in frame.hidden.chunks_exact_mut(n_embd).enumerate() {
            out.copy_from_slice(self.scratch.hidden(i));
        }
        frame.first_layer = layers.end as u32;
        Ok(index)
    }

    /// The hidden states of the last step's `rows` rows, appended to `out` (cleared).
    pub fn hidden_into(&self, rows: usize, out: &mut Vec<f32>) {
        out.clear();
        for i in 0..rows {
            out.extend_from_slice(self.scratch.hidden(i));
        }
    }

    /// The step buffers (the last exit's logits).
    pub fn scratch_mut(&mut self) -> &mut Scratch {
        &mut self.scratch
    }

    /// Logits of the `i`-th row of the last step that asked for them.
    pub fn logits_mut(&mut self, i: usize) -> &mut [f32] {
        self.scratch.logits_mut(i)
    }
}
