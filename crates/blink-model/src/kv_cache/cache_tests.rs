//! The prefix cache under keys and a limit, and the memory of free blocks given back to the
//! OS: checked against the kernel's own account of the buffers' pages (`mincore`).

use super::*;

const ADAPTER: PrefixKey = PrefixKey::adapter(1);

fn cache(blocks: usize) -> KvCache {
    KvCache::new(2, 3, 8, KvType::F16, blocks)
}

#[test]
fn sequences_of_different_keys_never_share_blocks() {
    let mut kv = cache(12);
    let prompt: Vec<u32> = (0..40).collect();
    let a = kv.new_seq_with(ADAPTER);
    kv.grow(a, 40).unwrap();
    kv.publish_prefix(a, &prompt).unwrap();
    // The base model and another adapter find nothing, neither whole blocks nor a block's
    // leading slots (the prompt and a prompt ending inside the first block).
    for key in [PrefixKey::BASE, PrefixKey::adapter(2)] {
        for tokens in [&prompt[..], &prompt[..9]] {
            let s = kv.new_seq_with(key);
            assert_eq!(kv.attach_prefix(s, tokens).unwrap(), 0, "{key:?}");
            assert!(kv.pending_copies().is_empty());
            kv.free_seq(s);
        }
    }
    // The same adapter reuses it as the base model reuses its own.
    let b = kv.new_seq_with(ADAPTER);
    assert_eq!(kv.seq_key(b).unwrap(), ADAPTER);
    assert_eq!(kv.attach_prefix(b, &prompt).unwrap(), 39);
    assert_eq!(kv.block_table(b).unwrap()[..2], kv.block_table(a).unwrap()[..2]);
    // The base model publishes the same tokens in blocks of its own, each key keeps its own.
    let c = kv.new_seq();
    kv.grow(c, 40).unwrap();
    kv.publish_prefix(c, &prompt).unwrap();
    let (d, e) = (kv.new_seq(), kv.new_seq_with(ADAPTER));
    assert_eq!((kv.attach_prefix(d, &prompt[..20]).unwrap(), kv.attach_prefix(e, &prompt[..20]).unwrap()), (19, 19));
    let table = |s: SeqId| kv.block_table(s).unwrap().to_vec();
    let (tc, td, ta, te) = (table(c), table(d), table(a), table(e));
    assert_eq!((td[0], te[0]), (tc[0], ta[0]));
    assert!(tc.iter().all(|x| !ta.contains(x)));
    assert!(kv.pending_copies().iter().any(|p| p.seq == d && p.src == tc[1]));
    assert!(kv.pending_copies().iter().any(|p| p.seq == e && p.src == ta[1]));
}

#[test]
fn the_cache_keeps_the_most_recently_released_prefixes_up_to_its_limit() {
    let mut kv = cache(16);
    kv.limit_cached_tokens(40); // two blocks
    assert_eq!(kv.cached_blocks_limit(), 2);
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| (i * 100..i * 100 + 16).collect()).collect();
    for p in &prompts {
        let s = kv.new_seq();
        kv.grow(s, 16).unwrap();
        kv.publish_prefix(s, p).unwrap();
        kv.free_seq(s);
        assert!(kv.cached_blocks() <= 2);
    }
    assert_eq!((kv.cached_blocks(), kv.free_blocks()), (2, 16));
    let attached = |kv: &mut KvCache, p: &[u32]| {
        let s = kv.new_seq();
        let n = kv.attach_prefix(s, p).unwrap();
        kv.free_seq(s);
        n
    };
    assert_eq!(prompts.iter().map(|p| attached(&mut kv, p)).collect::<Vec<_>>(), [0, 0, 15, 15]);
    kv.limit_cached_tokens(0);
    assert_eq!(kv.cached_blocks(), 0);
}

/// A cache's buffers as bytes, to write and read blocks without caring for their type.
struct Bufs {
    /// Start, length in bytes and runs (layers × heads) of every K and V buffer.
    bufs: Vec<(*mut u8, usize, usize)>,
    n_blocks: usize,
    head_block: usize,
}

