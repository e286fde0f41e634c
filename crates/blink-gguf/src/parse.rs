//! Parsing and validation of a whole GGUF file: header, metadata, tensor table and the
//! placement of every tensor's data.
//!
//! Nothing read from the file is trusted before it is checked, and no allocation is sized
//! by a count the remaining bytes could not back.

use crate::cursor::{decode_le, Cursor, What};
use crate::error::{GgufError, Quoted};
use crate::tensor::{tensor_n_bytes, TensorInfo};
use crate::types::GgmlType;
use crate::value::{Array, Value, ValueType};
use crate::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_KEY_LEN, MAX_NAME_LEN};
use crate::{MAX_DIMS, MAX_STRING_LEN};

/// Smallest metadata entry: key length, a one-byte key, value type, a one-byte value.
const MIN_KV_LEN: u64 = 8 + 1 + 4 + 1;
/// Smallest tensor-table entry: name length, one-byte name, n_dims, one dim, type, offset.
const MIN_TENSOR_LEN: u64 = 8 + 1 + 4 + 8 + 4 + 8;
/// Capacity reserved up front for lists whose elements are parsed one by one (metadata,
/// tensors, string and nested arrays); longer lists grow as they parse, so a huge claimed
/// count costs nothing until its elements are actually present.
const MAX_RESERVE: u64 = 1 << 16;

/// Everything learned from a file, fully validated against its length.
#[derive(Debug)]
pub(crate) struct Layout {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, Value)>,
    /// Indices into `metadata`, sorted by key.
    pub key_index: Vec<usize>,
    pub tensors: Vec<TensorInfo>,
    /// Indices into `tensors`, sorted by name.
    pub tensor_index: Vec<usize>,
    pub data_offset: u64,
}

/// Parses and validates `buf` as a complete GGUF file.
pub(crate) fn parse(buf: &[u8]) -> Result<Layout, GgufError> {
    let mut c = Cursor::new(buf);
    let magic = c.take(4, &|| "header magic".into())?;
    if magic != b"GGUF" {
        return Err(GgufError::BadMagic {
            found: magic.escape_ascii().to_string(),
        });
    }
    let version = c.u32(&|| "header version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let tensor_count_what = || "header tensor count".to_string();
    let kv_count_what = || "header metadata count".to_string();
    let tensor_count = c.u64(&tensor_count_what)?;
    let kv_count = c.u64(&kv_count_what)?;
    check_count(&c, tensor_count, MIN_TENSOR_LEN, 8, &tensor_count_what)?;
    check_count(&c, kv_count, MIN_KV_LEN, 16, &kv_count_what)?;

    let metadata = read_metadata(&mut c, kv_count)?;
    let key_index = sorted_index(&metadata, |(k, _)| k.as_str());
    if let Some((first, second)) = find_duplicate(&key_index, |i| metadata[i].0.as_str()) {
        return Err(GgufError::DuplicateKey {
            key: metadata[first].0.clone(),
            first,
            second,
        });
    }
    let alignment = alignment_of(&metadata, &key_index)?;

    let mut tensors = read_tensor_table(&mut c, tensor_count, alignment)?;
    let tensor_index = sorted_index(&tensors, |t| t.name.as_str());
    if let Some((first, second)) = find_duplicate(&tensor_index, |i| tensors[i].name.as_str()) {
        return Err(GgufError::DuplicateTensor {
            name: std::mem::take(&mut tensors[first].name),
            first,
            second,
        });
    }
    // The table ends inside the buffer, so rounding up cannot overflow a u64.
    let data_offset = c.pos().div_ceil(alignment) * alignment;
    check_extents(&tensors, data_offset, buf.len() as u64)?;

    Ok(Layout {
        version,
        alignment,
        metadata,
        key_index,
        tensors,
        tensor_index,
        data_offset,
    })
}

/// Fails unless `count` entries of at least `min_each` bytes fit in what is left.
/// `count_offset` is where the count field itself was read, for the message.
fn check_count(
    c: &Cursor,
    count: u64,
    min_each: u64,
    count_offset: u64,
    what: What,
) -> Result<(), GgufError> {
    let left = c.remaining();
    match count.checked_mul(min_each) {
        Some(need) if need <= left => Ok(()),
        _ => Err(GgufError::CountTooLarge {
            what: what(),
            count,
            min_each,
            offset: count_offset,
            left,
        }),
    }
}

fn read_metadata(c: &mut Cursor, kv_count: u64) -> Result<Vec<(String, Value)>, GgufError> {
    let mut metadata = Vec::with_capacity(kv_count.min(MAX_RESERVE) as usize);
    for i in 0..kv_count {
        let name_what = || format!("metadata key #{i} name");
        let key = read_name(c, MAX_KEY_LEN, &name_what)?;
        let entry = || format!("metadata key #{i} ({})", Quoted(&key));
        let type_offset = c.pos();
        let type_id = c.u32(&|| format!("{} value type", entry()))?;
        let value = read_value(c, type_id, type_offset, &|| format!("{} value", entry()))?;
        metadata.push((key, value));
    }
    Ok(metadata)
}

/// Reads a key or tensor name: a non-empty UTF-8 string of at most `limit` bytes.
fn read_name(c: &mut Cursor, limit: u64, what: What) -> Result<String, GgufError> {
    let offset = c.pos();
    let name = read_string(c, limit, what)?;
    if name.is_empty() {
        return Err(GgufError::EmptyName {
            what: what(),
            offset,
        });
    }
    Ok(name)
}

fn read_string(c: &mut Cursor, limit: u64, what: What) -> Result<String, GgufError> {
    let offset = c.pos();
    let len = c.u64(what)?;
    if len > limit {
        return Err(GgufError::StringTooLong {
            what: what(),
            offset,
            len,
            limit,
        });
    }
    let bytes = c.take(len, what)?;
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_owned()),
        Err(e) => Err(GgufError::InvalidUtf8 {
            what: what(),
            offset: offset + 8,
            position: e.valid_up_to(),
            len,
        }),
    }
}

