//! The machine's NUMA nodes: their CPUs (restricted to those this process may run on) and
//! the distances between them.
//!
//! [`Topology::detect`] reads `/sys/devices/system/node` on Linux and falls back to a single
//! node holding every allowed CPU when that is absent or malformed. [`Topology::simulated`]
//! splits the allowed CPUs into N pretend nodes so multi-node code runs on any machine;
//! memory is never bound for such a topology, since it all really lives on one node.

use std::fmt;
use std::path::Path;

use super::NumaError;
use crate::pool::split_range;

/// Where Linux describes the NUMA nodes.
pub const SYSFS_NODE_DIR: &str = "/sys/devices/system/node";

/// Distance the kernel reports from a node to itself, and to a remote node in simulation.
const LOCAL_DISTANCE: u32 = 10;
const REMOTE_DISTANCE: u32 = 20;

/// The largest CPU or node number a list may name; anything larger is treated as garbage.
use crate::cpulist::{format_cpulist, parse_cpulist, MAX_LIST_ID};

/// One NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The OS's node number (for a simulated topology, the node's index).
    pub id: usize,
    /// The node's CPUs this process may run on, ascending, never empty.
    pub cpus: Vec<usize>,
}

/// How a [`Topology`] was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopologySource {
    /// Read from sysfs: node ids are real, memory can be bound.
    Sysfs,
    /// No usable NUMA information: one node with every allowed CPU, memory is not bound.
    Fallback,
    /// Pretend nodes over the allowed CPUs: memory is not bound.
    Simulated,
}

/// The NUMA nodes this process can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<Node>,
    /// `nodes.len()²` distances, row-major by node index.
    distances: Vec<u32>,
    source: TopologySource,
}

impl Topology {
    /// The machine's topology, restricted to the CPUs this process may run on.
    ///
    /// Never fails: without readable, well-formed sysfs data it is [`Topology::fallback`].
    pub fn detect() -> Topology {
        let allowed = crate::affinity::allowed_cpus();
        #[cfg(target_os = "linux")]
        if let Ok(topology) = Topology::from_sysfs(Path::new(SYSFS_NODE_DIR), &allowed) {
            return topology;
        }
        Topology::fallback(&allowed)
    }

    /// One node (id 0) holding `cpus` (all CPUs the OS reports if empty), with no binding.
    pub fn fallback(cpus: &[usize]) -> Topology {
        let cpus = normalized(cpus);
        Topology {
            nodes: vec![Node { id: 0, cpus }],
            distances: vec![LOCAL_DISTANCE],
            source: TopologySource::Fallback,
        }
    }

    /// `n_nodes` pretend nodes (at least one) over the CPUs this process may run on.
    pub fn simulated(n_nodes: usize) -> Topology {
        Topology::simulated_on(&crate::affinity::allowed_cpus(), n_nodes)
    }

    /// `n_nodes` pretend nodes (at least one) over `cpus`, split into contiguous groups as
    /// evenly as possible. With fewer CPUs than nodes, node `i` gets CPU `i mod n_cpus`, so
    /// nodes share CPUs but each has one. Distances are 10 locally and 20 remotely.
    pub fn simulated_on(cpus: &[usize], n_nodes: usize) -> Topology {
        let cpus = normalized(cpus);
        let n = n_nodes.max(1);
        let nodes = (0..n)
            .map(|i| {
                let cpus = if cpus.len() >= n {
                    cpus[split_range(cpus.len(), 1, i, n)].to_vec()
                } else {
                    vec![cpus[i % cpus.len()]]
                };
                Node { id: i, cpus }
            })
            .collect();
        let distances =
            (0..n * n).map(|k| if k / n == k % n { LOCAL_DISTANCE } else { REMOTE_DISTANCE }).collect();
        Topology { nodes, distances, source: TopologySource::Simulated }
    }

