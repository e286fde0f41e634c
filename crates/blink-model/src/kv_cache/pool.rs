//! Ownership of KV blocks: reference counts, the free list, and the prefix cache.
//!
//! A block is free, owned by one or more sequences (shared prefix blocks), or cached: no
//! owner, but holding the keys and values of a known run of tokens, so a later request with
//! the same prefix can take it back instead of recomputing it. Cached blocks are evicted in
//! least-recently-released order when fresh blocks run out.
//!
//! A block's known contents may be full (every slot) or partial (its first slots, e.g. the
//! tail of a prompt). Full blocks are found by the chained hash of every token up to their
//! end and shared as they are; any block can also be found by its parent's hash and first
//! token, for a later sequence to copy its leading slots into a block of its own.

use std::collections::{BTreeMap, HashMap};

use super::BLOCK_TOKENS;

/// What a block is known to hold: the first `len` tokens of a block that follows the
/// prefix with chained hash `parent`.
#[derive(Clone, PartialEq, Eq)]
struct Content {
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
    free: Vec<u32>,
    /// Chained hash → the full block ending there.
    index: HashMap<u64, u32>,
    /// (parent hash, first token) → every block with known contents there.
    children: HashMap<(u64, u32), Vec<u32>>,
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

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl BlockPool {
    pub(crate) fn new(n_blocks: usize) -> BlockPool {
        BlockPool {
            refs: vec![0; n_blocks],
            content: vec![None; n_blocks],
            free: (0..n_blocks as u32).rev().collect(),
            index: HashMap::new(),
            children: HashMap::new(),
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
                self.forget(b);
                b
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// Drop what `b` is known to hold from the indexes.
    fn forget(&mut self, b: u32) {
        let Some(c) = self.content[b as usize].take() else { return };
        if c.is_full() && self.index.get(&c.hash()) == Some(&b) {
            self.index.remove(&c.hash());
        }
        let key = (c.parent, c.tokens[0]);
        if let Some(list) = self.children.get_mut(&key) {
            list.retain(|&x| x != b);
            if list.is_empty() {
                self.children.remove(&key);
            }
        }
    }

    /// Add an owner to `b` (a shared prefix block, or the source of a copy).
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

    /// The block holding the full block `tokens` that follows the prefix hashed `parent`.
    pub(crate) fn lookup(&self, parent: u64, tokens: &[u32]) -> Option<u32> {
        let b = *self.index.get(&chain_hash(parent, tokens))?;
        let c = self.content[b as usize].as_ref()?;
        (c.parent == parent && c.tokens() == tokens).then_some(b)
    }

    /// The block whose known leading slots, after the prefix hashed `parent`, match most of
    /// `tokens`, and how many match.
    pub(crate) fn lookup_partial(&self, parent: u64, tokens: &[u32]) -> Option<(u32, usize)> {
        let first = *tokens.first()?;
        let candidates = self.children.get(&(parent, first))?;
        candidates
            .iter()
            .filter_map(|&b| {
                let c = self.content[b as usize].as_ref()?;
                Some((b, common_prefix(c.tokens(), tokens)))
            })
            .max_by_key(|&(_, n)| n)
    }

    /// Record that the owned block `b`, following the prefix hashed `parent`, holds the
    /// computed `tokens` in its first slots. Contents already known elsewhere are not
    /// recorded twice; a block's known contents only ever grow.
    pub(crate) fn publish(&mut self, b: u32, parent: u64, tokens: &[u32]) {
        let i = b as usize;
        if tokens.is_empty() || tokens.len() > BLOCK_TOKENS {
            return;
        }
        if let Some(c) = &self.content[i] {
            // Known already: only a longer run of the same tokens adds anything.
            if c.parent != parent || tokens.len() <= c.len || !tokens.starts_with(c.tokens()) {
                return;
            }
            self.forget(b);
        } else if self.covered(parent, tokens) {
            return;
        }
        let mut t = [0u32; BLOCK_TOKENS];
        t[..tokens.len()].copy_from_slice(tokens);
        let c = Content { parent, tokens: t, len: tokens.len() };
        if c.is_full() {
            self.index.entry(c.hash()).or_insert(b);
        }
        self.children.entry((parent, tokens[0])).or_default().push(b);
        self.content[i] = Some(c);
    }

    /// Whether another block already holds at least `tokens` after `parent`.
    fn covered(&self, parent: u64, tokens: &[u32]) -> bool {
        self.lookup_partial(parent, tokens).is_some_and(|(_, n)| n == tokens.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_blocks_are_reused_then_evicted_oldest_first() {
        let mut p = BlockPool::new(3);
        let toks: Vec<u32> = (0..16).collect();
        let a = p.alloc().unwrap();
        p.publish(a, 0, &toks);
        p.release(a);
        assert_eq!((p.available(), p.cached()), (3, 1));
        assert_eq!(p.lookup(0, &toks), Some(a));
        p.retain(a);
        assert_eq!(p.cached(), 0);
        p.release(a);
        // Exhaust the free blocks; the cached one goes last.
        let b = p.alloc().unwrap();
        let c = p.alloc().unwrap();
        assert!(b != a && c != a);
        assert_eq!(p.alloc(), Some(a));
        assert_eq!(p.lookup(0, &toks), None);
        assert_eq!(p.lookup_partial(0, &toks), None);
        assert_eq!(p.alloc(), None);
    }

    #[test]
    fn lookup_checks_parent_and_tokens() {
        let mut p = BlockPool::new(1);
        let toks: Vec<u32> = (0..16).collect();
        let b = p.alloc().unwrap();
        p.publish(b, 42, &toks);
        let other: Vec<u32> = (1..17).collect();
        assert_eq!(p.lookup(42, &other), None);
        assert_eq!(p.lookup(7, &toks), None);
        assert_eq!(p.lookup(42, &toks), Some(b));
    }

    #[test]
    fn partial_contents_match_by_longest_common_prefix_and_grow() {
        let mut p = BlockPool::new(4);
        let (a, b) = (p.alloc().unwrap(), p.alloc().unwrap());
        p.publish(a, 5, &[1, 2, 3]);
        p.publish(b, 5, &[1, 2, 9, 9, 9]);
        assert_eq!(p.lookup_partial(5, &[1, 2, 3, 4]), Some((a, 3)));
        assert_eq!(p.lookup_partial(5, &[1, 2, 9, 9]), Some((b, 4)));
        assert_eq!(p.lookup_partial(5, &[2]), None);
        assert_eq!(p.lookup_partial(6, &[1]), None);
        // Partial contents are not shared as full blocks.
        assert_eq!(p.lookup(5, &[1, 2, 3]), None);
        // The same tokens in another block are not recorded twice; more of them are.
        let c = p.alloc().unwrap();
        p.publish(c, 5, &[1, 2]);
        p.release(c);
        assert_eq!(p.cached(), 0);
        let full: Vec<u32> = [1, 2, 3].into_iter().chain(10..23).collect();
        p.publish(a, 5, &full);
        assert_eq!(p.lookup(5, &full), Some(a));
        assert_eq!(p.lookup_partial(5, &full[..7]), Some((a, 7)));
        // Contents never shrink or change.
        p.publish(a, 5, &[1, 2, 3]);
        assert_eq!(p.lookup(5, &full), Some(a));
    }
}
