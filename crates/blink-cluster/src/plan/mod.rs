//! The planner: which layers each device holds, over how many rounds, and which devices
//! to leave out (Halda's problem in prima.cpp, with the network term it lacks).
//!
//! The time per token of a ring of windows `w` over `k` rounds is predicted as
//! - **compute**: `k · Σ w_d · t_d`, with `t_d` the seconds one layer takes on device d;
//! - **network**: every window is entered by a hop carrying a hidden state, so
//!   `k · Σ_{d in the ring} hop_d`, plus the hop back to the head when the head holds no
//!   window (`hop` = the link's latency + the hidden state's bytes over its bandwidth);
//! - **disk**: a device whose weights and KV cache do not fit its budget `B_d` keeps its
//!   KV cache and as much of its weights as fit, and reads the rest from disk every token,
//!   `r_d = max(0, k·w_d·(layer + kv) − B_d)` bytes, a window ahead. Per round it must
//!   read `r_d / k` at its disk's rate while the rest of the ring computes its windows;
//!   what the others' compute does not hide, it stalls: `k · Σ max(0, r_d/(k·disk_d) −
//!   Σ_{e≠d} w_e·t_e)`;
//! - **head**: the head's own work (embedding, output head, sampling), a constant.
//!
//! A device must hold its KV cache and at least the window it is computing:
//! `w_d · (k·kv + layer) ≤ B_d`. The rounds `k` divide the layers (every round has the same windows).
//! [`milp`] solves this as a mixed-integer program for each `k`; [`search`] by trying
//! every split, which the tests hold the program to.

mod milp;
pub mod search;
mod shape;

pub use shape::layer_bytes_by_type;

use std::fmt;

use serde::Serialize;

use crate::placement::Ring;

/// The model as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelShape {
    pub n_layers: usize,
    /// Weight bytes of one layer.
    pub layer_bytes: u64,
    /// KV-cache bytes of one layer at the context the ring is planned for.
    pub kv_layer_bytes: u64,
    /// What only the head holds: the token embedding, the output norm and head.
    pub head_bytes: u64,
    /// One token's hidden state on the wire.
    pub hidden_bytes: u64,
}

/// A link a hidden state crosses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    pub latency_s: f64,
    pub bytes_per_s: f64,
}

impl Link {
    /// Seconds one hop carrying `bytes` takes.
    pub fn hop_seconds(&self, bytes: u64) -> f64 {
        self.latency_s + bytes as f64 / self.bytes_per_s
    }
}

/// One device as profiled.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    pub name: String,
    /// Seconds one layer takes for one token here.
    pub layer_s: f64,
    /// Bytes it may hold: weights, KV cache (and on the head, the head's own tensors).
    pub memory: u64,
    /// The rate it reads weights from its disk, bytes/s.
    pub disk_bytes_per_s: f64,
    /// The link a hidden state crosses to reach it.
    pub link: Link,
}

/// What the planner plans for.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    pub model: ModelShape,
    /// In ring order.
    pub devices: Vec<Device>,
    /// The head's index in `devices` when it may take windows too.
    pub head: Option<usize>,
    /// The link back into the head, when it is not one of `devices`.
    pub head_link: Link,
    /// The head's own seconds per token (embedding, output head, sampling).
    pub head_s: f64,
    /// The most rounds to consider.
    pub max_rounds: usize,
}

/// A predicted time per token, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Breakdown {
    pub compute_s: f64,
    pub network_s: f64,
    pub disk_s: f64,
    pub head_s: f64,
}

impl Breakdown {
    pub fn total(&self) -> f64 {
        self.compute_s + self.network_s + self.disk_s + self.head_s
    }
}

/// A chosen ring and its predicted time per token.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub ring: Ring,
    pub predicted: Breakdown,
}

/// Why there is no plan.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanError {
    /// A figure that must be a positive number is not.
    Invalid(String),
    /// No split of the layers fits the devices' memory.
    DoesNotFit { model_bytes: u64, memory: u64 },
    /// The windows given do not fit (or do not cover the model).
    Infeasible(String),
    Solver(String),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Invalid(what) => write!(f, "cannot plan: {what}"),
            PlanError::DoesNotFit { model_bytes, memory } => write!(
                f,
                "no ring of these devices can hold the model: each device needs its KV cache and the window it computes in memory ({:.2} GiB of weights and cache; {:.2} GiB of memory in all)",
                *model_bytes as f64 / GIB,
                *memory as f64 / GIB
            ),
            PlanError::Infeasible(why) => write!(f, "the plan cannot run: {why}"),
            PlanError::Solver(e) => write!(f, "the planner's solver failed: {e}"),
        }
    }
}

impl std::error::Error for PlanError {}

const GIB: f64 = (1u64 << 30) as f64;

