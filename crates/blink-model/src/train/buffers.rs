//! What a training step computes in: its matrices as shared raw views (threads write
//! disjoint rows or columns between phases), the work buffers sized for the most tokens a
//! step takes, and the arena of saved activations, sized before the run.

use crate::config::ModelConfig;
use crate::lora::LoraTarget;

use super::attention::Rows;

/// A `[rows][cols]` matrix inside a buffer that the step's threads share. Each phase
/// writes disjoint elements and reads only what a finished phase wrote.
#[derive(Clone, Copy)]
pub(super) struct M {
    pub ptr: *mut f32,
    pub cols: usize,
}

// SAFETY: an M is a view; the phases' split of rows and columns keeps accesses disjoint.
unsafe impl Send for M {}
unsafe impl Sync for M {}

impl M {
    pub fn of(buf: &mut [f32], cols: usize) -> M {
        M { ptr: buf.as_mut_ptr(), cols }
    }

    /// # Safety
    /// Row `r` is inside the buffer and nobody writes it meanwhile.
    #[inline]
    pub unsafe fn row(&self, r: usize) -> &[f32] {
        std::slice::from_raw_parts(self.ptr.add(r * self.cols), self.cols)
    }

    /// # Safety
    /// Row `r` is inside the buffer and only this caller touches it meanwhile.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn row_mut(&self, r: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.ptr.add(r * self.cols), self.cols)
    }

    /// The address of element `(r, c)`.
    #[inline]
    pub fn at(&self, r: usize, c: usize) -> *mut f32 {
        self.ptr.wrapping_add(r * self.cols + c)
    }

    /// The first `rows` rows as one slice (an `A` operand).
    ///
    /// # Safety
    /// As for [`M::row`], for all of them.
    #[inline]
    pub unsafe fn rows(&self, rows: usize) -> &[f32] {
        std::slice::from_raw_parts(self.ptr, rows * self.cols)
    }

    /// Columns from `col` on, `width` wide, as attention's head rows.
    pub fn head(&self, row0: usize, col: usize) -> Rows {
        // SAFETY: only an address; rows are read within the buffer by the callers.
        Rows { ptr: unsafe { self.ptr.add(row0 * self.cols + col) }, stride: self.cols }
    }
}

/// The activations a layer's backward needs, saved by its forward (rows are the step's
/// tokens). Norm outputs and SwiGLU are recomputed; everything a product made is kept.
#[derive(Clone, Copy)]
pub(super) struct Saved {
    /// The layer's input and the residual after attention (inputs of the two norms).
    pub x: M,
    pub x2: M,
    /// Queries and keys after rope, values, attention output and its row log-sum-exps.
    pub q: M,
    pub k: M,
    pub v: M,
    pub attn: M,
    pub lse: M,
    pub gate: M,
    pub up: M,
    /// Per target, the adapter's `scale · A·x` (`[tokens][rank]`), when it has that pair.
    pub lora: [Option<M>; 7],
}

/// Floats the saved activations of one layer take per token, for adapter ranks `ranks`.
pub(super) fn saved_per_token(cfg: &ModelConfig, ranks: &[usize; 7]) -> usize {
    2 * cfg.n_embd + 2 * cfg.q_dim() + 2 * cfg.kv_dim() + cfg.n_head + 2 * cfg.n_ff + ranks.iter().sum::<usize>()
}

/// The saved activations of every layer, in one allocation.
pub(super) struct Arena {
    data: Vec<f32>,
    per_layer: usize,
}

