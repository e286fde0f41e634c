//! A device's profile, as `blink profile` prints it and the planner reads it: how fast it
//! runs a one-row product of each weight type, its memory (bandwidth, what is free, and
//! the cgroup's limit), how fast it reads its disk, and its links to its peers.

mod measure;
mod memory;
pub mod peer;

pub use measure::{disk_read_rate, measure};
pub use memory::memory_now;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::{Device, Link};

pub const FORMAT: &str = "blink-profile";
pub const VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub format: String,
    pub version: u32,
    pub cpu: String,
    pub threads: usize,
    /// The kernel path the products ran on.
    pub kernel: String,
    /// Weight bytes a one-row product (a decode token's) streams per second, by type name.
    pub product_bytes_per_s: BTreeMap<String, f64>,
    pub memory: Memory,
    /// Bytes per second read from the disk holding the model (its pages not cached).
    pub disk_read_bytes_per_s: f64,
    #[serde(default)]
    pub peers: Vec<PeerLink>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// STREAM triad bandwidth.
    pub bandwidth_bytes_per_s: f64,
    pub total_bytes: u64,
    /// What the kernel says is available (`MemAvailable`).
    pub available_bytes: u64,
    /// The cgroup's limit, if one is set (v1 or v2).
    pub cgroup_limit_bytes: Option<u64>,
    /// What this process may use: the available memory, within the cgroup's limit less
    /// its usage.
    pub budget_bytes: u64,
}

/// A link to a peer, as measured from this device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerLink {
    pub addr: String,
    /// Half a round trip of a small frame.
    pub latency_s: f64,
    pub bytes_per_s: f64,
}

impl Profile {
    /// Check a profile read from a file: its format, version and figures.
    pub fn check(&self) -> Result<(), String> {
        if self.format != FORMAT || self.version != VERSION {
            return Err(format!("not a {FORMAT} version {VERSION} file (it says {} version {})", self.format, self.version));
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.disk_read_bytes_per_s) || !positive(self.memory.bandwidth_bytes_per_s) {
            return Err("its disk or memory rate is not a positive number".into());
        }
        if let Some((ty, _)) = self.product_bytes_per_s.iter().find(|(_, &r)| !positive(r)) {
            return Err(format!("its product rate for {ty} is not a positive number"));
        }
        if let Some(p) = self.peers.iter().find(|p| !(p.latency_s.is_finite() && p.latency_s >= 0.0 && positive(p.bytes_per_s))) {
            return Err(format!("its link to {} is not a usable figure", p.addr));
        }
        Ok(())
    }

    /// Seconds a layer of these weight bytes by type takes for one token here. A type the
    /// profile did not measure is an error naming it.
    pub fn layer_seconds(&self, layer_bytes_by_type: &BTreeMap<String, u64>) -> Result<f64, String> {
        layer_bytes_by_type
            .iter()
            .map(|(ty, &bytes)| match self.product_bytes_per_s.get(ty) {
                Some(rate) => Ok(bytes as f64 / rate),
                None => Err(format!("the profile has no product rate for {ty} weights (profile this device with the model: blink profile -m MODEL)")),
            })
            .sum()
    }

    /// The device as the planner sees it, with a budget (`memory`, else the profile's) and
    /// the link a hidden state crosses to reach it.
    pub fn device(&self, name: &str, layer_bytes_by_type: &BTreeMap<String, u64>, memory: Option<u64>, link: Link) -> Result<Device, String> {
        Ok(Device {
            name: name.to_string(),
            layer_s: self.layer_seconds(layer_bytes_by_type)?,
            memory: memory.unwrap_or(self.memory.budget_bytes),
            disk_bytes_per_s: self.disk_read_bytes_per_s,
            link,
        })
    }
}
