//! One step's computation, run by every pool thread together, on one part or on one part
//! per NUMA node: the SPMD driver and its barrier plan.
//!
//! Each part computes its own output rows of every projection and its own heads'
//! attention, in buffers in its own memory. After a part computes columns the others need
//! (attention outputs, the residual stream, the FFN activations) it copies them into every
//! other part's buffers: writes cross nodes, reads never do. Phases are separated by
//! barriers: a node's threads meet at group barriers, all nodes at global ones. Each phase
//! splits its work so that no two threads write the same element.
//!
//! The driver (`run_on`) owns the order of phases and every barrier between them; the
//! phases themselves live with the block they belong to: `attention` and `ffn` (one
//! layer's two blocks), `project` (the one door of every matrix product), `buffers` (what
//! the threads share). A backward pass will mirror the blocks.

mod attend;
mod attention;
mod buffers;
mod experts;
mod ffn;
mod lora;
mod project;

use std::ops::Range;
use std::sync::Arc;

use blink_kernels::cpu::{self, Isa};
use blink_kernels::flavour::{self, Flavour};
use blink_kernels::gemm::RowForm;
use blink_runtime::numa::{NodePool, NodeWorker};
use blink_kernels::ops;
use blink_kernels::order::{self, DotOrder};
use blink_runtime::pool::SharedMut;

use super::scratch::{PartScratch, LORA_PRODUCTS};
use super::{Scratch, Step, StepInput, StepOutput, StepRow};
use crate::config::QkNorm;
use crate::kv_cache::{KvData, KvElem, KvShard, KvStore, TableSnapshot};
use crate::lora::LoraMix;
use crate::parallel::tensor::{TensorPart, MAX_PARTS};
use crate::weights::{Ffn, Weights};
use crate::Model;
use buffers::{Buf, PartView, Shared, Write};

/// The cache element store of a shard, by type.
pub(super) trait StoreOf: KvElem + blink_runtime::numa::Zeroable {
    fn store(data: &mut KvData) -> &mut KvStore<Self>;
}

impl StoreOf for half::f16 {
    fn store(data: &mut KvData) -> &mut KvStore<Self> {
        match data {
            KvData::F16(s) => s,
            KvData::F32(_) => unreachable!("shards of one cache share a type"),
        }
    }
}

impl StoreOf for f32 {
    fn store(data: &mut KvData) -> &mut KvStore<Self> {
        match data {
            KvData::F32(s) => s,
            KvData::F16(_) => unreachable!("shards of one cache share a type"),
        }
    }
}

pub(super) struct Pass<'a, T: KvElem> {
    model: &'a Model,
    rows: &'a [StepRow],
    layers: Range<usize>,
    input: StepInput<'a>,
    output: StepOutput,
    logit_rows: &'a [usize],
    /// How llama.cpp computes the rows: every row's products, the last layer's FFN's and
    /// the LM head's (see [`Scratch`]).
    row_forms: &'a [RowForm],
    out_forms: &'a [RowForm],
    logit_forms: &'a [RowForm],
    views: [Option<PartView<'a, T>>; MAX_PARTS],
    n_parts: usize,
    logits: Buf<'a>,
    act_stride: usize,
    tables: &'a TableSnapshot,
    /// The step's adapter mixes, and its rows that use one, grouped by slot.
    adapters: &'a [Arc<LoraMix>],
    lora_rows: &'a [usize],
    lora_groups: &'a [(usize, Range<usize>)],
    /// Columns of one product's activations in a row of `lora_t`.
    lora_stride: usize,
    isa: Isa,
    order: DotOrder,
    /// Which llama.cpp build's float definitions the llama order follows.
    flavour: Flavour,
}

