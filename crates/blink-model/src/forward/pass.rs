//! One step's computation, run by every pool thread together, on one part or on one part
//! per NUMA node.
//!
//! Each part computes its own output rows of every projection and its own heads'
//! attention, in buffers in its own memory. After a part computes columns the others need
//! (attention outputs, the residual stream, the FFN activations) it copies them into every
//! other part's buffers: writes cross nodes, reads never do. Phases are separated by
//! barriers: a node's threads meet at group barriers, all nodes at global ones. Each phase
//! splits its work so that no two threads write the same element.

use std::ops::Range;

use blink_gguf::GgmlType;
use blink_kernels::attention::{self, Online};
use blink_kernels::cpu::{self, Isa};
use blink_kernels::gemm::{self, ActRows, Out};
use blink_runtime::numa::{NodePool, NodeWorker};
use blink_kernels::ops;
use blink_kernels::order::{self, DotOrder};
use blink_runtime::pool::SharedMut;

use super::scratch::PartScratch;
use super::{Scratch, StepRow};
use crate::kv_cache::{KvData, KvElem, KvLayout, KvShard, KvStore, TableSnapshot, BLOCK_TOKENS};
use crate::placement::Part;
use crate::weights::{LayerWeights, Matrix, Weights};
use crate::Model;

/// Weight bytes per activation row a claimed chunk of a projection covers at least.
const CHUNK_BYTES: usize = 64 << 10;

/// How many blocks ahead attention asks for keys and values.
const PREFETCH_BLOCKS: usize = 2;

/// Most parts (NUMA nodes) a model may be split into.
pub const MAX_PARTS: usize = 16;

/// Whether a projection overwrites its output or adds to it (residual connections).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Write {
    Set,
    Add,
}

/// A `[rows][stride]` f32 matrix shared by the pool threads.
struct Buf<'a> {
    data: SharedMut<'a, f32>,
    stride: usize,
}

impl<'a> Buf<'a> {
    fn new(data: &'a mut [f32], stride: usize) -> Self {
        Buf { data: SharedMut::new(data), stride }
    }

    /// Columns `cols` of row `r`.
    ///
    /// # Safety
    /// The caller owns these elements for writing in the current phase.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    unsafe fn cols_mut(&self, r: usize, cols: Range<usize>) -> &mut [f32] {
        self.data.slice_mut(r * self.stride + cols.start..r * self.stride + cols.end)
    }

    /// # Safety
    /// Nobody writes these elements in the current phase.
    #[inline]
    unsafe fn cols(&self, r: usize, cols: Range<usize>) -> &[f32] {
        self.data.slice(r * self.stride + cols.start..r * self.stride + cols.end)
    }

    /// The whole of row `r`, mutable.
    ///
    /// # Safety
    /// As `cols_mut`.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    unsafe fn row_mut(&self, r: usize) -> &mut [f32] {
        self.cols_mut(r, 0..self.stride)
    }

    /// # Safety
    /// As `cols`.
    #[inline]
    unsafe fn row(&self, r: usize) -> &[f32] {
        self.cols(r, 0..self.stride)
    }

    /// Where a kernel writes column `col` of row 0.
    fn out(&self, col: usize, mode: Write) -> Out {
        // SAFETY: only forms a pointer inside the buffer; the kernel's writes are covered by
        // the caller's phase ownership.
        Out { ptr: unsafe { self.data.as_mut_ptr().add(col) }, ld: self.stride, accumulate: mode == Write::Add }
    }
}

/// One part's weights, buffers and cache shard, as seen during a step.
struct PartView<'a, T: KvElem> {
    w: &'a Weights,
    part: &'a Part,
    x: Buf<'a>,
    xn: Buf<'a>,
    q: Buf<'a>,
    k: Buf<'a>,
    v: Buf<'a>,
    attn: Buf<'a>,
    gate: Buf<'a>,
    up: Buf<'a>,
    act: SharedMut<'a, u8>,
    rope: Buf<'a>,
    qh: Buf<'a>,
    kc: SharedMut<'a, T>,
    vc: SharedMut<'a, T>,
    layout: KvLayout,
}

/// Buffers whose columns parts exchange.
#[derive(Clone, Copy)]
enum Shared {
    /// The residual stream `x`.
    Residual,
    /// The FFN activations (`gate` after SwiGLU).
    Ffn,
}

impl<T: KvElem> PartView<'_, T> {
    fn shared(&self, which: Shared) -> &Buf<'_> {
        match which {
            Shared::Residual => &self.x,
            Shared::Ffn => &self.gate,
        }
    }
}

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
    logit_rows: &'a [usize],
    views: [Option<PartView<'a, T>>; MAX_PARTS],
    n_parts: usize,
    logits: Buf<'a>,
    act_stride: usize,
    tables: &'a TableSnapshot,
    isa: Isa,
    order: DotOrder,
}

