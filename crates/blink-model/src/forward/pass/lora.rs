//! The adapters' share of a projection: for each row that runs with an adapter mix,
//! `y += scale · B(A·x)` for every pair of the mix that targets the projection, over this
//! part's rows of `B`.
//!
//! Both halves ride on phases `project` already has, so no barrier is added, and the
//! expand (reading about half of an adapter's weights) is spread over every thread of the
//! node even when one row is all the step has:
//! - **shrink** (`t = A·x`) runs beside the quantization of the input, before the barrier
//!   that opens the products, each row on the thread that quantizes it (the only one that
//!   may read the row before that barrier); `t` goes into the part's `lora_t`,
//!   `[adapter row][product][Σ ranks of the mix]`;
//! - **expand** runs after the base product of each chunk of output columns a thread
//!   claims, over the same columns, for every adapter row: that thread alone writes those
//!   columns in the phase, and the barrier that closes the products publishes them.
//!
//! An output element is the base product, then each adapter's delta in the mix's order,
//! each one fused chain over the rank: the same bits however rows, chunks and threads fall.
//! A row without an adapter costs nothing.

use std::ops::Range;

use blink_kernels::lora;
use blink_runtime::numa::NodeWorker;

use super::buffers::{Buf, PartView};
use super::project::Product;
use super::{Pass, StoreOf};
use crate::forward::scratch::LORA_PRODUCTS;
use crate::lora::{LoraMix, LoraTarget, PlacedPair};

/// The mix's pairs for (`layer`, `target`) on `part`, each with its user scale and the
/// offset of its activations in a row's `lora_t` block of that product.
fn pairs_of(mix: &LoraMix, part: usize, layer: usize, target: LoraTarget) -> impl Iterator<Item = (&PlacedPair, f32, usize)> {
    let mut offset = 0;
    mix.adapters().iter().filter_map(move |(adapter, user_scale)| {
        let pair = adapter.pair(part, layer, target)?;
        let at = offset;
        offset += pair.rank;
        Some((pair, *user_scale, at))
    })
}

impl<T: StoreOf> Pass<'_, T> {
    /// Whether adapters change any of these products in this step.
    pub(super) fn adapters_apply(&self, outputs: &[Product]) -> bool {
        !self.lora_rows.is_empty() && outputs.iter().any(|o| o.4.is_some())
    }

    /// Columns of `lora_t` one product's activations start at, in a row.
    fn lora_block(&self, product: usize) -> usize {
        product * self.lora_stride
    }

    /// `t = A·x` of every adapter row and pair of these products; runs in the quantization
    /// phase, each row on the thread that quantizes it, which alone may read it there (the
    /// norm before wrote it on that thread, with no barrier between).
    pub(super) fn adapter_shrinks(&self, w: &NodeWorker, me: &PartView<T>, input: &Buf, cols: usize, outputs: &[Product]) {
        assert!(outputs.len() <= LORA_PRODUCTS, "a projection with adapters has at most {LORA_PRODUCTS} products");
        let mine = w.share(self.rows.len(), 1);
        for (i, &r) in self.lora_rows.iter().enumerate().filter(|(_, r)| mine.contains(r)) {
            let slot = self.rows[r].adapter.expect("an adapter row has a slot").0;
            let mix = &self.adapters[usize::from(slot)];
            // SAFETY: row r of the input is this thread's in this phase.
            let x = unsafe { input.cols(r, 0..cols) };
            for (product, &(_, _, _, _, site)) in outputs.iter().enumerate() {
                let Some((layer, target)) = site else { continue };
                let block = self.lora_block(product);
                for (pair, _, at) in pairs_of(mix, w.node, layer, target) {
                    // SAFETY: so is row i of `lora_t`.
                    let t = unsafe { me.lora_t.cols_mut(i, block + at..block + at + pair.rank) };
                    lora::shrink(self.isa, &pair.a, x, t);
                }
            }
        }
    }

    /// Add every adapter row's delta over output columns `chunk` of product `product`, just
    /// computed by this thread's base product.
    pub(super) fn adapter_expand(&self, w: &NodeWorker, me: &PartView<T>, product: usize, outputs: &[Product], chunk: Range<usize>) {
        let (_, out, col, _, site) = outputs[product];
        let Some((layer, target)) = site else { return };
        let block = self.lora_block(product);
        for (slot, group) in self.lora_groups {
            for (pair, user_scale, at) in pairs_of(&self.adapters[*slot], w.node, layer, target) {
                let ld = pair.part_rows();
                let bt = &pair.bt[chunk.start..];
                for i in group.clone() {
                    // SAFETY: `lora_t` is read-only after the quantization barrier; this
                    // thread alone writes columns `chunk` of this product in this phase.
                    let (t, y) = unsafe { (me.lora_t.cols(i, block + at..block + at + pair.rank), out.cols_mut(self.lora_rows[i], col + chunk.start..col + chunk.end)) };
                    lora::expand(self.isa, bt, ld, t, pair.scale * user_scale, y);
                }
            }
        }
    }
}