    /// Read the topology from a sysfs node directory (normally [`SYSFS_NODE_DIR`]), keeping
    /// only the CPUs in `allowed` and only the nodes left with at least one CPU.
    pub fn from_sysfs(root: &Path, allowed: &[usize]) -> Result<Topology, NumaError> {
        let sysfs_err = |path: &Path, reason: String| NumaError::Sysfs { path: path.to_path_buf(), reason };
        let entries = std::fs::read_dir(root).map_err(|e| sysfs_err(root, e.to_string()))?;
        let mut ids: Vec<usize> = entries
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| entry.file_name().to_str().and_then(node_number))
            .collect();
        ids.sort_unstable();
        if ids.is_empty() {
            return Err(sysfs_err(root, "no node directories".into()));
        }
        // Each `distance` row has one column per online node, in ascending node order.
        let online_path = root.join("online");
        let columns = match std::fs::read_to_string(&online_path) {
            Ok(text) => parse_cpulist(&text).map_err(|e| sysfs_err(&online_path, e.to_string()))?,
            Err(_) => ids.clone(),
        };

        let allowed = normalized_set(allowed);
        let mut kept: Vec<(Node, Vec<u32>)> = Vec::new();
        for &id in &ids {
            let dir = root.join(format!("node{id}"));
            let cpulist_path = dir.join("cpulist");
            let text = std::fs::read_to_string(&cpulist_path).map_err(|e| sysfs_err(&cpulist_path, e.to_string()))?;
            let cpus: Vec<usize> = parse_cpulist(&text)
                .map_err(|e| sysfs_err(&cpulist_path, e.to_string()))?
                .into_iter()
                .filter(|c| allowed.binary_search(c).is_ok())
                .collect();
            if cpus.is_empty() {
                continue;
            }
            let distance_path = dir.join("distance");
            let text = std::fs::read_to_string(&distance_path).map_err(|e| sysfs_err(&distance_path, e.to_string()))?;
            let row = parse_distances(&text).ok_or_else(|| sysfs_err(&distance_path, format!("malformed '{}'", text.trim())))?;
            if row.len() != columns.len() {
                let reason = format!("{} distances for {} online nodes", row.len(), columns.len());
                return Err(sysfs_err(&distance_path, reason));
            }
            kept.push((Node { id, cpus }, row));
        }
        if kept.is_empty() {
            return Err(NumaError::NoUsableNode);
        }

        let mut distances = Vec::with_capacity(kept.len() * kept.len());
        for (node, row) in &kept {
            for (other, _) in &kept {
                let column = columns.iter().position(|&c| c == other.id).ok_or_else(|| {
                    sysfs_err(&online_path, format!("node {} is not listed online (row of node {})", other.id, node.id))
                })?;
                distances.push(row[column]);
            }
        }
        let nodes = kept.into_iter().map(|(node, _)| node).collect();
        Ok(Topology { nodes, distances, source: TopologySource::Sysfs })
    }

    /// The nodes, in ascending OS id order; always at least one.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Number of nodes.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Distance between the nodes at indices `a` and `b` of [`Topology::nodes`] (10 is local).
    ///
    /// # Panics
    /// If either index is out of range, like slice indexing.
    pub fn distance(&self, a: usize, b: usize) -> u32 {
        let n = self.nodes.len();
        assert!(a < n && b < n, "node index out of range: ({a}, {b}) with {n} nodes");
        self.distances[a * n + b]
    }

    /// Whether the nodes are pretend ones (see [`Topology::simulated`]).
    pub fn is_simulated(&self) -> bool {
        self.source == TopologySource::Simulated
    }

    /// How the topology was obtained.
    pub fn source(&self) -> TopologySource {
        self.source
    }

    /// Whether memory should be bound to nodes: only for a topology read from sysfs.
    pub fn binds_memory(&self) -> bool {
        self.source == TopologySource::Sysfs
    }

    /// Distinct CPUs over all nodes.
    pub fn n_cpus(&self) -> usize {
        let mut all: Vec<usize> = self.nodes.iter().flat_map(|n| n.cpus.iter().copied()).collect();
        all.sort_unstable();
        all.dedup();
        all.len()
    }
}

