//! The server's fine-tuning jobs (`/v1/fine_tuning/jobs`, with `--state-dir`): starting
//! the job service of `blink_train::jobs` over the loaded model, before the engine starts,
//! choosing what runs the jobs' training units (`start_trainer`: the one place a mode is
//! picked; a trainer inside the engine hands back the hook the engine starts with),
//! keeping the split trainer's threads off the engine's CPUs, serving the adapters the
//! jobs made, and the figures `/metrics` exports.
//!
//! The jobs' adapters are served through the server's adapter registry (`Adapters`
//! implements `AdapterSink`): a finished job's `ft:<base>:<suffix>:<job id>` and its epoch
//! checkpoints become models as soon as they are written, and again after a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blink_engine::serve::CoServe;
use blink_model::Model;
use blink_runtime::numa::{NodePool, Topology};
use blink_text::{ChatTemplate, Tokenizer};
use blink_train::jobs::{AdapterSink, BaseModel, CoServedJobs, Executor, JobService, JobSettings, SplitTrainer};
use blink_train::store::{FileStore, JobStatus};

use crate::adapters::Adapters;

/// What runs the jobs' training units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinetuneMode {
    /// Inside the engine's steps, in the time the requests' targets leave
    /// (`--finetune-mode coserve`, the default; see `--coserve-policy`).
    CoServe,
    /// A thread and pool of their own beside the engine (`--finetune-mode split`).
    Split,
}

impl FinetuneMode {
    pub fn parse(s: &str) -> Option<FinetuneMode> {
        match s {
            "coserve" => Some(FinetuneMode::CoServe),
            "split" => Some(FinetuneMode::Split),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FinetuneMode::CoServe => "coserve",
            FinetuneMode::Split => "split",
        }
    }
}

/// How the server trains its jobs.
#[derive(Clone, Debug)]
pub struct FinetuneOptions {
    pub mode: FinetuneMode,
    /// Threads of the split trainer's pool (`--finetune-threads`).
    pub threads: usize,
    /// The share of the time the split trainer trains (`--finetune-share`; 1: always).
    pub share: f64,
    /// The adapter and the settings OpenAI's API leaves out.
    pub settings: JobSettings,
}

impl Default for FinetuneOptions {
    fn default() -> Self {
        FinetuneOptions { mode: FinetuneMode::CoServe, threads: 1, share: 1.0, settings: JobSettings::default() }
    }
}

/// Where a server's jobs live and how they train.
pub struct JobsSetup {
    pub state_dir: PathBuf,
    /// The files endpoints' store, shared with the jobs.
    pub files: Arc<FileStore>,
    pub options: FinetuneOptions,
}

/// The loaded model as the jobs see it.
pub struct ServedModel<'a> {
    pub model: &'a Arc<Model>,
    pub path: &'a Path,
    /// What chat requests are rendered with (ChatML for a model without a template), so
    /// jobs render their examples as the model is chatted with.
    pub tokenizer: &'a Arc<Tokenizer>,
    pub template: &'a Arc<ChatTemplate>,
    /// The served model id first, then its aliases: what a job's `model` may name.
    pub names: Vec<String>,
    pub adapters: &'a Arc<Adapters>,
}

/// The jobs of a running server and what trains them.
pub struct FineTuning {
    pub service: JobService,
    _trainer: Trainer,
}

