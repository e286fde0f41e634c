//! The key/value cache: a pool of fixed-size blocks shared by all sequences.
//!
//! Each sequence has a block table; position `p` of a sequence lives in block
//! `table[p / BLOCK_TOKENS]` at slot `p % BLOCK_TOKENS`. Within a layer each KV head has its
//! own run of the pool's blocks, each `BLOCK_TOKENS` rows of `head_dim` values: one head's
//! keys are contiguous inside a block and across blocks of consecutive ids, which a
//! sequence that reserves its blocks together mostly has, so attention reads it as one
//! stream the hardware prefetcher follows. Storage is f16 (as llama.cpp keeps it) or f32,
//! and is zero-initialised lazily by the OS, so an unused budget costs address space, not
//! memory. Memory the cache no longer needs goes back to the OS: at most a set number of
//! blocks stay cached without owners ([`KvBlocks::limit_cached_tokens`]), and the pages of
//! free blocks are given back ([`KvBlocks::return_free_memory`]); new sequences take
//! resident blocks first, so the memory in use stays compact.
//!
//! A sequence's computed tokens can be published to a prefix cache ([`pool`]); a later
//! sequence starting with the same tokens attaches them instead of recomputing them: whole
//! blocks are shared, and where the match ends inside a block, its leading slots are copied
//! into a block of the new sequence's own before its next step. Shared blocks are only
//! ever read: a sequence writes past its attached prefix, into its own blocks. Prefixes are
//! cached under the key of the model that computed them ([`PrefixKey`]: the base model's,
//! or an adapter's), given once per sequence ([`KvBlocks::new_seq_with`]).
//!
//! In a model's sliding-window layers, the blocks a sequence has run a whole window past
//! give their pages back ([`slide`], [`KvCache::with_sliding_window`]).

mod bits;
mod blocks;
mod pool;
mod release;
mod slide;
#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod slide_tests;

use std::ops::Range;

use blink_runtime::numa::{NumaError, Topology, Zeroable};
use blink_runtime::storage::ReleasableStorage;

pub use blocks::{KvBlocks, SeqId, SlotCopy, TableSnapshot, RETURN_BATCH};
pub use pool::PrefixKey;

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

/// Shape of the cache: a window of layers (all of them, or one device's share of a ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// The model layer the cache's first layer holds.
    pub first_layer: usize,
    /// Layers held, from `first_layer` on.
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Blocks in the pool.
    n_blocks: usize,
    /// Elements of one layer's K (or V) buffer: the whole pool of blocks.
    layer_elems: usize,
}

impl KvLayout {
    /// Model layers `layers` of `n_kv_heads` heads of `head_dim` values, in `n_blocks` blocks.
    pub fn new(layers: Range<usize>, n_kv_heads: usize, head_dim: usize, n_blocks: usize) -> KvLayout {
        let mut l = KvLayout { first_layer: layers.start, n_layers: layers.len(), n_kv_heads, head_dim, n_blocks, layer_elems: 0 };
        l.layer_elems = n_blocks * l.block_elems();
        l
    }

    /// The model layers the cache holds.
    pub fn layers(&self) -> Range<usize> {
        self.first_layer..self.first_layer + self.n_layers
    }

    /// Elements of one block in one layer, for K or V.
    pub fn block_elems(&self) -> usize {
        self.n_kv_heads * BLOCK_TOKENS * self.head_dim
    }

    /// Bytes one token occupies across all layers, K and V.
    pub fn bytes_per_token(&self, ty: KvType) -> usize {
        2 * self.n_layers * self.n_kv_heads * self.head_dim * ty.bytes()
    }

    /// Offset of (model layer, block, head, slot) in the K or V buffer; `layer` is one of
    /// [`KvLayout::layers`].
    #[inline]
    pub fn offset(&self, layer: usize, block: u32, head: usize, slot: usize) -> usize {
        self.layer_offset(layer) + ((head * self.n_blocks + block as usize) * BLOCK_TOKENS + slot) * self.head_dim
    }

