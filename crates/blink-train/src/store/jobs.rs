//! Fine-tuning jobs (`/v1/fine_tuning/jobs`): each job's record in `jobs/<id>/job.json`,
//! replaced atomically on every change, and its events appended to `jobs/<id>/events.jsonl`,
//! each line synced before the call returns. A line cut short by a crash is the last one,
//! and reading skips it. The store checks every status change against the job's life
//! (`validating_files → queued → running → succeeded | failed | cancelled`, with pauses);
//! what runs a job, and when, is the caller's.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{json, Value};

use super::{new_id, unix_now, StoreError};
use crate::durable;

/// What temporary files in a job's directory start with (swept when the store opens).
pub(crate) const TEMP_PREFIX: &str = ".job.tmp-";

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobStatus {
    ValidatingFiles,
    Queued,
    Running,
    Paused,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub const ALL: [JobStatus; 7] = [JobStatus::ValidatingFiles, JobStatus::Queued, JobStatus::Running, JobStatus::Paused, JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled];

    /// OpenAI's name of the status.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::ValidatingFiles => "validating_files",
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Paused => "paused",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<JobStatus> {
        JobStatus::ALL.into_iter().find(|j| j.as_str() == s)
    }

    /// Whether the job has ended: nothing moves it any more.
    pub fn is_final(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled)
    }

    /// Whether a job may go from `self` to `to`. A running job goes back to `queued` when
    /// the server restarts under it (it resumes from its last checkpoint).
    pub fn may_become(self, to: JobStatus) -> bool {
        use JobStatus::*;
        match self {
            ValidatingFiles => matches!(to, Queued | Failed | Cancelled),
            Queued => matches!(to, Running | Paused | Failed | Cancelled),
            Running => matches!(to, Queued | Paused | Succeeded | Failed | Cancelled),
            Paused => matches!(to, Queued | Cancelled),
            Succeeded | Failed | Cancelled => false,
        }
    }
}

/// The settings a job trains with (OpenAI's `hyperparameters`, resolved).
#[derive(Clone, Debug, PartialEq)]
pub struct Hyperparameters {
    pub n_epochs: u64,
    /// Examples per optimizer step.
    pub batch_size: u64,
    pub learning_rate_multiplier: f64,
}

/// What a job was created with.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSpec {
    pub model: String,
    pub training_file: String,
    pub validation_file: Option<String>,
    pub suffix: Option<String>,
    pub seed: u64,
    pub hyperparameters: Hyperparameters,
}

/// A job as the store keeps it: OpenAI's fine-tuning job object.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    pub id: String,
    pub spec: JobSpec,
    pub status: JobStatus,
    pub created_at: u64,
    pub finished_at: Option<u64>,
    pub trained_tokens: Option<u64>,
    /// `(code, message)` of a failed job.
    pub error: Option<(String, String)>,
    pub fine_tuned_model: Option<String>,
}

impl JobRecord {
    /// OpenAI's JSON shape of a fine-tuning job.
    pub fn to_json(&self) -> Value {
        let s = &self.spec;
        let h = json!({"n_epochs": s.hyperparameters.n_epochs, "batch_size": s.hyperparameters.batch_size, "learning_rate_multiplier": s.hyperparameters.learning_rate_multiplier});
        let error = self.error.as_ref().map(|(code, message)| json!({"code": code, "message": message, "param": null}));
        json!({
            "id": self.id, "object": "fine_tuning.job", "model": s.model, "created_at": self.created_at,
            "finished_at": self.finished_at, "fine_tuned_model": self.fine_tuned_model, "organization_id": "blink",
            "result_files": [], "status": self.status.as_str(), "validation_file": s.validation_file,
            "training_file": s.training_file, "hyperparameters": h, "trained_tokens": self.trained_tokens,
            "error": error, "seed": s.seed, "user_provided_suffix": s.suffix, "estimated_finish": null, "integrations": [],
            "method": {"type": "supervised", "supervised": {"hyperparameters": h}},
        })
    }

