//! A thread pool with one pinned thread group per NUMA node.
//!
//! [`NodePool::run`] hands the same closure to every thread of every node (SPMD, as
//! [`crate::pool::ThreadPool::run`] does; the caller is node 0's thread 0). Threads are
//! numbered node-major: node 0's threads first, then node 1's, and so on. A thread knows its
//! node, its index within the node and its global index ([`NodeWorker`]), and meets others
//! at two barriers: [`NodeWorker::group_barrier`] among the threads of its node only, and
//! [`NodeWorker::global_barrier`] among all threads, done in two levels so that only one
//! representative per node touches the shared cross-node counter: a node's threads gather
//! at their node's barrier, the last to arrive meets the other nodes' representatives, and
//! then releases its node. Nothing is allocated per run.

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use crate::park::{Parking, SPINS};

use super::claim::{self, Claims, Cursor};

use super::topology::Topology;
use super::NumaError;
use crate::pool::{split_range, ThreadPool};

/// Spins before yielding when threads outnumber the CPUs they may use (e.g. simulated nodes
/// on a small machine): spinning would only keep the awaited thread off its CPU.
const SPINS_OVERSUBSCRIBED: u32 = 1 << 6;

/// A spin-then-park barrier (see `park`) whose last arriver can do work before releasing
/// the others.
///
/// Aligned to two cache lines so the barriers of different nodes never share one.
#[repr(align(128))]
struct Gate {
    arrived: AtomicUsize,
    generation: AtomicUsize,
    spins: u32,
    parking: Parking,
}

impl Gate {
    fn new(spins: u32) -> Gate {
        Gate { arrived: AtomicUsize::new(0), generation: AtomicUsize::new(0), spins, parking: Parking::new() }
    }

    /// Wait until `n` threads have arrived; the last one runs `last` first, while the
    /// others are still held, then releases them.
    #[inline]
    fn wait_then(&self, n: usize, last: impl FnOnce()) {
        if n <= 1 {
            last();
            return;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == n {
            self.arrived.store(0, Ordering::Relaxed);
            last();
            self.parking.bump(&self.generation);
            return;
        }
        self.parking.wait_for_change(&self.generation, generation, self.spins);
    }
}

/// Where one thread of the pool sits.
#[derive(Clone, Copy)]
struct Seat {
    node: usize,
    tid_in_node: usize,
}

/// The view of a [`NodePool`] that a running closure gets.
pub struct NodeWorker<'a> {
    /// Index of this thread's node, `0..n_nodes` (an index into the topology's nodes).
    pub node: usize,
    /// This thread's index within its node, `0..threads_in_node`.
    pub tid_in_node: usize,
    /// Threads of this node.
    pub threads_in_node: usize,
    /// Nodes taking part.
    pub n_nodes: usize,
    /// This thread's index over all nodes, `0..n_threads` (node-major).
    pub global_tid: usize,
    /// Threads over all nodes.
    pub n_threads: usize,
    group: &'a Gate,
    top: &'a Gate,
    /// This node's claim cursors, [`claim::SLOTS`] sets of one per thread.
    cursors: &'a [Cursor],
    /// The pool run, and the claiming loops this thread has started in it and since its
    /// last barrier.
    run: usize,
    loops: Cell<u32>,
    loops_since_barrier: Cell<usize>,
}

impl NodeWorker<'_> {
    /// Wait until every thread of this node has reached the same barrier. Other nodes are
    /// not involved.
    #[inline]
    pub fn group_barrier(&self) {
        self.loops_since_barrier.set(0);
        self.group.wait_then(self.threads_in_node, || {});
    }

    /// Wait until every thread of every node has reached the same barrier. Writes made by
    /// any thread before it are visible to all threads after it.
    #[inline]
    pub fn global_barrier(&self) {
        self.loops_since_barrier.set(0);
        let (top, n_nodes) = (self.top, self.n_nodes);
        self.group.wait_then(self.threads_in_node, || top.wait_then(n_nodes, || {}));
    }

    /// This thread's share of `0..n` among the threads of its node, in contiguous chunks
    /// whose boundaries fall on multiples of `align`.
    #[inline]
    pub fn share(&self, n: usize, align: usize) -> Range<usize> {
        split_range(n, align, self.tid_in_node, self.threads_in_node)
    }

    /// The ranges of `0..n` (boundaries on multiples of `align`) this thread computes in a
    /// loop the node's threads share: its own share first, in chunks of at least
    /// `min_chunk` items, then chunks of the others' that are left (see [`claim`]). Every
    /// item goes to exactly one thread.
    /// Every thread of the node must run the loop (all the same loops, in the same order),
    /// and at most [`claim::SLOTS`] such loops may run between two barriers.
    pub fn claim(&self, n: usize, align: usize, min_chunk: usize) -> Claims<'_> {
        let index = self.loops.get();
        self.loops.set(index.wrapping_add(1));
        let since = self.loops_since_barrier.get() + 1;
        self.loops_since_barrier.set(since);
        assert!(since <= claim::SLOTS, "more claiming loops between two barriers than cursor slots");
        let slot = index as usize % claim::SLOTS;
        let cursors = &self.cursors[slot * self.threads_in_node..(slot + 1) * self.threads_in_node];
        Claims::start(cursors, claim::epoch(self.run, index), n, align, min_chunk, self.tid_in_node)
    }

    /// This node's share of `0..n` among the nodes (e.g. its tensor-parallel slice).
    #[inline]
    pub fn node_share(&self, n: usize, align: usize) -> Range<usize> {
        split_range(n, align, self.node, self.n_nodes)
    }

    /// This thread's share of `0..n` among all threads of all nodes.
    #[inline]
    pub fn global_share(&self, n: usize, align: usize) -> Range<usize> {
        split_range(n, align, self.global_tid, self.n_threads)
    }
}

