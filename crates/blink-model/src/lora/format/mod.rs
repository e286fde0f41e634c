//! Adapter files: which format a path holds, reading it into [`LoraTensors`], and writing
//! [`LoraTensors`] in either format.
//!
//! Two formats: a PEFT directory (`adapter_config.json` + `adapter_model.safetensors`,
//! see `peft`) and llama.cpp's LoRA GGUF (see `gguf`). Both end in the same checks
//! (`check`): every pair fits the base model, and its `B` is in the base GGUF's row order.
//! The writers (`write_peft`, `write_gguf`) check the same before writing (`write`) and
//! undo for PEFT the row permutation that reading does, so a written adapter reads back
//! equal.

mod check;
mod gguf;
mod peft;
mod write;
mod write_gguf;
mod write_peft;

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::{LoraError, LoraTensors};
use crate::config::ModelConfig;

pub use write_gguf::write_gguf;
pub use write_peft::{peft_tensors, write_peft, write_peft_tensors, PeftMeta, PeftTensor};

/// Read the adapter at `path` and check it against `cfg`'s model.
///
/// `path` is a PEFT directory, its `adapter_config.json` or `adapter_model.safetensors`
/// (the other file is taken from beside it), or a llama.cpp LoRA GGUF file (known by its
/// magic, whatever its name). The result has one entry per layer of `cfg`; every `B` of Q
/// and K is in the base GGUF's row order (a PEFT adapter's rows are permuted for a model
/// with llama.cpp's normal rope order). Malformed or hostile files give an error, never a
/// panic.
pub fn read(path: &Path, cfg: &ModelConfig) -> Result<LoraTensors, LoraError> {
    let meta = fs::metadata(path).map_err(|source| io_error(path, source))?;
    if meta.is_dir() {
        return peft::read(&path.join(peft::CONFIG_FILE), &path.join(peft::MODEL_FILE), cfg);
    }
    if !meta.is_file() {
        return Err(io_error(path, io::Error::new(io::ErrorKind::InvalidInput, "not a regular file or directory")));
    }
    if has_gguf_magic(path)? {
        return gguf::read(path, cfg);
    }
    let sibling = |name: &str| path.parent().map_or_else(|| PathBuf::from(name), |dir| dir.join(name));
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if extension.eq_ignore_ascii_case("json") {
        peft::read(path, &sibling(peft::MODEL_FILE), cfg)
    } else if extension.eq_ignore_ascii_case("safetensors") {
        peft::read(&sibling(peft::CONFIG_FILE), path, cfg)
    } else {
        Err(check::format_error(
            path,
            format!("neither a PEFT adapter directory ({} + {}) nor a GGUF file", peft::CONFIG_FILE, peft::MODEL_FILE),
        ))
    }
}

fn io_error(path: &Path, source: io::Error) -> LoraError {
    LoraError::Io { path: path.to_path_buf(), source }
}

/// Whether the file at `path` starts with `GGUF`.
fn has_gguf_magic(path: &Path) -> Result<bool, LoraError> {
    let mut magic = Vec::with_capacity(4);
    File::open(path).and_then(|f| f.take(4).read_to_end(&mut magic)).map_err(|source| io_error(path, source))?;
    Ok(magic == b"GGUF")
}

/// The whole of the regular file at `path` (a FIFO or device would block or never end).
fn read_regular(path: &Path) -> Result<Vec<u8>, LoraError> {
    let meta = fs::metadata(path).map_err(|source| io_error(path, source))?;
    if !meta.is_file() {
        let what = if meta.is_dir() { "it is a directory" } else { "it is not a regular file" };
        return Err(io_error(path, io::Error::new(io::ErrorKind::InvalidInput, what)));
    }
    fs::read(path).map_err(|source| io_error(path, source))
}
