//! The cache's bookkeeping: which blocks each sequence owns, the free pool and the prefix
//! cache. No values live here, so it can admit and release sequences while a step's pass
//! writes the values ([`super::KvCache::parts_mut`]); the pass reads a [`TableSnapshot`]
//! taken when the step was prepared.

use super::pool::{chain_hash, BlockPool};
use super::{KvError, BLOCK_TOKENS};

/// Identifies a sequence's slot in the cache.
pub type SeqId = usize;

/// Blocks needed to hold `tokens` tokens.
pub(super) fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK_TOKENS)
}

#[derive(Default)]
struct SeqBlocks {
    table: Vec<u32>,
    len: usize,
}

/// Leading slots of a cached block to copy into a block a sequence owns, before the
/// sequence's next step: how a prefix that ends inside a block is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotCopy {
    pub seq: SeqId,
    pub src: u32,
    pub dst: u32,
    pub slots: usize,
}

/// The block pool and every sequence's block table.
pub struct KvBlocks {
    n_blocks: usize,
    pool: BlockPool,
    seqs: Vec<Option<SeqBlocks>>,
    /// Copies owed before the next pass; each pins its source block until done.
    copies: Vec<SlotCopy>,
}

/// Copies of some sequences' block tables, as they were when a step was prepared.
/// Reused from step to step, it allocates only when it meets a longer table or a higher
/// sequence id than before.
#[derive(Default)]
pub struct TableSnapshot {
    blocks: Vec<u32>,
    /// Per sequence id: where its copy is in `blocks` (start, length); empty if not taken.
    spans: Vec<(u32, u32)>,
    taken: Vec<SeqId>,
}

impl TableSnapshot {
    /// A snapshot with room for `blocks` block ids before it allocates.
    pub fn with_capacity(blocks: usize) -> TableSnapshot {
        TableSnapshot { blocks: Vec::with_capacity(blocks), ..Default::default() }
    }

    /// Forget every copy.
    pub fn clear(&mut self) {
        for &id in &self.taken {
            self.spans[id] = (0, 0);
        }
        self.taken.clear();
        self.blocks.clear();
    }

    /// Copy the block table of `id` (once per sequence until cleared).
    pub fn take(&mut self, blocks: &KvBlocks, id: SeqId) -> Result<(), KvError> {
        if self.spans.len() <= id {
            self.spans.resize(id + 1, (0, 0));
        }
        if self.spans[id].1 != 0 {
            return Ok(());
        }
        let table = blocks.block_table(id)?;
        self.spans[id] = (self.blocks.len() as u32, table.len() as u32);
        self.blocks.extend_from_slice(table);
        self.taken.push(id);
        Ok(())
    }

    /// The copied block table of `id` (empty if it was not taken).
    #[inline]
    pub fn get(&self, id: SeqId) -> &[u32] {
        match self.spans.get(id) {
            Some(&(start, len)) => &self.blocks[start as usize..(start + len) as usize],
            None => &[],
        }
    }
}

impl KvBlocks {
    pub(super) fn new(n_blocks: usize) -> KvBlocks {
        KvBlocks { n_blocks, pool: BlockPool::new(n_blocks), seqs: Vec::new(), copies: Vec::new() }
    }

    /// Total blocks in the pool.
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Blocks not owned by any sequence (free, or cached and evictable).
    pub fn free_blocks(&self) -> usize {
        self.pool.available()
    }

    /// Blocks without owners that still hold a cached prefix.
    pub fn cached_blocks(&self) -> usize {
        self.pool.cached()
    }

    /// Token capacity of the whole pool.
    pub fn capacity_tokens(&self) -> usize {
        self.n_blocks * BLOCK_TOKENS
    }

    /// A new, empty sequence.
    pub fn new_seq(&mut self) -> SeqId {
        if let Some(id) = self.seqs.iter().position(Option::is_none) {
            self.seqs[id] = Some(SeqBlocks::default());
            id
        } else {
            self.seqs.push(Some(SeqBlocks::default()));
            self.seqs.len() - 1
        }
    }

    /// Release a sequence and its blocks (published ones stay cached for reuse), and drop
    /// the copies it was owed.
    pub fn free_seq(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.get_mut(id).and_then(Option::take) {
            for &b in seq.table.iter().rev() {
                self.pool.release(b);
            }
        }
        let mut i = 0;
        while i < self.copies.len() {
            if self.copies[i].seq == id {
                let c = self.copies.swap_remove(i);
                self.pool.release(c.src);
            } else {
                i += 1;
            }
        }
    }

    /// The slot copies owed before the next pass ([`super::KvCache::apply_copies`]).
    pub fn pending_copies(&self) -> &[SlotCopy] {
        &self.copies
    }

