//! How a product cuts its activation rows into panels, from the cache sizes the CPU
//! reports: when the rows overflow one core's share of L2, they go in panels that fill at
//! most half of it, so while a claimed range of weight groups runs against a panel it stays
//! in L2 (the weight group in use stays in L1). Otherwise each group would stream every
//! row from L3 or memory: a long prompt of a wide matrix (1024 rows of 1536 columns, 1.7 MB
//! of activations) measured ~15% slower per row than 64 rows. Rows that fit stay whole: a
//! split costs a second pass over the weights, and 512 rows of 1536 columns (0.85 of a
//! 1 MiB L2) in two panels measured 4-5% slower in SmolLM2's pp512 on AVX-512. When there
//! are several panels, a claimed range of weight rows goes in blocks that fill at most half
//! of a core's share of L3, so the panels after the first read its weights from L3, not
//! from memory. Kernels that take weight rows a chunk at a time against every activation
//! tile (the k-quants' row-major kernels) size the chunk to half of L1
//! ([`chunk_rows`]), and the float kernels theirs to an eighth of L2; the 32-element
//! formats' AVX2 tiles cut a weight group too long for L1 into chunks of blocks of half of
//! it ([`k_chunk_blocks`], the k-cut). Panels, blocks and chunks change which order the
//! tiles run in, never a result's bits.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// L2 bytes one core can count on when the CPU does not say (the smallest L2 of current
/// x86 and ARM cores).
const FALLBACK_L2: usize = 256 << 10;

/// The fewest rows a panel takes (a multiple of every tile's row count: 2, 3 and 4), so
/// a very wide matrix still fills whole tiles.
pub const MIN_PANEL_ROWS: usize = 12;

/// L3 bytes per core when the CPU does not say.
const FALLBACK_L3: usize = 1 << 20;

/// L1 data bytes when the CPU does not say (every x86 core since 2003 and ARM's big cores
/// have at least this).
const FALLBACK_L1: usize = 32 << 10;

/// 0 until first read, then the L1 data, L2 and L3 bytes per core the chunks, panels and
/// blocks are sized for.
static L1_BYTES: AtomicUsize = AtomicUsize::new(0);
static L2_BYTES: AtomicUsize = AtomicUsize::new(0);
static L3_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The L1 data bytes of a core the weight chunks are sized for, as [`l2_bytes`]
/// (fallback 32 KiB).
pub fn l1_bytes() -> usize {
    cached(&L1_BYTES, 1, FALLBACK_L1)
}

/// The L2 bytes per core the panels are sized for: CPU 0's L2 divided among the CPUs that
/// share it ([`crate::cpu::caches`]), or a fallback of 256 KiB where Linux does not say.
pub fn l2_bytes() -> usize {
    cached(&L2_BYTES, 2, FALLBACK_L2)
}

/// The L3 bytes per core the weight blocks are sized for, as [`l2_bytes`] (fallback 1 MiB).
pub fn l3_bytes() -> usize {
    cached(&L3_BYTES, 3, FALLBACK_L3)
}

fn cached(slot: &AtomicUsize, level: u32, fallback: usize) -> usize {
    match slot.load(Ordering::Relaxed) {
        0 => {
            let found = detect(level).unwrap_or(fallback);
            slot.store(found, Ordering::Relaxed);
            found
        }
        bytes => bytes,
    }
}

/// The CPU's own figure for a cache level (its data or unified cache), per core: at
/// least 16 KiB for L1 and 64 KiB for the others.
fn detect(level: u32) -> Option<usize> {
    let least = if level == 1 { 16 << 10 } else { 64 << 10 };
    crate::cpu::caches()
        .iter()
        .find(|c| c.level == level && c.kind != "Instruction")
        .map(|c| (c.bytes as usize / c.shared_by.max(1)).max(least))
}

/// Size the panels for an L2 of `bytes` per core instead of the CPU's own (benchmarks
/// and tests of other machines' tilings; results do not change).
pub fn set_l2_bytes(bytes: usize) {
    L2_BYTES.store(bytes.max(1), Ordering::Relaxed);
}

