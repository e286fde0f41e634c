//! Writing llama.cpp's LoRA GGUF, as its `convert_lora_to_gguf.py` lays it out: the base
//! model's architecture, `general.type = adapter`, `adapter.type = lora`,
//! `adapter.lora.alpha`, and per pair the f32 tensors `blk.N.<tensor>.weight.lora_a`
//! (ggml dimensions `[in, r]`) and `…lora_b` (`[r, out]`). `B` is already in the base
//! GGUF's row order, as llama.cpp wants it.

use std::path::Path;

use blink_gguf::{GgmlType, GgufWriter, Value};

use super::super::{LoraError, LoraTensors};
use super::check::format_error;
use super::write::{checked_adapter, f32_bytes, replace_file};
use crate::config::ModelConfig;

/// Write `tensors` as a llama.cpp LoRA GGUF at `path`, replacing it atomically (its
/// directory must exist). `name` is recorded as `general.name`. The adapter must fit
/// `cfg`'s model and hold only finite values.
///
/// llama.cpp scales a pair of rank r by `adapter.lora.alpha / r`; for an rsLoRA adapter
/// (`alpha / √r`) the alpha written is `alpha · √r`, so its pairs must share one rank.
pub fn write_gguf(path: &Path, tensors: &LoraTensors, cfg: &ModelConfig, name: Option<&str>) -> Result<(), LoraError> {
    let pairs = checked_adapter(path, tensors, cfg)?;
    let alpha = if tensors.rslora {
        let rank = pairs[0].2.rank;
        if pairs.iter().any(|(_, _, p)| p.rank != rank) {
            return Err(LoraError::Unsupported("an rsLoRA adapter with pairs of different ranks: llama.cpp's GGUF has one alpha for all".into()));
        }
        (f64::from(tensors.alpha) * (rank as f64).sqrt()) as f32
    } else {
        tensors.alpha
    };

    let gguf = |e: blink_gguf::GgufError| format_error(path, e.to_string());
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String(cfg.arch.name().into())).map_err(gguf)?;
    w.add("general.type", Value::String("adapter".into())).map_err(gguf)?;
    w.add("adapter.type", Value::String("lora".into())).map_err(gguf)?;
    if let Some(name) = name {
        w.add("general.name", Value::String(name.into())).map_err(gguf)?;
    }
    w.add("adapter.lora.alpha", Value::F32(alpha)).map_err(gguf)?;
    // gguf-py writes it in every file; f32 tensors do not depend on it.
    w.add("general.quantization_version", Value::U32(2)).map_err(gguf)?;
    for (layer, target, pair) in pairs {
        let base = format!("blk.{layer}.{}.weight", target.gguf_name());
        w.add_tensor_owned(format!("{base}.lora_a"), GgmlType::F32, &[pair.cols as u64, pair.rank as u64], f32_bytes(&pair.a)).map_err(gguf)?;
        w.add_tensor_owned(format!("{base}.lora_b"), GgmlType::F32, &[pair.rank as u64, pair.rows as u64], f32_bytes(&pair.b)).map_err(gguf)?;
    }
    replace_file(path, |out| w.write_to(out))
}
