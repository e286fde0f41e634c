//! Fine-tuning jobs a server runs (`/v1/fine_tuning/jobs`): OpenAI's job life on top of
//! the state directory's stores, and the machinery that trains them.
//!
//! - [`JobService`] is what the HTTP handlers call: create (checked against the base
//!   model and the uploaded files), list, retrieve, events, checkpoints, cancel, pause
//!   and resume. Every change is written to the store before it is answered.
//! - A worker thread (`worker`) does the slow work off every hot path: it validates a
//!   job's files, sets its run up (resuming from the job's last checkpoint), hands it to
//!   the executor, and writes what the executor reports: checkpoints (each one a
//!   committed step), metrics events, epoch checkpoints served as models, and the final
//!   adapter, published as `ft:<base>:<suffix>:<job id>`.
//! - The executor (`units::JobUnits`) runs the job's units: inside the serving engine's
//!   steps through its co-serving hook (`hook`), or on a thread and pool of its own
//!   (`split`, the static split). Either way the run is [`crate::run::Finetune`], the
//!   code `blink finetune` runs, so a job trains exactly as the command does.
//!
//! A kill -9 at any moment loses no committed step and does none twice: a step is
//! committed when its checkpoint is durably written; a restarted server moves running
//! jobs back to `queued`, and their runs resume from their checkpoints. Metrics events are
//! written from the checkpoint's loss curve, after it, skipping steps already logged.

mod hook;
mod messages;
mod split;
mod units;
mod worker;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use blink_model::lora::LoraTarget;
use blink_model::Model;
use blink_text::{ChatTemplate, Tokenizer};
use serde_json::{json, Value};

use crate::optim::Decay;
use crate::run::FinetuneConfig;
use crate::store::{FileStore, JobEvent, JobRecord, JobSpec, JobStatus, JobStore, StoreError, PURPOSE_FINE_TUNE};

pub use hook::{cost_of, CoServedJobs};
pub use split::SplitTrainer;
pub use units::{Accepted, Executor};

/// OpenAI's `auto` values, resolved.
pub const AUTO_EPOCHS: u64 = 3;
pub const AUTO_BATCH_SIZE: u64 = 8;
pub const AUTO_LR_MULTIPLIER: f64 = 1.0;

/// How a server trains its jobs: the adapter, and the settings OpenAI's API leaves out.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSettings {
    /// The learning rate a multiplier of 1 gives.
    pub base_lr: f64,
    pub rank: usize,
    pub alpha: f32,
    pub targets: Vec<LoraTarget>,
    /// Tokens per packed batch (an example longer than this fails the job).
    pub batch_tokens: usize,
    pub warmup: u64,
    /// Commit (checkpoint) every this many optimizer steps, and at every epoch's end.
    pub checkpoint_every: u64,
}

impl Default for JobSettings {
    fn default() -> JobSettings {
        JobSettings { base_lr: 1e-3, rank: 8, alpha: 16.0, targets: LoraTarget::ALL.to_vec(), batch_tokens: 512, warmup: 2, checkpoint_every: 1 }
    }
}

impl JobSettings {
    /// The run a job with `spec` makes: the same as `blink finetune --lr {base_lr ×
    /// multiplier} --epochs {n_epochs} --batch-size {batch_size} --batch-tokens
    /// {batch_tokens} --warmup {warmup} --seed {seed} --rank … --alpha … --targets …`.
    pub fn finetune_config(&self, spec: &JobSpec) -> FinetuneConfig {
        let h = &spec.hyperparameters;
        FinetuneConfig {
            lr: self.base_lr * h.learning_rate_multiplier,
            epochs: h.n_epochs,
            batch_tokens: self.batch_tokens,
            batch_examples: usize::try_from(h.batch_size).unwrap_or(usize::MAX),
            accum: 1,
            warmup: self.warmup,
            decay: Decay::Cosine,
            weight_decay: 0.0,
            clip: Some(1.0),
            dropout: 0.0,
            seed: spec.seed,
            checkpoint_every: Some(self.checkpoint_every.max(1)),
        }
    }
}

/// The model jobs train on, with what renders their data, and the names a job may give
/// as its `model`.
pub struct BaseModel {
    pub model: Arc<Model>,
    pub path: PathBuf,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
    /// The served model id first, then its aliases.
    pub names: Vec<String>,
}