/// Threads grouped by NUMA node, each group pinned to its node's CPUs.
pub struct NodePool {
    pool: ThreadPool,
    /// One barrier per node.
    groups: Box<[Gate]>,
    /// Claim cursors per node ([`NodeWorker::claim`]).
    cursors: Box<[Box<[Cursor]>]>,
    /// The barrier the nodes' representatives meet at.
    top: Gate,
    /// Per global thread index.
    seats: Box<[Seat]>,
    /// Threads per node.
    sizes: Box<[usize]>,
    /// First global thread index of each node.
    starts: Box<[usize]>,
    /// OS id and CPUs of each node.
    ids: Box<[usize]>,
    cpus: Box<[Vec<usize>]>,
}

impl NodePool {
    /// A pool with `threads_per_node[i]` threads (at least one) for node index `i` of
    /// `topology`, each pinned to that node's CPUs where the OS allows. The caller of
    /// [`NodePool::run`] is node 0's thread 0 and is not pinned: see [`NodePool::pin_caller`].
    pub fn new(topology: &Topology, threads_per_node: &[usize]) -> Result<NodePool, NumaError> {
        Self::build(topology, threads_per_node, true)
    }

    /// Like [`NodePool::new`], but every thread is the pool's own (node 0's thread 0 too),
    /// so the caller is free while it computes: see [`NodePool::run_beside`].
    pub fn detached(topology: &Topology, threads_per_node: &[usize]) -> Result<NodePool, NumaError> {
        Self::build(topology, threads_per_node, false)
    }

    fn build(topology: &Topology, threads_per_node: &[usize], caller_works: bool) -> Result<NodePool, NumaError> {
        let nodes = topology.nodes();
        if threads_per_node.len() != nodes.len() {
            return Err(NumaError::ThreadCount { got: threads_per_node.len(), expected: nodes.len() });
        }
        if let Some(empty) = threads_per_node.iter().position(|&t| t == 0) {
            return Err(NumaError::EmptyGroup(empty));
        }
        let seats: Box<[Seat]> = threads_per_node
            .iter()
            .enumerate()
            .flat_map(|(node, &count)| (0..count).map(move |tid_in_node| Seat { node, tid_in_node }))
            .collect();
        let starts = threads_per_node.iter().scan(0, |next, &count| Some(std::mem::replace(next, *next + count))).collect();
        let cpus: Box<[Vec<usize>]> = nodes.iter().map(|n| n.cpus.clone()).collect();
        let oversubscribed = seats.len() > topology.n_cpus()
            || nodes.iter().zip(threads_per_node).any(|(node, &count)| count > node.cpus.len());
        let spins = if oversubscribed { SPINS_OVERSUBSCRIBED } else { SPINS };
        let pool = {
            let (seats, cpus) = (&seats, &cpus);
            let cpus_of = |tid: usize| seats.get(tid).map(|s| cpus[s.node].clone());
            if caller_works {
                ThreadPool::with_affinity(seats.len(), cpus_of)
            } else {
                ThreadPool::detached(seats.len(), cpus_of)
            }
        }
        .map_err(NumaError::Spawn)?;
        Ok(NodePool {
            pool,
            groups: nodes.iter().map(|_| Gate::new(spins)).collect(),
            cursors: threads_per_node.iter().map(|&t| (0..t * claim::SLOTS).map(|_| Cursor::default()).collect()).collect(),
            top: Gate::new(spins),
            seats,
            sizes: threads_per_node.into(),
            starts,
            ids: nodes.iter().map(|n| n.id).collect(),
            cpus,
        })
    }

