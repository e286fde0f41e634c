//! What memory this process may use: the kernel's `MemAvailable`, within its cgroup's
//! limit less the cgroup's usage (cgroup v1's `memory.limit_in_bytes`, or v2's
//! `memory.max`).

use std::path::{Path, PathBuf};

use super::Memory;

/// The memory figures now (bandwidth left at zero for the caller to measure).
pub fn memory_now() -> Memory {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| meminfo.lines().find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()).map_or(0, |kb| kb * 1024);
    let (total, available) = (field("MemTotal:"), field("MemAvailable:"));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|c| cgroup_limit(&c, Path::new("/sys/fs/cgroup")));
    let budget = match cgroup {
        Some((limit, usage)) => available.min(limit.saturating_sub(usage)),
        None => available,
    };
    Memory { bandwidth_bytes_per_s: 0.0, total_bytes: total, available_bytes: available, cgroup_limit_bytes: cgroup.map(|c| c.0), budget_bytes: budget }
}

/// The (limit, usage) of the memory cgroup `proc_cgroup` (the text of
/// `/proc/self/cgroup`) names, under `root`; `None` without a limit.
fn cgroup_limit(proc_cgroup: &str, root: &Path) -> Option<(u64, u64)> {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            // cgroup v1: a huge number means no limit.
            let dir = root.join("memory").join(rel);
            let limit = read(dir.join("memory.limit_in_bytes"))?;
            return (limit < 1 << 62).then(|| (limit, read(dir.join("memory.usage_in_bytes")).unwrap_or(0)));
        }
        if controllers.is_empty() {
            // cgroup v2: "max" means no limit (and does not parse).
            let dir = root.join(rel);
            if let Some(limit) = read(dir.join("memory.max")) {
                return Some((limit, read(dir.join("memory.current")).unwrap_or(0)));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_of_both_cgroup_versions() {
        let root = std::env::temp_dir().join(format!("blink-cgroup-{}", std::process::id()));
        let v1 = root.join("memory/ring/node1");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "1073741824\n").unwrap();
        std::fs::write(v1.join("memory.usage_in_bytes"), "1000\n").unwrap();
        assert_eq!(cgroup_limit("12:cpu:/\n4:memory:/ring/node1\n", &root), Some((1 << 30, 1000)));
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_limit("4:memory:/ring/node1\n", &root), None);
        let v2 = root.join("user.slice");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.max"), "2147483648\n").unwrap();
        std::fs::write(v2.join("memory.current"), "5\n").unwrap();
        assert_eq!(cgroup_limit("0::/user.slice\n", &root), Some((2 << 30, 5)));
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit("0::/user.slice\n", &root), None);
        std::fs::remove_dir_all(&root).unwrap();
        let now = memory_now();
        assert!(now.total_bytes > 0 && now.available_bytes <= now.total_bytes && now.budget_bytes <= now.available_bytes);
    }
}
