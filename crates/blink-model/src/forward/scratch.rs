//! Working memory of the forward pass, allocated once for a maximum step size: one set of
//! buffers per part, in that part's memory, plus the shared logits.

use blink_kernels::gemm::RowForm;
use blink_runtime::numa::NumaError;
use blink_runtime::storage::Storage;

use crate::kv_cache::TableSnapshot;
use crate::{Model, ModelError};

/// Products of one projection that adapters may target (q, k and v share an input).
pub(super) const LORA_PRODUCTS: usize = 3;

/// One part's buffers. Activations are full width in every part: a part computes its own
/// columns and copies them to the other parts, which then read only local memory.
pub(super) struct PartScratch {
    /// Residual stream, `[rows][n_embd]`.
    pub x: Storage<f32>,
    /// Normalised input of the next projection, `[rows][n_embd]`.
    pub xn: Storage<f32>,
    pub q: Storage<f32>,
    pub k: Storage<f32>,
    pub v: Storage<f32>,
    pub attn: Storage<f32>,
    pub gate: Storage<f32>,
    pub up: Storage<f32>,
    /// Quantized activations, `[rows][act_stride]` bytes.
    pub act: Storage<u8>,
    /// Rope angles of each row's position, `[rows][n_dims]`.
    pub rope: Storage<f32>,
    /// Per-thread rounded query head, `[threads][head_dim]`.
    pub qh: Storage<f32>,
    /// Adapter activations `t = A·x` of the step's adapter rows, `[rows][LORA_PRODUCTS]
    /// [lora_stride]` (grown when a step's mixes stack more rank than any before).
    pub lora_t: Storage<f32>,
    /// With experts: the router's scores, `[rows][n_expert]`; each (row, choice) slot's
    /// expert output, `[rows · n_used][n_embd]`; each slot's weight, `[rows · n_used]`; and
    /// the slots' routing (`experts::Routing`). Empty without experts.
    pub router: Storage<f32>,
    pub moe_out: Storage<f32>,
    pub moe_w: Storage<f32>,
    pub moe_idx: Storage<u32>,
}

/// Buffers a step computes in. Sized at creation; a step that does not fit is refused.
pub struct Scratch {
    max_rows: usize,
    max_logit_rows: usize,
    max_ctx: usize,
    n_threads: usize,
    pub(super) act_stride: usize,
    pub(super) parts: Vec<PartScratch>,
    /// Logits of the rows that asked for them, `[max_logit_rows][vocab]`.
    pub(super) logits: Vec<f32>,
    /// Indices of the rows with logits, in order (filled per step).
    pub(super) logit_rows: Vec<usize>,
    /// How llama.cpp computes each row's products (filled per step): every row's as it
    /// asks (`StepRow::grouped`, `StepRow::tiled`), the last layer's FFN's (which llama.cpp
    /// runs on the rows that want logits only: a sequence's such rows by fours, the last
    /// `m % 4` alone, and tiled where the row is and there are eight), and the LM head's
    /// (the same, by logit row).
    pub(super) row_forms: Vec<RowForm>,
    pub(super) out_forms: Vec<RowForm>,
    pub(super) logit_forms: Vec<RowForm>,
    /// Per-sequence expected next position while validating a step.
    pub(super) next_pos: Vec<usize>,
    /// The step's block tables, copied when it was checked.
    pub(super) tables: TableSnapshot,
    /// The rows that run with an adapter, grouped by slot (filled per step).
    pub(super) lora_rows: Vec<usize>,
    /// `(slot, range of lora_rows)` of each slot used (filled per step).
    pub(super) lora_groups: Vec<(usize, std::ops::Range<usize>)>,
    /// The room for a row's activations of one product (the most rank a mix stacked so far).
    pub(super) lora_stride: usize,
}

impl Scratch {
    /// Room for steps of up to `max_rows` rows, of which up to `max_logit_rows` want logits,
    /// at positions below `max_ctx`, computed by up to `n_threads` threads per part.
    pub fn new(model: &Model, max_rows: usize, max_logit_rows: usize, max_ctx: usize, n_threads: usize) -> Scratch {
        Self::try_new(model, max_rows, max_logit_rows, max_ctx, n_threads).expect("scratch memory could not be allocated")
    }

