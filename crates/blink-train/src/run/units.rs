//! The run's units of work and where the run is between them. An optimizer step is its
//! batches, each cut into forward units (a few layers each), the loss head and backward
//! units, then the optimizer: the gradients' global norm and AdamW's update, each over a
//! few layers at a time; an epoch's end adds the evaluation batches' forward units and
//! heads. The units give the same bits however they are cut. Whoever drives the run asks
//! for the next unit ([`Finetune::next_unit`], to size it) and runs it
//! ([`Finetune::run_unit`], or [`Finetune::run_unit_until`], which may stop it at any layer
//! boundary).

use std::ops::Deref;

use blink_model::lora::LoraTensors;
use blink_model::train::{self, BatchLoss, UnitShape};
use blink_model::Model;
use blink_runtime::numa::NodePool;

use super::{examples_of, Finetune, FinetuneError, Progress};
use crate::checkpoint::{CurvePoint, TrainState};
use crate::optim::{add_squares, clip_scale, OptimError};

/// The run's next unit, as a scheduler sizes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A piece of a training or evaluation batch's pass.
    Batch(UnitShape),
    /// The gradients' global norm (for clipping) over the `layers` layers left, which
    /// hold `params` adapter parameters; a unit takes one or more of them.
    GradNorm { layers: usize, params: usize },
    /// AdamW's update (clipping applied) of the `layers` layers left, which hold `params`
    /// adapter parameters; a unit takes one or more of them.
    Optimizer { layers: usize, params: usize },
}


/// What a unit did.
#[derive(Clone, Copy, Debug)]
pub enum Outcome {
    /// A piece of a batch ran.
    Working,
    /// An optimizer step ended. The run is at a commit point unless the epoch ended and
    /// its evaluation follows.
    Stepped(Progress),
    /// The evaluation after epoch `epoch` (0-based) ended.
    Evaluated { epoch: u64, loss: f64, accuracy: f64 },
    /// Every unit has run.
    Finished,
}

/// Where the run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pos {
    /// Batch `at` of the current step, whose batches end before `end` (of the state's
    /// epoch); `staged` once the trainer holds it.
    Train { at: usize, end: usize, staged: bool },
    /// The gradients' norm, from `layer` on.
    Norm { layer: usize },
    /// AdamW's update, from `layer` on.
    Update { layer: usize },
    /// Evaluation batch `at`.
    Eval { at: usize, staged: bool },
    Done,
}

/// The position and what the current step (or evaluation) has gathered so far.
pub(super) struct Cursor {
    pos: Pos,
    grads: LoraTensors,
    /// The step's loss, tokens and the weight of each of its targets.
    loss: BatchLoss,
    tokens: u64,
    weight: f32,
    eval: BatchLoss,
    /// The sum of the gradients' squares so far (f64, in the tensors' order).
    norm_squared: f64,
    /// The step's gradient norm, clipping factor and learning rate, once the norm is whole.
    norm: f64,
    clip: Option<f32>,
    lr: f64,
}

impl Cursor {
    pub fn new(params: &LoraTensors) -> Cursor {
        Cursor {
            pos: Pos::Done,
            grads: train::zeros_like(params),
            loss: BatchLoss::default(),
            tokens: 0,
            weight: 0.0,
            eval: BatchLoss::default(),
            norm_squared: 0.0,
            norm: 0.0,
            clip: None,
            lr: 0.0,
        }
    }

    pub fn is_done(&self) -> bool {
        self.pos == Pos::Done
    }

    /// Between steps: at a step's first batch, not yet begun, or done.
    pub fn at_commit_point(&self) -> bool {
        match self.pos {
            Pos::Train { staged, .. } => !staged && self.tokens == 0,
            Pos::Done => true,
            Pos::Norm { .. } | Pos::Update { .. } | Pos::Eval { .. } => false,
        }
    }
}

