//! The sliding-window layers' memory: blocks a sequence ran a whole window past give their
//! pages back in those layers only (checked with `mincore`), and nothing that needs them is
//! built on them afterwards (attached prefixes, truncations).

use blink_runtime::storage::page_size;

use super::*;

/// Layers 0..3 of which layer 1 is local, two key/value heads whose 16-token blocks are a
/// page each (f16), a window of 40 positions.
const WINDOW: usize = 40;
const LAYERS: usize = 3;
const HEADS: usize = 2;

fn head_dim() -> usize {
    page_size() / (BLOCK_TOKENS * 2)
}

fn cache(blocks: usize) -> KvCache {
    KvCache::new(LAYERS, HEADS, head_dim(), KvType::F16, blocks).with_sliding_window(WINDOW, |layer| layer == 1)
}

/// Run `id` on as a pass would: a step of `rows` rows from its length on (the cache marks
/// what the step's first row no longer sees), every layer's values written.
fn step(kv: &mut KvCache, id: SeqId, rows: usize) {
    let from = kv.seq_len(id).unwrap();
    kv.grow(id, from + rows).unwrap();
    kv.slide(id, from);
    let table = kv.block_table(id).unwrap().to_vec();
    let layout = *kv.layouts().next().unwrap();
    let KvData::F16(store) = &mut kv.shards[0].data else { panic!("an f16 cache") };
    for pos in from..from + rows {
        for layer in 0..LAYERS {
            for head in 0..HEADS {
                let at = layout.offset(layer, table[pos / BLOCK_TOKENS], head, pos % BLOCK_TOKENS);
                store.k[at..at + layout.head_dim].fill(f16::ONE);
                store.v[at..at + layout.head_dim].fill(f16::ONE);
            }
        }
    }
}

/// Whether block `b`'s pages in `layer` are resident, in every head, K and V (or in none).
fn resident(kv: &KvCache, layer: usize, b: u32) -> bool {
    let layout = *kv.layouts().next().unwrap();
    let KvData::F16(store) = &kv.shards[0].data else { panic!("an f16 cache") };
    let bytes = BLOCK_TOKENS * layout.head_dim * 2;
    let states: Vec<bool> = [store.k.releaser(), store.v.releaser()]
        .iter()
        .flat_map(|pages| {
            (0..HEADS).map(move |head| {
                let at = layout.offset(layer, b, head, 0) * 2;
                let (resident, pages_there) = pages.resident_pages(at..at + bytes).expect("mincore answers");
                assert_eq!(pages_there, 1, "a block is one page here");
                resident == 1
            })
        })
        .collect();
    assert!(states.iter().all(|&s| s == states[0]), "block {b} layer {layer}: heads or K/V disagree");
    states[0]
}

#[test]
fn blocks_past_the_window_give_back_their_local_pages_only() {
    let mut kv = cache(32);
    let a = kv.new_seq();
    for _ in 0..20 {
        step(&mut kv, a, 16);
    }
    let before = kv.resident_bytes();
    kv.return_free_memory();
    // The last step started at 304: it sees 265.., so blocks 0..16 are dead in layer 1.
    let dead = (304 + 1 - WINDOW) / BLOCK_TOKENS;
    assert_eq!(dead, 16);
    let table = kv.block_table(a).unwrap().to_vec();
    for (i, &b) in table.iter().enumerate() {
        assert!(resident(&kv, 0, b) && resident(&kv, 2, b), "global layers keep block {i}");
        assert_eq!(resident(&kv, 1, b), i >= dead, "local layer, block {i}");
    }
    let local_block = 2 * HEADS * BLOCK_TOKENS * head_dim() * 2;
    assert_eq!(before - kv.resident_bytes(), dead * local_block);
    assert_eq!(kv.returned().1, (dead * local_block) as u64);
    // Due only once a batch of blocks is marked: one more step marks one more block.
    step(&mut kv, a, 16);
    kv.return_free_memory_if_due();
    assert!(resident(&kv, 1, table[dead]));
    kv.return_free_memory();
    assert!(!resident(&kv, 1, table[dead]));
}