    /// The owed copies are done: unpin their sources.
    pub(super) fn copies_done(&mut self) {
        for c in self.copies.drain(..) {
            self.pool.release(c.src);
        }
    }

    fn seq(&self, id: SeqId) -> Result<&SeqBlocks, KvError> {
        self.seqs.get(id).and_then(Option::as_ref).ok_or(KvError::UnknownSeq(id))
    }

    fn seq_mut(&mut self, id: SeqId) -> Result<&mut SeqBlocks, KvError> {
        self.seqs.get_mut(id).and_then(Option::as_mut).ok_or(KvError::UnknownSeq(id))
    }

    /// Tokens currently stored for `id`.
    pub fn seq_len(&self, id: SeqId) -> Result<usize, KvError> {
        Ok(self.seq(id)?.len)
    }

    /// The block table of `id`.
    pub fn block_table(&self, id: SeqId) -> Result<&[u32], KvError> {
        Ok(&self.seq(id)?.table)
    }

    /// Make sure `id` has blocks for `tokens` tokens, without changing its length. Either
    /// every needed block is allocated or nothing changes.
    pub fn reserve(&mut self, id: SeqId, tokens: usize) -> Result<(), KvError> {
        let have = self.seq(id)?.table.len();
        let needed = blocks_for(tokens).saturating_sub(have);
        if needed > self.pool.available() {
            return Err(KvError::Full { needed, free: self.pool.available() });
        }
        for _ in 0..needed {
            let b = self.pool.alloc().expect("availability checked above");
            self.seqs[id].as_mut().expect("checked above").table.push(b);
        }
        Ok(())
    }

    /// Make room for `id` to hold `len` tokens and record that length. Either every needed
    /// block is allocated or nothing changes.
    pub fn grow(&mut self, id: SeqId, len: usize) -> Result<(), KvError> {
        self.reserve(id, len)?;
        let seq = self.seq_mut(id)?;
        seq.len = seq.len.max(len);
        Ok(())
    }

    /// Forget everything of `id` from position `len` on, returning whole blocks to the pool.
    pub fn truncate(&mut self, id: SeqId, len: usize) -> Result<(), KvError> {
        let keep = blocks_for(len);
        let seq = self.seq_mut(id)?;
        if len >= seq.len {
            return Ok(());
        }
        seq.len = len;
        let released: Vec<u32> = seq.table.drain(keep.min(seq.table.len())..).collect();
        for b in released.into_iter().rev() {
            self.pool.release(b);
        }
        Ok(())
    }

    /// Attach to the empty sequence `id` what the prefix cache holds of a prefix of
    /// `tokens`, leaving at least the last token to compute. Whole cached blocks are shared;
    /// where the match ends inside a block, the matching leading slots of a cached block
    /// are copied into a fresh block of `id` before its next step ([`SlotCopy`]). Returns
    /// how many tokens were attached.
    pub fn attach_prefix(&mut self, id: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        if self.seq(id)?.len != 0 {
            return Ok(0);
        }
        let usable = &tokens[..tokens.len().saturating_sub(1)];
        let seq = self.seqs[id].as_mut().expect("checked above");
        let mut parent = 0;
        for chunk in usable.chunks_exact(BLOCK_TOKENS) {
            let Some(b) = self.pool.lookup(parent, chunk) else { break };
            self.pool.retain(b);
            seq.table.push(b);
            seq.len += BLOCK_TOKENS;
            parent = chain_hash(parent, chunk);
        }
        let rest = &usable[seq.len..];
        if let Some((src, slots)) = self.pool.lookup_partial(parent, &rest[..rest.len().min(BLOCK_TOKENS)]) {
            // Pinned until copied, so that the allocation below cannot evict it.
            self.pool.retain(src);
            match self.pool.alloc() {
                Some(dst) => {
                    seq.table.push(dst);
                    seq.len += slots;
                    self.copies.push(SlotCopy { seq: id, src, dst, slots });
                }
                None => self.pool.release(src),
            }
        }
        Ok(seq.len)
    }

    /// Publish the computed tokens of `id` (`tokens`, the sequence so far, of which the
    /// cache holds the first `seq_len`), so later sequences can attach them: every full
    /// block, and the leading slots of the last one.
    pub fn publish_prefix(&mut self, id: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let seq = self.seqs.get(id).and_then(Option::as_ref).ok_or(KvError::UnknownSeq(id))?;
        let known = &tokens[..seq.len.min(tokens.len())];
        let mut parent = 0;
        for (chunk, &b) in known.chunks(BLOCK_TOKENS).zip(&seq.table) {
            self.pool.publish(b, parent, chunk);
            parent = chain_hash(parent, chunk);
        }
        Ok(())
    }
}
