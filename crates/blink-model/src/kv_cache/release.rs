//! Giving the memory of free blocks back to the OS.
//!
//! Each K or V buffer of a shard is a [`Region`]: `runs` runs (one per layer and key/value
//! head, in that order) of every block of the pool, each block of a run `head_block` bytes
//! (16 tokens of one head: 2 KiB for 64 f16 values). A page is given back only when every
//! block it touches, in whichever runs it spans, is free, so a page usually covers several
//! blocks and never one that is owned or cached. A release looks only around the blocks
//! freed since the last one: each span of free blocks around them (reaching a page's worth
//! of blocks past the last freed one, and across the seam between one run's last block and
//! the next run's first), in every run of every region, becomes one page range; ranges that
//! meet are given back in one call. A free block is then counted released once every page
//! it touches in every run was given back.

use std::ops::Range;

use blink_runtime::storage::PageReleaser;

use super::pool::BlockPool;

/// One K or V buffer of one shard.
pub(crate) struct Region {
    pub(crate) pages: PageReleaser,
    /// Runs of blocks in it: layers × heads.
    pub(crate) runs: usize,
}

/// Free blocks `a..b` (around some freed since the last release), extended across the seams
/// between runs by `ext_l` blocks before block 0 and `ext_r` after the last block; `lo..hi`
/// (offsets from a run's start) are the blocks whose pages were given back in every run.
#[derive(Clone, Copy)]
struct Span {
    a: u32,
    b: u32,
    ext_l: u32,
    ext_r: u32,
    lo: i64,
    hi: i64,
}

/// The pages of a cache's buffers, and what releasing them has done so far.
pub(crate) struct Releaser {
    regions: Vec<Region>,
    n_blocks: usize,
    head_block: usize,
    page: usize,
    /// Blocks past a block that a page touching it can reach.
    reach: u32,
    spans: Vec<Span>,
    /// Calls made and bytes given back, in all.
    pub(crate) calls: u64,
    pub(crate) bytes: u64,
    /// Bytes of one block over every region (all layers, heads, K and V).
    pub(crate) block_bytes: usize,
    /// A call was refused (or the OS cannot release): no more are tried.
    broken: bool,
}

impl Releaser {
    /// The releaser of `regions`, buffers of `n_blocks` blocks of `head_block` bytes per run.
    pub(crate) fn new(regions: Vec<Region>, n_blocks: usize, head_block: usize) -> Releaser {
        let page = blink_runtime::storage::page_size();
        let block_bytes = regions.iter().map(|r| r.runs * head_block).sum();
        let broken = !cfg!(target_os = "linux") || head_block == 0;
        Releaser {
            reach: page.div_ceil(head_block.max(1)) as u32,
            spans: Vec::with_capacity(n_blocks / 2 + 3),
            regions,
            n_blocks,
            head_block,
            page,
            calls: 0,
            bytes: 0,
            block_bytes,
            broken,
        }
    }

    /// Give back the pages that only free blocks occupy around the blocks freed since the
    /// last release (`pool.dirty`), and count the free blocks whose pages are all given back
    /// as released. Allocates nothing.
    pub(crate) fn release(&mut self, pool: &mut BlockPool) {
        if self.broken {
            while pool.dirty.pop_lowest().is_some() {}
            return;
        }
        self.find_spans(pool);
        if self.give_back().is_err() {
            self.broken = true;
        } else {
            for s in &self.spans {
                for b in s.lo.max(0)..s.hi.min(self.n_blocks as i64) {
                    pool.mark_released(b as u32);
                }
            }
        }
        for s in &self.spans {
            for b in s.a..s.b {
                pool.dirty.remove(b);
            }
        }
    }

