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

use std::ops::Deref;

use blink_kernels::cpu::{self, Isa};
use blink_runtime::numa::NodePool;
use thiserror::Error;

use crate::lora::{LoraTarget, LoraTensors};
use crate::Model;
use buffers::{Arena, Work, M};
use ctx::{Ctx, Scratches};
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
    #[error("a batch is under way")]
    Busy,
    #[error("no batch is staged")]
    NoBatch,
}

/// Which part of a batch's pass a unit of work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitKind {
    /// The embedding (with the first layers) and layers' forwards, keeping activations.
    Forward,
    /// The loss head (and, when training, the gradient at the last layer's output).
    Head,
    /// Layers' backwards, from the last down.
    Backward,
}

/// The next unit of a batch's pass, as a scheduler sizes it: `layers` is how many layers
/// the phase has left (a unit may take fewer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitShape {
    pub kind: UnitKind,
    pub layers: usize,
    /// The batch's tokens.
    pub rows: usize,
    /// Σ len² over its examples (attention within each).
    pub attn: usize,
    /// Rows that predict a target.
    pub head_rows: usize,
}

/// Where a batch's pass has got to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No batch.
    Idle,
    /// Layers from `next` on are still to run forward.
    Forward { next: usize },
    Head,
    /// Layers below `next` are still to run backward.
    Backward { next: usize },
}

/// The batch the trainer works through: its tokens in row order, each example's span,
/// the loss's weight (`None`: no gradients), and the loss once the head has run.
struct Staged {
    tokens: Vec<u32>,
    targets: Vec<bool>,
    spans: Vec<(usize, usize)>,
    weight: Option<f32>,
    phase: Phase,
    loss: BatchLoss,
}

/// The model and the buffers of steps of up to `max_tokens` tokens, for adapters whose
/// rank per target is at most `ranks`. `H` is how the model is held (`&Model`, or an
/// `Arc<Model>` shared with a serving engine). The compute threads are lent for each
/// unit of work.
///
/// A batch runs either whole ([`Trainer::step`]) or in units ([`Trainer::begin`], then
/// [`Trainer::run_unit`] until it returns the loss), a few layers at a time, so a
/// scheduler can place them between other work. Both run the same phases in the same
/// order: the results are bit-identical however a batch is cut.
pub struct Trainer<H: Deref<Target = Model>> {
    model: H,
    isa: Isa,
    scratch: Scratches,
    max_tokens: usize,
    ranks: [usize; 7],
    arena: Arena,
    work: Work,
    dropout: Option<Dropout>,
    staged: Staged,
}

