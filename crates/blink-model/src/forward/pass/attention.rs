//! The attention block of a layer, as phases the driver separates with barriers: the
//! Q/K/V projections with their biases, norms and rope and the cache stores
//! (`attention_in`), the exchange of queries between parts sharing a key/value head
//! (`share_queries`), causal attention over the cache, within a sliding window on a
//! model's local layers (`attend`), and the output projection into the residual stream
//! (`attention_out`).

use blink_kernels::attention::{self, Online};
use blink_runtime::numa::NodeWorker;
use blink_kernels::ops;

use super::buffers::{PartView, Write};
use super::{Pass, StoreOf};
use crate::kv_cache::BLOCK_TOKENS;
use crate::config::QkNorm;
use crate::lora::LoraTarget;
use crate::weights::LayerWeights;

/// How many blocks ahead attention asks for keys and values.
const PREFETCH_BLOCKS: usize = 2;

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
        self.project(w, me, input, (cfg.n_embd, n), self.grouped_rows, &[q, k, v]);
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
        self.project(w, me, &me.attn, (cfg.q_dim(), self.rows.len()), self.grouped_rows, &[out]);
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

    /// Causal attention over its sequence's cached positions, block by block (see
    /// `blink_kernels::attention` for the numerics), of every (row, query head) whose
    /// key/value head this part holds; items of a head held by several parts are dealt
    /// between them. The result goes into every part's `attn`.
    ///
    /// The query heads of a key/value head this part alone holds are usually one item,
    /// attended together, and so are consecutive rows of one prompt: they read the same
    /// keys and values (the results are the same bits).
    pub(super) fn attend(&self, w: &NodeWorker, me: &PartView<T>, layer: usize) {
        let cfg = &self.model.cfg;
        let hd = cfg.head_dim;
        let group = cfg.n_head / cfg.n_head_kv;
        // Queries already scaled (Gemma) meet unscaled scores.
        let scale = match (cfg.query_scale, cfg.attn_scale) {
            (Some(_), _) => 1.0,
            (None, Some(s)) => s,
            (None, None) => 1.0 / (hd as f32).sqrt(),
        };
        let scale = attention::Scale::new(scale, cfg.attn_softcap);
        // A local layer's query sees its last `window` positions only.
        let window = cfg.sliding.as_ref().filter(|_| cfg.is_local(layer)).map(|s| s.window);
        // SAFETY: per-thread scratch row.
        let qh = unsafe { me.qh.row_mut(w.tid_in_node) };
        // A whole item's rounded queries, accumulators (of several rows) and softmax
        // states, on the stack: decoding does not allocate.
        const MAX_GROUP: usize = 16;
        let mut qg = [0f32; 2048];
        let mut ag = [0f32; 2048];
        let mut states = [Online::default(); 32];
        // A whole group shares each key and value row between its heads (measured at about
        // 3/4 of the per-head cost) but makes `group` times fewer items to deal: take whole
        // groups unless that leaves the busiest thread more work.
        let (groups, threads) = (self.rows.len() * me.part.kv_groups.len(), w.threads_in_node);
        let whole = (1..=MAX_GROUP).contains(&group)
            && group * hd <= qg.len()
            && 3 * groups.div_ceil(threads) * group <= 4 * (groups * group).div_ceil(threads);
        // Whole groups of a prompt's consecutive rows go together too, about six heads an
        // item (two rows of SmolLM2's three heads fill AVX2's registers with value updates:
        // attention 1.25x faster), where rows are plenty.
        let prompt_rows = self.rows.windows(2).any(|p| p[0].seq == p[1].seq);
        let rows_per_item = if whole && prompt_rows && self.rows.len() >= 8 * threads {
            6usize.div_ceil(group).min(qg.len() / (group * hd)).min(states.len() / group)
        } else {
            1
        };
        // Items (first row, rows, first head, heads) are dealt round-robin between holders,
        // then claimed in chunks by the node's threads, each starting on an even share: a
        // thread that runs slower, or whose share holds the longer sequences, is helped by
        // the others.
        let together = |holders: usize| whole && holders == 1;
        let count = |rank: usize, holders: usize| {
            if together(holders) {
                self.rows.len().div_ceil(rows_per_item)
            } else {
                (self.rows.len() * group).saturating_sub(rank).div_ceil(holders)
            }
        };
        let item = |mut k: usize| {
            for &(g, rank, holders) in &me.part.kv_groups {
                let n = count(rank, holders);
                if k < n {
                    if together(holders) {
                        let r = k * rows_per_item;
                        return (r, rows_per_item.min(self.rows.len() - r), g * group, group);
                    }
                    let j = rank + k * holders;
                    return (j / group, 1, g * group + j % group, 1);
                }
                k -= n;
            }
            unreachable!("item index past the part's items")
        };
        let n_items = me.part.kv_groups.iter().map(|&(_, rank, holders)| count(rank, holders)).sum();
        // The keys and values of an item's first blocks are asked for while the item
        // before it computes, the later ones `PREFETCH_BLOCKS` blocks ahead of their use:
        // the keys before a block is attended, the values after, so that no burst of
        // requests holds every miss buffer (with both at once, 16 rows attending 512
        // cached tokens ran 1-4% slower).
        let n_pos = |r: usize| self.rows[r].pos + 1;
        // The first position row `r` sees.
        let first_pos = |r: usize| window.map_or(0, |w| n_pos(r).saturating_sub(w));
        // Positions `lo..hi` of block `b` of row `r`'s sequence, for query head `h`.
        // SAFETY: the cache is read-only in this phase.
        let span = |r: usize, h: usize, b: usize, lo: usize, hi: usize| unsafe {
            let (start, end) = (lo.max(b * BLOCK_TOKENS) - b * BLOCK_TOKENS, hi.min((b + 1) * BLOCK_TOKENS) - b * BLOCK_TOKENS);
            let kvh = h / group - me.part.kv_heads.start;
            let at = me.layout.offset(layer, self.tables.get(self.rows[r].seq)[b], kvh, 0);
            (me.kc.slice(at + start * hd..at + end * hd), me.vc.slice(at + start * hd..at + end * hd), end - start)
        };
        let fetch_start = |r: usize, h: usize| {
            let (lo, hi) = (first_pos(r), n_pos(r));
            for b in lo / BLOCK_TOKENS..(lo / BLOCK_TOKENS + PREFETCH_BLOCKS).min(hi.div_ceil(BLOCK_TOKENS)) {
                let (keys, values, _) = span(r, h, b, lo, hi);
                attention::prefetch(keys, values);
            }
        };
        // Queries `qs` (of rows of one sequence, `r` any of them: it picks the block table;
        // head `h`'s key/value head) over the sequence's positions `lo..hi`.
        let run = |r: usize, h: usize, lo: usize, hi: usize, qs: &[f32], states: &mut [Online], acc: &mut [f32]| {
            if lo >= hi {
                return;
            }
            let blocks = hi.div_ceil(BLOCK_TOKENS);
            for b in lo / BLOCK_TOKENS..blocks {
                let ahead = (b + PREFETCH_BLOCKS < blocks).then(|| span(r, h, b + PREFETCH_BLOCKS, lo, hi));
                if let Some((keys, _, _)) = ahead {
                    attention::prefetch::<T>(keys, &[]);
                }
                let (keys, values, n) = span(r, h, b, lo, hi);
                attention::attend_heads::<T>(self.isa, qs, keys, values, n, scale, states, acc);
                if let Some((_, values, _)) = ahead {
                    attention::prefetch::<T>(&[], values);
                }
            }
        };
        let mut mine = w.claim(n_items, 1, 1).flat_map(|range| range.map(item)).peekable();
        let mut first = true;
        while let Some((r0, rows, h, heads)) = mine.next() {
            if std::mem::take(&mut first) {
                fetch_start(r0, h);
            }
            if let Some(&(nr, _, nh, _)) = mine.peek() {
                fetch_start(nr, nh);
            }
            let cols = h * hd..(h + heads) * hd;
            // The item's rows in runs of one sequence.
            let mut a = r0;
            while a < r0 + rows {
                let b = (a + 1..r0 + rows).find(|&b| self.rows[b].seq != self.rows[a].seq).unwrap_or(r0 + rows);
                let (n, width) = (b - a, heads * hd);
                let states = &mut states[..n * heads];
                states.fill(Online::default());
                // SAFETY: q is read-only now; this thread owns heads h..h + heads of rows
                // a..b in every part's attn.
                let (qs, acc) = if n == 1 {
                    let qs = if heads == 1 { &mut qh[..] } else { &mut qg[..width] };
                    attention::prepare_query::<T>(unsafe { me.q.cols(a, cols.clone()) }, qs);
                    (&*qs, unsafe { me.attn.cols_mut(a, cols.clone()) })
                } else {
                    for (i, qs) in qg[..n * width].chunks_exact_mut(width).enumerate() {
                        attention::prepare_query::<T>(unsafe { me.q.cols(a + i, cols.clone()) }, qs);
                    }
                    (&qg[..n * width], &mut ag[..n * width])
                };
                acc.iter_mut().for_each(|x| *x = 0.0);
                // Each row's own first positions (in a window), the positions all the rows
                // see together, then each row's own last ones: in position order per row.
                let common = (a..b).map(first_pos).max().unwrap()..(a..b).map(n_pos).min().unwrap();
                let shared = n > 1 && common.start < common.end;
                let row = |i: usize| (i * heads..(i + 1) * heads, i * width..(i + 1) * width);
                if shared {
                    for i in 0..n {
                        let (st, at) = row(i);
                        run(a, h, first_pos(a + i), common.start, &qs[at.clone()], &mut states[st], &mut acc[at]);
                    }
                    run(a, h, common.start, common.end, qs, states, acc);
                }
                for i in 0..n {
                    let (st, at) = row(i);
                    let lo = if shared { common.end } else { first_pos(a + i) };
                    run(a, h, lo, n_pos(a + i), &qs[at.clone()], &mut states[st], &mut acc[at]);
                }
                for i in 0..n {
                    let (st, at) = row(i);
                    for (state, acc) in states[st].iter().zip(acc[at.clone()].chunks_exact_mut(hd)) {
                        state.finish(acc);
                    }
                    // SAFETY: as above.
                    unsafe {
                        if n > 1 {
                            me.attn.cols_mut(a + i, cols.clone()).copy_from_slice(&acc[at.clone()]);
                        }
                        for other in self.others(w.node) {
                            other.attn.cols_mut(a + i, cols.clone()).copy_from_slice(&acc[at.clone()]);
                        }
                    }
                }
                a = b;
            }
        }
    }
}
