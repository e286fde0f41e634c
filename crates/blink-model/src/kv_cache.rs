//! The key/value cache: a pool of fixed-size blocks shared by all sequences.
//!
//! Each sequence owns a block table; position `p` of a sequence lives in block
//! `table[p / BLOCK_TOKENS]` at slot `p % BLOCK_TOKENS`. Within a layer a block holds, per
//! KV head, `BLOCK_TOKENS` rows of `head_dim` values, so one head's keys are contiguous
//! inside a block. Storage is f16 (as llama.cpp keeps it) or f32, and is zero-initialised
//! lazily by the OS, so an unused budget costs address space, not memory.

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
pub struct KvStore<T> {
    pub k: Vec<T>,
    pub v: Vec<T>,
}

/// The storage, by element type.
pub enum KvData {
    F16(KvStore<f16>),
    F32(KvStore<f32>),
}

/// The block pool and the sequences' block tables.
pub struct KvCache {
    layout: KvLayout,
    n_blocks: usize,
    data: KvData,
    free: Vec<u32>,
    seqs: Vec<Option<SeqBlocks>>,
}

impl KvCache {
    /// A cache of `n_blocks` blocks of `BLOCK_TOKENS` tokens each, for `n_layers` layers
    /// of `n_kv_heads` heads of `head_dim` values.
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, ty: KvType, n_blocks: usize) -> KvCache {
        let layout = KvLayout::new(n_layers, n_kv_heads, head_dim, n_blocks);
        let elems = n_layers * layout.layer_elems;
        let data = match ty {
            KvType::F16 => KvData::F16(KvStore { k: vec![f16::ZERO; elems], v: vec![f16::ZERO; elems] }),
            KvType::F32 => KvData::F32(KvStore { k: vec![0f32; elems], v: vec![0f32; elems] }),
        };
        KvCache {
            layout,
            n_blocks,
            data,
            free: (0..n_blocks as u32).rev().collect(),
            seqs: Vec::new(),
        }
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(tokens: usize) -> usize {
        tokens.div_ceil(BLOCK_TOKENS)
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// The storage for writing, with a read-only view of the block tables beside it.
    pub fn split_mut(&mut self) -> (BlockTables<'_>, &mut KvData) {
        (BlockTables { seqs: &self.seqs }, &mut self.data)
    }

    pub fn kv_type(&self) -> KvType {
        match self.data {
            KvData::F16(_) => KvType::F16,
            KvData::F32(_) => KvType::F32,
        }
    }

    /// Total blocks in the pool.
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Blocks not owned by any sequence.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
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

    /// Release a sequence and its blocks.
    pub fn free_seq(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.get_mut(id).and_then(Option::take) {
            self.free.extend(seq.table.iter().rev());
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

    /// Make room for `id` to hold `len` tokens and record that length. Either every needed
    /// block is allocated or nothing changes.
    pub fn grow(&mut self, id: SeqId, len: usize) -> Result<(), KvError> {
        let have = self.seq(id)?.table.len();
        let needed = Self::blocks_for(len).saturating_sub(have);
        if needed > self.free.len() {
            return Err(KvError::Full { needed, free: self.free.len() });
        }
        let start = self.free.len() - needed;
        let new_blocks: Vec<u32> = self.free.drain(start..).rev().collect();
        let seq = self.seq_mut(id)?;
        seq.table.extend(new_blocks);
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
        self.free.extend(released.into_iter().rev());
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
