//! [`GgufWriter`]: builds a GGUF v3 file in memory or on disk.
//!
//! Everything added is validated against the same rules the reader enforces, so whatever
//! the writer produces opens again with [`GgufFile`](crate::GgufFile). A tensor may also be
//! declared without its data ([`GgufWriter::declare_tensor`]) and its bytes handed over only
//! when the file is written ([`GgufWriter::write_with`]), so a file larger than memory can
//! be made.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use crate::error::{GgufError, Quoted};
use crate::tensor::tensor_n_bytes;
use crate::types::GgmlType;
use crate::value::{Array, Value};
use crate::MAX_STRING_LEN;
use crate::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_KEY_LEN, MAX_NAME_LEN};

struct PendingTensor {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    /// `None`: declared, its bytes given while the file is written.
    data: Option<Vec<u8>>,
    n_bytes: u64,
}

/// Collects metadata and tensors, then serialises them as a GGUF v3 file.
///
/// Tensor data is laid out in insertion order, each tensor aligned to the file's alignment.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<PendingTensor>,
    tensor_index: HashMap<String, usize>,
    alignment: Option<u32>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a metadata entry. Fails if `key` is already present or the value cannot be
    /// read back (empty or over-long key, over-long string, arrays nested too deep).
    /// Adding `general.alignment` (a power-of-two `u32`) sets the alignment.
    pub fn add(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<(), GgufError> {
        let key = key.into();
        if let Some(&first) = self.key_index.get(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                first,
                second: self.metadata.len(),
            });
        }
        let value = value.into();
        self.check_entry(&key, &value)?;
        self.key_index.insert(key.clone(), self.metadata.len());
        self.metadata.push((key, value));
        Ok(())
    }

    /// Sets a metadata entry, replacing the value in place if the key is already present.
    pub fn set(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<(), GgufError> {
        let key = key.into();
        match self.key_index.get(&key) {
            None => self.add(key, value),
            Some(&i) => {
                let value = value.into();
                self.check_entry(&key, &value)?;
                self.metadata[i].1 = value;
                Ok(())
            }
        }
    }

    /// Sets the data alignment (a nonzero power of two), stored as `general.alignment`.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        self.set(ALIGNMENT_KEY, Value::U32(alignment))
    }

    /// The data alignment the file will use.
    pub fn alignment(&self) -> u64 {
        self.alignment.map_or(DEFAULT_ALIGNMENT, u64::from)
    }

    /// Validates a metadata entry; records the alignment if that is what it sets.
    fn check_entry(&mut self, key: &str, value: &Value) -> Result<(), GgufError> {
        let what = || format!("metadata key {}", Quoted(key));
        let bad = |problem: String| GgufError::Unwritable {
            what: what(),
            problem,
        };
        if key.is_empty() {
            return Err(bad("the key is empty".into()));
        }
        if key.len() as u64 > MAX_KEY_LEN {
            return Err(bad(format!("the key exceeds {MAX_KEY_LEN} bytes")));
        }
        check_value(value).map_err(bad)?;
        if key == ALIGNMENT_KEY {
            match *value {
                Value::U32(a) if a.is_power_of_two() => self.alignment = Some(a),
                Value::U32(a) => {
                    return Err(GgufError::BadAlignment {
                        problem: format!("must be a nonzero power of two, found {a}"),
                    })
                }
                _ => {
                    return Err(GgufError::BadAlignment {
                        problem: format!("must be of type u32, found {}", value.type_name()),
                    })
                }
            }
        }
        Ok(())
    }

    /// Appends a tensor, copying `data`, which must be exactly the size `ty` and `dims`
    /// (ggml order, `dims[0]` = row length) imply.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: &[u8],
    ) -> Result<(), GgufError> {
        self.add_tensor_owned(name, ty, dims, data.to_vec())
    }

    /// Like [`add_tensor`](Self::add_tensor), taking ownership of the data.
    pub fn add_tensor_owned(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        let n_bytes = self.check_tensor(&name, ty, dims)?;
        if data.len() as u64 != n_bytes {
            return Err(GgufError::BadTensor {
                problem: format!(
                    "data is {} bytes, but {ty} {dims:?} needs {n_bytes}",
                    data.len()
                ),
                name,
            });
        }
        self.push_tensor(name, ty, dims, Some(data), n_bytes);
        Ok(())
    }

    /// Declares a tensor without its data: [`write_with`](Self::write_with) asks for its
    /// bytes when their turn comes. Returns the number of bytes it will need.
    pub fn declare_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
    ) -> Result<u64, GgufError> {
        let name = name.into();
        let n_bytes = self.check_tensor(&name, ty, dims)?;
        self.push_tensor(name, ty, dims, None, n_bytes);
        Ok(n_bytes)
    }

    /// Checks a new tensor's name and shape; its size in bytes.
    fn check_tensor(&self, name: &str, ty: GgmlType, dims: &[u64]) -> Result<u64, GgufError> {
        if let Some(&first) = self.tensor_index.get(name) {
            return Err(GgufError::DuplicateTensor {
                name: name.to_string(),
                first,
                second: self.tensors.len(),
            });
        }
        if name.is_empty() || name.len() as u64 > MAX_NAME_LEN {
            return Err(GgufError::Unwritable {
                what: format!("tensor {}", Quoted(name)),
                problem: format!("names must be 1 to {MAX_NAME_LEN} bytes"),
            });
        }
        tensor_n_bytes(ty, dims).map_err(|problem| GgufError::BadTensor {
            name: name.to_string(),
            problem,
        })
    }

    fn push_tensor(
        &mut self,
        name: String,
        ty: GgmlType,
        dims: &[u64],
        data: Option<Vec<u8>>,
        n_bytes: u64,
    ) {
        self.tensor_index.insert(name.clone(), self.tensors.len());
        self.tensors.push(PendingTensor {
            name,
            ty,
            dims: dims.to_vec(),
            data,
            n_bytes,
        });
    }

    /// Everything before the tensor data: header, metadata, tensor table and padding.
    fn head(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        put_u32(&mut out, 3);
        put_u64(&mut out, self.tensors.len() as u64);
        put_u64(&mut out, self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            put_u32(&mut out, value.value_type() as u32);
            put_value(&mut out, value);
        }
        for (t, offset) in self.tensors.iter().zip(self.offsets()) {
            put_str(&mut out, &t.name);
            put_u32(&mut out, t.dims.len() as u32);
            for &d in &t.dims {
                put_u64(&mut out, d);
            }
            put_u32(&mut out, t.ty.id());
            put_u64(&mut out, offset);
        }
        // Without tensors there is no data section to align, so the file ends here.
        if !self.tensors.is_empty() {
            let padded = align_up(out.len() as u64, self.alignment());
            out.resize(padded as usize, 0);
        }
        out
    }

    /// Each tensor's offset in the data section: packed in order, each one aligned.
    fn offsets(&self) -> impl Iterator<Item = u64> + '_ {
        let alignment = self.alignment();
        self.tensors.iter().scan(0u64, move |end, t| {
            let start = align_up(*end, alignment);
            *end = start + t.n_bytes;
            Some(start)
        })
    }

    /// The whole file as bytes. The file ends with the last tensor's data (or, without
    /// tensors, with the tensor table): no trailing padding, so every byte is needed.
    ///
    /// # Panics
    /// If a tensor was declared without its data ([`write_with`](Self::write_with) writes
    /// those).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out)
            .expect("every tensor's data is held (declared tensors need write_with)");
        out
    }

    /// Streams the file to `w`; the bytes are those of [`to_bytes`](Self::to_bytes). Fails
    /// if a tensor was declared without its data.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        self.write_to_with(w, |name, _| {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tensor {} was declared without its data", Quoted(name)),
            ))
        })
    }

    /// Streams the file to `w`, calling `fill(name, w)` for each tensor declared without
    /// its data, in order, to write exactly its bytes (a different count is an error).
    pub fn write_to_with<W: Write>(
        &self,
        w: &mut W,
        mut fill: impl FnMut(&str, &mut dyn Write) -> io::Result<()>,
    ) -> io::Result<()> {
        w.write_all(&self.head())?;
        let mut written = 0u64;
        for (t, offset) in self.tensors.iter().zip(self.offsets()) {
            write_zeros(w, offset - written)?;
            match &t.data {
                Some(data) => w.write_all(data)?,
                None => {
                    let mut counted = Counted {
                        inner: &mut *w,
                        n: 0,
                    };
                    fill(&t.name, &mut counted)?;
                    if counted.n != t.n_bytes {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "tensor {} was given {} bytes, but needs {}",
                                Quoted(&t.name),
                                counted.n,
                                t.n_bytes
                            ),
                        ));
                    }
                }
            }
            written = offset + t.n_bytes;
        }
        w.flush()
    }

    /// Writes the file to `path`, replacing any existing file.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        self.write_with(path, |name, _| {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tensor {} was declared without its data", Quoted(name)),
            ))
        })
    }

    /// Writes the file to `path`, replacing any existing file, with `fill` writing each
    /// declared tensor's bytes as in [`write_to_with`](Self::write_to_with).
    pub fn write_with(
        &self,
        path: impl AsRef<Path>,
        fill: impl FnMut(&str, &mut dyn Write) -> io::Result<()>,
    ) -> Result<(), GgufError> {
        let path = path.as_ref();
        let io_err = |action| {
            move |source| GgufError::Io {
                action,
                path: path.to_path_buf(),
                source,
            }
        };
        let file = File::create(path).map_err(io_err("create"))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        self.write_to_with(&mut w, fill).map_err(io_err("write"))?;
        w.into_inner()
            .map_err(|e| io_err("write")(e.into_error()))?
            .sync_all()
            .map_err(io_err("sync"))
    }
}

