//! Work shared out in chunks among a node's threads, with stealing ([`NodeWorker::claim`]).
//!
//! Each thread starts on its own even share of the items (the share [`NodeWorker::share`]
//! would give it) and takes it a chunk at a time; once its share is done it takes chunks
//! from what is left of the others'. A thread that runs slower (a busy core, a smaller
//! core, another process) then finishes fewer chunks, and the node's threads reach their
//! next barrier together instead of waiting for the slowest. Which thread computes an item
//! never changes the item's result.
//!
//! Each share has a cursor: the chunks taken from it so far, tagged with the epoch of the
//! claiming loop (the pool run and the loop's index in it). The owner resets its cursor
//! when its loop starts; the others take chunks only from a cursor of their own epoch, so
//! a share whose owner has not started yet is left to it. Cursors are reused round-robin
//! by [`SLOTS`] loops in a row, so at most that many loops may run between two barriers.
//!
//! [`NodeWorker::claim`]: super::NodeWorker::claim
//! [`NodeWorker::share`]: super::NodeWorker::share

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::pool::split_range;

/// Claiming loops that may run between two barriers of a node.
pub const SLOTS: usize = 4;
/// Chunks each share is cut into: enough that a faster thread's help evens out the end.
const CHUNKS: usize = 16;
/// Bits of a cursor that count chunks taken; the rest hold the epoch.
const COUNT_BITS: u32 = 8;
const _: () = assert!(CHUNKS < 1 << COUNT_BITS);

/// One share's cursor, alone on its cache lines (the owner updates it at every chunk).
#[repr(align(128))]
#[derive(Default)]
pub(super) struct Cursor(AtomicU64);

/// The epoch of loop `index` of pool run `run`: distinct for every loop of a run and from
/// the loops of the runs before it.
pub(super) fn epoch(run: usize, index: u32) -> u64 {
    (((run as u64) << 16) | u64::from(index & 0xffff)) & (u64::MAX >> COUNT_BITS)
}

/// The ranges of `0..n` one thread computes: see the module docs.
pub struct Claims<'a> {
    /// This loop's cursors, one per thread of the node.
    cursors: &'a [Cursor],
    epoch: u64,
    n: usize,
    align: usize,
    /// Fewest units of `align` items in a chunk.
    min_chunk: usize,
    me: usize,
    /// The share being taken, as an offset from `me`; all are done at `cursors.len()`.
    turn: usize,
}

impl<'a> Claims<'a> {
    /// Start thread `me`'s loop over `0..n` in chunks aligned to `align` and at least
    /// `min_chunk` items long, resetting its own cursor to `epoch`.
    pub(super) fn start(cursors: &'a [Cursor], epoch: u64, n: usize, align: usize, min_chunk: usize, me: usize) -> Claims<'a> {
        cursors[me].0.store(epoch << COUNT_BITS, Ordering::Release);
        let align = align.max(1);
        Claims { cursors, epoch, n, align, min_chunk: min_chunk.div_ceil(align).max(1), me, turn: 0 }
    }

    /// The next chunk of thread `t`'s share, if it has started and has one left.
    fn take_chunk(&self, t: usize) -> Option<Range<usize>> {
        let threads = self.cursors.len();
        let share = split_range(self.n.div_ceil(self.align), 1, t, threads);
        let chunk = if threads == 1 { share.len() } else { share.len().div_ceil(CHUNKS).max(self.min_chunk) }.max(1);
        let chunks = share.len().div_ceil(chunk) as u64;
        let cursor = &self.cursors[t].0;
        let mut seen = cursor.load(Ordering::Acquire);
        loop {
            let taken = seen & ((1 << COUNT_BITS) - 1);
            if seen >> COUNT_BITS != self.epoch || taken >= chunks {
                return None;
            }
            match cursor.compare_exchange_weak(seen, seen + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let first = share.start + taken as usize * chunk;
                    let end = (first + chunk).min(share.end);
                    return Some((first * self.align).min(self.n)..(end * self.align).min(self.n));
                }
                Err(now) => seen = now,
            }
        }
    }
}

