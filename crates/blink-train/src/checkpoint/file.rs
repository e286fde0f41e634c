//! The checkpoint file's place on disk: replaced atomically through [`crate::durable`], so
//! a reader (or a crash) sees either the old checkpoint or the new one, whole.

use std::fs::File;
use std::io;
use std::path::Path;

use super::{CheckpointError, FILE_NAME};
use crate::durable;

/// Temporary files start with this; anything so named in a checkpoint directory is the
/// leftover of a save that never finished.
fn temp_prefix() -> String {
    format!(".{FILE_NAME}.tmp-")
}

/// `e` as a checkpoint error: a full disk or quota is [`CheckpointError::NoSpace`].
pub(super) fn io_error(path: &Path, action: &'static str, e: io::Error) -> CheckpointError {
    if durable::is_no_space(&e) {
        CheckpointError::NoSpace { path: path.to_path_buf() }
    } else {
        CheckpointError::Io { path: path.to_path_buf(), action, source: e }
    }
}

/// Removes the temporary files interrupted saves left in `dir`.
pub(super) fn remove_stray_temps(dir: &Path) {
    durable::remove_stray_temps(dir, &temp_prefix());
}

/// Replaces `path` (in `dir`) by what `write` writes, atomically.
pub(super) fn replace(dir: &Path, path: &Path, write: impl FnOnce(&mut File) -> io::Result<()>) -> Result<(), CheckpointError> {
    durable::replace(dir, path, &temp_prefix(), write).map_err(|e| io_error(path, e.action, e.source))
}
