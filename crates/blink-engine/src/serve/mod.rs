//! Continuous batching: one engine thread runs iteration-level scheduling over all
//! requests, packing decode rows and chunks of pending prefills into each step, on a pool
//! of compute threads of its own; it builds the next step while the current one computes.
//!
//! Front ends talk to it through [`Engine`] (cheap to clone): `submit` a [`Request`], read
//! [`Event`]s from the [`Submission`]. Requests and events cross between the front end's
//! threads and the engine thread through channels; the engine thread never blocks on a
//! client.
//!
//! The engine is split as the field splits it: `schedule` writes each step's plan
//! (`plan`, plain data) through an admission policy (`policy`), `execute` runs it,
//! `update` folds its output back into the sequences (`sequence`, a small state machine
//! with the scheduler as its one writer), and `step_loop` is those three calls, pipelined.
//! `api` holds the types front ends see. Co-served training plugs in through one hook
//! (`coserve`), given each step the time the latency model (`latency`) says is free.

mod api;
pub mod coserve;
mod cotrain;
mod execute;
pub mod latency;
mod plan;
pub mod policy;
mod schedule;
mod sequence;
mod step_loop;
mod update;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use blink_model::{KvType, Model};
use tokio::sync::mpsc as tmpsc;

use crate::EngineError;

pub use api::{EngineStats, Event, LatencyKindStats, Request, SubmitError, TokenLogprobs, Usage};
pub use coserve::{CoServe, SloTargets, TrainingPolicy, UnitRun};
pub use execute::{RemoteHealth, RemoteSteps, TableSync};
pub use plan::{Chunk, StepCost, StepPlan};

/// Sizes and limits of the serving engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Compute threads.
    pub n_threads: usize,
    /// Token capacity of the KV cache over all sequences (the memory budget).
    pub kv_tokens: usize,
    /// Longest sequence (prompt + generated) one request may have.
    pub max_seq_len: usize,
    /// Prompt tokens evaluated per step (chunked prefill budget).
    pub step_tokens: usize,
    /// Most sequences running at once.
    pub max_running: usize,
    /// Most adapter mixes in one step; rows of others wait for a later step.
    pub max_loras: usize,
    /// Most requests waiting for admission beyond the free sequence slots; more are
    /// refused with `QueueFull`.
    pub max_queue: usize,
    pub kv_type: KvType,
    /// Keep every position of the sliding-window layers, as llama.cpp's `--swa-full` does
    /// (so any cached prefix can be attached; otherwise blocks a whole window back give their pages there back to the OS).
    pub swa_full: bool,
    /// Reuse the KV blocks of shared prompt prefixes.
    pub prefix_cache: bool,
    /// Most tokens the prefix cache keeps in blocks no running sequence owns (`None`: a
    /// quarter of `kv_tokens`); past it the least recently released blocks are freed, and
    /// the memory of free blocks goes back to the OS.
    pub prefix_cache_tokens: Option<usize>,
    /// The requests' latency targets, which co-served training must leave them.
    pub slo: SloTargets,
    /// How much of a step co-served training may have.
    pub training: TrainingPolicy,
    /// The latency model's offline coefficients (`blink calibrate`); `None`: start
    /// uncalibrated and learn online.
    pub latency: Option<latency::Coefficients>,
}

impl EngineConfig {
    /// The runner's sizes for the engine's steps: `step_tokens + max_running` rows (every
    /// running sequence's decode row, and a full prompt budget), a logit row per running
    /// sequence.
    pub fn runner_config(&self, detached: bool) -> crate::RunnerConfig {
        crate::RunnerConfig {
            threads: self.n_threads,
            kv_tokens: self.kv_tokens,
            kv_type: self.kv_type,
            max_rows: self.step_tokens.saturating_add(self.max_running),
            max_logit_rows: self.max_running,
            max_ctx: self.max_seq_len,
            swa_full: self.swa_full,
            detached,
        }
    }

    /// Tokens of blocks without owners the prefix cache keeps.
    pub fn cached_tokens_limit(&self) -> usize {
        match (self.prefix_cache, self.prefix_cache_tokens) {
            (false, _) => 0,
            (true, Some(tokens)) => tokens,
            (true, None) => self.kv_tokens / 4,
        }
    }
}

/// What the front end sends to the engine thread.
enum Command {
    Submit { request: Request, events: tmpsc::UnboundedSender<Event>, at: Instant },
    /// Look for training work again.
    Wake,
    Shutdown,
}

/// Requests submitted but not yet admitted, and sequences running: `submit` reads them to
/// bound the queue, the engine thread moves requests from one to the other (counting a
/// request as running before it stops counting it as waiting, so `submit` never sees room
/// that is not there).
#[derive(Default)]
struct Occupancy {
    waiting: AtomicU64,
    running: AtomicU64,
}

struct Shared {
    commands: Mutex<mpsc::Sender<Command>>,
    stats: Arc<Mutex<EngineStats>>,
    occupancy: Arc<Occupancy>,
    next_id: AtomicU64,
    config: EngineConfig,
    capacity_tokens: usize,
    thread: Mutex<Option<JoinHandle<()>>>,
    remote_health: Option<RemoteHealth>,
}

/// A handle to the engine thread. Clones share the engine; it stops when the last one drops.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

/// A submitted request's event stream. Dropping it cancels the request.
pub struct Submission {
    pub id: u64,
    events: tmpsc::UnboundedReceiver<Event>,
}

