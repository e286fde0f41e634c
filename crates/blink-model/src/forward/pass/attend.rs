//! Causal attention over the cache, within a sliding window on a model's local layers
//! (`Pass::attend`): the cutting of (row, query head) pairs into items and their dealing
//! between the parts holding a key/value head and the node's threads ([`Items`]), one
//! layer's cached keys and values as a part reads them ([`Reader`]), and one run of an
//! item's rows of one sequence ([`Reader::attend_run`]). The numerics are
//! `blink_kernels::attention`'s.

use std::ops::Range;

use blink_kernels::attention::{self, Online, Scale};
use blink_runtime::numa::NodeWorker;

use super::buffers::PartView;
use super::{Pass, StoreOf};
use crate::kv_cache::BLOCK_TOKENS;
use crate::forward::StepRow;

/// How many blocks ahead attention asks for keys and values.
const PREFETCH_BLOCKS: usize = 2;
/// The most query heads of one key/value head that are attended together.
const MAX_GROUP: usize = 16;
/// Floats of an item's rounded queries, and of its accumulators.
const ITEM_FLOATS: usize = 2048;
/// Softmax states of an item (rows × heads).
const ITEM_STATES: usize = 32;

impl<T: StoreOf> Pass<'_, T> {
    /// Causal attention over its sequence's cached positions, block by block, of every
    /// (row, query head) whose key/value head this part holds; items of a head held by
    /// several parts are dealt between them. The result goes into every part's `attn`.
    ///
    /// The query heads of a key/value head this part alone holds are usually one item,
    /// attended together, and so are consecutive rows of one prompt: they read the same
    /// keys and values (the results are the same bits).
    pub(super) fn attend(&self, w: &NodeWorker, me: &PartView<T>, layer: usize) {
        let reader = Reader::new(self, me, layer);
        let items = Items::new(self.rows, &me.part.kv_groups, reader.group, reader.hd, w.threads_in_node);
        // SAFETY: per-thread scratch row.
        let qh = unsafe { me.qh.row_mut(w.tid_in_node) };
        let mut scratch = ItemScratch { queries: [0.0; ITEM_FLOATS], accs: [0.0; ITEM_FLOATS], states: [Online::default(); ITEM_STATES] };
        // Items are claimed in chunks by the node's threads, each starting on an even
        // share: a thread that runs slower, or whose share holds the longer sequences, is
        // helped by the others. The keys and values of an item's first blocks are asked
        // for while the item before it computes.
        let mut mine = w.claim(items.len(), 1, 1).flat_map(|range| range.map(|k| items.get(k))).peekable();
        let mut first = true;
        while let Some(item) = mine.next() {
            if std::mem::take(&mut first) {
                reader.fetch_start(item.rows.start, item.heads.start);
            }
            if let Some(next) = mine.peek() {
                reader.fetch_start(next.rows.start, next.heads.start);
            }
            // The item's rows in runs of one sequence.
            let mut a = item.rows.start;
            while a < item.rows.end {
                let b = (a + 1..item.rows.end).find(|&b| self.rows[b].seq != self.rows[a].seq).unwrap_or(item.rows.end);
                // SAFETY: this thread claimed the item, so it alone owns its heads of these
                // rows in every part's attn; q is read-only in this phase.
                unsafe { reader.attend_run(w, a..b, item.heads.clone(), &mut scratch, qh) };
                a = b;
            }
        }
    }
}

/// Query heads `heads` of rows `rows`, attended by one thread together.
struct Item {
    rows: Range<usize>,
    heads: Range<usize>,
}

/// How a layer's (row, query head) pairs whose key/value heads this part holds are cut
/// into items. A key/value head this part alone holds gives items of whole query-head
/// groups (of one or more rows) when `whole`, else one pair an item; one that several
/// parts hold has its pairs dealt round-robin between them, one pair an item.
struct Items<'a> {
    n_rows: usize,
    /// (key/value head, this part's rank among its holders, holders).
    kv_groups: &'a [(usize, usize, usize)],
    /// Query heads per key/value head.
    group: usize,
    /// Whether a key/value head this part alone holds takes its query heads as one item...
    whole: bool,
    /// ... of this many consecutive rows.
    rows_per_item: usize,
}

