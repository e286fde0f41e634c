//! A model file's figures as the planner needs them.

use std::collections::BTreeMap;

use blink_gguf::GgufFile;
use blink_model::config::ModelConfig;

use super::ModelShape;

impl ModelShape {
    /// The shape of the model in `file` (configured as `cfg`), with a KV cache of
    /// `ctx_tokens` tokens of `kv_elem_bytes`-byte elements per layer. A layer's bytes are
    /// the mean of its blocks' (`blk.N.*`); the rest of the file is the head's.
    pub fn of(file: &GgufFile, cfg: &ModelConfig, ctx_tokens: usize, kv_elem_bytes: usize) -> ModelShape {
        let (mut blocks, mut head) = (0u64, 0u64);
        for t in file.tensors() {
            if t.name.starts_with("blk.") {
                blocks += t.n_bytes;
            } else {
                head += t.n_bytes;
            }
        }
        ModelShape {
            n_layers: cfg.n_layers,
            layer_bytes: blocks.div_ceil(cfg.n_layers.max(1) as u64),
            kv_layer_bytes: (2 * cfg.n_head_kv * cfg.head_dim * kv_elem_bytes * ctx_tokens) as u64,
            head_bytes: head,
            hidden_bytes: (cfg.n_embd * std::mem::size_of::<f32>()) as u64,
        }
    }
}

/// A mean layer's matrix bytes by type name (the `blk.N.*` matrices over the `n_layers`
/// layers), what a profile's product rates are applied to. Vectors (norms, biases) are
/// left out: they cost memory, not products.
pub fn layer_bytes_by_type(file: &GgufFile, n_layers: usize) -> BTreeMap<String, u64> {
    let mut by_type = BTreeMap::new();
    let is_matrix = |dims: &[u64]| dims.iter().filter(|&&d| d > 1).count() >= 2;
    for t in file.tensors().iter().filter(|t| t.name.starts_with("blk.") && is_matrix(&t.dims)) {
        *by_type.entry(t.ty.name().to_string()).or_insert(0) += t.n_bytes;
    }
    by_type.values_mut().for_each(|b| *b = b.div_ceil(n_layers.max(1) as u64));
    by_type
}