impl<H: Deref<Target = Model>> Finetune<H> {
    /// The next unit (staging its batch in the trainer if need be), or `None` when the
    /// run is over.
    pub fn next_unit(&mut self) -> Result<Option<Unit>, FinetuneError> {
        match self.cursor.pos {
            Pos::Done => return Ok(None),
            Pos::Norm { layer } => return Ok(Some(Unit::GradNorm { layers: self.n_layers() - layer, params: params_from(&self.state.params, layer) })),
            Pos::Update { layer } => return Ok(Some(Unit::Optimizer { layers: self.n_layers() - layer, params: params_from(&self.state.params, layer) })),
            Pos::Train { at, end, staged: false } => {
                let epoch = self.state.epoch as usize;
                if at == self.state.batch as usize {
                    let step_batches = &self.plan[epoch][at..end];
                    let targets: usize = step_batches.iter().flat_map(|b| &b.examples).map(|&i| self.train[i].n_targets()).sum();
                    self.cursor.weight = 1.0 / targets.max(1) as f32;
                }
                self.trainer.set_dropout(self.dropout_for(epoch, at))?;
                self.trainer.begin(&examples_of(&self.plan[epoch][at], &self.train), Some(self.cursor.weight))?;
                self.cursor.pos = Pos::Train { at, end, staged: true };
            }
            Pos::Eval { at, staged: false } => {
                self.trainer.set_dropout(None)?;
                self.trainer.begin(&examples_of(&self.eval_plan[at], &self.eval), None)?;
                self.cursor.pos = Pos::Eval { at, staged: true };
            }
            Pos::Train { staged: true, .. } | Pos::Eval { staged: true, .. } => {}
        }
        Ok(Some(Unit::Batch(self.trainer.next_unit().expect("a staged batch has a unit left"))))
    }

    /// Run the next unit on `pool`, taking at most `max_layers` layers (at least one) of
    /// a batch's forward or backward, or of the optimizer's norm or update.
    pub fn run_unit(&mut self, pool: &NodePool, max_layers: usize) -> Result<Outcome, FinetuneError> {
        if self.next_unit()?.is_none() {
            return Ok(Outcome::Finished);
        }
        match self.cursor.pos {
            Pos::Train { at, end, .. } => {
                let c = &mut self.cursor;
                if let Some(loss) = self.trainer.run_unit(pool, &self.state.params, Some(&mut c.grads), max_layers)? {
                    c.loss.add(loss);
                    c.tokens += self.plan[self.state.epoch as usize][at].tokens as u64;
                    c.pos = if at + 1 == end { Pos::Norm { layer: 0 } } else { Pos::Train { at: at + 1, end, staged: false } };
                }
                Ok(Outcome::Working)
            }
            Pos::Norm { layer } => self.norm_unit(layer, max_layers.max(1)).map(|()| Outcome::Working),
            Pos::Update { layer } => self.update_unit(layer, max_layers.max(1)),
            Pos::Eval { at, .. } => {
                let Some(loss) = self.trainer.run_unit(pool, &self.state.params, None, max_layers)? else { return Ok(Outcome::Working) };
                self.cursor.eval.add(loss);
                if at + 1 < self.eval_plan.len() {
                    self.cursor.pos = Pos::Eval { at: at + 1, staged: false };
                    return Ok(Outcome::Working);
                }
                let total = std::mem::take(&mut self.cursor.eval);
                let (loss, accuracy) = (total.mean(), total.correct as f64 / total.targets.max(1) as f64);
                let p = self.state.curve.last_mut().expect("a step came before its evaluation");
                (p.eval_loss, p.eval_accuracy) = (Some(loss), Some(accuracy));
                self.next_step();
                Ok(Outcome::Evaluated { epoch: self.state.epoch - 1, loss, accuracy })
            }
            Pos::Done => Ok(Outcome::Finished),
        }
    }

    /// Run the next unit on `pool` as [`Self::run_unit`] does, but one layer at a time,
    /// asking `stop` after each whether to leave the rest for a later unit (a unit over
    /// layers runs at least one; a loss head runs whole). Returns what the last layer's
    /// run gave and the layers run (0 for a head, or when the run is over).
    pub fn run_unit_until(&mut self, pool: &NodePool, max_layers: usize, stop: &dyn Fn() -> bool) -> Result<(Outcome, usize), FinetuneError> {
        let layers = match self.next_unit()? {
            None => return Ok((Outcome::Finished, 0)),
            Some(Unit::Batch(shape)) => shape.layers,
            Some(Unit::GradNorm { layers, .. } | Unit::Optimizer { layers, .. }) => layers,
        };
        if layers == 0 {
            return Ok((self.run_unit(pool, 1)?, 0));
        }
        let want = max_layers.clamp(1, layers);
        let mut done = 0;
        loop {
            let outcome = self.run_unit(pool, 1)?;
            done += 1;
            if done == want || stop() {
                return Ok((outcome, done));
            }
        }
    }

    fn n_layers(&self) -> usize {
        self.state.params.layers.len()
    }

