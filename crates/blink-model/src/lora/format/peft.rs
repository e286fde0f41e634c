//! PEFT adapters: `adapter_config.json` (rank, alpha and the features Blink refuses) and
//! `adapter_model.safetensors` (the pairs, in Hugging Face's names and row order).

use std::path::Path;

use safetensors::{Dtype, SafeTensors};
use serde_json::{Map, Value};

use super::super::{LoraError, LoraFormat, LoraTarget, LoraTensors};
use super::check::{format_error, layer_index, Elem, Found, Layout, Pairs, Rank, Side};
use crate::config::ModelConfig;

/// The configuration's file name in a PEFT directory.
pub(super) const CONFIG_FILE: &str = "adapter_config.json";
/// The tensors' file name in a PEFT directory.
pub(super) const MODEL_FILE: &str = "adapter_model.safetensors";

/// What `adapter_config.json` says that reading needs.
#[derive(Debug)]
struct Config {
    r: usize,
    alpha: f32,
    rslora: bool,
}

/// Read the PEFT adapter of `config_path` and `model_path` and check it against `cfg`.
pub(super) fn read(config_path: &Path, model_path: &Path, cfg: &ModelConfig) -> Result<LoraTensors, LoraError> {
    let config = parse_config(config_path, &super::read_regular(config_path)?)?;
    let bytes = match super::read_regular(model_path) {
        Ok(bytes) => bytes,
        Err(e) => {
            let pickled = model_path.with_file_name("adapter_model.bin");
            if pickled.is_file() {
                return Err(LoraError::Unsupported(format!("{}: pickled PyTorch weights; save the adapter as safetensors", pickled.display())));
            }
            return Err(e);
        }
    };
    let st = SafeTensors::deserialize(&bytes).map_err(|e| format_error(model_path, format!("not a valid safetensors file: {e}")))?;
    let mut names = st.names();
    names.sort_unstable();
    let mut pairs = Pairs::new(Layout::Peft);
    for name in names {
        let (layer, target, side) = parse_name(name, cfg)?;
        let view = st.tensor(name).map_err(|e| format_error(model_path, format!("tensor '{name}': {e}")))?;
        let elem = match view.dtype() {
            Dtype::F32 => Elem::F32,
            Dtype::F16 => Elem::F16,
            Dtype::BF16 => Elem::BF16,
            other => return Err(LoraError::Unsupported(format!("tensor '{name}' is {other:?}; adapters are read in F32, F16 or BF16"))),
        };
        pairs.insert(model_path, layer, target, side, Found { name: name.to_string(), shape: view.shape().to_vec(), elem, data: view.data() })?;
    }
    let layers = pairs.build(model_path, cfg, Rank::Config(config.r))?;
    Ok(LoraTensors { format: LoraFormat::Peft, alpha: config.alpha, rslora: config.rslora, layers })
}

/// The (layer, target, side) a PEFT tensor name gives:
/// `base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}[.default].weight`.
fn parse_name(name: &str, cfg: &ModelConfig) -> Result<(usize, LoraTarget, Side), LoraError> {
    let unknown = || LoraError::Unsupported(format!("tensor '{name}' is not a LoRA matrix of a block's attention or MLP projection"));
    let rest = name.strip_prefix("base_model.model.").ok_or_else(unknown)?;
    let rest = rest.strip_prefix("model.").unwrap_or(rest);
    let segments: Vec<&str> = rest.split('.').collect();
    let Some(at) = segments.iter().position(|s| s.starts_with("lora_")) else {
        return Err(unknown());
    };
    let side = match segments[at] {
        "lora_A" => Side::A,
        "lora_B" => Side::B,
        // lora_embedding_A/B (an embedding's adapter), lora_magnitude_vector (DoRA), …
        _ if at > 0 => return Err(unknown_module(segments[at - 1], name)),
        _ => return Err(unknown()),
    };
    if !matches!(&segments[at + 1..], ["weight"] | ["default", "weight"]) {
        return Err(unknown());
    }
    let module = match at.checked_sub(1) {
        Some(m) => segments[m],
        None => return Err(unknown()),
    };
    let Some(target) = LoraTarget::ALL.into_iter().find(|t| t.peft_name() == module) else {
        return Err(unknown_module(module, name));
    };
    let ["layers", digits, p, _] = segments[..at] else {
        return Err(unknown());
    };
    if p != target.peft_block() {
        return Err(unknown());
    }
    let layer = layer_index(digits, cfg)?.ok_or_else(unknown)?;
    Ok((layer, target, side))
}

