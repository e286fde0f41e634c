//! LoRA fine-tuning's pass over the frozen model: a forward over training examples that
//! keeps what the backward needs, a chunked cross-entropy loss head, and a hand-written
//! backward into the adapter's `A` and `B` (f32 master weights, in the base model's GGUF
//! row order; see [`crate::lora::LoraTensors`]).
//!
//! Products read the frozen matrices from their quantized blocks, a tile at a time, in
//! float ([`blink_kernels::fgemm`]): the inference pass's 8-bit activations move the loss
//! by about 1% on the default model, more than a gradient check allows. Each example is
//! its own causal sequence, so packed examples never attend to each other. Every
//! reduction runs in a fixed order: a step's result depends only on its inputs.
//!
//! `forward` and `backward` mirror a layer's blocks; `head` is the loss; `lora` a pair's
//! products; `attention` and `elementwise` the per-row pieces; `ctx` runs phases on the
//! pool; `buffers` holds the work buffers and the saved-activation arena; `dropout` the
//! adapter inputs' dropout masks.

mod attention;
mod backward;
mod buffers;
mod ctx;
mod dropout;
pub mod elementwise;
mod forward;
mod head;
mod lora;

use blink_kernels::cpu;
use thiserror::Error;

use crate::lora::{LoraTarget, LoraTensors};
use crate::Model;
use buffers::{Arena, Work, M};
use ctx::Ctx;
pub use dropout::{mix64, Dropout};
use lora::PairView;

/// One training example: its tokens, and which of them are targets (`targets[i]`: token
/// `i` is predicted from position `i - 1` and counted in the loss).
#[derive(Clone, Copy, Debug)]
pub struct Example<'a> {
    pub tokens: &'a [u32],
    pub targets: &'a [bool],
}

/// What a batch's forward gave.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchLoss {
    /// The sum of the targets' negative log-likelihoods.
    pub nll_sum: f64,
    pub targets: usize,
    /// Targets that were also the most likely token.
    pub correct: usize,
}

impl BatchLoss {
    pub fn add(&mut self, other: BatchLoss) {
        self.nll_sum += other.nll_sum;
        self.targets += other.targets;
        self.correct += other.correct;
    }

    pub fn mean(&self) -> f64 {
        self.nll_sum / self.targets.max(1) as f64
    }
}

/// Why a batch or a trainer could not be set up. Nothing has been computed then.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TrainError {
    #[error("fine-tuning does not support {0} yet")]
    Unsupported(String),
    #[error("a batch of {tokens} tokens exceeds the {max} the trainer was sized for")]
    TooManyTokens { tokens: usize, max: usize },
    #[error("example {example}: {reason}")]
    BadExample { example: usize, reason: String },
    #[error("the adapter does not match the model: {0}")]
    AdapterMismatch(String),
    #[error("no memory for {what} ({bytes} bytes)")]
    Memory { what: &'static str, bytes: usize },
    #[error("cannot start the compute threads: {0}")]
    Threads(String),
}

/// The model, its pool and the buffers of steps of up to `max_tokens` tokens, for
/// adapters whose rank per target is at most `ranks`.
pub struct Trainer<'m> {
    model: &'m Model,
    ctx: Ctx,
    max_tokens: usize,
    ranks: [usize; 7],
    arena: Arena,
    work: Work,
    dropout: Option<Dropout>,
}

