//! A persistent pool of compute threads that run one closure together, SPMD style.
//!
//! `ThreadPool::run` hands the same closure to every thread (the caller is thread 0) and
//! returns when all have finished. Inside, threads split work by their index and meet at
//! `Worker::barrier`. Waiting spins briefly, then parks, so an idle pool costs nothing and
//! a busy one hands off in well under a microsecond. Nothing is allocated per call.
//!
//! A *detached* pool ([`ThreadPool::detached`]) has a thread of its own for every index, so
//! the caller is free while it computes: [`ThreadPool::run_beside`] starts the closure,
//! runs other work on the calling thread, then waits (briefly spinning, then asleep).

use std::cell::UnsafeCell;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::park::{Parking, SPINS};

/// The view of the pool a running closure gets.
pub struct Worker<'a> {
    /// This thread's index, `0..n_threads`.
    pub tid: usize,
    /// Threads taking part.
    pub n_threads: usize,
    /// Which run of the pool this is: distinct for consecutive runs of a pool of several
    /// threads (a one-thread pool has nobody to tell its runs apart from).
    pub(crate) run: usize,
    barrier: &'a Barrier,
}

impl Worker<'_> {
    /// Wait until every thread of this run has reached the same barrier.
    #[inline]
    pub fn barrier(&self) {
        self.barrier.wait(self.n_threads);
    }

    /// This thread's share of `0..n`, in contiguous chunks whose boundaries fall on
    /// multiples of `align` (the last chunk takes the remainder).
    #[inline]
    pub fn share(&self, n: usize, align: usize) -> std::ops::Range<usize> {
        split_range(n, align, self.tid, self.n_threads)
    }
}

/// Part `part` of `parts` of `0..n`, with inner boundaries on multiples of `align`.
pub fn split_range(n: usize, align: usize, part: usize, parts: usize) -> std::ops::Range<usize> {
    let align = align.max(1);
    let units = n.div_ceil(align);
    let start = (units * part / parts * align).min(n);
    let end = (units * (part + 1) / parts * align).min(n);
    start..end
}

/// A spin-then-park barrier (see `park`).
struct Barrier {
    arrived: AtomicUsize,
    generation: AtomicUsize,
    parking: Parking,
}

impl Barrier {
    fn new() -> Self {
        Barrier { arrived: AtomicUsize::new(0), generation: AtomicUsize::new(0), parking: Parking::new() }
    }

    fn wait(&self, n: usize) {
        if n <= 1 {
            return;
        }
        let gen = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == n {
            self.arrived.store(0, Ordering::Relaxed);
            self.parking.bump(&self.generation);
            return;
        }
        self.parking.wait_for_change(&self.generation, gen, SPINS);
    }
}

/// The closure of the current run, type-erased. Valid only while `run` is on the stack.
type Job = *const (dyn Fn(&Worker) + Sync);

struct Shared {
    n_threads: usize,
    /// Bumped once per run; workers start when they see it change.
    epoch: AtomicUsize,
    /// Workers still running the current job.
    busy: AtomicUsize,
    job: UnsafeCell<Option<Job>>,
    shutdown: AtomicBool,
    barrier: Barrier,
    /// Where idle workers sleep between runs.
    parking: Parking,
    /// Set when a worker's closure panicked; `run` re-raises it on the caller.
    panicked: AtomicBool,
    /// Whether the caller of `run` is thread 0 (otherwise a pool thread is).
    caller_works: bool,
    /// Bumped when the last worker finishes a run, for a detached pool's caller to wake on.
    finished: AtomicUsize,
    finished_parking: Parking,
    /// When the last worker finished the latest run, in nanoseconds after `started`.
    finished_at: AtomicU64,
    started: Instant,
}

