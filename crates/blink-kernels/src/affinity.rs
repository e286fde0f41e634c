//! Pinning threads to CPUs, where the OS allows it.
//!
//! Linux uses `sched_setaffinity`; elsewhere pinning is a no-op. Failure is never fatal:
//! a container may forbid it, and the pool still works unpinned.

/// Restrict the calling thread to `cpus`. Returns whether the OS accepted it.
pub fn pin_current_thread(cpus: &[usize]) -> bool {
    #[cfg(target_os = "linux")]
    {
        if cpus.is_empty() {
            return false;
        }
        // SAFETY: cpu_set_t is plain data; CPU_SET bounds-checks against its capacity below.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let capacity = 8 * std::mem::size_of::<libc::cpu_set_t>();
            for &cpu in cpus.iter().filter(|&&c| c < capacity) {
                libc::CPU_SET(cpu, &mut set);
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpus;
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
    {
        // SAFETY: as above.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                let capacity = 8 * std::mem::size_of::<libc::cpu_set_t>();
                let cpus: Vec<usize> = (0..capacity).filter(|&c| libc::CPU_ISSET(c, &set)).collect();
                if !cpus.is_empty() {
                    return cpus;
                }
            }
        }
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}
