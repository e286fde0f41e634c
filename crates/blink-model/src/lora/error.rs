//! Why an adapter could not be read or used with a model.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why an adapter could not be loaded. Every variant names the file or tensor at fault.
#[derive(Debug, Error)]
pub enum LoraError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The file is not an adapter in any format Blink reads, or is malformed.
    #[error("{}: {reason}", path.display())]
    Format { path: PathBuf, reason: String },
    /// A tensor's shape does not fit the base model.
    #[error("adapter tensor '{tensor}' has shape {found:?}, but the base model needs {expected:?}")]
    Shape { tensor: String, expected: Vec<usize>, found: Vec<usize> },
    /// The adapter was made for another model (architecture, layer count, targets).
    #[error("adapter does not fit this model: {0}")]
    WrongBase(String),
    /// A weight too large for the f16 that adapters are held in.
    #[error("adapter tensor '{tensor}' holds {value}, outside the range of f16 (±65504) that adapter weights are held in")]
    Range { tensor: String, value: f32 },
    /// A feature of the file Blink does not run (a target, DoRA, bias training, …).
    #[error("unsupported adapter: {0}")]
    Unsupported(String),
    /// Memory for the placed adapter could not be had.
    #[error("no memory for the adapter: {0}")]
    Memory(blink_runtime::numa::NumaError),
}

impl LoraError {
    /// The error as a message about the adapter the user named at `given`: the file at
    /// fault when the error names one (it lies at or under `given`), else `given` first.
    pub fn about(&self, given: &Path) -> String {
        match self {
            LoraError::Io { .. } | LoraError::Format { .. } => self.to_string(),
            _ => format!("{}: {self}", given.display()),
        }
    }
}
