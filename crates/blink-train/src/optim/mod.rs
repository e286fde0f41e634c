//! The optimizer side of training: AdamW with PyTorch's semantics (`adamw`), gradient
//! clipping by global L2 norm (`clip`) and the learning-rate schedule with warm-up
//! (`schedule`). All of it is deterministic: fixed loop orders, no threads.

mod adamw;
mod clip;
mod schedule;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::{add_squares, clip_grad_norm, clip_scale, grad_norm};
pub use schedule::{Decay, Schedule};

/// Why an optimizer operation was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptimError {
    /// A hyper-parameter out of its range.
    #[error("invalid optimizer setting: {0}")]
    Setting(String),
    /// Parameters, gradients and optimizer state do not line up.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// The gradients hold an infinity or NaN (the step must not be taken).
    #[error("the gradient norm is not finite ({0})")]
    NonFinite(f64),
}
