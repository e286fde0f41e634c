//! The memory of sliding-window layers beyond their window.
//!
//! A local layer's query at position `p` reads positions `p + 1 - window ..= p` only, so
//! once a sequence's rows start at `p`, its blocks wholly before `p + 1 - window` are dead
//! in the local layers: no row it may still run reads them there. Each step marks them
//! ([`super::KvBlocks::slide`]), and the next release gives their pages in the local
//! layers back to the OS, while the global layers keep theirs. A long sequence then holds a
//! window's worth of keys and values in its local layers, as llama.cpp's sliding-window
//! cache does (Gemma 3: 15 of 18 layers).
//!
//! Only blocks a sequence owns alone are marked (a shared prefix block stays whole until
//! its last owner slides past it or frees it). A marked block stays marked while owned or
//! cached, so a later sequence attaches a cached prefix only where the window before its
//! first new row is whole, and a sequence cut back into its dead blocks starts over
//! ([`super::KvBlocks::truncate`]). Whoever rewinds a sequence (benchmarks, calibration)
//! turns marking off instead ([`super::KvBlocks::release_slid_out`]).
//!
//! A page is given back only when every block it touches in that layer's run is dead or
//! free, so with blocks smaller than a page (head dims under 128 in f16) some pages wait
//! for their neighbours.

use blink_runtime::storage::PageReleaser;

use super::bits::Bits;
use super::pool::BlockPool;

/// One K or V buffer of one shard, and its runs (layer × key/value head) that belong to
/// local layers.
pub(crate) struct LocalRuns {
    pub(crate) pages: PageReleaser,
    pub(crate) runs: Vec<usize>,
}

/// The local layers' share of a cache, and what giving it back has done so far.
pub(crate) struct Slide {
    /// Positions a local layer's query sees, its own included.
    pub(crate) window: usize,
    regions: Vec<LocalRuns>,
    n_blocks: usize,
    /// Bytes of one block in one run.
    head_block: usize,
    page: usize,
    /// Blocks past a block that a page touching it can reach.
    reach: u32,
    /// Marked blocks whose pages were not offered to a release yet.
    pub(crate) due: Bits,
    /// Marking is on.
    pub(crate) enabled: bool,
    /// Calls made and bytes given back, in all.
    pub(crate) calls: u64,
    pub(crate) bytes: u64,
    /// Bytes of one block over every local run of every region.
    pub(crate) block_bytes: usize,
    /// A call was refused (or the OS cannot release): no more are tried.
    broken: bool,
}

impl Slide {
    /// The local runs `regions` of buffers of `n_blocks` blocks of `head_block` bytes per
    /// run, for layers that see `window` positions.
    pub(crate) fn new(window: usize, regions: Vec<LocalRuns>, n_blocks: usize, head_block: usize) -> Slide {
        let page = blink_runtime::storage::page_size();
        let block_bytes = regions.iter().map(|r| r.runs.len() * head_block).sum();
        Slide {
            window,
            reach: page.div_ceil(head_block.max(1)) as u32,
            broken: !cfg!(target_os = "linux") || head_block == 0,
            regions,
            n_blocks,
            head_block,
            page,
            due: Bits::new(n_blocks),
            enabled: true,
            calls: 0,
            bytes: 0,
            block_bytes,
        }
    }

    /// Blocks of a sequence whose rows start at `first_pos` that are dead in the local
    /// layers: those wholly before its window.
    pub(crate) fn dead_blocks(&self, first_pos: usize) -> usize {
        (first_pos + 1).saturating_sub(self.window) / super::BLOCK_TOKENS
    }

    /// Give back the local layers' pages of the due blocks (with the dead or free blocks
    /// around them that share their pages), and count those wholly given back in
    /// `pool.slid_out`. Allocates nothing.
    pub(crate) fn release(&mut self, pool: &mut BlockPool) {
        let n = self.n_blocks as u32;
        let mut from = 0;
        while let Some(x) = self.due.next(from) {
            self.due.remove(x);
            from = x + 1;
            // Handed to a new owner since it was marked: its values are live again.
            if !pool.is_slid(x) || self.broken {
                continue;
            }
            let dead = |b: u32| pool.is_slid(b) || pool.is_free(b);
            let mut a = x;
            while a > 0 && x - a < self.reach && dead(a - 1) {
                a -= 1;
            }
            let (mut b, mut last) = (x + 1, x);
            while b < n && b - last <= self.reach && dead(b) {
                if self.due.remove(b) {
                    last = b;
                }
                b += 1;
            }
            from = b;
            match self.give_back(a, b) {
                Ok((lo, hi)) => {
                    for b in lo.max(a)..hi.min(b) {
                        if pool.is_slid(b) {
                            pool.slid_out.insert(b);
                        }
                    }
                }
                Err(_) => self.broken = true,
            }
        }
    }

    /// Give back the whole pages of blocks `a..b` in every local run; returns the blocks
    /// whose pages were all given back in every run.
    fn give_back(&mut self, a: u32, b: u32) -> Result<(u32, u32), i32> {
        let (hb, page) = (self.head_block, self.page);
        let (mut lo, mut hi) = (a, b);
        for region in &self.regions {
            let base = region.pages.base();
            for &run in &region.runs {
                let start = run * self.n_blocks * hb;
                let range = start + a as usize * hb..start + b as usize * hb;
                // The whole pages inside, as PageReleaser::release takes them.
                let from = (base + range.start).next_multiple_of(page) - base;
                let to = ((base + range.end) / page * page).saturating_sub(base);
                if from >= to {
                    (lo, hi) = (b, a);
                    continue;
                }
                lo = lo.max(((from - start).div_ceil(hb)) as u32);
                hi = hi.min(((to - start) / hb) as u32);
                self.calls += 1;
                // SAFETY: blocks a..b are dead in the local layers or free: no pass reads or
                // writes them there (a pass writes its rows' own positions and reads within
                // their windows, past every dead block of theirs), no copy is owed into
                // them, and a new owner writes a block's every layer before reading it.
                self.bytes += unsafe { region.pages.release(range)? } as u64;
            }
        }
        Ok((lo, hi))
    }
}
