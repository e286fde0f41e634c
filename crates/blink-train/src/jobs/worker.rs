//! The jobs' worker thread: everything slow or blocking about a job, kept off the engine
//! thread. It validates a job's files, sets its run up (from its last checkpoint), hands
//! the run to the executor, and writes what the executor reports back: a checkpoint per
//! committed step (then the record's trained tokens and the steps' metrics events), an
//! adapter at each epoch's end (served as a checkpoint model), and the final adapter.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use blink_model::lora::{self, LoraTensors, PeftMeta};
use serde_json::{json, Value};

use super::messages::{Control, Msg, Report};
use super::units::{Active, Executor};
use super::{fine_tuned_name, AdapterSink, BaseModel, CheckpointRecord, JobSettings};
use crate::checkpoint::{self, TrainState};
use crate::data::load_examples;
use crate::durable;
use crate::run::{fingerprint, init, Finetune};
use crate::store::{unix_now, FileStore, JobRecord, JobStatus, JobStore, StoreError};

/// What the service, the worker and the executor share.
pub(crate) struct Shared {
    pub store: JobStore,
    pub files: Arc<FileStore>,
    pub base: BaseModel,
    pub settings: JobSettings,
    pub sink: Arc<dyn AdapterSink>,
    controls: Mutex<HashMap<String, Arc<Control>>>,
    committed: AtomicU64,
    /// Tells whoever runs the executor that a run was handed over (the engine sleeps
    /// when it has nothing to do).
    waker: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl Shared {
    pub fn new(store: JobStore, files: Arc<FileStore>, base: BaseModel, settings: JobSettings, sink: Arc<dyn AdapterSink>) -> Shared {
        Shared { store, files, base, settings, sink, controls: Mutex::new(HashMap::new()), committed: AtomicU64::new(0), waker: Mutex::new(None) }
    }

    pub fn set_waker(&self, wake: Box<dyn Fn() + Send + Sync>) {
        *self.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(wake);
    }

    fn wake_executor(&self) {
        if let Some(wake) = self.waker.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            wake();
        }
    }

    /// The job's control flags (made on first use).
    pub fn control(&self, id: &str) -> Arc<Control> {
        self.controls.lock().unwrap_or_else(|p| p.into_inner()).entry(id.to_string()).or_default().clone()
    }

    pub fn committed_tokens(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }
}

/// Start the worker; returns its mailbox and the executor it feeds.
pub(crate) fn spawn(shared: Arc<Shared>) -> Result<(Sender<Msg>, Executor), StoreError> {
    let (tx, rx) = mpsc::channel();
    let (runs_tx, runs_rx) = mpsc::channel();
    let (spares_tx, spares_rx) = mpsc::channel();
    let executor = Executor::new(runs_rx, tx.clone(), spares_rx);
    let worker = Worker { shared, runs: runs_tx, spares: spares_tx, held: None, logged: HashMap::new() };
    std::thread::Builder::new()
        .name("blink-jobs".into())
        .spawn(move || {
            // Writing a checkpoint (tens of megabytes hashed and copied) yields to the
            // engine's passes, as the HTTP threads do: when both cores compute, a pass's
            // threads meet at barriers, and one preempted holds up all. (Not idle-only:
            // a busy engine would then starve the writer, and commits with it.)
            blink_runtime::affinity::lower_current_thread_priority(10);
            worker.run(rx)
        })
        .map_err(|e| StoreError::Io { path: PathBuf::from("<jobs worker>"), action: "cannot start", source: e })?;
    Ok((tx, executor))
}

