//! A layer of experts in place of the FFN, as llama.cpp's `build_moe_ffn` computes it:
//! the router scores every expert (softmax), each row takes its `n_used` best (in falling
//! order of score, weights normed to sum to one), every chosen expert runs its SwiGLU FFN
//! on the rows that chose it, and each row adds `Σ_k out_k · w_k` (left to right) to the
//! residual stream.
//!
//! A row's choices are its slots (`row · n_used + k`). The slots are sorted by expert, so
//! each expert multiplies one contiguous run of activation rows: the input rows are
//! quantized once and gathered in that order, and the FFN buffers (`gate`, `up`, then
//! `moe_out`) hold a row per slot in that order. Split over parts, experts are split by
//! expert: every part routes every row (the same bits), runs its own experts whole over
//! their slots, in its own memory, and copies their outputs (`moe_out` rows) into the
//! other parts (writes cross nodes, reads never do); then each part sums every row's
//! outputs, in order, on its columns of the residual stream. An output is the same bits on
//! whichever part computes it, so the split changes nothing in the result.

use blink_gguf::GgmlType;
use blink_kernels::gemm::{self, ActRows, Out, ROW_ALIGN};
use blink_kernels::quant::float;
use blink_kernels::flavour::Flavour;
use blink_runtime::numa::NodeWorker;

use std::ops::Range;

use super::buffers::{Buf, PartView, Shared, Write};
use super::{Pass, StoreOf};
use crate::config::Moe;
use crate::weights::{Experts, Matrix};

/// Where a step's routing sits in a part's `moe_idx`, for `slots` slots: each slot's
/// expert, the slots in expert order, each slot's place in that order, and each expert's
/// first place (and the end).
struct Routing {
    slots: usize,
}

impl Routing {
    fn expert(&self, s: usize) -> usize {
        s
    }
    fn order(&self, p: usize) -> usize {
        self.slots + p
    }
    fn place(&self, s: usize) -> usize {
        2 * self.slots + s
    }
    fn start(&self, e: usize) -> usize {
        3 * self.slots + e
    }

    /// The places of the slots of experts `experts` (once the order is written).
    ///
    /// # Safety
    /// The order was written before a barrier, and nobody writes it now.
    unsafe fn places<T: StoreOf>(&self, me: &PartView<T>, experts: &Range<usize>) -> Range<usize> {
        let at = |e: usize| me.moe_idx.slice(self.start(e)..self.start(e) + 1)[0] as usize;
        at(experts.start)..at(experts.end)
    }
}

/// A row's routing from its router scores (overwritten by their softmax): the `n_used`
/// experts of highest score in falling order into `chosen`, their weights into `weights`.
/// The softmax is ggml's on `flavour`'s build (`ops::soft_max_exp`: sixteen or eight
/// scores at a time through ggml's `exp`, the rest through libm's, the sum in f64) with
/// the sum's inverse applied in f32.
fn route(flavour: Flavour, moe: &Moe, scores: &mut [f32], chosen: &mut [u32], weights: &mut [f32]) {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v });
    let sum = blink_kernels::ops::soft_max_exp(flavour, scores, max);
    let inv = (1.0 / sum) as f32;
    scores.iter_mut().for_each(|v| *v *= inv);
    // Falling score, equal scores by expert number.
    for i in 0..chosen.len() {
        let mut best = usize::MAX;
        for e in 0..scores.len() {
            if !chosen[..i].contains(&(e as u32)) && (best == usize::MAX || scores[e] > scores[best]) {
                best = e;
            }
        }
        chosen[i] = best as u32;
    }
    for (w, &c) in weights.iter_mut().zip(chosen.iter()) {
        *w = scores[c as usize];
    }
    if moe.norm_weights {
        // ggml's row sum (in f64), kept off zero as llama.cpp keeps it.
        let sum = (weights.iter().map(|&w| w as f64).sum::<f64>() as f32).max(6.103_515_6e-5);
        weights.iter_mut().for_each(|w| *w /= sum);
    }
    if let Some(s) = moe.weights_scale {
        weights.iter_mut().for_each(|w| *w *= s);
    }
}

