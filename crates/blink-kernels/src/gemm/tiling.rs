//! How a product cuts its activation rows into panels, from the cache sizes the CPU
//! reports: when the rows overflow one core's share of L2, they go in panels that fill at
//! most half of it, so while a claimed range of weight groups runs against a panel it stays
//! in L2 (the weight group in use stays in L1). Otherwise each group would stream every
//! row from L3 or memory: a long prompt of a wide matrix (1024 rows of 1536 columns, 1.7 MB
//! of activations) measured ~15% slower per row than 64 rows. Rows that fit stay whole: a
//! split costs a second pass over the weights, and 512 rows of 1536 columns (0.85 of a
//! 1 MiB L2) in two panels measured 4-5% slower in SmolLM2's pp512 on AVX-512. Panels change
//! which order the tiles run in, never a result's bits.

use std::sync::atomic::{AtomicUsize, Ordering};

/// L2 bytes one core can count on when the CPU does not say (the smallest L2 of current
/// x86 and ARM cores).
const FALLBACK_L2: usize = 256 << 10;

/// The fewest rows a panel takes (a multiple of every tile's row count: 2, 3 and 4), so
/// a very wide matrix still fills whole tiles.
pub const MIN_PANEL_ROWS: usize = 12;

/// 0 until first read, then the L2 bytes per core the panels are sized for.
static L2_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The L2 bytes per core the panels are sized for: CPU 0's L2 divided among the CPUs that
/// share it ([`crate::cpu::caches`]), or a fallback of 256 KiB where Linux does not say.
pub fn l2_bytes() -> usize {
    match L2_BYTES.load(Ordering::Relaxed) {
        0 => {
            let found = detect();
            L2_BYTES.store(found, Ordering::Relaxed);
            found
        }
        bytes => bytes,
    }
}

/// The CPU's own figure (see [`l2_bytes`]).
fn detect() -> usize {
    crate::cpu::caches()
        .iter()
        .find(|c| c.level == 2 && c.kind != "Instruction")
        .map_or(FALLBACK_L2, |c| (c.bytes as usize / c.shared_by.max(1)).max(64 << 10))
}

/// Size the panels for an L2 of `bytes` per core instead of the CPU's own (benchmarks
/// and tests of other machines' tilings; results do not change).
pub fn set_l2_bytes(bytes: usize) {
    L2_BYTES.store(bytes.max(1), Ordering::Relaxed);
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
    fn this_cpus_l2_is_read() {
        let l2 = detect();
        assert!((64 << 10..=64 << 20).contains(&l2), "{l2}");
    }
}