// SAFETY: `job` is written only by the thread inside `run` before the epoch is published
// (Release) and read by workers after they observe it (Acquire); `run` does not return
// until every worker has finished with it.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of threads that execute closures together.
pub struct ThreadPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    /// Serializes concurrent `run` calls from different threads.
    run_lock: Mutex<()>,
    /// Distinguishes pools, so a calling thread is pinned once per pool.
    id: usize,
    /// Where the calling thread (thread 0) is pinned at its first `run`.
    caller_cpus: Option<Vec<usize>>,
}

thread_local! {
    /// The pool this thread was last pinned for as a caller.
    static PINNED_FOR: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all (the caller counts as one). When the process
    /// may use at least that many CPUs, thread `i` is pinned to the `i`-th of them (the
    /// caller at its first `run`); `BLINK_NO_PIN=1` turns pinning off.
    pub fn new(n_threads: usize) -> io::Result<ThreadPool> {
        let cpus = crate::affinity::allowed_cpus();
        let pin = n_threads <= cpus.len();
        Self::with_affinity(n_threads, |i| pin.then(|| vec![cpus[i]]))
    }

    /// Like `new`, pinning thread `i` to the CPU set `cpus(i)` where the OS allows.
    pub fn with_affinity(n_threads: usize, cpus: impl Fn(usize) -> Option<Vec<usize>>) -> io::Result<ThreadPool> {
        Self::build(n_threads, cpus, true)
    }

    /// A pool of `n_threads` threads of its own (the caller is not one of them), thread
    /// `i` pinned to `cpus(i)` where the OS allows: for [`ThreadPool::run_beside`].
    pub fn detached(n_threads: usize, cpus: impl Fn(usize) -> Option<Vec<usize>>) -> io::Result<ThreadPool> {
        Self::build(n_threads, cpus, false)
    }

    fn build(n_threads: usize, cpus: impl Fn(usize) -> Option<Vec<usize>>, caller_works: bool) -> io::Result<ThreadPool> {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            epoch: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            shutdown: AtomicBool::new(false),
            barrier: Barrier::new(),
            parking: Parking::new(),
            panicked: AtomicBool::new(false),
            caller_works,
            finished: AtomicUsize::new(0),
            finished_parking: Parking::new(),
            finished_at: AtomicU64::new(0),
            started: Instant::now(),
        });
        static NEXT_ID: AtomicUsize = AtomicUsize::new(1);
        let mut pool = ThreadPool {
            shared,
            handles: Vec::with_capacity(n_threads),
            run_lock: Mutex::new(()),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            caller_cpus: if caller_works { cpus(0) } else { None },
        };
        for tid in usize::from(caller_works)..n_threads {
            let shared = Arc::clone(&pool.shared);
            let cpus = cpus(tid);
            // On failure (a limit on threads, say), dropping the pool stops those started.
            let handle = std::thread::Builder::new().name(format!("blink-compute-{tid}")).spawn(move || {
                if let Some(cpus) = cpus {
                    crate::affinity::pin_current_thread(&cpus);
                }
                worker_loop(&shared, tid)
            })?;
            pool.handles.push(handle);
        }
        Ok(pool)
    }

    /// Threads in the pool, the caller included.
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Run `f` on every thread of the pool (the caller is thread 0) and wait for all.
    ///
    /// If any thread's closure panics, the panic is re-raised here after all threads finish.
    pub fn run<F: Fn(&Worker) + Sync>(&self, f: F) {
        if !self.shared.caller_works {
            self.run_beside(f, || ());
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cpus) = &self.caller_cpus {
            if PINNED_FOR.get() != self.id {
                PINNED_FOR.set(self.id);
                crate::affinity::pin_current_thread(cpus);
            }
        }
        let shared = &*self.shared;
        if shared.n_threads == 1 {
            f(&Worker { tid: 0, n_threads: 1, run: shared.epoch.load(Ordering::Relaxed), barrier: &shared.barrier });
            return;
        }
        let job: &(dyn Fn(&Worker) + Sync) = &f;
        // SAFETY: the pointer's lifetime is erased; it is only dereferenced by workers
        // between the epoch bump below and `busy` reaching zero, all within this call.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(&Worker) + Sync), Job>(job) };
        unsafe { *shared.job.get() = Some(job) };
        shared.busy.store(shared.n_threads - 1, Ordering::Release);
        shared.parking.bump(&shared.epoch);

        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            f(&Worker { tid: 0, n_threads: shared.n_threads, run: shared.epoch.load(Ordering::Relaxed), barrier: &shared.barrier })
        }));

        let mut spins = 0u32;
        while shared.busy.load(Ordering::Acquire) != 0 {
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        unsafe { *shared.job.get() = None };
        if let Err(payload) = result {
            std::panic::resume_unwind(payload);
        }
        if shared.panicked.swap(false, Ordering::AcqRel) {
            panic!("a compute thread panicked");
        }
    }
}