impl Bufs {
    fn of(kv: &mut KvCache) -> Bufs {
        let mut bufs = Vec::new();
        let mut head_block = 0;
        for shard in &mut kv.shards {
            let l = shard.layout;
            let runs = l.n_layers * l.n_kv_heads;
            let mut add = |p: *mut u8, bytes: usize| bufs.push((p, bytes, runs));
            match &mut shard.data {
                KvData::F16(s) => {
                    add(s.k.as_mut_ptr().cast(), s.k.len() * 2);
                    add(s.v.as_mut_ptr().cast(), s.v.len() * 2);
                    head_block = BLOCK_TOKENS * l.head_dim * 2;
                }
                KvData::F32(s) => {
                    add(s.k.as_mut_ptr().cast(), s.k.len() * 4);
                    add(s.v.as_mut_ptr().cast(), s.v.len() * 4);
                    head_block = BLOCK_TOKENS * l.head_dim * 4;
                }
            }
        }
        Bufs { bufs, n_blocks: kv.n_blocks(), head_block }
    }

    /// Byte offsets of block `b` in buffer `i`, one range per run.
    fn ranges(&self, i: usize, b: u32) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        (0..self.bufs[i].2).map(move |run| {
            let at = (run * self.n_blocks + b as usize) * self.head_block;
            at..at + self.head_block
        })
    }

    fn fill(&self, b: u32, byte: u8) {
        for i in 0..self.bufs.len() {
            for r in self.ranges(i, b) {
                // SAFETY: the range lies in the buffer, and the test holds the cache mutably.
                unsafe { std::ptr::write_bytes(self.bufs[i].0.add(r.start), byte, r.len()) };
            }
        }
    }

    fn holds(&self, b: u32, byte: u8) -> bool {
        (0..self.bufs.len()).all(|i| {
            self.ranges(i, b).all(|r| {
                // SAFETY: as in `fill`.
                let s = unsafe { std::slice::from_raw_parts(self.bufs[i].0.add(r.start), r.len()) };
                s.iter().all(|&x| x == byte)
            })
        })
    }

    /// Per buffer, whether each of its pages is resident.
    #[cfg(target_os = "linux")]
    fn resident(&self) -> Vec<Vec<bool>> {
        let page = blink_runtime::storage::page_size();
        self.bufs
            .iter()
            .map(|&(p, bytes, _)| {
                assert_eq!(p as usize % page, 0, "the buffers are page-aligned mappings");
                let mut v = vec![0u8; bytes.div_ceil(page)];
                // SAFETY: `v` has a byte per page of the mapping.
                assert_eq!(unsafe { libc::mincore(p.cast(), bytes, v.as_mut_ptr().cast()) }, 0);
                v.iter().map(|&x| x & 1 != 0).collect()
            })
            .collect()
    }

    /// Per buffer, the blocks each page touches.
    fn blocks_of_pages(&self) -> Vec<Vec<Vec<u32>>> {
        let page = blink_runtime::storage::page_size();
        (0..self.bufs.len())
            .map(|i| {
                let mut pages = vec![Vec::new(); self.bufs[i].1.div_ceil(page)];
                for b in 0..self.n_blocks as u32 {
                    for r in self.ranges(i, b) {
                        for blocks in &mut pages[r.start / page..r.end.div_ceil(page)] {
                            blocks.push(b);
                        }
                    }
                }
                pages
            })
            .collect()
    }
}

