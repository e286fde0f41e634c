//! The model side of Blink: everything needed to turn token ids into logits.
//!
//! Owns GGUF-to-model mapping (config, weights), the tokenizer and chat template, the KV
//! cache and the batched forward pass. It does not schedule requests or sample tokens
//! (that is `blink-engine`), and its numerics live in `blink-kernels`.

pub mod chat_template;
pub mod config;
pub mod fetch;
pub mod forward;
pub mod kv_cache;
pub mod rope;
pub mod tokenizer;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

use blink_gguf::{GgufError, GgufFile};
use thiserror::Error;

pub use chat_template::{ChatMessage, ChatTemplate, TemplateError};
pub use config::{Arch, ModelConfig};
pub use forward::{ForwardError, Scratch, StepRow};
pub use kv_cache::{KvCache, KvType, SeqId};
pub use rope::Rope;
pub use tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
pub use weights::Weights;

/// Why a model could not be loaded.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("bad model metadata: {0}")]
    BadConfig(String),
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    #[error("bad tensor: {0}")]
    BadTensor(String),
}

/// A loaded model: configuration, weights and rope tables, backed by the mapped file.
pub struct Model {
    pub cfg: ModelConfig,
    pub weights: Weights,
    pub rope: Rope,
    file: Arc<GgufFile>,
}

impl Model {
    /// Build the model from an opened (and therefore validated) GGUF file.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        let cfg = ModelConfig::from_gguf(&file)?;
        let weights = Weights::from_gguf(&file, &cfg, blink_kernels::cpu::active())?;
        let rope = Rope::new(&cfg.rope, weights.rope_freqs.clone());
        Ok(Model { cfg, weights, rope, file })
    }

    /// Open, validate and load the GGUF file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        Self::from_gguf(Arc::new(GgufFile::open(path)?))
    }

    /// The file the model was loaded from.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Weight bytes one decode step reads: every layer matrix and the output head.
    pub fn bytes_per_token(&self) -> usize {
        let w = &self.weights;
        let layers: usize = w
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
            .map(|m| m.bytes().len())
            .sum();
        layers + w.output.bytes().len()
    }

    /// A KV cache for this model able to hold `tokens` tokens in all.
    pub fn new_kv_cache(&self, tokens: usize, ty: KvType) -> KvCache {
        KvCache::new(self.cfg.n_layers, self.cfg.n_head_kv, self.cfg.head_dim, ty, KvCache::blocks_for(tokens))
    }
}
