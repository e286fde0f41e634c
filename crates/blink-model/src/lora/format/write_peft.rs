//! Writing PEFT adapters: `adapter_config.json` with the settings PEFT needs to load it, and
//! `adapter_model.safetensors` with the pairs in PEFT's saved names, f32, `B` of Q and K put
//! back into Hugging Face's row order (the inverse of what reading does).
//!
//! The tensors alone can also be written ([`write_peft_tensors`]): gradients of an adapter,
//! held as a [`LoraTensors`], dumped under the names and in the layout of the adapter.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::Path;

use safetensors::{Dtype, View};
use serde_json::{json, Number, Value};

use super::super::{LoraError, LoraTarget, LoraTensors};
use super::check::{format_error, permute_rows, qk_heads, RowOrder, Side};
use super::peft::{CONFIG_FILE, MODEL_FILE};
use super::write::{checked_adapter, checked_pairs, f32_bytes, replace_file};
use crate::config::ModelConfig;

/// What `adapter_config.json` records that the tensors do not say. The rank, `lora_alpha`,
/// `use_rslora` and `target_modules` come from the [`LoraTensors`] written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeftMeta {
    /// The base model's Hugging Face id or local path, for PEFT's `from_pretrained` to
    /// load it by (`None`: written as null, and the base model must be given to PEFT).
    pub base_model_name_or_path: Option<String>,
    /// The dropout on the adapter's input during training (recorded; inference has none).
    pub lora_dropout: f32,
}

/// One f32 matrix as a PEFT file stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct PeftTensor<'a> {
    /// `base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight`.
    pub name: String,
    /// `[rows, cols]`, row-major: `[r, in]` for `lora_A`, `[out, r]` for `lora_B`.
    pub shape: [usize; 2],
    pub values: Cow<'a, [f32]>,
}

impl View for &PeftTensor<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(f32_bytes(&self.values))
    }

    fn data_len(&self) -> usize {
        self.values.len() * 4
    }
}

/// PEFT's saved name of the `side` matrix of `target` in `layer`.
fn peft_tensor_name(layer: usize, target: LoraTarget, side: Side) -> String {
    let side = match side {
        Side::A => "A",
        Side::B => "B",
    };
    format!("base_model.model.model.layers.{layer}.{}.{}.lora_{side}.weight", target.peft_block(), target.peft_name())
}

/// Every pair of `tensors` (checked against `cfg`'s model) as PEFT stores it: `lora_A` and
/// `lora_B` of each (layer, target), in that order, `B` of Q and K in Hugging Face's row
/// order. Values are not checked, so gradients that overflowed are written as they are.
pub fn peft_tensors<'t>(tensors: &'t LoraTensors, cfg: &ModelConfig) -> Result<Vec<PeftTensor<'t>>, LoraError> {
    let pairs = checked_pairs(tensors, cfg)?;
    let mut out = Vec::with_capacity(pairs.len() * 2);
    for (layer, target, pair) in pairs {
        let b = match qk_heads(cfg, target) {
            None => Cow::Borrowed(&pair.b[..]),
            Some(n) => Cow::Owned(permute_rows(&pair.b, pair.rows, pair.rank, n, RowOrder::HuggingFace).ok_or_else(|| {
                LoraError::Unsupported(format!("layer {layer} {}: {} rows do not split into {n} heads of rotary pairs", target.peft_name(), pair.rows))
            })?),
        };
        out.push(PeftTensor { name: peft_tensor_name(layer, target, Side::A), shape: [pair.rank, pair.cols], values: Cow::Borrowed(&pair.a) });
        out.push(PeftTensor { name: peft_tensor_name(layer, target, Side::B), shape: [pair.rows, pair.rank], values: b });
    }
    Ok(out)
}

/// Write the tensors of `tensors` as a PEFT `adapter_model.safetensors` at `path` (any
/// name), atomically: the file an adapter of these tensors would have, with no checks on
/// the values (a dump of gradients, say). Its directory must exist.
pub fn write_peft_tensors(path: &Path, tensors: &LoraTensors, cfg: &ModelConfig) -> Result<(), LoraError> {
    write_safetensors(path, &peft_tensors(tensors, cfg)?)
}