/// A writer that counts the bytes passed through it.
struct Counted<'a, W: Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `n` zero bytes without allocating for large alignments.
fn write_zeros(w: &mut impl Write, mut n: u64) -> io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let chunk = n.min(ZEROS.len() as u64);
        w.write_all(&ZEROS[..chunk as usize])?;
        n -= chunk;
    }
    Ok(())
}

fn align_up(n: u64, alignment: u64) -> u64 {
    n.div_ceil(alignment) * alignment
}

/// Checks that a value stays within the reader's limits.
fn check_value(value: &Value) -> Result<(), String> {
    match value {
        Value::String(s) => check_str(s),
        Value::Array(a) => check_array(a, 1),
        _ => Ok(()),
    }
}

fn check_str(s: &str) -> Result<(), String> {
    if s.len() as u64 > MAX_STRING_LEN {
        return Err(format!(
            "a string of {} bytes exceeds the limit of {MAX_STRING_LEN}",
            s.len()
        ));
    }
    Ok(())
}

fn check_array(a: &Array, depth: usize) -> Result<(), String> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(format!(
            "arrays are nested more than {MAX_ARRAY_DEPTH} levels deep"
        ));
    }
    match a {
        Array::String(v) => v.iter().try_for_each(|s| check_str(s)),
        Array::Array(v) => v.iter().try_for_each(|inner| check_array(inner, depth + 1)),
        _ => Ok(()),
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    put_u32(out, a.element_type() as u32);
    put_u64(out, a.len() as u64);
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &[T], f: fn(T) -> [u8; N]) {
        out.reserve(v.len() * N);
        for &x in v {
            out.extend_from_slice(&f(x));
        }
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each(out, v, i8::to_le_bytes),
        Array::U16(v) => each(out, v, u16::to_le_bytes),
        Array::I16(v) => each(out, v, i16::to_le_bytes),
        Array::U32(v) => each(out, v, u32::to_le_bytes),
        Array::I32(v) => each(out, v, i32::to_le_bytes),
        Array::U64(v) => each(out, v, u64::to_le_bytes),
        Array::I64(v) => each(out, v, i64::to_le_bytes),
        Array::F32(v) => each(out, v, f32::to_le_bytes),
        Array::F64(v) => each(out, v, f64::to_le_bytes),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
    }
}