impl Iterator for Claims<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        let threads = self.cursors.len();
        while self.turn < threads {
            if let Some(r) = self.take_chunk((self.me + self.turn) % threads) {
                return Some(r);
            }
            self.turn += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::super::{NodePool, Topology};
    use super::SLOTS;

    /// Every item of every loop is claimed by exactly one thread of its node, in aligned
    /// chunks, over many runs of three loops between barriers (as the q, k and v
    /// projections run), on uneven node layouts.
    #[test]
    fn each_item_goes_to_one_thread() {
        for layout in [&[1usize][..], &[2], &[3], &[2, 1, 3]] {
            let pool = NodePool::new(&Topology::simulated(layout.len()), layout).unwrap();
            let sizes = [0usize, 1, 7, 8, 100, 1000];
            for _run in 0..20 {
                let counts: Vec<Vec<AtomicU32>> = (0..layout.len() * sizes.len() * 3).map(|_| (0..1000).map(|_| AtomicU32::new(0)).collect()).collect();
                pool.run(|w| {
                    for (s, &n) in sizes.iter().enumerate() {
                        for l in 0..3 {
                            let seen = &counts[(w.node * sizes.len() + s) * 3 + l];
                            for r in w.claim(n, 8, 1) {
                                assert!(r.start % 8 == 0 && r.end <= n && !r.is_empty(), "{r:?} of {n}");
                                r.for_each(|i| {
                                    seen[i].fetch_add(1, Ordering::Relaxed);
                                });
                            }
                        }
                        w.group_barrier();
                    }
                });
                for (k, seen) in counts.iter().enumerate() {
                    let n = sizes[k / 3 % sizes.len()];
                    assert!(seen.iter().enumerate().all(|(i, c)| c.load(Ordering::Relaxed) == u32::from(i < n)), "{layout:?} loop {k}");
                }
            }
        }
    }

    /// A thread that computes slowly is helped: the others take most of its share. The slow
    /// thread is held in its first chunk until the others have done every other item (a
    /// thread on a very busy core), rather than slowed by a fixed sleep, so the outcome
    /// depends on no thread being scheduled in time: a busy machine only delays it.
    #[test]
    fn a_slow_thread_is_helped() {
        let pool = NodePool::new(&Topology::simulated(1), &[3]).unwrap();
        let n = 3 * 64;
        let started = AtomicUsize::new(0);
        let done_by_slow = AtomicUsize::new(0);
        let total = AtomicUsize::new(0);
        // Only if nobody helps: then the slow thread does its whole share after this.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        pool.run(|w| {
            let claims = w.claim(n, 1, 1);
            // The others take chunks of a share only once its owner has started the loop,
            // which a thread scheduled late may not have yet.
            started.fetch_add(1, Ordering::AcqRel);
            while started.load(Ordering::Acquire) < 3 {
                std::thread::yield_now();
            }
            for r in claims {
                if w.tid_in_node == 0 {
                    while total.load(Ordering::Acquire) + r.len() < n && std::time::Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    done_by_slow.fetch_add(r.len(), Ordering::Relaxed);
                }
                total.fetch_add(r.len(), Ordering::AcqRel);
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), n);
        // Its own share is 64 items in 16 chunks of 4; the others finish theirs and take
        // what is left of it while it holds its first.
        assert!(done_by_slow.load(Ordering::Relaxed) < 32, "the slow thread did {} of its 64", done_by_slow.load(Ordering::Relaxed));
    }

    /// More loops between two barriers than there are cursor slots is refused.
    #[test]
    fn too_many_loops_between_barriers_panic() {
        let pool = NodePool::new(&Topology::simulated(1), &[2]).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(|w| {
                for _ in 0..=SLOTS {
                    w.claim(10, 1, 1).for_each(drop);
                }
            })
        }));
        assert!(r.is_err());
    }
}