/// The pages given back are exactly those touching only free blocks, for every layer, head,
/// K and V, and across the seams between one head's run of blocks and the next.
#[cfg(target_os = "linux")]
#[test]
fn the_pages_of_free_blocks_go_back_and_owned_blocks_keep_theirs() {
    // 2 KiB per block and head: two blocks to a 4 KiB page; 9 blocks, so runs start mid-page.
    let mut kv = KvCache::new(2, 3, 64, KvType::F16, 9);
    let bufs = Bufs::of(&mut kv);
    let (a, b) = (kv.new_seq(), kv.new_seq());
    kv.grow(a, 4 * 16).unwrap();
    kv.grow(b, 5 * 16).unwrap();
    let (ta, tb) = (kv.block_table(a).unwrap().to_vec(), kv.block_table(b).unwrap().to_vec());
    assert_eq!((ta.clone(), tb.clone()), (vec![0, 1, 2, 3], vec![4, 5, 6, 7, 8]));
    for blk in 0..9 {
        bufs.fill(blk, blk as u8 + 1);
    }
    let pages = bufs.blocks_of_pages();
    assert!(bufs.resident().iter().flatten().all(|&r| r));
    let before = kv.resident_bytes();
    assert_eq!(before, 9 * kv.block_bytes());

    kv.free_seq(b);
    kv.return_free_memory();
    let resident = bufs.resident();
    for (i, buf) in pages.iter().enumerate() {
        for (p, blocks) in buf.iter().enumerate() {
            let expected = blocks.iter().any(|x| ta.contains(x));
            assert_eq!(resident[i][p], expected, "buffer {i} page {p} (blocks {blocks:?})");
        }
    }
    assert!(ta.iter().all(|&x| bufs.holds(x, x as u8 + 1)), "owned blocks keep their values");
    // Block 4 shares pages with block 3 (in the first run) and with 0 (at seams): it stays
    // counted resident; the others are released.
    assert_eq!((4..9).map(|x| kv.block_state(x).1).collect::<Vec<_>>(), [false, true, true, true, false]);
    assert_eq!(kv.resident_bytes(), 6 * kv.block_bytes());
    let (calls, bytes) = kv.returned();
    // One range per run of every buffer, and none for the pages blocks 3 and 8 share.
    assert_eq!(calls, 2 * 6);
    assert_eq!(bytes as usize, resident.iter().flatten().filter(|&&r| !r).count() * blink_runtime::storage::page_size());

    // A new sequence takes back the resident block first.
    let c = kv.new_seq();
    kv.grow(c, 16).unwrap();
    assert_eq!(kv.block_table(c).unwrap(), [4]);
    kv.free_seq(c);
    kv.free_seq(a);
    kv.return_free_memory();
    assert!(bufs.resident().iter().flatten().all(|&r| !r), "every page is given back");
    assert_eq!((kv.released_blocks(), kv.resident_bytes()), (9, 0));
    // Given-back pages read as zero.
    assert!((0..9).all(|x| bufs.holds(x, 0)));
}

/// Random work on caches of several shapes: cached blocks never pass the limit, owned and
/// cached blocks keep their values, blocks of one key are never attached under another,
/// every page touching only free blocks is given back by a release, and a block counted
/// released has none of its pages resident.
#[cfg(target_os = "linux")]
#[test]
fn random_work_keeps_values_keys_and_the_limit_and_gives_back_free_pages() {
    let shapes: [(usize, &[usize], usize, KvType, usize); 4] = [
        (2, &[3], 64, KvType::F16, 9),     // 2 KiB blocks, runs start mid-page
        (3, &[1, 1], 32, KvType::F16, 13), // two shards, four blocks to a page
        (2, &[1], 64, KvType::F32, 7),     // a block per page
        (1, &[2], 128, KvType::F32, 5),    // two pages per block
    ];
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    // Three documents sharing their first 20 tokens: full and partial matches.
    let docs: Vec<Vec<u32>> = (0..3).map(|d| (0..120).map(|i| if i < 20 { i } else { d * 1000 + i }).collect()).collect();
    for (layers, heads, head_dim, ty, n) in shapes {
        let shards: Vec<(usize, Option<(&Topology, usize)>)> = heads.iter().map(|&h| (h, None)).collect();
        let mut kv = KvCache::sharded(0..layers, &shards, head_dim, ty, n).unwrap();
        kv.limit_cached_tokens(3 * BLOCK_TOKENS);
        let bufs = Bufs::of(&mut kv);
        let pages = bufs.blocks_of_pages();
        let mut pattern = vec![0u8; n];
        let mut key_of = vec![PrefixKey::BASE; n];
        let mut live: Vec<(SeqId, Vec<u32>)> = Vec::new();
        let mut byte = 0u8;
        for step in 0..300 {
            let free_before: Vec<bool> = (0..n as u32).map(|b| kv.block_state(b).0).collect();
            let mut explicit_release = false;
            match next(10) {
                0..=4 => {
                    let key = [PrefixKey::BASE, ADAPTER][next(2)];
                    let tokens = docs[next(3)][..1 + next(70)].to_vec();
                    let id = kv.new_seq_with(key);
                    let attached = kv.attach_prefix(id, &tokens).unwrap();
                    kv.apply_copies();
                    if kv.grow(id, tokens.len() + next(20)).is_err() {
                        kv.free_seq(id);
                        continue;
                    }
                    let table = kv.block_table(id).unwrap().to_vec();
                    for (i, &b) in table.iter().enumerate() {
                        if (i + 1) * BLOCK_TOKENS <= attached {
                            assert!(!free_before[b as usize], "step {step}: attached a free block");
                            assert_eq!(key_of[b as usize], key, "step {step}: block {b} attached under another key");
                        } else {
                            byte = byte % 250 + 1;
                            bufs.fill(b, byte);
                            (pattern[b as usize], key_of[b as usize]) = (byte, key);
                        }
                    }
                    kv.publish_prefix(id, &tokens).unwrap();
                    live.push((id, tokens));
                }
                5..=7 if !live.is_empty() => {
                    let (id, tokens) = live.swap_remove(next(live.len()));
                    if next(2) == 0 {
                        kv.publish_prefix(id, &tokens).unwrap();
                    }
                    kv.free_seq(id);
                }
                8 => {
                    kv.return_free_memory();
                    explicit_release = true;
                }
                _ => {
                    if next(4) == 0 {
                        kv.limit_cached_tokens(next(5) * BLOCK_TOKENS);
                    }
                    kv.return_free_memory_if_due();
                }
            }
            assert!(kv.cached_blocks() <= kv.cached_blocks_limit(), "step {step}");
            let state: Vec<(bool, bool)> = (0..n as u32).map(|b| kv.block_state(b)).collect();
            let resident = bufs.resident();
            for (i, buf) in pages.iter().enumerate() {
                for (p, blocks) in buf.iter().enumerate() {
                    if blocks.iter().all(|&b| state[b as usize].1) {
                        assert!(!resident[i][p], "step {step}: a page of blocks counted released is resident");
                    }
                    if explicit_release && blocks.iter().all(|&b| state[b as usize].0) {
                        assert!(!resident[i][p], "step {step}: buffer {i} page {p} of free blocks {blocks:?} kept");
                    }
                }
            }
            for b in 0..n as u32 {
                if !state[b as usize].0 {
                    assert!(bufs.holds(b, pattern[b as usize]), "step {step}: block {b} lost its values");
                }
            }
        }
        for (id, _) in live.drain(..) {
            kv.free_seq(id);
        }
        kv.limit_cached_tokens(0);
        kv.return_free_memory_if_due();
        assert!(bufs.resident().iter().flatten().all(|&r| !r), "{layers}×{heads:?}×{head_dim} {ty:?}: pages left");
        assert_eq!(kv.released_blocks(), n);
    }
}