    #[inline]
    fn layer_offset(&self, layer: usize) -> usize {
        debug_assert!(self.layers().contains(&layer), "layer {layer} outside the cache's {:?}", self.layers());
        (layer - self.first_layer) * self.layer_elems
    }
}

/// Errors of cache bookkeeping.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KvError {
    #[error("the KV cache is full: {needed} more blocks needed, {free} free")]
    Full { needed: usize, free: usize },
    #[error("unknown sequence id {0}")]
    UnknownSeq(usize),
    #[error("block {block} is not in a cache of {n_blocks} blocks")]
    NoSuchBlock { block: u32, n_blocks: usize },
}

/// K and V buffers of one element type, all layers in one allocation each.
pub struct KvStore<T: KvElem + Zeroable> {
    pub k: ReleasableStorage<T>,
    pub v: ReleasableStorage<T>,
}

impl<T: KvElem + Zeroable> KvStore<T> {
    /// Copy the first `slots` positions of block `src` into block `dst`, every layer and head.
    fn copy_slots(&mut self, layout: &KvLayout, src: u32, dst: u32, slots: usize) {
        let n = slots * layout.head_dim;
        for layer in layout.layers() {
            for head in 0..layout.n_kv_heads {
                let (from, to) = (layout.offset(layer, src, head, 0), layout.offset(layer, dst, head, 0));
                self.k.copy_within(from..from + n, to);
                self.v.copy_within(from..from + n, to);
            }
        }
    }
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

/// The block bookkeeping ([`KvBlocks`], which a `KvCache` derefs to) and the values, in
/// one or more shards (one per NUMA node's heads) that share its block tables.
pub struct KvCache {
    blocks: KvBlocks,
    shards: Vec<KvShard>,
}

/// Copy the first `slots` positions of block `src` into block `dst` in every shard.
fn copy_in_shards(shards: &mut [KvShard], src: u32, dst: u32, slots: usize) {
    for shard in shards {
        match &mut shard.data {
            KvData::F16(s) => s.copy_slots(&shard.layout, src, dst, slots),
            KvData::F32(s) => s.copy_slots(&shard.layout, src, dst, slots),
        }
    }
}

impl std::ops::Deref for KvCache {
    type Target = KvBlocks;
    fn deref(&self) -> &KvBlocks {
        &self.blocks
    }
}

impl std::ops::DerefMut for KvCache {
    fn deref_mut(&mut self) -> &mut KvBlocks {
        &mut self.blocks
    }
}

impl KvCache {
    /// A cache of `n_blocks` blocks of `BLOCK_TOKENS` tokens each, for `n_layers` layers
    /// of `n_kv_heads` heads of `head_dim` values, on the heap.
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, ty: KvType, n_blocks: usize) -> KvCache {
        Self::sharded(0..n_layers, &[(n_kv_heads, None)], head_dim, ty, n_blocks).expect("heap storage does not fail")
    }

    /// A cache of model layers `layers` whose values are split in shards of `heads`
    /// key/value heads each, each in its home (`None`: the heap; `Some((topology, node))`:
    /// memory bound to that node).
    pub fn sharded(
        layers: Range<usize>,
        shards: &[(usize, Option<(&Topology, usize)>)],
        head_dim: usize,
        ty: KvType,
        n_blocks: usize,
    ) -> Result<KvCache, NumaError> {
        let n_layers = layers.len();
        let mut regions = Vec::with_capacity(2 * shards.len());
        let shards = shards
            .iter()
            .map(|&(heads, home)| {
                // Blocks of this shard's keys (or values) over all layers.
                let block_bytes = n_layers.saturating_mul(heads * BLOCK_TOKENS * head_dim * ty.bytes());
                let too_large = NumaError::TooLarge { len: n_blocks, elem_size: block_bytes };
                let elems = n_blocks.checked_mul(heads * BLOCK_TOKENS * head_dim).and_then(|e| e.checked_mul(n_layers)).ok_or(too_large)?;
                let layout = KvLayout::new(layers.clone(), heads, head_dim, n_blocks);
                fn store<T: KvElem + Zeroable>(elems: usize, home: Option<(&Topology, usize)>) -> Result<KvStore<T>, NumaError> {
                    Ok(KvStore { k: ReleasableStorage::zeroed(elems, home)?, v: ReleasableStorage::zeroed(elems, home)? })
                }
                let data = match ty {
                    KvType::F16 => KvData::F16(store(elems, home)?),
                    KvType::F32 => KvData::F32(store(elems, home)?),
                };
                let (k, v) = match &data {
                    KvData::F16(s) => (s.k.releaser(), s.v.releaser()),
                    KvData::F32(s) => (s.k.releaser(), s.v.releaser()),
                };
                regions.extend([k, v].map(|pages| release::Region { pages, runs: n_layers * heads }));
                Ok(KvShard { layout, data })
            })
            .collect::<Result<Vec<_>, NumaError>>()?;
        let releaser = release::Releaser::new(regions, n_blocks, BLOCK_TOKENS * head_dim * ty.bytes());
        Ok(KvCache { blocks: KvBlocks::new(n_blocks, Some(releaser)), shards })
    }