impl<T: StoreOf> Pass<'_, T> {
    /// Norm done (`input`): route every row, then each of the part's experts' gate and up
    /// over its slots and SwiGLU on them (no barrier at the end: each thread's slots are
    /// done).
    pub(super) fn experts_in(&self, w: &NodeWorker, me: &PartView<T>, input: &Buf, ex: &Experts) {
        let (cfg, n) = (&self.model.cfg, self.rows.len());
        let moe = cfg.moe.expect("a layer of experts has them in its config");
        let slots = n * moe.n_used;
        self.router_scores(w, me, input, ex);
        let at = Routing { slots };
        for r in w.share(n, 1) {
            // SAFETY: each thread owns its rows' scores, slots and weights.
            unsafe {
                let chosen = me.moe_idx.slice_mut(at.expert(r * moe.n_used)..at.expert((r + 1) * moe.n_used));
                route(self.flavour, &moe, me.router.row_mut(r), chosen, me.moe_w.slice_mut(r * moe.n_used..(r + 1) * moe.n_used));
            }
        }
        w.group_barrier();
        if w.tid_in_node == 0 {
            // SAFETY: one thread per node writes the order, between barriers.
            unsafe { sort_slots(me, &at, moe.n_expert) };
        }
        w.group_barrier();
        // SAFETY: the order was written before the barrier.
        let mine = unsafe { at.places(me, &me.part.experts) };
        let Some(first) = ex.experts.first() else { return };
        let mut quantized = None;
        for which in [Product::Gate, Product::Up] {
            let ty = which.matrix(first).mat_ref().activation_type();
            if quantized != Some(ty) {
                self.gather_inputs(w, me, input, n, &at, mine.clone(), ty);
                quantized = Some(ty);
            }
            self.expert_products(w, me, ex, which, n, &at, ty);
        }
        w.group_barrier();
        self.gated_activation(w, me, mine, 0..cfg.n_ff);
    }

    /// Each of the part's experts' down projection over its slots (their outputs then
    /// copied into the other parts), then each row's weighted sum of its experts' outputs
    /// into the residual stream (or into `xn`, for a model that norms the block's output).
    pub(super) fn experts_out(&self, w: &NodeWorker, me: &PartView<T>, ex: &Experts) {
        let (cfg, n) = (&self.model.cfg, self.rows.len());
        let moe = cfg.moe.expect("a layer of experts has them in its config");
        let at = Routing { slots: n * moe.n_used };
        // SAFETY: the order was written before a barrier of `experts_in`.
        let mine = unsafe { at.places(me, &me.part.experts) };
        if let Some(first) = ex.experts.first() {
            let ty = first.down.mat_ref().activation_type();
            // The slots' activations are already in expert order, on the threads that
            // computed them.
            self.quantize_rows(w, me, &me.gate, cfg.n_ff, mine.clone(), ty);
            w.group_barrier();
            self.expert_products(w, me, ex, Product::Down, 0, &at, ty);
        }
        w.group_barrier();
        if self.n_parts > 1 {
            self.broadcast_rows(w, me, Shared::ExpertOut, 0..cfg.n_embd, mine);
            w.global_barrier();
        }
        let cols = me.part.embd_rows.clone();
        let apart = cfg.block_out_apart();
        for r in w.share(n, 1) {
            // SAFETY: the products ended at the barrier; each thread owns its rows of x (or
            // xn) on this part's columns, and its rows' slots of `moe_out`.
            unsafe {
                let place = |k: usize| me.moe_idx.slice(at.place(r * moe.n_used + k)..at.place(r * moe.n_used + k) + 1)[0] as usize;
                let weights = me.moe_w.slice(r * moe.n_used..(r + 1) * moe.n_used);
                // Σ_k out_k · w_k, left to right, in the first slot's row.
                let sum = me.moe_out.cols_mut(place(0), cols.clone());
                sum.iter_mut().for_each(|v| *v *= weights[0]);
                for (k, &wk) in weights.iter().enumerate().skip(1) {
                    let out = me.moe_out.cols(place(k), cols.clone());
                    sum.iter_mut().zip(out).for_each(|(s, &o)| *s += o * wk);
                }
                let dst = if apart { me.xn.cols_mut(r, cols.clone()) } else { me.x.cols_mut(r, cols.clone()) };
                if apart {
                    dst.copy_from_slice(sum);
                } else {
                    dst.iter_mut().zip(sum.iter()).for_each(|(d, &s)| *d += s);
                }
            }
        }
        // What follows may share the rows out differently (the LM head's rows), as after a
        // dense FFN's down projection.
        w.group_barrier();
    }

    /// Every part scores every expert for every row. An f32 router (as converters leave it)
    /// is multiplied as llama.cpp multiplies it: a prompt's rows through its `sgemm`
    /// order, a generated row through `vec_dot`'s (`quant::float`); other types as any
    /// product.
    fn router_scores(&self, w: &NodeWorker, me: &PartView<T>, input: &Buf, ex: &Experts) {
        let n_embd = self.model.cfg.n_embd;
        let router = &ex.router;
        if router.ty != GgmlType::F32 || router.layout != gemm::Layout::RowMajor {
            return self.project(w, me, input, (n_embd, self.rows.len()), &[], &[(router, &me.router, 0, Write::Set, None)]);
        }
        let bytes = router.bytes();
        for r in w.share(self.rows.len(), 1) {
            // SAFETY: the norm wrote this row on this thread; each thread owns its rows'
            // scores.
            unsafe {
                let (x, scores) = (input.row(r), me.router.row_mut(r));
                let x = std::slice::from_raw_parts(x.as_ptr() as *const u8, 4 * n_embd);
                let prompt = self.rows[r].kind == crate::forward::RowKind::Prompt;
                for (e, s) in scores.iter_mut().enumerate() {
                    let row = &bytes[e * 4 * n_embd..(e + 1) * 4 * n_embd];
                    *s = if prompt { float::dot_f32_sgemm(self.flavour, n_embd, row, x) } else { float::dot_f32_in(self.flavour, n_embd, row, x) };
                }
            }
        }
        w.group_barrier();
    }

    /// The input rows quantized to `ty` (activation rows `0..n`), then those of the slots
    /// at places `places` copied in expert order after them (rows `n + p`).
    #[allow(clippy::too_many_arguments)]
    fn gather_inputs(&self, w: &NodeWorker, me: &PartView<T>, input: &Buf, n: usize, at: &Routing, places: Range<usize>, ty: GgmlType) {
        self.quantize_rows(w, me, input, self.model.cfg.n_embd, 0..n, ty);
        w.group_barrier();
        let bytes = ty.row_bytes(self.model.cfg.n_embd as u64).expect("checked at load") as usize;
        let stride = self.act_stride;
        for p in w.share(places.len(), 1) {
            let p = places.start + p;
            // SAFETY: rows 0..n were written before the barrier; each thread owns its places.
            unsafe {
                let s = me.moe_idx.slice(at.order(p)..at.order(p) + 1)[0] as usize;
                let row = s / (at.slots / n);
                let src = me.act.slice(row * stride..row * stride + bytes).as_ptr();
                let dst = me.act.slice_mut((n + p) * stride..(n + p) * stride + bytes);
                std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), bytes);
            }
        }
        w.group_barrier();
    }

    /// One product of each of the part's experts over its run of slots: activation rows
    /// from `first` on (in expert order), this thread's share of the matrix's rows.
    #[allow(clippy::too_many_arguments)]
    fn expert_products(&self, w: &NodeWorker, me: &PartView<T>, ex: &Experts, which: Product, first: usize, at: &Routing, ty: GgmlType) {
        let out = match which {
            Product::Gate => &me.gate,
            Product::Up => &me.up,
            Product::Down => &me.moe_out,
        };
        let stride = self.act_stride;
        for (e, f) in me.part.experts.clone().zip(&ex.experts) {
            // SAFETY: the order was written before a barrier.
            let run = unsafe { me.moe_idx.slice(at.start(e)..at.start(e) + 2) };
            let run = run[0] as usize..run[1] as usize;
            let m = which.matrix(f);
            let rows = w.share(m.rows, ROW_ALIGN);
            if run.is_empty() || rows.is_empty() {
                continue;
            }
            let base = out.out(0, Write::Set);
            // SAFETY: activation rows were written before the last barrier; this thread
            // alone writes rows `rows` of the run's output rows.
            unsafe {
                let act = ActRows { ty, bytes: me.act.slice((first + run.start) * stride..(first + run.end) * stride), stride, count: run.len(), forms: &[] };
                let out = Out { ptr: base.ptr.add(run.start * base.ld), ..base };
                gemm::product(self.isa, self.order, &m.mat_ref(), &act, std::iter::once(rows), out);
            }
        }
    }
}