struct Worker {
    shared: Arc<Shared>,
    runs: Sender<Active>,
    /// Written snapshots go back to the executor, to be filled again.
    spares: Sender<Box<TrainState>>,
    /// The job handed to the executor and not yet let go.
    held: Option<String>,
    /// Per job, the last step whose metrics event is in its log.
    logged: HashMap<String, u64>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Msg>) {
        // Jobs waiting from before a restart start without a message.
        self.advance();
        while let Ok(msg) = rx.recv() {
            match msg {
                Msg::Stop => return,
                Msg::Wake => {}
                Msg::Report(r) => self.handle(r),
            }
            self.advance();
        }
    }

    fn store(&self) -> &JobStore {
        &self.shared.store
    }

    /// Validate new jobs, and hand the oldest queued one over when none is held.
    fn advance(&mut self) {
        let Ok((mut jobs, _)) = self.store().list(None, usize::MAX) else { return };
        jobs.reverse(); // oldest first
        for job in jobs.iter().filter(|j| j.status == JobStatus::ValidatingFiles) {
            self.validate(job);
        }
        match &self.held {
            Some(id) => {
                // Resumed before the executor reached the commit point it pauses at: let it go on.
                if self.store().get(id).is_ok_and(|j| j.status == JobStatus::Queued) {
                    self.shared.control(id).unpause();
                    let _ = self.store().transition(id, JobStatus::Running, "Fine-tuning job running", |_| {});
                }
            }
            None => {
                let next = jobs.iter().filter_map(|j| self.store().get(&j.id).ok()).find(|j| j.status == JobStatus::Queued);
                if let Some(job) = next {
                    self.start(&job);
                }
            }
        }
    }

    /// `validating_files` → `queued`, or `failed` naming the bad lines.
    fn validate(&self, job: &JobRecord) {
        let result = self.examples(&job.spec.training_file, "training_file").and_then(|_| match &job.spec.validation_file {
            Some(v) => self.examples(v, "validation_file").map(|_| ()),
            None => Ok(()),
        });
        let _ = match result {
            Ok(()) => self.store().transition(&job.id, JobStatus::Queued, "Files validated; the job is queued", |_| {}),
            Err((code, message)) => self.fail(&job.id, code, &message),
        };
    }

    fn examples(&self, file_id: &str, field: &'static str) -> Result<Vec<crate::data::Example>, (&'static str, String)> {
        let code = if field == "training_file" { "invalid_training_file" } else { "invalid_validation_file" };
        let path = self.shared.files.path(file_id).map_err(|e| (code, e.to_string()))?;
        let b = &self.shared.base;
        load_examples(&path, &b.tokenizer, &b.template).map_err(|e| (code, format!("{field} {file_id}: {e}")))
    }

    fn fail(&self, id: &str, code: &str, message: &str) -> Result<JobRecord, StoreError> {
        self.store().transition(id, JobStatus::Failed, &format!("Fine-tuning job failed: {message}"), |r| r.error = Some((code.into(), message.into())))
    }

    /// Set the job's run up (resuming from its checkpoint) and hand it to the executor.
    fn start(&mut self, job: &JobRecord) {
        let control = self.shared.control(&job.id);
        control.unpause();
        match self.set_up(job) {
            Ok(run) => {
                let resumed_at = run.steps_done();
                let msg = if resumed_at > 0 { format!("Fine-tuning job running, from step {resumed_at}") } else { "Fine-tuning job started".into() };
                if self.store().transition(&job.id, JobStatus::Running, &msg, |_| {}).is_ok() {
                    let active = Active::new(job.id.clone(), run, control);
                    if self.runs.send(active).is_ok() {
                        self.held = Some(job.id.clone());
                        self.shared.wake_executor();
                    }
                }
            }
            Err((code, message)) => {
                let _ = self.fail(&job.id, code, &message);
            }
        }
    }

    fn set_up(&self, job: &JobRecord) -> Result<Finetune<Arc<blink_model::Model>>, (&'static str, String)> {
        let train = self.examples(&job.spec.training_file, "training_file")?;
        let eval = match &job.spec.validation_file {
            Some(v) => self.examples(v, "validation_file")?,
            None => Vec::new(),
        };
        let (b, s) = (&self.shared.base, &self.shared.settings);
        let cfg = s.finetune_config(&job.spec);
        let params = init::fresh(&b.model.cfg, s.rank, s.alpha, &s.targets, cfg.seed);
        let fp = fingerprint(&b.path, &train, &eval, &params, &cfg, "job");
        let mut run = Finetune::new(b.model.clone(), cfg, train, eval, params, fp).map_err(|e| ("invalid_training_file", e.to_string()))?;
        run.resume(&self.store().job_dir(&job.id)).map_err(|e| ("checkpoint", e.to_string()))?;
        Ok(run)
    }

    fn handle(&mut self, report: Report) {
        match report {
            Report::Commit { id, state, epoch_ended } => {
                if let Err(e) = self.commit(&id, &state, epoch_ended) {
                    // The last checkpoint written stays; the job stops here.
                    self.shared.control(&id).cancel();
                    let _ = self.fail(&id, "checkpoint", &e);
                }
                let _ = self.spares.send(state);
            }
            Report::Finished { id, params, trained_tokens } => {
                self.held = None;
                let result = self.finish(&id, &params, trained_tokens);
                if let Err(e) = result {
                    let _ = self.fail(&id, "output", &e);
                }
            }
            Report::Failed { id, error } => {
                self.held = None;
                let _ = self.fail(&id, "training", &error);
            }
            Report::Released { id } => {
                if self.held.as_deref() == Some(&id) {
                    self.held = None;
                }
            }
        }
    }

    /// Write the committed step: checkpoint first (what commits it), then the record and
    /// the metrics events of the steps not yet logged, then the epoch's adapter.
    fn commit(&mut self, id: &str, state: &TrainState, epoch_ended: Option<u64>) -> Result<(), String> {
        let dir = self.store().job_dir(id);
        checkpoint::save(&dir, state).map_err(|e| e.to_string())?;
        let before = self.store().get(id).map_err(|e| e.to_string())?.trained_tokens.unwrap_or(0);
        self.store().update(id, |r| r.trained_tokens = Some(state.trained_tokens)).map_err(|e| e.to_string())?;
        self.shared.committed.fetch_add(state.trained_tokens.saturating_sub(before), Ordering::Relaxed);
        let logged = match self.logged.get(id) {
            Some(&s) => s,
            None => self.last_logged_step(id),
        };
        let total = self.store().get(id).map(|r| r.spec.hyperparameters.n_epochs).unwrap_or(0);
        for p in state.curve.iter().filter(|p| p.step > logged) {
            let mut data = json!({"step": p.step, "train_loss": p.train_loss, "learning_rate": p.lr, "trained_tokens": p.tokens, "epoch": p.epoch + 1, "n_epochs": total});
            if let Some(v) = p.eval_loss {
                data["valid_loss"] = json!(v);
                data["valid_mean_token_accuracy"] = json!(p.eval_accuracy);
            }
            let message = format!("Step {}: training loss={:.4}", p.step, p.train_loss);
            self.store().event(id, "info", &message, "metrics", data).map_err(|e| e.to_string())?;
            self.logged.insert(id.to_string(), p.step);
        }
        if let (Some(_), Some(p)) = (epoch_ended, state.curve.last()) {
            self.save_epoch_adapter(id, state, p).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The step of the newest metrics event in the job's log (0: none).
    fn last_logged_step(&self, id: &str) -> u64 {
        let Ok((events, _)) = self.store().events(id, None, usize::MAX) else { return 0 };
        events.iter().filter(|e| e.kind == "metrics").filter_map(|e| e.data["step"].as_u64()).max().unwrap_or(0)
    }

    fn save_epoch_adapter(&self, id: &str, state: &TrainState, point: &crate::checkpoint::CurvePoint) -> Result<(), String> {
        let job = self.store().get(id).map_err(|e| e.to_string())?;
        let dir = self.store().job_dir(id);
        let mut all = read_checkpoints(&dir);
        if all.iter().any(|c| c.step == point.step) {
            return Ok(());
        }
        let out = dir.join("checkpoints").join(format!("step-{}", point.step));
        self.write_adapter(&out, &state.params)?;
        let name = format!("{}:ckpt-step-{}", fine_tuned_name(&job.spec, id), point.step);
        let id_part = id.trim_start_matches("ftjob-");
        all.push(CheckpointRecord { id: format!("ftckpt-{id_part}-{}", point.step), job_id: id.into(), created_at: unix_now(), step: point.step, model: name.clone(), train_loss: point.train_loss, valid_loss: point.eval_loss, valid_mean_token_accuracy: point.eval_accuracy });
        let bytes = serde_json::to_vec(&all.iter().map(CheckpointRecord::to_json).collect::<Vec<_>>()).expect("JSON values serialize");
        let path = dir.join(CHECKPOINTS_FILE);
        durable::replace(&dir, &path, crate::store::jobs::TEMP_PREFIX, |f| std::io::Write::write_all(f, &bytes)).map_err(|e| format!("{} {}: {}", e.action, path.display(), e.source))?;
        self.shared.sink.publish(&name, &out)
    }

    fn finish(&mut self, id: &str, params: &LoraTensors, trained_tokens: u64) -> Result<(), String> {
        let job = self.store().get(id).map_err(|e| e.to_string())?;
        if job.status != JobStatus::Running {
            return Ok(()); // cancelled or paused just as it ended: nothing is published
        }
        let out = self.store().job_dir(id).join("adapter");
        self.write_adapter(&out, params)?;
        let name = fine_tuned_name(&job.spec, id);
        self.shared.sink.publish(&name, &out)?;
        self.store()
            .transition(id, JobStatus::Succeeded, &format!("The job has successfully completed: {name}"), |r| {
                r.fine_tuned_model = Some(name.clone());
                r.trained_tokens = Some(trained_tokens);
            })
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    fn write_adapter(&self, out: &Path, params: &LoraTensors) -> Result<(), String> {
        let cfg = &self.shared.base.model.cfg;
        let meta = PeftMeta { base_model_name_or_path: Some(cfg.name.clone()), lora_dropout: 0.0 };
        std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
        lora::write_peft(out, params, cfg, &meta).map_err(|e| format!("{}: {e}", out.display()))
    }
}

/// The list of a job's epoch checkpoints.
const CHECKPOINTS_FILE: &str = "checkpoints.json";

/// A job's epoch checkpoints, oldest first (none when the file is missing or unreadable).
pub(crate) fn read_checkpoints(job_dir: &Path) -> Vec<CheckpointRecord> {
    let Ok(bytes) = std::fs::read(job_dir.join(CHECKPOINTS_FILE)) else { return Vec::new() };
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(&bytes) else { return Vec::new() };
    items.iter().filter_map(CheckpointRecord::from_json).collect()
}
