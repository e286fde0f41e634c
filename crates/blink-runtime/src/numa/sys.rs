//! The system calls behind [`super::memory`]: anonymous mappings, huge-page advice, `mbind`,
//! and the page placement queries `move_pages` / `get_mempolicy`. Off Linux, a zeroed
//! page-aligned heap allocation stands in for the mapping and nothing can be bound, advised
//! or queried.

pub(crate) use imp::*;

#[cfg(target_os = "linux")]
mod imp {
    use std::ptr::NonNull;

    /// Allocate on the node while it has memory, elsewhere after (`MPOL_BIND` would have the
    /// OOM killer end the process when one node fills, however much the others hold).
    const MPOL_PREFERRED: libc::c_int = 1;
    const MPOL_F_NODE: libc::c_ulong = 1;
    const MPOL_F_ADDR: libc::c_ulong = 2;

    pub(crate) fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(size).ok().filter(|s| s.is_power_of_two()).unwrap_or(4096)
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL)
    }

    /// A fresh private anonymous mapping of `bytes` (a non-zero multiple of the page size).
    pub(crate) fn map(bytes: usize) -> std::io::Result<NonNull<u8>> {
        // SAFETY: an anonymous mapping at an address of the kernel's choosing aliases nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        NonNull::new(p.cast()).ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))
    }

    /// # Safety
    /// `p` and `bytes` must be exactly a mapping returned by [`map`], not used afterwards.
    pub(crate) unsafe fn unmap(p: *mut u8, bytes: usize) {
        libc::munmap(p.cast(), bytes);
    }

    /// `madvise(MADV_HUGEPAGE)` (or `MADV_NOHUGEPAGE`) over `[p, p + bytes)`; whether the
    /// kernel accepted it.
    pub(crate) fn advise_huge_pages(p: *mut u8, bytes: usize, huge: bool) -> bool {
        let advice = if huge { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        // SAFETY: advice changes no contents; the kernel validates the range.
        unsafe { libc::madvise(p.cast(), bytes, advice) == 0 }
    }

    /// Bind `[p, p + bytes)` to `node` with `MPOL_PREFERRED`; `Err(errno)` on failure.
    pub(crate) fn bind(p: *mut u8, bytes: usize, node: usize) -> Result<(), i32> {
        let bits = libc::c_ulong::BITS as usize;
        let mut mask: Vec<libc::c_ulong> = vec![0; node / bits + 1];
        mask[node / bits] |= 1 << (node % bits);
        // The kernel reads `maxnode - 1` bits (libnuma passes its mask size plus one).
        let maxnode = (mask.len() * bits + 1) as libc::c_ulong;
        // SAFETY: mbind only changes the policy of our own mapping; the mask outlives the
        // call and holds `maxnode - 1` bits.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                p as libc::c_ulong,
                bytes as libc::c_ulong,
                MPOL_PREFERRED,
                mask.as_ptr(),
                maxnode,
                0 as libc::c_uint,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(errno())
        }
    }

    /// The node of each page address in `pages` (page-aligned), or `-errno`.
    ///
    /// Uses `move_pages` without moving anything, which reports `-ENOENT` for pages not
    /// faulted in; if that call is unavailable, `get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR)`
    /// per page (which maps a missing page read-only, harmlessly, to answer).
    pub(crate) fn placement(pages: &[usize]) -> Vec<i32> {
        let mut status = vec![-libc::ENOENT; pages.len()];
        if pages.is_empty() {
            return status;
        }
        let ptrs: Vec<*mut libc::c_void> = pages.iter().map(|&a| a as *mut libc::c_void).collect();
        // SAFETY: pid 0 is this process; with a null `nodes` the kernel only writes one
        // status per page into `status`, which has `ptrs.len()` entries.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                0 as libc::c_int,
                ptrs.len() as libc::c_ulong,
                ptrs.as_ptr(),
                std::ptr::null::<libc::c_int>(),
                status.as_mut_ptr(),
                0 as libc::c_int,
            )
        };
        if r >= 0 {
            return status;
        }
        let move_pages_errno = errno();
        for (slot, &addr) in status.iter_mut().zip(pages) {
            let mut node: libc::c_int = -1;
            // SAFETY: with a null mask only `node` is written; the kernel validates `addr`.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_get_mempolicy,
                    &mut node as *mut libc::c_int,
                    std::ptr::null_mut::<libc::c_ulong>(),
                    0 as libc::c_ulong,
                    addr as libc::c_ulong,
                    MPOL_F_NODE | MPOL_F_ADDR,
                )
            };
            *slot = if r == 0 && node >= 0 { node } else { -move_pages_errno };
        }
        status
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::alloc::Layout;
    use std::ptr::NonNull;

    pub(crate) fn page_size() -> usize {
        4096
    }

    fn layout(bytes: usize) -> std::io::Result<Layout> {
        Layout::from_size_align(bytes, page_size()).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    }

    /// Zeroed, page-aligned memory of `bytes` (non-zero).
    pub(crate) fn map(bytes: usize) -> std::io::Result<NonNull<u8>> {
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout(bytes)?) };
        NonNull::new(p).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))
    }

    /// # Safety
    /// `p` and `bytes` must be exactly an allocation returned by [`map`], not used afterwards.
    pub(crate) unsafe fn unmap(p: *mut u8, bytes: usize) {
        if let Ok(layout) = layout(bytes) {
            std::alloc::dealloc(p, layout);
        }
    }

    pub(crate) fn advise_huge_pages(_p: *mut u8, _bytes: usize, _huge: bool) -> bool {
        false
    }

    pub(crate) fn bind(_p: *mut u8, _bytes: usize, _node: usize) -> Result<(), i32> {
        Err(-1)
    }

    pub(crate) fn placement(pages: &[usize]) -> Vec<i32> {
        vec![-1; pages.len()]
    }
}
