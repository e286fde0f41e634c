//! Where a model's weights, cache and work live: one flat pool, or one part per NUMA node.
//!
//! Tensor parallelism splits every layer by *output* rows, so each part computes whole
//! dot products and every result is bit-identical to the unsplit model: query heads (with
//! the key/value heads they need), the output projection's and the FFN's rows, and the
//! vocabulary rows of the embedding table and the LM head. Splits follow each node's
//! thread count, so uneven splits and head counts not divisible by the node count work.

use std::ops::Range;

use blink_kernels::gemm::ROW_ALIGN;
use blink_runtime::numa::{NodePool, NumaError, Topology};

use crate::config::ModelConfig;

/// Most parts (NUMA nodes) a model may be split into.
pub const MAX_PARTS: usize = 16;

/// How the model is spread over the machine.
#[derive(Clone, Debug)]
pub struct TensorPlacement {
    pub topology: Topology,
    /// Threads of each node (one entry per node used).
    pub threads: Vec<usize>,
    /// Whether memory is split per node (tensor parallel) or one flat pool.
    pub numa: bool,
}

impl TensorPlacement {
    /// One flat pool of `threads` threads over the CPUs this process may use; memory is
    /// not bound to any node.
    pub fn flat(threads: usize) -> TensorPlacement {
        let cpus = blink_runtime::affinity::allowed_cpus();
        TensorPlacement { topology: Topology::fallback(&cpus), threads: vec![threads.max(1)], numa: false }
    }

    /// Tensor parallel over `topology`'s nodes, `threads` in all, divided among the nodes in
    /// proportion to their CPUs (at least one each).
    pub fn tensor_parallel(topology: Topology, threads: usize) -> TensorPlacement {
        let cpus: Vec<usize> = topology.nodes().iter().map(|n| n.cpus.len().max(1)).collect();
        let per_node = proportional(threads.max(cpus.len()), &cpus, 1).iter().map(|r| r.len().max(1)).collect();
        TensorPlacement { topology, threads: per_node, numa: true }
    }

    /// The placement when none is asked for: tensor parallel on a machine of 2 to
    /// [`MAX_PARTS`] nodes, else one flat pool, with a note
    /// when there are more nodes than parts.
    pub fn automatic(topology: Topology, threads: usize) -> (TensorPlacement, Option<String>) {
        let nodes = topology.n_nodes();
        let max = MAX_PARTS;
        match nodes {
            2.. if nodes <= max => (TensorPlacement::tensor_parallel(topology, threads), None),
            1 => (TensorPlacement::flat(threads), None),
            _ => (
                TensorPlacement::flat(threads),
                Some(format!("{nodes} NUMA nodes, more than the {max} parts tensor parallelism splits a model into: running on one flat pool")),
            ),
        }
    }

    /// Nodes (parts) used.
    pub fn n_parts(&self) -> usize {
        self.threads.len()
    }

    /// Threads in all.
    pub fn n_threads(&self) -> usize {
        self.threads.iter().sum()
    }

    /// The thread pool this placement runs on; with `detached`, the caller is not one of
    /// its threads (see [`NodePool::detached`]).
    pub fn pool(&self, detached: bool) -> Result<NodePool, NumaError> {
        if detached {
            NodePool::detached(&self.topology, &self.threads)
        } else {
            NodePool::new(&self.topology, &self.threads)
        }
    }
}

/// One node's part of the model: the ranges of work and weights it owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPart {
    pub q_heads: Range<usize>,
    /// The key/value heads its query heads use (neighbouring parts may share one).
    pub kv_heads: Range<usize>,
    /// Rows of the attention output projection and of the FFN down projection.
    pub embd_rows: Range<usize>,
    /// Rows of the FFN gate and up projections (columns of down).
    pub ff_rows: Range<usize>,
    /// The experts whose weights it holds whole and whose rows it computes, in a model
    /// with experts (empty otherwise): experts are split by expert, not by rows.
    pub experts: Range<usize>,
    /// Rows of the embedding table and of the LM head.
    pub vocab_rows: Range<usize>,
    /// For each held key/value head: (head, this part's rank among its holders, holders).
    /// A head held by two parts has its attention work dealt between them.
    pub kv_groups: Vec<(usize, usize, usize)>,
}

/// The parts of a model for a placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSplit {
    pub parts: Vec<TensorPart>,
    /// Whether some key/value head is held by more than one part (their query vectors
    /// are then exchanged before attention).
    pub shares_kv: bool,
}