/// Where finished adapters go: the server serves each under its name from then on.
pub trait AdapterSink: Send + Sync {
    fn publish(&self, name: &str, dir: &Path) -> Result<(), String>;
}

/// One of a job's checkpoints: an adapter saved at an epoch's end, served as a model.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointRecord {
    pub id: String,
    pub job_id: String,
    pub created_at: u64,
    pub step: u64,
    pub model: String,
    pub train_loss: f64,
    pub valid_loss: Option<f64>,
    pub valid_mean_token_accuracy: Option<f64>,
}

impl CheckpointRecord {
    /// OpenAI's fine-tuning job checkpoint object.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id, "object": "fine_tuning.job.checkpoint", "created_at": self.created_at,
            "fine_tuned_model_checkpoint": self.model, "fine_tuning_job_id": self.job_id, "step_number": self.step,
            "metrics": {"step": self.step, "train_loss": self.train_loss, "valid_loss": self.valid_loss,
                        "valid_mean_token_accuracy": self.valid_mean_token_accuracy},
        })
    }

    fn from_json(v: &Value) -> Option<CheckpointRecord> {
        let m = &v["metrics"];
        Some(CheckpointRecord {
            id: v["id"].as_str()?.into(),
            job_id: v["fine_tuning_job_id"].as_str()?.into(),
            created_at: v["created_at"].as_u64()?,
            step: v["step_number"].as_u64()?,
            model: v["fine_tuned_model_checkpoint"].as_str()?.into(),
            train_loss: m["train_loss"].as_f64()?,
            valid_loss: m["valid_loss"].as_f64(),
            valid_mean_token_accuracy: m["valid_mean_token_accuracy"].as_f64(),
        })
    }
}

/// The name a finished job's adapter is served under: `ft:<base>:<suffix>:<job id>`
/// (the suffix empty when none was given, as OpenAI leaves `::`).
pub fn fine_tuned_name(spec: &JobSpec, job_id: &str) -> String {
    format!("ft:{}:{}:{job_id}", spec.model, spec.suffix.as_deref().unwrap_or(""))
}

/// The fine-tuning jobs of a server.
pub struct JobService {
    shared: Arc<worker::Shared>,
    worker: Mutex<mpsc::Sender<messages::Msg>>,
}

impl JobService {
    /// Open the jobs of `state_dir` (moving the ones a stopped server was running back to
    /// `queued`) and start the worker. Returns the service and the executor side, which
    /// the caller runs: in the engine's steps ([`CoServedJobs`]) or on threads of its own
    /// ([`SplitTrainer`]).
    pub fn start(state_dir: &Path, files: Arc<FileStore>, base: BaseModel, settings: JobSettings, sink: Arc<dyn AdapterSink>) -> Result<(JobService, Executor), StoreError> {
        let store = JobStore::open(state_dir)?;
        let (jobs, _) = store.list(None, usize::MAX)?;
        for job in jobs.iter().filter(|j| j.status == JobStatus::Running) {
            store.transition(&job.id, JobStatus::Queued, "The server restarted: the job resumes from its last checkpoint", |_| {})?;
        }
        let shared = Arc::new(worker::Shared::new(store, files, base, settings, sink));
        let (tx, executor) = worker::spawn(shared.clone())?;
        Ok((JobService { shared, worker: Mutex::new(tx) }, executor))
    }

    fn store(&self) -> &JobStore {
        &self.shared.store
    }

    fn notify(&self) {
        let _ = self.worker.lock().unwrap_or_else(|p| p.into_inner()).send(messages::Msg::Wake);
    }

    /// A new job: `spec.model` must name the base model and its files must be uploaded
    /// fine-tuning data. It starts in `validating_files`.
    pub fn create(&self, spec: JobSpec) -> Result<JobRecord, StoreError> {
        if !self.shared.base.names.contains(&spec.model) {
            return Err(StoreError::Invalid(format!("model '{}' is not served here; fine-tuning takes the base model ({})", spec.model, self.shared.base.names.join(", "))));
        }
        for (field, id) in [("training_file", Some(&spec.training_file)), ("validation_file", spec.validation_file.as_ref())] {
            let Some(id) = id else { continue };
            let file = self.shared.files.get(id)?;
            if file.purpose != PURPOSE_FINE_TUNE {
                return Err(StoreError::Invalid(format!("{field} '{id}' has purpose '{}', not '{PURPOSE_FINE_TUNE}'", file.purpose)));
            }
        }
        let h = &spec.hyperparameters;
        if h.n_epochs == 0 || h.batch_size == 0 || !(h.learning_rate_multiplier.is_finite() && h.learning_rate_multiplier > 0.0) {
            return Err(StoreError::Invalid("n_epochs and batch_size must be at least 1, and learning_rate_multiplier a positive number".into()));
        }
        if let Some(s) = spec.suffix.as_deref().filter(|s| s.len() > 64 || s.contains(':')) {
            return Err(StoreError::Invalid(format!("the suffix '{s}' must be at most 64 characters, without ':'")));
        }
        let record = self.store().create(spec)?;
        self.notify();
        Ok(record)
    }