impl ThreadPool {
    /// Start `f` on every pool thread, run `beside` on the calling thread meanwhile, then
    /// wait for the pool. Returns `beside`'s result and how long `f` took (from its start
    /// until the last thread finished). On a pool whose caller is thread 0, `f` runs
    /// after `beside`, on the caller too.
    ///
    /// If any thread's closure panics, the panic is re-raised here after all finish.
    pub fn run_beside<F: Fn(&Worker) + Sync, R>(&self, f: F, beside: impl FnOnce() -> R) -> (R, Duration) {
        let shared = &*self.shared;
        if shared.caller_works {
            let r = beside();
            let start = Instant::now();
            self.run(f);
            return (r, start.elapsed());
        }
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let job: &(dyn Fn(&Worker) + Sync) = &f;
        // SAFETY: as in `run`: workers dereference the job only until `busy` reaches zero,
        // and this call does not return (or unwind) before that.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(&Worker) + Sync), Job>(job) };
        unsafe { *shared.job.get() = Some(job) };
        let finished = shared.finished.load(Ordering::Acquire);
        shared.busy.store(shared.n_threads, Ordering::Release);
        let start = Instant::now();
        shared.parking.bump(&shared.epoch);

        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(beside));

        // A short spin, then sleep: this thread is not a compute thread, and spinning
        // would take a CPU from one that is.
        shared.finished_parking.sleep_until_change(&shared.finished, finished, CALLER_SPINS);
        let took = Duration::from_nanos(shared.finished_at.load(Ordering::Acquire))
            .saturating_sub(start.duration_since(shared.started));
        unsafe { *shared.job.get() = None };
        let r = match result {
            Ok(r) => r,
            Err(payload) => std::panic::resume_unwind(payload),
        };
        if shared.panicked.swap(false, Ordering::AcqRel) {
            panic!("a compute thread panicked");
        }
        (r, took)
    }
}

/// Spins of a detached pool's caller before it sleeps.
const CALLER_SPINS: u32 = 1 << 6;

fn worker_loop(shared: &Shared, tid: usize) {
    let mut seen = 0usize;
    loop {
        shared.parking.wait_for_change(&shared.epoch, seen, SPINS);
        seen = shared.epoch.load(Ordering::Acquire);
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: published before the epoch bump we just observed; valid until we
        // decrement `busy`.
        if let Some(job) = unsafe { *shared.job.get() } {
            let worker = Worker { tid, n_threads: shared.n_threads, run: seen, barrier: &shared.barrier };
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*job)(&worker) }));
            if ok.is_err() {
                shared.panicked.store(true, Ordering::Release);
            }
        }
        if shared.busy.fetch_sub(1, Ordering::AcqRel) == 1 && !shared.caller_works {
            let now = shared.started.elapsed().as_nanos() as u64;
            shared.finished_at.store(now, Ordering::Release);
            shared.finished_parking.bump(&shared.finished);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.parking.bump(&self.shared.epoch);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// A slice that several pool threads write at disjoint ranges.
///
/// The pool's SPMD style needs shared output buffers; this wrapper keeps the unsafety in
/// one place. Callers promise that concurrent `slice_mut` ranges never overlap and that
/// reads of a range happen only after a barrier that follows its writes.
pub struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: std::marker::PhantomData<&'a mut [T]>,
}

