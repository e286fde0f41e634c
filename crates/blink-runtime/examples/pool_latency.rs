//! Dev tool: how long a pool run and a barrier take, for the flat pool and the node pool.
use blink_runtime::numa::{NodePool, Topology};
use blink_runtime::pool::ThreadPool;
fn main() {
    let pool = ThreadPool::new(2).unwrap();
    let t = std::time::Instant::now();
    for _ in 0..10000 { pool.run(|_| {}); }
    println!("thread pool run: {:.2} us", t.elapsed().as_secs_f64() * 1e6 / 10000.0);
    let t = std::time::Instant::now();
    pool.run(|w| { for _ in 0..100000 { w.barrier(); } });
    println!("thread pool barrier: {:.3} us", t.elapsed().as_secs_f64() * 1e6 / 100000.0);
    for (name, topo, threads) in [("flat", Topology::fallback(&[0, 1]), vec![2]), ("2 nodes", Topology::simulated(2), vec![1, 1])] {
        let np = NodePool::new(&topo, &threads).unwrap();
        let t = std::time::Instant::now();
        for _ in 0..10000 { np.run(|_| {}); }
        println!("{name} node pool run: {:.2} us", t.elapsed().as_secs_f64() * 1e6 / 10000.0);
        let t = std::time::Instant::now();
        np.run(|w| { for _ in 0..100000 { w.group_barrier(); } });
        println!("{name} group barrier: {:.3} us", t.elapsed().as_secs_f64() * 1e6 / 100000.0);
        let t = std::time::Instant::now();
        np.run(|w| { for _ in 0..100000 { w.global_barrier(); } });
        println!("{name} global barrier: {:.3} us", t.elapsed().as_secs_f64() * 1e6 / 100000.0);
    }
}
