//! A fine-tuning run: the loop `blink finetune` (and, later, a co-served job) drives.
//!
//! Each optimizer step runs `accum` packed batches through the trainer, with the loss's
//! gradient weighted by `1 / targets` of the whole step (the mean over its targets), then
//! clips by global norm, sets the scheduled rate and takes an AdamW step. Epoch orders
//! come from the seed, so the whole run is a function of its settings: a run resumed from
//! a checkpoint (taken between steps) ends bit-identical to one never interrupted.
//!
//! `init` makes the starting adapter and lists its tensors in the optimizer's order;
//! `curve` writes the loss curve; the checkpoint format is [`crate::checkpoint`]'s.

pub mod curve;
pub mod init;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use blink_model::lora::{LoraError, LoraTarget, LoraTensors};
use blink_model::train::{self, mix64, BatchLoss, Dropout, TrainError, Trainer};
use blink_model::Model;
use thiserror::Error;

use crate::checkpoint::{self, CheckpointError, CurvePoint, TrainState};
use crate::data::{pack, pack_epoch, Batch, DataError, Example};
use crate::optim::{clip_grad_norm, AdamW, AdamWConfig, Decay, OptimError, Schedule};

/// A run's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct FinetuneConfig {
    pub lr: f64,
    pub epochs: u64,
    pub batch_tokens: usize,
    /// Batches per optimizer step.
    pub accum: usize,
    pub warmup: u64,
    pub decay: Decay,
    pub weight_decay: f64,
    /// Clip the gradients' global norm to this (`None`: no clipping).
    pub clip: Option<f64>,
    /// The dropout on each adapter pair's input (0: none); each batch draws its own masks.
    pub dropout: f32,
    pub seed: u64,
    pub threads: usize,
    /// Write a checkpoint every this many steps (and at the end).
    pub checkpoint_every: Option<u64>,
}

/// Why a run could not start or go on.
#[derive(Debug, Error)]
pub enum FinetuneError {
    #[error("{0}")]
    Setting(String),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Optim(#[from] OptimError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Adapter(#[from] LoraError),
    #[error("writing {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("the checkpoint in {0} was made by a run with other data, model or settings; start afresh in another directory, or drop --resume")]
    ResumeMismatch(PathBuf),
}

/// What a step reports to whoever watches the run.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub step: u64,
    pub total_steps: u64,
    pub epoch: u64,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    /// Tokens trained over the time this process has trained.
    pub tokens_per_s: f64,
    pub elapsed: Duration,
}

/// Whoever watches a run: the CLI's progress bar, a job's event log.
pub trait Observer {
    fn step(&mut self, progress: &Progress);
    fn eval(&mut self, _epoch: u64, _loss: f64, _accuracy: f64) {}
    fn checkpoint(&mut self, _step: u64) {}
}

/// The run's result, for `--json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub steps: u64,
    pub trained_tokens: u64,
    pub tokens_per_s: f64,
    pub train_loss: Option<f64>,
    pub eval_loss: Option<f64>,
    pub eval_accuracy: Option<f64>,
}

/// A run in progress: data, plan, trainer and state.
pub struct Finetune<'m> {
    cfg: FinetuneConfig,
    train: Vec<Example>,
    eval: Vec<Example>,
    /// Each epoch's batches.
    plan: Vec<Vec<Batch>>,
    total_steps: u64,
    schedule: Schedule,
    trainer: Trainer<'m>,
    adam: AdamW,
    state: TrainState,
}

