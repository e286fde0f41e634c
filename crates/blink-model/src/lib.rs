//! The model side of Blink: everything needed to turn token ids into logits.
//!
//! Owns GGUF-to-model mapping (config, weights), the KV cache and the batched forward pass.
//! It does not schedule requests or sample tokens (that is `blink-engine`), knows no text
//! (the tokenizer and chat template are `blink-text`'s), its numerics live in
//! `blink-kernels`, and its threads and memory homes in `blink-runtime`.

pub mod config;
pub mod fetch;
pub mod forward;
pub mod kv_cache;
pub mod lora;
pub mod parallel;
pub mod rope;
pub mod train;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

use blink_gguf::{GgufError, GgufFile};
use blink_runtime::numa::NumaError;
use weights::{Home, Loader};
use thiserror::Error;

pub use config::{Arch, ModelConfig};
pub use forward::{AdapterSlot, ForwardError, RowKind, Scratch, Step, StepInput, StepOutput, StepRow, LLAMA_UBATCH};
pub use kv_cache::{KvCache, KvType, SeqId};
pub use rope::Rope;
pub use parallel::tensor::{TensorPart, TensorPlacement, TensorSplit};
pub use weights::{Matrices, Share, Weights};

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
    #[error("cannot place the model in memory: {0}")]
    Placement(String),
    /// The OS would not start the compute threads (a limit on threads or memory).
    #[error("could not start a compute thread: {0}")]
    Threads(std::io::Error),
    /// A cache or buffer could not be had (sized by the caller, so usually too large).
    #[error(transparent)]
    Memory(NumaError),
}

/// A loaded model: configuration, rope tables and weights, as one part (flat) or one part
/// per NUMA node (tensor parallel), backed by the mapped file.
pub struct Model {
    pub cfg: ModelConfig,
    pub rope: Rope,
    /// The local (sliding-window) layers' rope, when they have their own base.
    pub rope_local: Option<Rope>,
    /// Phi-3's ropes for contexts up to the original one and past it, when the file has
    /// both factor sets ([`Model::fit_context`] chooses; the short one until then).
    rope_by_context: Option<(Rope, Rope)>,
    /// How the work is split over the parts (one part for a flat model).
    pub split: TensorSplit,
    /// One per part of `split`, in the part's memory.
    pub parts: Vec<Weights>,
    placement: TensorPlacement,
    file: Arc<GgufFile>,
    share: Share,
}

