//! The key/value cache: a pool of fixed-size blocks shared by all sequences.
//!
//! Each sequence has a block table; position `p` of a sequence lives in block
//! `table[p / BLOCK_TOKENS]` at slot `p % BLOCK_TOKENS`. Within a layer a block holds, per
//! KV head, `BLOCK_TOKENS` rows of `head_dim` values, so one head's keys are contiguous
//! inside a block. Storage is f16 (as llama.cpp keeps it) or f32, and is zero-initialised
//! lazily by the OS, so an unused budget costs address space, not memory.
//!
//! Full blocks of a prompt can be published to a prefix cache ([`pool`]); a later sequence
//! starting with the same tokens attaches them instead of recomputing them. Shared blocks
//! are only ever read: a sequence writes past its attached prefix, into its own blocks.

mod pool;

use blink_kernels::numa::{NumaError, Topology, Zeroable};

use crate::memory::Storage;
use pool::{chain_hash, BlockPool};

use half::f16;
use thiserror::Error;

/// Tokens per block.
pub const BLOCK_TOKENS: usize = 16;

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F16,
    F32,
}

impl KvType {
    pub fn bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }

    pub fn parse(s: &str) -> Option<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Some(KvType::F16),
            "f32" => Some(KvType::F32),
            _ => None,
        }
    }
}

/// A value type the cache can store (f16 or f32).
pub use blink_kernels::attention::CacheElem as KvElem;

/// Shape of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Elements of one layer's K (or V) buffer: the whole pool of blocks.
    layer_elems: usize,
}

impl KvLayout {
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, n_blocks: usize) -> KvLayout {
        let mut l = KvLayout { n_layers, n_kv_heads, head_dim, layer_elems: 0 };
        l.layer_elems = n_blocks * l.block_elems();
        l
    }

    /// Elements of one block in one layer, for K or V.
    pub fn block_elems(&self) -> usize {
        self.n_kv_heads * BLOCK_TOKENS * self.head_dim
    }

    /// Bytes one token occupies across all layers, K and V.
    pub fn bytes_per_token(&self, ty: KvType) -> usize {
        2 * self.n_layers * self.n_kv_heads * self.head_dim * ty.bytes()
    }

    /// Offset of (layer, block, head, slot) in the K or V buffer.
    #[inline]
    pub fn offset(&self, layer: usize, block: u32, head: usize, slot: usize) -> usize {
        self.layer_offset(layer) + ((block as usize * self.n_kv_heads + head) * BLOCK_TOKENS + slot) * self.head_dim
    }

    #[inline]
    fn layer_offset(&self, layer: usize) -> usize {
        layer * self.layer_elems
    }
}

/// Errors of cache bookkeeping.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KvError {
    #[error("the KV cache is full: {needed} more blocks needed, {free} free")]
    Full { needed: usize, free: usize },
    #[error("unknown sequence id {0}")]
    UnknownSeq(usize),
}

/// Identifies a sequence's slot in the cache.
pub type SeqId = usize;

/// Read-only access to every sequence's block table.
#[derive(Clone, Copy)]
pub struct BlockTables<'a> {
    seqs: &'a [Option<SeqBlocks>],
}

impl BlockTables<'_> {
    /// The block table of `id` (empty for an unknown id).
    #[inline]
    pub fn get(&self, id: SeqId) -> &[u32] {
        self.seqs.get(id).and_then(Option::as_ref).map_or(&[], |s| &s.table)
    }
}

#[derive(Default)]
struct SeqBlocks {
    table: Vec<u32>,
    len: usize,
}

/// K and V buffers of one element type, all layers in one allocation each.
pub struct KvStore<T: KvElem + Zeroable> {
    pub k: Storage<T>,
    pub v: Storage<T>,
}

/// The storage, by element type.
pub enum KvData {
    F16(KvStore<f16>),
    F32(KvStore<f32>),
}

/// One part's share of the cache: the values of its key/value heads.
pub struct KvShard {
    pub layout: KvLayout,
    pub data: KvData,
}

/// The block pool and the sequences' block tables, and the values in one or more shards
/// (one per NUMA node's heads) that share those tables.
pub struct KvCache {
    n_blocks: usize,
    shards: Vec<KvShard>,
    pool: BlockPool,
    seqs: Vec<Option<SeqBlocks>>,
}