    fn from_json(v: &Value) -> Option<JobRecord> {
        let h = &v["hyperparameters"];
        let opt_str = |v: &Value| v.as_str().map(str::to_string);
        Some(JobRecord {
            id: v["id"].as_str()?.to_string(),
            spec: JobSpec {
                model: v["model"].as_str()?.to_string(),
                training_file: v["training_file"].as_str()?.to_string(),
                validation_file: opt_str(&v["validation_file"]),
                suffix: opt_str(&v["user_provided_suffix"]),
                seed: v["seed"].as_u64()?,
                hyperparameters: Hyperparameters { n_epochs: h["n_epochs"].as_u64()?, batch_size: h["batch_size"].as_u64()?, learning_rate_multiplier: h["learning_rate_multiplier"].as_f64()? },
            },
            status: JobStatus::parse(v["status"].as_str()?)?,
            created_at: v["created_at"].as_u64()?,
            finished_at: v["finished_at"].as_u64(),
            trained_tokens: v["trained_tokens"].as_u64(),
            error: v["error"].as_object().and_then(|e| Some((e.get("code")?.as_str()?.to_string(), e.get("message")?.as_str()?.to_string()))),
            fine_tuned_model: opt_str(&v["fine_tuned_model"]),
        })
    }
}

/// One line of a job's log: OpenAI's fine-tuning job event.
#[derive(Clone, Debug, PartialEq)]
pub struct JobEvent {
    pub id: String,
    pub created_at: u64,
    /// `info`, `warn` or `error`.
    pub level: String,
    pub message: String,
    /// `message`, or `metrics` for a step's figures (in `data`).
    pub kind: String,
    pub data: Value,
}

impl JobEvent {
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "object": "fine_tuning.job.event", "created_at": self.created_at, "level": self.level, "message": self.message, "type": self.kind, "data": self.data})
    }

    fn from_json(v: &Value) -> Option<JobEvent> {
        Some(JobEvent {
            id: v["id"].as_str()?.to_string(),
            created_at: v["created_at"].as_u64()?,
            level: v["level"].as_str()?.to_string(),
            message: v["message"].as_str()?.to_string(),
            kind: v["type"].as_str()?.to_string(),
            data: v["data"].clone(),
        })
    }
}

/// The jobs of a state directory.
pub struct JobStore {
    dir: PathBuf,
    jobs: Mutex<BTreeMap<String, JobRecord>>,
}

