//! Memory that lives on one NUMA node.
//!
//! A [`NodeBuffer`] is an anonymous, page-aligned mapping of zeroed elements. On a topology
//! read from sysfs its range is bound to the node with `mbind(MPOL_PREFERRED)` before any
//! page exists, so every page faults in on that node whoever touches it, while the node has
//! memory (past that, on another node rather than ending the process). Binding needs no
//! privilege, but containers often forbid the call; the buffer is then unbound
//! ([`NodeBuffer::binding`] says why) and pages land where they are first touched, which is
//! why [`NodeBuffer::first_touch_in`] has the node's own pinned threads fault them in.
//! [`NodeBuffer::placement`] asks the kernel where each page really is.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::groups::NodePool;
use super::sys;
use super::topology::Topology;
use super::NumaError;

/// Types for which all-zero bytes are a valid value, so a fresh mapping is a valid slice.
///
/// # Safety
/// Implement only for `Copy` types with no padding-sensitive invariants whose all-zero bit
/// pattern is a valid value (plain numbers, arrays and `repr(C)` structs of them).
pub unsafe trait Zeroable: Copy {}

macro_rules! zeroable {
    ($($t:ty),*) => {
        // SAFETY: all-zero bytes are a valid value of each of these primitive types.
        $(unsafe impl Zeroable for $t {})*
    };
}
zeroable!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64, half::f16, half::bf16);
// SAFETY: an array of zeroable elements is zeroable.
unsafe impl<T: Zeroable, const N: usize> Zeroable for [T; N] {}

/// Whether a buffer's pages are bound to its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// `mbind(MPOL_PREFERRED)` succeeded: pages are allocated on the node while it has room.
    Bound,
    /// Not attempted: the topology is simulated or a fallback, the OS is not Linux, or the
    /// buffer has no pages.
    Skipped,
    /// `mbind` failed with this errno (`EPERM`/`ENOSYS` in containers, `EINVAL` for a node
    /// without memory); pages land where they are first touched.
    Failed(i32),
}

/// A zero-initialised `[T]` in its own mapping, bound to one NUMA node where possible.
pub struct NodeBuffer<T: Zeroable> {
    ptr: NonNull<T>,
    len: usize,
    /// Length of the mapping in bytes (a multiple of the page size); 0 when nothing is mapped.
    mapped: usize,
    /// Index of the node in the topology.
    node: usize,
    /// The node's OS id.
    os_node: usize,
    binding: Binding,
}

// SAFETY: the buffer owns its mapping exclusively, like a `Box<[T]>`.
unsafe impl<T: Zeroable + Send> Send for NodeBuffer<T> {}
// SAFETY: shared access only hands out `&[T]`.
unsafe impl<T: Zeroable + Sync> Sync for NodeBuffer<T> {}

impl<T: Zeroable> NodeBuffer<T> {
    /// `len` zeroed elements for the node at index `node` of `topology`, bound to it when
    /// the topology is real. Pages are not faulted in: see [`NodeBuffer::first_touch`].
    pub fn new(topology: &Topology, node: usize, len: usize) -> Result<NodeBuffer<T>, NumaError> {
        let n_nodes = topology.n_nodes();
        let os_node = topology.nodes().get(node).ok_or(NumaError::NoSuchNode { index: node, n_nodes })?.id;
        let elem_size = std::mem::size_of::<T>();
        let page = page_size();
        if std::mem::align_of::<T>() > page {
            return Err(NumaError::Alignment(std::mem::align_of::<T>()));
        }
        let too_large = NumaError::TooLarge { len, elem_size };
        let bytes = len.checked_mul(elem_size).ok_or(too_large)?;
        if bytes == 0 {
            let ptr = NonNull::dangling();
            return Ok(NodeBuffer { ptr, len, mapped: 0, node, os_node, binding: Binding::Skipped });
        }
        let mapped = bytes
            .checked_next_multiple_of(page)
            .filter(|&m| m <= isize::MAX as usize)
            .ok_or(NumaError::TooLarge { len, elem_size })?;
        let base = sys::map(mapped).map_err(|source| NumaError::Map { bytes: mapped, source })?;
        let binding = if topology.binds_memory() && cfg!(target_os = "linux") {
            match sys::bind(base.as_ptr(), mapped, os_node) {
                Ok(()) => Binding::Bound,
                Err(errno) => Binding::Failed(errno),
            }
        } else {
            Binding::Skipped
        };
        Ok(NodeBuffer { ptr: base.cast(), len, mapped, node, os_node, binding })
    }

