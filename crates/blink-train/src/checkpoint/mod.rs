//! Checkpoints of a fine-tuning run: everything it needs to continue exactly where it
//! stopped — the adapter being trained, AdamW's moments, the position in the data, the loss
//! curve so far — in ONE file, `DIR/checkpoint.safetensors`.
//!
//! The file is an ordinary safetensors file: the adapter's pairs as f32 tensors
//! `blk.{layer}.{gguf target}.lora_a` (`[rank, cols]`) and `.lora_b` (`[rows, rank]`), the
//! moments as `adam_m.{i}` and `adam_v.{i}` (1-D, in the run's flat parameter order), and the
//! rest as strings in the header's `__metadata__` (see `format`): a format version, the
//! scalars, the curve as JSON, the run's fingerprint, and an FNV-1a 64 checksum over all
//! metadata and tensor bytes. Floats that must come back bit-identical (α, losses, rates)
//! are stored as the hex of their bits.
//!
//! Saving is atomic: the file is written to a uniquely named temporary file in the same
//! directory, synced, renamed over the previous checkpoint, and the directory is synced
//! (see `file`). Any failure — a full disk included — removes the temporary file and leaves
//! the previous checkpoint as it was; a temporary file left by a killed process is ignored
//! and removed by the next [`save`] or [`load`]. Loading checks the version and the checksum
//! before it trusts anything, so a torn or damaged file is an error, never a panic or a
//! silently wrong resume. One run writes a directory at a time.

mod file;
mod format;

use std::io;
use std::path::{Path, PathBuf};

use blink_model::lora::LoraTensors;

/// The checkpoint's file name in its directory.
pub const FILE_NAME: &str = "checkpoint.safetensors";

/// The layout version written in the metadata; [`load`] reads it and every earlier one
/// (version 1 differs only in its checksum) and refuses any other.
pub const FORMAT_VERSION: u32 = 2;

/// One row of the loss curve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CurvePoint {
    /// Optimizer steps done when the row was taken.
    pub step: u64,
    pub epoch: u64,
    pub train_loss: f64,
    pub lr: f64,
    /// Tokens trained on so far.
    pub tokens: u64,
    pub eval_loss: Option<f64>,
    pub eval_accuracy: Option<f64>,
}

/// Everything a run needs to continue exactly where it stopped.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainState {
    /// The adapter being trained (f32).
    pub params: LoraTensors,
    /// AdamW's step count (for its bias corrections).
    pub adam_steps: u64,
    /// AdamW first moments, one Vec per parameter tensor in the run's flat order.
    pub adam_m: Vec<Vec<f32>>,
    /// AdamW second moments, as `adam_m`.
    pub adam_v: Vec<Vec<f32>>,
    /// Optimizer steps done.
    pub step: u64,
    /// The position of the next batch: its epoch and its index among the epoch's packed
    /// batches.
    pub epoch: u64,
    pub batch: u64,
    pub trained_tokens: u64,
    pub curve: Vec<CurvePoint>,
    /// What the run was started with (a hash of data, model and settings, made by the
    /// caller); [`resume`] refuses a checkpoint whose fingerprint differs.
    pub fingerprint: String,
}

/// Why a checkpoint could not be saved or loaded. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The disk (or quota) filled up while writing; the previous checkpoint is untouched.
    #[error("no space left on device while writing checkpoint {}; the last checkpoint is kept", .path.display())]
    NoSpace { path: PathBuf },
    /// Any other I/O failure; `action` says what was being done ("cannot read", …).
    #[error("{action} checkpoint {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: io::Error,
    },
    /// Not a safetensors file, not a Blink checkpoint, truncated, or inconsistent.
    #[error("checkpoint {} is malformed: {reason}", .path.display())]
    Malformed { path: PathBuf, reason: String },
    /// The bytes are not the ones written: the file was damaged after it was saved.
    #[error(
        "checkpoint {} is corrupted: its checksum is {computed:016x} but {recorded:016x} was recorded when it was written; \
         delete it to start over, or restore a copy",
        .path.display()
    )]
    Checksum { path: PathBuf, recorded: u64, computed: u64 },
    /// Written by a build with another checkpoint layout.
    #[error("checkpoint {} has format version {found}; this build of Blink reads versions 1 to {FORMAT_VERSION}", .path.display())]
    Version { path: PathBuf, found: String },
    /// The checkpoint belongs to a run started with other data, model or settings.
    #[error(
        "checkpoint {} was written by a different run (fingerprint {found}, this run's is {expected}): \
         resume with the same data, model and settings, or delete the checkpoint to start over",
        .path.display()
    )]
    Fingerprint { path: PathBuf, found: String, expected: String },
    /// The state given to [`save`] cannot be stored as it is (a bug in the caller).
    #[error("cannot save checkpoint {}: {reason}", .path.display())]
    InvalidState { path: PathBuf, reason: String },
}

/// The checkpoint file of `dir`.
pub fn checkpoint_path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// `dir`, with the empty path as `.` (a directory to list and sync).
fn nonempty(dir: &Path) -> &Path {
    if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    }
}

/// Writes `state` as `dir`'s checkpoint, atomically replacing the previous one (creating
/// `dir` if needed). On error the previous checkpoint is kept and no temporary file remains.
pub fn save(dir: &Path, state: &TrainState) -> Result<(), CheckpointError> {
    let dir = nonempty(dir);
    let path = checkpoint_path(dir);
    let encoded = format::encode(&path, state)?;
    std::fs::create_dir_all(dir).map_err(|e| file::io_error(&path, "cannot create the directory of", e))?;
    file::remove_stray_temps(dir);
    file::replace(dir, &path, |w| encoded.write_to(w))
}

/// Reads `dir`'s checkpoint: `Ok(None)` when there is none (nor the directory). A stray
/// temporary file of an interrupted save is ignored and removed.
pub fn load(dir: &Path) -> Result<Option<TrainState>, CheckpointError> {
    let dir = nonempty(dir);
    let path = checkpoint_path(dir);
    file::remove_stray_temps(dir);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(file::io_error(&path, "cannot read", e)),
    };
    format::decode(&path, &bytes).map(Some)
}

/// [`load`], refusing a checkpoint whose fingerprint is not `fingerprint`.
pub fn resume(dir: &Path, fingerprint: &str) -> Result<Option<TrainState>, CheckpointError> {
    let Some(state) = load(dir)? else { return Ok(None) };
    if state.fingerprint != fingerprint {
        return Err(CheckpointError::Fingerprint { path: checkpoint_path(dir), found: state.fingerprint, expected: fingerprint.to_string() });
    }
    Ok(Some(state))
}