impl JobStore {
    /// Opens (creating) `state_dir/jobs`, reading every job's record.
    pub fn open(state_dir: &Path) -> Result<JobStore, StoreError> {
        let dir = state_dir.join("jobs");
        fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, "cannot create", e))?;
        let mut jobs = BTreeMap::new();
        for entry in fs::read_dir(&dir).map_err(|e| StoreError::io(&dir, "cannot list", e))?.flatten() {
            let job_dir = entry.path();
            durable::remove_stray_temps(&job_dir, TEMP_PREFIX);
            let record = fs::read(job_dir.join("job.json")).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()).and_then(|v| JobRecord::from_json(&v));
            // A directory without a readable record is a create cut short: not a job.
            if let Some(r) = record {
                jobs.insert(r.id.clone(), r);
            }
        }
        Ok(JobStore { dir, jobs: Mutex::new(jobs) })
    }

    /// A new job in `validating_files`, with its first event.
    pub fn create(&self, spec: JobSpec) -> Result<JobRecord, StoreError> {
        let mut jobs = self.lock();
        let id = loop {
            let id = new_id("ftjob-");
            if !jobs.contains_key(&id) {
                break id;
            }
        };
        let record = JobRecord { id: id.clone(), spec, status: JobStatus::ValidatingFiles, created_at: unix_now(), finished_at: None, trained_tokens: None, error: None, fine_tuned_model: None };
        let job_dir = self.dir.join(&id);
        fs::create_dir_all(&job_dir).map_err(|e| StoreError::io(&job_dir, "cannot create", e))?;
        self.append_event(&id, "info", &format!("Created fine-tuning job: {id}"), "message", Value::Null)?;
        self.write_record(&record)?;
        jobs.insert(id, record.clone());
        Ok(record)
    }

    pub fn get(&self, id: &str) -> Result<JobRecord, StoreError> {
        self.lock().get(id).cloned().ok_or_else(|| not_found(id))
    }

    /// Up to `limit` jobs, newest first, starting after the job `after` (OpenAI's cursor);
    /// and whether more follow.
    pub fn list(&self, after: Option<&str>, limit: usize) -> Result<(Vec<JobRecord>, bool), StoreError> {
        let mut all: Vec<JobRecord> = self.lock().values().cloned().collect();
        all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.cmp(&a.id)));
        let start = match after {
            Some(id) => all.iter().position(|j| j.id == id).ok_or_else(|| not_found(id))? + 1,
            None => 0,
        };
        let rest = &all[start..];
        Ok((rest.iter().take(limit).cloned().collect(), rest.len() > limit))
    }

    /// Moves the job to `to` (refused where its life does not allow it), with an event
    /// saying so; `change` edits the record on the way (trained tokens, error, model).
    pub fn transition(&self, id: &str, to: JobStatus, message: &str, change: impl FnOnce(&mut JobRecord)) -> Result<JobRecord, StoreError> {
        let mut jobs = self.lock();
        let job = jobs.get(id).ok_or_else(|| not_found(id))?;
        if !job.status.may_become(to) {
            return Err(StoreError::Conflict(format!("job {id} is {}; it cannot become {}", job.status.as_str(), to.as_str())));
        }
        let mut next = job.clone();
        next.status = to;
        change(&mut next);
        if to.is_final() {
            next.finished_at = Some(unix_now());
        }
        self.write_record(&next)?;
        let level = if to == JobStatus::Failed { "error" } else { "info" };
        self.append_event(id, level, message, "message", Value::Null)?;
        jobs.insert(id.to_string(), next.clone());
        Ok(next)
    }

    /// Edits the record without a change of status (trained tokens so far).
    pub fn update(&self, id: &str, change: impl FnOnce(&mut JobRecord)) -> Result<JobRecord, StoreError> {
        let mut jobs = self.lock();
        let mut next = jobs.get(id).ok_or_else(|| not_found(id))?.clone();
        change(&mut next);
        next.status = jobs[id].status;
        self.write_record(&next)?;
        jobs.insert(id.to_string(), next.clone());
        Ok(next)
    }

    /// Adds an event to the job's log.
    pub fn event(&self, id: &str, level: &str, message: &str, kind: &str, data: Value) -> Result<(), StoreError> {
        let jobs = self.lock();
        self.get_locked(&jobs, id)?;
        self.append_event(id, level, message, kind, data)
    }

    /// Up to `limit` events, newest first, starting after the event `after`; and whether
    /// more follow.
    pub fn events(&self, id: &str, after: Option<&str>, limit: usize) -> Result<(Vec<JobEvent>, bool), StoreError> {
        let jobs = self.lock();
        self.get_locked(&jobs, id)?;
        let path = self.events_path(id);
        let bytes = fs::read(&path).map_err(|e| StoreError::io(&path, "cannot read", e))?;
        let mut all: Vec<JobEvent> = bytes.split(|&b| b == b'\n').filter_map(|l| serde_json::from_slice::<Value>(l).ok()).filter_map(|v| JobEvent::from_json(&v)).collect();
        all.reverse();
        Ok(super::page(&all, |e| &e.id, after, limit))
    }

    /// The job's own directory (its checkpoints and adapter go there).
    pub fn job_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    fn get_locked(&self, jobs: &BTreeMap<String, JobRecord>, id: &str) -> Result<(), StoreError> {
        jobs.contains_key(id).then_some(()).ok_or_else(|| not_found(id))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, JobRecord>> {
        // The map only changes after the disk has: a panic elsewhere leaves it consistent.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn events_path(&self, id: &str) -> PathBuf {
        self.dir.join(id).join("events.jsonl")
    }

    fn write_record(&self, r: &JobRecord) -> Result<(), StoreError> {
        let dir = self.dir.join(&r.id);
        let path = dir.join("job.json");
        let bytes = serde_json::to_vec(&r.to_json()).expect("a JSON value serializes");
        durable::replace(&dir, &path, TEMP_PREFIX, |f| f.write_all(&bytes)).map_err(|e| StoreError::io(&path, e.action, e.source))
    }

    /// Appends one event line and syncs it. A torn line left by a crash before this one
    /// gets a newline first, so it stays a line of its own (and is skipped on reading).
    fn append_event(&self, id: &str, level: &str, message: &str, kind: &str, data: Value) -> Result<(), StoreError> {
        let path = self.events_path(id);
        let path = path.as_path();
        let io = |action| move |e| StoreError::io(path, action, e);
        let mut f = OpenOptions::new().create(true).append(true).read(true).open(path).map_err(io("cannot open"))?;
        let mut existing = Vec::new();
        f.read_to_end(&mut existing).map_err(io("cannot read"))?;
        // Lines so far (a torn one included) number the event, so ids never repeat.
        let n = existing.iter().filter(|&&b| b == b'\n').count();
        let torn = existing.last().is_some_and(|&b| b != b'\n');
        let event = JobEvent { id: format!("ftevent-{}-{n}", id.trim_start_matches("ftjob-")), created_at: unix_now(), level: level.into(), message: message.into(), kind: kind.into(), data };
        let mut line = if torn { b"\n".to_vec() } else { Vec::new() };
        line.extend(serde_json::to_vec(&event.to_json()).expect("a JSON value serializes"));
        line.push(b'\n');
        f.write_all(&line).map_err(io("cannot write"))?;
        f.sync_data().map_err(io("cannot sync"))
    }
}

