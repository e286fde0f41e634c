//! The FFN block of a layer, as phases the driver separates with barriers: norm, the
//! part's rows of the gate and up projections and SwiGLU (or GeGLU) on them (`ffn_in`),
//! then the down projection into the residual stream (`ffn_out`), or into `xn` when the
//! model norms the block's output before adding it (`add_normed`).

use std::ops::Range;

use blink_runtime::numa::NodeWorker;
use blink_kernels::ops;

use super::buffers::{PartView, Write};
use super::{Pass, StoreOf};
use crate::config::FfnAct;
use crate::lora::LoraTarget;
use crate::weights::{Ffn, LayerWeights};

impl<T: StoreOf> Pass<'_, T> {
    /// Norm, gate and up, SwiGLU (no barrier at the end: each thread's rows are done).
    pub(super) fn ffn_in(&self, w: &NodeWorker, me: &PartView<T>, layer: usize, lw: &LayerWeights) {
        let (cfg, n) = (&self.model.cfg, self.rows.len());
        let input = self.block_input(w, me, lw.ffn_norm.as_deref(), n);
        let f = match &lw.ffn {
            Ffn::Dense(f) => f,
            Ffn::Experts(e) => return self.experts_in(w, me, input, e),
        };
        let fc = me.part.ff_rows.start;
        let gate = (&f.gate, &me.gate, fc, Write::Set, Some((layer, LoraTarget::Gate)));
        let up = (&f.up, &me.up, fc, Write::Set, Some((layer, LoraTarget::Up)));
        self.project(w, me, input, (cfg.n_embd, n), self.ffn_forms(layer), &[gate, up]);
        self.gated_activation(w, me, 0..n, me.part.ff_rows.clone());
    }

    /// SwiGLU (or GeGLU) on columns `cols` of rows `rows` of `gate`/`up`.
    pub(super) fn gated_activation(&self, w: &NodeWorker, me: &PartView<T>, rows: Range<usize>, cols: Range<usize>) {
        for r in w.share(rows.len(), 1) {
            let r = rows.start + r;
            // SAFETY: rows are split between the node's threads; gate/up were completed
            // before the barrier that ended the projection.
            let (gate, up) = unsafe { (me.gate.cols_mut(r, cols.clone()), me.up.cols(r, cols.clone())) };
            match self.model.cfg.ffn_act {
                FfnAct::Silu => ops::swiglu(self.isa, self.flavour, gate, up),
                FfnAct::GeluTanh => blink_kernels::gelu::geglu(self.isa, gate, up),
            }
        }
    }

    /// The down projection: the part's rows of the residual stream. Unsplit, it needs no
    /// barrier before it: the projection first quantizes this thread's share of the rows
    /// (the same share as SwiGLU's), which it has just computed in full.
    pub(super) fn ffn_out(&self, w: &NodeWorker, me: &PartView<T>, layer: usize, lw: &LayerWeights) {
        let cfg = &self.model.cfg;
        let f = match &lw.ffn {
            Ffn::Dense(f) => f,
            Ffn::Experts(e) => return self.experts_out(w, me, e),
        };
        let (out, mode) = if cfg.block_out_apart() { (&me.xn, Write::Set) } else { (&me.x, Write::Add) };
        let down = (&f.down, out, me.part.embd_rows.start, mode, Some((layer, LoraTarget::Down)));
        self.project(w, me, &me.gate, (cfg.n_ff, self.rows.len()), self.ffn_forms(layer), &[down]);
    }
}