impl<'a, T: StoreOf> Pass<'a, T> {
    pub(super) fn new(model: &'a Model, rows: &'a [StepRow], s: &'a mut Scratch, shards: &'a mut [KvShard]) -> Self {
        let cfg = &model.cfg;
        let n_parts = model.parts.len();
        assert!(n_parts <= MAX_PARTS && shards.len() == n_parts && s.parts.len() == n_parts, "parts of model, cache and scratch differ");
        let mut it = model
            .parts
            .iter()
            .zip(&model.plan.parts)
            .zip(s.parts.iter_mut())
            .zip(shards.iter_mut())
            .map(|(((w, part), ps), shard): (((&Weights, &Part), &mut PartScratch), &mut KvShard)| {
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
                    rope: Buf::new(&mut ps.rope, cfg.rope.n_dims),
                    qh: Buf::new(&mut ps.qh, cfg.head_dim),
                    kc: SharedMut::new(&mut store.k),
                    vc: SharedMut::new(&mut store.v),
                    layout,
                }
            });
        let views = std::array::from_fn(|_| it.next());
        Pass {
            model,
            rows,
            logit_rows: &s.logit_rows,
            views,
            n_parts,
            logits: Buf::new(&mut s.logits, cfg.vocab_size),
            act_stride: s.act_stride,
            tables: &s.tables,
            isa: cpu::active(),
            order: order::active(),
        }
    }

    /// Run the pass on `pool`, and `beside` on the calling thread meanwhile (see
    /// [`NodePool::run_beside`]).
    pub(super) fn run_beside<R>(&self, pool: &NodePool, beside: impl FnOnce() -> R) -> (R, std::time::Duration) {
        pool.run_beside(|w| self.run_on(w, self.view(w.node)), beside)
    }

    fn view(&self, part: usize) -> &PartView<'a, T> {
        self.views[part].as_ref().expect("a view per part")
    }

    fn others(&self, part: usize) -> impl Iterator<Item = &PartView<'a, T>> {
        (0..self.n_parts).filter(move |&p| p != part).map(|p| self.view(p))
    }

    fn run_on(&self, w: &NodeWorker, me: &PartView<T>) {
        let cfg = &self.model.cfg;
        let (n, hd) = (self.rows.len(), cfg.head_dim);
        let split = self.n_parts > 1;
        self.embed(w);
        self.rope_angles(w, me);
        w.global_barrier();
        for (l, lw) in me.w.layers.iter().enumerate() {
            // Attention: the part's query heads (and the key/value heads they use).
            self.norm_rows(w, me, &lw.attn_norm, n, |r| r);
            let (qc, kc) = (me.part.q_heads.start * hd, me.part.kv_heads.start * hd);
            self.project(w, me, &me.xn, cfg.n_embd, n, &[(&lw.wq, &me.q, qc, Write::Set), (&lw.wk, &me.k, kc, Write::Set), (&lw.wv, &me.v, kc, Write::Set)]);
            self.qkv_post(w, me, l, lw);
            if self.model.plan.shares_kv {
                w.group_barrier();
                self.share_queries(w, me);
                w.global_barrier();
            } else {
                w.group_barrier();
            }
            self.attention(w, me, l);
            w.global_barrier();
            // Output projection: the part's rows of the residual stream, then everyone's copy.
            self.project(w, me, &me.attn, cfg.q_dim(), n, &[(&lw.wo, &me.x, me.part.embd_rows.start, Write::Add)]);
            if split {
                self.broadcast(w, me, Shared::Residual, me.part.embd_rows.clone());
                w.global_barrier();
            }
            // FFN: the part's rows of gate and up, SwiGLU on them, then everyone's copy.
            self.norm_rows(w, me, &lw.ffn_norm, n, |r| r);
            let fc = me.part.ff_rows.start;
            self.project(w, me, &me.xn, cfg.n_embd, n, &[(&lw.w_gate, &me.gate, fc, Write::Set), (&lw.w_up, &me.up, fc, Write::Set)]);
            for r in w.share(n, 1) {
                // SAFETY: rows are split between the node's threads; gate/up were completed
                // before the barrier that ended the projection.
                unsafe { ops::swiglu(self.isa, me.gate.cols_mut(r, me.part.ff_rows.clone()), me.up.cols(r, me.part.ff_rows.clone())) };
            }
            if split {
                self.broadcast(w, me, Shared::Ffn, me.part.ff_rows.clone());
                w.global_barrier();
            }
            // Unsplit, no barrier: the projection first quantizes this thread's share of the
            // rows (the same share as SwiGLU's), which it has just computed in full.
            self.project(w, me, &me.gate, cfg.n_ff, n, &[(&lw.w_down, &me.x, me.part.embd_rows.start, Write::Add)]);
            if split {
                self.broadcast(w, me, Shared::Residual, me.part.embd_rows.clone());
                w.global_barrier();
            }
        }
        let n_logits = self.logit_rows.len();
        if n_logits > 0 {
            self.norm_rows(w, me, &me.w.output_norm, n_logits, |i| self.logit_rows[i]);
            let vr = me.part.vocab_rows.start;
            self.project(w, me, &me.xn, cfg.n_embd, n_logits, &[(&me.w.output, &self.logits, vr, Write::Set)]);
        }
    }

    /// Copy columns `cols` of every row of one buffer from this part to the others. The
    /// node's threads split the rows.
    fn broadcast(&self, w: &NodeWorker, me: &PartView<T>, which: Shared, cols: Range<usize>) {
        for r in w.share(self.rows.len(), 1) {
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
                for other in self.others(w.node) {
                    other.x.row_mut(r).copy_from_slice(out);
                }
            }
        }
    }

    /// The rope angles of every row's position, computed once for all layers.
    fn rope_angles(&self, w: &NodeWorker, me: &PartView<T>) {
        for r in w.share(self.rows.len(), 1) {
            // SAFETY: rope rows are split between the node's threads.
            unsafe { self.model.rope.angles(self.rows[r].pos, me.rope.row_mut(r)) };
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

    /// Multiply `count` rows of `input` (width `cols`) by each of the part's matrices,
    /// writing or adding the results at a column offset of its output. Activations are
    /// quantized once per distinct format; group barriers separate quantization from the
    /// products and the products from what follows.
    fn project(&self, w: &NodeWorker, me: &PartView<T>, input: &Buf, cols: usize, count: usize, outputs: &[(&Matrix, &Buf, usize, Write)]) {
        let mut quantized: Option<GgmlType> = None;
        for &(m, out, col, mode) in outputs {
            let mat = m.mat_ref();
            let act_ty = mat.activation_type();
            if quantized != Some(act_ty) {
                if quantized.is_some() {
                    w.group_barrier();
                }
                self.quantize_rows(w, me, input, cols, count, act_ty);
                w.group_barrier();
                quantized = Some(act_ty);
            }
            // Rows go out in chunks the node's threads claim, so a thread that runs slower
            // computes fewer of them; a chunk streams at least `CHUNK_BYTES` of weights
            // per activation row (shorter runs cost the hardware prefetcher its stride).
            let row_bytes = m.bytes().len() / m.rows.max(1);
            let rows = w.claim(m.rows, gemm::ROW_ALIGN, CHUNK_BYTES / (row_bytes * count).max(1));
            // SAFETY: act is read-only in this phase (written before the last barrier); this
            // thread alone writes columns `col + r` of `out` for each range `r` it claims.
            unsafe {
                let act = ActRows { ty: act_ty, bytes: me.act.slice(0..count * self.act_stride), stride: self.act_stride, count };
                gemm::product(self.isa, self.order, &mat, &act, rows, out.out(col, mode));
            }
        }
        w.group_barrier();
    }

    fn quantize_rows(&self, w: &NodeWorker, me: &PartView<T>, input: &Buf, cols: usize, count: usize, ty: GgmlType) {
        let bytes = ty.row_bytes(cols as u64).expect("checked at load") as usize;
        for r in w.share(count, 1) {
            // SAFETY: input rows are read-only here (written by this thread or before a
            // barrier); act rows are split between the node's threads.
            unsafe {
                let dst = me.act.slice_mut(r * self.act_stride..r * self.act_stride + bytes);
                ops::quantize_row(self.isa, ty, input.cols(r, 0..cols), dst);
            }
        }
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
        for r in w.share(self.rows.len(), 1) {
            // SAFETY: each thread owns its rows of q, k, v, and the cache slots of those rows'
            // positions (distinct rows have distinct (sequence, position) pairs).
            let (q, k, v) = unsafe { (me.q.cols_mut(r, qc.clone()), me.k.cols_mut(r, kc.clone()), me.v.cols_mut(r, kc.clone())) };
            for (x, b) in [(&mut *q, &lw.bq), (&mut *k, &lw.bk), (&mut *v, &lw.bv)] {
                if let Some(b) = b {
                    x.iter_mut().zip(b.iter()).for_each(|(x, b)| *x += b);
                }
            }
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                q.chunks_exact_mut(hd).for_each(|h| ops::rms_norm_in_place(self.isa, h, qn, cfg.norm_eps));
                k.chunks_exact_mut(hd).for_each(|h| ops::rms_norm_in_place(self.isa, h, kn, cfg.norm_eps));
            }
            // SAFETY: written before the pass's first barrier.
            let angles = unsafe { me.rope.row(r) };
            q.chunks_exact_mut(hd).for_each(|h| rope.apply(self.isa, angles, h));
            k.chunks_exact_mut(hd).for_each(|h| rope.apply(self.isa, angles, h));

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
    fn share_queries(&self, w: &NodeWorker, me: &PartView<T>) {
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
    /// attended together (the results are the same bits).
    fn attention(&self, w: &NodeWorker, me: &PartView<T>, layer: usize) {
        let cfg = &self.model.cfg;
        let hd = cfg.head_dim;
        let group = cfg.n_head / cfg.n_head_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        // SAFETY: per-thread scratch row.
        let qh = unsafe { me.qh.row_mut(w.tid_in_node) };
        // A whole group's rounded queries and softmax states (on the stack: decoding does
        // not allocate).
        const MAX_GROUP: usize = 16;
        let mut qg = [0f32; 2048];
        let mut states = [Online::default(); MAX_GROUP];
        // A whole group shares each key and value row between its heads (measured at about
        // 3/4 of the per-head cost) but makes `group` times fewer items to deal: take whole
        // groups unless that leaves the busiest thread more work.
        let (groups, threads) = (self.rows.len() * me.part.kv_groups.len(), w.threads_in_node);
        let whole = (2..=MAX_GROUP).contains(&group)
            && group * hd <= qg.len()
            && 3 * groups.div_ceil(threads) * group <= 4 * (groups * group).div_ceil(threads);
        // Items (row, first head, heads) are dealt round-robin between holders, then claimed
        // in chunks by the node's threads, each starting on an even share: a thread that
        // runs slower, or whose share holds the longer sequences, is helped by the others.
        // Per key/value group: the first (row·group + head) index, the step and the heads.
        let deal = |rank: usize, holders: usize| if whole && holders == 1 { (0, group, group) } else { (rank, holders, 1) };
        let count = |rank, holders| {
            let (first, step, _) = deal(rank, holders);
            (self.rows.len() * group).saturating_sub(first).div_ceil(step)
        };
        let item = |mut k: usize| {
            for &(g, rank, holders) in &me.part.kv_groups {
                let n = count(rank, holders);
                if k < n {
                    let (first, step, heads) = deal(rank, holders);
                    let j = first + k * step;
                    return (j / group, g * group + j % group, heads);
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
        // SAFETY: the cache is read-only in this phase.
        let block = |r: usize, h: usize, b: usize| unsafe {
            let n = (n_pos(r) - b * BLOCK_TOKENS).min(BLOCK_TOKENS);
            let kvh = h / group - me.part.kv_heads.start;
            let at = me.layout.offset(layer, self.tables.get(self.rows[r].seq)[b], kvh, 0);
            (me.kc.slice(at..at + n * hd), me.vc.slice(at..at + n * hd), n)
        };
        let fetch_start = |r: usize, h: usize| {
            for b in 0..PREFETCH_BLOCKS.min(n_pos(r).div_ceil(BLOCK_TOKENS)) {
                let (keys, values, _) = block(r, h, b);
                attention::prefetch(keys, values);
            }
        };
        let mut mine = w.claim(n_items, 1, 1).flat_map(|range| range.map(item)).peekable();
        let mut first = true;
        while let Some((r, h, heads)) = mine.next() {
            if std::mem::take(&mut first) {
                fetch_start(r, h);
            }
            if let Some(&(nr, nh, _)) = mine.peek() {
                fetch_start(nr, nh);
            }
            let cols = h * hd..(h + heads) * hd;
            // SAFETY: q is read-only now; this thread owns heads h..h + heads of row r in
            // every part's attn.
            let (q, acc) = unsafe { (me.q.cols(r, cols.clone()), me.attn.cols_mut(r, cols.clone())) };
            let qs = if heads == 1 { &mut qh[..] } else { &mut qg[..heads * hd] };
            attention::prepare_query::<T>(q, qs);
            acc.iter_mut().for_each(|a| *a = 0.0);
            let states = &mut states[..heads];
            states.fill(Online::default());
            let blocks = n_pos(r).div_ceil(BLOCK_TOKENS);
            for b in 0..blocks {
                let ahead = (b + PREFETCH_BLOCKS < blocks).then(|| block(r, h, b + PREFETCH_BLOCKS));
                if let Some((keys, _, _)) = ahead {
                    attention::prefetch::<T>(keys, &[]);
                }
                let (keys, values, n) = block(r, h, b);
                attention::attend_heads::<T>(self.isa, qs, keys, values, n, scale, states, acc);
                if let Some((_, values, _)) = ahead {
                    attention::prefetch::<T>(&[], values);
                }
            }
            for (state, acc) in states.iter().zip(acc.chunks_exact_mut(hd)) {
                state.finish(acc);
            }
            for other in self.others(w.node) {
                // SAFETY: as above, for the other parts' copies.
                unsafe { other.attn.cols_mut(r, cols.clone()).copy_from_slice(acc) };
            }
        }
    }
}
