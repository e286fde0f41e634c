//! A fine-tuning run: what `blink finetune` and a co-served job drive, the same code for
//! both.
//!
//! Each optimizer step runs `accum` packed batches through the trainer, with the loss's
//! gradient weighted by `1 / targets` of the whole step (the mean over its targets), then
//! clips by global norm, sets the scheduled rate and takes an AdamW step. Epoch orders
//! come from the seed, so the whole run is a function of its settings: a run resumed from
//! a checkpoint (taken between steps) ends bit-identical to one never interrupted.
//!
//! The run advances in units (`units`): a few layers of a batch's forward or backward,
//! its loss head, or the optimizer's update, each on a pool lent for it. `blink
//! finetune` runs them back to back ([`Finetune::run`]); a serving engine places them in
//! its steps' slack. The units are the same either way, so the results are too.
//!
//! `init` makes the starting adapter and lists its tensors in the optimizer's order;
//! `curve` writes the loss curve; the checkpoint format is [`crate::checkpoint`]'s.

pub mod curve;
pub mod init;
mod units;

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use blink_model::lora::{LoraError, LoraTarget, LoraTensors};
use blink_model::train::{self, BatchLoss, TrainError, Trainer};
use blink_model::Model;
use blink_runtime::numa::NodePool;
use thiserror::Error;

use crate::checkpoint::{self, CheckpointError, CurvePoint, TrainState};
use crate::data::{pack, pack_epoch, Batch, DataError, Example};
use crate::optim::{AdamW, AdamWConfig, Decay, OptimError, Schedule};

pub use units::{Outcome, Unit};

/// A run's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct FinetuneConfig {
    pub lr: f64,
    pub epochs: u64,
    pub batch_tokens: usize,
    /// Most examples in a batch (`usize::MAX`: as many as fit in `batch_tokens`).
    pub batch_examples: usize,
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
    /// The step's tokens.
    pub tokens: u64,
    /// Tokens trained over the time this process has trained (set by [`Finetune::run`]).
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

/// A run in progress: data, plan, trainer and state. `H` holds the model (`&Model`, or
/// an `Arc<Model>` shared with a serving engine).
pub struct Finetune<H: Deref<Target = Model>> {
    cfg: FinetuneConfig,
    train: Vec<Example>,
    eval: Vec<Example>,
    /// Each epoch's batches, and the evaluation set's.
    plan: Vec<Vec<Batch>>,
    eval_plan: Vec<Batch>,
    total_steps: u64,
    schedule: Schedule,
    trainer: Trainer<H>,
    adam: AdamW,
    state: TrainState,
    /// Where the run is between units, and what the current step has gathered.
    cursor: units::Cursor,
    /// The step of the last checkpoint written (or resumed from).
    saved_step: Option<u64>,
}

impl<H: Deref<Target = Model>> Finetune<H> {
    /// Set a run up from `init`; `fingerprint` names its data, model and settings (a
    /// checkpoint of another run is refused on resume).
    pub fn new(model: H, cfg: FinetuneConfig, train: Vec<Example>, eval: Vec<Example>, init: LoraTensors, fingerprint: String) -> Result<Finetune<H>, FinetuneError> {
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
        let plan = (0..cfg.epochs).map(|e| pack_epoch(&train, cfg.batch_tokens, cfg.batch_examples, cfg.seed, e)).collect::<Result<Vec<_>, _>>()?;
        let eval_plan = if eval.is_empty() { Vec::new() } else { pack(&eval, &(0..eval.len()).collect::<Vec<_>>(), cfg.batch_tokens, cfg.batch_examples)? };
        let total_steps = plan.iter().map(|b| b.len().div_ceil(cfg.accum) as u64).sum();
        let schedule = Schedule::new(cfg.lr, cfg.warmup.min(total_steps), total_steps, cfg.decay)?;
        let trainer = Trainer::new(model, cfg.batch_tokens, init::ranks(&init))?;
        let sizes: Vec<usize> = init::tensors(&init).iter().map(|t| t.len()).collect();
        let adam = AdamW::new(AdamWConfig::new(cfg.lr, cfg.weight_decay), &sizes)?;
        let cursor = units::Cursor::new(&init);
        let state = TrainState { params: init, adam_steps: 0, adam_m: Vec::new(), adam_v: Vec::new(), step: 0, epoch: 0, batch: 0, trained_tokens: 0, curve: Vec::new(), fingerprint };
        let mut run = Finetune { cfg, train, eval, plan, eval_plan, total_steps, schedule, trainer, adam, state, cursor, saved_step: None };
        run.next_step();
        Ok(run)
    }

    pub fn config(&self) -> &FinetuneConfig {
        &self.cfg
    }

    pub fn model(&self) -> &Model {
        self.trainer.model()
    }

    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    /// Optimizer steps done.
    pub fn steps_done(&self) -> u64 {
        self.state.step
    }

