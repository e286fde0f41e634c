//! [`GgufFile`]: an opened, fully validated GGUF file and its typed metadata getters.
//!
//! The bytes live in a memory map (or an owned buffer); tensor data is handed out as
//! borrowed slices of it, never copied.

use std::fmt;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::error::GgufError;
use crate::parse::{lookup, parse, Layout};
use crate::tensor::TensorInfo;
use crate::value::{Array, Value};

/// Where the file's bytes live: a map (with the file kept open, for advice on its cached
/// pages), or a buffer.
enum Backing {
    Mapped(Mmap, File),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(map, _) => map,
            Backing::Owned(bytes) => bytes,
        }
    }
}

/// A GGUF v2/v3 file whose header, metadata, tensor table and tensor extents have all been
/// validated. Construction either yields a fully valid file or an error.
pub struct GgufFile {
    backing: Backing,
    layout: Layout,
}

impl GgufFile {
    /// Memory-maps and validates the file at `path`.
    ///
    /// The map is read-only. As with any memory map, the file must not be truncated or
    /// modified by another process while the `GgufFile` is alive.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io_err = |action| {
            move |source| GgufError::Io {
                action,
                path: path.to_path_buf(),
                source,
            }
        };
        // Only a regular file can be mapped; opening a FIFO would also wait for a writer.
        let kind = std::fs::metadata(path).map_err(io_err("open"))?.file_type();
        if !kind.is_file() {
            let what = if kind.is_dir() { "it is a directory" } else { "it is not a regular file" };
            return Err(io_err("open")(std::io::Error::new(std::io::ErrorKind::InvalidInput, what)));
        }
        let file = File::open(path).map_err(io_err("open"))?;
        let len = file.metadata().map_err(io_err("stat"))?.len();
        let backing = if len == 0 {
            // Some platforms refuse to map an empty file; an empty buffer fails parsing the same way.
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and only ever read through `&[u8]`; the caller is
            // told above that the file must not change underneath it.
            Backing::Mapped(unsafe { Mmap::map(&file) }.map_err(io_err("memory-map"))?, file)
        };
        Self::from_backing(backing)
    }

    /// Validates a GGUF file held in memory (tests, fuzzing, files not on disk).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(backing: Backing) -> Result<GgufFile, GgufError> {
        let layout = parse(backing.bytes())?;
        Ok(GgufFile { backing, layout })
    }

    /// The GGUF format version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.layout.version
    }

    /// Alignment of tensor data, from `general.alignment` (default 32).
    pub fn alignment(&self) -> u64 {
        self.layout.alignment
    }

    /// All metadata entries, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.layout.metadata
    }

    /// The value of metadata key `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let l = &self.layout;
        lookup(&l.metadata, &l.key_index, key, |(k, _)| k).map(|(_, v)| v)
    }

    /// Any integer value that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.require(key).and_then(|v| to_u32(key, v))
    }

    /// Any non-negative integer value.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.require(key).and_then(|v| to_u64(key, v))
    }

    /// An `f32` value, or an `f64` one narrowed to `f32`.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.require(key).and_then(|v| to_f32(key, v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.require(key).and_then(|v| to_bool(key, v))
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.require(key).and_then(|v| to_str(key, v))
    }

    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        self.require(key).and_then(|v| to_array(key, v))
    }

    /// Like [`get_u32`](Self::get_u32), but `Ok(None)` when the key is absent.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.get(key).map(|v| to_u32(key, v)).transpose()
    }

    /// Like [`get_u64`](Self::get_u64), but `Ok(None)` when the key is absent.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get(key).map(|v| to_u64(key, v)).transpose()
    }

    /// Like [`get_f32`](Self::get_f32), but `Ok(None)` when the key is absent.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.get(key).map(|v| to_f32(key, v)).transpose()
    }

    /// Like [`get_bool`](Self::get_bool), but `Ok(None)` when the key is absent.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get(key).map(|v| to_bool(key, v)).transpose()
    }

    /// Like [`get_str`](Self::get_str), but `Ok(None)` when the key is absent.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get(key).map(|v| to_str(key, v)).transpose()
    }

    /// Like [`get_array`](Self::get_array), but `Ok(None)` when the key is absent.
    pub fn opt_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        self.get(key).map(|v| to_array(key, v)).transpose()
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_owned()))
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.layout.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let l = &self.layout;
        lookup(&l.tensors, &l.tensor_index, name, |t| &t.name)
    }

    /// The exact bytes of a tensor of this file.
    ///
    /// Every tensor from [`tensors`](Self::tensors) was checked to lie inside the file when it
    /// was opened. A `TensorInfo` that does not describe a range of this file (one built by
    /// hand, or taken from another file) yields an empty slice.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = self
            .layout
            .data_offset
            .checked_add(t.offset)
            .and_then(|start| Some((start, start.checked_add(t.n_bytes)?)))
            .and_then(|(start, end)| {
                Some(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
            });
        range
            .and_then(|r| self.backing.bytes().get(r))
            .unwrap_or(&[])
    }

    /// Tell the OS that `t`'s bytes will not be read again soon, so their pages can leave
    /// memory (used after a tensor was copied elsewhere, e.g. repacked). Reading them later
    /// still works: the pages come back from the file. A no-op for in-memory files.
    pub fn release_tensor(&self, t: &TensorInfo) {
        if let Backing::Mapped(map, _) = &self.backing {
            const PAGE: usize = 4096;
            let start = (self.layout.data_offset + t.offset) as usize;
            let first = start.next_multiple_of(PAGE);
            let end = (start + t.n_bytes as usize) / PAGE * PAGE;
            if end > first {
                // SAFETY: the map is a shared, read-only file mapping: dropping its pages only
                // makes later reads fault them back in from the file, with the same bytes.
                // Advisory only; failure just leaves the pages resident.
                let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first) };
            }
        }
    }

    /// The open file behind the map, and the offset in it of `bytes` (a slice of this
    /// file's bytes, such as [`GgufFile::tensor_data`]): for advice on its cached pages.
    /// `None` for in-memory files or a slice from elsewhere.
    pub fn file_range(&self, bytes: &[u8]) -> Option<(&File, u64)> {
        let Backing::Mapped(map, file) = &self.backing else { return None };
        let start = (bytes.as_ptr() as usize).checked_sub(map.as_ptr() as usize)?;
        (start + bytes.len() <= map.len()).then_some((file, start as u64))
    }

    /// Whether the bytes are a memory map of the file (rather than a buffer).
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mapped(..))
    }

    /// The whole file's bytes (its map, or the buffer it was read into).
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// Absolute offset of the data section (tensor offsets are relative to it): the end of
    /// the tensor table rounded up to the alignment. In a file without tensors it may lie
    /// past the end of the file.
    pub fn data_offset(&self) -> u64 {
        self.layout.data_offset
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version())
            .field("file_size", &self.file_size())
            .field("alignment", &self.alignment())
            .field("metadata_entries", &self.metadata().len())
            .field("tensors", &self.tensors().len())
            .field("data_offset", &self.data_offset())
            .finish()
    }
}

fn wrong_type(key: &str, expected: &'static str, v: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_owned(),
        expected,
        found: format!("{} {v}", v.type_name()),
    }
}

fn to_u32(key: &str, v: &Value) -> Result<u32, GgufError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| wrong_type(key, "an integer in u32 range", v))
}

fn to_u64(key: &str, v: &Value) -> Result<u64, GgufError> {
    v.as_u64()
        .ok_or_else(|| wrong_type(key, "a non-negative integer", v))
}

fn to_f32(key: &str, v: &Value) -> Result<f32, GgufError> {
    match *v {
        Value::F32(x) => Ok(x),
        Value::F64(x) => Ok(x as f32),
        _ => Err(wrong_type(key, "a float", v)),
    }
}

fn to_bool(key: &str, v: &Value) -> Result<bool, GgufError> {
    v.as_bool().ok_or_else(|| wrong_type(key, "a bool", v))
}

fn to_str<'v>(key: &str, v: &'v Value) -> Result<&'v str, GgufError> {
    v.as_str().ok_or_else(|| wrong_type(key, "a string", v))
}

fn to_array<'v>(key: &str, v: &'v Value) -> Result<&'v Array, GgufError> {
    v.as_array().ok_or_else(|| wrong_type(key, "an array", v))
}
