//! The attention block of a layer, as phases the driver separates with barriers: the
//! Q/K/V projections with their biases, norms and rope and the cache stores
//! (`attention_in`), the exchange of queries between parts sharing a key/value head
//! (`share_queries`), and the output projection into the residual stream
//! (`attention_out`). Causal attention over the cache, between `share_queries` and
//! `attention_out`, is in `attend.rs` (`Pass::attend`).

use blink_kernels::attention;
use blink_runtime::numa::NodeWorker;
use blink_kernels::ops;

use super::buffers::{PartView, Write};
use super::{Pass, StoreOf};
use crate::kv_cache::BLOCK_TOKENS;
use crate::config::QkNorm;
use crate::lora::LoraTarget;
use crate::weights::LayerWeights;

impl<T: StoreOf> Pass<'_, T> {
    /// Norm, then the part's query heads and the key/value heads they use, through the
    /// projections and into the cache (no barrier at the end).
    pub(super) fn attention_in(&self, w: &NodeWorker, me: &PartView<T>, layer: usize, lw: &LayerWeights) {
        let (cfg, n) = (&self.model.cfg, self.rows.len());
        let hd = cfg.head_dim;
        let input = self.block_input(w, me, lw.attn_norm.as_deref(), n);
        let (qc, kc) = (me.part.q_heads.start * hd, me.part.kv_heads.start * hd);
        let q = (&lw.wq, &me.q, qc, Write::Set, Some((layer, LoraTarget::Q)));
        let k = (&lw.wk, &me.k, kc, Write::Set, Some((layer, LoraTarget::K)));
        let v = (&lw.wv, &me.v, kc, Write::Set, Some((layer, LoraTarget::V)));
        self.project(w, me, input, (cfg.n_embd, n), self.row_forms, &[q, k, v]);
        if cfg.qk_norm == Some(QkNorm::Whole) && self.n_parts > 1 {
            self.share_qk(w, me);
            w.global_barrier();
        }
        self.qkv_post(w, me, layer, lw);
    }

    /// Copy this part's Q columns, and the K columns of its key/value heads that another
    /// part lacks, into the other parts, so every part holds whole Q and K rows to norm.
    /// (A head two parts hold is computed by both: neither writes the other's copy.)
    fn share_qk(&self, w: &NodeWorker, me: &PartView<T>) {
        let hd = self.model.cfg.head_dim;
        let qc = me.part.q_heads.start * hd..me.part.q_heads.end * hd;
        for r in w.share(self.rows.len(), 1) {
            for other in self.others(w.node) {
                // SAFETY: this part alone computed these columns; its threads split the
                // rows; no part reads them before the next global barrier.
                unsafe {
                    other.q.cols_mut(r, qc.clone()).copy_from_slice(me.q.cols(r, qc.clone()));
                    for &(g, rank, _) in &me.part.kv_groups {
                        if rank == 0 && !other.part.kv_heads.contains(&g) {
                            let cols = g * hd..(g + 1) * hd;
                            other.k.cols_mut(r, cols.clone()).copy_from_slice(me.k.cols(r, cols));
                        }
                    }
                }
            }
        }
    }

    /// The output projection: the part's rows of the residual stream (or of `xn`, when the
    /// model norms the block's output before adding it).
    pub(super) fn attention_out(&self, w: &NodeWorker, me: &PartView<T>, layer: usize, lw: &LayerWeights) {
        let cfg = &self.model.cfg;
        let (x, mode) = if cfg.block_out_apart() { (&me.xn, Write::Set) } else { (&me.x, Write::Add) };
        let out = (&lw.wo, x, me.part.embd_rows.start, mode, Some((layer, LoraTarget::O)));
        self.project(w, me, &me.attn, (cfg.q_dim(), self.rows.len()), self.row_forms, &[out]);
    }

    /// Biases, Q/K norms and rotary embedding of the part's heads; then its K and V go into
    /// its cache shard.
    fn qkv_post(&self, w: &NodeWorker, me: &PartView<T>, layer: usize, lw: &LayerWeights) {
        let cfg = &self.model.cfg;
        let hd = cfg.head_dim;
        let rope = &self.model.rope;
        let (qr, kr) = (me.part.q_heads.clone(), me.part.kv_heads.clone());
        let (qc, kc) = (qr.start * hd..qr.end * hd, kr.start * hd..kr.end * hd);
        let slot_at = |r: usize, h: usize| {
            let row = self.rows[r];
            me.layout.offset(layer, self.tables.get(row.seq)[row.pos / BLOCK_TOKENS], h, row.pos % BLOCK_TOKENS)
        };
        // The cache lines the rows' keys and values go to are rarely in cache, and stores
        // that miss stall the thread once its store buffer fills: ask for them first.
        for r in w.share(self.rows.len(), 1) {
            for h in 0..kr.len() {
                let at = slot_at(r, h);
                // SAFETY: only addresses are taken; nothing reads these slots in this phase.
                unsafe { attention::prefetch(me.kc.slice(at..at + hd), me.vc.slice(at..at + hd)) };
            }
        }
        let ropes = cfg.ropes(layer);
        for r in w.share(self.rows.len(), 1) {
            // SAFETY: each thread owns its rows of q, k, v (this part's columns), and the cache
            // slots of those rows' positions (distinct rows have distinct (sequence, position)
            // pairs).
            let (q, k, v) = unsafe { (me.q.cols_mut(r, qc.clone()), me.k.cols_mut(r, kc.clone()), me.v.cols_mut(r, kc.clone())) };
            for (x, b) in [(&mut *q, &lw.bq), (&mut *k, &lw.bk), (&mut *v, &lw.bv)] {
                if let Some(b) = b {
                    x.iter_mut().zip(b.iter()).for_each(|(x, b)| *x += b);
                }
            }
            match (&lw.q_norm, &lw.k_norm, cfg.qk_norm) {
                (Some(qn), Some(kn), Some(QkNorm::Whole)) => {
                    // SAFETY: whole rows are normed, this part's columns written: the others'
                    // columns were shared before the last global barrier, and no part writes
                    // them before the next (the query exchange waits for one).
                    unsafe {
                        ops::rms_norm_cols_in_place(self.isa, me.q.row_mut(r), qn, cfg.norm_eps, qc.clone());
                        ops::rms_norm_cols_in_place(self.isa, me.k.row_mut(r), kn, cfg.norm_eps, kc.clone());
                    }
                }
                (Some(qn), Some(kn), _) => {
                    q.chunks_exact_mut(hd).for_each(|h| ops::rms_norm_in_place(self.isa, h, qn, cfg.norm_eps));
                    k.chunks_exact_mut(hd).for_each(|h| ops::rms_norm_in_place(self.isa, h, kn, cfg.norm_eps));
                }
                _ => {}
            }
            // SAFETY: as above (the whole rows' borrows have ended).
            let (q, k) = unsafe { (me.q.cols_mut(r, qc.clone()), me.k.cols_mut(r, kc.clone())) };
            if ropes {
                // SAFETY: written before the pass's first barrier.
                let angles = unsafe { me.rope.row(r) };
                let (rope, angles) = match &self.model.rope_local {
                    Some(local) if cfg.is_local(layer) => (local, &angles[cfg.rope.n_dims..]),
                    _ => (rope, angles),
                };
                q.chunks_exact_mut(hd).for_each(|h| rope.apply(self.isa, angles, h));
                k.chunks_exact_mut(hd).for_each(|h| rope.apply(self.isa, angles, h));
            }
            if let Some(s) = cfg.query_scale {
                q.iter_mut().for_each(|x| *x *= s);
            }

            for h in 0..kr.len() {
                let at = slot_at(r, h);
                unsafe {
                    T::from_f32_slice(&k[h * hd..(h + 1) * hd], me.kc.slice_mut(at..at + hd));
                    T::from_f32_slice(&v[h * hd..(h + 1) * hd], me.vc.slice_mut(at..at + hd));
                }
            }
        }
    }

    /// Copy the query vectors of this part's heads whose key/value head another part also
    /// holds into that part's `q`, so either can attend for them.
    pub(super) fn share_queries(&self, w: &NodeWorker, me: &PartView<T>) {
        let cfg = &self.model.cfg;
        let (hd, group) = (cfg.head_dim, cfg.n_head / cfg.n_head_kv);
        for &(g, _, holders) in &me.part.kv_groups {
            if holders < 2 {
                continue;
            }
            let heads = (g * group).max(me.part.q_heads.start)..((g + 1) * group).min(me.part.q_heads.end);
            let cols = heads.start * hd..heads.end * hd;
            for r in w.share(self.rows.len(), 1) {
                // SAFETY: this part alone computed these heads; its threads split the rows;
                // the other holders do not touch them until the next global barrier.
                unsafe {
                    let src = me.q.cols(r, cols.clone());
                    for other in self.others(w.node).filter(|o| o.part.kv_heads.contains(&g)) {
                        other.q.cols_mut(r, cols.clone()).copy_from_slice(src);
                    }
                }
            }
        }
    }
}
