//! What passes between the jobs' worker thread and their executor on the engine thread:
//! the worker's mailbox (`Msg`), what the executor reports of the run it holds (`Report`),
//! and the control flags the HTTP side sets on a job (`Control`), which the executor reads
//! between units.

use std::sync::atomic::{AtomicBool, Ordering};

use blink_model::lora::LoraTensors;

use crate::checkpoint::TrainState;

/// What the HTTP side asks of a job the executor may be running; read at unit bounds.
#[derive(Default, Debug)]
pub(crate) struct Control {
    pause: AtomicBool,
    cancel: AtomicBool,
}

impl Control {
    pub fn pause(&self) {
        self.pause.store(true, Ordering::Release);
    }

    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    pub fn paused(&self) -> bool {
        self.pause.load(Ordering::Acquire)
    }

    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    pub(super) fn unpause(&self) {
        self.pause.store(false, Ordering::Release);
    }
}

/// What reaches the worker.
pub(crate) enum Msg {
    /// Something changed in the store (a new job, a pause, a resume...).
    Wake,
    Stop,
    Report(Report),
}

/// What the executor reports about the job it runs.
pub(crate) enum Report {
    /// A step to commit: the run's state at a commit point, and the epoch that ended
    /// with it, if one did.
    Commit { id: String, state: Box<TrainState>, epoch_ended: Option<u64> },
    /// The run is over; its adapter.
    Finished { id: String, params: Box<LoraTensors>, trained_tokens: u64 },
    Failed { id: String, error: String },
    /// The executor let the job go (paused or cancelled).
    Released { id: String },
}
