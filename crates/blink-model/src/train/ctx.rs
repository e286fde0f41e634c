//! How a training step runs its phases on the pool: each phase is one pool run, its
//! threads splitting rows, items or a product's columns; the run's end is the barrier.

use blink_kernels::cpu::Isa;
use blink_kernels::fgemm::{self, BSource, FgemmScratch, OutF32};
use blink_runtime::numa::{NodePool, NodeWorker};

use super::buffers::M;

/// Per-thread buffers: a product's tiles and attention's scores.
pub(super) struct ThreadScratch {
    pub gemm: FgemmScratch,
    pub scores: Vec<f32>,
}

/// The pool and every thread's scratch.
pub(super) struct Ctx {
    pub pool: NodePool,
    pub isa: Isa,
    scratch: Vec<std::cell::UnsafeCell<ThreadScratch>>,
}

// SAFETY: thread `i` alone touches `scratch[i]`, inside a pool run.
unsafe impl Sync for Ctx {}

impl Ctx {
    pub fn new(pool: NodePool, isa: Isa, max_tokens: usize) -> Ctx {
        let scratch = (0..pool.n_threads()).map(|_| std::cell::UnsafeCell::new(ThreadScratch { gemm: FgemmScratch::default(), scores: vec![0.0; max_tokens] })).collect();
        Ctx { pool, isa, scratch }
    }

    /// This thread's scratch.
    ///
    /// # Safety
    /// Only from inside a pool run, once per thread at a time.
    #[allow(clippy::mut_from_ref)]
    unsafe fn mine(&self, w: &NodeWorker) -> &mut ThreadScratch {
        &mut *self.scratch[w.global_tid].get()
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
