//! The checkpoint's bytes: a safetensors file written here by hand (so the tensors stream to
//! the file without a second copy in memory) and read back with the `safetensors` crate.
//!
//! Tensors, all F32, in this order in the file: for each layer and target (in
//! [`LoraTarget::ALL`] order) with a pair, `blk.{l}.{gguf name}.lora_a` `[rank, cols]` and
//! `.lora_b` `[rows, rank]`; then `adam_m.{i}` and `adam_v.{i}` `[len]` for each moment pair.
//! `__metadata__` strings: `blink.checkpoint.version`, the decimal scalars (`step`, `epoch`,
//! `batch`, `trained_tokens`, `adam_steps`, `moments`, `layers`), `fingerprint`,
//! `lora.format` (`peft`/`gguf`), `lora.alpha` (hex of the f32 bits), `lora.rslora`,
//! `curve` (a JSON array; f64 values as hex of their bits) and `checksum`.
//!
//! The checksum covers every other metadata entry (key, value; by key) and then every
//! tensor (name, dtype, shape, data bytes; by name), each field length-prefixed. Version 2
//! takes FNV-1a 64's step a 64-bit little-endian word at a time (a field's last word
//! padded with zeros; its length is hashed before it), eight times fewer steps than
//! version 1's byte at a time: the 29 MB checkpoint of a rank-8 adapter on every projection
//! of SmolLM2 hashed in about 35 ms of a core, which a co-serving engine's step felt as a
//! tripled pass. Version 1's files still load. Either way one changed byte always changes
//! the checksum: each step `(h ^ x) · p` is a bijection of the state and of the input.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::path::Path;

use blink_model::lora::{LoraFormat, LoraPair, LoraTarget, LoraTensors};
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use serde_json::{json, Map, Value};

use super::{CheckpointError, CurvePoint, TrainState, FORMAT_VERSION};

const VERSION_KEY: &str = "blink.checkpoint.version";
const CHECKSUM_KEY: &str = "checksum";
/// The largest header the safetensors reader accepts.
const MAX_HEADER: usize = 100_000_000;
/// Floats per write.
const CHUNK: usize = 1 << 16;
/// More layers than any model has: a bound on the loop over them.
const MAX_LAYERS: usize = 1 << 16;

/// The checksum: FNV-1a 64's step over bytes (format 1) or over 64-bit words (format 2).
struct Checksum {
    state: u64,
    words: bool,
}

const FNV_PRIME: u64 = 0x0100_0000_01b3;

impl Checksum {
    /// The checksum of files of format `version` (1 or 2).
    fn new(version: u32) -> Checksum {
        Checksum { state: 0xcbf2_9ce4_8422_2325, words: version >= 2 }
    }

    fn step(&mut self, x: u64) {
        self.state = (self.state ^ x).wrapping_mul(FNV_PRIME);
    }

    fn bytes(&mut self, bytes: &[u8]) {
        if !self.words {
            bytes.iter().for_each(|&b| self.step(u64::from(b)));
            return;
        }
        let words = bytes.chunks_exact(8);
        let tail = words.remainder();
        words.for_each(|w| self.step(u64::from_le_bytes(w.try_into().expect("eight bytes"))));
        if !tail.is_empty() {
            let mut last = [0u8; 8];
            last[..tail.len()].copy_from_slice(tail);
            self.step(u64::from_le_bytes(last));
        }
    }

    fn u64(&mut self, v: u64) {
        if self.words {
            self.step(v);
        } else {
            self.bytes(&v.to_le_bytes());
        }
    }

    fn field(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        self.bytes(bytes);
    }

    /// A tensor's name, dtype and shape (its data follows, length-prefixed by the caller).
    fn tensor_head(&mut self, name: &str, dtype: Dtype, shape: &[usize]) {
        self.field(name.as_bytes());
        self.field(format!("{dtype:?}").as_bytes());
        self.u64(shape.len() as u64);
        shape.iter().for_each(|&d| self.u64(d as u64));
    }
}

/// Hashes the metadata (all but the checksum itself).
fn hash_metadata(h: &mut Checksum, meta: &BTreeMap<String, String>) {
    for (k, v) in meta.iter().filter(|(k, _)| *k != CHECKSUM_KEY) {
        h.field(k.as_bytes());
        h.field(v.as_bytes());
    }
}

/// One f32 tensor to write.
struct Tensor<'a> {
    name: String,
    shape: Vec<usize>,
    values: &'a [f32],
}

/// A checkpoint ready to be written: its header (length, JSON, padding) and its tensors.
pub(super) struct Encoded<'a> {
    header: Vec<u8>,
    tensors: Vec<Tensor<'a>>,
}

