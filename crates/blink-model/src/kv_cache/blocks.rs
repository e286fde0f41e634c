//! The cache's bookkeeping: which blocks each sequence owns, the free pool and the prefix
//! cache. No values live here, so it can admit and release sequences while a step's pass
//! writes the values ([`super::KvCache::parts_mut`]); the pass reads a [`TableSnapshot`]
//! taken when the step was prepared. For the same reason it can give the memory of free
//! blocks back to the OS beside a pass ([`KvBlocks::return_free_memory`]): a pass touches
//! only blocks its sequences own.

use super::pool::{chain_hash, BlockPool, PrefixKey};
use super::release::Releaser;
use super::slide::Slide;
use super::{KvError, BLOCK_TOKENS};

/// Blocks freed since the last release that make the next one due
/// ([`KvBlocks::return_free_memory_if_due`]).
pub const RETURN_BATCH: usize = 16;

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
    /// Whose prefixes it attaches and publishes.
    key: PrefixKey,
    /// Leading blocks of `table` already considered dead in the sliding-window layers.
    slid: usize,
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
    /// Gives free blocks' pages back (`None`: bookkeeping without values).
    releaser: Option<Releaser>,
    /// Gives back the sliding-window layers' pages of blocks past every window (`None`: no
    /// such layers, or no values).
    slide: Option<Slide>,
    /// Entries a new sequence's block table has room for (see [`KvBlocks::set_table_room`]).
    table_room: usize,
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
    pub(super) fn new(n_blocks: usize, releaser: Option<Releaser>) -> KvBlocks {
        KvBlocks { n_blocks, pool: BlockPool::new(n_blocks), seqs: Vec::new(), copies: Vec::new(), releaser, slide: None, table_room: 0 }
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

    /// Keep at most `tokens` tokens' worth of whole blocks cached without owners (the
    /// prefix cache's share of the pool beyond what sequences own); past it the least
    /// recently released are freed, now and whenever more are released. Unlimited at first.
    pub fn limit_cached_tokens(&mut self, tokens: usize) {
        self.pool.set_cache_limit(tokens / BLOCK_TOKENS);
    }

    /// Most blocks kept cached without owners.
    pub fn cached_blocks_limit(&self) -> usize {
        self.pool.cache_limit()
    }

    /// Free blocks whose memory is with the OS: never touched, or given back.
    pub fn released_blocks(&self) -> usize {
        self.pool.released()
    }

    /// Bytes of one block's values over all layers, heads and shards, K and V.
    pub fn block_bytes(&self) -> usize {
        self.releaser.as_ref().map_or(0, |r| r.block_bytes)
    }

    /// At most how many bytes of values are resident: those of every block but the
    /// released ones, less the sliding-window layers' share of the blocks past every
    /// window that was given back (owned blocks never written are counted, though they
    /// hold no pages).
    pub fn resident_bytes(&self) -> usize {
        let slid_out = self.slide.as_ref().map_or(0, |s| self.pool.slid_out.len() * s.block_bytes);
        (self.n_blocks - self.released_blocks()) * self.block_bytes() - slid_out
    }

    /// Calls made to give memory back, and the bytes given back, since the cache was made
    /// (free blocks' and the sliding-window layers').
    pub fn returned(&self) -> (u64, u64) {
        let (c, b) = self.releaser.as_ref().map_or((0, 0), |r| (r.calls, r.bytes));
        let (sc, sb) = self.slide.as_ref().map_or((0, 0), |s| (s.calls, s.bytes));
        (c + sc, b + sb)
    }

    /// Give back the sliding-window layers' pages of blocks past every window (`slide`).
    pub(super) fn set_slide(&mut self, slide: Slide) {
        self.slide = Some(slide);
    }

    /// Whether blocks past their sequences' windows are marked dead in the sliding-window
    /// layers and their pages there given back (on by default where the model has such
    /// layers). Whoever cuts sequences back to positions they ran past (a benchmark's
    /// rewind) turns it off first, so that the cut keeps the window before it.
    pub fn release_slid_out(&mut self, on: bool) {
        if let Some(s) = &mut self.slide {
            s.enabled = on;
        }
    }

    /// The rows of `id` from now on start at `first_pos` (a step's first row of it): mark
    /// its blocks wholly before that row's window dead in the sliding-window layers, for
    /// the next release to give back. Blocks shared with other sequences are left whole.
    pub fn slide(&mut self, id: SeqId, first_pos: usize) {
        let Some(slide) = self.slide.as_mut().filter(|s| s.enabled) else { return };
        let Some(seq) = self.seqs.get_mut(id).and_then(Option::as_mut) else { return };
        let dead = slide.dead_blocks(first_pos).min(seq.table.len());
        for &b in &seq.table[seq.slid.min(dead)..dead] {
            if self.pool.owners(b) == 1 && self.pool.mark_slid(b) {
                slide.due.insert(b);
            }
        }
        seq.slid = seq.slid.max(dead);
    }

    /// Whether every block a row at position `len` of `table` reads in the sliding-window
    /// layers still holds its values there.
    fn window_whole(&self, table: &[u32], len: usize) -> bool {
        let Some(slide) = &self.slide else { return true };
        if len == 0 {
            return true;
        }
        let first = slide.dead_blocks(len);
        table[first.min(table.len())..blocks_for(len).min(table.len())].iter().all(|&b| !self.pool.is_slid(b))
    }

    /// Give the OS back the memory of the blocks freed since the last time (whole pages
    /// only free blocks occupy, in every layer, head, K and V; they read as zero when next
    /// used). Safe beside a pass. Off Linux, nothing is given back.
    pub fn return_free_memory(&mut self) {
        if let Some(r) = &mut self.releaser {
            if self.pool.dirty.len() > 0 {
                r.release(&mut self.pool);
            }
        }
        if let Some(s) = &mut self.slide {
            if s.due.len() > 0 {
                s.release(&mut self.pool);
            }
        }
    }

    /// [`KvBlocks::return_free_memory`] once [`RETURN_BATCH`] blocks have been freed since
    /// the last time, or as soon as no block is owned: meanwhile new sequences take the freed
    /// blocks back, memory and all, and the calls are fewer and longer. For a caller to run
    /// after each round of releases and admissions.
    pub fn return_free_memory_if_due(&mut self) {
        let dirty = self.pool.dirty.len();
        let slid = self.slide.as_ref().map_or(0, |s| s.due.len());
        if dirty >= RETURN_BATCH || slid >= RETURN_BATCH || (dirty > 0 && self.pool.available() == self.n_blocks) {
            self.return_free_memory();
        }
    }

    /// New sequences' block tables start with room for `tokens` tokens (at most the
    /// pool), so one that grows a block at a time, as a ring device's do, allocates nothing
    /// on the way there. Without it a table grows as it needs, which is enough for
    /// sequences that reserve their blocks when they start.
    pub fn set_table_room(&mut self, tokens: usize) {
        self.table_room = blocks_for(tokens).min(self.n_blocks);
    }

    /// A new, empty sequence of the base model (its prefixes under [`PrefixKey::BASE`]).
    pub fn new_seq(&mut self) -> SeqId {
        self.new_seq_with(PrefixKey::BASE)
    }

    /// A new, empty sequence whose blocks hold keys and values computed under `key` (the
    /// base model's or an adapter's): it attaches and publishes prefixes under that key
    /// only, so sequences of different keys never share blocks.
    pub fn new_seq_with(&mut self, key: PrefixKey) -> SeqId {
        let seq = SeqBlocks { key, table: Vec::with_capacity(self.table_room), ..SeqBlocks::default() };
        if let Some(id) = self.seqs.iter().position(Option::is_none) {
            self.seqs[id] = Some(seq);
            id
        } else {
            self.seqs.push(Some(seq));
            self.seqs.len() - 1
        }
    }

    /// The prefix key of `id`.
    pub fn seq_key(&self, id: SeqId) -> Result<PrefixKey, KvError> {
        Ok(self.seq(id)?.key)
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
    /// Returns the length kept: `len`, or 0 where the sliding-window layers already gave
    /// back part of the window before `len` (the sequence then starts over).
    pub fn truncate(&mut self, id: SeqId, len: usize) -> Result<usize, KvError> {
        let seq = self.seq(id)?;
        if len >= seq.len {
            return Ok(seq.len);
        }
        let len = if self.window_whole(&seq.table, len) { len } else { 0 };
        let keep = blocks_for(len);
        let seq = self.seq_mut(id)?;
        seq.len = len;
        seq.slid = seq.slid.min(keep);
        let released: Vec<u32> = seq.table.drain(keep.min(seq.table.len())..).collect();
        for b in released.into_iter().rev() {
            self.pool.release(b);
        }
        Ok(len)
    }

    /// Forget every cached prefix: the values were lost (a ring's devices emptied their
    /// caches). Cached blocks become free; no later sequence attaches what was published.
    pub fn forget_prefixes(&mut self) {
        self.pool.forget_all();
    }

    /// Mirroring (a ring device whose head keeps the bookkeeping, prefix cache and all):
    /// keep the first `blocks` blocks of `id`'s table, its length within them. A mirrored
    /// sequence's blocks are the head's choice; this cache's pool never hands them out nor
    /// takes them back, so such a cache allocates for no sequence ([`KvBlocks::grow`]
    /// within the table only) and forgets them with [`KvBlocks::forget_mirrored`].
    pub fn mirror_cut(&mut self, id: SeqId, blocks: usize) -> Result<(), KvError> {
        let seq = self.seq_mut(id)?;
        seq.table.truncate(blocks);
        seq.len = seq.len.min(blocks * BLOCK_TOKENS);
        Ok(())
    }

    /// Mirroring: block `block` is the next of `id`'s table.
    pub fn mirror_push(&mut self, id: SeqId, block: u32) -> Result<(), KvError> {
        let n_blocks = self.n_blocks;
        if block as usize >= n_blocks {
            return Err(KvError::NoSuchBlock { block, n_blocks });
        }
        self.seq_mut(id)?.table.push(block);
        Ok(())
    }

    /// Mirroring: set `id`'s length to `len` tokens, within its table.
    pub fn mirror_len(&mut self, id: SeqId, len: usize) -> Result<(), KvError> {
        let seq = self.seq_mut(id)?;
        seq.len = len.min(seq.table.len() * BLOCK_TOKENS);
        Ok(())
    }

    /// Mirroring: forget `id` (its blocks stay the head's business).
    pub fn forget_mirrored(&mut self, id: SeqId) {
        if let Some(slot) = self.seqs.get_mut(id) {
            *slot = None;
        }
    }

    /// Attach to the empty sequence `id` what the prefix cache holds of a prefix of
    /// `tokens` under the sequence's key, leaving at least the last token to compute. Whole
    /// cached blocks are shared; where the match ends inside a block, the matching leading
    /// slots of a cached block are copied into a fresh block of `id` before its next step
    /// ([`SlotCopy`]). Returns how many tokens were attached.
    pub fn attach_prefix(&mut self, id: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        if self.seq(id)?.len != 0 {
            return Ok(0);
        }
        let usable = &tokens[..tokens.len().saturating_sub(1)];
        let seq = self.seqs[id].as_mut().expect("checked above");
        let key = seq.key;
        let mut parent = key.root();
        for chunk in usable.chunks_exact(BLOCK_TOKENS) {
            let Some(b) = self.pool.lookup(key, parent, chunk) else { break };
            self.pool.retain(b);
            seq.table.push(b);
            seq.len += BLOCK_TOKENS;
            parent = chain_hash(parent, chunk);
        }
        let rest = &usable[seq.len..];
        if let Some((src, slots)) = self.pool.lookup_partial(key, parent, &rest[..rest.len().min(BLOCK_TOKENS)]) {
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
        // The first new row reads the window before it in the sliding-window layers: a
        // prefix whose window there was given back is not attached.
        let len = seq.len;
        let copied_whole = self.copies.last().filter(|c| c.seq == id).is_none_or(|c| !self.pool.is_slid(c.src));
        if !copied_whole || !self.window_whole(&self.seq(id)?.table, len) {
            self.free_seq(id);
            self.seqs[id] = Some(SeqBlocks { key, ..SeqBlocks::default() });
            return Ok(0);
        }
        Ok(len)
    }

    /// Publish the computed tokens of `id` (`tokens`, the sequence so far, of which the
    /// cache holds the first `seq_len`), so later sequences of the same key can attach
    /// them: every full block, and the leading slots of the last one.
    pub fn publish_prefix(&mut self, id: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let seq = self.seqs.get(id).and_then(Option::as_ref).ok_or(KvError::UnknownSeq(id))?;
        let known = &tokens[..seq.len.min(tokens.len())];
        let mut parent = seq.key.root();
        for (chunk, &b) in known.chunks(BLOCK_TOKENS).zip(&seq.table) {
            self.pool.publish(b, seq.key, parent, chunk);
            parent = chain_hash(parent, chunk);
        }
        Ok(())
    }
}

#[cfg(test)]
impl KvBlocks {
    /// Whether block `b` is free (neither owned nor cached), and whether it counts as released.
    pub(super) fn block_state(&self, b: u32) -> (bool, bool) {
        (self.pool.is_free(b), self.pool.is_released(b))
    }
}
