//! Adapter files: which format a path holds, and reading it into [`LoraTensors`].

use std::path::Path;

use super::{LoraError, LoraTensors};
use crate::config::ModelConfig;

/// Read the adapter at `path` (a PEFT directory, or a llama.cpp LoRA GGUF file) and check
/// it against `cfg`'s model.
pub fn read(path: &Path, cfg: &ModelConfig) -> Result<LoraTensors, LoraError> {
    let _ = cfg;
    Err(LoraError::Format { path: path.to_path_buf(), reason: "adapter reading is not written yet".into() })
}
