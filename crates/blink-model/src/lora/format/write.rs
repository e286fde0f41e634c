//! What both writers share: checking that an adapter fits the base model before anything
//! is written (so that what is written reads back), and replacing a file atomically.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::super::{LoraError, LoraPair, LoraTarget, LoraTensors};
use super::check::format_error;
use crate::config::ModelConfig;

/// Every pair of `tensors` in `cfg`'s model, with its layer and target, after checking that
/// there is one entry per layer and that every pair has the model's shape and a rank the
/// reader takes, with as many values as its shape needs.
pub(super) fn checked_pairs<'t>(tensors: &'t LoraTensors, cfg: &ModelConfig) -> Result<Vec<(usize, LoraTarget, &'t LoraPair)>, LoraError> {
    if tensors.layers.len() != cfg.n_layers {
        return Err(LoraError::WrongBase(format!("the adapter has {} layers, the model has {}", tensors.layers.len(), cfg.n_layers)));
    }
    let mut pairs = Vec::new();
    for (layer, slots) in tensors.layers.iter().enumerate() {
        for target in LoraTarget::ALL {
            let Some(pair) = &slots[target.index()] else { continue };
            let (rows, cols) = target.shape(cfg);
            let what = |side: &str| format!("layer {layer} {} lora_{side}", target.peft_name());
            if pair.cols != cols {
                return Err(LoraError::Shape { tensor: what("A"), expected: vec![pair.rank, cols], found: vec![pair.rank, pair.cols] });
            }
            if pair.rows != rows {
                return Err(LoraError::Shape { tensor: what("B"), expected: vec![rows, pair.rank], found: vec![pair.rows, pair.rank] });
            }
            let max = rows.min(cols);
            if pair.rank == 0 || pair.rank > max {
                return Err(LoraError::WrongBase(format!("{} has rank {}, outside 1..={max}", what("A"), pair.rank)));
            }
            for (side, len, shape) in [("A", pair.a.len(), [pair.rank, cols]), ("B", pair.b.len(), [rows, pair.rank])] {
                if len != shape[0] * shape[1] {
                    return Err(LoraError::WrongBase(format!("{} holds {len} values, its shape {shape:?} needs {}", what(side), shape[0] * shape[1])));
                }
            }
            pairs.push((layer, target, pair));
        }
    }
    Ok(pairs)
}

/// [`checked_pairs`], for an adapter about to be written to `path`: it must also hold a
/// pair, a finite positive alpha and only finite values, as the readers require.
pub(super) fn checked_adapter<'t>(path: &Path, tensors: &'t LoraTensors, cfg: &ModelConfig) -> Result<Vec<(usize, LoraTarget, &'t LoraPair)>, LoraError> {
    let pairs = checked_pairs(tensors, cfg)?;
    if pairs.is_empty() {
        return Err(format_error(path, "the adapter to write holds no LoRA pairs".into()));
    }
    if !(tensors.alpha.is_finite() && tensors.alpha > 0.0) {
        return Err(format_error(path, format!("lora_alpha = {} is not a finite positive number", tensors.alpha)));
    }
    for &(layer, target, pair) in &pairs {
        for (side, values) in [("A", &pair.a), ("B", &pair.b)] {
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(format_error(path, format!("layer {layer} {} lora_{side} holds a non-finite value ({}) at element {i}", target.peft_name(), values[i])));
            }
        }
    }
    Ok(pairs)
}

/// `values` as little-endian bytes.
pub(super) fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Replace the file at `path` with what `fill` writes, atomically: the bytes go to a new
/// temporary file beside it, which is synced and renamed over `path`, and then the
/// directory is synced, so that `path` holds either its old contents or all of the new
/// ones, even after a crash. The directory must exist; any failure removes the temporary
/// file and is an I/O error naming `path`.
pub(super) fn replace_file(path: &Path, fill: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> Result<(), LoraError> {
    let io_error = |source| LoraError::Io { path: path.to_path_buf(), source };
    let file_name = path.file_name().ok_or_else(|| io_error(io::Error::new(io::ErrorKind::InvalidInput, "the path names no file")))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(file_name);
    temp_name.push(format!(".{}.{}.tmp", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let temp = dir.join(temp_name);

    let file = OpenOptions::new().write(true).create_new(true).open(&temp).map_err(io_error)?;
    let written = (|| {
        let mut w = BufWriter::new(file);
        fill(&mut w)?;
        w.flush()?;
        let file = w.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temp, path)
    })();
    if let Err(source) = written {
        let _ = fs::remove_file(&temp);
        return Err(io_error(source));
    }
    sync_dir(&dir).map_err(io_error)
}

/// Make a rename in `dir` durable.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Windows cannot open a directory as a file; its renames are not synced this way.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("blink-lora-replace-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn replaces_the_file_and_leaves_nothing_else() {
        let dir = temp_dir("ok");
        let path = dir.join("a.bin");
        fs::write(&path, b"old").unwrap();
        replace_file(&path, |w| w.write_all(b"new contents")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new contents");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "no temporary file is left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_fill_keeps_the_old_file_and_removes_the_temporary() {
        let dir = temp_dir("fail");
        let path = dir.join("a.bin");
        fs::write(&path, b"old").unwrap();
        let e = replace_file(&path, |w| {
            w.write_all(b"partial")?;
            Err(io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert!(matches!(&e, LoraError::Io { path: p, .. } if *p == path), "{e:?}");
        assert!(e.to_string().contains("disk on fire"), "{e}");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_is_an_io_error() {
        let path = std::env::temp_dir().join(format!("blink-lora-no-such-dir-{}", std::process::id())).join("a.bin");
        let e = replace_file(&path, |w| w.write_all(b"x")).unwrap_err();
        assert!(matches!(&e, LoraError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound), "{e:?}");
    }
}
