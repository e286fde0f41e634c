//! Waiting for another thread to move a counter: spin briefly, then yield the CPU, then
//! sleep. Shared by the barriers of [`crate::pool`] and [`crate::numa`].
//!
//! Spinning makes a hand-off take well under a microsecond when every thread has a CPU.
//! When the machine is oversubscribed (other processes, more threads than CPUs), a spinning
//! thread would keep the very thread it waits for off the CPU, so after a short spin it
//! yields, and after a while it sleeps until woken.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

/// Pause-spins before yielding.
pub(crate) const SPINS: u32 = 1 << 11;
/// Yields before sleeping.
const YIELDS: u32 = 1 << 7;

/// Where threads sleep while waiting on a counter.
pub(crate) struct Parking {
    lock: Mutex<()>,
    cond: Condvar,
    sleepers: AtomicUsize,
}

impl Parking {
    pub(crate) fn new() -> Parking {
        Parking { lock: Mutex::new(()), cond: Condvar::new(), sleepers: AtomicUsize::new(0) }
    }

    /// Wait until `value` differs from `seen`, spinning at most `spins` times first.
    pub(crate) fn wait_for_change(&self, value: &AtomicUsize, seen: usize, spins: u32) {
        self.wait(value, seen, spins, YIELDS);
    }

    /// As `wait_for_change`, but without yielding between the spin and the sleep: for a
    /// thread that expects a long wait and must not take CPU time from those it waits for.
    pub(crate) fn sleep_until_change(&self, value: &AtomicUsize, seen: usize, spins: u32) {
        self.wait(value, seen, spins, 0);
    }

    fn wait(&self, value: &AtomicUsize, seen: usize, spins: u32, yields: u32) {
        for _ in 0..spins {
            if value.load(Ordering::Acquire) != seen {
                return;
            }
            std::hint::spin_loop();
        }
        for _ in 0..yields {
            if value.load(Ordering::Acquire) != seen {
                return;
            }
            std::thread::yield_now();
        }
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SeqCst pairs with `bump`'s increment-then-check: one of the two sides always sees
        // the other, so a wake-up is never lost.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while value.load(Ordering::SeqCst) == seen {
            guard = self.cond.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::AcqRel);
    }

    /// Move `value` on and wake whoever sleeps on it.
    pub(crate) fn bump(&self, value: &AtomicUsize) {
        value.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cond.notify_all();
        }
    }
}
