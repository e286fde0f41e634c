//! Pinning threads to CPUs, where the OS allows it, and lowering a background thread's
//! scheduling priority below the compute threads'.
//!
//! Linux uses `sched_setaffinity` with a mask sized to the CPU ids (a machine may have more
//! than the 1024 of libc's `cpu_set_t`); elsewhere pinning is a no-op. Failure is never
//! fatal: a container may forbid it, and the pool still works unpinned. `BLINK_NO_PIN=1`
//! turns pinning off.

/// Whether `BLINK_NO_PIN` asks for no pinning.
fn pinning_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("BLINK_NO_PIN").is_some_and(|v| !v.is_empty() && v != "0"))
}

/// Restrict the calling thread to `cpus`. Returns whether the OS accepted it.
pub fn pin_current_thread(cpus: &[usize]) -> bool {
    if cpus.is_empty() || pinning_off() {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        let mask = linux::Mask::of(cpus);
        // SAFETY: the kernel reads `bytes()` bytes of the mask, which it holds.
        unsafe { libc::sched_setaffinity(0, mask.bytes(), mask.as_ptr()) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// The CPUs this process may run on, in ascending order: the calling thread's set the
/// first time this is asked (before Blink pins anything), remembered for later calls.
pub fn allowed_cpus() -> Vec<usize> {
    static ALLOWED: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    ALLOWED.get_or_init(current_cpus).clone()
}

/// The CPUs the calling thread may run on now.
fn current_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    if let Some(cpus) = linux::affinity().or_else(linux::status_cpus).filter(|c| !c.is_empty()) {
        return cpus;
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}

#[cfg(target_os = "linux")]
mod linux {
    use libc::c_ulong;

    /// Bits per mask word, laid out as the kernel's (and glibc's) CPU masks are.
    const WORD_BITS: usize = 8 * std::mem::size_of::<c_ulong>();
    /// The kernel's largest CPU count (NR_CPUS): masks never need more.
    const MAX_CPUS: usize = 1 << 13;

    /// A CPU mask of any size: bit `c % WORD_BITS` of word `c / WORD_BITS` is CPU `c`.
    pub struct Mask(Vec<c_ulong>);

    impl Mask {
        fn empty(cpus: usize) -> Mask {
            Mask(vec![0; cpus.div_ceil(WORD_BITS).max(1)])
        }

        /// A mask of `cpus` (ids past the kernel's largest are left out).
        pub fn of(cpus: &[usize]) -> Mask {
            let top = cpus.iter().copied().filter(|&c| c < MAX_CPUS).max().map_or(0, |c| c + 1);
            let mut mask = Mask::empty(top.max(1024));
            for &c in cpus.iter().filter(|&&c| c < MAX_CPUS) {
                mask.0[c / WORD_BITS] |= 1 << (c % WORD_BITS);
            }
            mask
        }

        fn cpus(&self) -> Vec<usize> {
            (0..self.0.len() * WORD_BITS).filter(|&c| self.0[c / WORD_BITS] >> (c % WORD_BITS) & 1 == 1).collect()
        }

        pub fn bytes(&self) -> usize {
            std::mem::size_of_val(&self.0[..])
        }

        /// The mask as libc's type; the kernel reads [`Mask::bytes`] bytes of it.
        pub fn as_ptr(&self) -> *const libc::cpu_set_t {
            self.0.as_ptr().cast()
        }
    }

    /// The calling thread's affinity, with a mask grown until the kernel's CPU ids fit.
    pub fn affinity() -> Option<Vec<usize>> {
        let mut size = 1024;
        while size <= MAX_CPUS {
            let mut mask = Mask::empty(size);
            // SAFETY: the kernel writes at most `bytes()` bytes into the mask.
            if unsafe { libc::sched_getaffinity(0, mask.bytes(), mask.0.as_mut_ptr().cast()) } == 0 {
                return Some(mask.cpus());
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                return None;
            }
            size *= 2;
        }
        None
    }

    /// The process's CPUs as `/proc/self/status` lists them.
    pub fn status_cpus() -> Option<Vec<usize>> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
        crate::cpulist::parse_cpulist(list.trim()).ok()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn masks_hold_cpu_ids_past_libc_set_size() {
            let cpus = vec![0, 63, 64, 1023, 1024, 1500, 8191];
            let mask = Mask::of(&cpus);
            assert_eq!(mask.cpus(), cpus);
            assert!(mask.bytes() * 8 >= 8192);
            // Small sets keep at least libc's size, which every kernel accepts.
            assert_eq!(Mask::of(&[3]).bytes(), 128);
            assert_eq!(Mask::of(&[3, 9000]).cpus(), vec![3]);
        }

        #[test]
        fn the_process_cpus_read_both_ways_agree() {
            // Nothing in this test binary pins the main test thread's process mask away
            // from /proc's view, which is the process's (thread group leader's) mask.
            let status = status_cpus().expect("/proc/self/status lists the allowed CPUs");
            let affinity = affinity().expect("sched_getaffinity answers");
            assert!(!affinity.is_empty() && affinity.iter().all(|c| status.contains(c)), "{affinity:?} vs {status:?}");
        }
    }
}

/// Lower the calling thread's scheduling priority to nice `nice` (Linux; elsewhere, and
/// where the OS refuses, nothing changes). For threads that share cores with the compute
/// pool but must never stall a pass: the HTTP runtime, the fine-tuning jobs' writer. A
/// pass's threads meet at barriers, so a core taken from one of them holds up all.
pub fn lower_current_thread_priority(nice: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread; failure leaves the priority as is.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}
