//! Writing a file so that a crash leaves either the old one or the new one, whole: write a
//! uniquely named temporary file in the same directory, sync it, rename it over the target,
//! sync the directory. A rename within one directory is atomic. On any failure before the
//! rename the temporary file is removed; after a crash, [`remove_stray_temps`] sweeps the
//! leftovers (their names start with the prefix the writer chose).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// What failed, and the step it failed at ("cannot write", "cannot sync", ...).
#[derive(Debug)]
pub(crate) struct WriteError {
    pub action: &'static str,
    pub source: io::Error,
}

/// Whether `e` means the disk (or a quota) is full.
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded)
}

/// A name in `dir`, starting with `prefix`, that no other write (in this process or
/// another) is using.
fn temp_path(dir: &Path, prefix: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{prefix}{}-{nanos}-{n}", std::process::id()))
}

/// Removes the temporary files interrupted writes with `prefix` left in `dir` (best
/// effort: they are never read, so a failure to list or remove them is ignored).
pub(crate) fn remove_stray_temps(dir: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(|name| name.starts_with(prefix)) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Replaces `path` (in `dir`) by what `write` writes, atomically; the temporary file's
/// name starts with `prefix`.
pub(crate) fn replace(dir: &Path, path: &Path, prefix: &str, write: impl FnOnce(&mut File) -> io::Result<()>) -> Result<(), WriteError> {
    let fail = |action: &'static str| move |source: io::Error| WriteError { action, source };
    let temp = temp_path(dir, prefix);
    let mut file = OpenOptions::new().write(true).create_new(true).open(&temp).map_err(fail("cannot create a temporary file for"))?;
    let written = write(&mut file).map_err(fail("cannot write")).and_then(|()| file.sync_all().map_err(fail("cannot sync")));
    drop(file);
    let renamed = written.and_then(|()| fs::rename(&temp, path).map_err(fail("cannot move into place")));
    if let Err(e) = renamed {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    sync_dir(dir).map_err(fail("cannot sync the directory of"))
}

/// Makes `dir`'s entries (a rename, a removal) durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all())
}
