//! An adapter as read from a file, before it is placed on a model's parts: one pair of
//! float matrices per (layer, target), in the GGUF row order of the base model.

use super::target::LoraTarget;

/// One LoRA pair, `ΔW = scale · B·A`.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraPair {
    pub rank: usize,
    /// Output features (rows of the base matrix).
    pub rows: usize,
    /// Input features (columns of the base matrix).
    pub cols: usize,
    /// `A`, `[rank][cols]`, row-major.
    pub a: Vec<f32>,
    /// `B`, `[rows][rank]`, row-major, its rows in the base GGUF tensor's row order (for
    /// Q and K of a model with llama.cpp's normal rope order, Hugging Face's rows permuted).
    pub b: Vec<f32>,
}

/// Which file an adapter came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoraFormat {
    /// A PEFT directory (`adapter_config.json` + `adapter_model.safetensors`).
    Peft,
    /// A llama.cpp LoRA GGUF.
    Gguf,
}

/// Every pair of an adapter, checked against the base model's shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraTensors {
    pub format: LoraFormat,
    /// `lora_alpha`: a pair of rank r is scaled by `alpha / r` (`alpha / √r` with rsLoRA).
    pub alpha: f32,
    pub rslora: bool,
    /// One entry per base layer, indexed by [`LoraTarget::index`].
    pub layers: Vec<[Option<LoraPair>; 7]>,
}

impl LoraTensors {
    /// The pair of `target` in `layer`, if the adapter has one.
    pub fn pair(&self, layer: usize, target: LoraTarget) -> Option<&LoraPair> {
        self.layers.get(layer)?[target.index()].as_ref()
    }

    /// The factor a pair of rank `rank` is scaled by (before any user scale).
    pub fn pair_scale(&self, rank: usize) -> f32 {
        if self.rslora {
            self.alpha / (rank as f32).sqrt()
        } else {
            self.alpha / rank as f32
        }
    }

    /// The targets the adapter changes in some layer.
    pub fn targets(&self) -> Vec<LoraTarget> {
        LoraTarget::ALL.into_iter().filter(|t| self.layers.iter().any(|l| l[t.index()].is_some())).collect()
    }

    /// Bytes of its tensors, as f32.
    pub fn tensor_bytes(&self) -> usize {
        self.layers.iter().flatten().flatten().map(|p| (p.a.len() + p.b.len()) * 4).sum()
    }
}