/// Size the weight blocks for an L3 of `bytes` per core, as [`set_l2_bytes`].
pub fn set_l3_bytes(bytes: usize) {
    L3_BYTES.store(bytes.max(1), Ordering::Relaxed);
}

/// Size the weight chunks for an L1 of `bytes`, as [`set_l2_bytes`].
pub fn set_l1_bytes(bytes: usize) {
    L1_BYTES.store(bytes.max(1), Ordering::Relaxed);
}

/// Weight rows of `row_bytes` each per chunk of a kernel that runs every activation tile
/// over a chunk before the next: as many as fill `cache_bytes / 2` (half of L1 for the
/// quantized kernels, whose tiles' activation rows and accumulators take the other
/// half), at least one.
pub fn chunk_rows(row_bytes: usize, cache_bytes: usize) -> usize {
    (cache_bytes / 2 / row_bytes.max(1)).max(1)
}

/// Blocks per chunk of a tile's dot products (the k-cut), for weight groups of
/// `group_block_bytes` per block and tiles of `tile_rows` activation rows of
/// `act_block_bytes` per block. All `n_blocks` when a group and a tile's rows fit in `l1`;
/// else chunks of them that fill at most half of it, so that a group's chunk stays in L1
/// while every tile of the group runs over it: the fewest even chunks, at least a block
/// each.
pub fn k_chunk_blocks(n_blocks: usize, group_block_bytes: usize, act_block_bytes: usize, tile_rows: usize, l1: usize) -> usize {
    let per_block = (group_block_bytes + tile_rows * act_block_bytes).max(1);
    if n_blocks.saturating_mul(per_block) <= l1 {
        return n_blocks.max(1);
    }
    let fit = (l1 / 2 / per_block).max(1);
    n_blocks.div_ceil(n_blocks.div_ceil(fit))
}

/// Activation rows of `row_bytes` each that a panel takes when `l2` bytes of L2 are a
/// core's and the rows overflow it: half of it, in whole multiples of [`MIN_PANEL_ROWS`],
/// at least that many.
pub fn panel_rows(row_bytes: usize, l2: usize) -> usize {
    let fit = l2 / 2 / row_bytes.max(1);
    (fit - fit % MIN_PANEL_ROWS).max(MIN_PANEL_ROWS)
}

/// The rows per panel for `n_rows` activation rows of `row_bytes` each: all of them when
/// they fit in `l2`, else [`panel_rows`].
pub fn panel_for(n_rows: usize, row_bytes: usize, l2: usize) -> usize {
    if n_rows.saturating_mul(row_bytes) <= l2 {
        n_rows.max(1)
    } else {
        panel_rows(row_bytes, l2)
    }
}

/// Weight rows of `row_bytes` each per block of a claimed range, for a product whose
/// `n_act` activation rows go in panels of `panel`: all of them with one panel (each
/// weight is read once anyway), else as many as fill half of `l3`, a multiple of `align`
/// and at least that.
pub fn weight_block_rows(n_act: usize, panel: usize, row_bytes: usize, align: usize, l3: usize) -> usize {
    if panel >= n_act {
        return usize::MAX;
    }
    let fit = l3 / 2 / row_bytes.max(1);
    (fit - fit % align.max(1)).max(align.max(1))
}

