//! Buffers that live on the heap or in memory bound to a NUMA node: zeroed, lazily backed,
//! chosen by a home that is either.

use std::ops::{Deref, DerefMut};

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