impl TensorSplit {
    /// Split `cfg`'s work over parts weighted by `weights` (threads per node).
    pub fn new(cfg: &ModelConfig, weights: &[usize]) -> TensorSplit {
        let group = cfg.n_head / cfg.n_head_kv;
        let q = proportional(cfg.n_head, weights, 1);
        let embd = proportional(cfg.n_embd, weights, ROW_ALIGN);
        let ff = proportional(cfg.n_ff, weights, ROW_ALIGN);
        let vocab = proportional(cfg.vocab_size, weights, ROW_ALIGN);
        let experts = proportional(cfg.moe.map_or(0, |m| m.n_expert), weights, 1);
        let parts = (0..weights.len())
            .map(|i| {
                let q_heads = q[i].clone();
                let kv_heads = if q_heads.is_empty() {
                    0..0
                } else {
                    q_heads.start / group..(q_heads.end - 1) / group + 1
                };
                TensorPart {
                    q_heads,
                    kv_heads,
                    embd_rows: embd[i].clone(),
                    ff_rows: ff[i].clone(),
                    experts: experts[i].clone(),
                    vocab_rows: vocab[i].clone(),
                    kv_groups: Vec::new(),
                }
            })
            .collect::<Vec<TensorPart>>();
        let mut parts = parts;
        let holders = |g: usize, parts: &[TensorPart]| parts.iter().enumerate().filter(|(_, p)| p.kv_heads.contains(&g)).map(|(i, _)| i).collect::<Vec<_>>();
        let mut shares_kv = false;
        for i in 0..parts.len() {
            let groups = parts[i]
                .kv_heads
                .clone()
                .map(|g| {
                    let h = holders(g, &parts);
                    shares_kv |= h.len() > 1;
                    (g, h.iter().position(|&p| p == i).expect("a part holds its own heads"), h.len())
                })
                .collect();
            parts[i].kv_groups = groups;
        }
        TensorSplit { parts, shares_kv }
    }
}

/// Split `0..n` into contiguous ranges proportional to `weights`, with inner boundaries on
/// multiples of `align` (the largest remainders get the leftover units).
pub fn proportional(n: usize, weights: &[usize], align: usize) -> Vec<Range<usize>> {
    let align = align.max(1);
    let units = n.div_ceil(align);
    let total: usize = weights.iter().sum::<usize>().max(1);
    let mut counts: Vec<usize> = weights.iter().map(|&w| units * w / total).collect();
    let mut left = units - counts.iter().sum::<usize>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse((units * weights[i]) % total));
    for &i in order.iter().cycle().take(weights.len() * 2) {
        if left == 0 {
            break;
        }
        counts[i] += 1;
        left -= 1;
    }
    let mut start = 0;
    counts
        .iter()
        .map(|&c| {
            let r = (start * align).min(n)..((start + c) * align).min(n);
            start += c;
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysfs node directory of `n` nodes with a CPU each, as the kernel lays it out.
    fn sysfs_of(n: usize) -> (std::path::PathBuf, Vec<usize>) {
        let root = std::env::temp_dir().join(format!("blink-placement-{n}-{}", std::process::id()));
        for node in 0..n {
            let dir = root.join(format!("node{node}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cpulist"), format!("{node}\n")).unwrap();
            let distances: Vec<String> = (0..n).map(|other| if other == node { "10" } else { "20" }.to_string()).collect();
            std::fs::write(dir.join("distance"), distances.join(" ") + "\n").unwrap();
        }
        (root, (0..n).collect())
    }

    #[test]
    fn the_automatic_placement_splits_over_up_to_max_parts_nodes() {
        for (nodes, tensor_parallel, noted) in [(1, false, false), (2, true, false), (16, true, false), (24, false, true)] {
            let (root, cpus) = sysfs_of(nodes);
            let topology = Topology::from_sysfs(&root, &cpus);
            std::fs::remove_dir_all(&root).unwrap();
            let (placement, note) = TensorPlacement::automatic(topology.unwrap(), nodes);
            assert_eq!((placement.numa, note.is_some()), (tensor_parallel, noted), "{nodes} nodes: {note:?}");
            if tensor_parallel {
                assert_eq!(placement.n_parts(), nodes);
            }
        }
    }

    #[test]
    fn proportional_splits_cover_everything_once() {
        for (n, w, a) in [(9usize, vec![1usize, 1], 1usize), (576, vec![1, 1, 1], 8), (49152, vec![3, 1], 8), (3, vec![1, 1, 1, 1], 1), (100, vec![2, 5], 8)] {
            let parts = proportional(n, &w, a);
            assert_eq!(parts.len(), w.len());
            let mut next = 0;
            for p in &parts {
                assert_eq!(p.start, next);
                assert!(p.start % a == 0 || p.start == n);
                next = p.end;
            }
            assert_eq!(next, n, "{n} {w:?}");
        }
        assert_eq!(proportional(9, &[1, 1], 1), vec![0..5, 5..9]);
        assert_eq!(proportional(9, &[1, 1, 1], 1), vec![0..3, 3..6, 6..9]);
    }
}