impl Encoded<'_> {
    /// Writes the whole file to `w`.
    pub(super) fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.header)?;
        for chunk in self.tensors.iter().flat_map(|t| t.values.chunks(CHUNK)) {
            w.write_all(&le_bytes(chunk))?;
        }
        Ok(())
    }
}

/// The little-endian bytes of `values`: their memory as it is on a little-endian target
/// (no copy), a converted copy elsewhere.
fn le_bytes(values: &[f32]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: an f32 is four bytes with no padding, and u8 has no alignment: the
        // values' memory read as bytes, which on this target are their little-endian bytes.
        Cow::Borrowed(unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) })
    } else {
        Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

fn pair_names(layer: usize, target: LoraTarget) -> [String; 2] {
    let base = format!("blk.{layer}.{}", target.gguf_name());
    [format!("{base}.lora_a"), format!("{base}.lora_b")]
}

fn moment_names(i: usize) -> [String; 2] {
    [format!("adam_m.{i}"), format!("adam_v.{i}")]
}

fn bits64(v: f64) -> Value {
    Value::String(format!("{:016x}", v.to_bits()))
}

fn format_name(format: LoraFormat) -> &'static str {
    match format {
        LoraFormat::Peft => "peft",
        LoraFormat::Gguf => "gguf",
    }
}

