//! The executor side of the jobs: it holds the run the worker handed over and runs its
//! units, each sized to the time it is offered, on whatever pool it is lent, and cut
//! short at a layer boundary when whoever lent the pool wants it back. Between
//! units it reads the job's control flags (a cancel stops at once; a pause at the next
//! commit point, so no finished step is thrown away), and at each commit point that is
//! due it takes the run's state and reports it, for the worker to write.

use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blink_model::Model;
use blink_runtime::numa::NodePool;

use super::messages::{Control, Msg, Report};
use crate::checkpoint::TrainState;
use crate::run::{Finetune, Outcome, Unit};

/// A job's run in the executor's hands.
pub(crate) struct Active {
    id: String,
    run: Finetune<Arc<Model>>,
    control: Arc<Control>,
    /// Epochs done at the last commit.
    committed_epochs: u64,
}

impl Active {
    pub fn new(id: String, run: Finetune<Arc<Model>>, control: Arc<Control>) -> Active {
        let committed_epochs = run.epochs_done();
        Active { id, run, control, committed_epochs }
    }
}

/// What the executor accepted to run next: the unit and the layers it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub unit: Unit,
    /// For a unit over layers (a forward, backward, gradient norm or update), the layers
    /// it covers (at least one).
    pub layers: usize,
}

/// Runs the jobs' units, fed by the worker.
pub struct Executor {
    incoming: Receiver<Active>,
    reports: Sender<Msg>,
    /// Snapshots the worker has written and handed back, to be filled again: a commit
    /// then copies into buffers that exist instead of allocating tens of megabytes.
    spares: Receiver<Box<TrainState>>,
    active: Option<Active>,
    accepted: Option<Accepted>,
    /// Whether the worker is gone (the service stopped): nothing more will come.
    closed: bool,
    /// How long the last commit's snapshot took: reserved in the offer of a unit that
    /// ends a step.
    commit_time: Duration,
    /// Snapshots handed to the worker and not yet back (being written), and one back.
    writing: usize,
    spare: Option<Box<TrainState>>,
    /// A checkpoint came due while the worker was writing and waits for the next commit
    /// point (whichever step that is).
    held: bool,
}

impl Executor {
    pub(crate) fn new(incoming: Receiver<Active>, reports: Sender<Msg>, spares: Receiver<Box<TrainState>>) -> Executor {
        Executor { incoming, reports, spares, active: None, accepted: None, closed: false, commit_time: Duration::ZERO, writing: 0, spare: None, held: false }
    }

    /// Take the run the worker handed over, if one came.
    fn poll(&mut self) {
        if self.active.is_some() {
            return;
        }
        match self.incoming.try_recv() {
            Ok(a) => self.active = Some(a),
            Err(TryRecvError::Disconnected) => self.closed = true,
            Err(TryRecvError::Empty) => {}
        }
    }

    /// Whether a job's run is waiting for units.
    pub fn has_work(&mut self) -> bool {
        self.poll();
        self.active.is_some()
    }

