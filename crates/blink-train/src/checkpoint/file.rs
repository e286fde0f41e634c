//! Replacing the checkpoint file atomically: write a uniquely named temporary file in the
//! same directory, sync it, rename it over the old file, sync the directory. A rename within
//! one directory is atomic, so a reader (or a crash) sees either the old checkpoint or the
//! new one, whole. On any failure before the rename the temporary file is removed.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{CheckpointError, FILE_NAME};

/// Temporary files start with this; anything so named in a checkpoint directory is the
/// leftover of a save that never finished.
fn temp_prefix() -> String {
    format!(".{FILE_NAME}.tmp-")
}

/// A name no other save (in this process or another) is using.
fn temp_path(dir: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{}{}-{nanos}-{n}", temp_prefix(), std::process::id()))
}

/// `e` as a checkpoint error: a full disk or quota is [`CheckpointError::NoSpace`].
pub(super) fn io_error(path: &Path, action: &'static str, e: io::Error) -> CheckpointError {
    match e.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => CheckpointError::NoSpace { path: path.to_path_buf() },
        _ => CheckpointError::Io { path: path.to_path_buf(), action, source: e },
    }
}

/// Removes the temporary files interrupted saves left in `dir` (best effort: a failure to
/// list or remove is ignored, as the files are never read).
pub(super) fn remove_stray_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let prefix = temp_prefix();
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(|name| name.starts_with(&prefix)) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Replaces `path` (in `dir`) by what `write` writes, atomically.
pub(super) fn replace(dir: &Path, path: &Path, write: impl FnOnce(&mut File) -> io::Result<()>) -> Result<(), CheckpointError> {
    let temp = temp_path(dir);
    let mut file = OpenOptions::new().write(true).create_new(true).open(&temp).map_err(|e| io_error(path, "cannot create a temporary file for", e))?;
    let written = write(&mut file)
        .map_err(|e| io_error(path, "cannot write", e))
        .and_then(|()| file.sync_all().map_err(|e| io_error(path, "cannot sync", e)));
    drop(file);
    let renamed = written.and_then(|()| fs::rename(&temp, path).map_err(|e| io_error(path, "cannot move into place", e)));
    if let Err(e) = renamed {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    // The rename is durable once the directory entry is on disk.
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_error(path, "cannot sync the directory of", e))
}