    /// Epochs whose every step is done.
    pub fn epochs_done(&self) -> u64 {
        self.state.epoch
    }

    pub fn trained_tokens(&self) -> u64 {
        self.state.trained_tokens
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
    /// Only between optimizer steps (a run just set up, or at a commit point).
    pub fn resume(&mut self, dir: &Path) -> Result<bool, FinetuneError> {
        let Some(state) = checkpoint::load(dir)? else { return Ok(false) };
        if state.fingerprint != self.state.fingerprint || init::ranks(&state.params) != init::ranks(&self.state.params) {
            return Err(FinetuneError::ResumeMismatch(dir.to_owned()));
        }
        self.adam = AdamW::from_state(*self.adam.config(), state.adam_steps, state.adam_m.clone(), state.adam_v.clone())?;
        self.state = state;
        self.state.adam_m = Vec::new();
        self.state.adam_v = Vec::new();
        self.saved_step = Some(self.state.step);
        self.trainer.abandon();
        self.next_step();
        Ok(true)
    }

    /// The loss of the first batch of the first epoch and its gradients for the current
    /// adapter (the mean over its targets), without a step: `--dump-grads`. With dropout,
    /// the batch's masks are those its training step draws.
    pub fn first_batch_gradients(&mut self, pool: &NodePool) -> Result<(BatchLoss, LoraTensors), FinetuneError> {
        self.trainer.abandon();
        self.trainer.set_dropout(self.dropout_for(0, 0))?;
        let batch = &self.plan[0][0];
        let examples = examples_of(batch, &self.train);
        let targets: usize = batch.examples.iter().map(|&i| self.train[i].n_targets()).sum();
        let mut grads = train::zeros_like(&self.state.params);
        let loss = self.trainer.step(pool, &examples, &self.state.params, Some((&mut grads, 1.0 / targets.max(1) as f32)))?;
        self.next_step();
        Ok((loss, grads))
    }

    /// Run (or finish) the run on `pool`, unit after unit, checkpointing into `dir` as
    /// asked.
    pub fn run(&mut self, pool: &NodePool, dir: &Path, observer: &mut dyn Observer) -> Result<Summary, FinetuneError> {
        let started = Instant::now();
        let mut tokens_here = 0u64;
        loop {
            match self.run_unit(pool, usize::MAX)? {
                Outcome::Working => {}
                Outcome::Stepped(mut progress) => {
                    tokens_here += progress.tokens;
                    progress.elapsed = started.elapsed();
                    progress.tokens_per_s = tokens_here as f64 / progress.elapsed.as_secs_f64().max(1e-9);
                    observer.step(&progress);
                }
                Outcome::Evaluated { epoch, loss, accuracy } => observer.eval(epoch, loss, accuracy),
                Outcome::Finished => break,
            }
            if self.checkpoint_due() {
                self.save_checkpoint(dir)?;
                observer.checkpoint(self.state.step);
            }
        }
        if self.checkpoint_due() {
            self.save_checkpoint(dir)?;
            observer.checkpoint(self.state.step);
        }
        let secs = started.elapsed().as_secs_f64();
        Ok(Summary { tokens_per_s: if secs > 0.0 { tokens_here as f64 / secs } else { 0.0 }, ..self.summary() })
    }

    /// The run's figures so far (without a rate: that depends on who timed it).
    pub fn summary(&self) -> Summary {
        let last = self.state.curve.last();
        let last_eval = self.state.curve.iter().rev().find(|p| p.eval_loss.is_some());
        Summary {
            steps: self.state.step,
            trained_tokens: self.state.trained_tokens,
            tokens_per_s: 0.0,
            train_loss: last.map(|p| p.train_loss),
            eval_loss: last_eval.and_then(|p| p.eval_loss),
            eval_accuracy: last_eval.and_then(|p| p.eval_accuracy),
        }
    }

    /// Whether a checkpoint is due: the run is between optimizer steps, `checkpoint_every`
    /// steps have passed since the last one (or the run is over), and none was written
    /// at this step.
    pub fn checkpoint_due(&self) -> bool {
        let Some(every) = self.cfg.checkpoint_every.filter(|&n| n > 0) else { return false };
        self.at_commit_point() && self.saved_step != Some(self.state.step) && (self.state.step.is_multiple_of(every) || self.is_finished())
    }

    /// Whether the current step is the last one saved (or handed over to be saved).
    pub fn step_saved(&self) -> bool {
        self.saved_step == Some(self.state.step)
    }

    /// Whether every unit has run.
    pub fn is_finished(&self) -> bool {
        self.cursor.is_done()
    }

    /// Whether the run is between optimizer steps (and their evaluation): what a
    /// checkpoint taken now holds is a committed step.
    pub fn at_commit_point(&self) -> bool {
        self.cursor.at_commit_point()
    }

    /// The run's state to checkpoint now (the optimizer's moments included): call at a
    /// commit point, then [`Finetune::mark_saved`] once it is durably written.
    pub fn checkpoint_state(&self) -> TrainState {
        let mut state = TrainState { params: self.state.params.clone(), adam_m: Vec::new(), adam_v: Vec::new(), curve: Vec::new(), fingerprint: String::new(), ..self.state };
        self.checkpoint_state_into(&mut state);
        state
    }

    /// As [`Finetune::checkpoint_state`], into `dst`, reusing its buffers (a co-served
    /// job's commit then allocates nothing once its two snapshots exist).
    pub fn checkpoint_state_into(&self, dst: &mut TrainState) {
        let s = &self.state;
        copy_tensors(&mut dst.params, &s.params);
        (dst.step, dst.epoch, dst.batch, dst.trained_tokens) = (s.step, s.epoch, s.batch, s.trained_tokens);
        dst.curve.clone_from(&s.curve);
        dst.fingerprint.clone_from(&s.fingerprint);
        dst.adam_steps = self.adam.steps();
        let n = self.adam.n_tensors();
        dst.adam_m.resize_with(n, Vec::new);
        dst.adam_v.resize_with(n, Vec::new);
        for i in 0..n {
            let (m, v) = self.adam.moments(i).expect("a moment per tensor");
            dst.adam_m[i].clear();
            dst.adam_m[i].extend_from_slice(m);
            dst.adam_v[i].clear();
            dst.adam_v[i].extend_from_slice(v);
        }
    }

    /// A checkpoint of step `step` has been written.
    pub fn mark_saved(&mut self, step: u64) {
        self.saved_step = Some(step);
    }

    /// Write the checkpoint into `dir` now.
    pub fn save_checkpoint(&mut self, dir: &Path) -> Result<(), FinetuneError> {
        checkpoint::save(dir, &self.checkpoint_state())?;
        self.mark_saved(self.state.step);
        Ok(())
    }

    /// Batch `index` of `epoch`'s dropout: its seed a function of the run's seed and the
    /// batch's place, so a resumed run draws the masks an uninterrupted one would.
    fn dropout_for(&self, epoch: usize, index: usize) -> Option<train::Dropout> {
        const DROPOUT_SALT: u64 = 0xBB67_AE85_84CA_A73B;
        let place = train::mix64((epoch as u64) << 32 | index as u64);
        (self.cfg.dropout > 0.0).then(|| train::Dropout { p: self.cfg.dropout, seed: train::mix64(self.cfg.seed ^ DROPOUT_SALT ^ place) })
    }
}

/// A name for a run's data, model, starting adapter and settings (FNV-1a over them; the
/// model by path and size), so a checkpoint of another run is refused on resume. `extra`
/// adds settings outside [`FinetuneConfig`] that change the result (the output format).
pub fn fingerprint(model: &Path, train: &[Example], eval: &[Example], params: &LoraTensors, cfg: &FinetuneConfig, extra: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    let size = std::fs::metadata(model).map(|m| m.len()).unwrap_or(0);
    eat(format!("{}|{size}", model.display()).as_bytes());
    for e in train.iter().chain(eval) {
        e.tokens.iter().for_each(|t| eat(&t.to_le_bytes()));
        e.targets.iter().for_each(|&t| eat(&[u8::from(t)]));
        eat(b";");
    }
    for t in init::tensors(params) {
        t.iter().for_each(|v| eat(&v.to_bits().to_le_bytes()));
    }
    let settings = FinetuneConfig { checkpoint_every: None, ..cfg.clone() };
    eat(format!("{settings:?}|{extra}|{}", params.alpha).as_bytes());
    format!("{h:016x}")
}

/// `dst` becomes a copy of `src`, in `dst`'s buffers when the pairs' shapes agree.
fn copy_tensors(dst: &mut LoraTensors, src: &LoraTensors) {
    let same = dst.layers.len() == src.layers.len()
        && dst.layers.iter().zip(&src.layers).all(|(a, b)| a.iter().zip(b).all(|(p, q)| match (p, q) {
            (Some(p), Some(q)) => p.a.len() == q.a.len() && p.b.len() == q.b.len(),
            (None, None) => true,
            _ => false,
        }));
    if !same {
        *dst = src.clone();
        return;
    }
    (dst.format, dst.alpha, dst.rslora) = (src.format, src.alpha, src.rslora);
    for (a, b) in dst.layers.iter_mut().flatten().zip(src.layers.iter().flatten()) {
        if let (Some(p), Some(q)) = (a, b) {
            (p.rank, p.rows, p.cols) = (q.rank, q.rows, q.cols);
            p.a.copy_from_slice(&q.a);
            p.b.copy_from_slice(&q.b);
        }
    }
}

fn examples_of<'e>(batch: &Batch, set: &'e [Example]) -> Vec<train::Example<'e>> {
    batch.examples.iter().map(|&i| train::Example { tokens: &set[i].tokens, targets: &set[i].targets }).collect()
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