impl<'a> Items<'a> {
    fn new(rows: &[StepRow], kv_groups: &'a [(usize, usize, usize)], group: usize, hd: usize, threads: usize) -> Self {
        // A whole group shares each key and value row between its heads (measured at about
        // 3/4 of the per-head cost) but makes `group` times fewer items to deal: take whole
        // groups unless that leaves the busiest thread more work.
        let groups = rows.len() * kv_groups.len();
        let whole = (1..=MAX_GROUP).contains(&group)
            && group * hd <= ITEM_FLOATS
            && 3 * groups.div_ceil(threads) * group <= 4 * (groups * group).div_ceil(threads);
        // Whole groups of a prompt's consecutive rows go together too, about six heads an
        // item (two rows of SmolLM2's three heads fill AVX2's registers with value updates:
        // attention 1.25x faster), where rows are plenty.
        let prompt_rows = rows.windows(2).any(|p| p[0].seq == p[1].seq);
        let rows_per_item = if whole && prompt_rows && rows.len() >= 8 * threads {
            6usize.div_ceil(group).min(ITEM_FLOATS / (group * hd)).min(ITEM_STATES / group)
        } else {
            1
        };
        Items { n_rows: rows.len(), kv_groups, group, whole, rows_per_item }
    }

    fn together(&self, holders: usize) -> bool {
        self.whole && holders == 1
    }

    /// The items of a key/value head this part takes as rank `rank` of `holders`.
    fn count(&self, rank: usize, holders: usize) -> usize {
        if self.together(holders) {
            self.n_rows.div_ceil(self.rows_per_item)
        } else {
            (self.n_rows * self.group).saturating_sub(rank).div_ceil(holders)
        }
    }

    fn len(&self) -> usize {
        self.kv_groups.iter().map(|&(_, rank, holders)| self.count(rank, holders)).sum()
    }

    /// Item `k` of the part's items, in the order of their key/value heads.
    fn get(&self, mut k: usize) -> Item {
        for &(g, rank, holders) in self.kv_groups {
            let n = self.count(rank, holders);
            if k < n {
                if self.together(holders) {
                    let r = k * self.rows_per_item;
                    return Item { rows: r..(r + self.rows_per_item).min(self.n_rows), heads: g * self.group..(g + 1) * self.group };
                }
                let j = rank + k * holders;
                let h = g * self.group + j % self.group;
                return Item { rows: j / self.group..j / self.group + 1, heads: h..h + 1 };
            }
            k -= n;
        }
        unreachable!("item index past the part's items")
    }
}

/// A thread's scratch for an item: its rounded queries, accumulators (of several rows)
/// and softmax states, on the stack, so that decoding does not allocate.
struct ItemScratch {
    queries: [f32; ITEM_FLOATS],
    accs: [f32; ITEM_FLOATS],
    states: [Online; ITEM_STATES],
}

/// One layer's cached keys and values, as this part's attention reads them. Built only
/// inside `Pass::attend`, between the barriers around it, when no thread writes the cache.
struct Reader<'p, 'a, T: StoreOf> {
    pass: &'p Pass<'a, T>,
    me: &'p PartView<'a, T>,
    layer: usize,
    hd: usize,
    /// Query heads per key/value head.
    group: usize,
    /// On a local layer, a query sees its last `window` positions only.
    window: Option<usize>,
    scale: Scale,
}

impl<'p, 'a, T: StoreOf> Reader<'p, 'a, T> {
    fn new(pass: &'p Pass<'a, T>, me: &'p PartView<'a, T>, layer: usize) -> Self {
        let cfg = &pass.model.cfg;
        let hd = cfg.head_dim;
        // Queries already scaled (Gemma) meet unscaled scores.
        let scale = match (cfg.query_scale, cfg.attn_scale) {
            (Some(_), _) => 1.0,
            (None, Some(s)) => s,
            (None, None) => 1.0 / (hd as f32).sqrt(),
        };
        let window = cfg.sliding.as_ref().filter(|_| cfg.is_local(layer)).map(|s| s.window);
        let (group, scale) = (cfg.n_head / cfg.n_head_kv, Scale::new(scale, cfg.attn_softcap));
        Reader { pass, me, layer, hd, group, window, scale }
    }

    /// One past the last position row `r` sees (its own).
    fn n_pos(&self, r: usize) -> usize {
        self.pass.rows[r].pos + 1
    }

    /// The first position row `r` sees.
    fn first_pos(&self, r: usize) -> usize {
        self.window.map_or(0, |w| self.n_pos(r).saturating_sub(w))
    }

    /// The keys and values of positions `lo..hi` of block `b` of row `r`'s sequence, for
    /// query head `h`, and how many positions they hold.
    fn span(&self, r: usize, h: usize, b: usize, lo: usize, hi: usize) -> (&[T], &[T], usize) {
        let hd = self.hd;
        let (start, end) = (lo.max(b * BLOCK_TOKENS) - b * BLOCK_TOKENS, hi.min((b + 1) * BLOCK_TOKENS) - b * BLOCK_TOKENS);
        let kvh = h / self.group - self.me.part.kv_heads.start;
        let at = self.me.layout.offset(self.layer, self.pass.tables.get(self.pass.rows[r].seq)[b], kvh, 0);
        let cells = at + start * hd..at + end * hd;
        // SAFETY: the cache is read-only in this phase.
        unsafe { (self.me.kc.slice(cells.clone()), self.me.vc.slice(cells), end - start) }
    }