    /// `len` zeroed elements in a mapping of their own, bound to no node (reported as node
    /// 0): memory for a process that does not split itself over nodes.
    pub fn unbound(len: usize) -> Result<NodeBuffer<T>, NumaError> {
        NodeBuffer::new(&Topology::fallback(&[0]), 0, len)
    }

    /// Ask for the buffer to be backed by transparent huge pages, before its pages are
    /// touched: memory streamed again and again (weights) then costs a TLB entry per 2 MiB
    /// instead of per 4 KiB, and the hardware prefetcher is not stopped at every 4 KiB
    /// page boundary. Returns whether the kernel took the advice (it may not: huge pages
    /// disabled, or not Linux); the buffer works the same either way.
    pub fn advise_huge_pages(&self) -> bool {
        self.mapped > 0 && sys::advise_huge_pages(self.ptr.as_ptr().cast(), self.mapped, true)
    }

    /// Ask for ordinary pages only, even where the system backs memory with huge pages
    /// unasked (for memory given back page by page); whether the kernel accepted it.
    pub fn advise_small_pages(&self) -> bool {
        self.mapped > 0 && sys::advise_huge_pages(self.ptr.as_ptr().cast(), self.mapped, false)
    }

    /// Copy `src` into elements `at..at + src.len()` through a shared reference, for a
    /// buffer filled piece by piece while earlier pieces are already being read.
    ///
    /// # Safety
    /// No reference to those elements may exist during the call, and no other thread may
    /// access them.
    pub unsafe fn write_at(&self, at: usize, src: &[T]) {
        assert!(at.checked_add(src.len()).is_some_and(|end| end <= self.len), "write past the buffer");
        std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(at), src.len());
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Index of the buffer's node in its topology.
    pub fn node(&self) -> usize {
        self.node
    }

    /// The OS id of the buffer's node.
    pub fn os_node(&self) -> usize {
        self.os_node
    }

    /// Whether `mbind` placed the pages on the node.
    pub fn is_bound(&self) -> bool {
        self.binding == Binding::Bound
    }

    /// What became of binding the pages.
    pub fn binding(&self) -> Binding {
        self.binding
    }

    /// The elements (the start is page-aligned, so at least 64-byte aligned).
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `ptr` is valid for `len` initialised (zeroed, `T: Zeroable`) elements and
        // aligned, or dangling with `len * size_of::<T>() == 0`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Pages in the mapping.
    pub fn n_pages(&self) -> usize {
        self.mapped / page_size()
    }

    /// Fault every page in from the calling thread, keeping the contents. Call it from a
    /// thread pinned to the node so unbound pages land there too.
    pub fn first_touch(&mut self) {
        let base = self.ptr.as_ptr().cast::<u8>();
        // SAFETY: `&mut self` gives exclusive access to all `n_pages` pages of the mapping.
        unsafe { touch_pages(base, 0..self.n_pages()) };
    }

    /// Fault every page in from the threads of this buffer's node in `pool`, each taking a
    /// contiguous share of the pages; the contents are kept. The pool must have been built
    /// from the same topology. Node index 0 includes the caller of `run`; pin it with
    /// [`NodePool::pin_caller`] if its pages must land on node 0 without binding.
    pub fn first_touch_in(&mut self, pool: &NodePool) -> Result<(), NumaError> {
        let n_nodes = pool.n_nodes();
        let pool_os_node = pool.node_id(self.node).ok_or(NumaError::NoSuchNode { index: self.node, n_nodes })?;
        if pool_os_node != self.os_node {
            return Err(NumaError::NodeMismatch { index: self.node, buffer: self.os_node, pool: pool_os_node });
        }
        let n_pages = self.n_pages();
        let base = self.ptr.as_ptr() as usize;
        let node = self.node;
        pool.run(|w| {
            if w.node == node {
                // SAFETY: `&mut self` is held for the whole run, so nothing else accesses the
                // mapping, and the threads of the node touch disjoint page ranges.
                unsafe { touch_pages(base as *mut u8, w.share(n_pages, 1)) };
            }
        });
        Ok(())
    }