/// `rows` in blocks of `block` rows (the last one shorter).
pub fn blocks(rows: Range<usize>, block: usize) -> impl Iterator<Item = Range<usize>> {
    let end = rows.end;
    (rows.start..rows.end).step_by(block.max(1)).map(move |s| s..s.saturating_add(block).min(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panels_fill_half_of_l2_in_whole_tiles() {
        // SmolLM2's feed-forward input (576 columns as Q8_1: 648 bytes a row), 1 MiB L2.
        assert_eq!(panel_rows(648, 1 << 20), 804);
        // Its down projection's (1536 columns: 1728 bytes), a Zen 2's 512 KiB.
        assert_eq!(panel_rows(1728, 512 << 10), 144);
        // A 7B model's down projection (11008 columns: 12384 bytes) on a 256 KiB L2.
        assert_eq!(panel_rows(12384, 256 << 10), MIN_PANEL_ROWS);
        for (row, l2) in [(648, 1 << 20), (1728, 512 << 10), (36, 32 << 10), (100_000, 1 << 20)] {
            let p = panel_rows(row, l2);
            assert!(p.is_multiple_of(MIN_PANEL_ROWS) && p >= MIN_PANEL_ROWS);
            assert!(p == MIN_PANEL_ROWS || p * row <= l2 / 2, "{row} {l2}: {p}");
        }
    }

    #[test]
    fn rows_that_fit_in_l2_stay_whole() {
        // SmolLM2's pp512: the down projection's 885 KB of activations fit a 1 MiB L2...
        assert_eq!(panel_for(512, 1728, 1 << 20), 512);
        // ...not a Zen 2's 512 KiB, nor 2048 rows in 1 MiB.
        assert_eq!(panel_for(512, 1728, 512 << 10), 144);
        assert_eq!(panel_for(2048, 1728, 1 << 20), 300);
        assert_eq!(panel_for(0, 1728, 1 << 20), 1);
    }

    #[test]
    fn weight_blocks_fill_half_of_l3_only_past_one_panel() {
        assert_eq!(weight_block_rows(512, 512, 864, 8, 16 << 20), usize::MAX);
        // 1536-wide Q4_1 rows (864 bytes) in half of 16 MiB: 9709 rows, in groups of 8.
        assert_eq!(weight_block_rows(2048, 804, 864, 8, 16 << 20), 9704);
        assert_eq!(weight_block_rows(2048, 804, 1 << 30, 8, 16 << 20), 8);
        let parts: Vec<_> = blocks(16..61, 16).collect();
        assert_eq!(parts, [16..32, 32..48, 48..61]);
        assert_eq!(blocks(0..100, usize::MAX).collect::<Vec<_>>(), vec![0..100]);
    }

    #[test]
    fn chunks_fill_half_of_their_cache() {
        // A 576-wide Q4_K row (2 super-blocks, 288 bytes) in half of a 32 KiB L1: 56 rows.
        assert_eq!(chunk_rows(288, 32 << 10), 56);
        // A 48 KiB L1 (Intel's since Ice Lake) takes half as many again.
        assert_eq!(chunk_rows(288, 48 << 10), 85);
        // A row wider than the cache: one at a time.
        assert_eq!(chunk_rows(100_000, 32 << 10), 1);
    }

    /// A group and a tile's rows that fit in L1 stay whole (every matrix of SmolLM2, Q4_1
    /// against Q8_1 rows two at a time: 576 and 1536 columns); longer ones go in the fewest
    /// even chunks of at most half of it (14336 columns: 448 blocks of 232 bytes, 70 to a
    /// half of 32 KiB, so seven chunks of 64).
    #[test]
    fn groups_too_long_for_l1_go_in_even_chunks() {
        let (group_block, act_block) = (8 * 20, 36);
        for blocks in [18, 48, 137] {
            assert_eq!(k_chunk_blocks(blocks, group_block, act_block, 2, 32 << 10), blocks);
        }
        assert_eq!(k_chunk_blocks(448, group_block, act_block, 2, 32 << 10), 64);
        for l1 in [1 << 10, 8 << 10, 48 << 10] {
            for blocks in [1, 5, 100, 449] {
                let chunk = k_chunk_blocks(blocks, group_block, act_block, 2, l1);
                assert!((1..=blocks).contains(&chunk));
                if chunk < blocks {
                    assert!(chunk == 1 || chunk * (group_block + 2 * act_block) <= l1 / 2, "{blocks} blocks, {l1} bytes");
                    // Even: the last chunk is at most one block shorter than the others'
                    // share would be.
                    assert!(blocks.div_ceil(chunk) * chunk - blocks < blocks.div_ceil(chunk));
                }
            }
        }
    }

    #[test]
    fn this_cpus_caches_are_read() {
        let l1 = detect(1).expect("Linux reports an L1 data cache for CPU 0");
        assert!((16 << 10..=4 << 20).contains(&l1), "{l1}");
        let l2 = detect(2).expect("Linux reports an L2 for CPU 0");
        assert!((64 << 10..=64 << 20).contains(&l2), "{l2}");
        assert!(l3_bytes() >= 64 << 10);
    }
}