    /// One thread per CPU of each node.
    pub fn one_per_cpu(topology: &Topology) -> Result<NodePool, NumaError> {
        let counts: Vec<usize> = topology.nodes().iter().map(|n| n.cpus.len()).collect();
        NodePool::new(topology, &counts)
    }

    /// Pin the calling thread to node 0's CPUs, as the pool's own threads are pinned to
    /// theirs. Call it from the thread that will call [`NodePool::run`]; returns whether
    /// the OS accepted it.
    pub fn pin_caller(&self) -> bool {
        crate::affinity::pin_current_thread(&self.cpus[0])
    }

    /// Nodes in the pool.
    pub fn n_nodes(&self) -> usize {
        self.sizes.len()
    }

    /// Threads over all nodes, the caller included.
    pub fn n_threads(&self) -> usize {
        self.seats.len()
    }

    /// Threads of the node at `node`, if there is one.
    pub fn threads_in_node(&self, node: usize) -> Option<usize> {
        self.sizes.get(node).copied()
    }

    /// Global thread indices of the node at `node` (empty if there is none).
    pub fn node_threads(&self, node: usize) -> Range<usize> {
        match (self.starts.get(node), self.sizes.get(node)) {
            (Some(&start), Some(&size)) => start..start + size,
            _ => 0..0,
        }
    }

    /// OS id of the node at `node`, if there is one.
    pub fn node_id(&self, node: usize) -> Option<usize> {
        self.ids.get(node).copied()
    }

    /// CPUs the threads of the node at `node` are pinned to (empty if there is none).
    pub fn cpus(&self, node: usize) -> &[usize] {
        self.cpus.get(node).map_or(&[], |c| c.as_slice())
    }

    /// Run `f` on every thread of every node (the caller is node 0's thread 0) and wait
    /// for all. A panic in any thread is re-raised here once all have finished.
    ///
    /// Every thread of a node must pass the same sequence of group and global barriers.
    pub fn run<F: Fn(&NodeWorker) + Sync>(&self, f: F) {
        self.pool.run(|w| f(&self.seat(w)));
    }

    /// Start `f` on every thread, run `beside` on the calling thread meanwhile, and wait;
    /// see [`ThreadPool::run_beside`]. Returns `beside`'s result and how long `f` took.
    pub fn run_beside<F: Fn(&NodeWorker) + Sync, R>(&self, f: F, beside: impl FnOnce() -> R) -> (R, std::time::Duration) {
        self.pool.run_beside(|w| f(&self.seat(w)), beside)
    }