    /// The OS node of each page as the kernel reports it now. Negative entries are unknown:
    /// on Linux `-errno`, e.g. `-ENOENT` for a page not yet faulted in, or `-EPERM`/`-ENOSYS`
    /// where the query is forbidden; elsewhere `-1`.
    pub fn placement(&self) -> Vec<i32> {
        let page = page_size();
        let pages: Vec<usize> = (0..self.n_pages()).map(|i| self.ptr.as_ptr() as usize + i * page).collect();
        sys::placement(&pages)
    }
}

impl<T: Zeroable> Deref for NodeBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Zeroable> DerefMut for NodeBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.as_mut_slice()
    }
}

impl<T: Zeroable> std::fmt::Debug for NodeBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBuffer")
            .field("len", &self.len)
            .field("node", &self.node)
            .field("os_node", &self.os_node)
            .field("binding", &self.binding)
            .finish()
    }
}

impl<T: Zeroable> Drop for NodeBuffer<T> {
    fn drop(&mut self) {
        if self.mapped > 0 {
            // SAFETY: `ptr` came from `sys::map(self.mapped)` and is unmapped only here.
            unsafe { sys::unmap(self.ptr.as_ptr().cast(), self.mapped) };
        }
    }
}

/// The OS node of the page holding `ptr`, or `None` if it is not resident or the kernel
/// will not say. Never dereferences `ptr`.
pub fn node_of_page<T>(ptr: *const T) -> Option<i32> {
    let page = ptr as usize & !(page_size() - 1);
    sys::placement(&[page]).first().copied().filter(|&n| n >= 0)
}

/// Read and rewrite one byte of each page in `pages`, faulting it in for writing.
///
/// # Safety
/// `base` must start a live mapping covering `pages`, which no other thread accesses during
/// the call.
unsafe fn touch_pages(base: *mut u8, pages: std::ops::Range<usize>) {
    let page = page_size();
    for i in pages {
        let p = base.add(i * page);
        // Volatile so the write (of the same value) is not elided: it is what faults the page.
        p.write_volatile(p.read_volatile());
    }
}