    /// Give back the pages that the layers `is_local` says are sliding-window ones (their
    /// queries see `window` positions) hold for blocks past every window ([`slide`]).
    pub fn with_sliding_window(mut self, window: usize, is_local: impl Fn(usize) -> bool) -> KvCache {
        let mut regions = Vec::with_capacity(2 * self.shards.len());
        let head_dim = self.shards.first().map_or(0, |s| s.layout.head_dim);
        let head_block = BLOCK_TOKENS * head_dim * self.kv_type().bytes();
        for shard in &self.shards {
            let l = &shard.layout;
            let runs: Vec<usize> = (0..l.n_layers).filter(|&i| is_local(l.first_layer + i)).flat_map(|i| (0..l.n_kv_heads).map(move |h| i * l.n_kv_heads + h)).collect();
            let (k, v) = match &shard.data {
                KvData::F16(s) => (s.k.releaser(), s.v.releaser()),
                KvData::F32(s) => (s.k.releaser(), s.v.releaser()),
            };
            regions.extend([k, v].map(|pages| slide::LocalRuns { pages, runs: runs.clone() }));
        }
        if regions.iter().any(|r| !r.runs.is_empty()) {
            let n_blocks = self.blocks.n_blocks();
            self.blocks.set_slide(slide::Slide::new(window, regions, n_blocks, head_block));
        }
        self
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(tokens: usize) -> usize {
        blocks::blocks_for(tokens)
    }

    /// Make the slot copies that sequences attached to cached prefixes are owed (see
    /// [`KvBlocks::attach_prefix`]). Run before each pass; a no-op when none are owed.
    pub fn apply_copies(&mut self) {
        if self.blocks.pending_copies().is_empty() {
            return;
        }
        for c in self.blocks.pending_copies() {
            copy_in_shards(&mut self.shards, c.src, c.dst, c.slots);
        }
        self.blocks.copies_done();
    }

    /// Copy the first `slots` positions of block `src` into block `dst` now, values only
    /// (a ring device making a copy its head's bookkeeping owes; see
    /// [`KvBlocks::mirror_cut`]).
    pub fn copy_slots(&mut self, src: u32, dst: u32, slots: usize) -> Result<(), KvError> {
        let n_blocks = self.blocks.n_blocks();
        for block in [src, dst] {
            if block as usize >= n_blocks {
                return Err(KvError::NoSuchBlock { block, n_blocks });
            }
        }
        copy_in_shards(&mut self.shards, src, dst, slots.min(BLOCK_TOKENS));
        Ok(())
    }

    /// The shards' layouts, in part order.
    pub fn layouts(&self) -> impl Iterator<Item = &KvLayout> {
        self.shards.iter().map(|s| &s.layout)
    }

    /// The bookkeeping and the values, apart: a step's pass writes the values while the
    /// bookkeeping may admit or release other sequences, and give free blocks' pages back.
    /// Only for the pass, which touches owned blocks only: whoever held the values beside
    /// the bookkeeping could otherwise read pages as they are given back.
    pub(crate) fn parts_mut(&mut self) -> (&mut KvBlocks, &mut [KvShard]) {
        (&mut self.blocks, &mut self.shards)
    }

    pub fn kv_type(&self) -> KvType {
        match self.shards[0].data {
            KvData::F16(_) => KvType::F16,
            KvData::F32(_) => KvType::F32,
        }
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
        // A second sequence with the same prompt shares the two full blocks and is owed a
        // copy of the third's first seven slots, the last token being left to compute.
        let b = kv.new_seq();
        assert_eq!(kv.attach_prefix(b, &prompt).unwrap(), 39);
        let (ta, tb) = (kv.block_table(a).unwrap().to_vec(), kv.block_table(b).unwrap().to_vec());
        assert_eq!(tb[..2], ta[..2]);
        assert_ne!(tb[2], ta[2]);
        assert_eq!(kv.pending_copies(), &[SlotCopy { seq: b, src: ta[2], dst: tb[2], slots: 7 }]);
        assert_eq!(kv.seq_len(b).unwrap(), 39);
        // A prompt of exactly two blocks keeps its last token to compute.
        let c = kv.new_seq();
        assert_eq!(kv.attach_prefix(c, &prompt[..32]).unwrap(), 31);
        assert_eq!(kv.pending_copies().len(), 2);
        kv.free_seq(c);
        assert_eq!(kv.pending_copies().len(), 1);
        kv.free_seq(a);
        // The copy's source stays pinned until the copy is made.
        assert_eq!(kv.free_blocks(), 6 - 3 - 1);
        kv.apply_copies();
        assert!(kv.pending_copies().is_empty());
        kv.free_seq(b);
        // All blocks are available again; a's three still hold the cached prefix.
        assert_eq!((kv.free_blocks(), kv.cached_blocks()), (6, 3));
        let d = kv.new_seq();
        assert_eq!(kv.attach_prefix(d, &prompt).unwrap(), 39);
        kv.free_seq(d);
        // Filling the cache evicts the cached blocks.
        let e = kv.new_seq();
        kv.grow(e, 96).unwrap();
        assert_eq!(kv.cached_blocks(), 0);
        let f = kv.new_seq();
        assert_eq!(kv.attach_prefix(f, &prompt).unwrap(), 0);
    }

    #[test]
    fn copied_slots_carry_every_layer_and_head() {
        let mut kv = cache(4);
        let prompt: Vec<u32> = (100..110).collect();
        let a = kv.new_seq();
        kv.grow(a, 10).unwrap();
        let src = kv.block_table(a).unwrap()[0];
        let layout = *kv.layouts().next().unwrap();
        let KvData::F16(store) = &mut kv.shards[0].data else { panic!("an f16 cache") };
        for layer in 0..2 {
            for head in 0..3 {
                for slot in 0..BLOCK_TOKENS {
                    let at = layout.offset(layer, src, head, slot);
                    for i in 0..8 {
                        store.k[at + i] = f16::from_f32((layer * 1000 + head * 100 + slot * 10 + i) as f32);
                        store.v[at + i] = -store.k[at + i];
                    }
                }
            }
        }
        kv.publish_prefix(a, &prompt).unwrap();
        let b = kv.new_seq();
        assert_eq!(kv.attach_prefix(b, &[100, 101, 102, 103, 7, 8]).unwrap(), 4);
        let dst = kv.block_table(b).unwrap()[0];
        kv.apply_copies();
        let KvData::F16(store) = &kv.shards[0].data else { panic!("an f16 cache") };
        for layer in 0..2 {
            for head in 0..3 {
                for slot in 0..BLOCK_TOKENS {
                    let (from, to) = (layout.offset(layer, src, head, slot), layout.offset(layer, dst, head, slot));
                    let copied = store.k[to..to + 8] == store.k[from..from + 8] && store.v[to..to + 8] == store.v[from..from + 8];
                    assert_eq!(copied, slot < 4, "layer {layer} head {head} slot {slot}");
                }
            }
        }
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