unsafe impl<T: Send> Send for SharedMut<'_, T> {}
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    pub fn new(slice: &'a mut [T]) -> Self {
        SharedMut { ptr: slice.as_mut_ptr(), len: slice.len(), _life: std::marker::PhantomData }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The base pointer, for kernels that write strided elements themselves. The same
    /// disjointness rules as `slice_mut` apply to whatever they write.
    pub fn as_mut_ptr(&self) -> *mut T {
        self.ptr
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Mutable access to `range`.
    ///
    /// # Safety
    /// No other thread may access any element of `range` until the next barrier.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, range: std::ops::Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.len, "SharedMut range out of bounds");
        std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.end - range.start)
    }

    /// Mutable access to element `i`.
    ///
    /// # Safety
    /// No other thread may access element `i` until the next barrier.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn at(&self, i: usize) -> &mut T {
        assert!(i < self.len, "SharedMut index out of bounds");
        &mut *self.ptr.add(i)
    }

    /// Shared access to `range`.
    ///
    /// # Safety
    /// No thread may write any element of `range` until the next barrier.
    #[inline]
    pub unsafe fn slice(&self, range: std::ops::Range<usize>) -> &[T] {
        assert!(range.start <= range.end && range.end <= self.len, "SharedMut range out of bounds");
        std::slice::from_raw_parts(self.ptr.add(range.start), range.end - range.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn a_detached_pool_computes_while_the_caller_works() {
        let pool = ThreadPool::detached(3, |_| None).unwrap();
        let hits: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
        let caller = std::thread::current().id();
        for round in 0..500u64 {
            let (beside, took) = pool.run_beside(
                |w| {
                    assert_ne!(std::thread::current().id(), caller, "the caller must not compute");
                    hits[w.tid].fetch_add(1, Ordering::Relaxed);
                    w.barrier();
                },
                || round * 2,
            );
            assert_eq!(beside, round * 2);
            assert!(took < Duration::from_secs(10));
        }
        pool.run(|w| {
            hits[w.tid].fetch_add(1, Ordering::Relaxed);
        });
        for h in &hits {
            assert_eq!(h.load(Ordering::Relaxed), 501);
        }
        // A worker's panic reaches the caller, and the pool survives it.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run_beside(|w| assert!(w.tid != 1, "boom"), || ());
        }));
        assert!(r.is_err());
        pool.run(|_| {});
    }

    #[test]
    fn every_thread_runs_once_per_call() {
        let pool = ThreadPool::new(4).unwrap();
        let hits: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        for _ in 0..1000 {
            pool.run(|w| {
                hits[w.tid].fetch_add(1, Ordering::Relaxed);
            });
        }
        for h in &hits {
            assert_eq!(h.load(Ordering::Relaxed), 1000);
        }
    }

    #[test]
    fn barrier_orders_phases() {
        let pool = ThreadPool::new(3).unwrap();
        let mut data = vec![0usize; 300];
        let shared = SharedMut::new(&mut data);
        pool.run(|w| {
            let r = w.share(300, 1);
            unsafe { shared.slice_mut(r.clone()).iter_mut().for_each(|x| *x = 1) };
            w.barrier();
            // After the barrier every element written by every thread is visible.
            let sum: usize = unsafe { shared.slice(0..300).iter().sum() };
            assert_eq!(sum, 300);
            w.barrier();
        });
    }

    #[test]
    fn split_covers_range_on_aligned_boundaries() {
        for n in [0, 1, 7, 64, 100, 1000] {
            for parts in 1..6 {
                let mut next = 0;
                for p in 0..parts {
                    let r = split_range(n, 16, p, parts);
                    assert_eq!(r.start, next);
                    assert!(r.start.is_multiple_of(16) || r.start == n);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn worker_panic_is_reported_to_caller() {
        let pool = ThreadPool::new(2).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(|w| {
                if w.tid == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        // The pool still works afterwards.
        let hits = AtomicU64::new(0);
        pool.run(|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }
}
