//! Working memory of the forward pass, allocated once for a maximum step size.

use blink_kernels::quant;

use crate::Model;

/// Buffers a step computes in. Sized at creation; a step that does not fit is refused.
pub struct Scratch {
    max_rows: usize,
    max_logit_rows: usize,
    max_ctx: usize,
    n_threads: usize,
    /// Residual stream, `[rows][n_embd]`.
    pub(super) x: Vec<f32>,
    /// Normalised input of the next projection, `[rows][max(n_embd, n_ff)]`.
    pub(super) xn: Vec<f32>,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) attn: Vec<f32>,
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    /// Quantized activations, `[rows][act_stride]` bytes.
    pub(super) act: Vec<u8>,
    pub(super) act_stride: usize,
    /// Per-thread rope angles, `[threads][n_dims]`.
    pub(super) rope: Vec<f32>,
    /// Per-thread rounded query head, `[threads][head_dim]`.
    pub(super) qh: Vec<f32>,
    /// Logits of the rows that asked for them, `[max_logit_rows][vocab]`.
    pub(super) logits: Vec<f32>,
    /// Indices of the rows with logits, in order (filled per step).
    pub(super) logit_rows: Vec<usize>,
    /// Per-sequence expected next position while validating a step.
    pub(super) next_pos: Vec<usize>,
}

impl Scratch {
    /// Room for steps of up to `max_rows` rows, of which up to `max_logit_rows` want logits,
    /// at positions below `max_ctx`, computed by `n_threads` threads.
    pub fn new(model: &Model, max_rows: usize, max_logit_rows: usize, max_ctx: usize, n_threads: usize) -> Scratch {
        let cfg = &model.cfg;
        let w = &model.weights;
        let max_rows = max_rows.max(1);
        let max_logit_rows = max_logit_rows.clamp(1, max_rows);
        let n_threads = n_threads.max(1);
        // The widest quantized activation row any matrix consumes.
        let mut act_stride = 0;
        let mut consider = |m: &crate::weights::Matrix| {
            let ty = quant::vec_dot_type(m.ty);
            let bytes = ty.row_bytes(m.cols as u64).unwrap_or(0) as usize;
            act_stride = act_stride.max(bytes);
        };
        consider(&w.output);
        for l in &w.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                consider(m);
            }
        }
        let act_stride = act_stride.next_multiple_of(64);
        let wide = cfg.n_embd.max(cfg.n_ff).max(cfg.q_dim());
        Scratch {
            max_rows,
            max_logit_rows,
            max_ctx,
            n_threads,
            x: vec![0.0; max_rows * cfg.n_embd],
            xn: vec![0.0; max_rows * wide],
            q: vec![0.0; max_rows * cfg.q_dim()],
            k: vec![0.0; max_rows * cfg.kv_dim()],
            v: vec![0.0; max_rows * cfg.kv_dim()],
            attn: vec![0.0; max_rows * cfg.q_dim()],
            gate: vec![0.0; max_rows * cfg.n_ff],
            up: vec![0.0; max_rows * cfg.n_ff],
            act: vec![0; max_rows * act_stride],
            act_stride,
            rope: vec![0.0; n_threads * cfg.rope.n_dims],
            qh: vec![0.0; n_threads * cfg.head_dim],
            logits: vec![0.0; max_logit_rows * cfg.vocab_size],
            logit_rows: Vec::with_capacity(max_rows),
            next_pos: Vec::new(),
        }
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

    /// Mutable logits of the `i`-th row with logits (for in-place sampling transforms).
    pub fn logits_mut(&mut self, i: usize) -> &mut [f32] {
        let vocab = self.logits.len() / self.max_logit_rows;
        &mut self.logits[i * vocab..(i + 1) * vocab]
    }
}
