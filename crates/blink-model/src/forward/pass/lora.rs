//! The adapters' share of a projection: for each row that runs with an adapter mix, after
//! the base product, `y += scale · B(A·x)` for every pair of the mix that targets the
//! projection, over this part's rows of `B`.
//!
//! Rows are visited grouped by slot, so a group's pairs stay in cache, and each row is
//! done by the thread that owns it in the row-split phases before and after a projection
//! (`NodeWorker::share` of the step's rows): its input was written by that thread or
//! before a barrier, and what reads its output next (biases and rope, SwiGLU, the
//! exchange of the residual stream, the next norm) runs on that thread too. No barrier is
//! added, and a row without an adapter costs nothing.

use blink_kernels::lora;
use blink_runtime::numa::NodeWorker;

use super::buffers::{Buf, PartView};
use super::project::Product;
use super::{Pass, StoreOf};

impl<T: StoreOf> Pass<'_, T> {
    pub(super) fn adapter_deltas(&self, w: &NodeWorker, me: &PartView<T>, input: &Buf, cols: usize, outputs: &[Product]) {
        let mine = w.share(self.rows.len(), 1);
        // SAFETY: each thread has its own row of `lora_t`.
        let t_row = unsafe { me.lora_t.row_mut(w.tid_in_node) };
        for (slot, group) in self.lora_groups {
            let mix = &self.adapters[*slot];
            for &r in self.lora_rows[group.clone()].iter().filter(|r| mine.contains(r)) {
                // SAFETY: the input is read-only in this phase (see the module comment).
                let x = unsafe { input.cols(r, 0..cols) };
                for &(_, out, col, _, site) in outputs {
                    let Some((layer, target)) = site else { continue };
                    for (adapter, user_scale) in mix.adapters() {
                        let Some(pair) = adapter.pair(w.node, layer, target) else { continue };
                        let t = &mut t_row[..pair.rank];
                        lora::shrink(self.isa, &pair.a, x, t);
                        let n = pair.part_rows();
                        // SAFETY: this thread owns row r of the output in this phase.
                        let y = unsafe { out.cols_mut(r, col..col + n) };
                        lora::expand(self.isa, &pair.bt, n, t, pair.scale * user_scale, y);
                    }
                }
            }
        }
    }
}