    /// The spans of free blocks around the dirty ones, in order.
    fn find_spans(&mut self, pool: &BlockPool) {
        self.spans.clear();
        let (n, reach) = (self.n_blocks as u32, self.reach);
        let mut from = 0;
        while let Some(x) = pool.dirty.next(from) {
            let mut a = x;
            while a > from && x - a < reach && pool.is_free(a - 1) {
                a -= 1;
            }
            let (mut b, mut last) = (x + 1, x);
            while b < n && b - last <= reach && pool.is_free(b) {
                if pool.dirty.contains(b) {
                    last = b;
                }
                b += 1;
            }
            let ext_l = if a == 0 { (0..reach.min(n)).take_while(|&i| pool.is_free(n - 1 - i)).count() as u32 } else { 0 };
            let ext_r = if b == n { (0..reach.min(n)).take_while(|&i| pool.is_free(i)).count() as u32 } else { 0 };
            self.spans.push(Span { a, b, ext_l, ext_r, lo: i64::MIN, hi: i64::MAX });
            from = b;
        }
        // A span at one end of the runs reaches blocks at the other end (across the seams);
        // they get a span of their own, so they are counted released in the last (first) run
        // too.
        let span = |a: u32, b: u32, ext_l: u32, ext_r: u32| Span { a, b, ext_l, ext_r, lo: i64::MIN, hi: i64::MAX };
        let (Some(&first), Some(&last)) = (self.spans.first(), self.spans.last()) else { return };
        if first.a == 0 && first.ext_l > 0 && last.b < n {
            let free_head = (0..reach.min(n)).take_while(|&i| pool.is_free(i)).count() as u32;
            self.spans.push(span(n - first.ext_l, n, 0, free_head));
        }
        if last.b == n && last.ext_r > 0 && first.a > 0 {
            let free_tail = (0..reach.min(n)).take_while(|&i| pool.is_free(n - 1 - i)).count() as u32;
            self.spans.insert(0, span(0, last.ext_r, free_tail, 0));
        }
    }

    /// Give back every span's pages in every run of every region, ranges that meet in one
    /// call, narrowing each span's `lo..hi` to the blocks wholly given back.
    fn give_back(&mut self) -> Result<(), i32> {
        let (n, hb, page) = (self.n_blocks, self.head_block, self.page);
        for region in &self.regions {
            let base = region.pages.base();
            let total = (region.runs * n) as i64;
            let mut pending: Option<Range<usize>> = None;
            for run in 0..region.runs {
                let start = (run * n) as i64;
                for s in self.spans.iter_mut() {
                    let j0 = (start + s.a as i64 - s.ext_l as i64).max(0) as usize;
                    let j1 = (start + s.b as i64 + s.ext_r as i64).min(total) as usize;
                    // Whole pages of the span's bytes, as offsets in the buffer.
                    // (To the buffer's extent at its end: a mapping's last page is all its own.)
                    let end = if j1 as i64 == total { region.pages.len() } else { j1 * hb };
                    let from = (base + j0 * hb).next_multiple_of(page) - base;
                    let to = ((base + end) / page * page).saturating_sub(base);
                    if from >= to {
                        (s.lo, s.hi) = (i64::MAX, i64::MIN);
                        continue;
                    }
                    s.lo = s.lo.max(from.div_ceil(hb) as i64 - start);
                    s.hi = s.hi.min((to / hb) as i64 - start);
                    match &mut pending {
                        Some(p) if (p.start..=p.end).contains(&from) => p.end = p.end.max(to),
                        _ => {
                            if let Some(p) = pending.replace(from..to) {
                                self.bytes += Self::call(&region.pages, p, &mut self.calls)? as u64;
                            }
                        }
                    }
                }
            }
            if let Some(p) = pending {
                self.bytes += Self::call(&region.pages, p, &mut self.calls)? as u64;
            }
        }
        Ok(())
    }

    fn call(pages: &PageReleaser, range: Range<usize>, calls: &mut u64) -> Result<usize, i32> {
        *calls += 1;
        // SAFETY: the range holds only blocks that are free (neither owned nor cached): no
        // pass reads or writes them (a pass touches the blocks of its sequences, which own
        // them until it ends), no copy is owed from or into them, and a block's contents
        // matter again only once a new owner has written them.
        unsafe { pages.release(range) }
    }
}
