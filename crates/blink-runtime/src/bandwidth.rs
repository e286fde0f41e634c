//! Memory bandwidth, measured with a STREAM-style triad (`a = b + s·c`) on the compute
//! pool. Decode speed is bounded by bandwidth ÷ weight bytes read per token; this gives
//! the numerator on the machine at hand.

use std::time::Instant;

use crate::pool::{SharedMut, ThreadPool};

/// Elements per array: 64 MiB of f32 each, well beyond any last-level cache.
const LEN: usize = 16 << 20;

/// Best-of-several triad bandwidth in GB/s (10^9 bytes), counting the two reads and the
/// write per element, as STREAM does. Fails only if the threads cannot be started.
pub fn triad_gbs(threads: usize) -> std::io::Result<f64> {
    let pool = ThreadPool::new(threads.max(1))?;
    let mut a = vec![0f32; LEN];
    let b = vec![1f32; LEN];
    let c = vec![2f32; LEN];
    let out = SharedMut::new(&mut a);
    let mut best = f64::MAX;
    for _ in 0..6 {
        let start = Instant::now();
        pool.run(|w| {
            let r = w.share(LEN, 4096);
            // SAFETY: each thread writes its own disjoint range.
            let dst = unsafe { out.slice_mut(r.clone()) };
            for ((d, &x), &y) in dst.iter_mut().zip(&b[r.clone()]).zip(&c[r]) {
                *d = x + 3.0 * y;
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    std::hint::black_box(&a);
    Ok((3 * LEN * 4) as f64 / best / 1e9)
}