/// Which of an expert's three matrices.
#[derive(Clone, Copy)]
enum Product {
    Gate,
    Up,
    Down,
}

impl Product {
    fn matrix(self, f: &crate::weights::FfnMatrices) -> &Matrix {
        match self {
            Product::Gate => &f.gate,
            Product::Up => &f.up,
            Product::Down => &f.down,
        }
    }
}

/// Sort the slots by expert (a counting sort, slots of one expert in slot order).
///
/// # Safety
/// The caller is the one thread of its node writing the order, with the experts written.
unsafe fn sort_slots<T: StoreOf>(me: &PartView<T>, at: &Routing, n_expert: usize) {
    let starts = me.moe_idx.slice_mut(at.start(0)..at.start(0) + n_expert + 1);
    starts.fill(0);
    let experts = me.moe_idx.slice(at.expert(0)..at.expert(0) + at.slots);
    for &e in experts {
        starts[e as usize + 1] += 1;
    }
    for e in 0..n_expert {
        starts[e + 1] += starts[e];
    }
    // Each expert's start serves as its cursor, ending at the next one's start; then the
    // starts are shifted back (no allocation on the step's path).
    let order = me.moe_idx.slice_mut(at.order(0)..at.order(0) + at.slots);
    let place = me.moe_idx.slice_mut(at.place(0)..at.place(0) + at.slots);
    for (s, &e) in experts.iter().enumerate() {
        let p = starts[e as usize];
        starts[e as usize] += 1;
        order[p as usize] = s as u32;
        place[s] = p;
    }
    starts.copy_within(0..n_expert, 1);
    starts[0] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moe(n_used: usize, norm_weights: bool) -> Moe {
        Moe { n_expert: 20, n_used, norm_weights, weights_scale: None }
    }

    /// Twenty scores: sixteen (or eight) at a time through ggml's `exp`, four through
    /// libm's; the chosen experts in falling order of score, ties to the lower number,
    /// weights normed to one.
    #[test]
    fn routing_takes_the_best_experts_in_falling_order() {
        for flavour in Flavour::ALL {
            routing_in(flavour);
        }
    }

    fn routing_in(flavour: Flavour) {
        let route = |moe: &Moe, s: &mut [f32], c: &mut [u32], w: &mut [f32]| route(flavour, moe, s, c, w);
        let raw: Vec<f32> = (0..20).map(|e| ((e * 7 % 20) as f32 - 10.0) * 0.3).collect();
        let mut scores = raw.clone();
        let (mut chosen, mut weights) = ([0u32; 3], [0f32; 3]);
        route(&moe(3, true), &mut scores, &mut chosen, &mut weights);
        let mut order: Vec<usize> = (0..20).collect();
        order.sort_by(|&a, &b| raw[b].partial_cmp(&raw[a]).unwrap().then(a.cmp(&b)));
        assert_eq!(chosen.map(|c| c as usize).to_vec(), order[..3].to_vec());
        let total: f32 = scores.iter().sum();
        assert!((total - 1.0).abs() < 1e-6, "softmax sums to {total}");
        assert!((weights.iter().sum::<f32>() - 1.0).abs() < 1e-6 && weights[0] >= weights[1] && weights[1] >= weights[2]);
        // Without norming, the weights are the softmax's own.
        let (mut s2, mut w2) = (raw.clone(), [0f32; 3]);
        route(&moe(3, false), &mut s2, &mut chosen, &mut w2);
        assert_eq!(w2, chosen.map(|c| s2[c as usize]));
        // Equal scores: the lower expert first.
        let mut flat = vec![0.5f32; 20];
        route(&moe(3, true), &mut flat, &mut chosen, &mut weights);
        assert_eq!(chosen, [0, 1, 2]);
        assert!(weights.iter().all(|&w| (w - 1.0 / 3.0).abs() < 1e-6));
    }
}
