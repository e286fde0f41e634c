//! Advice on memory-mapped files: read a range ahead, give a range's memory back for
//! real, and ask which of its pages are resident.
//!
//! Release is `madvise(MADV_DONTNEED)` on the mapping (the process's page-table entries
//! go) and then `posix_fadvise(POSIX_FADV_DONTNEED)` on the file (the page cache's clean
//! pages go, which a memory cgroup counts against its limit). `posix_madvise` is never
//! used: glibc makes its `POSIX_MADV_DONTNEED` a no-op. Every call is advice: a failure
//! leaves pages where they were, and later reads fault them back in from the file.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// `bytes` widened to whole pages: (start address, length).
fn pages_of(bytes: &[u8]) -> (usize, usize) {
    let p = page();
    let start = bytes.as_ptr() as usize / p * p;
    let end = (bytes.as_ptr() as usize + bytes.len()).next_multiple_of(p);
    (start, end - start)
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `MADV_POPULATE_READ` (Linux 5.14), which libc may not name.
const MADV_POPULATE_READ: libc::c_int = 22;

/// Ask the kernel to read `bytes` (part of a file mapping) in ahead of use: a hint
/// (`MADV_WILLNEED`), or with `force` a read that returns once the pages are in
/// (`MADV_POPULATE_READ`, falling back to touching a byte per page where the kernel
/// lacks it).
pub fn prefetch(bytes: &[u8], force: bool) -> io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    let (start, len) = pages_of(bytes);
    if force {
        // SAFETY: the range covers pages of a live mapping the caller holds; populating
        // reads them and changes no byte.
        let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, MADV_POPULATE_READ) };
        if rc == 0 {
            return Ok(());
        }
        let mut sum = 0u8;
        for i in (0..bytes.len()).step_by(page()) {
            // SAFETY: `i` is inside `bytes`; a volatile read keeps the touch.
            sum ^= unsafe { std::ptr::read_volatile(bytes.as_ptr().add(i)) };
        }
        std::hint::black_box(sum);
        return Ok(());
    }
    // SAFETY: as above; WILLNEED only starts reads.
    check(unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_WILLNEED) })
}

/// Give the memory of `bytes`, part of a read-only shared mapping of `file` starting at
/// `file_offset` of the file, back: the mapping's pages and the file's cached ones.
///
/// # Safety
/// `bytes` must lie in a read-only, shared (or private and never written) mapping of a
/// file: `MADV_DONTNEED` on anonymous or written private memory would zero it.
pub unsafe fn release(bytes: &[u8], file: Option<(&File, u64)>) -> io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    let (start, len) = pages_of(bytes);
    // SAFETY: the caller promises a file mapping, whose pages refault from the file.
    check(unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) })?;
    if let Some((f, offset)) = file {
        // The same whole pages of the file (the kernel drops only whole pages in range).
        let before = (bytes.as_ptr() as usize - start) as u64;
        let from = offset.saturating_sub(before);
        // SAFETY: advice on an open file descriptor; no memory is touched.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), from as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}

/// Give back the memory of the whole pages inside `bytes`, anonymous memory whose
/// contents are no longer wanted: they read as zeros until written again.
///
/// # Safety
/// Nothing may read the pages' old contents after this, and no other live data may
/// share them (only whole pages inside `bytes` are given back).
pub unsafe fn discard(bytes: &[u8]) -> io::Result<()> {
    let p = page();
    let start = (bytes.as_ptr() as usize).next_multiple_of(p);
    let end = (bytes.as_ptr() as usize + bytes.len()) / p * p;
    if end <= start {
        return Ok(());
    }
    // SAFETY: whole pages inside the caller's range, which it gives up.
    check(unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) })
}

/// Bytes of `bytes`' pages resident in memory (`mincore`; whole pages).
pub fn resident(bytes: &[u8]) -> io::Result<usize> {
    if bytes.is_empty() {
        return Ok(0);
    }
    let (start, len) = pages_of(bytes);
    let p = page();
    let mut vec = vec![0u8; len / p];
    // SAFETY: `vec` has one byte per page of the range, which lies in a live mapping.
    check(unsafe { libc::mincore(start as *mut libc::c_void, len, vec.as_mut_ptr()) })?;
    Ok(vec.iter().filter(|&&b| b & 1 == 1).count() * p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn release_and_prefetch_move_a_mapped_files_pages() {
        let path = std::env::temp_dir().join(format!("blink-residency-{}", std::process::id()));
        let len = 64 * page();
        {
            let mut f = File::create(&path).unwrap();
            f.write_all(&vec![7u8; len]).unwrap();
            f.sync_all().unwrap();
        }
        let file = File::open(&path).unwrap();
        // SAFETY: a read-only shared mapping of a file this test alone writes.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: the mapping is `len` bytes and lives until munmap below.
        let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
        prefetch(bytes, true).unwrap();
        assert_eq!(resident(bytes).unwrap(), len);
        // SAFETY: a shared read-only file mapping.
        unsafe { release(bytes, Some((&file, 0))).unwrap() };
        assert_eq!(resident(bytes).unwrap(), 0, "released pages leave the page cache too");
        assert!(bytes.iter().all(|&b| b == 7), "released pages read back from the file");
        unsafe { release(bytes, Some((&file, 0))).unwrap() };
        assert_eq!(resident(bytes).unwrap(), 0);
        // (The kernel may read ahead past what was asked for.)
        prefetch(&bytes[..8 * page()], true).unwrap();
        assert_eq!(resident(&bytes[..8 * page()]).unwrap(), 8 * page());
        unsafe { libc::munmap(ptr, len) };
        let _ = std::fs::remove_file(&path);
    }
}