#[test]
fn forgotten_prefixes_are_attached_no_more_and_their_blocks_are_free() {
    let mut kv = cache(8);
    let prompt: Vec<u32> = (0..40).collect();
    let a = kv.new_seq();
    kv.grow(a, 40).unwrap();
    kv.publish_prefix(a, &prompt).unwrap();
    kv.free_seq(a);
    assert_eq!((kv.cached_blocks(), kv.free_blocks()), (3, 8));
    kv.forget_prefixes();
    assert_eq!((kv.cached_blocks(), kv.free_blocks()), (0, 8));
    let b = kv.new_seq();
    assert_eq!(kv.attach_prefix(b, &prompt).unwrap(), 0, "nothing is known any more");
    assert!(kv.pending_copies().is_empty());
}

#[test]
fn a_mirrored_table_is_the_heads_and_takes_nothing_from_the_pool() {
    let mut kv = cache(8);
    let s = kv.new_seq();
    kv.mirror_cut(s, 0).unwrap();
    kv.mirror_push(s, 5).unwrap();
    kv.mirror_push(s, 2).unwrap();
    assert_eq!(kv.mirror_push(s, 8), Err(KvError::NoSuchBlock { block: 8, n_blocks: 8 }));
    assert_eq!(kv.block_table(s).unwrap(), &[5, 2]);
    // Growing within the table allocates nothing.
    kv.grow(s, 2 * BLOCK_TOKENS).unwrap();
    assert_eq!((kv.free_blocks(), kv.block_table(s).unwrap().len()), (8, 2));
    kv.mirror_len(s, 3).unwrap();
    assert_eq!(kv.seq_len(s).unwrap(), 3);
    // The head cut the table back to a block and named another.
    kv.mirror_cut(s, 1).unwrap();
    kv.mirror_push(s, 7).unwrap();
    assert_eq!(kv.block_table(s).unwrap(), &[5, 7]);
    kv.forget_mirrored(s);
    assert_eq!(kv.seq_len(s), Err(KvError::UnknownSeq(s)));
    assert_eq!(kv.free_blocks(), 8, "the pool never knew the head's blocks");
}