    pub fn get(&self, id: &str) -> Result<JobRecord, StoreError> {
        self.store().get(id)
    }

    pub fn list(&self, after: Option<&str>, limit: usize) -> Result<(Vec<JobRecord>, bool), StoreError> {
        self.store().list(after, limit)
    }

    pub fn events(&self, id: &str, after: Option<&str>, limit: usize) -> Result<(Vec<JobEvent>, bool), StoreError> {
        self.store().events(id, after, limit)
    }

    /// The job's checkpoints, newest first, after the checkpoint `after`; and whether more
    /// follow.
    pub fn checkpoints(&self, id: &str, after: Option<&str>, limit: usize) -> Result<(Vec<CheckpointRecord>, bool), StoreError> {
        self.store().get(id)?;
        let mut all = worker::read_checkpoints(&self.store().job_dir(id));
        all.reverse();
        Ok(crate::store::page(&all, |c| &c.id, after, limit))
    }

    /// Stop the job for good; a run under way stops at once (steps not yet committed
    /// are dropped).
    pub fn cancel(&self, id: &str) -> Result<JobRecord, StoreError> {
        let record = self.store().transition(id, JobStatus::Cancelled, "Fine-tuning job cancelled", |_| {})?;
        self.shared.control(id).cancel();
        self.notify();
        Ok(record)
    }

    /// Pause the job; a run under way stops at its next committed step.
    pub fn pause(&self, id: &str) -> Result<JobRecord, StoreError> {
        let record = self.store().transition(id, JobStatus::Paused, "Fine-tuning job paused", |_| {})?;
        self.shared.control(id).pause();
        self.notify();
        Ok(record)
    }

    /// Queue a paused job again; it continues from its last committed step.
    pub fn resume(&self, id: &str) -> Result<JobRecord, StoreError> {
        // The store lets a running job go back to `queued` (for a restart); a client may
        // only resume a paused one.
        let status = self.store().get(id)?.status;
        if status != JobStatus::Paused {
            return Err(StoreError::Conflict(format!("job {id} is {}; only a paused job can be resumed", status.as_str())));
        }
        let record = self.store().transition(id, JobStatus::Queued, "Fine-tuning job resumed", |_| {})?;
        self.notify();
        Ok(record)
    }

    /// Every adapter the jobs have made (finished jobs' and their checkpoints'), by the
    /// name it is served under: for a server to serve them again after a restart.
    pub fn served_models(&self) -> Vec<(String, PathBuf)> {
        let Ok((jobs, _)) = self.store().list(None, usize::MAX) else { return Vec::new() };
        let mut out = Vec::new();
        for job in jobs {
            let dir = self.store().job_dir(&job.id);
            out.extend(worker::read_checkpoints(&dir).into_iter().map(|c| (c.model, dir.join("checkpoints").join(format!("step-{}", c.step)))));
            if let (JobStatus::Succeeded, Some(name)) = (job.status, job.fine_tuned_model) {
                out.push((name, dir.join("adapter")));
            }
        }
        out
    }

    /// Have `wake` called whenever a job's run is handed to the executor (for an engine
    /// that sleeps while it has nothing to do: [`blink_engine::serve::Engine::wake`]).
    pub fn set_waker(&self, wake: Box<dyn Fn() + Send + Sync>) {
        self.shared.set_waker(wake);
    }

    /// Training tokens committed over all jobs since the service started (what
    /// `/metrics` exports as `blink_finetune_trained_tokens_total`).
    pub fn committed_tokens(&self) -> u64 {
        self.shared.committed_tokens()
    }
}

impl Drop for JobService {
    fn drop(&mut self) {
        let _ = self.worker.lock().unwrap_or_else(|p| p.into_inner()).send(messages::Msg::Stop);
    }
}