impl Arena {
    pub fn new(cfg: &ModelConfig, tokens: usize, ranks: &[usize; 7]) -> Result<Arena, std::collections::TryReserveError> {
        let per_layer = tokens * saved_per_token(cfg, ranks);
        let mut data = Vec::new();
        data.try_reserve_exact(per_layer * cfg.n_layers)?;
        data.resize(per_layer * cfg.n_layers, 0.0);
        Ok(Arena { data, per_layer })
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// Layer `l`'s views, for steps of up to `tokens` tokens.
    pub fn layer(&mut self, cfg: &ModelConfig, l: usize, tokens: usize, ranks: &[usize; 7]) -> Saved {
        let base = &mut self.data[l * self.per_layer..(l + 1) * self.per_layer];
        let mut at = 0;
        let mut take = |cols: usize| {
            let m = M { ptr: base[at..].as_mut_ptr(), cols };
            at += tokens * cols;
            m
        };
        let (e, q, kv, f) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let (x, x2, q, k, v, attn, lse, gate, up) = (take(e), take(e), take(q), take(kv), take(kv), take(q), take(cfg.n_head), take(f), take(f));
        let lora = std::array::from_fn(|i| (ranks[i] > 0).then(|| take(ranks[i])));
        Saved { x, x2, q, k, v, attn, lse, gate, up, lora }
    }
}

/// Work buffers of a step.
pub(super) struct Work {
    pub x: Vec<f32>,
    pub xn: Vec<f32>,
    pub tmp: Vec<f32>,
    pub h: Vec<f32>,
    pub rope: Vec<f32>,
    pub dx: Vec<f32>,
    pub dxn: Vec<f32>,
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    pub da: Vec<f32>,
    pub dh: Vec<f32>,
    pub dg: Vec<f32>,
    pub du: Vec<f32>,
    /// Adapter temporaries: `[tokens][rank]`, its transpose, `dBᵀ` (`[rank][out]`) and
    /// a dropped-out input (`[tokens][in]`).
    pub lora_t: Vec<f32>,
    pub lora_tt: Vec<f32>,
    pub lora_dbt: Vec<f32>,
    pub lora_x: Vec<f32>,
    /// The loss head: normed rows, a chunk of logits, their gradient rows.
    pub hf: Vec<f32>,
    pub logits: Vec<f32>,
    pub dhf: Vec<f32>,
}

/// Vocabulary rows whose logits are computed at once.
pub(super) const VOCAB_CHUNK: usize = 4096;

impl Work {
    pub fn new(cfg: &ModelConfig, tokens: usize, max_rank: usize) -> Work {
        let z = |n: usize| vec![0f32; n];
        let (e, q, kv, f) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let widest = LoraTarget::ALL.iter().map(|t| t.shape(cfg).0).max().unwrap_or(0);
        Work {
            x: z(tokens * e),
            xn: z(tokens * e),
            tmp: z(tokens * e),
            h: z(tokens * f),
            rope: z(tokens * cfg.rope.n_dims),
            dx: z(tokens * e),
            dxn: z(tokens * e),
            dq: z(tokens * q),
            dk: z(tokens * kv),
            dv: z(tokens * kv),
            da: z(tokens * q),
            dh: z(tokens * f),
            dg: z(tokens * f),
            du: z(tokens * f),
            lora_t: z(tokens * max_rank),
            lora_tt: z(tokens * max_rank),
            lora_dbt: z(max_rank * widest),
            lora_x: Vec::new(),
            hf: z(tokens * e),
            logits: z(tokens * VOCAB_CHUNK.min(cfg.vocab_size)),
            dhf: z(tokens * e),
        }
    }

    /// Sizes the dropped-out input buffer, which only steps with dropout use.
    pub fn for_dropout(&mut self, cfg: &ModelConfig, tokens: usize) {
        let deepest = LoraTarget::ALL.iter().map(|t| t.shape(cfg).1).max().unwrap_or(0);
        self.lora_x.resize(tokens * deepest, 0.0);
    }

    /// Views of every buffer, for a step's phases.
    pub fn views(&mut self, cfg: &ModelConfig) -> WorkViews {
        let (e, q, kv, f) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        WorkViews {
            x: M::of(&mut self.x, e),
            xn: M::of(&mut self.xn, e),
            tmp: M::of(&mut self.tmp, e),
            h: M::of(&mut self.h, f),
            rope: M::of(&mut self.rope, cfg.rope.n_dims),
            dx: M::of(&mut self.dx, e),
            dxn: M::of(&mut self.dxn, e),
            dq: M::of(&mut self.dq, q),
            dk: M::of(&mut self.dk, kv),
            dv: M::of(&mut self.dv, kv),
            da: M::of(&mut self.da, q),
            dh: M::of(&mut self.dh, f),
            dg: M::of(&mut self.dg, f),
            du: M::of(&mut self.du, f),
            lora: LoraTemps { t: M::of(&mut self.lora_t, 0), tt: M::of(&mut self.lora_tt, 0), dbt: M::of(&mut self.lora_dbt, 0), x: M::of(&mut self.lora_x, 0) },
            hf: M::of(&mut self.hf, e),
            logits: M::of(&mut self.logits, VOCAB_CHUNK.min(cfg.vocab_size)),
            dhf: M::of(&mut self.dhf, e),
        }
    }

    pub fn bytes(&self) -> usize {
        let all = [&self.x, &self.xn, &self.tmp, &self.h, &self.rope, &self.dx, &self.dxn, &self.dq, &self.dk, &self.dv, &self.da, &self.dh, &self.dg, &self.du];
        let more = [&self.lora_t, &self.lora_tt, &self.lora_dbt, &self.lora_x, &self.hf, &self.logits, &self.dhf];
        all.iter().chain(more.iter()).map(|v| v.len() * 4).sum()
    }
}

/// The temporaries an adapter pair's products go through.
#[derive(Clone, Copy)]
pub(super) struct LoraTemps {
    /// `[tokens][rank]`.
    pub t: M,
    /// `[rank][tokens]`.
    pub tt: M,
    /// `[rank][rows]`.
    pub dbt: M,
    /// `[tokens][cols]`: the input through dropout, or `dy·B·A` before its mask.
    pub x: M,
}

/// The work buffers as a step's phases see them.
#[derive(Clone, Copy)]
pub(super) struct WorkViews {
    pub x: M,
    pub xn: M,
    pub tmp: M,
    pub h: M,
    pub rope: M,
    pub dx: M,
    pub dxn: M,
    pub dq: M,
    pub dk: M,
    pub dv: M,
    pub da: M,
    pub dh: M,
    pub dg: M,
    pub du: M,
    pub lora: LoraTemps,
    pub hf: M,
    pub logits: M,
    pub dhf: M,
}
