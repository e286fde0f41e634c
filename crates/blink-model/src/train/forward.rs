//! A layer's forward for training: the inference pass's blocks in float, every product's
//! output kept in the layer's [`Saved`] views for the backward.

use blink_kernels::fgemm::BSource;

use super::buffers::{Saved, M};
use super::elementwise::{rms_norm, rope, swiglu};
use super::lora::PairView;
use super::{attention, pre_norm, Run};
use crate::config::RopeOrder;
use crate::lora::LoraTarget;

impl Run<'_> {
    /// The batch's token embeddings into the residual stream, and each row's rope angles.
    pub(super) unsafe fn embed(&self) {
        let emb = &self.model.parts[0].token_embd;
        let (x, table) = (self.w.x, self.w.rope);
        let pos: Vec<usize> = self.spans().flat_map(|(_, len)| 0..len).collect();
        self.ctx.each(self.n, |t| unsafe {
            emb.dequantize_row(self.tokens[t] as usize, x.row_mut(t));
            self.model.rope.angles(pos[t], table.row_mut(t));
        });
    }

    /// `out = input·Wᵀ` (+ bias) (+ the adapter's delta, keeping its activations).
    #[allow(clippy::too_many_arguments)]
    unsafe fn project(&self, input: M, depth: usize, w: &crate::weights::Matrix, bias: Option<&[f32]>, out: M, pair: Option<&PairView>, kept: Option<M>) {
        let n = self.n;
        self.ctx.product(input, n, depth, BSource::WeightT(w.mat_ref()), w.rows, out, false);
        if let Some(b) = bias {
            self.ctx.each(n, |t| unsafe { out.row_mut(t).iter_mut().zip(b).for_each(|(y, &b)| *y += b) });
        }
        if let (Some(p), Some(kept)) = (pair, kept) {
            self.ctx.lora_forward(p, n, input, out, kept, &self.w.lora);
        }
    }

    /// Layer `l` over the batch: the residual stream `x` moves to the layer's output.
    pub(super) unsafe fn layer_forward(&self, l: usize, s: &Saved, pairs: &[Option<PairView>; 7]) {
        let cfg = &self.model.cfg;
        let lw = self.model.parts[0].layer(l);
        let (n, eps, wv) = (self.n, cfg.norm_eps, self.w);
        let pair = |t: LoraTarget| pairs[t.index()].as_ref();
        let kept = |t: LoraTarget| s.lora[t.index()];

        self.ctx.each(n, |t| unsafe {
            s.x.row_mut(t).copy_from_slice(wv.x.row(t));
            rms_norm(wv.x.row(t), pre_norm(&lw.attn_norm), eps, wv.xn.row_mut(t));
        });
        let e = cfg.n_embd;
        self.project(wv.xn, e, &lw.wq, lw.bq.as_deref(), s.q, pair(LoraTarget::Q), kept(LoraTarget::Q));
        self.project(wv.xn, e, &lw.wk, lw.bk.as_deref(), s.k, pair(LoraTarget::K), kept(LoraTarget::K));
        self.project(wv.xn, e, &lw.wv, lw.bv.as_deref(), s.v, pair(LoraTarget::V), kept(LoraTarget::V));
        let (hd, neox) = (cfg.head_dim, cfg.rope.order == RopeOrder::NeoX);
        self.ctx.each(n, |t| unsafe {
            let table = wv.rope.row(t);
            for h in s.q.row_mut(t).chunks_exact_mut(hd).chain(s.k.row_mut(t).chunks_exact_mut(hd)) {
                rope(table, h, neox);
            }
        });
        self.attend(s);
        self.project(s.attn, cfg.q_dim(), &lw.wo, None, wv.tmp, pair(LoraTarget::O), kept(LoraTarget::O));
        self.ctx.each(n, |t| unsafe {
            let x = wv.x.row_mut(t);
            x.iter_mut().zip(wv.tmp.row(t)).for_each(|(x, &o)| *x += o);
            s.x2.row_mut(t).copy_from_slice(x);
            rms_norm(x, pre_norm(&lw.ffn_norm), eps, wv.xn.row_mut(t));
        });
        self.project(wv.xn, e, &lw.dense().gate, None, s.gate, pair(LoraTarget::Gate), kept(LoraTarget::Gate));
        self.project(wv.xn, e, &lw.dense().up, None, s.up, pair(LoraTarget::Up), kept(LoraTarget::Up));
        self.ctx.each(n, |t| unsafe { swiglu(s.gate.row(t), s.up.row(t), wv.h.row_mut(t)) });
        self.project(wv.h, cfg.n_ff, &lw.dense().down, None, wv.tmp, pair(LoraTarget::Down), kept(LoraTarget::Down));
        self.ctx.each(n, |t| unsafe { wv.x.row_mut(t).iter_mut().zip(wv.tmp.row(t)).for_each(|(x, &d)| *x += d) });
    }

    /// Causal attention of every example and head, into `s.attn` and `s.lse`.
    unsafe fn attend(&self, s: &Saved) {
        let cfg = &self.model.cfg;
        let (hd, heads, group) = (cfg.head_dim, cfg.n_head, cfg.n_head / cfg.n_head_kv);
        let scale = 1.0 / (hd as f32).sqrt();
        let spans = self.spans;
        self.ctx.each_with(spans.len() * heads, |item, scratch| unsafe {
            let ((row0, len), h) = (spans[item / heads], item % heads);
            let kvh = h / group;
            let lse = attention::Rows { ptr: s.lse.at(row0, h), stride: s.lse.cols };
            attention::forward(len, hd, scale, s.q.head(row0, h * hd), s.k.head(row0, kvh * hd), s.v.head(row0, kvh * hd), s.attn.head(row0, h * hd), lse, &mut scratch.scores);
        });
    }
}
