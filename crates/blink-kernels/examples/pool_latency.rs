//! Dev tool: how long a pool run and a barrier take.
use blink_kernels::pool::ThreadPool;
fn main() {
    let pool = ThreadPool::new(2);
    let t = std::time::Instant::now();
    for _ in 0..10000 { pool.run(|_| {}); }
    println!("run: {:.2} us", t.elapsed().as_secs_f64() * 1e6 / 10000.0);
    let t = std::time::Instant::now();
    pool.run(|w| { for _ in 0..100000 { w.barrier(); } });
    println!("barrier: {:.3} us", t.elapsed().as_secs_f64() * 1e6 / 100000.0);
}