/// The system page size.
pub fn page_size() -> usize {
    sys::page_size()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the kernel answers placement queries here (seccomp may forbid them).
    #[cfg(target_os = "linux")]
    fn placement_known(status: &[i32]) -> bool {
        status.iter().all(|&s| s >= 0)
    }

    #[test]
    fn buffers_are_zeroed_aligned_and_writable() {
        let t = Topology::simulated(3);
        let mut b = NodeBuffer::<f32>::new(&t, 2, 10_001).unwrap();
        assert_eq!(b.len(), 10_001);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert!(b.iter().all(|&x| x == 0.0));
        assert_eq!(b.binding(), Binding::Skipped);
        assert_eq!((b.node(), b.os_node()), (2, 2));
        b[10_000] = 3.5;
        b.first_touch();
        assert_eq!(b[10_000], 3.5, "touching keeps the contents");
        assert_eq!(b.n_pages(), (10_001 * 4usize).div_ceil(page_size()));

        let empty = NodeBuffer::<u64>::new(&t, 0, 0).unwrap();
        assert!(empty.is_empty() && empty.placement().is_empty());
        assert!(matches!(NodeBuffer::<u8>::new(&t, 3, 1), Err(NumaError::NoSuchNode { index: 3, n_nodes: 3 })));
        assert!(matches!(NodeBuffer::<u64>::new(&t, 0, usize::MAX / 4), Err(NumaError::TooLarge { .. })));
    }

    /// Whether `move_pages` may be called here (seccomp profiles often forbid it).
    #[cfg(target_os = "linux")]
    fn move_pages_available() -> bool {
        // SAFETY: a query of zero pages reads and writes nothing.
        let r = unsafe { libc::syscall(libc::SYS_move_pages, 0, 0usize, 0usize, 0usize, 0usize, 0) };
        r == 0
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn untouched_pages_are_not_resident() {
        let t = Topology::detect();
        let b = NodeBuffer::<u8>::new(&t, 0, 4 * page_size()).unwrap();
        let status = b.placement();
        assert_eq!(status.len(), 4);
        if move_pages_available() {
            assert!(status.iter().all(|&s| s == -libc::ENOENT), "{status:?}");
            assert_eq!(node_of_page(b.as_ptr()), None);
        }
    }

    /// A node the kernel does not have: binding fails, and the buffer works unbound.
    #[cfg(target_os = "linux")]
    #[test]
    fn failed_binding_leaves_a_usable_buffer() {
        let root = std::env::temp_dir().join(format!("blink-numa-nobind-{}", std::process::id()));
        let node = root.join("node4000");
        std::fs::create_dir_all(&node).unwrap();
        let cpu = crate::affinity::allowed_cpus()[0];
        std::fs::write(node.join("cpulist"), format!("{cpu}\n")).unwrap();
        std::fs::write(node.join("distance"), "10\n").unwrap();
        let t = Topology::from_sysfs(&root, &[cpu]);
        let _ = std::fs::remove_dir_all(&root);
        let t = t.unwrap();
        assert!(t.binds_memory());
        let mut b = NodeBuffer::<u64>::new(&t, 0, 1000).unwrap();
        assert!(!b.is_bound());
        assert!(matches!(b.binding(), Binding::Failed(e) if e > 0), "{:?}", b.binding());
        b.first_touch();
        b[999] = 7;
        assert_eq!(b.iter().sum::<u64>(), 7);
    }

    #[cfg(target_os = "linux")]
    /// On every real node: allocate there, touch from a thread pinned to the node, and check
    /// that the kernel reports every page on that node. On a one-node machine this is node 0.
    #[test]
    fn pages_touched_by_a_pinned_thread_live_on_its_node() {
        let t = Topology::detect();
        for (index, node) in t.nodes().iter().enumerate() {
            let len = 37 * page_size() + 123;
            let buf = NodeBuffer::<u8>::new(&t, index, len).unwrap();
            let cpus = node.cpus.clone();
            let buf = std::thread::spawn(move || {
                let mut buf = buf;
                crate::affinity::pin_current_thread(&cpus);
                buf.first_touch();
                buf
            })
            .join()
            .unwrap();
            let status = buf.placement();
            assert_eq!(status.len(), 38);
            if !placement_known(&status) && status.iter().all(|&s| s == -libc::EPERM || s == -libc::ENOSYS) {
                eprintln!("page placement cannot be queried here ({status:?}); skipping the check");
                return;
            }
            let expected = node.id as i32;
            assert!(status.iter().all(|&s| s == expected), "node {}: binding {:?}, pages on {status:?}", node.id, buf.binding());
            assert_eq!(node_of_page(buf.as_ptr().wrapping_add(len - 1)), Some(expected));
        }
    }

    #[cfg(target_os = "linux")]
    /// The same through a node pool: each node's own threads fault its buffer in.
    #[test]
    fn pool_first_touch_places_pages_on_each_node() {
        let t = Topology::detect();
        let pool = NodePool::new(&t, &vec![1; t.n_nodes()]).unwrap();
        pool.pin_caller();
        for (index, node) in t.nodes().iter().enumerate() {
            let mut buf = NodeBuffer::<u16>::new(&t, index, 9 * page_size()).unwrap();
            buf.first_touch_in(&pool).unwrap();
            let status = buf.placement();
            if !placement_known(&status) {
                eprintln!("page placement cannot be queried here ({status:?}); skipping the check");
                return;
            }
            assert!(status.iter().all(|&s| s == node.id as i32), "node {}: {status:?}", node.id);
        }
        // A buffer from another topology is refused.
        let other = Topology::simulated(t.n_nodes() + 1);
        let mut stray = NodeBuffer::<u8>::new(&other, t.n_nodes(), 1).unwrap();
        assert!(stray.first_touch_in(&pool).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn pool_first_touch_on_simulated_nodes_keeps_contents() {
        let t = Topology::simulated(3);
        let pool = NodePool::new(&t, &[2, 1, 3]).unwrap();
        let mut buf = NodeBuffer::<u32>::new(&t, 2, 50 * page_size() / 4 + 7).unwrap();
        let n = buf.len();
        buf.iter_mut().enumerate().step_by(97).for_each(|(i, x)| *x = i as u32);
        buf.first_touch_in(&pool).unwrap();
        assert!(buf.iter().enumerate().all(|(i, &x)| x == if i % 97 == 0 { i as u32 } else { 0 }));
        assert_eq!(buf.len(), n);
        let status = buf.placement();
        assert!(status.iter().all(|&s| s != -libc::ENOENT), "every page was faulted in: {status:?}");
    }
}
