//! Buffers that live on the heap or in memory bound to a NUMA node, and buffers whose
//! unused pages can be given back to the OS while they are in use.

use std::ops::{Deref, DerefMut, Range};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::numa::{NodeBuffer, NumaError, Topology, Zeroable};

/// A zero-initialised buffer: on the heap, or bound to a NUMA node.
pub enum Storage<T: Zeroable> {
    Heap(Vec<T>),
    Node(NodeBuffer<T>),
}

impl<T: Zeroable> Storage<T> {
    /// `len` zeros at `home` (`None`: the heap). Either way the OS provides the pages
    /// lazily, so untouched parts cost no memory.
    pub fn zeroed(len: usize, home: Option<(&Topology, usize)>) -> Result<Self, NumaError> {
        Ok(match home {
            None => Storage::Heap(heap_zeroed(len)?),
            Some((topology, node)) => Storage::Node(NodeBuffer::new(topology, node, len)?),
        })
    }
}

impl<T: Zeroable> Deref for Storage<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Storage::Heap(v) => v,
            Storage::Node(b) => b,
        }
    }
}

impl<T: Zeroable> DerefMut for Storage<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Storage::Heap(v) => v,
            Storage::Node(b) => b,
        }
    }
}

/// A zeroed buffer whose whole pages can be handed back to the OS while it is in use: the
/// user reads and writes the elements, and the bookkeeping that knows which parts hold
/// nothing any more (the KV cache's free blocks) holds a [`PageReleaser`] for it. The
/// memory lives until both are dropped.
pub struct ReleasableStorage<T: Zeroable> {
    ptr: NonNull<T>,
    len: usize,
    /// Owns the memory; never accessed, only kept alive (and shared with the releasers).
    memory: Arc<Storage<T>>,
}

// SAFETY: the elements are reached only through `&self`/`&mut self` as with a `Box<[T]>`;
// the shared `Arc` only keeps the memory alive.
unsafe impl<T: Zeroable + Send + Sync> Send for ReleasableStorage<T> {}
// SAFETY: as above; shared access only hands out `&[T]`.
unsafe impl<T: Zeroable + Send + Sync> Sync for ReleasableStorage<T> {}

impl<T: Zeroable + Send + Sync + 'static> ReleasableStorage<T> {
    /// `len` zeros in a page-aligned mapping of their own (bound to `home`'s node if given),
    /// so that pages and the elements on them line up the same way whatever the allocator.
    pub fn zeroed(len: usize, home: Option<(&Topology, usize)>) -> Result<Self, NumaError> {
        let buffer = match home {
            None => NodeBuffer::unbound(len)?,
            Some((topology, node)) => NodeBuffer::new(topology, node, len)?,
        };
        Ok(Self::new(Storage::Node(buffer)))
    }

    /// Make `storage` releasable (any storage: its pages need not be aligned with anything).
    pub fn new(mut storage: Storage<T>) -> Self {
        let len = storage.len();
        let ptr = NonNull::new(storage.as_mut_ptr()).unwrap_or(NonNull::dangling());
        ReleasableStorage { ptr, len, memory: Arc::new(storage) }
    }

    /// A handle that can give this buffer's pages back to the OS.
    pub fn releaser(&self) -> PageReleaser {
        let mut bytes = self.len * std::mem::size_of::<T>();
        if let Storage::Node(_) = *self.memory {
            // A mapping of its own: the rest of the last page is the buffer's too.
            bytes = bytes.next_multiple_of(page_size());
        }
        let keep: Arc<dyn Send + Sync> = self.memory.clone();
        PageReleaser { base: self.ptr.as_ptr() as usize, bytes, _keep: keep }
    }
}

