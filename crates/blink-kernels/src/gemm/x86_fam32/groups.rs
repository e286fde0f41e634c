//! The tiles of a run of weight groups against a batch's activation rows: which tile
//! widths run, the k-cut (the blocks in chunks that stay in L1 across a group's tiles,
//! each tile's sums kept between chunks) and the prefetching of what comes next.

use std::ops::Range;

use std::arch::x86_64::*;

use super::tiles::{self, tile_block, tile_lanes, Tile};
use super::{pairs_first, tiling, DotU8I8, Fam32, Out, Shape, GROUP, PARTIAL};

/// The tiles of every weight group in `rows`. Where a group and a tile's activation rows
/// do not fit in L1 together ([`tiling::k_chunk_blocks`]) and there is more than one tile,
/// the blocks go in chunks (on kernels with [`Shape::K_CUT`]) that stay in L1 across the
/// group's tiles, each tile's running sums kept between chunks ([`tiles::Chunk`]).
#[inline(always)]
pub(super) unsafe fn groups<F: Fam32, D: DotU8I8 + Shape, const BLOCK: bool>(n_blocks: usize, group_bytes: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, scales: &[f32], offsets: &[i32], out: Out) {
    let wide = D::wide(BLOCK, pairs_first::<F, D>());
    let group_block = F::FIELDS.group_block();
    // (One tile alone reuses nothing: it keeps whole groups.)
    let chunk_blocks = if D::K_CUT && n_act > wide { tiling::k_chunk_blocks(n_blocks, group_block, F::ACT_BYTES, wide, tiling::l1_bytes()) } else { n_blocks };
    let n_tiles = if wide > 1 { n_act / wide + n_act % wide } else { n_act };
    // Offsets per block: one in the block order, one per lane in llama.cpp's.
    let per_block = if BLOCK { 1 } else { 8 };
    // Whole groups have a loop of their own: run through the chunk loop as one chunk, their
    // per-group bookkeeping cost 2- and 4-row products 7-23% (docs/PERFORMANCE.md).
    if !D::K_CUT || chunk_blocks >= n_blocks {
        for g in (rows.start..rows.end).step_by(GROUP) {
            let live = (rows.end - g).min(GROUP);
            let wg = w.as_ptr().add(g / GROUP * group_bytes);
            // Every tile prefetches lines of the next group while the group computes,
            // spread over all its tiles and blocks rather than requested all at once; past
            // the end of `rows` too, where this thread's next claimed chunk most likely
            // starts. (A lone tile is left to the hardware prefetcher: measured no better
            // with it.)
            let next_in_matrix = (g / GROUP + 2) * group_bytes <= w.len();
            let next = if n_act > wide && next_in_matrix { wg.add(group_bytes) } else { std::ptr::null() };
            let tile = |j: usize, k: usize| Tile {
                n_blocks,
                row_blocks: n_blocks,
                chunk: tiles::Chunk::WHOLE,
                w: wg,
                a: act.as_ptr().add(j * act_stride),
                a_stride: act_stride,
                scales: scales.as_ptr().add(2 * j * n_blocks),
                offsets: if offsets.is_empty() { std::ptr::null() } else { offsets.as_ptr().add(j * n_blocks * per_block) },
                out: out.ptr.add(j * out.ld + g),
                ld: out.ld,
                accumulate: out.accumulate,
                live,
                ahead: Ahead::new(next, group_bytes, k, n_tiles, n_blocks),
            };
            run_tiles::<F, D, BLOCK, false>(n_act, wide, n_tiles <= L2_FETCH_MAX_TILES, tile);
        }
        return;
    }
    let mut partial = PARTIAL.take();
    partial.resize(n_act * tiles::PARTIAL_FLOATS, 0.0);
    for g in (rows.start..rows.end).step_by(GROUP) {
        let live = (rows.end - g).min(GROUP);
        let wg = w.as_ptr().add(g / GROUP * group_bytes);
        let next_in_matrix = (g / GROUP + 2) * group_bytes <= w.len();
        for k0 in (0..n_blocks).step_by(chunk_blocks) {
            let k1 = (k0 + chunk_blocks).min(n_blocks);
            let chunk = tiles::Chunk { partial: partial.as_mut_ptr(), first: k0 == 0, last: k1 == n_blocks };
            // The tiles ask for the group's next chunk, or after the last the next group's
            // first, into L1.
            let (next, next_bytes) = match (k1 < n_blocks, n_act > wide && next_in_matrix) {
                (true, _) => (wg.add(k1 * group_block), (n_blocks - k1).min(chunk_blocks) * group_block),
                (false, true) => (wg.add(group_bytes), chunk_blocks * group_block),
                (false, false) => (std::ptr::null(), 0),
            };
            let tile = |j: usize, k: usize| Tile {
                n_blocks: k1 - k0,
                row_blocks: n_blocks,
                chunk: tiles::Chunk { partial: chunk.partial.add(j * tiles::PARTIAL_FLOATS), ..chunk },
                w: wg.add(k0 * group_block),
                a: act.as_ptr().add(j * act_stride + k0 * F::ACT_BYTES),
                a_stride: act_stride,
                scales: scales.as_ptr().add(2 * (j * n_blocks + k0)),
                offsets: if offsets.is_empty() { std::ptr::null() } else { offsets.as_ptr().add((j * n_blocks + k0) * per_block) },
                out: out.ptr.add(j * out.ld + g),
                ld: out.ld,
                accumulate: out.accumulate,
                live,
                ahead: Ahead::new(next, next_bytes, k, n_tiles, k1 - k0),
            };
            run_tiles::<F, D, BLOCK, true>(n_act, wide, false, tile);
        }
    }
    PARTIAL.set(partial);
}

