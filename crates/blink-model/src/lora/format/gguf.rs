//! llama.cpp's LoRA GGUF (as `convert_lora_to_gguf.py` writes it): the adapter metadata,
//! and the pairs `blk.N.<tensor>.weight.lora_{a,b}`, already in the base GGUF's row order.

use std::path::Path;

use blink_gguf::{GgmlType, GgufError, GgufFile};

use super::super::{LoraError, LoraFormat, LoraTarget, LoraTensors};
use super::check::{format_error, layer_index, Elem, Found, Layout, Pairs, Rank, Side};
use crate::config::ModelConfig;

/// Read the llama.cpp LoRA GGUF at `path` and check it against `cfg`.
pub(super) fn read(path: &Path, cfg: &ModelConfig) -> Result<LoraTensors, LoraError> {
    let file = GgufFile::open(path).map_err(|e| match e {
        GgufError::Io { source, .. } => LoraError::Io { path: path.to_path_buf(), source },
        e => format_error(path, e.to_string()),
    })?;
    let meta = |e: GgufError| format_error(path, e.to_string());
    match file.opt_str("general.type").map_err(meta)? {
        Some("adapter") => {}
        Some(other) => return Err(format_error(path, format!("general.type is '{other}', not 'adapter': this is not a LoRA adapter"))),
        None => return Err(format_error(path, "has no general.type: not a llama.cpp adapter".into())),
    }
    match file.opt_str("adapter.type").map_err(meta)? {
        Some("lora") => {}
        Some(other) => return Err(LoraError::Unsupported(format!("{}: adapter.type '{other}' (Blink reads LoRA adapters)", path.display()))),
        None => return Err(format_error(path, "has no adapter.type".into())),
    }
    let arch = file.opt_str("general.architecture").map_err(meta)?.ok_or_else(|| format_error(path, "has no general.architecture".into()))?;
    if arch != cfg.arch.name() {
        return Err(LoraError::WrongBase(format!("the adapter is for architecture '{arch}', the model is '{}'", cfg.arch.name())));
    }
    if file.get("adapter.alora.invocation_tokens").is_some() {
        return Err(LoraError::Unsupported(format!("{}: an activated LoRA (adapter.alora.invocation_tokens)", path.display())));
    }
    let alpha = file.opt_f32("adapter.lora.alpha").map_err(meta)?.unwrap_or(0.0);
    if !(alpha.is_finite() && alpha >= 0.0) {
        return Err(format_error(path, format!("adapter.lora.alpha = {alpha} is not a finite non-negative number")));
    }

    let mut pairs = Pairs::new(Layout::Gguf);
    for t in file.tensors() {
        let (layer, target, side) = parse_name(&t.name, cfg)?;
        let elem = match t.ty {
            GgmlType::F32 => Elem::F32,
            GgmlType::F16 => Elem::F16,
            GgmlType::BF16 => Elem::BF16,
            other => return Err(LoraError::Unsupported(format!("tensor '{}' is {other}; adapters are read in F32, F16 or BF16", t.name))),
        };
        let shape = t.dims.iter().rev().map(|&d| usize::try_from(d)).collect::<Result<Vec<_>, _>>().map_err(|_| format_error(path, format!("tensor '{}' has dimensions {:?} too large for this machine", t.name, t.dims)))?;
        pairs.insert(path, layer, target, side, Found { name: t.name.clone(), shape, elem, data: file.tensor_data(t) })?;
    }
    let layers = pairs.build(path, cfg, Rank::FromA)?;
    // As llama.cpp: without an alpha (or with 0) a pair is scaled by 1, i.e. alpha = rank.
    let alpha = if alpha != 0.0 {
        alpha
    } else {
        let mut ranks = layers.iter().flatten().flatten().map(|p| p.rank);
        let first = ranks.next().unwrap_or(1);
        if ranks.any(|r| r != first) {
            return Err(LoraError::Unsupported(format!("{}: pairs of different ranks with no adapter.lora.alpha", path.display())));
        }
        first as f32
    };
    Ok(LoraTensors { format: LoraFormat::Gguf, alpha, rslora: false, layers })
}

/// The (layer, target, side) of `blk.N.<gguf name>.weight.lora_{a|b}`.
fn parse_name(name: &str, cfg: &ModelConfig) -> Result<(usize, LoraTarget, Side), LoraError> {
    let unknown = || LoraError::Unsupported(format!("tensor '{name}' is not a LoRA matrix of a block's attention or MLP projection"));
    let (base, side) = if let Some(base) = name.strip_suffix(".lora_a") {
        (base, Side::A)
    } else if let Some(base) = name.strip_suffix(".lora_b") {
        (base, Side::B)
    } else {
        return Err(unknown());
    };
    let base = base.strip_suffix(".weight").ok_or_else(unknown)?;
    let Some((digits, tensor)) = base.strip_prefix("blk.").and_then(|rest| rest.split_once('.')) else {
        // `token_embd`, `output`: an adapter on the embeddings or the head.
        return Err(LoraError::Unsupported(format!("target '{base}' (tensor '{name}'): Blink's adapters change only a block's attn_q/k/v/output and ffn_gate/up/down")));
    };
    let Some(target) = LoraTarget::ALL.into_iter().find(|t| t.gguf_name() == tensor) else {
        return Err(LoraError::Unsupported(format!("target '{tensor}' (tensor '{name}'): Blink's adapters change only a block's attn_q/k/v/output and ffn_gate/up/down")));
    };
    let layer = layer_index(digits, cfg)?.ok_or_else(unknown)?;
    Ok((layer, target, side))
}