impl Submission {
    /// The next event; `None` once the request has finished or failed.
    pub async fn next(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// As `next`, blocking the calling (non-async) thread.
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.events.blocking_recv()
    }
}

impl Engine {
    /// Start the engine thread for `model`; `eog` are the end-of-generation token ids.
    /// Fails if the cache and buffers `config` asks for cannot be allocated, or the queue
    /// could hold no request.
    pub fn start(model: Arc<Model>, eog: Vec<u32>, config: EngineConfig) -> Result<Engine, EngineError> {
        Engine::start_with(model, eog, config, None)
    }

    /// As [`Engine::start`], with training co-served in the steps' slack through `coserve`.
    pub fn start_with(model: Arc<Model>, eog: Vec<u32>, config: EngineConfig, coserve: Option<Box<dyn CoServe>>) -> Result<Engine, EngineError> {
        Engine::start_inner(model, eog, config, coserve, None)
    }

    /// As [`Engine::start`], its steps running on `remote` (a ring of devices; `model`
    /// is the head's share), up to `in_flight` steps of different sequences at once. The
    /// devices' caches follow the bookkeeping's block tables, so prompt prefixes are shared
    /// there as here. Nothing is co-served.
    pub fn start_remote(model: Arc<Model>, eog: Vec<u32>, config: EngineConfig, remote: Box<dyn RemoteSteps>, in_flight: usize) -> Result<Engine, EngineError> {
        Engine::start_inner(model, eog, config, None, Some((remote, in_flight)))
    }

    fn start_inner(model: Arc<Model>, eog: Vec<u32>, config: EngineConfig, coserve: Option<Box<dyn CoServe>>, remote: Option<(Box<dyn RemoteSteps>, usize)>) -> Result<Engine, EngineError> {
        if config.max_queue == 0 {
            return Err(EngineError::BadParams("the queue must hold at least one request".into()));
        }
        let (tx, rx) = mpsc::channel();
        let remote_health = remote.as_ref().and_then(|(r, _)| r.health());
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let occupancy = Arc::new(Occupancy::default());
        let step_loop = step_loop::StepLoop::new(model, eog, &config, rx, stats.clone(), occupancy.clone(), coserve, remote)?;
        let capacity_tokens = step_loop.capacity_tokens();
        let thread = std::thread::Builder::new()
            .name("blink-engine".into())
            .spawn(move || step_loop.run())
            .map_err(EngineError::Spawn)?;
        Ok(Engine {
            shared: Arc::new(Shared {
                commands: Mutex::new(tx),
                stats,
                occupancy,
                next_id: AtomicU64::new(1),
                config,
                capacity_tokens,
                thread: Mutex::new(Some(thread)),
                remote_health,
            }),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// Queue a request. Fails at once if it can never fit, or if `max_queue` requests
    /// already wait beyond the free sequence slots (a burst on an idle engine is admitted
    /// whole however short the queue).
    pub fn submit(&self, request: Request) -> Result<Submission, SubmitError> {
        let s = &*self.shared;
        if request.prompt.is_empty() {
            return Err(SubmitError::Invalid("the prompt is empty".into()));
        }
        if request.max_tokens == 0 {
            return Err(SubmitError::Invalid("max_tokens must be at least 1".into()));
        }
        let needed = request.prompt.len() + request.max_tokens;
        if needed > s.config.max_seq_len {
            return Err(SubmitError::Invalid(format!(
                "prompt ({} tokens) plus max_tokens ({}) exceeds the context size of {}",
                request.prompt.len(),
                request.max_tokens,
                s.config.max_seq_len
            )));
        }
        if needed > s.capacity_tokens {
            return Err(SubmitError::TooLarge { needed, capacity: s.capacity_tokens });
        }
        if let Err(e) = request.sampling.validate() {
            return Err(SubmitError::Invalid(e));
        }
        let free_slots = s.config.max_running.saturating_sub(s.occupancy.running.load(Ordering::Acquire) as usize);
        let ahead = s.occupancy.waiting.fetch_add(1, Ordering::AcqRel) as usize;
        if ahead >= s.config.max_queue.saturating_add(free_slots) {
            s.occupancy.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::QueueFull(ahead - free_slots));
        }
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events_rx) = tmpsc::unbounded_channel();
        let sent = s
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::Submit { request, events: events_tx, at: Instant::now() });
        if sent.is_err() {
            s.occupancy.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::Stopped);
        }
        Ok(Submission { id, events: events_rx })
    }

    /// Have the engine look for co-served training work again (a job became ready).
    pub fn wake(&self) {
        let _ = self.shared.commands.lock().unwrap_or_else(|e| e.into_inner()).send(Command::Wake);
    }

    /// Whether the engine thread is still serving (it stops only when told to, or on a bug).
    pub fn is_running(&self) -> bool {
        let thread = self.shared.thread.lock().unwrap_or_else(|e| e.into_inner());
        thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Whether the devices of a remote executor can run steps now (always, for a local
    /// one): `Err` with the reason, such as a ring's lost device.
    pub fn remote_health(&self) -> Result<(), String> {
        self.shared.remote_health.as_ref().map_or(Ok(()), |h| h())
    }

    /// A snapshot of the engine's counters.
    pub fn stats(&self) -> EngineStats {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = self.commands.lock().unwrap_or_else(|e| e.into_inner()).send(Command::Shutdown);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}