impl Cluster {
    /// Check the figures the model needs: positive, finite rates and times.
    pub fn validate(&self) -> Result<(), PlanError> {
        let bad = |what: String| Err(PlanError::Invalid(what));
        if self.devices.is_empty() {
            return bad("the cluster has no devices".into());
        }
        if self.model.n_layers == 0 {
            return bad("the model has no layers".into());
        }
        if self.head.is_some_and(|h| h >= self.devices.len()) {
            return bad("the head's index is past the devices".into());
        }
        let link_ok = |l: &Link| l.latency_s.is_finite() && l.latency_s >= 0.0 && l.bytes_per_s.is_finite() && l.bytes_per_s > 0.0;
        if !(link_ok(&self.head_link) && self.head_s.is_finite() && self.head_s >= 0.0) {
            return bad("the head's link or time is not a usable figure".into());
        }
        for d in &self.devices {
            if !(d.layer_s.is_finite() && d.layer_s > 0.0) {
                return bad(format!("device {}: its time per layer ({}) is not a positive number", d.name, d.layer_s));
            }
            if !(d.disk_bytes_per_s.is_finite() && d.disk_bytes_per_s > 0.0) {
                return bad(format!("device {}: its disk rate ({}) is not a positive number", d.name, d.disk_bytes_per_s));
            }
            if !link_ok(&d.link) {
                return bad(format!("device {}: its link's latency or bandwidth is not a usable figure", d.name));
            }
        }
        if self.head.is_some_and(|h| self.devices[h].memory < self.model.head_bytes) {
            return bad("the head's memory does not hold the embedding and output head".into());
        }
        Ok(())
    }

    /// The bytes device `d` may give to windows and KV cache.
    fn budget(&self, d: usize) -> f64 {
        let own = if self.head == Some(d) { self.model.head_bytes } else { 0 };
        self.devices[d].memory.saturating_sub(own) as f64
    }

    /// The rounds to consider: the divisors of the layers up to `max_rounds`.
    pub fn round_choices(&self) -> Vec<usize> {
        (1..=self.max_rounds.max(1).min(self.model.n_layers)).filter(|&k| self.model.n_layers.is_multiple_of(k)).collect()
    }

    fn hop(&self, d: usize) -> f64 {
        self.devices[d].link.hop_seconds(self.model.hidden_bytes)
    }

    /// The predicted time per token of `windows` over `rounds`, or why it cannot run.
    pub fn predict(&self, windows: &[usize], rounds: usize) -> Result<Breakdown, PlanError> {
        let m = &self.model;
        if windows.len() != self.devices.len() {
            return Err(PlanError::Infeasible(format!("{} windows for {} devices", windows.len(), self.devices.len())));
        }
        if rounds == 0 || windows.iter().sum::<usize>() * rounds != m.n_layers {
            return Err(PlanError::Infeasible(format!("windows {windows:?} over {rounds} rounds do not cover the model's {} layers", m.n_layers)));
        }
        let k = rounds as f64;
        let (layer, kv) = (m.layer_bytes as f64, m.kv_layer_bytes as f64);
        let compute_round: f64 = windows.iter().zip(&self.devices).map(|(&w, d)| w as f64 * d.layer_s).sum();
        let mut b = Breakdown { compute_s: k * compute_round, head_s: self.head_s, ..Breakdown::default() };
        for (i, &w) in windows.iter().enumerate() {
            let w = w as f64;
            let budget = self.budget(i);
            if w * (k * kv + layer) > budget {
                return Err(PlanError::Infeasible(format!("device {} cannot hold its KV cache and a window of {w} layers", self.devices[i].name)));
            }
            if w > 0.0 {
                b.network_s += k * self.hop(i);
            }
            let read = (w * k * (layer + kv) - budget).max(0.0);
            let others = compute_round - w * self.devices[i].layer_s;
            b.disk_s += k * (read / (k * self.devices[i].disk_bytes_per_s) - others).max(0.0);
        }
        b.network_s += match self.head {
            Some(h) if windows[h] > 0 => 0.0,
            Some(h) => self.hop(h),
            None => self.head_link.hop_seconds(m.hidden_bytes),
        };
        Ok(b)
    }

    /// The best plan, from the mixed-integer program.
    /// The cluster with the devices `down` left out (no memory: no window fits them), in
    /// their places in the ring: what the head re-plans over when they are lost.
    pub fn without(&self, down: &[usize]) -> Cluster {
        let mut c = self.clone();
        for &d in down {
            if let Some(dev) = c.devices.get_mut(d) {
                dev.memory = 0;
            }
        }
        c
    }

    pub fn plan(&self) -> Result<Plan, PlanError> {
        self.validate()?;
        let mut best: Option<Plan> = None;
        for k in self.round_choices() {
            if let Some(windows) = milp::solve(self, k)? {
                let predicted = self.predict(&windows, k)?;
                if best.as_ref().is_none_or(|b| predicted.total() < b.predicted.total()) {
                    best = Some(Plan { ring: Ring::new(windows, k).expect("windows that cover the layers"), predicted });
                }
            }
        }
        best.ok_or_else(|| self.does_not_fit())
    }

    fn does_not_fit(&self) -> PlanError {
        let m = &self.model;
        PlanError::DoesNotFit {
            model_bytes: m.n_layers as u64 * (m.layer_bytes + m.kv_layer_bytes) + m.head_bytes,
            memory: self.devices.iter().map(|d| d.memory).sum(),
        }
    }
}
