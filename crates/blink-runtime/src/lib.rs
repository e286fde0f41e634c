//! Where Blink's compute runs: threads, pinning, NUMA topology, node memory and bandwidth
//! probing. Owns the persistent SPMD thread pool ([`pool`]) and its per-node form with
//! work claiming ([`numa`]), pinning threads to CPUs ([`affinity`]), the machine's NUMA
//! nodes, memory bound to a node ([`numa::NodeBuffer`]), zeroed buffers on the heap or a
//! node ([`storage`]), huge-page chunks handed out piece by piece ([`arena`]) and the
//! memory-bandwidth probe ([`bandwidth`]), and advice on memory-mapped files: prefetch,
//! release and residency ([`residency`]); and the allocation counter the no-allocation
//! tests install ([`alloc_count`]).
//!
//! Must not touch numerics, models or file formats: it runs closures and hands out memory,
//! and knows nothing of what they compute or hold.

pub mod affinity;
pub mod alloc_count;
pub mod arena;
pub mod bandwidth;
pub mod cpulist;
mod park;
pub mod numa;
pub mod pool;
pub mod residency;
pub mod storage;
