//! What a forward pass is asked to do: a step.
//!
//! A step is rows and a range of layers. Every kind of work is a step: a prompt's chunk
//! and a decode token are rows of kind `Prompt` and `Decode` over all the layers, a ring
//! device's share is the same rows over its window of layers with hidden states coming in
//! and going out, and fine-tuning's forward is rows of kind `Training`. No feature gets a
//! forward pass of its own; each is a different step.

use std::ops::Range;
use std::sync::Arc;

use crate::kv_cache::SeqId;
use crate::lora::LoraMix;

/// What a row is for. The pass computes every kind alike; the kind tells the scheduler,
/// the latency model and (later) the trainer which rows are whose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// A token of a prompt being evaluated (prefill).
    #[default]
    Prompt,
    /// A generated token fed back to produce the next one.
    Decode,
    /// A token of a fine-tuning example.
    Training,
}

/// An adapter's slot: an index into the step's [`Step::adapters`]. A row without one, or
/// with an empty mix, runs the base model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterSlot(pub u16);

/// One token of one sequence in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRow {
    /// The token, or `None` when the step's input is hidden states.
    pub token: Option<u32>,
    /// Position of the token in its sequence.
    pub pos: usize,
    pub seq: SeqId,
    /// Whether this row's logits are wanted (for a step that ends in the LM head).
    pub logits: bool,
    /// The adapter this row runs with; `None` is the base model.
    pub adapter: Option<AdapterSlot>,
    pub kind: RowKind,
    /// A prompt row that llama.cpp multiplies in a group of four rows (its position's four
    /// lie within the prompt, which it evaluates in one batch): set so that `Q4_K`
    /// matrices give its bits (see `blink_kernels::quant::vec_dot_grouped`).
    pub grouped: bool,
    /// A prompt row that llama.cpp multiplies in a micro-batch of eight rows or more, with
    /// its tiled kernels for some types (see `blink_kernels::quant::vec_dot_tiled`).
    pub tiled: bool,
}

/// The micro-batch llama.cpp's tools evaluate a prompt in by default (`-ub 512`).
pub const LLAMA_UBATCH: usize = 512;

impl StepRow {
    /// A prompt token, without logits.
    pub fn prompt(token: u32, pos: usize, seq: SeqId) -> StepRow {
        StepRow { token: Some(token), pos, seq, logits: false, adapter: None, kind: RowKind::Prompt, grouped: false, tiled: false }
    }

    /// A generated token fed back, with logits.
    pub fn decode(token: u32, pos: usize, seq: SeqId) -> StepRow {
        StepRow { token: Some(token), pos, seq, logits: true, adapter: None, kind: RowKind::Decode, grouped: false, tiled: false }
    }

    /// A row whose input is a hidden state (a window after the first), of `kind`.
    pub fn hidden(pos: usize, seq: SeqId, kind: RowKind) -> StepRow {
        StepRow { token: None, pos, seq, logits: false, adapter: None, kind, grouped: false, tiled: false }
    }

    pub fn with_logits(self, logits: bool) -> StepRow {
        StepRow { logits, ..self }
    }

    pub fn with_adapter(self, adapter: Option<AdapterSlot>) -> StepRow {
        StepRow { adapter, ..self }
    }

    pub fn with_kind(self, kind: RowKind) -> StepRow {
        StepRow { kind, ..self }
    }

    pub fn with_grouped(self, grouped: bool) -> StepRow {
        StepRow { grouped, ..self }
    }

    /// Whether this row is tiled (see [`StepRow::tiled`]).
    pub fn with_tiled(self, tiled: bool) -> StepRow {
        StepRow { tiled, ..self }
    }

    /// A prompt row at `pos` of a prompt of `len` tokens, marked as llama.cpp's tools
    /// evaluate such a prompt ([`StepRow::in_batches_of`] of [`LLAMA_UBATCH`]).
    pub fn in_prompt_of(self, len: usize) -> StepRow {
        self.in_batches_of(len, LLAMA_UBATCH)
    }

    /// A prompt row at `pos` of a prompt of `len` tokens that llama.cpp evaluates in
    /// micro-batches of `ubatch` rows: in each, by fours, the last `n % 4` of its `n` rows
    /// alone, and tiled if `n` is eight or more.
    pub fn in_batches_of(self, len: usize, ubatch: usize) -> StepRow {
        let ubatch = ubatch.max(1);
        let start = self.pos.min(len) / ubatch * ubatch;
        let n = len.saturating_sub(start).min(ubatch);
        StepRow { grouped: self.pos - start < n - n % 4, tiled: n >= 8, ..self }
    }
}

/// Where a step's rows come from.
#[derive(Clone, Copy, Debug)]
pub enum StepInput<'a> {
    /// The rows' tokens, looked up in the embedding table.
    Tokens,
    /// Hidden states, `[rows][n_embd]`, as a previous window left them.
    Hidden(&'a [f32]),
}

/// What a step leaves in the scratch when it is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutput {
    /// Logits of the rows that ask for them, after the final norm and the LM head
    /// ([`Scratch::logits`](crate::Scratch::logits)).
    Logits,
    /// The hidden state of every row at the window's end
    /// ([`Scratch::hidden`](crate::Scratch::hidden)), for the next window.
    Hidden,
}

/// One step of the forward pass: rows over a range of layers.
///
/// Fine-tuning will add an output that keeps what its backward pass needs (saved
/// activations in an arena sized before the run) and a loss head beside the LM head; they
/// belong here, as another [`StepOutput`].
#[derive(Clone, Debug)]
pub struct Step<'a> {
    pub rows: &'a [StepRow],
    pub layers: Range<usize>,
    pub input: StepInput<'a>,
    pub output: StepOutput,
    /// The adapter mixes the rows' slots index. Rows of one slot are grouped for the
    /// adapters' products; a row's result does not depend on the others.
    pub adapters: &'a [Arc<LoraMix>],
}

impl<'a> Step<'a> {
    /// Tokens in, logits out, over all `n_layers` layers: the whole model.
    pub fn whole(rows: &'a [StepRow], n_layers: usize) -> Step<'a> {
        Step { rows, layers: 0..n_layers, input: StepInput::Tokens, output: StepOutput::Logits, adapters: &[] }
    }

    /// The same step with the rows' slots indexing `adapters`.
    pub fn with_adapters(self, adapters: &'a [Arc<LoraMix>]) -> Step<'a> {
        Step { adapters, ..self }
    }
}
