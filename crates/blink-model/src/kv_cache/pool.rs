//! Ownership of KV blocks: reference counts, the free blocks, and the prefix cache.
//!
//! A block is owned by one or more sequences (shared prefix blocks), cached: no owner, but
//! holding the keys and values of a known run of tokens, so a later request with the same
//! prefix can take it back instead of recomputing it, or free. At most a set number of
//! blocks stay cached ([`BlockPool::set_cache_limit`]); beyond it, and when fresh blocks
//! run out, the least recently released are evicted (freed).
//!
//! A free block's memory is resident (it was used since its pages were last given back) or
//! released (never touched, or given back to the OS: [`super::release`]). New owners get
//! resident blocks first, lowest id first, so the memory in use stays compact; blocks freed
//! since the last release are marked for the next one.
//!
//! A block's known contents may be full (every slot) or partial (its first slots, e.g. the
//! tail of a prompt). Full blocks are found by the chained hash of every token up to their
//! end and shared as they are; any block can also be found by its parent's hash and first
//! token, for a later sequence to copy its leading slots into a block of its own. Contents
//! are recorded under a [`PrefixKey`] (whose model computed them: the base model's or an
//! adapter's) and found only under the same key.

use std::collections::{BTreeMap, HashMap};

use super::bits::Bits;
use super::BLOCK_TOKENS;

/// Whose keys and values a sequence's blocks hold: the base model's, or those of the model
/// with one adapter applied. A prefix cached under one key is only ever attached by
/// sequences of the same key. Under [`PrefixKey::BASE`] the chained hashes are those of a
/// cache without keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PrefixKey {
    adapter: Option<u64>,
}

impl PrefixKey {
    /// The base model, without adapters.
    pub const BASE: PrefixKey = PrefixKey { adapter: None };

    /// The model with the adapter identified by `id` (chosen by the caller, e.g. a hash of
    /// the adapter's name and weights; the same id must always mean the same adapter).
    pub const fn adapter(id: u64) -> PrefixKey {
        PrefixKey { adapter: Some(id) }
    }

    /// The chained hash before the first block: the root of every prefix under this key.
    pub(crate) fn root(self) -> u64 {
        match self.adapter {
            None => 0,
            Some(id) => chain_hash(0x6164_6170_7465_7221, &[id as u32, (id >> 32) as u32]) | 1,
        }
    }
}

/// What a block is known to hold: the first `len` tokens of a block that follows the
/// prefix with chained hash `parent`, computed under `key`.
#[derive(Clone, PartialEq, Eq)]
struct Content {
    key: PrefixKey,
    parent: u64,
    tokens: [u32; BLOCK_TOKENS],
    len: usize,
}

impl Content {
    fn tokens(&self) -> &[u32] {
        &self.tokens[..self.len]
    }

    fn is_full(&self) -> bool {
        self.len == BLOCK_TOKENS
    }

    /// The chained hash up to the end of a full block.
    fn hash(&self) -> u64 {
        chain_hash(self.parent, self.tokens())
    }
}

pub(crate) struct BlockPool {
    refs: Vec<u32>,
    content: Vec<Option<Content>>,
    /// Free blocks whose memory may be resident.
    resident: Bits,
    /// Free blocks whose memory is not: never touched, or given back.
    released: Bits,
    /// Free resident blocks not yet offered to a release (a subset of `resident`).
    pub(super) dirty: Bits,
    /// Owned or cached blocks whose values in the sliding-window layers are dead (see
    /// [`super::slide`]), and those of them whose pages there were given back.
    slid: Bits,
    pub(super) slid_out: Bits,
    /// (key, chained hash) → the full block ending there.
    index: HashMap<(PrefixKey, u64), u32>,
    /// (parent hash, first token) → every block with known contents there.
    children: HashMap<(u64, u32), Vec<u32>>,
    /// Cached blocks without owners, by release time (oldest first).
    evictable: BTreeMap<u64, u32>,
    released_at: Vec<u64>,
    clock: u64,
    /// Most cached blocks kept without owners.
    cache_limit: usize,
}

