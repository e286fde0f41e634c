//! A layer's backward: from the gradient of its output (in `dx`) to the gradient of its
//! input (in `dx` again), adding the adapter pairs' gradients on the way. Products go
//! through the frozen matrices as `dx = dy·W`, read from their blocks. Norm outputs and
//! SwiGLU are recomputed from what the forward saved.

use blink_kernels::fgemm::BSource;

use super::buffers::{Saved, M};
use super::elementwise::{rms_norm, rms_norm_backward, rope_backward, swiglu, swiglu_backward};
use super::lora::PairView;
use super::{attention, pre_norm, Run};
use crate::config::RopeOrder;
use crate::lora::LoraTarget;
use crate::weights::Matrix;

impl Run<'_> {
    /// `dinput (+)= dy·W`, then the adapter pair's share: its gradients from `dy` and
    /// `input`, and its term of `dinput`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn project_back(&self, dy: M, w: &Matrix, dinput: M, accumulate: bool, input: M, pair: Option<&PairView>, kept: Option<M>) {
        self.ctx.product(dy, self.n, w.rows, BSource::Weight(w.mat_ref()), w.cols, dinput, accumulate);
        if let (Some(p), Some(kept)) = (pair, kept) {
            self.ctx.lora_backward(p, self.n, input, kept, dy, dinput, &self.w.lora);
        }
    }

    /// Layer `l`'s backward; `dx` holds the gradient of its output and leaves with that
    /// of its input.
    pub(super) unsafe fn layer_backward(&self, l: usize, s: &Saved, pairs: &[Option<PairView>; 7]) {
        let cfg = &self.model.cfg;
        let lw = self.model.parts[0].layer(l);
        let (n, eps, wv) = (self.n, cfg.norm_eps, self.w);
        let pair = |t: LoraTarget| pairs[t.index()].as_ref();
        let kept = |t: LoraTarget| s.lora[t.index()];

        // The FFN block: x3 = x2 + down(swiglu(gate(xn2), up(xn2))).
        self.ctx.each(n, |t| unsafe {
            rms_norm(s.x2.row(t), pre_norm(&lw.ffn_norm), eps, wv.xn.row_mut(t));
            swiglu(s.gate.row(t), s.up.row(t), wv.h.row_mut(t));
        });
        self.project_back(wv.dx, &lw.dense().down, wv.dh, false, wv.h, pair(LoraTarget::Down), kept(LoraTarget::Down));
        self.ctx.each(n, |t| unsafe { swiglu_backward(s.gate.row(t), s.up.row(t), wv.dh.row(t), wv.dg.row_mut(t), wv.du.row_mut(t)) });
        self.project_back(wv.dg, &lw.dense().gate, wv.dxn, false, wv.xn, pair(LoraTarget::Gate), kept(LoraTarget::Gate));
        self.project_back(wv.du, &lw.dense().up, wv.dxn, true, wv.xn, pair(LoraTarget::Up), kept(LoraTarget::Up));
        self.ctx.each(n, |t| unsafe { rms_norm_backward(s.x2.row(t), pre_norm(&lw.ffn_norm), eps, wv.dxn.row(t), wv.dx.row_mut(t)) });

        // The attention block: x2 = x + o(attention(rope(q(xn)), rope(k(xn)), v(xn))).
        self.project_back(wv.dx, &lw.wo, wv.da, false, s.attn, pair(LoraTarget::O), kept(LoraTarget::O));
        self.attend_back(s);
        let (hd, neox) = (cfg.head_dim, cfg.rope.order == RopeOrder::NeoX);
        self.ctx.each(n, |t| unsafe {
            let table = wv.rope.row(t);
            for h in wv.dq.row_mut(t).chunks_exact_mut(hd).chain(wv.dk.row_mut(t).chunks_exact_mut(hd)) {
                rope_backward(table, h, neox);
            }
            rms_norm(s.x.row(t), pre_norm(&lw.attn_norm), eps, wv.xn.row_mut(t));
        });
        self.project_back(wv.dq, &lw.wq, wv.dxn, false, wv.xn, pair(LoraTarget::Q), kept(LoraTarget::Q));
        self.project_back(wv.dk, &lw.wk, wv.dxn, true, wv.xn, pair(LoraTarget::K), kept(LoraTarget::K));
        self.project_back(wv.dv, &lw.wv, wv.dxn, true, wv.xn, pair(LoraTarget::V), kept(LoraTarget::V));
        self.ctx.each(n, |t| unsafe { rms_norm_backward(s.x.row(t), pre_norm(&lw.attn_norm), eps, wv.dxn.row(t), wv.dx.row_mut(t)) });
    }

    /// Attention's gradients from `da` into `dq`, `dk` and `dv`. Each item is one
    /// example's key/value head with the query heads that share it, so a thread owns the
    /// rows it adds to.
    unsafe fn attend_back(&self, s: &Saved) {
        let cfg = &self.model.cfg;
        let (hd, kv_heads, group) = (cfg.head_dim, cfg.n_head_kv, cfg.n_head / cfg.n_head_kv);
        let scale = 1.0 / (hd as f32).sqrt();
        let spans = self.spans;
        let wv = self.w;
        self.ctx.each_with(spans.len() * kv_heads, |item, scratch| unsafe {
            let ((row0, len), kvh) = (spans[item / kv_heads], item % kv_heads);
            for t in row0..row0 + len {
                wv.dk.row_mut(t)[kvh * hd..(kvh + 1) * hd].fill(0.0);
                wv.dv.row_mut(t)[kvh * hd..(kvh + 1) * hd].fill(0.0);
            }
            let (k, v, dk, dv) = (s.k.head(row0, kvh * hd), s.v.head(row0, kvh * hd), wv.dk.head(row0, kvh * hd), wv.dv.head(row0, kvh * hd));
            for h in kvh * group..(kvh + 1) * group {
                let lse = attention::Rows { ptr: s.lse.at(row0, h), stride: s.lse.cols };
                let col = h * hd;
                attention::backward(len, hd, scale, (s.q.head(row0, col), k, v), (s.attn.head(row0, col), lse), wv.da.head(row0, col), (wv.dq.head(row0, col), dk, dv), &mut scratch.scores);
            }
        });
    }
}