impl<T: Zeroable> Deref for ReleasableStorage<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` is valid for `len` initialised elements (the storage's, kept alive by
        // `memory`, which is never accessed), or dangling with `len == 0`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> DerefMut for ReleasableStorage<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive (releasers only ever
        // zero pages nobody is using, see `PageReleaser::release`).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Gives whole pages of a [`ReleasableStorage`] back to the OS (`madvise(MADV_DONTNEED)`):
/// they stop counting in the process's resident memory and read as zero when next touched.
/// Keeps the buffer's memory alive. Off Linux nothing can be released.
pub struct PageReleaser {
    /// Address and extent of the buffer: its bytes, and for a mapping of its own the rest
    /// of its last page.
    base: usize,
    bytes: usize,
    _keep: Arc<dyn Send + Sync>,
}

impl PageReleaser {
    /// Address of the buffer's first byte (pages are aligned to addresses, not to it).
    pub fn base(&self) -> usize {
        self.base
    }

    /// Extent of the buffer in bytes: its elements', and for a mapping of its own the rest
    /// of its last page.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The whole pages inside bytes `range` of the buffer, as addresses (may be empty).
    fn pages_within(&self, range: Range<usize>) -> Range<usize> {
        let page = page_size();
        let end = range.end.min(self.bytes);
        let start = (self.base + range.start.min(end)).next_multiple_of(page);
        let end = (self.base + end) / page * page;
        start..end.max(start)
    }

    /// Give back the whole pages inside bytes `range` of the buffer (clipped to it) in one
    /// call. Returns the bytes given back (0 if no whole page lies there), or the errno of a
    /// refused call (-1 off Linux).
    ///
    /// # Safety
    /// No thread may access those bytes during the call, and nothing may rely on what they
    /// held: they read as zero afterwards.
    pub unsafe fn release(&self, range: Range<usize>) -> Result<usize, i32> {
        let pages = self.pages_within(range);
        if pages.is_empty() {
            return Ok(0);
        }
        sys::dont_need(pages.start, pages.len())?;
        Ok(pages.len())
    }

    /// How many of the whole pages inside bytes `range` of the buffer are resident
    /// (`mincore`), and how many whole pages there are; `None` where the OS will not say.
    pub fn resident_pages(&self, range: Range<usize>) -> Option<(usize, usize)> {
        let pages = self.pages_within(range);
        let n = pages.len() / page_size();
        Some((sys::resident(pages.start, n)?, n))
    }
}

/// The system page size.
pub fn page_size() -> usize {
    crate::numa::page_size()
}

mod sys {
    /// `madvise(MADV_DONTNEED)` over whole pages `[addr, addr + bytes)`.
    #[cfg(target_os = "linux")]
    pub(super) fn dont_need(addr: usize, bytes: usize) -> Result<(), i32> {
        // SAFETY: the caller owns the pages and no one uses them; the kernel validates the range.
        let r = unsafe { libc::madvise(addr as *mut libc::c_void, bytes, libc::MADV_DONTNEED) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL))
        }
    }

    /// Resident pages among the `n` pages from `addr` (page-aligned).
    #[cfg(target_os = "linux")]
    pub(super) fn resident(addr: usize, n: usize) -> Option<usize> {
        if n == 0 {
            return Some(0);
        }
        let mut vec = vec![0u8; n];
        // SAFETY: `vec` has one byte per page of the range, which the kernel validates.
        let r = unsafe { libc::mincore(addr as *mut libc::c_void, n * super::page_size(), vec.as_mut_ptr().cast()) };
        (r == 0).then(|| vec.iter().filter(|&&b| b & 1 != 0).count())
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn dont_need(_addr: usize, _bytes: usize) -> Result<(), i32> {
        Err(-1)
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn resident(_addr: usize, _n: usize) -> Option<usize> {
        None
    }
}

/// A vector of `n` zeros from `alloc_zeroed`, whose pages the OS provides lazily;
/// `vec![x; n]` would write every element of types it does not know to be zero.
/// Failing, not aborting, when there is no memory: sizes come from the user.
fn heap_zeroed<T: Zeroable>(n: usize) -> Result<Vec<T>, NumaError> {
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    let elem_size = std::mem::size_of::<T>();
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| NumaError::TooLarge { len: n, elem_size })?;
    // SAFETY: Zeroable types are valid as all-zero bits; the pointer comes from the global
    // allocator with exactly this layout, as Vec requires.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout) as *mut T;
        if ptr.is_null() {
            return Err(NumaError::OutOfMemory { bytes: layout.size() });
        }
        Ok(Vec::from_raw_parts(ptr, n, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Given-back pages read as zero and leave the process's resident set, bytes around them
    /// keep their values; on the heap (not page-aligned) and in a mapping of its own, whose
    /// last page is all the buffer's.
    #[cfg(target_os = "linux")]
    #[test]
    fn released_pages_read_zero_and_their_neighbours_keep_their_values() {
        let page = page_size();
        let len = 10 * page + 100;
        for (storage, mapped) in [(Storage::<u8>::zeroed(len, None).unwrap(), false), (Storage::Node(NodeBuffer::unbound(len).unwrap()), true)] {
            let mut s = ReleasableStorage::new(storage);
            s.fill(7);
            let r = s.releaser();
            assert_eq!(r.len(), if mapped { 11 * page } else { len });
            let (resident, whole) = r.resident_pages(0..r.len()).unwrap();
            assert_eq!(resident, whole);
            let (at, end) = (1000, 6 * page + 5);
            // SAFETY: nothing reads or writes the buffer meanwhile.
            let given = unsafe { r.release(at..end) }.unwrap();
            let first = (r.base() + at).next_multiple_of(page) - r.base();
            let last = (r.base() + end) / page * page - r.base();
            assert_eq!(given, last - first);
            assert_eq!(r.resident_pages(first..last).unwrap(), (0, (last - first) / page));
            let tail = if mapped { page } else { 0 };
            // SAFETY: as above.
            assert_eq!(unsafe { r.release(10 * page..r.len()) }.unwrap(), tail);
            for (i, &x) in s.iter().enumerate() {
                let zero = (first..last).contains(&i) || (mapped && i >= 10 * page);
                assert_eq!(x, if zero { 0 } else { 7 }, "byte {i}");
            }
            // No whole page inside, no call.
            // SAFETY: as above.
            assert_eq!(unsafe { r.release(5..page / 2) }.unwrap(), 0);
        }
    }
}