impl Model {
    /// Build a flat model from an opened (and therefore validated) GGUF file.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        Self::from_gguf_placed(file, &TensorPlacement::flat(1))
    }

    /// Build the model for `placement`: flat, or split over its NUMA nodes.
    pub fn from_gguf_placed(file: Arc<GgufFile>, placement: &TensorPlacement) -> Result<Model, ModelError> {
        Self::from_gguf_share(file, placement, Share::all())
    }

    /// Build the model for `placement`, holding the layers `share` names (a ring device's
    /// windows) and placing their matrices as it says. Steps over other layers are refused.
    pub fn from_gguf_share(file: Arc<GgufFile>, placement: &TensorPlacement, share: Share) -> Result<Model, ModelError> {
        let cfg = ModelConfig::from_gguf(&file)?;
        weights::check_layer_count(&file, &cfg)?;
        if placement.numa && placement.n_parts() > forward::MAX_PARTS {
            return Err(ModelError::Placement(format!("{} NUMA nodes; tensor parallelism splits a model over at most {}", placement.n_parts(), forward::MAX_PARTS)));
        }
        let isa = blink_kernels::cpu::active();
        let split = if placement.numa { TensorSplit::new(&cfg, &placement.threads) } else { TensorSplit::new(&cfg, &[1]) };
        let homes: Vec<Home> = (0..split.parts.len())
            .map(|node| if placement.numa { Home::Node { topology: &placement.topology, node } } else { Home::Shared })
            .collect();
        let used = weights::Used::default();
        let loader = Loader::new(&file, isa, Home::Shared, &used, share.matrices);
        let rope_freqs = loader.rope_freqs(&cfg)?;
        let (short, long) = (loader.rope_factors(&cfg, "rope_factors_short.weight")?, loader.rope_factors(&cfg, "rope_factors_long.weight")?);
        let load = |part: &parallel::tensor::TensorPart, home: Home| Weights::load(&Loader::new(&file, isa, home, &used, share.matrices), &cfg, part, &share);
        let parts = if placement.numa {
            // Each node's part is loaded by a thread on that node, all at once: its pages
            // are first touched there, so they are local even where binding is refused
            // (a container without the right to call mbind, a node without memory).
            std::thread::scope(|scope| {
                let loads = split
                    .parts
                    .iter()
                    .zip(&homes)
                    .enumerate()
                    .map(|(node, (part, &home))| {
                        let cpus = placement.topology.nodes().get(node).map_or(&[][..], |n| &n.cpus[..]);
                        std::thread::Builder::new().name(format!("blink-load-{node}")).spawn_scoped(scope, move || {
                            blink_runtime::affinity::pin_current_thread(cpus);
                            load(part, home)
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(ModelError::Threads)?;
                loads.into_iter().map(|t| t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect::<Result<Vec<_>, _>>()
            })?
        } else {
            split.parts.iter().zip(&homes).map(|(part, &home)| load(part, home)).collect::<Result<Vec<_>, _>>()?
        };
        used.check_all(&file, &share)?;
        weights::release_copied(&file, &parts);
        // As llama.cpp: `rope_freqs` wins; else the short factors (or none) and the long.
        let rope_by_context = match (&rope_freqs, short, long) {
            (None, short, Some(long)) => Some((Rope::new(&cfg.rope, short), Rope::new(&cfg.rope, Some(long)))),
            _ => None,
        };
        let rope = match &rope_by_context {
            Some((short, _)) => short.clone(),
            None => Rope::new(&cfg.rope, rope_freqs),
        };
        let rope_local = cfg.sliding.as_ref().map(|s| Rope::new(&s.rope, None));
        Ok(Model { cfg, rope, rope_local, rope_by_context, split, parts, placement: placement.clone(), file, share })
    }

    /// Choose the rope for sequences of up to `n_ctx` tokens: Phi-3's long factors past the
    /// context its file was trained at, as llama.cpp chooses them (for its context per
    /// sequence). Models with one rope keep it.
    pub fn fit_context(&mut self, n_ctx: usize) {
        if let Some((short, long)) = &self.rope_by_context {
            self.rope = if n_ctx > self.cfg.rope.original_ctx { long.clone() } else { short.clone() };
        }
    }

    /// Open, validate and load the GGUF file at `path` (flat).
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        Self::from_gguf(Arc::new(GgufFile::open(path)?))
    }

    /// The file the model was loaded from.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Which layers this process holds, and how.
    pub fn share(&self) -> &Share {
        &self.share
    }

    /// How the model is spread over the machine.
    pub fn placement(&self) -> &TensorPlacement {
        &self.placement
    }

    /// Weight bytes each part reads per decode step: its layer matrices and LM head rows.
    pub fn bytes_per_token_by_part(&self) -> Vec<usize> {
        self.parts.iter().map(|w| w.product_matrices().map(|m| m.bytes().len()).sum()).collect()
    }

    /// Weight bytes one decode step reads in all.
    pub fn bytes_per_token(&self) -> usize {
        self.bytes_per_token_by_part().iter().sum()
    }

    /// A KV cache for this model able to hold `tokens` tokens in all, split like the model.
    pub fn new_kv_cache(&self, tokens: usize, ty: KvType) -> KvCache {
        self.try_new_kv_cache(tokens, ty).expect("the KV cache could not be allocated")
    }

    /// As `new_kv_cache`, reporting a failure to map or bind node memory.
    /// Its sliding-window layers give back the memory of blocks past every window (a
    /// window's cache, a ring device's, keeps them: see [`KvCache::with_sliding_window`]).
    pub fn try_new_kv_cache(&self, tokens: usize, ty: KvType) -> Result<KvCache, ModelError> {
        let kv = self.try_new_kv_cache_for(0..self.cfg.n_layers, tokens, ty)?;
        Ok(match &self.cfg.sliding {
            Some(s) => kv.with_sliding_window(s.window, |layer| self.cfg.is_local(layer)),
            None => kv,
        })
    }

    /// A KV cache of `tokens` tokens holding only model layers `layers` (a window), split
    /// like the model. Steps over other layers are refused with it.
    pub fn try_new_kv_cache_for(&self, layers: std::ops::Range<usize>, tokens: usize, ty: KvType) -> Result<KvCache, ModelError> {
        if layers.start > layers.end || layers.end > self.cfg.n_layers {
            return Err(ModelError::Placement(format!("layers {layers:?} are not a window of the model's {} layers", self.cfg.n_layers)));
        }
        let topology = &self.placement.topology;
        let shards: Vec<(usize, Option<(&blink_runtime::numa::Topology, usize)>)> = self
            .split
            .parts
            .iter()
            .enumerate()
            .map(|(node, p)| (p.kv_heads.len(), self.placement.numa.then_some((topology, node))))
            .collect();
        KvCache::sharded(layers, &shards, self.cfg.head_dim, ty, KvCache::blocks_for(tokens)).map_err(ModelError::Memory)
    }

    /// A compute pool matching the model's placement (`threads` in all for a flat model);
    /// the caller of its `run` is one of the threads.
    pub fn pool(&self, threads: usize) -> Result<blink_runtime::numa::NodePool, ModelError> {
        self.build_pool(threads, false)
    }

    /// As [`Model::pool`], with threads of its own only, so that the caller can work while
    /// a step computes ([`Model::forward_beside`]): for the serving engine.
    pub fn detached_pool(&self, threads: usize) -> Result<blink_runtime::numa::NodePool, ModelError> {
        self.build_pool(threads, true)
    }

    fn build_pool(&self, threads: usize, detached: bool) -> Result<blink_runtime::numa::NodePool, ModelError> {
        // A flat model's pool runs over its placement's CPUs (all allowed ones, unless the
        // placement was given fewer, e.g. to leave CPUs to a trainer beside a server).
        let placement = if self.placement.numa { self.placement.clone() } else { TensorPlacement { topology: self.placement.topology.clone(), threads: vec![threads.max(1)], numa: false } };
        placement.pool(detached).map_err(|e| match e {
            blink_runtime::numa::NumaError::Spawn(e) => ModelError::Threads(e),
            e => ModelError::Placement(e.to_string()),
        })
    }
}
