//! A global allocator that counts heap allocations on every thread while asked to: how
//! the tests hold the hot paths (decode steps, the serving engine's steps, a ring's hops)
//! to allocating nothing. A test binary installs it with
//! `#[global_allocator] static A: CountingAlloc = CountingAlloc;` and measures with
//! [`count_allocations`]; outside a measurement it only forwards to the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Forwards to [`System`], counting allocations and reallocations while a measurement runs.
pub struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static FIRST_SIZE: AtomicUsize = AtomicUsize::new(0);

fn count(layout: Layout) {
    if COUNTING.load(Ordering::Relaxed) && ALLOCS.fetch_add(1, Ordering::Relaxed) == 0 {
        FIRST_SIZE.store(layout.size(), Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(layout);
        System.realloc(ptr, layout, new_size)
    }
}

/// What a measurement counted: heap allocations (and reallocations) on every thread, and
/// the size of the first, to name the culprit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    pub allocs: usize,
    pub first_size: usize,
}

/// Run `f`, counting the allocations every thread makes meanwhile (through
/// [`CountingAlloc`], which must be the global allocator; one measurement at a time).
pub fn count_allocations<R>(f: impl FnOnce() -> R) -> (R, Counted) {
    ALLOCS.store(0, Ordering::SeqCst);
    FIRST_SIZE.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let r = f();
    COUNTING.store(false, Ordering::SeqCst);
    (r, Counted { allocs: ALLOCS.load(Ordering::SeqCst), first_size: FIRST_SIZE.load(Ordering::SeqCst) })
}