impl<'m> Trainer<'m> {
    pub fn new(model: &'m Model, threads: usize, max_tokens: usize, ranks: [usize; 7]) -> Result<Trainer<'m>, TrainError> {
        let cfg = &model.cfg;
        if model.parts.len() != 1 {
            return Err(TrainError::Unsupported("a model split over NUMA nodes (train on a flat placement)".into()));
        }
        let w = &model.parts[0];
        if w.layers.iter().any(|l| l.q_norm.is_some() || l.k_norm.is_some()) {
            return Err(TrainError::Unsupported(format!("the per-head Q/K norms of {}", cfg.arch.name())));
        }
        let max_tokens = max_tokens.max(1);
        let arena = Arena::new(cfg, max_tokens, &ranks)
            .map_err(|_| TrainError::Memory { what: "saved activations", bytes: max_tokens * buffers::saved_per_token(cfg, &ranks) * cfg.n_layers * 4 })?;
        let work = Work::new(cfg, max_tokens, ranks.iter().copied().max().unwrap_or(0));
        let pool = model.pool(threads.max(1)).map_err(|e| TrainError::Threads(e.to_string()))?;
        Ok(Trainer { model, ctx: Ctx::new(pool, cpu::active(), max_tokens), max_tokens, ranks, arena, work, dropout: None })
    }

    /// The dropout on the adapter's inputs for the steps that follow (`None`, as for
    /// evaluation: none). A training run sets a new seed for each batch.
    pub fn set_dropout(&mut self, dropout: Option<Dropout>) -> Result<(), TrainError> {
        if let Some(d) = dropout.filter(|d| !(0.0..1.0).contains(&d.p)) {
            return Err(TrainError::Unsupported(format!("a dropout of {} (it must be in [0, 1))", d.p)));
        }
        self.dropout = dropout.filter(|d| d.p > 0.0);
        if self.dropout.is_some() {
            self.work.for_dropout(&self.model.cfg, self.max_tokens);
        }
        Ok(())
    }

    /// Bytes of the saved-activation arena and the work buffers.
    pub fn buffer_bytes(&self) -> usize {
        self.arena.bytes() + self.work.bytes()
    }

    /// The batch's loss with `params`, and (when `grads` is given) its gradients added
    /// to `grads`, the loss's targets weighted by `weight` each (`1 / targets` of the
    /// whole optimizer step gives the mean's gradient).
    pub fn step(&mut self, batch: &[Example], params: &LoraTensors, grads: Option<(&mut LoraTensors, f32)>) -> Result<BatchLoss, TrainError> {
        let tokens = self.check(batch, params)?;
        let n: usize = tokens.len();
        let pairs = |g: Option<&mut LoraTensors>| self.pair_views(params, g);
        let (views, weight) = match grads {
            Some((g, weight)) => {
                check_same_shapes(params, g)?;
                (pairs(Some(g)), Some(weight))
            }
            None => (pairs(None), None),
        };
        let cfg = &self.model.cfg;
        let saved: Vec<_> = (0..cfg.n_layers).map(|l| self.arena.layer(cfg, l, self.max_tokens, &self.ranks)).collect();
        let wv = self.work.views(cfg);
        let run = Run { model: self.model, ctx: &self.ctx, batch, n, w: wv };
        // SAFETY: the buffers were sized for `max_tokens` ≥ n rows (checked), and every
        // phase keeps its writes disjoint.
        unsafe {
            run.embed(&tokens);
            for (l, s) in saved.iter().enumerate() {
                run.layer_forward(l, s, &views[l]);
            }
            let loss = run.loss_head(weight);
            if weight.is_some() {
                for (l, s) in saved.iter().enumerate().rev() {
                    run.layer_backward(l, s, &views[l]);
                }
            }
            Ok(loss)
        }
    }

    /// The batch's tokens in row order, after checking it fits and is well formed.
    fn check(&self, batch: &[Example], params: &LoraTensors) -> Result<Vec<u32>, TrainError> {
        let cfg = &self.model.cfg;
        let total: usize = batch.iter().map(|e| e.tokens.len()).sum();
        if total > self.max_tokens {
            return Err(TrainError::TooManyTokens { tokens: total, max: self.max_tokens });
        }
        for (i, e) in batch.iter().enumerate() {
            let bad = |reason: String| TrainError::BadExample { example: i, reason };
            if e.targets.len() != e.tokens.len() {
                return Err(bad(format!("{} targets for {} tokens", e.targets.len(), e.tokens.len())));
            }
            if let Some(&t) = e.tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
                return Err(bad(format!("token {t} is outside the vocabulary of {}", cfg.vocab_size)));
            }
            if e.tokens.len() > cfg.n_ctx_train.max(1) {
                return Err(bad(format!("{} tokens exceed the model's context of {}", e.tokens.len(), cfg.n_ctx_train)));
            }
        }
        if params.layers.len() != cfg.n_layers {
            return Err(TrainError::AdapterMismatch(format!("{} layers for the model's {}", params.layers.len(), cfg.n_layers)));
        }
        for layer in &params.layers {
            for (t, p) in LoraTarget::ALL.into_iter().zip(layer) {
                if let Some(p) = p {
                    if (p.rows, p.cols) != t.shape(cfg) || p.rank > self.ranks[t.index()] {
                        return Err(TrainError::AdapterMismatch(format!("{} pair of rank {} and shape {}×{}", t.short_name(), p.rank, p.rows, p.cols)));
                    }
                }
            }
        }
        Ok(batch.iter().flat_map(|e| e.tokens.iter().copied()).collect())
    }