#[test]
fn a_prefix_is_attached_only_where_the_window_before_it_is_whole() {
    let mut kv = cache(40);
    let prompt: Vec<u32> = (0..200).collect();
    let a = kv.new_seq();
    for _ in 0..12 {
        step(&mut kv, a, 16);
    }
    step(&mut kv, a, 8);
    kv.publish_prefix(a, &prompt).unwrap();
    kv.free_seq(a);
    kv.return_free_memory();
    let free = kv.free_blocks();
    // Its last step started at 192, so blocks 0..9 are dead: a prompt continuing all 200
    // tokens sees 161.. from its first new row, at 200, and attaches.
    let b = kv.new_seq();
    let mut longer = prompt.clone();
    longer.extend([7, 8, 9]);
    assert_eq!(kv.attach_prefix(b, &longer).unwrap(), 200);
    kv.free_seq(b);
    // One that shares only its first 100 tokens would see 61..100 from row 100: gone.
    let c = kv.new_seq();
    let mut shorter = prompt[..100].to_vec();
    shorter.push(5000);
    assert_eq!(kv.attach_prefix(c, &shorter).unwrap(), 0);
    assert_eq!(kv.seq_len(c).unwrap(), 0);
    assert!(kv.block_table(c).unwrap().is_empty() && kv.pending_copies().is_empty());
    assert_eq!(kv.free_blocks(), free, "nothing stays held by the refused attach");
    // The refusal left the cached prefix as it was.
    assert_eq!(kv.attach_prefix(c, &longer).unwrap(), 200);
}

#[test]
fn a_cut_into_the_dead_blocks_starts_the_sequence_over() {
    let mut kv = cache(32);
    let a = kv.new_seq();
    for _ in 0..19 {
        step(&mut kv, a, 16);
    }
    // The last step started at 288: blocks 0..15 are dead. A cut to 299 sees 260..: whole.
    assert_eq!(kv.truncate(a, 299).unwrap(), 299);
    // A cut to 250 would see 211..250, blocks 13 and 14: gone, so it starts over.
    assert_eq!(kv.truncate(a, 250).unwrap(), 0);
    assert_eq!((kv.seq_len(a).unwrap(), kv.block_table(a).unwrap().len()), (0, 0));
}

#[test]
fn shared_blocks_and_a_cache_that_does_not_slide_keep_every_layer() {
    let mut kv = cache(40);
    let prompt: Vec<u32> = (0..64).collect();
    let a = kv.new_seq();
    step(&mut kv, a, 64);
    kv.publish_prefix(a, &prompt).unwrap();
    let b = kv.new_seq();
    assert_eq!(kv.attach_prefix(b, &prompt).unwrap(), 63);
    kv.apply_copies();
    for _ in 0..10 {
        step(&mut kv, a, 16);
    }
    kv.return_free_memory();
    let table = kv.block_table(a).unwrap().to_vec();
    // b shares a's first three blocks: they stay whole; a's own blocks past its window go.
    for (i, &blk) in table.iter().enumerate() {
        assert_eq!(resident(&kv, 1, blk), !(3..(208 + 1 - WINDOW) / BLOCK_TOKENS).contains(&i), "block {i}");
    }

    let mut kv = cache(32);
    kv.release_slid_out(false);
    let a = kv.new_seq();
    for _ in 0..20 {
        step(&mut kv, a, 16);
    }
    kv.return_free_memory();
    assert!(kv.block_table(a).unwrap().iter().all(|&b| resident(&kv, 1, b)));
    assert_eq!(kv.truncate(a, 100).unwrap(), 100);
}

#[test]
fn blocks_smaller_than_a_page_go_back_once_their_neighbours_are_dead() {
    // Blocks of half a page (f16).
    let hd = page_size() / (BLOCK_TOKENS * 2 * 2);
    let mut kv = KvCache::new(2, 1, hd, KvType::F16, 16).with_sliding_window(16, |layer| layer == 0);
    let a = kv.new_seq();
    kv.grow(a, 16 * 16).unwrap();
    let layout = *kv.layouts().next().unwrap();
    if let KvData::F16(store) = &mut kv.shards[0].data {
        store.k.fill(f16::ONE);
        store.v.fill(f16::ONE);
    }
    let pages = |kv: &KvCache| {
        let KvData::F16(store) = &kv.shards[0].data else { panic!("an f16 cache") };
        let run = layout.offset(1, 0, 0, 0) * 2;
        (store.k.releaser().resident_pages(0..run).unwrap().0, store.k.releaser().resident_pages(run..2 * run).unwrap().0)
    };
    let (local, global) = pages(&kv);
    // Rows from 47 on see 32..: blocks 0 and 1 are dead, one whole page.
    kv.slide(a, 47);
    kv.return_free_memory();
    assert_eq!(pages(&kv), (local - 1, global));
    // From 63: block 2 is dead too, but its page holds block 3, which is not.
    kv.slide(a, 63);
    kv.return_free_memory();
    assert_eq!(pages(&kv), (local - 1, global));
    kv.slide(a, 79);
    kv.return_free_memory();
    assert_eq!(pages(&kv), (local - 2, global));
}