/// Lays `state` out as the checkpoint file at `path` (named in errors).
pub(super) fn encode<'a>(path: &Path, state: &'a TrainState) -> Result<Encoded<'a>, CheckpointError> {
    let invalid = |reason: String| CheckpointError::InvalidState { path: path.to_path_buf(), reason };
    let mut tensors = Vec::new();
    for (l, layer) in state.params.layers.iter().enumerate() {
        for (target, pair) in LoraTarget::ALL.into_iter().zip(layer) {
            let Some(p) = pair else { continue };
            if p.a.len() != p.rank * p.cols || p.b.len() != p.rows * p.rank {
                return Err(invalid(format!("the {} pair of layer {l} has {} and {} values for rank {}, {}×{}", target.gguf_name(), p.a.len(), p.b.len(), p.rank, p.rows, p.cols)));
            }
            let [a, b] = pair_names(l, target);
            tensors.push(Tensor { name: a, shape: vec![p.rank, p.cols], values: &p.a });
            tensors.push(Tensor { name: b, shape: vec![p.rows, p.rank], values: &p.b });
        }
    }
    if state.adam_m.len() != state.adam_v.len() {
        return Err(invalid(format!("{} first moments but {} second moments", state.adam_m.len(), state.adam_v.len())));
    }
    for (i, (m, v)) in state.adam_m.iter().zip(&state.adam_v).enumerate() {
        if m.len() != v.len() {
            return Err(invalid(format!("moments {i} have {} and {} values", m.len(), v.len())));
        }
        let [mn, vn] = moment_names(i);
        tensors.push(Tensor { name: mn, shape: vec![m.len()], values: m });
        tensors.push(Tensor { name: vn, shape: vec![v.len()], values: v });
    }

    let curve: Vec<Value> = state
        .curve
        .iter()
        .map(|c| {
            json!({"step": c.step, "epoch": c.epoch, "train_loss": bits64(c.train_loss), "lr": bits64(c.lr), "tokens": c.tokens,
                   "eval_loss": c.eval_loss.map(bits64), "eval_accuracy": c.eval_accuracy.map(bits64)})
        })
        .collect();
    let p = &state.params;
    let mut meta: BTreeMap<String, String> = [
        (VERSION_KEY, FORMAT_VERSION.to_string()),
        ("fingerprint", state.fingerprint.clone()),
        ("step", state.step.to_string()),
        ("epoch", state.epoch.to_string()),
        ("batch", state.batch.to_string()),
        ("trained_tokens", state.trained_tokens.to_string()),
        ("adam_steps", state.adam_steps.to_string()),
        ("moments", state.adam_m.len().to_string()),
        ("layers", p.layers.len().to_string()),
        ("lora.format", format_name(p.format).to_string()),
        ("lora.alpha", format!("{:08x}", p.alpha.to_bits())),
        ("lora.rslora", p.rslora.to_string()),
        ("curve", Value::Array(curve).to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();

    let mut h = Checksum::new(FORMAT_VERSION);
    hash_metadata(&mut h, &meta);
    let mut by_name: Vec<&Tensor> = tensors.iter().collect();
    by_name.sort_by(|a, b| a.name.cmp(&b.name));
    for t in by_name {
        h.tensor_head(&t.name, Dtype::F32, &t.shape);
        h.field(&le_bytes(t.values));
    }
    meta.insert(CHECKSUM_KEY.to_string(), format!("{:016x}", h.state));

    let mut header = Map::new();
    header.insert("__metadata__".to_string(), json!(meta));
    let mut offset = 0usize;
    for t in &tensors {
        let end = offset + t.values.len() * 4;
        header.insert(t.name.clone(), json!({"dtype": "F32", "shape": t.shape, "data_offsets": [offset, end]}));
        offset = end;
    }
    let mut json = Value::Object(header).to_string().into_bytes();
    json.resize(json.len().next_multiple_of(8), b' ');
    if json.len() > MAX_HEADER {
        return Err(invalid(format!("its header (mostly the loss curve, {} points) is {} bytes, over safetensors' limit of {MAX_HEADER}", state.curve.len(), json.len())));
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    Ok(Encoded { header: bytes, tensors })
}

/// Why safetensors could not read the file, in words.
fn describe(e: &SafeTensorError, len: usize) -> String {
    match e {
        SafeTensorError::HeaderTooSmall | SafeTensorError::InvalidHeaderLength | SafeTensorError::MetadataIncompleteBuffer => {
            format!("the file is truncated or incomplete: its {len} bytes do not hold what its header describes ({e})")
        }
        _ => format!("not a valid safetensors file ({e})"),
    }
}

/// Reads a checkpoint file's `bytes` (from `path`, named in errors).
pub(super) fn decode(path: &Path, bytes: &[u8]) -> Result<TrainState, CheckpointError> {
    let malformed = |reason: String| CheckpointError::Malformed { path: path.to_path_buf(), reason };
    let (n, metadata): (usize, Metadata) = SafeTensors::read_metadata(bytes).map_err(|e| malformed(describe(&e, bytes.len())))?;
    let data = bytes.get(8 + n..).unwrap_or_default();
    let meta: BTreeMap<String, String> = metadata.metadata().clone().unwrap_or_default().into_iter().collect();
    let Some(version) = meta.get(VERSION_KEY) else {
        return Err(malformed(format!("it has no `{VERSION_KEY}` metadata: not a checkpoint written by Blink")));
    };
    let Some(version) = version.parse::<u32>().ok().filter(|v| (1..=FORMAT_VERSION).contains(v)) else {
        return Err(CheckpointError::Version { path: path.to_path_buf(), found: version.clone() });
    };
    let recorded = meta.get(CHECKSUM_KEY).and_then(|s| parse_hex(s, 16)).ok_or_else(|| malformed("no valid `checksum` metadata".into()))?;

    let mut infos: HashMap<String, &TensorInfo> = metadata.tensors();
    let mut names: Vec<&String> = infos.keys().collect();
    names.sort();
    let mut h = Checksum::new(version);
    hash_metadata(&mut h, &meta);
    for name in names {
        let info = infos[name];
        let tensor = data.get(info.data_offsets.0..info.data_offsets.1).ok_or_else(|| malformed(format!("tensor {name} lies outside the file")))?;
        h.tensor_head(name, info.dtype, &info.shape);
        h.field(tensor);
    }
    if h.state != recorded {
        return Err(CheckpointError::Checksum { path: path.to_path_buf(), recorded, computed: h.state });
    }

    // The bytes are the ones written; what follows only fails on a writer's bug.
    let get = |key: &str| meta.get(key).ok_or_else(|| malformed(format!("no `{key}` metadata")));
    let num = |key: &str| get(key)?.parse::<u64>().map_err(|_| malformed(format!("`{key}` is not a number")));
    let take = |infos: &mut HashMap<String, &TensorInfo>, name: &str, shape: &[usize]| take_f32(infos, data, name, shape).map_err(&malformed);
    let n_layers = num("layers")? as usize;
    if n_layers > MAX_LAYERS {
        return Err(malformed(format!("{n_layers} layers")));
    }
    let mut layers = Vec::with_capacity(n_layers.min(infos.len()));
    for l in 0..n_layers {
        let mut layer: [Option<LoraPair>; 7] = Default::default();
        for target in LoraTarget::ALL {
            let [an, bn] = pair_names(l, target);
            let (Some(ai), Some(bi)) = (infos.get(&an), infos.get(&bn)) else { continue };
            let (&[rank, cols], &[rows, rank_b]) = (ai.shape.as_slice(), bi.shape.as_slice()) else {
                return Err(malformed(format!("the {} pair of layer {l} is not two matrices", target.gguf_name())));
            };
            if rank_b != rank {
                return Err(malformed(format!("the {} pair of layer {l} has ranks {rank} and {rank_b}", target.gguf_name())));
            }
            let (a, b) = (take(&mut infos, &an, &[rank, cols])?, take(&mut infos, &bn, &[rows, rank])?);
            layer[target.index()] = Some(LoraPair { rank, rows, cols, a, b });
        }
        layers.push(layer);
    }
    let mut adam_m = Vec::new();
    let mut adam_v = Vec::new();
    for i in 0..num("moments")? as usize {
        let [mn, vn] = moment_names(i);
        let len = infos.get(&mn).map_or(0, |t| t.shape.first().copied().unwrap_or(0));
        adam_m.push(take(&mut infos, &mn, &[len])?);
        adam_v.push(take(&mut infos, &vn, &[len])?);
    }
    if let Some(extra) = infos.keys().min() {
        return Err(malformed(format!("unexpected tensor {extra}")));
    }

    let format = match get("lora.format")?.as_str() {
        "peft" => LoraFormat::Peft,
        "gguf" => LoraFormat::Gguf,
        other => return Err(malformed(format!("unknown adapter format `{other}`"))),
    };
    let alpha = parse_hex(get("lora.alpha")?, 8).ok_or_else(|| malformed("`lora.alpha` is not 8 hex digits".into()))?;
    let rslora = get("lora.rslora")?.parse::<bool>().map_err(|_| malformed("`lora.rslora` is not true or false".into()))?;
    let params = LoraTensors { format, alpha: f32::from_bits(alpha as u32), rslora, layers };
    let curve = parse_curve(get("curve")?).map_err(|reason| malformed(format!("the loss curve: {reason}")))?;
    Ok(TrainState {
        params,
        adam_steps: num("adam_steps")?,
        adam_m,
        adam_v,
        step: num("step")?,
        epoch: num("epoch")?,
        batch: num("batch")?,
        trained_tokens: num("trained_tokens")?,
        curve,
        fingerprint: get("fingerprint")?.clone(),
    })
}

/// Removes tensor `name` from `infos` and reads it as f32 of `shape`.
fn take_f32(infos: &mut HashMap<String, &TensorInfo>, data: &[u8], name: &str, shape: &[usize]) -> Result<Vec<f32>, String> {
    let info = infos.remove(name).ok_or_else(|| format!("tensor {name} is missing"))?;
    if info.dtype != Dtype::F32 || info.shape != shape {
        return Err(format!("tensor {name} is {:?} {:?}, not F32 {shape:?}", info.dtype, info.shape));
    }
    let raw = data.get(info.data_offsets.0..info.data_offsets.1).ok_or_else(|| format!("tensor {name} lies outside the file"))?;
    Ok(raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// `s` as exactly `digits` lower-case hex digits.
fn parse_hex(s: &str, digits: usize) -> Option<u64> {
    let hex = s.len() == digits && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if hex {
        u64::from_str_radix(s, 16).ok()
    } else {
        None
    }
}

fn parse_curve(text: &str) -> Result<Vec<CurvePoint>, String> {
    let rows: Vec<Value> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let num = |row: &Value, key: &str| row[key].as_u64().ok_or_else(|| format!("`{key}` is not a number"));
    let float = |row: &Value, key: &str| -> Result<Option<f64>, String> {
        match &row[key] {
            Value::Null => Ok(None),
            Value::String(s) => parse_hex(s, 16).map(|b| Some(f64::from_bits(b))).ok_or_else(|| format!("`{key}` is not 16 hex digits")),
            _ => Err(format!("`{key}` is not 16 hex digits")),
        }
    };
    let required = |row: &Value, key: &str| float(row, key)?.ok_or_else(|| format!("`{key}` is missing"));
    rows.iter()
        .map(|r| {
            Ok(CurvePoint {
                step: num(r, "step")?,
                epoch: num(r, "epoch")?,
                train_loss: required(r, "train_loss")?,
                lr: required(r, "lr")?,
                tokens: num(r, "tokens")?,
                eval_loss: float(r, "eval_loss")?,
                eval_accuracy: float(r, "eval_accuracy")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{le_bytes, Checksum};

    #[test]
    fn floats_are_written_as_their_little_endian_bytes() {
        let values = [1.5f32, -0.0, f32::NAN, 3.0e-39];
        let want: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(&*le_bytes(&values), &want[..]);
    }

    /// Format 2 pads a field's last word with zeros (its length was hashed before it), and
    /// the two versions differ (a file's version picks its checksum).
    #[test]
    fn words_are_padded_and_versions_differ() {
        let (mut a, mut b) = (Checksum::new(2), Checksum::new(2));
        a.bytes(b"blink");
        b.bytes(b"blink\0\0\0");
        assert_eq!(a.state, b.state);
        let mut v1 = Checksum::new(1);
        v1.bytes(b"blink");
        assert_ne!(a.state, v1.state);
    }
}
