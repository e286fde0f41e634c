//! The static split: the jobs' units run back to back on a thread and pool of their own,
//! beside a serving engine that never sees them (the analogue of a trainer process beside
//! an inference server). It is co-serving's baseline, and how a server without an engine
//! hook trains.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blink_model::Model;
use blink_runtime::numa::NodePool;

use super::units::{Accepted, Executor};

/// The most layers of a unit when the split trainer has less than the whole of its CPUs.
pub const SHARED_UNIT_LAYERS: usize = 4;

/// The thread that runs the jobs' units on its own pool.
pub struct SplitTrainer {
    thread: Option<JoinHandle<()>>,
}

impl SplitTrainer {
    /// Start the thread; `pool` is its compute (its threads should not share cores with
    /// the engine's). It trains `share` of the time (1: back to back; below, in units of at
    /// most [`SHARED_UNIT_LAYERS`] layers, each followed by a pause that keeps it to that
    /// share, as a trainer given a fixed slice of a shared machine). It stops when the job
    /// service does.
    pub fn start(mut executor: Executor, model: Arc<Model>, pool: NodePool, share: f64) -> std::io::Result<SplitTrainer> {
        let share = if share.is_finite() { share.clamp(0.01, 1.0) } else { 1.0 };
        let thread = std::thread::Builder::new().name("blink-split-train".into()).spawn(move || {
            let _model = model; // the pool's steps read it
            let price = |a: &Accepted| if share < 1.0 && a.layers > SHARED_UNIT_LAYERS { Duration::MAX } else { Duration::ZERO };
            while executor.wait() {
                while executor.offer(Duration::from_secs(3600), &price).is_some() {
                    let t = Instant::now();
                    executor.run(&pool, &|| false);
                    if share < 1.0 {
                        std::thread::sleep(t.elapsed().mul_f64((1.0 - share) / share));
                    }
                }
            }
        })?;
        Ok(SplitTrainer { thread: Some(thread) })
    }
}

impl Drop for SplitTrainer {
    fn drop(&mut self) {
        // The thread ends once the service (and with it the worker) has stopped; a run in
        // the middle of a unit finishes the unit first.
        if let Some(t) = self.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}