fn value_type(id: u32, offset: u64, what: What) -> Result<ValueType, GgufError> {
    ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
        what: what(),
        offset,
        id,
    })
}

fn read_value(
    c: &mut Cursor,
    type_id: u32,
    type_offset: u64,
    what: What,
) -> Result<Value, GgufError> {
    Ok(match value_type(type_id, type_offset, what)? {
        ValueType::U8 => Value::U8(c.u8(what)?),
        ValueType::I8 => Value::I8(c.u8(what)? as i8),
        ValueType::U16 => Value::U16(c.u16(what)?),
        ValueType::I16 => Value::I16(c.u16(what)? as i16),
        ValueType::U32 => Value::U32(c.u32(what)?),
        ValueType::I32 => Value::I32(c.u32(what)? as i32),
        ValueType::U64 => Value::U64(c.u64(what)?),
        ValueType::I64 => Value::I64(c.u64(what)? as i64),
        ValueType::F32 => Value::F32(f32::from_bits(c.u32(what)?)),
        ValueType::F64 => Value::F64(f64::from_bits(c.u64(what)?)),
        ValueType::Bool => {
            let offset = c.pos();
            Value::Bool(to_bool(c.u8(what)?, offset, what)?)
        }
        ValueType::String => Value::String(read_string(c, MAX_STRING_LEN, what)?),
        ValueType::Array => Value::Array(read_array(c, 1, what)?),
    })
}

fn to_bool(byte: u8, offset: u64, what: What) -> Result<bool, GgufError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(GgufError::BadBool {
            what: what(),
            offset,
            byte,
        }),
    }
}

/// Reads an array (element type, count, elements) nested `depth` levels deep (1 = top level).
fn read_array(c: &mut Cursor, depth: usize, what: What) -> Result<Array, GgufError> {
    let start = c.pos();
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::ArrayTooDeep {
            what: what(),
            offset: start,
            limit: MAX_ARRAY_DEPTH,
        });
    }
    let type_id = c.u32(&|| format!("{} array element type", what()))?;
    let ty = value_type(type_id, start, &|| format!("{} array element type", what()))?;
    let count_offset = c.pos();
    let count = c.u64(&|| format!("{} array length", what()))?;
    let count_what = || format!("{} array length", what());
    check_count(c, count, ty.min_size(), count_offset, &count_what)?;
    // `count * min_size` was checked above, so these products cannot overflow.
    Ok(match ty {
        ValueType::U8 => Array::U8(c.take(count, what)?.to_vec()),
        ValueType::I8 => Array::I8(c.take(count, what)?.iter().map(|&b| b as i8).collect()),
        ValueType::U16 => Array::U16(decode_le(c.take(count * 2, what)?, u16::from_le_bytes)),
        ValueType::I16 => Array::I16(decode_le(c.take(count * 2, what)?, i16::from_le_bytes)),
        ValueType::U32 => Array::U32(decode_le(c.take(count * 4, what)?, u32::from_le_bytes)),
        ValueType::I32 => Array::I32(decode_le(c.take(count * 4, what)?, i32::from_le_bytes)),
        ValueType::U64 => Array::U64(decode_le(c.take(count * 8, what)?, u64::from_le_bytes)),
        ValueType::I64 => Array::I64(decode_le(c.take(count * 8, what)?, i64::from_le_bytes)),
        ValueType::F32 => Array::F32(decode_le(c.take(count * 4, what)?, f32::from_le_bytes)),
        ValueType::F64 => Array::F64(decode_le(c.take(count * 8, what)?, f64::from_le_bytes)),
        ValueType::Bool => {
            let offset = c.pos();
            let bytes = c.take(count, what)?;
            let mut out = Vec::with_capacity(bytes.len());
            for (j, &b) in bytes.iter().enumerate() {
                let at = offset + j as u64;
                out.push(to_bool(b, at, &|| format!("{} element #{j}", what()))?);
            }
            Array::Bool(out)
        }
        ValueType::String => {
            let mut out = Vec::with_capacity(count.min(MAX_RESERVE) as usize);
            for j in 0..count {
                let elem = || format!("{} element #{j}", what());
                out.push(read_string(c, MAX_STRING_LEN, &elem)?);
            }
            Array::String(out)
        }
        ValueType::Array => {
            let mut out = Vec::with_capacity(count.min(MAX_RESERVE) as usize);
            for j in 0..count {
                let elem = || format!("{} element #{j}", what());
                out.push(read_array(c, depth + 1, &elem)?);
            }
            Array::Array(out)
        }
    })
}