    /// As `new`, reporting a failure to map or bind node memory.
    pub fn try_new(model: &Model, max_rows: usize, max_logit_rows: usize, max_ctx: usize, n_threads: usize) -> Result<Scratch, ModelError> {
        let cfg = &model.cfg;
        let max_rows = max_rows.max(1);
        let max_logit_rows = max_logit_rows.clamp(1, max_rows);
        let n_threads = n_threads.max(1);
        // The widest quantized activation row any matrix consumes.
        let act_stride = model
            .parts
            .iter()
            .flat_map(|w| w.product_matrices())
            .map(|m| m.mat_ref().activation_row_bytes().unwrap_or(0))
            .max()
            .unwrap_or(0)
            .next_multiple_of(64);
        // No buffer is wider than this per row: sizes whose products overflow are refused
        // before anything is allocated.
        let widest = [cfg.n_embd, cfg.q_dim(), cfg.n_ff, cfg.vocab_size, cfg.rope_width()].into_iter().max().unwrap_or(0) * 4 + act_stride;
        let too_large = || ModelError::Memory(NumaError::TooLarge { len: max_rows, elem_size: widest });
        max_rows.checked_mul(widest).filter(|&b| b <= isize::MAX as usize).ok_or_else(too_large)?;
        // With experts, the FFN buffers hold a row per (row, choice) slot, and the
        // activations the input rows before them.
        let (n_expert, slots) = cfg.moe.map_or((0, 1), |m| (m.n_expert, m.n_used));
        let act_rows = if cfg.moe.is_some() { max_rows * (slots + 1) } else { max_rows };
        let placement = model.placement();
        let parts = (0..model.parts.len())
            .map(|node| {
                let home = placement.numa.then_some((&placement.topology, node));
                let f = |len: usize| Storage::<f32>::zeroed(len, home);
                Ok(PartScratch {
                    x: f(max_rows * cfg.n_embd)?,
                    xn: f(max_rows * cfg.n_embd)?,
                    q: f(max_rows * cfg.q_dim())?,
                    k: f(max_rows * cfg.kv_dim())?,
                    v: f(max_rows * cfg.kv_dim())?,
                    attn: f(max_rows * cfg.q_dim())?,
                    gate: f(max_rows * slots * cfg.n_ff)?,
                    up: f(max_rows * slots * cfg.n_ff)?,
                    act: Storage::<u8>::zeroed(act_rows * act_stride, home)?,
                    rope: f(max_rows * cfg.rope_width())?,
                    qh: f(n_threads * cfg.head_dim)?,
                    lora_t: f(0)?,
                    router: f(max_rows * n_expert)?,
                    moe_out: f(if n_expert > 0 { max_rows * slots * cfg.n_embd } else { 0 })?,
                    moe_w: f(if n_expert > 0 { max_rows * slots } else { 0 })?,
                    moe_idx: Storage::<u32>::zeroed(if n_expert > 0 { 3 * max_rows * slots + n_expert + 1 } else { 0 }, home)?,
                })
            })
            .collect::<Result<Vec<_>, NumaError>>()
            .map_err(ModelError::Memory)?;
        let n_logits = max_logit_rows * cfg.vocab_size;
        let mut logits = Vec::new();
        logits.try_reserve_exact(n_logits).map_err(|_| ModelError::Memory(NumaError::OutOfMemory { bytes: n_logits * 4 }))?;
        logits.resize(n_logits, 0.0);
        Ok(Scratch {
            max_rows,
            max_logit_rows,
            max_ctx,
            n_threads,
            act_stride,
            parts,
            logits,
            logit_rows: Vec::with_capacity(max_rows),
            row_forms: Vec::with_capacity(max_rows),
            out_forms: Vec::with_capacity(max_rows),
            logit_forms: Vec::with_capacity(max_rows),
            next_pos: Vec::new(),
            // Room for every row to be its own sequence at the longest context.
            tables: TableSnapshot::with_capacity(max_rows * max_ctx.div_ceil(crate::kv_cache::BLOCK_TOKENS)),
            lora_rows: Vec::with_capacity(max_rows),
            lora_groups: Vec::with_capacity(max_rows),
            lora_stride: 0,
        })
    }

    /// Make room for mixes stacking up to `rank` (a no-op once there is); on failure, the
    /// bytes per part it asked for.
    pub(super) fn reserve_lora(&mut self, model: &Model, rank: usize) -> Result<(), usize> {
        if rank <= self.lora_stride {
            return Ok(());
        }
        let len = self.max_rows.checked_mul(LORA_PRODUCTS * rank).ok_or(usize::MAX)?;
        let placement = model.placement();
        for (node, part) in self.parts.iter_mut().enumerate() {
            let home = placement.numa.then_some((&placement.topology, node));
            part.lora_t = Storage::<f32>::zeroed(len, home).map_err(|_| len.saturating_mul(4))?;
        }
        self.lora_stride = rank;
        Ok(())
    }

    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    pub fn max_logit_rows(&self) -> usize {
        self.max_logit_rows
    }

    /// Positions must stay below this.
    pub fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    /// Threads per part the scratch was sized for.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Rows of the last step that produced logits.
    pub fn n_logits(&self) -> usize {
        self.logit_rows.len()
    }

    /// Logits of the `i`-th row (in step order) that asked for them.
    pub fn logits(&self, i: usize) -> &[f32] {
        let vocab = self.logits.len() / self.max_logit_rows;
        &self.logits[i * vocab..(i + 1) * vocab]
    }

    /// The hidden state of row `i` at the end of the last step's window (the residual
    /// stream, whole in every part; read from the first part's memory), `[n_embd]`. What a
    /// step ending in [`StepOutput::Hidden`](super::StepOutput::Hidden) leaves for the next
    /// window.
    pub fn hidden(&self, i: usize) -> &[f32] {
        let x = &self.parts[0].x;
        let n_embd = x.len() / self.max_rows;
        &x[i * n_embd..(i + 1) * n_embd]
    }

    /// Mutable logits of the `i`-th row with logits (for in-place sampling transforms).
    pub fn logits_mut(&mut self, i: usize) -> &mut [f32] {
        let vocab = self.logits.len() / self.max_logit_rows;
        &mut self.logits[i * vocab..(i + 1) * vocab]
    }
}
