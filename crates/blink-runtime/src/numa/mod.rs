//! NUMA infrastructure: which nodes the machine has, memory bound to a node, and a thread
//! pool with one pinned thread group per node.
//!
//! - [`topology`] reads the nodes, their CPUs (as far as this process may use them) and
//!   their distances from `/sys/devices/system/node`, falling back to one node; it can also
//!   simulate N nodes on any machine so multi-node code paths run in tests.
//! - [`memory`] maps [`NodeBuffer`]s whose pages are bound to one node (`mbind`) and
//!   faulted in by that node's threads, and reports where each page really lives.
//! - [`groups`] runs one closure on every thread of every node (SPMD, like
//!   [`crate::pool::ThreadPool`]) with a barrier per node and a two-level barrier across
//!   nodes; [`claim`] shares a loop's items out among a node's threads in chunks, with
//!   stealing, so uneven thread speeds do not leave the others waiting.
//!
//! Everything degrades instead of failing: without `/sys`, without permission to bind
//! memory, or off Linux, there is one node, memory is unbound and the pool still works.

pub mod claim;
pub mod groups;
pub mod memory;
mod sys;
pub mod topology;

pub use claim::Claims;
pub use groups::{NodePool, NodeWorker};
pub use memory::{node_of_page, page_size, Binding, NodeBuffer, Zeroable};
pub use crate::cpulist::{format_cpulist, parse_cpulist};
pub use topology::{Node, Topology, TopologySource};

use std::path::PathBuf;

/// Why a NUMA operation could not be done.
#[derive(Debug, thiserror::Error)]
pub enum NumaError {
    /// The OS would not start another thread (a limit on threads or memory).
    #[error("could not start a compute thread: {0}")]
    Spawn(std::io::Error),
    /// A sysfs file was missing, unreadable or malformed.
    #[error("{}: {reason}", path.display())]
    Sysfs { path: PathBuf, reason: String },
    /// No node had any CPU this process may run on.
    #[error("no NUMA node has a CPU this process may run on")]
    NoUsableNode,
    /// A node index past the end of the topology or pool.
    #[error("no NUMA node at index {index} (there are {n_nodes})")]
    NoSuchNode { index: usize, n_nodes: usize },
    /// A buffer and a pool that were built from different topologies.
    #[error("buffer is on OS node {buffer} but the pool's node {index} is OS node {pool}")]
    NodeMismatch { index: usize, buffer: usize, pool: usize },
    /// The requested size does not fit the address space.
    #[error("a buffer of {len} elements of {elem_size} bytes is too large")]
    TooLarge { len: usize, elem_size: usize },
    /// The element type needs more alignment than a page gives.
    #[error("element alignment {0} exceeds the page size")]
    Alignment(usize),
    /// The allocator had no memory for a buffer.
    #[error("cannot allocate {bytes} bytes: out of memory")]
    OutOfMemory { bytes: usize },
    /// The OS refused to map memory.
    #[error("mapping {bytes} bytes failed: {source}")]
    Map { bytes: usize, source: std::io::Error },
    /// `threads_per_node` does not have one entry per node.
    #[error("threads_per_node has {got} entries for {expected} nodes")]
    ThreadCount { got: usize, expected: usize },
    /// A node was given no threads.
    #[error("node index {0} was given no threads (every node needs at least one)")]
    EmptyGroup(usize),
}