    /// Ask for the keys and values of row `r`'s first blocks, for query head `h`.
    fn fetch_start(&self, r: usize, h: usize) {
        let (lo, hi) = (self.first_pos(r), self.n_pos(r));
        for b in lo / BLOCK_TOKENS..(lo / BLOCK_TOKENS + PREFETCH_BLOCKS).min(hi.div_ceil(BLOCK_TOKENS)) {
            let (keys, values, _) = self.span(r, h, b, lo, hi);
            attention::prefetch(keys, values);
        }
    }

    /// Queries `qs` (of rows of one sequence, `r` any of them: it picks the block table;
    /// head `h`'s key/value head) over the sequence's `positions`.
    ///
    /// Later blocks are asked for `PREFETCH_BLOCKS` ahead of their use: the keys before a
    /// block is attended, the values after, so that no burst of requests holds every miss
    /// buffer (with both at once, 16 rows attending 512 cached tokens ran 1-4% slower).
    fn attend_positions(&self, r: usize, h: usize, positions: Range<usize>, qs: &[f32], states: &mut [Online], acc: &mut [f32]) {
        let Range { start: lo, end: hi } = positions;
        if lo >= hi {
            return;
        }
        let blocks = hi.div_ceil(BLOCK_TOKENS);
        for b in lo / BLOCK_TOKENS..blocks {
            let ahead = (b + PREFETCH_BLOCKS < blocks).then(|| self.span(r, h, b + PREFETCH_BLOCKS, lo, hi));
            if let Some((keys, _, _)) = ahead {
                attention::prefetch::<T>(keys, &[]);
            }
            let (keys, values, n) = self.span(r, h, b, lo, hi);
            attention::attend_heads::<T>(self.pass.isa, self.pass.flavour, qs, keys, values, n, self.scale, states, acc);
            if let Some((_, values, _)) = ahead {
                attention::prefetch::<T>(&[], values);
            }
        }
    }

    /// Query heads `heads` of `rows`, consecutive rows of one sequence, over the positions
    /// each sees; the results go into every part's `attn`.
    ///
    /// # Safety
    /// The calling thread alone owns `heads` of `rows` in every part's `attn`, and `q` is
    /// read-only (the attention phase, on an item this thread claimed).
    unsafe fn attend_run(&self, w: &NodeWorker, rows: Range<usize>, heads: Range<usize>, s: &mut ItemScratch, qh: &mut [f32]) {
        let (hd, me) = (self.hd, self.me);
        let (a, n, h, nh) = (rows.start, rows.len(), heads.start, heads.len());
        let (cols, width) = (h * hd..heads.end * hd, nh * hd);
        debug_assert!(rows.clone().all(|r| self.pass.rows[r].seq == self.pass.rows[a].seq), "a run of one sequence");
        let states = &mut s.states[..n * nh];
        states.fill(Online::default());
        // SAFETY: the caller's (see above).
        let (qs, acc) = if n == 1 {
            let qs = if nh == 1 { qh } else { &mut s.queries[..width] };
            attention::prepare_query::<T>(unsafe { me.q.cols(a, cols.clone()) }, qs);
            (&*qs, unsafe { me.attn.cols_mut(a, cols.clone()) })
        } else {
            for (i, qs) in s.queries[..n * width].chunks_exact_mut(width).enumerate() {
                attention::prepare_query::<T>(unsafe { me.q.cols(a + i, cols.clone()) }, qs);
            }
            (&s.queries[..n * width], &mut s.accs[..n * width])
        };
        acc.fill(0.0);
        // Each row's own first positions (in a window), the positions all the rows see
        // together, then each row's own last ones: in position order per row.
        let common = rows.clone().map(|r| self.first_pos(r)).max().unwrap()..rows.clone().map(|r| self.n_pos(r)).min().unwrap();
        let shared = n > 1 && common.start < common.end;
        let row = |i: usize| (i * nh..(i + 1) * nh, i * width..(i + 1) * width);
        if shared {
            for i in 0..n {
                let (st, at) = row(i);
                self.attend_positions(a, h, self.first_pos(a + i)..common.start, &qs[at.clone()], &mut states[st], &mut acc[at]);
            }
            self.attend_positions(a, h, common.clone(), qs, states, acc);
        }
        for i in 0..n {
            let (st, at) = row(i);
            let lo = if shared { common.end } else { self.first_pos(a + i) };
            self.attend_positions(a, h, lo..self.n_pos(a + i), &qs[at.clone()], &mut states[st], &mut acc[at]);
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
                for other in self.pass.others(w.node) {
                    other.attn.cols_mut(a + i, cols.clone()).copy_from_slice(&acc[at.clone()]);
                }
            }
        }
    }
}