    /// The squares of layers `layer..` (at most `n` of them) into the norm; when the norm
    /// is whole, the step's clipping factor and rate, and AdamW's step begins.
    fn norm_unit(&mut self, layer: usize, n: usize) -> Result<(), FinetuneError> {
        let n_layers = self.n_layers();
        let end = n_layers.min(layer + n);
        let c = &mut self.cursor;
        for g in c.grads.layers[layer..end].iter().flatten().flatten().flat_map(|p| [&p.a, &p.b]) {
            add_squares(&mut c.norm_squared, g);
        }
        if end < n_layers {
            c.pos = Pos::Norm { layer: end };
            return Ok(());
        }
        let norm = c.norm_squared.sqrt();
        if !norm.is_finite() {
            return Err(OptimError::NonFinite(norm).into());
        }
        c.clip = match self.cfg.clip {
            Some(max) => clip_scale(norm, max)?,
            None => None,
        };
        (c.norm, c.lr) = (norm, self.schedule.lr(self.state.step));
        self.adam.set_lr(c.lr)?;
        self.adam.begin_step();
        c.pos = Pos::Update { layer: 0 };
        Ok(())
    }

    /// AdamW's update of layers `layer..` (at most `n` of them), their gradients clipped
    /// first; after the last layer, the step's bookkeeping.
    fn update_unit(&mut self, layer: usize, n: usize) -> Result<Outcome, FinetuneError> {
        let n_layers = self.n_layers();
        let end = n_layers.min(layer + n);
        let c = &mut self.cursor;
        // The optimizer's number for each matrix: A and B of every pair, in layer order.
        let first = 2 * self.state.params.layers[..layer].iter().flatten().flatten().count();
        let params = self.state.params.layers[layer..end].iter_mut().flatten().flatten().flat_map(|p| [&mut p.a, &mut p.b]);
        let grads = c.grads.layers[layer..end].iter_mut().flatten().flatten().flat_map(|p| [&mut p.a, &mut p.b]);
        for (tensor, (p, g)) in (first..).zip(params.zip(grads)) {
            if let Some(scale) = c.clip {
                g.iter_mut().for_each(|x| *x *= scale);
            }
            self.adam.update(tensor, p, g)?;
        }
        if end < n_layers {
            c.pos = Pos::Update { layer: end };
            return Ok(Outcome::Working);
        }
        self.end_step().map(Outcome::Stepped)
    }

    /// The bookkeeping of a step whose update is done; then on to the evaluation or the
    /// next step.
    fn end_step(&mut self) -> Result<Progress, FinetuneError> {
        let c = &self.cursor;
        let (norm, lr) = (c.norm, c.lr);
        let epoch = self.state.epoch as usize;
        let end = self.plan[epoch].len().min(self.state.batch as usize + self.cfg.accum);
        let (loss, tokens) = (c.loss.mean(), c.tokens);
        let s = &mut self.state;
        s.step += 1;
        s.trained_tokens += tokens;
        s.batch = end as u64;
        s.curve.push(CurvePoint { step: s.step, epoch: epoch as u64, train_loss: loss, lr, tokens: s.trained_tokens, eval_loss: None, eval_accuracy: None });
        let progress = Progress { step: s.step, total_steps: self.total_steps, epoch: epoch as u64, loss, lr, grad_norm: norm, tokens, tokens_per_s: 0.0, elapsed: Default::default() };
        if end == self.plan[epoch].len() {
            s.epoch += 1;
            s.batch = 0;
            if !self.eval_plan.is_empty() {
                self.cursor.pos = Pos::Eval { at: 0, staged: false };
                return Ok(progress);
            }
        }
        self.next_step();
        Ok(progress)
    }

    /// Position the cursor at the state's next step, with nothing gathered.
    pub(super) fn next_step(&mut self) {
        self.cursor.restart(&self.state, &self.plan, self.cfg.accum);
    }
}

impl Cursor {
    /// At `state`'s next step (or done), its gradients zeroed.
    pub fn restart(&mut self, state: &TrainState, plan: &[Vec<crate::data::Batch>], accum: usize) {
        let epoch = state.epoch as usize;
        self.pos = match plan.get(epoch) {
            Some(batches) => {
                let at = state.batch as usize;
                Pos::Train { at, end: batches.len().min(at + accum), staged: false }
            }
            None => Pos::Done,
        };
        for p in self.grads.layers.iter_mut().flatten().flatten() {
            p.a.fill(0.0);
            p.b.fill(0.0);
        }
        (self.loss, self.tokens, self.eval) = (BatchLoss::default(), 0, BatchLoss::default());
        (self.norm_squared, self.norm, self.clip, self.lr) = (0.0, 0.0, None, 0.0);
    }
}

/// The adapter parameters of layers `layer..`.
fn params_from(params: &LoraTensors, layer: usize) -> usize {
    params.layers[layer..].iter().flatten().flatten().map(|p| p.a.len() + p.b.len()).sum()
}
