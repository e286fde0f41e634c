//! The serving engine's memory stays bounded under many short distinct requests: the prefix
//! cache keeps at most its limit of blocks without owners, and the memory of the other
//! freed blocks goes back to the OS, so the process's resident memory grows by what the
//! running requests and the prefix cache hold, not by every block ever used. Measured from
//! the kernel's count of the process's anonymous resident pages; this file holds one test,
//! so nothing else runs beside it.

#![cfg(target_os = "linux")]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use blink_engine::serve::{Engine, EngineConfig, EngineStats};
use blink_model::kv_cache::{BLOCK_TOKENS, RETURN_BATCH};
use support::{collect, config, greedy, model, settled};

/// The process's anonymous resident memory, in bytes (`RssAnon` of /proc/self/status).
fn rss_anon() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).expect("RssAnon in /proc/self/status");
    let kb: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[test]
fn many_short_distinct_requests_leave_memory_bounded() {
    let (model, tok) = model();
    let block_bytes = 2 * model.cfg.n_layers * model.cfg.n_head_kv * model.cfg.head_dim * 2 * BLOCK_TOKENS;
    let (clients, per_client, max_tokens) = (8, 16, 4);
    let cap_tokens = 4 * BLOCK_TOKENS;
    let cfg = EngineConfig { kv_tokens: 4096, max_seq_len: 256, max_running: clients, prefix_cache_tokens: Some(cap_tokens), ..config() };
    let n_blocks = cfg.kv_tokens / BLOCK_TOKENS;
    let engine = Engine::start(model, tok.eog_ids().to_vec(), cfg).unwrap();
    let prompt = |client: usize, i: usize| {
        let mut ids = tok.encode(&format!("Client {client} asks question {i}: what is {} times {}?", client * 31 + i, i * 7 + 3), false, true);
        ids.truncate(2 * BLOCK_TOKENS - max_tokens);
        ids
    };
    let run = |client: usize, i: usize| {
        let mut request = greedy(prompt(client, i), max_tokens);
        request.ignore_eos = true;
        let mut sub = engine.submit(request).unwrap();
        collect(&mut sub)
    };

    // Warm up (buffers, channels, allocator arenas), then measure from rest.
    std::thread::scope(|s| {
        for c in 0..clients {
            s.spawn(move || run(c, 1000));
        }
    });
    let idle = settled(&engine);
    let base = rss_anon();

    let done = AtomicBool::new(false);
    let (peak_rss, peak) = std::thread::scope(|s| {
        let monitor = s.spawn(|| {
            let (mut peak_rss, mut peak) = (0, EngineStats::default());
            while !done.load(Ordering::Acquire) {
                let st = engine.stats();
                assert!(st.kv_blocks_cached <= st.kv_blocks_cached_limit, "{st:?}");
                if st.kv_resident_bytes > peak.kv_resident_bytes {
                    peak = st;
                }
                peak_rss = peak_rss.max(rss_anon());
                std::thread::sleep(Duration::from_millis(2));
            }
            (peak_rss, peak)
        });
        let workers: Vec<_> = (0..clients).map(|c| s.spawn(move || (0..per_client).for_each(|i| drop(run(c, i))))).collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Release);
        monitor.join().unwrap()
    });
    let end = settled(&engine);
    let after = rss_anon();

    // Each request computes two blocks' worth of distinct tokens: kept, they would fill
    // most of the cache.
    let touched = clients * per_client * 2;
    assert!(touched >= n_blocks * 3 / 4, "the workload should touch most of the cache: {touched} of {n_blocks} blocks");
    // What may be resident: the running requests' blocks, the prefix cache's, those freed
    // since the last release, and a neighbour sharing a page with each kept block.
    let cap = cap_tokens / BLOCK_TOKENS;
    let bound = (clients * 2 + 2 * cap + RETURN_BATCH + 2) * block_bytes;
    assert_eq!(end.kv_blocks_cached_limit, cap);
    assert!(end.kv_blocks_cached <= cap, "{end:?}");
    assert!(end.requests_finished >= (clients * (per_client + 1)) as u64);
    assert!(end.kv_return_calls_total > idle.kv_return_calls_total && end.kv_returned_bytes_total > 0, "{end:?}");
    assert!(peak.kv_resident_bytes as usize <= bound, "resident KV {} > {bound}: {peak:?}", peak.kv_resident_bytes);
    // At rest only the prefix cache's blocks (and neighbours sharing their pages) remain.
    assert!(end.kv_resident_bytes as usize <= (2 * cap + 2) * block_bytes, "{end:?}");
    // The kernel agrees: the process grew by no more than that bound (with room for the
    // allocator), far less than the blocks the requests used.
    let slack = 16 << 20;
    let grown = peak_rss.max(after).saturating_sub(base);
    eprintln!(
        "anonymous RSS {} MiB at rest, peak +{} MiB, after +{} MiB; bound {} MiB; {touched} blocks used ({} MiB)",
        base >> 20,
        grown >> 20,
        after.saturating_sub(base) >> 20,
        (bound + slack) >> 20,
        (touched * block_bytes) >> 20
    );
    assert!(bound + slack < touched * block_bytes / 2, "the bound should be well below what the requests used");
    assert!(grown <= bound + slack, "anonymous RSS grew by {grown} bytes, more than {}", bound + slack);
}