impl fmt::Display for Topology {
    /// One line per node: `node 0: cpus 0-3,8; distances 10 21`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let note = match self.source {
            TopologySource::Sysfs => "",
            TopologySource::Fallback => " (no NUMA information)",
            TopologySource::Simulated => " (simulated)",
        };
        for (i, node) in self.nodes.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "node {}{note}: cpus {}; distances", node.id, format_cpulist(&node.cpus))?;
            for j in 0..self.nodes.len() {
                write!(f, " {}", self.distance(i, j))?;
            }
        }
        Ok(())
    }
}

/// The number in a directory name `nodeN`.
fn node_number(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("node")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&v| v <= MAX_LIST_ID)
}

/// A `distance` row: whitespace-separated positive numbers.
fn parse_distances(text: &str) -> Option<Vec<u32>> {
    let row: Vec<u32> = text.split_whitespace().map(|s| s.parse().ok().filter(|&d| d > 0)).collect::<Option<_>>()?;
    (!row.is_empty()).then_some(row)
}

/// Ascending, distinct.
fn normalized_set(cpus: &[usize]) -> Vec<usize> {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// Ascending, distinct, and never empty (all CPUs the OS reports, at least CPU 0).
fn normalized(cpus: &[usize]) -> Vec<usize> {
    let v = normalized_set(cpus);
    if !v.is_empty() {
        return v;
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn cpulist_parses_ranges_whitespace_and_empty() {
        assert_eq!(parse_cpulist("0-3,8,10-11").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(" 0-1 , 4 \n").unwrap(), vec![0, 1, 4]);
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpulist("").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpulist("5,3-4,3").unwrap(), vec![3, 4, 5]);
        assert_eq!(parse_cpulist("7-7").unwrap(), vec![7]);
        for bad in ["3-1", "a", "1-", "-1", "1--2", "0-7:2", "+1", "99999999999999999999", "0-100000000"] {
            assert!(parse_cpulist(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn cpulist_formats_compactly_and_round_trips() {
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[5]), "5");
        assert_eq!(format_cpulist(&[]), "");
        assert_eq!(format_cpulist(&[3, 1, 2, 2]), "1-3");
        for text in ["0-3,8,10-11", "1", "0,2,4", "0-63"] {
            assert_eq!(format_cpulist(&parse_cpulist(text).unwrap()), text);
        }
    }

    #[test]
    fn simulated_splits_evenly_and_shares_when_short() {
        let cpus: Vec<usize> = (0..8).collect();
        let t = Topology::simulated_on(&cpus, 3);
        let sizes: Vec<usize> = t.nodes().iter().map(|n| n.cpus.len()).collect();
        assert_eq!(sizes, vec![2, 3, 3]);
        let flat: Vec<usize> = t.nodes().iter().flat_map(|n| n.cpus.clone()).collect();
        assert_eq!(flat, cpus, "contiguous groups covering every CPU once");
        assert!(t.is_simulated() && !t.binds_memory());
        assert_eq!(t.n_cpus(), 8);
        assert_eq!((t.distance(0, 0), t.distance(0, 2), t.distance(2, 1)), (10, 20, 20));

        let t = Topology::simulated_on(&[0, 1], 3);
        let cpus: Vec<Vec<usize>> = t.nodes().iter().map(|n| n.cpus.clone()).collect();
        assert_eq!(cpus, vec![vec![0], vec![1], vec![0]]);
        assert_eq!(t.nodes().iter().map(|n| n.id).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(t.n_cpus(), 2);

        let t = Topology::simulated_on(&[4, 5], 0);
        assert_eq!(t.n_nodes(), 1);
        assert_eq!(t.nodes()[0].cpus, vec![4, 5]);
        // The real entry point works on this machine too, whatever its CPU count.
        let t = Topology::simulated(3);
        assert_eq!(t.n_nodes(), 3);
        assert!(t.nodes().iter().all(|n| !n.cpus.is_empty()));
    }

    #[test]
    fn display_has_one_line_per_node() {
        let t = Topology::simulated_on(&[0, 1, 2, 3, 8], 2);
        assert_eq!(
            t.to_string(),
            "node 0 (simulated): cpus 0-1; distances 10 20\nnode 1 (simulated): cpus 2-3,8; distances 20 10"
        );
        assert_eq!(Topology::fallback(&[0, 1]).to_string(), "node 0 (no NUMA information): cpus 0-1; distances 10");
    }

    /// `(node id, cpulist, distance)` file contents of one fake node.
    type FakeNode<'a> = (usize, &'a str, &'a str);

    /// A scratch sysfs tree: the files of each node, and an `online` file.
    struct FakeSysfs(PathBuf);

    impl FakeSysfs {
        fn new(tag: &str, nodes: &[FakeNode], online: Option<&str>) -> FakeSysfs {
            let root = std::env::temp_dir().join(format!("blink-numa-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            for &(id, cpulist, distance) in nodes {
                let dir = root.join(format!("node{id}"));
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join("cpulist"), cpulist).unwrap();
                std::fs::write(dir.join("distance"), distance).unwrap();
            }
            std::fs::create_dir_all(&root).unwrap();
            std::fs::write(root.join("possible"), "0-7\n").unwrap();
            if let Some(online) = online {
                std::fs::write(root.join("online"), online).unwrap();
            }
            FakeSysfs(root)
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn sysfs_nodes_are_read_and_restricted_to_allowed_cpus() {
        let fake = FakeSysfs::new(
            "ok",
            &[
                (0, "0-3\n", "10 21 31\n"),
                (1, "4-7\n", "21 10 31\n"),
                (3, "\n", "31 31 10\n"), // memory-only node: no CPUs
            ],
            Some("0-1,3\n"),
        );
        let all: Vec<usize> = (0..8).collect();
        let t = Topology::from_sysfs(&fake.0, &all).unwrap();
        assert_eq!(t.n_nodes(), 2);
        assert_eq!(t.nodes()[1], Node { id: 1, cpus: vec![4, 5, 6, 7] });
        assert_eq!((t.distance(0, 1), t.distance(1, 1)), (21, 10));
        assert!(t.binds_memory() && !t.is_simulated());
        assert_eq!(t.to_string(), "node 0: cpus 0-3; distances 10 21\nnode 1: cpus 4-7; distances 21 10");

        // Only CPUs 5 and 6 allowed: node 0 disappears.
        let t = Topology::from_sysfs(&fake.0, &[5, 6]).unwrap();
        assert_eq!(t.nodes(), &[Node { id: 1, cpus: vec![5, 6] }]);
        assert_eq!(t.distance(0, 0), 10);
        assert!(matches!(Topology::from_sysfs(&fake.0, &[42]), Err(NumaError::NoUsableNode)));
    }

    #[test]
    fn malformed_sysfs_is_an_error_not_a_panic() {
        let all: Vec<usize> = (0..8).collect();
        let cases: [(&str, &[FakeNode]); 4] = [
            ("cpulist", &[(0, "0-x\n", "10\n")]),
            ("distance", &[(0, "0-3\n", "ten\n")]),
            ("columns", &[(0, "0-3\n", "10 20\n")]),
            ("nonodes", &[]),
        ];
        for (tag, nodes) in cases {
            let fake = FakeSysfs::new(tag, nodes, None);
            let err = Topology::from_sysfs(&fake.0, &all).unwrap_err();
            assert!(!err.to_string().is_empty(), "{tag}");
        }
        assert!(Topology::from_sysfs(Path::new("/nonexistent/blink/numa"), &all).is_err());
    }

    #[test]
    fn detect_always_yields_usable_nodes() {
        let t = Topology::detect();
        assert!(t.n_nodes() >= 1);
        assert!(t.nodes().iter().all(|n| !n.cpus.is_empty()));
        assert!(!t.is_simulated());
        let allowed = crate::affinity::allowed_cpus();
        assert!(t.nodes().iter().flat_map(|n| &n.cpus).all(|c| allowed.contains(c)));
        assert_eq!(t.to_string().lines().count(), t.n_nodes());
    }
}