impl<'a, T: StoreOf> Pass<'a, T> {
    /// The pass of a step that was checked ([`Model::step_beside`]).
    pub(super) fn new(model: &'a Model, step: &Step<'a>, s: &'a mut Scratch, shards: &'a mut [KvShard]) -> Self {
        let cfg = &model.cfg;
        let n_parts = model.parts.len();
        assert!(n_parts <= MAX_PARTS && shards.len() == n_parts && s.parts.len() == n_parts, "parts of model, cache and scratch differ");
        let mut it = model
            .parts
            .iter()
            .zip(&model.split.parts)
            .zip(s.parts.iter_mut())
            .zip(shards.iter_mut())
            .map(|(((w, part), ps), shard): (((&Weights, &TensorPart), &mut PartScratch), &mut KvShard)| {
                let layout = shard.layout;
                let store = T::store(&mut shard.data);
                PartView {
                    w,
                    part,
                    x: Buf::new(&mut ps.x, cfg.n_embd),
                    xn: Buf::new(&mut ps.xn, cfg.n_embd),
                    q: Buf::new(&mut ps.q, cfg.q_dim()),
                    k: Buf::new(&mut ps.k, cfg.kv_dim()),
                    v: Buf::new(&mut ps.v, cfg.kv_dim()),
                    attn: Buf::new(&mut ps.attn, cfg.q_dim()),
                    gate: Buf::new(&mut ps.gate, cfg.n_ff),
                    up: Buf::new(&mut ps.up, cfg.n_ff),
                    act: SharedMut::new(&mut ps.act),
                    rope: Buf::new(&mut ps.rope, cfg.rope_width()),
                    qh: Buf::new(&mut ps.qh, cfg.head_dim),
                    lora_t: Buf::new(&mut ps.lora_t, LORA_PRODUCTS * s.lora_stride),
                    router: Buf::new(&mut ps.router, cfg.moe.map_or(1, |m| m.n_expert)),
                    moe_out: Buf::new(&mut ps.moe_out, cfg.n_embd),
                    moe_w: SharedMut::new(&mut ps.moe_w),
                    moe_idx: SharedMut::new(&mut ps.moe_idx),
                    kc: SharedMut::new(&mut store.k),
                    vc: SharedMut::new(&mut store.v),
                    layout,
                }
            });
        let views = std::array::from_fn(|_| it.next());
        Pass {
            model,
            rows: step.rows,
            layers: step.layers.clone(),
            input: step.input,
            output: step.output,
            logit_rows: &s.logit_rows,
            row_forms: &s.row_forms,
            out_forms: &s.out_forms,
            logit_forms: &s.logit_forms,
            views,
            n_parts,
            logits: Buf::new(&mut s.logits, cfg.vocab_size),
            act_stride: s.act_stride,
            tables: &s.tables,
            adapters: step.adapters,
            lora_rows: &s.lora_rows,
            lora_groups: &s.lora_groups,
            lora_stride: s.lora_stride,
            isa: cpu::active(),
            order: order::active(),
            flavour: flavour::active(),
        }
    }

    /// Run the pass on `pool`, and `beside` on the calling thread meanwhile (see
    /// [`NodePool::run_beside`]).
    pub(super) fn run_beside<R>(&self, pool: &NodePool, beside: impl FnOnce() -> R) -> (R, std::time::Duration) {
        pool.run_beside(|w| self.run_on(w, self.view(w.node)), beside)
    }