impl<'m> Finetune<'m> {
    /// Set a run up from `init`; `fingerprint` names its data, model and settings (a
    /// checkpoint of another run is refused on resume).
    pub fn new(model: &'m Model, cfg: FinetuneConfig, train: Vec<Example>, eval: Vec<Example>, init: LoraTensors, fingerprint: String) -> Result<Finetune<'m>, FinetuneError> {
        if cfg.epochs == 0 || cfg.accum == 0 {
            return Err(FinetuneError::Setting("--epochs and --accum must be at least 1".into()));
        }
        if !cfg.lr.is_finite() || cfg.lr <= 0.0 {
            return Err(FinetuneError::Setting(format!("the learning rate must be a positive number, not {}", cfg.lr)));
        }
        if !(0.0..1.0).contains(&cfg.dropout) {
            return Err(FinetuneError::Setting(format!("--dropout must be in [0, 1), not {}", cfg.dropout)));
        }
        if let Some(c) = cfg.clip.filter(|c| !(c.is_finite() && *c > 0.0)) {
            return Err(FinetuneError::Setting(format!("--clip must be a positive number, not {c}")));
        }
        let plan = (0..cfg.epochs).map(|e| pack_epoch(&train, cfg.batch_tokens, cfg.seed, e)).collect::<Result<Vec<_>, _>>()?;
        if !eval.is_empty() {
            pack(&eval, &(0..eval.len()).collect::<Vec<_>>(), cfg.batch_tokens)?;
        }
        let total_steps = plan.iter().map(|b| b.len().div_ceil(cfg.accum) as u64).sum();
        let schedule = Schedule::new(cfg.lr, cfg.warmup.min(total_steps), total_steps, cfg.decay)?;
        let trainer = Trainer::new(model, cfg.threads, cfg.batch_tokens, init::ranks(&init))?;
        let sizes: Vec<usize> = init::tensors(&init).iter().map(|t| t.len()).collect();
        let adam = AdamW::new(AdamWConfig::new(cfg.lr, cfg.weight_decay), &sizes)?;
        let state = TrainState { params: init, adam_steps: 0, adam_m: Vec::new(), adam_v: Vec::new(), step: 0, epoch: 0, batch: 0, trained_tokens: 0, curve: Vec::new(), fingerprint };
        Ok(Finetune { cfg, train, eval, plan, total_steps, schedule, trainer, adam, state })
    }

    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    /// The adapter as trained so far.
    pub fn params(&self) -> &LoraTensors {
        &self.state.params
    }

    pub fn curve(&self) -> &[CurvePoint] {
        &self.state.curve
    }

    /// Bytes the trainer's buffers hold (saved activations and work space).
    pub fn buffer_bytes(&self) -> usize {
        self.trainer.buffer_bytes()
    }

    /// Continue from the checkpoint in `dir`, if there is one; returns whether there was.
    pub fn resume(&mut self, dir: &Path) -> Result<bool, FinetuneError> {
        let Some(state) = checkpoint::load(dir)? else { return Ok(false) };
        if state.fingerprint != self.state.fingerprint || init::ranks(&state.params) != init::ranks(&self.state.params) {
            return Err(FinetuneError::ResumeMismatch(dir.to_owned()));
        }
        self.adam = AdamW::from_state(*self.adam.config(), state.adam_steps, state.adam_m.clone(), state.adam_v.clone())?;
        self.state = state;
        Ok(true)
    }

    /// The loss of the first batch of the first epoch and its gradients for the current
    /// adapter (the mean over its targets), without a step: `--dump-grads`. With dropout,
    /// the batch's masks are those its training step draws.
    pub fn first_batch_gradients(&mut self) -> Result<(BatchLoss, LoraTensors), FinetuneError> {
        self.trainer.set_dropout(self.dropout_for(0, 0))?;
        let batch = &self.plan[0][0];
        let examples = self.examples_of(batch, &self.train);
        let targets: usize = batch.examples.iter().map(|&i| self.train[i].n_targets()).sum();
        let mut grads = train::zeros_like(&self.state.params);
        let loss = self.trainer.step(&examples, &self.state.params, Some((&mut grads, 1.0 / targets.max(1) as f32)))?;
        Ok((loss, grads))
    }

    fn examples_of<'e>(&self, batch: &Batch, set: &'e [Example]) -> Vec<train::Example<'e>> {
        batch.examples.iter().map(|&i| train::Example { tokens: &set[i].tokens, targets: &set[i].targets }).collect()
    }

    /// The evaluation set's mean loss and token accuracy with the current adapter.
    pub fn evaluate(&mut self) -> Result<Option<(f64, f64)>, FinetuneError> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let batches = pack(&self.eval, &(0..self.eval.len()).collect::<Vec<_>>(), self.cfg.batch_tokens)?;
        self.trainer.set_dropout(None)?;
        let mut total = BatchLoss::default();
        for b in &batches {
            let examples = self.examples_of(b, &self.eval);
            total.add(self.trainer.step(&examples, &self.state.params, None)?);
        }
        Ok(Some((total.mean(), total.correct as f64 / total.targets.max(1) as f64)))
    }

    /// Run (or finish) the run, checkpointing into `dir` as asked.
    pub fn run(&mut self, dir: &Path, observer: &mut dyn Observer) -> Result<Summary, FinetuneError> {
        let started = Instant::now();
        let mut tokens_here = 0u64;
        while (self.state.epoch as usize) < self.plan.len() {
            let epoch = self.state.epoch as usize;
            let n_batches = self.plan[epoch].len();
            let first = self.state.batch as usize;
            let last = (first + self.cfg.accum).min(n_batches);
            let (loss, tokens, grad_norm, lr) = self.optimizer_step(epoch, first..last)?;
            tokens_here += tokens;
            self.state.step += 1;
            self.state.trained_tokens += tokens;
            self.state.batch = last as u64;
            let epoch_done = last == n_batches;
            self.state.curve.push(CurvePoint { step: self.state.step, epoch: epoch as u64, train_loss: loss, lr, tokens: self.state.trained_tokens, eval_loss: None, eval_accuracy: None });
            let elapsed = started.elapsed();
            let progress = Progress { step: self.state.step, total_steps: self.total_steps, epoch: epoch as u64, loss, lr, grad_norm, tokens_per_s: tokens_here as f64 / elapsed.as_secs_f64().max(1e-9), elapsed };
            observer.step(&progress);
            if epoch_done {
                self.state.epoch += 1;
                self.state.batch = 0;
                if let Some((loss, acc)) = self.evaluate()? {
                    let p = self.state.curve.last_mut().expect("a point was just pushed");
                    (p.eval_loss, p.eval_accuracy) = (Some(loss), Some(acc));
                    observer.eval(epoch as u64, loss, acc);
                }
            }
            let finished = self.state.epoch as usize == self.plan.len();
            if self.cfg.checkpoint_every.is_some_and(|n| n > 0 && (self.state.step.is_multiple_of(n) || finished)) {
                self.save_checkpoint(dir)?;
                observer.checkpoint(self.state.step);
            }
        }
        let secs = started.elapsed().as_secs_f64();
        let last = self.state.curve.last();
        let last_eval = self.state.curve.iter().rev().find(|p| p.eval_loss.is_some());
        Ok(Summary {
            steps: self.state.step,
            trained_tokens: self.state.trained_tokens,
            tokens_per_s: if secs > 0.0 { tokens_here as f64 / secs } else { 0.0 },
            train_loss: last.map(|p| p.train_loss),
            eval_loss: last_eval.and_then(|p| p.eval_loss),
            eval_accuracy: last_eval.and_then(|p| p.eval_accuracy),
        })
    }

    /// One optimizer step over batches `range` of `epoch`: (mean loss, tokens, gradient
    /// norm before clipping, rate used).
    fn optimizer_step(&mut self, epoch: usize, range: std::ops::Range<usize>) -> Result<(f64, u64, f64, f64), FinetuneError> {
        let batches = &self.plan[epoch][range.clone()];
        let targets: usize = batches.iter().flat_map(|b| &b.examples).map(|&i| self.train[i].n_targets()).sum();
        let weight = 1.0 / targets.max(1) as f32;
        let mut grads = train::zeros_like(&self.state.params);
        let mut loss = BatchLoss::default();
        let mut tokens = 0u64;
        for (b, index) in batches.iter().zip(range) {
            self.trainer.set_dropout(self.dropout_for(epoch, index))?;
            let examples = self.examples_of(b, &self.train);
            loss.add(self.trainer.step(&examples, &self.state.params, Some((&mut grads, weight)))?);
            tokens += b.tokens as u64;
        }
        let mut g = init::tensors_mut(&mut grads);
        let norm = match self.cfg.clip {
            Some(max) => clip_grad_norm(&mut g, max)?,
            None => crate::optim::grad_norm(&g),
        };
        if !norm.is_finite() {
            return Err(OptimError::NonFinite(norm).into());
        }
        let lr = self.schedule.lr(self.state.step);
        self.adam.set_lr(lr)?;
        let g: Vec<&[f32]> = g.into_iter().map(|s| &*s).collect();
        self.adam.step(&mut init::tensors_mut(&mut self.state.params), &g)?;
        Ok((loss.mean(), tokens, norm, lr))
    }

    /// Batch `index` of `epoch`'s dropout: its seed a function of the run's seed and the
    /// batch's place, so a resumed run draws the masks an uninterrupted one would.
    fn dropout_for(&self, epoch: usize, index: usize) -> Option<Dropout> {
        const DROPOUT_SALT: u64 = 0xBB67_AE85_84CA_A73B;
        let place = mix64((epoch as u64) << 32 | index as u64);
        (self.cfg.dropout > 0.0).then(|| Dropout { p: self.cfg.dropout, seed: mix64(self.cfg.seed ^ DROPOUT_SALT ^ place) })
    }

    fn save_checkpoint(&mut self, dir: &Path) -> Result<(), FinetuneError> {
        self.state.adam_steps = self.adam.steps();
        (self.state.adam_m, self.state.adam_v) = (0..self.adam.n_tensors()).map(|i| self.adam.moments(i).map(|(m, v)| (m.to_vec(), v.to_vec())).expect("a moment per tensor")).unzip();
        checkpoint::save(dir, &self.state)?;
        // The moments live in the optimizer; the state keeps only the saved copy's place.
        (self.state.adam_m, self.state.adam_v) = (Vec::new(), Vec::new());
        Ok(())
    }
}

/// The targets named on the command line (`q,k,v,o,gate,up,down`, or `all`).
pub fn parse_targets(s: &str) -> Result<Vec<LoraTarget>, String> {
    if s.trim() == "all" {
        return Ok(LoraTarget::ALL.to_vec());
    }
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let t = LoraTarget::from_name(name).ok_or_else(|| format!("unknown target '{name}' (use q, k, v, o, gate, up, down)"))?;
        if !out.contains(&t) {
            out.push(t);
        }
    }
    if out.is_empty() {
        return Err("no targets given".into());
    }
    Ok(out)
}
