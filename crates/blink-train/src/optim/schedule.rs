//! The learning-rate schedule: linear warm-up from 0, then constant, linear or cosine decay
//! to 0 at the last step, as Hugging Face transformers' `get_constant_schedule_with_warmup`,
//! `get_linear_schedule_with_warmup` and `get_cosine_schedule_with_warmup` (one half-cycle).
//!
//! [`Schedule::lr`] takes transformers' `current_step`: the number of optimizer steps
//! already taken. With the scheduler stepped after each optimizer step, as there, update
//! `k` (1-based) uses `lr(k - 1)`, so with warm-up the first update has rate 0, the rate
//! peaks at update `warmup + 1` and decay reaches 0 at `lr(total)`, just past the last update.
//! Factor at step `s` (`w` = warmup, `T` = total):
//! - `s < w`: `s / w`;
//! - constant: 1;
//! - linear: `(T - s) / max(1, T - w)`;
//! - cosine: `0.5 · (1 + cos(π · p))`, `p = (s - w) / max(1, T - w)`.
//!
//! Past `T` the decaying schedules stay at 0 (transformers' cosine would rise again).

use std::f64::consts::PI;

use super::OptimError;

/// What the rate does after warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decay {
    Constant,
    Linear,
    Cosine,
}

/// A learning-rate schedule over a run of `total` optimizer steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    peak_lr: f64,
    warmup: u64,
    total: u64,
    decay: Decay,
}

impl Schedule {
    /// Peak rate `peak_lr` (finite, ≥ 0), reached after `warmup` steps (≤ `total`, which is ≥ 1).
    pub fn new(peak_lr: f64, warmup: u64, total: u64, decay: Decay) -> Result<Schedule, OptimError> {
        if !(peak_lr.is_finite() && peak_lr >= 0.0) {
            return Err(OptimError::Setting(format!("the learning rate is {peak_lr}")));
        }
        if total == 0 {
            return Err(OptimError::Setting("a run of 0 steps".into()));
        }
        if warmup > total {
            return Err(OptimError::Setting(format!("{warmup} warm-up steps in a run of {total}")));
        }
        Ok(Schedule { peak_lr, warmup, total, decay })
    }

    pub fn peak_lr(&self) -> f64 {
        self.peak_lr
    }

    pub fn warmup(&self) -> u64 {
        self.warmup
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn decay(&self) -> Decay {
        self.decay
    }

    /// The rate once `step` optimizer steps have been taken.
    pub fn lr(&self, step: u64) -> f64 {
        self.peak_lr * self.factor(step)
    }

    /// The rate's fraction of the peak once `step` optimizer steps have been taken.
    pub fn factor(&self, step: u64) -> f64 {
        if step < self.warmup {
            return step as f64 / self.warmup as f64;
        }
        let span = (self.total - self.warmup).max(1) as f64;
        let after = (step - self.warmup) as f64;
        match self.decay {
            Decay::Constant => 1.0,
            Decay::Linear => ((self.total as f64 - step as f64) / span).max(0.0),
            Decay::Cosine => {
                let progress = (after / span).min(1.0);
                (0.5 * (1.0 + (PI * progress).cos())).max(0.0)
            }
        }
    }
}