/// Write `tensors` as a PEFT adapter in the existing directory `dir`: its
/// `adapter_model.safetensors` and then its `adapter_config.json`, each replaced
/// atomically. The adapter must fit `cfg`'s model, have one rank for all its pairs (PEFT's
/// `r`), and hold only finite values.
pub fn write_peft(dir: &Path, tensors: &LoraTensors, cfg: &ModelConfig, meta: &PeftMeta) -> Result<(), LoraError> {
    let model_path = dir.join(MODEL_FILE);
    let config_path = dir.join(CONFIG_FILE);
    let pairs = checked_adapter(&model_path, tensors, cfg)?;
    let mut ranks: Vec<usize> = pairs.iter().map(|(_, _, p)| p.rank).collect::<BTreeSet<_>>().into_iter().collect();
    if ranks.len() > 1 {
        return Err(LoraError::Unsupported(format!("pairs of ranks {ranks:?}: a PEFT adapter is written with one rank 'r'")));
    }
    let r = ranks.pop().unwrap_or(0);
    if !(meta.lora_dropout.is_finite() && (0.0..1.0).contains(&meta.lora_dropout)) {
        return Err(format_error(&config_path, format!("lora_dropout = {} is not in [0, 1)", meta.lora_dropout)));
    }
    let layers: BTreeSet<usize> = pairs.iter().map(|&(layer, _, _)| layer).collect();
    let layers_to_transform = if layers.len() == cfg.n_layers { Value::Null } else { json!(layers) };
    let target_modules: Vec<&str> = tensors.targets().into_iter().map(LoraTarget::peft_name).collect();

    // The keys in the order PEFT's `save_pretrained` writes them (sorted).
    let config = json!({
        "alpha_pattern": {},
        "base_model_name_or_path": meta.base_model_name_or_path,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "layers_to_transform": layers_to_transform,
        "lora_alpha": json_number(tensors.alpha),
        "lora_bias": false,
        "lora_dropout": json_float(meta.lora_dropout),
        "modules_to_save": null,
        "peft_type": "LORA",
        "r": r,
        "rank_pattern": {},
        "target_modules": target_modules,
        "task_type": "CAUSAL_LM",
        "use_dora": false,
        "use_rslora": tensors.rslora,
    });
    let mut text = serde_json::to_vec_pretty(&config).map_err(|e| format_error(&config_path, e.to_string()))?;
    text.push(b'\n');

    write_safetensors(&model_path, &peft_tensors(tensors, cfg)?)?;
    replace_file(&config_path, |w| w.write_all(&text))
}

/// `v` as a JSON number: an integer when it is one (as PEFT writes `lora_alpha = 16`), else
/// as [`json_float`].
fn json_number(v: f32) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        return json!(v as i64);
    }
    json_float(v)
}

/// `v` as the shortest decimal that reads back as the same f32 (`0.1`, not
/// `0.10000000149011612`).
fn json_float(v: f32) -> Value {
    let shortest: f64 = v.to_string().parse().unwrap_or(f64::from(v));
    Number::from_f64(shortest).map_or(Value::Null, Value::Number)
}

/// Write `tensors` as a safetensors file at `path`, atomically, with PEFT's metadata.
fn write_safetensors(path: &Path, tensors: &[PeftTensor<'_>]) -> Result<(), LoraError> {
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors::serialize(tensors.iter().map(|t| (t.name.as_str(), t)), Some(metadata)).map_err(|e| format_error(path, format!("cannot serialize the tensors: {e}")))?;
    replace_file(path, |w| w.write_all(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_peft_saved_names() {
        assert_eq!(peft_tensor_name(3, LoraTarget::Q, Side::A), "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight");
        assert_eq!(peft_tensor_name(29, LoraTarget::Down, Side::B), "base_model.model.model.layers.29.mlp.down_proj.lora_B.weight");
    }

    #[test]
    fn numbers_read_back_as_the_same_f32() {
        assert_eq!(json_number(16.0).to_string(), "16");
        assert_eq!(json_number(0.1).to_string(), "0.1");
        assert_eq!(json_float(0.0).to_string(), "0.0");
        assert_eq!(json_float(0.05).to_string(), "0.05");
        for v in [0.05f32, 1.0 / 3.0, 12.5, 1e-7, 3.0e38] {
            assert_eq!(json_number(v).as_f64().unwrap() as f32, v);
            assert_eq!(json_float(v).as_f64().unwrap() as f32, v);
        }
    }
}