    /// The node-level view of pool thread `w`.
    #[inline]
    fn seat<'a>(&'a self, w: &crate::pool::Worker) -> NodeWorker<'a> {
        let Seat { node, tid_in_node } = self.seats[w.tid];
        NodeWorker {
            node,
            tid_in_node,
            threads_in_node: self.sizes[node],
            n_nodes: self.sizes.len(),
            global_tid: w.tid,
            n_threads: w.n_threads,
            group: &self.groups[node],
            top: &self.top,
            cursors: &self.cursors[node],
            run: w.run,
            loops: Cell::new(0),
            loops_since_barrier: Cell::new(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::SharedMut;
    use std::sync::atomic::AtomicU64;

    /// Uneven pools over 1, 2 and 3 simulated nodes.
    const LAYOUTS: &[&[usize]] = &[&[1], &[3], &[2, 1], &[1, 3], &[2, 1, 3], &[1, 1, 1]];

    fn pool(layout: &[usize]) -> NodePool {
        NodePool::new(&Topology::simulated(layout.len()), layout).unwrap()
    }

    #[test]
    fn every_thread_has_a_distinct_seat() {
        for &layout in LAYOUTS {
            let p = pool(layout);
            let total: usize = layout.iter().sum();
            assert_eq!((p.n_nodes(), p.n_threads()), (layout.len(), total));
            let hits: Vec<AtomicU64> = (0..total).map(|_| AtomicU64::new(0)).collect();
            p.run(|w| {
                assert_eq!(w.n_nodes, layout.len());
                assert_eq!(w.n_threads, total);
                assert_eq!(w.threads_in_node, layout[w.node]);
                assert!(w.tid_in_node < w.threads_in_node);
                assert_eq!(w.global_tid, layout[..w.node].iter().sum::<usize>() + w.tid_in_node);
                assert!(p.node_threads(w.node).contains(&w.global_tid));
                hits[w.global_tid].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{layout:?}");
        }
    }

    #[test]
    fn bad_layouts_are_errors() {
        let t = Topology::simulated(2);
        assert!(matches!(NodePool::new(&t, &[1]), Err(NumaError::ThreadCount { got: 1, expected: 2 })));
        assert!(matches!(NodePool::new(&t, &[1, 0]), Err(NumaError::EmptyGroup(1))));
        let p = NodePool::one_per_cpu(&t).unwrap();
        assert_eq!(p.n_threads(), t.nodes().iter().map(|n| n.cpus.len()).sum::<usize>());
        assert_eq!((p.node_id(1), p.node_id(2), p.threads_in_node(2)), (Some(1), None, None));
        assert_eq!(p.cpus(1), t.nodes()[1].cpus.as_slice());
        assert!(p.cpus(5).is_empty() && p.node_threads(5).is_empty());
    }

    /// Each phase: every thread writes its slot; after the group barrier its node's slots
    /// are all visible, after the global barrier every slot is.
    #[test]
    fn barriers_order_phases_within_and_across_nodes() {
        for &layout in LAYOUTS {
            let p = pool(layout);
            let total = p.n_threads();
            let mut slots = vec![0usize; total];
            let shared = SharedMut::new(&mut slots);
            p.run(|w| {
                let mine = p.node_threads(w.node);
                for phase in 1..=50 {
                    // SAFETY: each thread writes only its own slot between barriers.
                    unsafe { *shared.at(w.global_tid) = phase };
                    w.group_barrier();
                    // SAFETY: no thread writes again before the global barrier below.
                    let node_slots = unsafe { shared.slice(mine.clone()) };
                    assert!(node_slots.iter().all(|&s| s == phase), "{layout:?} group phase {phase}");
                    w.global_barrier();
                    // SAFETY: every write of this phase happened before the barrier above.
                    let all = unsafe { shared.slice(0..total) };
                    assert!(all.iter().all(|&s| s == phase), "{layout:?} global phase {phase}");
                    w.global_barrier();
                }
            });
        }
    }

    #[test]
    fn shares_cover_each_level_exactly() {
        let p = pool(&[2, 1, 3]);
        let n = 1000;
        let counts: Vec<AtomicU64> = (0..3 * n).map(|_| AtomicU64::new(0)).collect();
        p.run(|w| {
            let slice = w.node_share(n, 16);
            for i in w.share(slice.len(), 4) {
                counts[slice.start + i].fetch_add(1, Ordering::Relaxed);
            }
            for i in w.global_share(n, 1) {
                counts[n + i].fetch_add(1, Ordering::Relaxed);
            }
            if w.tid_in_node == 0 {
                for i in w.node_share(n, 1) {
                    counts[2 * n + i].fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }

    /// Many barriers in a row, with alternating counters whose exact values each barrier
    /// must publish (a counter is next bumped two rounds later, behind another barrier).
    #[test]
    fn barrier_stress() {
        for &layout in &[&[2usize, 1, 3][..], &[1, 2], &[4]] {
            let p = pool(layout);
            let total = p.n_threads() as u64;
            let rounds = 1500u64;
            for _ in 0..2 {
                let global = [AtomicU64::new(0), AtomicU64::new(0)];
                let per_node: Vec<[AtomicU64; 2]> = layout.iter().map(|_| [AtomicU64::new(0), AtomicU64::new(0)]).collect();
                p.run(|w| {
                    let in_node = w.threads_in_node as u64;
                    for r in 0..rounds {
                        let k = (r % 2) as usize;
                        per_node[w.node][k].fetch_add(1, Ordering::Relaxed);
                        w.group_barrier();
                        assert_eq!(per_node[w.node][k].load(Ordering::Relaxed), in_node * (r / 2 + 1));
                        global[k].fetch_add(1, Ordering::Relaxed);
                        w.global_barrier();
                        assert_eq!(global[k].load(Ordering::Relaxed), total * (r / 2 + 1));
                    }
                });
                assert_eq!(global[0].load(Ordering::Relaxed) + global[1].load(Ordering::Relaxed), total * rounds);
            }
        }
    }

    #[test]
    fn worker_panic_reaches_the_caller_and_the_pool_survives() {
        let p = pool(&[1, 2]);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.run(|w| assert!(w.global_tid != 2, "boom"));
        }));
        assert!(r.is_err());
        let hits = AtomicU64::new(0);
        p.run(|w| {
            w.global_barrier();
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 3);
    }
}