impl KvCache {
    /// A cache of `n_blocks` blocks of `BLOCK_TOKENS` tokens each, for `n_layers` layers
    /// of `n_kv_heads` heads of `head_dim` values, on the heap.
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, ty: KvType, n_blocks: usize) -> KvCache {
        Self::sharded(n_layers, &[(n_kv_heads, None)], head_dim, ty, n_blocks).expect("heap storage does not fail")
    }

    /// A cache whose values are split in shards of `heads` key/value heads each, each in
    /// its home (`None`: the heap; `Some((topology, node))`: memory bound to that node).
    pub fn sharded(
        n_layers: usize,
        shards: &[(usize, Option<(&Topology, usize)>)],
        head_dim: usize,
        ty: KvType,
        n_blocks: usize,
    ) -> Result<KvCache, NumaError> {
        let shards = shards
            .iter()
            .map(|&(heads, home)| {
                let layout = KvLayout::new(n_layers, heads, head_dim, n_blocks);
                let elems = n_layers * layout.layer_elems;
                let data = match ty {
                    KvType::F16 => KvData::F16(KvStore { k: Storage::zeroed(elems, home)?, v: Storage::zeroed(elems, home)? }),
                    KvType::F32 => KvData::F32(KvStore { k: Storage::zeroed(elems, home)?, v: Storage::zeroed(elems, home)? }),
                };
                Ok(KvShard { layout, data })
            })
            .collect::<Result<Vec<_>, NumaError>>()?;
        Ok(KvCache { n_blocks, shards, pool: BlockPool::new(n_blocks), seqs: Vec::new() })
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(tokens: usize) -> usize {
        tokens.div_ceil(BLOCK_TOKENS)
    }

    /// The shards' layouts, in part order.
    pub fn layouts(&self) -> impl Iterator<Item = &KvLayout> {
        self.shards.iter().map(|s| &s.layout)
    }

    /// The storage for writing, with a read-only view of the block tables beside it.
    pub fn split_mut(&mut self) -> (BlockTables<'_>, &mut [KvShard]) {
        (BlockTables { seqs: &self.seqs }, &mut self.shards)
    }

    pub fn kv_type(&self) -> KvType {
        match self.shards[0].data {
            KvData::F16(_) => KvType::F16,
            KvData::F32(_) => KvType::F32,
        }
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

    /// Release a sequence and its blocks (published ones stay cached for reuse).
    pub fn free_seq(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.get_mut(id).and_then(Option::take) {
            for &b in seq.table.iter().rev() {
                self.pool.release(b);
            }
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
        let needed = Self::blocks_for(tokens).saturating_sub(have);
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
        let keep = Self::blocks_for(len);
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

    /// Attach to the empty sequence `id` the cached blocks that hold a prefix of `tokens`,
    /// leaving at least one token to compute. Returns how many tokens were attached.
    pub fn attach_prefix(&mut self, id: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        if self.seq(id)?.len != 0 {
            return Ok(0);
        }
        let usable = tokens.len().saturating_sub(1) / BLOCK_TOKENS;
        let mut hash = 0;
        let mut attached = 0;
        for chunk in tokens.chunks_exact(BLOCK_TOKENS).take(usable) {
            hash = chain_hash(hash, chunk);
            let Some(b) = self.pool.lookup(hash, chunk) else { break };
            self.pool.retain(b);
            let seq = self.seqs[id].as_mut().expect("checked above");
            seq.table.push(b);
            seq.len += BLOCK_TOKENS;
            attached += BLOCK_TOKENS;
        }
        Ok(attached)
    }

    /// Publish the full blocks of `id` whose tokens (`tokens`, the sequence so far) are
    /// computed, so later sequences can attach them.
    pub fn publish_prefix(&mut self, id: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let seq = self.seq(id)?;
        let full = seq.len.min(tokens.len()) / BLOCK_TOKENS;
        let mut hash = 0;
        for (i, chunk) in tokens.chunks_exact(BLOCK_TOKENS).take(full).enumerate() {
            hash = chain_hash(hash, chunk);
            let b = self.seqs[id].as_ref().expect("checked above").table[i];
            self.pool.publish(b, hash, chunk);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(blocks: usize) -> KvCache {
        KvCache::new(2, 3, 8, KvType::F16, blocks)
    }

    #[test]
    fn grow_allocates_whole_blocks_and_fails_atomically() {
        let mut kv = cache(4);
        let a = kv.new_seq();
        kv.grow(a, 17).unwrap();
        assert_eq!(kv.block_table(a).unwrap().len(), 2);
        assert_eq!(kv.free_blocks(), 2);
        let b = kv.new_seq();
        assert_eq!(kv.grow(b, 50), Err(KvError::Full { needed: 4, free: 2 }));
        assert_eq!(kv.free_blocks(), 2);
        assert_eq!(kv.seq_len(b).unwrap(), 0);
    }

    #[test]
    fn prefixes_are_shared_cached_and_evicted() {
        let mut kv = cache(6);
        let prompt: Vec<u32> = (0..40).collect();
        let a = kv.new_seq();
        kv.grow(a, 40).unwrap();
        kv.publish_prefix(a, &prompt).unwrap();
        // A second sequence with the same prompt attaches the two full blocks.
        let b = kv.new_seq();
        assert_eq!(kv.attach_prefix(b, &prompt).unwrap(), 32);
        assert_eq!(kv.block_table(b).unwrap(), &kv.block_table(a).unwrap()[..2]);
        assert_eq!(kv.seq_len(b).unwrap(), 32);
        // A prompt of exactly two blocks keeps its last token to compute: one block attaches.
        let c = kv.new_seq();
        assert_eq!(kv.attach_prefix(c, &prompt[..32]).unwrap(), 16);
        kv.free_seq(a);
        kv.free_seq(b);
        kv.free_seq(c);
        // All blocks are available again; two of them still hold the cached prefix.
        assert_eq!((kv.free_blocks(), kv.cached_blocks()), (6, 2));
        let d = kv.new_seq();
        assert_eq!(kv.attach_prefix(d, &prompt).unwrap(), 32);
        kv.free_seq(d);
        // Filling the cache evicts the cached blocks.
        let e = kv.new_seq();
        kv.grow(e, 96).unwrap();
        assert_eq!(kv.cached_blocks(), 0);
        let f = kv.new_seq();
        assert_eq!(kv.attach_prefix(f, &prompt).unwrap(), 0);
    }

    #[test]
    fn free_and_truncate_return_blocks() {
        let mut kv = cache(4);
        let a = kv.new_seq();
        kv.grow(a, 64).unwrap();
        kv.truncate(a, 20).unwrap();
        assert_eq!(kv.block_table(a).unwrap().len(), 2);
        assert_eq!(kv.seq_len(a).unwrap(), 20);
        kv.free_seq(a);
        assert_eq!(kv.free_blocks(), 4);
        assert_eq!(kv.seq_len(a), Err(KvError::UnknownSeq(a)));
    }
}