    /// The forms of layer `layer`'s FFN products: llama.cpp runs the model's last layer's
    /// FFN on the rows that want logits only.
    fn ffn_forms(&self, layer: usize) -> &'a [RowForm] {
        if layer + 1 == self.model.cfg.n_layers {
            self.out_forms
        } else {
            self.row_forms
        }
    }

    fn view(&self, part: usize) -> &PartView<'a, T> {
        self.views[part].as_ref().expect("a view per part")
    }

    fn others(&self, part: usize) -> impl Iterator<Item = &PartView<'a, T>> {
        (0..self.n_parts).filter(move |&p| p != part).map(|p| self.view(p))
    }

    fn run_on(&self, w: &NodeWorker, me: &PartView<T>) {
        let split = self.n_parts > 1;
        match self.input {
            StepInput::Tokens => self.embed(w),
            StepInput::Hidden(states) => self.load_hidden(w, me, states),
        }
        self.rope_angles(w, me);
        w.global_barrier();
        for l in self.layers.clone() {
            let lw = me.w.layer(l);
            self.attention_in(w, me, l, lw);
            if self.model.split.shares_kv {
                if self.model.cfg.qk_norm == Some(QkNorm::Whole) {
                    // The norms read every part's Q columns, which the sharing rewrites.
                    w.global_barrier();
                } else {
                    w.group_barrier();
                }
                self.share_queries(w, me);
                w.global_barrier();
            } else {
                w.group_barrier();
            }
            self.attend(w, me, l);
            w.global_barrier();
            self.attention_out(w, me, l, lw);
            self.join_residual(w, me, lw.attn_post_norm.as_deref());
            self.ffn_in(w, me, l, lw);
            // A part's experts run whole on it: their activations stay there.
            if split && matches!(lw.ffn, Ffn::Dense(_)) {
                self.broadcast(w, me, Shared::Ffn, me.part.ff_rows.clone());
                w.global_barrier();
            }
            self.ffn_out(w, me, l, lw);
            self.join_residual(w, me, lw.ffn_post_norm.as_deref());
        }
        if self.model.cfg.block_out_apart() {
            // The last block's output joined the stream row by row on each thread's share
            // of the rows; the LM head's rows are shared out differently.
            w.global_barrier();
        }
        // With `StepOutput::Hidden` the residual stream, whole in every part, is the output.
        let n_logits = self.logit_rows.len();
        if self.output == StepOutput::Logits && n_logits > 0 {
            self.norm_rows(w, me, &me.w.output_norm, n_logits, |i| self.logit_rows[i]);
            let vr = me.part.vocab_rows.start;
            self.project(w, me, &me.xn, (self.model.cfg.n_embd, n_logits), self.logit_forms, &[(&me.w.output, &self.logits, vr, Write::Set, None)]);
            if let Some(cap) = self.model.cfg.logit_softcap {
                self.soft_cap(w, me, n_logits, cap);
            }
            if let Some(s) = self.model.cfg.logit_scale {
                self.scale_logits(w, me, n_logits, 1.0 / s);
            }
        }
    }

    /// A block's output joins every part's residual stream: split, each part's columns go
    /// to the others; with a post-norm (`post_norm`) or a residual scale, the output was
    /// left in `xn`, whole in every part once shared, and `x += rms_norm(xn) · post_norm`
    /// (times the scale) on each part's copy.
    fn join_residual(&self, w: &NodeWorker, me: &PartView<T>, post_norm: Option<&[f32]>) {
        let split = self.n_parts > 1;
        let scale = self.model.cfg.residual_scale;
        if post_norm.is_none() && scale.is_none() {
            if split {
                self.broadcast(w, me, Shared::Residual, me.part.embd_rows.clone());
                w.global_barrier();
            }
            return;
        }
        if split {
            self.broadcast(w, me, Shared::BlockOut, me.part.embd_rows.clone());
            w.global_barrier();
        }
        let eps = self.model.cfg.norm_eps;
        for r in w.share(self.rows.len(), 1) {
            // SAFETY: xn is whole (the projection's barrier, or the broadcast's); the node's
            // threads split the rows of x and xn, and the next phase reads the same rows on
            // the same thread first.
            unsafe {
                let out = me.xn.row_mut(r);
                if let Some(weight) = post_norm {
                    ops::rms_norm_in_place(self.isa, out, weight, eps);
                }
                if let Some(s) = scale {
                    out.iter_mut().for_each(|v| *v *= s);
                }
                me.x.row_mut(r).iter_mut().zip(out.iter()).for_each(|(x, y)| *x += *y);
            }
        }
    }

    /// The logit rows' values on this part's vocabulary columns times `s`.
    fn scale_logits(&self, w: &NodeWorker, me: &PartView<T>, n_logits: usize, s: f32) {
        let cols = me.part.vocab_rows.clone();
        for r in w.share(n_logits, 1) {
            // SAFETY: as in `soft_cap`.
            let row = unsafe { self.logits.cols_mut(r, cols.clone()) };
            row.iter_mut().for_each(|v| *v *= s);
        }
    }

    /// `cap · tanh(logit / cap)` on this part's vocabulary columns of the logit rows.
    fn soft_cap(&self, w: &NodeWorker, me: &PartView<T>, n_logits: usize, cap: f32) {
        let cols = me.part.vocab_rows.clone();
        for r in w.share(n_logits, 1) {
            // SAFETY: the projection's barrier ended it; this part's columns, rows split
            // between its threads.
            let row = unsafe { self.logits.cols_mut(r, cols.clone()) };
            row.iter_mut().for_each(|v| *v = (*v * (1.0 / cap)).tanh() * cap);
        }
    }

    /// Copy columns `cols` of every row of one buffer from this part to the others. The
    /// node's threads split the rows.
    fn broadcast(&self, w: &NodeWorker, me: &PartView<T>, which: Shared, cols: Range<usize>) {
        self.broadcast_rows(w, me, which, cols, 0..self.rows.len())
    }

    /// [`Pass::broadcast`] of rows `rows`.
    fn broadcast_rows(&self, w: &NodeWorker, me: &PartView<T>, which: Shared, cols: Range<usize>, rows: Range<usize>) {
        for r in w.share(rows.len(), 1) {
            let r = rows.start + r;
            // SAFETY: this part alone owns columns `cols` in this phase, in every part's
            // buffer; its threads split the rows.
            unsafe {
                let src = me.shared(which).cols(r, cols.clone());
                for other in self.others(w.node) {
                    other.shared(which).cols_mut(r, cols.clone()).copy_from_slice(src);
                }
            }
        }
    }

    /// Token embeddings into every part's residual stream: each row is written by the part
    /// holding its token's embedding.
    fn embed(&self, w: &NodeWorker) {
        let me = self.view(w.node);
        let vocab = &me.part.vocab_rows;
        for r in w.share(self.rows.len(), 1) {
            let token = self.rows[r].token.expect("checked: a tokens step has a token per row") as usize;
            if !vocab.contains(&token) {
                continue;
            }
            // SAFETY: row r is written by exactly one thread (of the owning part).
            unsafe {
                let out = me.x.row_mut(r);
                me.w.token_embd.dequantize_row(token - vocab.start, out);
                if let Some(scale) = self.model.cfg.embd_scale {
                    out.iter_mut().for_each(|v| *v *= scale);
                }
                for other in self.others(w.node) {
                    other.x.row_mut(r).copy_from_slice(out);
                }
            }
        }
    }

    /// Hidden states handed in by a previous window, into this part's residual stream
    /// (`states` is `[rows][n_embd]`, checked).
    fn load_hidden(&self, w: &NodeWorker, me: &PartView<T>, states: &[f32]) {
        let n_embd = self.model.cfg.n_embd;
        for r in w.share(self.rows.len(), 1) {
            // SAFETY: each part's threads split its rows.
            unsafe { me.x.row_mut(r).copy_from_slice(&states[r * n_embd..(r + 1) * n_embd]) };
        }
    }

    /// The rope angles of every row's position, computed once for all layers (the local
    /// layers' after the global ones', when they differ).
    fn rope_angles(&self, w: &NodeWorker, me: &PartView<T>) {
        let n_dims = self.model.cfg.rope.n_dims;
        for r in w.share(self.rows.len(), 1) {
            // SAFETY: rope rows are split between the node's threads.
            let row = unsafe { me.rope.row_mut(r) };
            self.model.rope.angles(self.rows[r].pos, &mut row[..n_dims]);
            if let Some(local) = &self.model.rope_local {
                local.angles(self.rows[r].pos, &mut row[n_dims..]);
            }
        }
    }

    /// A block's input: its norm of the residual stream in `xn`, or the stream itself for a
    /// model without pre-norms (OLMo 2).
    fn block_input<'s>(&'s self, w: &NodeWorker, me: &'s PartView<'a, T>, norm: Option<&[f32]>, count: usize) -> &'s Buf<'a> {
        match norm {
            Some(weight) => {
                self.norm_rows(w, me, weight, count, |r| r);
                &me.xn
            }
            None => &me.x,
        }
    }

    /// `xn[i] = rms_norm(x[src(i)]) * weight` for `i in 0..count`, in this part. No barrier:
    /// the next projection quantizes the same rows on the same thread first.
    fn norm_rows(&self, w: &NodeWorker, me: &PartView<T>, weight: &[f32], count: usize, src: impl Fn(usize) -> usize) {
        let eps = self.model.cfg.norm_eps;
        // Four rows at a time, whose sums of squares (serial chains) then overlap.
        const ROWS: usize = 4;
        let mine = w.share(count, 1);
        let mut i = mine.start;
        while i < mine.end {
            // SAFETY: x is read-only in this phase; xn rows are split between threads.
            unsafe {
                if mine.end - i >= ROWS {
                    let rows: [usize; ROWS] = std::array::from_fn(|k| i + k);
                    ops::rms_norm_rows(self.isa, rows.map(|r| me.x.row(src(r))), weight, eps, rows.map(|r| me.xn.row_mut(r)));
                    i += ROWS;
                } else {
                    ops::rms_norm(self.isa, me.x.row(src(i)), weight, eps, me.xn.row_mut(i));
                    i += 1;
                }
            }
        }
    }
}