/// One group's (or chunk's) tiles: the activation rows `wide` at a time, then one at a
/// time, tile `k` of rows from `j` made by `tile(j, k)`; the next group's lines into L2
/// if `l2`, else into L1.
#[inline(always)]
unsafe fn run_tiles<F: Fam32, D: DotU8I8 + Shape, const BLOCK: bool, const CHUNKED: bool>(n_act: usize, wide: usize, l2: bool, tile: impl Fn(usize, usize) -> Tile) {
    macro_rules! tile {
        ($ra:literal, $j:expr, $k:expr) => {
            match (BLOCK, l2) {
                (true, true) => tile_block::<F, D, $ra, true, CHUNKED>(tile($j, $k)),
                (true, false) => tile_block::<F, D, $ra, false, CHUNKED>(tile($j, $k)),
                (false, true) => tile_lanes::<F, D, $ra, true, CHUNKED>(tile($j, $k)),
                (false, false) => tile_lanes::<F, D, $ra, false, CHUNKED>(tile($j, $k)),
            }
        };
    }
    let (mut j, mut k) = (0, 0);
    while wide > 1 && n_act - j >= wide {
        match wide {
            2 => tile!(2, j, k),
            3 => tile!(3, j, k),
            _ => tile!(4, j, k),
        }
        j += wide;
        k += 1;
    }
    while j < n_act {
        tile!(1, j, k);
        j += 1;
        k += 1;
    }
}

/// The lines of the next weight group a tile asks for, one per block: at block `b < count`,
/// the line at `at + b · stride`. The count is worked out once per tile, so a block pays one
/// compare (testing the pointer and the group's end at every block cost ~6% of a 16-row
/// product).
#[derive(Clone, Copy)]
pub(super) struct Ahead {
    at: *const u8,
    stride: usize,
    count: usize,
}

/// Tiles per group up to which the next group is fetched into L2: a group of few tiles is
/// done sooner than L1 prefetches arrive, and they hold the miss buffers its own loads
/// need (4 rows streamed, K = 576: Q4_1 ~80 -> 89 GMAC/s, Q8_0 ~47 -> 71); with more
/// tiles L1 is better (16 rows: Q4_1 92 against 85).
const L2_FETCH_MAX_TILES: usize = 3;

impl Ahead {
    /// Nothing to fetch.
    pub(super) const NONE: Ahead = Ahead { at: std::ptr::null(), stride: 0, count: 0 };

    /// Tile `k`'s share (every `tiles`-th line) of the `bytes` at `next` (none if null), at
    /// most one line per block of its `n_blocks`.
    pub(super) fn new(next: *const u8, bytes: usize, k: usize, tiles: usize, n_blocks: usize) -> Ahead {
        let lines = bytes.div_ceil(64);
        let count = if next.is_null() || k >= lines { 0 } else { (lines - k).div_ceil(tiles).min(n_blocks) };
        Ahead { at: next.wrapping_add(64 * k), stride: 64 * tiles, count }
    }

    /// At block `b`, its line: into L2 if `L2`, else into L1.
    #[inline(always)]
    pub(super) unsafe fn fetch<const L2: bool>(self, b: usize) {
        if b < self.count {
            let p = self.at.wrapping_add(b * self.stride) as *const i8;
            if L2 {
                _mm_prefetch::<_MM_HINT_T1>(p);
            } else {
                _mm_prefetch::<_MM_HINT_T0>(p);
            }
        }
    }
}
