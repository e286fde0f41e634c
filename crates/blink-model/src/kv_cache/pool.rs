//! Ownership of KV blocks: reference counts, the free list, and the prefix cache.
//!
//! A block is free, owned by one or more sequences (shared prefix blocks), or cached: no
//! owner, but holding the keys and values of a known run of tokens, so a later request with
//! the same prefix can take it back instead of recomputing it. Cached blocks are evicted in
//! least-recently-released order when fresh blocks run out.

use std::collections::{BTreeMap, HashMap};

use super::BLOCK_TOKENS;

/// The identity of a full block's contents: the hash of every token up to its end, and its
/// own tokens (to rule out hash collisions).
#[derive(Clone, PartialEq, Eq)]
struct Content {
    hash: u64,
    tokens: [u32; BLOCK_TOKENS],
}

pub(crate) struct BlockPool {
    refs: Vec<u32>,
    content: Vec<Option<Content>>,
    free: Vec<u32>,
    /// Content hash → block holding it.
    index: HashMap<u64, u32>,
    /// Cached blocks without owners, by release time (oldest first).
    evictable: BTreeMap<u64, u32>,
    released_at: Vec<u64>,
    clock: u64,
}

/// The chained hash of a block: its parent's hash and its tokens.
pub(crate) fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = parent ^ 0x9e37_79b9_7f4a_7c15;
    for &t in tokens {
        h = (h ^ t as u64).wrapping_mul(0x0100_0000_01b3).rotate_left(29);
    }
    h ^ (h >> 31)
}

impl BlockPool {
    pub(crate) fn new(n_blocks: usize) -> BlockPool {
        BlockPool {
            refs: vec![0; n_blocks],
            content: vec![None; n_blocks],
            free: (0..n_blocks as u32).rev().collect(),
            index: HashMap::new(),
            evictable: BTreeMap::new(),
            released_at: vec![0; n_blocks],
            clock: 0,
        }
    }

    /// Blocks that can be handed out: free ones and evictable cached ones.
    pub(crate) fn available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Cached blocks without owners.
    pub(crate) fn cached(&self) -> usize {
        self.evictable.len()
    }

    /// A block for a new owner: a free one, else the least recently released cached one.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first()?;
                if let Some(c) = self.content[b as usize].take() {
                    self.index.remove(&c.hash);
                }
                b
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// Add an owner to `b` (a shared prefix block).
    pub(crate) fn retain(&mut self, b: u32) {
        let i = b as usize;
        if self.refs[i] == 0 {
            self.evictable.remove(&self.released_at[i]);
        }
        self.refs[i] += 1;
    }

    /// Drop an owner of `b`; without owners it becomes cached (if it has known contents) or free.
    pub(crate) fn release(&mut self, b: u32) {
        let i = b as usize;
        debug_assert!(self.refs[i] > 0, "releasing an unowned block");
        self.refs[i] -= 1;
        if self.refs[i] == 0 {
            if self.content[i].is_some() {
                self.clock += 1;
                self.released_at[i] = self.clock;
                self.evictable.insert(self.clock, b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// The block holding the full block `tokens` whose chained hash is `hash`, if cached.
    pub(crate) fn lookup(&self, hash: u64, tokens: &[u32]) -> Option<u32> {
        let b = *self.index.get(&hash)?;
        let c = self.content[b as usize].as_ref()?;
        (c.hash == hash && c.tokens[..] == *tokens).then_some(b)
    }

    /// Record that `b` (owned, full) holds `tokens` with chained hash `hash`.
    pub(crate) fn publish(&mut self, b: u32, hash: u64, tokens: &[u32]) {
        let i = b as usize;
        if self.content[i].is_some() || self.index.contains_key(&hash) {
            return;
        }
        let mut t = [0u32; BLOCK_TOKENS];
        t.copy_from_slice(tokens);
        self.content[i] = Some(Content { hash, tokens: t });
        self.index.insert(hash, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_blocks_are_reused_then_evicted_oldest_first() {
        let mut p = BlockPool::new(3);
        let toks: Vec<u32> = (0..16).collect();
        let h = chain_hash(0, &toks);
        let a = p.alloc().unwrap();
        p.publish(a, h, &toks);
        p.release(a);
        assert_eq!((p.available(), p.cached()), (3, 1));
        assert_eq!(p.lookup(h, &toks), Some(a));
        p.retain(a);
        assert_eq!(p.cached(), 0);
        p.release(a);
        // Exhaust the free blocks; the cached one goes last.
        let b = p.alloc().unwrap();
        let c = p.alloc().unwrap();
        assert!(b != a && c != a);
        assert_eq!(p.alloc(), Some(a));
        assert_eq!(p.lookup(h, &toks), None);
        assert_eq!(p.alloc(), None);
    }

    #[test]
    fn lookup_checks_tokens_not_just_the_hash() {
        let mut p = BlockPool::new(1);
        let toks: Vec<u32> = (0..16).collect();
        let b = p.alloc().unwrap();
        p.publish(b, 42, &toks);
        let other: Vec<u32> = (1..17).collect();
        assert_eq!(p.lookup(42, &other), None);
        assert_eq!(p.lookup(42, &toks), Some(b));
    }
}