/// Indices `0..items.len()` sorted by `key`.
fn sorted_index<T>(items: &[T], key: impl Fn(&T) -> &str) -> Vec<usize> {
    let mut index: Vec<usize> = (0..items.len()).collect();
    index.sort_unstable_by(|&a, &b| key(&items[a]).cmp(key(&items[b])).then(a.cmp(&b)));
    index
}

/// The first pair of positions (in file order) sharing a key, given a sorted index.
fn find_duplicate<'k>(index: &[usize], key: impl Fn(usize) -> &'k str) -> Option<(usize, usize)> {
    index
        .windows(2)
        .filter(|w| key(w[0]) == key(w[1]))
        .map(|w| (w[0], w[1]))
        .min_by_key(|&(_, second)| second)
}

/// Looks a key up through a sorted index.
pub(crate) fn lookup<'v, T>(
    items: &'v [T],
    index: &[usize],
    name: &str,
    key: impl Fn(&T) -> &str,
) -> Option<&'v T> {
    index
        .binary_search_by(|&i| key(&items[i]).cmp(name))
        .ok()
        .map(|pos| &items[index[pos]])
}

fn alignment_of(metadata: &[(String, Value)], key_index: &[usize]) -> Result<u64, GgufError> {
    match lookup(metadata, key_index, ALIGNMENT_KEY, |(k, _)| k) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, Value::U32(a))) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some((_, Value::U32(a))) => Err(GgufError::BadAlignment {
            problem: format!("must be a nonzero power of two, found {a}"),
        }),
        Some((_, v)) => Err(GgufError::BadAlignment {
            problem: format!("must be of type u32, found {} {v}", v.type_name()),
        }),
    }
}

fn read_tensor_table(
    c: &mut Cursor,
    tensor_count: u64,
    alignment: u64,
) -> Result<Vec<TensorInfo>, GgufError> {
    let mut tensors = Vec::with_capacity(tensor_count.min(MAX_RESERVE) as usize);
    for i in 0..tensor_count {
        let name = read_name(c, MAX_NAME_LEN, &|| format!("tensor #{i} name"))?;
        let entry = || format!("tensor #{i} ({})", Quoted(&name));
        let n_dims = c.u32(&|| format!("{} dimension count", entry()))?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(GgufError::BadTensor {
                name,
                problem: format!("has {n_dims} dimensions, must have 1 to {MAX_DIMS}"),
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(&|| format!("{} dims[{d}]", entry()))?);
        }
        let type_id = c.u32(&|| format!("{} type", entry()))?;
        let offset = c.u64(&|| format!("{} data offset", entry()))?;
        let Some(ty) = GgmlType::from_id(type_id) else {
            return Err(GgufError::UnsupportedTensorType { name, id: type_id });
        };
        let n_bytes = match tensor_n_bytes(ty, &dims) {
            Ok(n) => n,
            Err(problem) => return Err(GgufError::BadTensor { name, problem }),
        };
        if offset % alignment != 0 {
            return Err(GgufError::BadTensor {
                name,
                problem: format!(
                    "data offset {offset} is not a multiple of the alignment {alignment}"
                ),
            });
        }
        tensors.push(TensorInfo {
            name,
            ty,
            dims,
            offset,
            n_bytes,
        });
    }
    Ok(tensors)
}

/// Every tensor's bytes must lie inside the file and no two tensors may share a byte.
fn check_extents(tensors: &[TensorInfo], data_offset: u64, file_len: u64) -> Result<(), GgufError> {
    for t in tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|start| start.checked_add(t.n_bytes));
        if end.is_none_or(|end| end > file_len) {
            return Err(GgufError::BadTensor {
                name: t.name.clone(),
                problem: format!(
                    "data at offset {} + {} ({} bytes) extends past the end of the file ({file_len} bytes)",
                    data_offset, t.offset, t.n_bytes
                ),
            });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_unstable_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // Both extents end inside the file, so these sums cannot overflow.
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::TensorOverlap {
                first: a.name.clone(),
                first_start: a.offset,
                first_end: a.offset + a.n_bytes,
                second: b.name.clone(),
                second_start: b.offset,
                second_end: b.offset + b.n_bytes,
            });
        }
    }
    Ok(())
}
