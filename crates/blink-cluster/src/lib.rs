//! Home clusters (after prima.cpp): a model too big for any one device runs on a ring of
//! them. Each device holds a window of layers for each of k rounds; a token's hidden state
//! goes round the ring k times.
//!
//! This crate owns what is the same whatever carries the bytes:
//! - [`placement`]: which device, round and local index each layer has;
//! - [`config`]: the cluster file (`cluster.toml`): the devices, their budgets, the
//!   shared token's file and an optional fixed plan;
//! - [`plan`]: the planner, which chooses the windows, the number of rounds and the
//!   devices left out, from the devices' profiles and the links between them, as a
//!   mixed-integer program (checked against exhaustive search);
//! - [`profile`]: a device's measured figures, as `blink profile` prints them.

pub mod auth;
pub mod config;
pub mod head;
pub mod link;
pub mod node;
pub mod placement;
pub mod plan;
pub mod profile;
pub mod stream;
pub mod wire;
pub mod windows;

pub use config::{ClusterFile, ConfigError, DeviceEntry};
pub use placement::{Place, Ring};
pub use plan::{Cluster, Device, Link, ModelShape, Plan, PlanError};