/// The chained hash of a block: its parent's hash and its tokens.
pub(crate) fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = parent ^ 0x9e37_79b9_7f4a_7c15;
    for &t in tokens {
        h = (h ^ t as u64).wrapping_mul(0x0100_0000_01b3).rotate_left(29);
    }
    h ^ (h >> 31)
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl BlockPool {
    /// `n_blocks` free blocks, none of them resident, with no limit on cached blocks.
    pub(crate) fn new(n_blocks: usize) -> BlockPool {
        BlockPool {
            refs: vec![0; n_blocks],
            content: vec![None; n_blocks],
            resident: Bits::new(n_blocks),
            released: Bits::full(n_blocks),
            dirty: Bits::new(n_blocks),
            slid: Bits::new(n_blocks),
            slid_out: Bits::new(n_blocks),
            index: HashMap::new(),
            children: HashMap::new(),
            evictable: BTreeMap::new(),
            released_at: vec![0; n_blocks],
            clock: 0,
            cache_limit: usize::MAX,
        }
    }

    /// Blocks that can be handed out: free ones and evictable cached ones.
    pub(crate) fn available(&self) -> usize {
        self.resident.len() + self.released.len() + self.evictable.len()
    }

    /// Cached blocks without owners.
    pub(crate) fn cached(&self) -> usize {
        self.evictable.len()
    }

    /// Free blocks whose memory is not resident.
    pub(crate) fn released(&self) -> usize {
        self.released.len()
    }

    pub(crate) fn cache_limit(&self) -> usize {
        self.cache_limit
    }

    /// Keep at most `blocks` cached blocks without owners, evicting the least recently
    /// released beyond that now and whenever more are released.
    pub(crate) fn set_cache_limit(&mut self, blocks: usize) {
        self.cache_limit = blocks;
        self.evict_to_limit();
    }

    fn evict_to_limit(&mut self) {
        while self.evictable.len() > self.cache_limit {
            let Some((_, b)) = self.evictable.pop_first() else { break };
            self.forget(b);
            self.free(b);
        }
    }

    /// `b` has no owner and no contents any more.
    fn free(&mut self, b: u32) {
        self.resident.insert(b);
        self.dirty.insert(b);
        self.slid.remove(b);
        self.slid_out.remove(b);
    }

    /// How many sequences (and owed copies) hold `b`.
    pub(super) fn owners(&self, b: u32) -> u32 {
        self.refs[b as usize]
    }

    /// Whether `b`'s values in the sliding-window layers are dead.
    pub(super) fn is_slid(&self, b: u32) -> bool {
        self.slid.contains(b)
    }

    /// `b`'s values in the sliding-window layers are dead: no row that may still run reads
    /// them. Whether it was not marked before.
    pub(super) fn mark_slid(&mut self, b: u32) -> bool {
        self.slid.insert(b)
    }

    /// Whether `b` is free (not owned, not cached).
    #[inline]
    pub(super) fn is_free(&self, b: u32) -> bool {
        self.resident.contains(b) || self.released.contains(b)
    }

    /// Whether the free block `b` counts as released.
    #[cfg(test)]
    pub(super) fn is_released(&self, b: u32) -> bool {
        self.released.contains(b)
    }

    /// The free block `b`'s memory was given back.
    pub(super) fn mark_released(&mut self, b: u32) {
        if self.resident.remove(b) {
            self.released.insert(b);
        }
        self.dirty.remove(b);
    }

    /// A block for a new owner: a free one whose memory is resident, else a free one, else
    /// the least recently released cached one; the lowest id first among free ones.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let b = if let Some(b) = self.resident.pop_lowest() {
            self.dirty.remove(b);
            b
        } else if let Some(b) = self.released.pop_lowest() {
            b
        } else {
            let (_, b) = self.evictable.pop_first()?;
            self.forget(b);
            b
        };
        self.refs[b as usize] = 1;
        // A new owner writes every layer afresh.
        self.slid.remove(b);
        self.slid_out.remove(b);
        Some(b)
    }

    /// Drop what `b` is known to hold from the indexes.
    fn forget(&mut self, b: u32) {
        let Some(c) = self.content[b as usize].take() else { return };
        if c.is_full() && self.index.get(&(c.key, c.hash())) == Some(&b) {
            self.index.remove(&(c.key, c.hash()));
        }
        let key = (c.parent, c.tokens[0]);
        if let Some(list) = self.children.get_mut(&key) {
            list.retain(|&x| x != b);
            if list.is_empty() {
                self.children.remove(&key);
            }
        }
    }

    /// Forget every block's known contents (the values behind them are gone): cached
    /// blocks become free, owned ones stay owned.
    pub(crate) fn forget_all(&mut self) {
        for (_, b) in std::mem::take(&mut self.evictable) {
            self.content[b as usize] = None;
            self.free(b);
        }
        self.content.iter_mut().for_each(|c| *c = None);
        self.index.clear();
        self.children.clear();
    }

    /// Add an owner to `b` (a shared prefix block, or the source of a copy).
    pub(crate) fn retain(&mut self, b: u32) {
        let i = b as usize;
        if self.refs[i] == 0 {
            self.evictable.remove(&self.released_at[i]);
        }
        self.refs[i] += 1;
    }

    /// Drop an owner of `b`; without owners it becomes cached (if it has known contents,
    /// evicting the oldest cached block past the limit) or free.
    pub(crate) fn release(&mut self, b: u32) {
        let i = b as usize;
        debug_assert!(self.refs[i] > 0, "releasing an unowned block");
        self.refs[i] -= 1;
        if self.refs[i] == 0 {
            if self.content[i].is_some() {
                self.clock += 1;
                self.released_at[i] = self.clock;
                self.evictable.insert(self.clock, b);
                self.evict_to_limit();
            } else {
                self.free(b);
            }
        }
    }

    /// The block holding the full block `tokens` that follows the prefix hashed `parent`
    /// under `key`.
    pub(crate) fn lookup(&self, key: PrefixKey, parent: u64, tokens: &[u32]) -> Option<u32> {
        let b = *self.index.get(&(key, chain_hash(parent, tokens)))?;
        let c = self.content[b as usize].as_ref()?;
        (c.key == key && c.parent == parent && c.tokens() == tokens).then_some(b)
    }

    /// The block whose known leading slots, after the prefix hashed `parent` under `key`,
    /// match most of `tokens`, and how many match.
    pub(crate) fn lookup_partial(&self, key: PrefixKey, parent: u64, tokens: &[u32]) -> Option<(u32, usize)> {
        let first = *tokens.first()?;
        let candidates = self.children.get(&(parent, first))?;
        candidates
            .iter()
            .filter_map(|&b| {
                let c = self.content[b as usize].as_ref().filter(|c| c.key == key)?;
                Some((b, common_prefix(c.tokens(), tokens)))
            })
            .max_by_key(|&(_, n)| n)
    }

    /// Record that the owned block `b`, following the prefix hashed `parent` under `key`,
    /// holds the computed `tokens` in its first slots. Contents already known elsewhere are
    /// not recorded twice; a block's known contents only ever grow.
    pub(crate) fn publish(&mut self, b: u32, key: PrefixKey, parent: u64, tokens: &[u32]) {
        let i = b as usize;
        if tokens.is_empty() || tokens.len() > BLOCK_TOKENS {
            return;
        }
        if let Some(c) = &self.content[i] {
            // Known already: only a longer run of the same tokens adds anything.
            if c.key != key || c.parent != parent || tokens.len() <= c.len || !tokens.starts_with(c.tokens()) {
                return;
            }
            self.forget(b);
        } else if self.covered(key, parent, tokens) {
            return;
        }
        let mut t = [0u32; BLOCK_TOKENS];
        t[..tokens.len()].copy_from_slice(tokens);
        let c = Content { key, parent, tokens: t, len: tokens.len() };
        if c.is_full() {
            self.index.entry((key, c.hash())).or_insert(b);
        }
        self.children.entry((parent, tokens[0])).or_default().push(b);
        self.content[i] = Some(c);
    }

    /// Whether another block already holds at least `tokens` after `parent` under `key`.
    fn covered(&self, key: PrefixKey, parent: u64, tokens: &[u32]) -> bool {
        self.lookup_partial(key, parent, tokens).is_some_and(|(_, n)| n == tokens.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: PrefixKey = PrefixKey::BASE;

    #[test]
    fn cached_blocks_are_reused_then_evicted_oldest_first() {
        let mut p = BlockPool::new(3);
        let toks: Vec<u32> = (0..16).collect();
        let a = p.alloc().unwrap();
        p.publish(a, K, 0, &toks);
        p.release(a);
        assert_eq!((p.available(), p.cached()), (3, 1));
        assert_eq!(p.lookup(K, 0, &toks), Some(a));
        p.retain(a);
        assert_eq!(p.cached(), 0);
        p.release(a);
        // Exhaust the free blocks; the cached one goes last.
        let b = p.alloc().unwrap();
        let c = p.alloc().unwrap();
        assert!(b != a && c != a);
        assert_eq!(p.alloc(), Some(a));
        assert_eq!(p.lookup(K, 0, &toks), None);
        assert_eq!(p.lookup_partial(K, 0, &toks), None);
        assert_eq!(p.alloc(), None);
    }

    #[test]
    fn lookup_checks_parent_and_tokens() {
        let mut p = BlockPool::new(1);
        let toks: Vec<u32> = (0..16).collect();
        let b = p.alloc().unwrap();
        p.publish(b, K, 42, &toks);
        let other: Vec<u32> = (1..17).collect();
        assert_eq!(p.lookup(K, 42, &other), None);
        assert_eq!(p.lookup(K, 7, &toks), None);
        assert_eq!(p.lookup(K, 42, &toks), Some(b));
    }

    #[test]
    fn partial_contents_match_by_longest_common_prefix_and_grow() {
        let mut p = BlockPool::new(4);
        let (a, b) = (p.alloc().unwrap(), p.alloc().unwrap());
        p.publish(a, K, 5, &[1, 2, 3]);
        p.publish(b, K, 5, &[1, 2, 9, 9, 9]);
        assert_eq!(p.lookup_partial(K, 5, &[1, 2, 3, 4]), Some((a, 3)));
        assert_eq!(p.lookup_partial(K, 5, &[1, 2, 9, 9]), Some((b, 4)));
        assert_eq!(p.lookup_partial(K, 5, &[2]), None);
        assert_eq!(p.lookup_partial(K, 6, &[1]), None);
        // Partial contents are not shared as full blocks.
        assert_eq!(p.lookup(K, 5, &[1, 2, 3]), None);
        // The same tokens in another block are not recorded twice; more of them are.
        let c = p.alloc().unwrap();
        p.publish(c, K, 5, &[1, 2]);
        p.release(c);
        assert_eq!(p.cached(), 0);
        let full: Vec<u32> = [1, 2, 3].into_iter().chain(10..23).collect();
        p.publish(a, K, 5, &full);
        assert_eq!(p.lookup(K, 5, &full), Some(a));
        assert_eq!(p.lookup_partial(K, 5, &full[..7]), Some((a, 7)));
        // Contents never shrink or change.
        p.publish(a, K, 5, &[1, 2, 3]);
        assert_eq!(p.lookup(K, 5, &full), Some(a));
    }

    #[test]
    fn cached_blocks_beyond_the_limit_are_freed_oldest_first() {
        let mut p = BlockPool::new(8);
        let blocks: Vec<u32> = (0..4).map(|_| p.alloc().unwrap()).collect();
        for (i, &b) in blocks.iter().enumerate() {
            p.publish(b, K, 0, &[i as u32 + 1]);
        }
        p.set_cache_limit(2);
        for &b in &blocks {
            p.release(b);
            assert!(p.cached() <= 2);
        }
        // The two released first were evicted; the last two are still found.
        assert_eq!(p.cached(), 2);
        assert_eq!((p.lookup_partial(K, 0, &[1]), p.lookup_partial(K, 0, &[2])), (None, None));
        assert_eq!((p.lookup_partial(K, 0, &[3]), p.lookup_partial(K, 0, &[4])), (Some((blocks[2], 1)), Some((blocks[3], 1))));
        assert!(p.is_free(blocks[0]) && p.is_free(blocks[1]) && !p.is_free(blocks[2]));
        assert_eq!(p.available(), 8);
        // Lowering the limit evicts at once; a limit of 0 keeps nothing.
        p.set_cache_limit(0);
        assert_eq!((p.cached(), p.lookup_partial(K, 0, &[4])), (0, None));
        let b = p.alloc().unwrap();
        p.publish(b, K, 0, &[9]);
        p.release(b);
        assert_eq!((p.cached(), p.available()), (0, 8));
    }

    #[test]
    fn resident_blocks_are_handed_out_before_released_ones() {
        let mut p = BlockPool::new(6);
        assert_eq!(p.released(), 6);
        let a: Vec<u32> = (0..4).map(|_| p.alloc().unwrap()).collect();
        assert_eq!(a, [0, 1, 2, 3]);
        p.release(a[3]);
        p.release(a[1]);
        assert_eq!((p.released(), p.dirty.len()), (2, 2));
        // Freed blocks (resident) come back before never-touched ones, lowest id first.
        assert_eq!((p.alloc(), p.dirty.len()), (Some(1), 1));
        p.mark_released(3);
        assert_eq!((p.released(), p.dirty.len()), (3, 0));
        assert_eq!((p.alloc(), p.alloc(), p.alloc(), p.alloc()), (Some(3), Some(4), Some(5), None));
    }

    #[test]
    fn prefixes_are_found_only_under_their_key() {
        let mut p = BlockPool::new(4);
        let adapter = PrefixKey::adapter(7);
        assert_eq!(PrefixKey::BASE.root(), 0);
        assert!(adapter.root() != 0 && adapter.root() != PrefixKey::adapter(8).root());
        let toks: Vec<u32> = (0..16).collect();
        let b = p.alloc().unwrap();
        p.publish(b, adapter, adapter.root(), &toks);
        assert_eq!(p.lookup(adapter, adapter.root(), &toks), Some(b));
        // Even under the adapter's parent hash, another key finds nothing, full or partial.
        assert_eq!(p.lookup(K, adapter.root(), &toks), None);
        assert_eq!(p.lookup_partial(K, adapter.root(), &toks[..5]), None);
        assert_eq!(p.lookup(PrefixKey::adapter(8), adapter.root(), &toks), None);
        // The same tokens under the base key (as if its hashes collided with the adapter's)
        // are not "covered" by the adapter's block, and each key finds its own.
        let c = p.alloc().unwrap();
        p.publish(c, K, adapter.root(), &toks);
        assert_eq!(p.lookup(K, adapter.root(), &toks), Some(c));
        assert_eq!(p.lookup(adapter, adapter.root(), &toks), Some(b));
        assert_eq!(p.lookup_partial(K, adapter.root(), &toks[..5]), Some((c, 5)));
        assert_eq!(p.lookup_partial(adapter, adapter.root(), &toks[..5]), Some((b, 5)));
    }
}
