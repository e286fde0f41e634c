//! Home clusters (after prima.cpp): a model too big for any one device runs on a ring of
//! them. Each device holds a window of layers for each of k rounds; a token's hidden state
//! goes round the ring k times.
//!
//! - [`placement`]: which device, round and local index each layer has;
//! - [`config`]: the cluster file (`cluster.toml`): the devices, their budgets, the
//!   shared token's file and an optional fixed plan;
//! - [`plan`]: the planner, which chooses the windows, the number of rounds and the
//!   devices left out, from the devices' profiles and the links between them, as a
//!   mixed-integer program (checked against exhaustive search);
//! - [`profile`]: a device's measured figures, as `blink profile` prints them;
//! - [`wire`], [`auth`], [`link`]: the frames the ring speaks (versioned, bounded,
//!   validated), the shared token's challenge and response, and framed TCP connections
//!   (with a shim imitating a slow link);
//! - [`windows`]: a device's windows of layers, a KV cache each, and the steps over them;
//! - [`stream`]: windows held only around their use, refilled from the file and given
//!   back, for a device whose budget they exceed;
//! - [`node`]: `blink node`, a device of the ring;
//! - [`head`]: the head, which owns the embedding, the LM head and sampling and sends
//!   steps round the ring (several in flight), for sessions (`Steps`) and the serving
//!   engine (`RemoteSteps`).

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
