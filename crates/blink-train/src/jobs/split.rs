//! The static split: the jobs' units run back to back on a thread and pool of their own,
//! beside a serving engine that never sees them (the analogue of a trainer process beside
//! an inference server). It is co-serving's baseline, and how a server without an engine
//! hook trains.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use blink_model::Model;
use blink_runtime::numa::NodePool;

use super::units::Executor;

/// The thread that runs the jobs' units on its own pool.
pub struct SplitTrainer {
    thread: Option<JoinHandle<()>>,
}

impl SplitTrainer {
    /// Start the thread; `pool` is its compute (its threads should not share cores with
    /// the engine's). It stops when the job service does.
    pub fn start(mut executor: Executor, model: Arc<Model>, pool: NodePool) -> std::io::Result<SplitTrainer> {
        let thread = std::thread::Builder::new().name("blink-split-train".into()).spawn(move || {
            let _model = model; // the pool's steps read it
            while executor.wait() {
                while executor.offer(Duration::MAX, &|_| Duration::ZERO).is_some() {
                    executor.run(&pool);
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