    /// Block until a run comes; `false` once the service has stopped.
    pub fn wait(&mut self) -> bool {
        while self.active.is_none() {
            match self.incoming.recv() {
                Ok(a) => self.active = Some(a),
                Err(_) => {
                    self.closed = true;
                    return false;
                }
            }
        }
        true
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Send `r` to the worker; when it is gone (the service stopped), the run is dropped
    /// too, so a stopped server's job does not train on unseen.
    fn report(&mut self, r: Report) {
        if self.reports.send(Msg::Report(r)).is_err() {
            self.closed = true;
            self.active = None;
        }
    }

    /// The next unit, sized to `free`: the most layers of a forward, backward, gradient
    /// norm or update whose `price` fits (at least one), or a head that fits whole; `None`
    /// when nothing fits or there is no job. Applies the job's control flags first.
    pub fn offer(&mut self, free: Duration, price: &dyn Fn(&Accepted) -> Duration) -> Option<Accepted> {
        self.poll();
        self.accepted = None;
        let a = self.active.as_mut()?;
        if a.control.cancelled() || (a.control.paused() && a.run.at_commit_point()) {
            if !a.control.cancelled() {
                // A paused job's steps are all committed before it lets go.
                self.commit(true);
            }
            let a = self.active.as_mut()?;
            let id = a.id.clone();
            self.active = None;
            self.report(Report::Released { id });
            return None;
        }
        let unit = match a.run.next_unit() {
            Ok(Some(u)) => u,
            Ok(None) => {
                self.finish();
                return None;
            }
            Err(e) => {
                self.fail(e.to_string());
                return None;
            }
        };
        // The unit that ends a step is followed by its commit (the snapshot's copy).
        let commit_time = self.commit_time;
        let fits = |layers: usize| {
            let ends_step = matches!(unit, Unit::Optimizer { layers: left, .. } if layers >= left);
            fits_with_commit(price(&Accepted { unit, layers }), if ends_step { commit_time } else { Duration::ZERO }, free)
        };
        // A unit over layers takes the most layers whose price fits (it grows with them).
        let layers = match unit {
            Unit::Batch(shape) => shape.layers,
            Unit::GradNorm { layers, .. } | Unit::Optimizer { layers, .. } => layers,
        };
        let accepted = if layers > 0 {
            let (mut lo, mut hi) = (0, layers);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if fits(mid) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            (lo > 0).then_some(Accepted { unit, layers: lo })
        } else {
            fits(0).then_some(Accepted { unit, layers: 0 })
        };
        self.accepted = accepted;
        accepted
    }

    /// Run the unit last accepted on `pool`, one layer at a time, leaving the rest of its
    /// layers for a later unit as soon as `stop` says so; then commit, finish or fail as
    /// the run says. Returns what ran (`None`: nothing) and the time the commit took (zero
    /// if there was none).
    pub fn run(&mut self, pool: &NodePool, stop: &dyn Fn() -> bool) -> (Option<Accepted>, Duration) {
        let (Some(accepted), Some(a)) = (self.accepted.take(), self.active.as_mut()) else { return (None, Duration::ZERO) };
        let outcome = a.run.run_unit_until(pool, accepted.layers.max(1), stop);
        let t = Instant::now();
        let ran = match outcome {
            Ok((Outcome::Finished, _)) => {
                self.finish();
                None
            }
            Ok((_, layers)) => {
                self.commit_if_due();
                if self.active.as_ref().is_some_and(|a| a.run.is_finished()) {
                    self.finish();
                }
                Some(Accepted { layers, ..accepted })
            }
            Err(e) => {
                self.fail(e.to_string());
                None
            }
        };
        (ran, t.elapsed())
    }

    /// At a commit point where a checkpoint is due or an epoch has ended since the last
    /// commit: report the state. A periodic checkpoint waits while the worker still writes
    /// the last one (it runs at a lower priority than the engine's passes): it is taken at
    /// the next commit point instead, and snapshots never pile up. An epoch's end, the
    /// run's end and a pause (`now`) are committed at once.
    fn commit_if_due(&mut self) {
        self.commit(false)
    }

    fn commit(&mut self, now: bool) {
        while let Ok(back) = self.spares.try_recv() {
            self.writing = self.writing.saturating_sub(1);
            self.spare = Some(back);
        }
        let Some(a) = self.active.as_mut() else { return };
        let epochs = a.run.epochs_done();
        let epoch_ended = epochs > a.committed_epochs;
        let due = a.run.checkpoint_due() || (self.held && a.run.at_commit_point() && !a.run.step_saved());
        if !(a.run.at_commit_point() && (due || epoch_ended)) {
            return;
        }
        if self.writing > 0 && !(now || epoch_ended || a.run.is_finished()) {
            self.held = true;
            return;
        }
        self.held = false;
        let t = Instant::now();
        let state = match self.spare.take() {
            Some(mut spare) => {
                a.run.checkpoint_state_into(&mut spare);
                spare
            }
            None => Box::new(a.run.checkpoint_state()),
        };
        self.writing += 1;
        a.run.mark_saved(state.step);
        self.commit_time = t.elapsed();
        let epoch_ended = epoch_ended.then(|| epochs - 1);
        a.committed_epochs = epochs;
        let id = a.id.clone();
        self.report(Report::Commit { id, state, epoch_ended });
    }

    fn finish(&mut self) {
        self.commit_if_due();
        if let Some(a) = self.active.take() {
            self.report(Report::Finished { id: a.id, params: Box::new(a.run.params().clone()), trained_tokens: a.run.trained_tokens() });
        }
    }

    fn fail(&mut self, error: String) {
        if let Some(a) = self.active.take() {
            self.report(Report::Failed { id: a.id, error });
        }
    }
}

/// Whether a unit priced `price`, followed by a commit like the last one (`commit`, zero
/// unless the unit ends a step), fits `free`. The commit counts for at most `free`, so a
/// unit priced zero always fits: that is what an idle engine offers when nothing else fits
/// (see the serving engine's co-training), and one slow commit (a loaded machine, a first
/// snapshot's allocation) must not keep every later step from ending.
fn fits_with_commit(price: Duration, commit: Duration, free: Duration) -> bool {
    price.saturating_add(commit.min(free)) <= free
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_commit_never_keeps_a_zero_priced_unit_out() {
        let ms = Duration::from_millis;
        assert!(fits_with_commit(ms(0), ms(10_000), ms(250)));
        assert!(!fits_with_commit(ms(1), ms(10_000), ms(250)));
        assert!(fits_with_commit(ms(150), ms(100), ms(250)));
        assert!(!fits_with_commit(ms(151), ms(100), ms(250)));
        assert!(!fits_with_commit(Duration::MAX, ms(0), ms(250)));
    }
}
