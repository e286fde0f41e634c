//! Where one home's long-lived copies (a model part's weights) live: a few large mappings,
//! each advised to be backed by transparent huge pages, handed out piece by piece.
//!
//! Data streamed from memory every step (weights, in a decode step) costs a TLB miss per
//! 4 KiB page, and the hardware prefetcher stops at every page boundary; in 2 MiB pages
//! neither happens. One mapping per piece (a matrix) would be too small for huge pages, so
//! pieces are packed one after another into 32 MiB chunks, starting on a 2 MiB boundary.
//! Untouched pages cost nothing, so a chunk's unused tail costs at most one huge page.

use std::cell::RefCell;
use std::sync::Arc;

use crate::numa::{NodeBuffer, NumaError, Topology};

/// Bytes a chunk holds, unless one piece needs more.
const CHUNK_BYTES: usize = 32 << 20;
/// The huge page size the chunks are laid out for.
const HUGE_PAGE: usize = 2 << 20;
/// Alignment of each piece (a cache line, as vector loads want).
const PIECE_ALIGN: usize = 64;

/// A piece of an arena chunk: `len` bytes at `at` in `chunk`, which it keeps alive.
pub struct Piece {
    pub chunk: Arc<NodeBuffer<u8>>,
    pub at: usize,
    pub len: usize,
}

struct Chunk {
    buf: Arc<NodeBuffer<u8>>,
    used: usize,
}

/// Hands out pieces of chunks in one home: unbound memory, or memory bound to a node.
pub struct Arena<'a> {
    node: Option<(&'a Topology, usize)>,
    current: RefCell<Option<Chunk>>,
    huge: bool,
}

impl<'a> Arena<'a> {
    pub fn new(node: Option<(&'a Topology, usize)>) -> Arena<'a> {
        Arena { node, current: RefCell::new(None), huge: true }
    }

    /// An arena in ordinary pages: for pieces whose memory is given back and taken again
    /// piece by piece, which a huge page would round up to 2 MiB.
    pub fn small_pages(node: Option<(&'a Topology, usize)>) -> Arena<'a> {
        Arena { node, current: RefCell::new(None), huge: false }
    }

    /// A copy of `bytes` in the arena.
    pub fn place(&self, bytes: &[u8]) -> Result<Piece, NumaError> {
        let piece = self.reserve(bytes.len())?;
        // SAFETY: pieces never overlap and a reserved piece is not referenced yet; the
        // arena is used from one thread.
        unsafe { piece.chunk.write_at(piece.at, bytes) };
        Ok(piece)
    }

    /// `len` bytes of the arena, zero and untouched (they cost no memory until written):
    /// for contents filled later, and refilled at will by their owner.
    pub fn reserve(&self, len: usize) -> Result<Piece, NumaError> {
        let mut current = self.current.borrow_mut();
        let fits = current.as_ref().is_some_and(|c| c.used.next_multiple_of(PIECE_ALIGN) + len <= c.buf.len());
        if !fits {
            *current = Some(self.chunk(len)?);
        }
        let chunk = current.as_mut().expect("a chunk with room");
        let at = chunk.used.next_multiple_of(PIECE_ALIGN);
        chunk.used = at + len;
        Ok(Piece { chunk: chunk.buf.clone(), at, len })
    }

    /// A fresh chunk for at least `len` bytes, its use starting on a huge-page boundary.
    fn chunk(&self, len: usize) -> Result<Chunk, NumaError> {
        let size = CHUNK_BYTES.max(len.next_multiple_of(HUGE_PAGE)) + HUGE_PAGE;
        let buf = match self.node {
            Some((topology, node)) => NodeBuffer::new(topology, node, size)?,
            None => NodeBuffer::unbound(size)?,
        };
        if self.huge {
            buf.advise_huge_pages();
        } else {
            buf.advise_small_pages();
        }
        let start = (buf.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - buf.as_ptr() as usize;
        Ok(Chunk { buf: Arc::new(buf), used: start })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_hold_their_bytes_aligned_and_apart() {
        let arena = Arena::new(None);
        let small: Vec<u8> = (0..1000).map(|i| i as u8).collect();
        let big = vec![7u8; CHUNK_BYTES + HUGE_PAGE];
        let pieces: Vec<Piece> = [&small[..], &small[..10], &big[..], &small[..]].iter().map(|b| arena.place(b).unwrap()).collect();
        for (p, want) in pieces.iter().zip([&small[..], &small[..10], &big[..], &small[..]]) {
            assert_eq!(&p.chunk[p.at..p.at + p.len], want);
            assert_eq!((p.chunk.as_ptr() as usize + p.at) % PIECE_ALIGN, 0);
        }
        // The first piece starts a chunk on a huge-page boundary; the second follows it.
        assert_eq!((pieces[0].chunk.as_ptr() as usize + pieces[0].at) % HUGE_PAGE, 0);
        assert!(Arc::ptr_eq(&pieces[0].chunk, &pieces[1].chunk));
        assert_eq!(pieces[1].at, pieces[0].at + 1024);
        // A piece too big for the rest of the chunk gets a chunk of its own.
        assert!(!Arc::ptr_eq(&pieces[1].chunk, &pieces[2].chunk));
    }
}