fn not_found(id: &str) -> StoreError {
    StoreError::NotFound { what: "fine-tuning job", id: id.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec { model: "m".into(), training_file: "file-1".into(), validation_file: None, suffix: Some("zorb".into()), seed: 7, hyperparameters: Hyperparameters { n_epochs: 3, batch_size: 4, learning_rate_multiplier: 1.5 } }
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("blink-jobs-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_job_lives_through_its_states_and_a_reopen() {
        let dir = scratch("life");
        let store = JobStore::open(&dir).unwrap();
        let job = store.create(spec()).unwrap();
        assert_eq!(job.status, JobStatus::ValidatingFiles);
        store.transition(&job.id, JobStatus::Queued, "Files validated", |_| {}).unwrap();
        store.transition(&job.id, JobStatus::Running, "Fine-tuning started", |_| {}).unwrap();
        store.event(&job.id, "info", "Step 1/10: training loss=2.05", "metrics", json!({"step": 1, "train_loss": 2.05})).unwrap();
        store.update(&job.id, |j| j.trained_tokens = Some(512)).unwrap();
        let done = store.transition(&job.id, JobStatus::Succeeded, "The job has successfully completed", |j| j.fine_tuned_model = Some("ft:m:zorb:x".into())).unwrap();
        assert!(done.finished_at.is_some());
        let err = store.transition(&job.id, JobStatus::Cancelled, "", |_| {}).unwrap_err();
        assert!(matches!(err, StoreError::Conflict(_)), "{err}");
        drop(store);
        let store = JobStore::open(&dir).unwrap();
        assert_eq!(store.get(&job.id).unwrap(), done);
        let (events, more) = store.events(&job.id, None, 10).unwrap();
        let messages: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(messages, ["The job has successfully completed", "Step 1/10: training loss=2.05", "Fine-tuning started", "Files validated", &format!("Created fine-tuning job: {}", job.id)]);
        assert!(!more);
        let (page, more) = store.events(&job.id, Some(&events[1].id), 2).unwrap();
        assert_eq!((page, more), (events[2..4].to_vec(), true));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lists_page_newest_first_and_unknown_ids_are_not_found() {
        let dir = scratch("list");
        let store = JobStore::open(&dir).unwrap();
        let ids: Vec<String> = (0..5).map(|_| store.create(spec()).unwrap().id).collect();
        let (first, more) = store.list(None, 2).unwrap();
        assert!(more && first.len() == 2);
        let (rest, more) = store.list(Some(&first[1].id), 10).unwrap();
        assert!(!more && rest.len() == 3);
        // Newest first, jobs made within the same second too.
        let seen: Vec<String> = first.iter().chain(&rest).map(|j| j.id.clone()).collect();
        assert_eq!(seen, ids.iter().rev().cloned().collect::<Vec<_>>());
        assert!(matches!(store.get("ftjob-nope"), Err(StoreError::NotFound { .. })));
        assert!(matches!(store.list(Some("ftjob-nope"), 1), Err(StoreError::NotFound { .. })));
        assert!(matches!(store.events("ftjob-nope", None, 1), Err(StoreError::NotFound { .. })));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_torn_event_line_is_skipped_and_later_events_still_read() {
        let dir = scratch("torn");
        let store = JobStore::open(&dir).unwrap();
        let job = store.create(spec()).unwrap();
        let mut f = OpenOptions::new().append(true).open(store.events_path(&job.id)).unwrap();
        f.write_all(b"{\"id\": \"ftevent-cut").unwrap();
        drop(f);
        drop(store);
        let store = JobStore::open(&dir).unwrap();
        store.event(&job.id, "info", "after the crash", "message", Value::Null).unwrap();
        let (events, _) = store.events(&job.id, None, 10).unwrap();
        let messages: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(messages, ["after the crash", &format!("Created fine-tuning job: {}", job.id)]);
        assert_ne!(events[0].id, events[1].id);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_life_of_a_job_allows_only_its_moves() {
        use JobStatus::*;
        for s in JobStatus::ALL {
            assert_eq!(JobStatus::parse(s.as_str()), Some(s));
            if s.is_final() {
                assert!(JobStatus::ALL.iter().all(|&t| !s.may_become(t)), "{s:?} moved");
            }
        }
        assert!(ValidatingFiles.may_become(Queued) && Queued.may_become(Running) && Running.may_become(Succeeded));
        assert!(Running.may_become(Paused) && Paused.may_become(Queued) && Running.may_become(Queued));
        assert!(!Queued.may_become(Succeeded) && !Paused.may_become(Running) && !ValidatingFiles.may_become(Running));
    }
}