/// What runs the jobs' units; dropping it lets its threads end once the service stops.
enum Trainer {
    /// The engine runs them (through the hook it was started with).
    Engine,
    Split(#[allow(dead_code)] SplitTrainer),
}

/// Open the jobs of the state directory, start their worker and trainer, and serve again
/// every adapter finished jobs made; with the hook to start the engine with when the
/// trainer runs inside it. Blocking (it reads the state directory): run it off the async
/// threads, before the engine starts.
pub fn start(setup: &JobsSetup, served: ServedModel<'_>) -> Result<(FineTuning, Option<Box<dyn CoServe>>), String> {
    let (state_dir, opts) = (&setup.state_dir, &setup.options);
    if served.model.placement().numa {
        eprintln!("blink: note: fine-tuning trains on a flat model; on this tensor-parallel placement jobs fail (serve with --numa off to train)");
    }
    let base = BaseModel { model: served.model.clone(), path: served.path.to_path_buf(), tokenizer: served.tokenizer.clone(), template: served.template.clone(), names: served.names.clone() };
    let sink: Arc<dyn AdapterSink> = served.adapters.clone();
    let (service, executor) = JobService::start(state_dir, setup.files.clone(), base, opts.settings.clone(), sink).map_err(|e| format!("--state-dir {}: {e}", state_dir.display()))?;
    for (name, dir) in service.served_models() {
        if let Err(e) = served.adapters.publish(&name, &dir) {
            eprintln!("blink: warning: the fine-tuned model {name} is not served: {e}");
        }
    }
    let (trainer, hook) = start_trainer(opts, executor, served.model)?;
    Ok((FineTuning { service, _trainer: trainer }, hook))
}

/// Start what runs the jobs' units, by mode; a trainer inside the engine returns the hook
/// the engine is to start with (`Engine::start_with`). The split trainer runs them back
/// to back on `threads` threads of its own, kept off the engine's CPUs where the machine
/// has room.
fn start_trainer(opts: &FinetuneOptions, executor: Executor, model: &Arc<Model>) -> Result<(Trainer, Option<Box<dyn CoServe>>), String> {
    let threads = opts.threads;
    match opts.mode {
        FinetuneMode::CoServe => Ok((Trainer::Engine, Some(Box::new(CoServedJobs::new(executor))))),
        FinetuneMode::Split => {
            let threads = threads.max(1);
            let cpus = trainer_cpus(model, threads);
            let pool = NodePool::new(&Topology::fallback(&cpus), &[threads]).map_err(|e| format!("cannot start the fine-tuning threads: {e}"))?;
            let trainer = SplitTrainer::start(executor, model.clone(), pool, opts.share).map_err(|e| format!("cannot start the fine-tuning thread: {e}"))?;
            Ok((Trainer::Split(trainer), None))
        }
    }
}

/// The CPUs the split trainer's pool runs on: the first `threads` allowed CPUs the
/// engine's pool is not pinned to, or, when too few are left, all of them (shared with
/// the engine, with a note saying how to split them).
fn trainer_cpus(model: &Model, threads: usize) -> Vec<usize> {
    let allowed = blink_runtime::affinity::allowed_cpus();
    let placement = model.placement();
    let engine: Vec<usize> = placement.topology.nodes().iter().flat_map(|n| n.cpus.iter().copied()).collect();
    let free: Vec<usize> = allowed.iter().copied().filter(|c| !engine.contains(c)).collect();
    if free.len() >= threads {
        return free[..threads].to_vec();
    }
    let engine_threads = placement.n_threads();
    eprintln!(
        "blink: note: the fine-tuning pool's {threads} thread(s) share the CPUs with the engine's {engine_threads}; give -t N with N + --finetune-threads at most {} to keep them apart",
        allowed.len()
    );
    allowed
}

/// The engine's CPUs beside a split trainer of `trainer_threads`: the first
/// `engine_threads` allowed CPUs, when they and the trainer's fit in the allowed ones
/// (the trainer then takes the next ones); `None` when they do not: both run over all.
pub fn engine_cpus(engine_threads: usize, trainer_threads: usize) -> Option<Vec<usize>> {
    let allowed = blink_runtime::affinity::allowed_cpus();
    (engine_threads + trainer_threads.max(1) <= allowed.len()).then(|| allowed[..engine_threads].to_vec())
}

/// Job counts by status and training tokens committed, for `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct FinetuneStats {
    pub trained_tokens: u64,
    pub jobs: Vec<(&'static str, usize)>,
}

impl FineTuning {
    pub fn stats(&self) -> FinetuneStats {
        let jobs = self.service.list(None, usize::MAX).map(|(jobs, _)| jobs).unwrap_or_default();
        let jobs = JobStatus::ALL.iter().map(|s| (s.as_str(), jobs.iter().filter(|j| j.status == *s).count())).collect();
        FinetuneStats { trained_tokens: self.service.committed_tokens(), jobs }
    }
}