impl<H: Deref<Target = Model>> Trainer<H> {
    pub fn new(model: H, max_tokens: usize, ranks: [usize; 7]) -> Result<Trainer<H>, TrainError> {
        let cfg = &model.cfg;
        if model.parts.len() != 1 {
            return Err(TrainError::Unsupported("a model split over NUMA nodes (train on a flat placement)".into()));
        }
        let w = &model.parts[0];
        if !w.holds(0..cfg.n_layers) {
            return Err(TrainError::Unsupported("a model holding only some of its layers (a ring device's share)".into()));
        }
        if cfg.qk_norm.is_some() {
            return Err(TrainError::Unsupported(format!("the Q/K norms of {}", cfg.arch.name())));
        }
        // The backward pass is Llama's: a family with more in its blocks is refused by name.
        if cfg.moe.is_some() {
            return Err(TrainError::Unsupported(format!("the experts of {} (adapters train dense FFNs)", cfg.arch.name())));
        }
        if !cfg.pre_norms || cfg.no_rope_every.is_some() || cfg.attn_softcap.is_some() || cfg.post_norms || cfg.ffn_act != crate::config::FfnAct::Silu || cfg.embd_scale.is_some() || cfg.sliding.is_some() || cfg.logit_softcap.is_some() || cfg.query_scale.is_some() || cfg.block_out_apart() || cfg.attn_scale.is_some() || cfg.logit_scale.is_some() {
            return Err(TrainError::Unsupported(format!("the blocks of {} (norms after attention and the FFN, GeGLU, local layers, layers without rope, soft-capping, multipliers)", cfg.arch.name())));
        }
        let max_tokens = max_tokens.max(1);
        let arena = Arena::new(cfg, max_tokens, &ranks)
            .map_err(|_| TrainError::Memory { what: "saved activations", bytes: max_tokens * buffers::saved_per_token(cfg, &ranks) * cfg.n_layers * 4 })?;
        let work = Work::new(cfg, max_tokens, ranks.iter().copied().max().unwrap_or(0));
        let staged = Staged { tokens: Vec::with_capacity(max_tokens), targets: Vec::with_capacity(max_tokens), spans: Vec::new(), weight: None, phase: Phase::Idle, loss: BatchLoss::default() };
        Ok(Trainer { model, isa: cpu::active(), scratch: Scratches::new(), max_tokens, ranks, arena, work, dropout: None, staged })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The most tokens a batch may hold.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The dropout on the adapter's inputs for the batches that begin next (`None`, as
    /// for evaluation: none). A training run sets a new seed for each batch.
    pub fn set_dropout(&mut self, dropout: Option<Dropout>) -> Result<(), TrainError> {
        if let Some(d) = dropout.filter(|d| !(0.0..1.0).contains(&d.p)) {
            return Err(TrainError::Unsupported(format!("a dropout of {} (it must be in [0, 1))", d.p)));
        }
        if self.staged.phase != Phase::Idle {
            return Err(TrainError::Busy);
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
    /// whole optimizer step gives the mean's gradient); all of it at once, on `pool`.
    pub fn step(&mut self, pool: &NodePool, batch: &[Example], params: &LoraTensors, mut grads: Option<(&mut LoraTensors, f32)>) -> Result<BatchLoss, TrainError> {
        self.begin(batch, grads.as_ref().map(|g| g.1))?;
        loop {
            if let Some(loss) = self.run_unit(pool, params, grads.as_mut().map(|g| &mut *g.0), usize::MAX)? {
                return Ok(loss);
            }
        }
    }

    /// Stage a batch (its loss weighted by `weight` per target when gradients are to be
    /// computed), after checking it; nothing is computed yet. Refused while another
    /// batch is under way.
    pub fn begin(&mut self, batch: &[Example], weight: Option<f32>) -> Result<(), TrainError> {
        if self.staged.phase != Phase::Idle {
            return Err(TrainError::Busy);
        }
        self.check(batch)?;
        let s = &mut self.staged;
        s.tokens.clear();
        s.targets.clear();
        s.spans.clear();
        for e in batch {
            s.spans.push((s.tokens.len(), e.tokens.len()));
            s.tokens.extend_from_slice(e.tokens);
            s.targets.extend_from_slice(e.targets);
        }
        (s.weight, s.phase, s.loss) = (weight, Phase::Forward { next: 0 }, BatchLoss::default());
        Ok(())
    }

    /// Drop the staged batch (a job cancelled or paused mid-batch); gradients it added
    /// so far stay where they are, so the caller discards them too.
    pub fn abandon(&mut self) {
        self.staged.phase = Phase::Idle;
    }

    /// The next unit of the staged batch, or `None` when no batch is under way.
    pub fn next_unit(&self) -> Option<UnitShape> {
        let s = &self.staged;
        let (kind, layers) = match s.phase {
            Phase::Idle => return None,
            Phase::Forward { next } => (UnitKind::Forward, self.model.cfg.n_layers - next),
            Phase::Head => (UnitKind::Head, 0),
            Phase::Backward { next } => (UnitKind::Backward, next),
        };
        let head_rows = s.spans.iter().map(|&(start, len)| s.targets[start..start + len].iter().skip(1).filter(|&&t| t).count()).sum();
        Some(UnitShape { kind, layers, rows: s.tokens.len(), attn: s.spans.iter().map(|&(_, len)| len * len).sum(), head_rows })
    }

    /// Run the staged batch's next unit on `pool`: up to `max_layers` layers of its
    /// forward or backward (at least one), or its loss head. Returns the batch's loss
    /// when the batch is done (after the head without gradients, after the last
    /// backward layer with them). `params` (and `grads`, when the batch computes them)
    /// must be the same tensors for every unit of a batch.
    pub fn run_unit(&mut self, pool: &NodePool, params: &LoraTensors, grads: Option<&mut LoraTensors>, max_layers: usize) -> Result<Option<BatchLoss>, TrainError> {
        let phase = self.staged.phase;
        if phase == Phase::Idle {
            return Err(TrainError::NoBatch);
        }
        self.check_params(params)?;
        let wants_grads = self.staged.weight.is_some();
        let grads = match grads {
            Some(g) if wants_grads => {
                check_same_shapes(params, g)?;
                Some(g)
            }
            None if wants_grads && matches!(phase, Phase::Head | Phase::Backward { .. }) => {
                return Err(TrainError::AdapterMismatch("the batch computes gradients, but none were given".into()))
            }
            _ => None,
        };
        let views = self.pair_views(params, grads);
        let (n_layers, k) = (self.model.cfg.n_layers, max_layers.max(1));
        self.scratch.ensure(pool.n_threads(), self.max_tokens);
        let cfg = &self.model.cfg;
        let (max_tokens, ranks) = (self.max_tokens, self.ranks);
        let arena = &mut self.arena;
        let mut saved = |l: usize| arena.layer(cfg, l, max_tokens, &ranks);
        let s = &self.staged;
        let run = Run { model: &self.model, ctx: Ctx::new(pool, self.isa, &self.scratch), tokens: &s.tokens, targets: &s.targets, spans: &s.spans, n: s.tokens.len(), w: self.work.views(cfg) };
        // SAFETY: the buffers were sized for `max_tokens` ≥ n rows (checked when the batch
        // was staged), and every phase keeps its writes disjoint.
        let (next, loss) = unsafe {
            match phase {
                Phase::Idle => unreachable!("checked above"),
                Phase::Forward { next } => {
                    if next == 0 {
                        run.embed();
                    }
                    let end = next.saturating_add(k).min(n_layers);
                    for (l, pairs) in views.iter().enumerate().take(end).skip(next) {
                        run.layer_forward(l, &saved(l), pairs);
                    }
                    (if end == n_layers { Phase::Head } else { Phase::Forward { next: end } }, None)
                }
                Phase::Head => {
                    let loss = run.loss_head(s.weight);
                    if s.weight.is_some() {
                        (Phase::Backward { next: n_layers }, Some(loss))
                    } else {
                        (Phase::Idle, Some(loss))
                    }
                }
                Phase::Backward { next } => {
                    let end = next.saturating_sub(k);
                    for l in (end..next).rev() {
                        run.layer_backward(l, &saved(l), &views[l]);
                    }
                    (if end == 0 { Phase::Idle } else { Phase::Backward { next: end } }, None)
                }
            }
        };
        let s = &mut self.staged;
        if let Some(loss) = loss {
            s.loss = loss;
        }
        s.phase = next;
        Ok((next == Phase::Idle).then_some(s.loss))
    }

    /// The batch fits and is well formed.
    fn check(&self, batch: &[Example]) -> Result<(), TrainError> {
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
        Ok(())
    }

    /// The adapter's pairs fit the model and the trainer's ranks.
    fn check_params(&self, params: &LoraTensors) -> Result<(), TrainError> {
        let cfg = &self.model.cfg;
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
        Ok(())
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

/// One unit's phases: the model, the lent pool, the staged batch and the buffers' views.
struct Run<'a> {
    model: &'a Model,
    ctx: Ctx<'a>,
    tokens: &'a [u32],
    targets: &'a [bool],
    /// Each example's first row and length, in row order.
    spans: &'a [(usize, usize)],
    /// Tokens (rows) of the batch.
    n: usize,
    w: buffers::WorkViews,
}

impl Run<'_> {
    /// Each example's first row and length, in row order.
    fn spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.spans.iter().copied()
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

/// A block's input norm weights: every model the trainer takes has them (checked in
/// [`Trainer::new`]).
fn pre_norm(weight: &Option<crate::weights::Vector>) -> &[f32] {
    weight.as_deref().expect("the trainer takes models with pre-norms only")
}
