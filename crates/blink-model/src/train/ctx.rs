//! How a training step runs its phases on a pool: each phase is one pool run, its
//! threads splitting rows, items or a product's columns; the run's end is the barrier.
//! The pool is lent for each unit of work (the trainer's own, or the serving engine's
//! when fine-tuning is co-served); the threads' scratch belongs to the trainer.

use blink_kernels::cpu::Isa;
use blink_kernels::fgemm::{self, BSource, FgemmScratch, OutF32};
use blink_runtime::numa::{NodePool, NodeWorker};

use super::buffers::M;

/// Per-thread buffers: a product's tiles and attention's scores.
pub(super) struct ThreadScratch {
    pub gemm: FgemmScratch,
    pub scores: Vec<f32>,
}

/// Every pool thread's scratch, by global thread index.
pub(super) struct Scratches(Vec<std::cell::UnsafeCell<ThreadScratch>>);

// SAFETY: thread `i` alone touches element `i`, inside a pool run.
unsafe impl Sync for Scratches {}

impl Scratches {
    pub fn new() -> Scratches {
        Scratches(Vec::new())
    }

    /// Room for `threads` threads, for steps of up to `max_tokens` tokens (grows only
    /// when a pool with more threads than before is lent).
    pub fn ensure(&mut self, threads: usize, max_tokens: usize) {
        while self.0.len() < threads {
            self.0.push(std::cell::UnsafeCell::new(ThreadScratch { gemm: FgemmScratch::default(), scores: vec![0.0; max_tokens] }));
        }
    }
}

/// A lent pool and every thread's scratch.
pub(super) struct Ctx<'a> {
    pub pool: &'a NodePool,
    pub isa: Isa,
    scratch: &'a Scratches,
}

impl<'a> Ctx<'a> {
    /// # Panics
    /// When `scratch` has no room for one of the pool's threads ([`Scratches::ensure`]).
    pub fn new(pool: &'a NodePool, isa: Isa, scratch: &'a Scratches) -> Ctx<'a> {
        assert!(scratch.0.len() >= pool.n_threads(), "scratch for every pool thread");
        Ctx { pool, isa, scratch }
    }

    /// This thread's scratch.
    ///
    /// # Safety
    /// Only from inside a pool run, once per thread at a time.
    #[allow(clippy::mut_from_ref)]
    unsafe fn mine(&self, w: &NodeWorker) -> &mut ThreadScratch {
        &mut *self.scratch.0[w.global_tid].get()
    }

    /// `f(i)` for `i in 0..n`, split between the threads.
    pub fn each(&self, n: usize, f: impl Fn(usize) + Sync) {
        self.pool.run(|w| {
            for i in w.share(n, 1) {
                f(i);
            }
        });
    }

    /// As [`Ctx::each`], with the thread's scratch.
    pub fn each_with(&self, n: usize, f: impl Fn(usize, &mut ThreadScratch) + Sync) {
        self.pool.run(|w| {
            // SAFETY: inside the run, this thread's own scratch.
            let s = unsafe { self.mine(w) };
            for i in w.share(n, 1) {
                f(i, s);
            }
        });
    }

    /// `C[..m][..n] (+)= A[..m][..depth] · B`, the columns split between the threads.
    ///
    /// # Safety
    /// The matrices hold `m` rows; nothing else touches `c` meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn product(&self, a: M, m: usize, depth: usize, b: BSource, n: usize, c: M, accumulate: bool) {
        if m == 0 || n == 0 {
            return;
        }
        let align = fgemm::col_align(&b);
        self.pool.run(|w| {
            let cols = w.share(n, align);
            if cols.is_empty() {
                return;
            }
            // SAFETY: each thread writes its own columns of `c`; `a` is read-only here.
            unsafe {
                let s = self.mine(w);
                let out = OutF32 { ptr: c.at(0, cols.start), ld: c.cols, accumulate };
                fgemm::fgemm(self.isa, a.rows(m), a.cols, m, depth, b, cols, out, &mut s.gemm);
            }
        });
    }
}