fn unknown_module(module: &str, tensor: &str) -> LoraError {
    LoraError::Unsupported(format!("target module '{module}' (tensor '{tensor}'): Blink's adapters change only q/k/v/o_proj and gate/up/down_proj"))
}

fn parse_config(path: &Path, bytes: &[u8]) -> Result<Config, LoraError> {
    let bad = |reason: String| format_error(path, reason);
    let value: Value = serde_json::from_slice(bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(bad("not a JSON object".into()));
    };
    let unsupported = |what: String| LoraError::Unsupported(format!("{}: {what}", path.display()));

    match present(&obj, "peft_type") {
        None => {}
        Some(Value::String(t)) if t == "LORA" => {}
        Some(other) => return Err(unsupported(format!("peft_type {other} (Blink reads LORA adapters)"))),
    }
    let r = match present(&obj, "r") {
        None => return Err(bad("has no rank 'r'".into())),
        Some(v) => v.as_u64().filter(|&r| r > 0).and_then(|r| usize::try_from(r).ok()).ok_or_else(|| bad(format!("r = {v} is not a positive integer")))?,
    };
    let alpha = match present(&obj, "lora_alpha") {
        None => return Err(bad("has no 'lora_alpha'".into())),
        Some(v) => v.as_f64().map(|a| a as f32).filter(|a| a.is_finite() && *a > 0.0).ok_or_else(|| bad(format!("lora_alpha = {v} is not a finite positive number")))?,
    };
    let rslora = flag(path, &obj, "use_rslora")?;
    if flag(path, &obj, "fan_in_fan_out")? {
        return Err(unsupported("fan_in_fan_out = true (tensors stored transposed)".into()));
    }
    if flag(path, &obj, "use_dora")? {
        return Err(unsupported("use_dora = true (DoRA adapters)".into()));
    }
    if flag(path, &obj, "lora_bias")? {
        return Err(unsupported("lora_bias = true (a bias on lora_B)".into()));
    }
    match present(&obj, "bias") {
        None => {}
        Some(Value::String(b)) if b == "none" => {}
        Some(Value::String(b)) => return Err(unsupported(format!("bias = \"{b}\" (trained biases)"))),
        Some(other) => return Err(bad(format!("bias = {other} is not a string"))),
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        match present(&obj, key) {
            None => {}
            Some(Value::Object(m)) if m.is_empty() => {}
            Some(Value::Object(_)) => return Err(unsupported(format!("{key} (per-module ranks or alphas)"))),
            Some(other) => return Err(bad(format!("{key} = {other} is not an object"))),
        }
    }
    for (key, what) in [("modules_to_save", "whole modules saved beside the adapter"), ("layer_replication", "replicated layers"), ("alora_invocation_tokens", "activated LoRA")] {
        match present(&obj, key) {
            None => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(_) => return Err(unsupported(format!("{key} ({what})"))),
        }
    }
    check_target_modules(path, present(&obj, "target_modules"))?;
    Ok(Config { r, alpha, rslora })
}

/// `obj[key]`, with null taken as absent.
fn present<'v>(obj: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// A boolean setting, false when absent.
fn flag(path: &Path, obj: &Map<String, Value>, key: &str) -> Result<bool, LoraError> {
    match present(obj, key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format_error(path, format!("{key} = {other} is not a boolean"))),
    }
}

/// Every module a list of `target_modules` names must be one Blink can change. A string is
/// a regular expression in PEFT (or `all-linear`): the tensors say what it matched.
fn check_target_modules(path: &Path, value: Option<&Value>) -> Result<(), LoraError> {
    match value {
        None | Some(Value::String(_)) => Ok(()),
        Some(Value::Array(list)) => {
            for entry in list {
                let Value::String(name) = entry else {
                    return Err(format_error(path, format!("target_modules entry {entry} is not a string")));
                };
                // PEFT matches a listed name against the end of each module's path.
                let module = name.rsplit('.').next().unwrap_or(name);
                if !LoraTarget::ALL.iter().any(|t| t.peft_name() == module) {
                    return Err(LoraError::Unsupported(format!("{}: target module '{name}': Blink's adapters change only q/k/v/o_proj and gate/up/down_proj", path.display())));
                }
            }
            Ok(())
        }
        Some(other) => Err(format_error(path, format!("target_modules = {other} is neither a list nor a string"))),
    }
}