    /// Per layer and target, the pair's view (with its gradients when given).
    fn pair_views<'p>(&self, params: &'p LoraTensors, mut grads: Option<&mut LoraTensors>) -> Vec<[Option<PairView<'p>>; 7]> {
        params
            .layers
            .iter()
            .enumerate()
            .map(|(l, layer)| {
                std::array::from_fn(|i| {
                    let p = layer[i].as_ref()?;
                    let (ga, gb) = match grads.as_deref_mut().and_then(|g| g.layers[l][i].as_mut()) {
                        Some(g) => (M::of(&mut g.a, p.cols), M::of(&mut g.b, p.rank)),
                        None => (M { ptr: std::ptr::null_mut(), cols: p.cols }, M { ptr: std::ptr::null_mut(), cols: p.rank }),
                    };
                    let drop = self.dropout.map(|d| d.mask(l, LoraTarget::ALL[i]));
                    Some(PairView { pair: p, scale: params.pair_scale(p.rank), ga, gb, drop })
                })
            })
            .collect()
    }
}

/// One step's phases: the model, the pool, the batch and the buffers' views.
struct Run<'a> {
    model: &'a Model,
    ctx: &'a Ctx,
    batch: &'a [Example<'a>],
    /// Tokens (rows) of the batch.
    n: usize,
    w: buffers::WorkViews,
}

impl Run<'_> {
    /// Each example's first row and length, in row order.
    fn spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.batch.iter().scan(0, |at, e| {
            let start = *at;
            *at += e.tokens.len();
            Some((start, e.tokens.len()))
        })
    }
}

/// Gradients must have the parameters' pairs and shapes.
fn check_same_shapes(params: &LoraTensors, grads: &LoraTensors) -> Result<(), TrainError> {
    let same = params.layers.len() == grads.layers.len()
        && params.layers.iter().zip(&grads.layers).all(|(a, b)| {
            a.iter().zip(b).all(|(p, g)| match (p, g) {
                (None, None) => true,
                (Some(p), Some(g)) => p.rank == g.rank && p.rows == g.rows && p.cols == g.cols && g.a.len() == p.a.len() && g.b.len() == p.b.len(),
                _ => false,
            })
        });
    if same {
        Ok(())
    } else {
        Err(TrainError::AdapterMismatch("the gradients' pairs differ from the parameters'".into()))
    }
}

/// A zero tensor set with `params`' pairs and shapes (gradients, optimizer moments).
pub fn zeros_like(params: &LoraTensors) -> LoraTensors {
    let mut z = params.clone();
    for p in z.layers.iter_mut().flatten().flatten() {
        p.a.fill(0.0);
        p.b.fill(0.0);
    }
    z
}
