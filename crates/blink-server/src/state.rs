//! What the handlers share: options, metrics, the file store, and — once loaded — the
//! model, its tokenizer and template, the engine, and the fine-tuning jobs.
//!
//! The server answers before the model is loaded (`/health` says 503 "loading"), so the
//! loaded part sits in a `OnceLock` that is set exactly once.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use blink_engine::serve::latency::Coefficients;
use blink_engine::serve::{Engine, EngineConfig, RemoteSteps, SloTargets, TrainingPolicy};
use blink_engine::Loaded;
use blink_model::lora::LoraMix;
use blink_model::{KvType, Model, Share, TensorPlacement};
use blink_runtime::numa::Topology;
use blink_text::{ChatMessage, ChatTemplate, Tokenizer};
use blink_train::store::{FileStore, StoreError};

use crate::adapters::{AdapterOptions, Adapters};
use crate::error::ApiError;
use crate::finetune::{self, FineTuning, FinetuneOptions, JobsSetup, ServedModel};
use crate::metrics::Metrics;

/// HTTP-side options.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Required as `Authorization: Bearer KEY` on every endpoint but `/health` and `/`.
    pub api_key: Option<String>,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Time allowed for a request's headers to arrive.
    pub header_timeout: Duration,
    /// Time allowed for a request's body to arrive.
    pub body_timeout: Duration,
    /// Time in-flight requests get to finish on shutdown.
    pub shutdown_grace: Duration,
    /// Where uploaded files (and fine-tuning jobs) are kept; without it those endpoints
    /// answer 403.
    pub state_dir: Option<PathBuf>,
    /// Largest file `POST /v1/files` takes, in bytes.
    pub max_upload_bytes: usize,
    /// How fine-tuning jobs are trained (with `state_dir`).
    pub finetune: FinetuneOptions,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            api_key: None,
            max_body: 4 << 20,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            state_dir: None,
            max_upload_bytes: 100 << 20,
            finetune: FinetuneOptions::default(),
        }
    }
}

impl ServerOptions {
    /// `model` as this server runs it: with a state directory (so a split trainer may run
    /// beside the engine), a flat engine is kept to the first `threads` allowed CPUs when
    /// they and the trainer's threads fit in the allowed ones, the trainer taking the next.
    fn engine_options(&self, mut model: ModelOptions) -> ModelOptions {
        if self.state_dir.is_none() || model.placement.as_ref().is_some_and(|p| p.numa) {
            return model;
        }
        let threads = match model.placement.as_ref() {
            Some(p) => p.n_threads(),
            None if model.threads > 0 => model.threads,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        if let Some(cpus) = finetune::engine_cpus(threads, self.finetune.threads) {
            model.placement = Some(TensorPlacement { topology: Topology::fallback(&cpus), threads: vec![threads], numa: false });
        }
        model
    }
}

/// The model and how to serve it.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    pub path: PathBuf,
    /// Compute threads (0: all available CPUs).
    pub threads: usize,
    /// Longest sequence one request may have (default: the model's context, at most 4096;
    /// 0: the model's).
    pub ctx_size: Option<usize>,
    /// KV cache tokens over all sequences (default: `parallel` × the context size, so every
    /// running request can reserve a full context; blocks never used cost no memory).
    pub kv_budget: Option<usize>,
    /// Most sequences running at once.
    pub parallel: usize,
    /// Most requests waiting for admission.
    pub queue: usize,
    /// Prompt tokens evaluated per engine step.
    pub step_tokens: usize,
    pub kv_type: KvType,
    /// Keep every position of the sliding-window layers (see `EngineConfig::swa_full`).
    pub swa_full: bool,
    pub prefix_cache: bool,
    /// Most tokens the prefix cache keeps in blocks no request owns (default: a quarter of
    /// the KV budget).
    pub prefix_cache_tokens: Option<usize>,
    /// Most distinct adapters (or adapter mixes) in one engine step.
    pub max_loras: usize,
    /// The LoRA adapters to serve, and how run-time loads are allowed.
    pub adapters: AdapterOptions,
    /// Flat or tensor parallel over NUMA nodes (`None`: flat over `threads`).
    pub placement: Option<TensorPlacement>,
    /// The requests' latency targets, how much of each step co-served training may take,
    /// and the latency model's calibrated coefficients (`blink calibrate`).
    pub slo: SloTargets,
    pub training: TrainingPolicy,
    pub latency: Option<Coefficients>,
    /// Serve on a ring of devices: this process is its head.
    pub ring: Option<RingOption>,
}

/// Serving on a ring: which layers the head holds, and how it connects to the devices
/// once its share is loaded (given the engine's sizes).
#[derive(Clone)]
pub struct RingOption {
    pub share: Share,
    /// Most steps of different sequences going round the ring at once.
    pub in_flight: usize,
    #[allow(clippy::type_complexity)]
    pub connect: Arc<dyn Fn(Arc<Model>, &EngineConfig) -> Result<Box<dyn RemoteSteps>, String> + Send + Sync>,
}

impl std::fmt::Debug for RingOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingOption").field("share", &self.share).finish_non_exhaustive()
    }
}

impl ModelOptions {
    /// Defaults for the model at `path`.
    pub fn new(path: impl Into<PathBuf>) -> ModelOptions {
        ModelOptions {
            path: path.into(),
            threads: 0,
            ctx_size: None,
            kv_budget: None,
            parallel: 16,
            queue: 64,
            step_tokens: 256,
            kv_type: KvType::F16,
            swa_full: false,
            prefix_cache: true,
            prefix_cache_tokens: None,
            max_loras: 8,
            adapters: AdapterOptions::default(),
            placement: None,
            slo: SloTargets::default(),
            training: TrainingPolicy::default(),
            latency: None,
            ring: None,
        }
    }
}

/// A loaded model being served.
pub struct Ready {
    pub engine: Engine,
    pub model: Arc<Model>,
    /// The model file.
    pub path: PathBuf,
    pub tokenizer: Arc<Tokenizer>,
    /// The model's template, or ChatML for a model that has none (as llama.cpp's server).
    pub template: Arc<ChatTemplate>,
    /// The id `/v1/models` reports: the file name without `.gguf`.
    pub model_id: String,
    /// Other names accepted in the `model` field (the file name, `general.name`).
    pub aliases: Vec<String>,
    /// Unix time the model was loaded.
    pub created: u64,
    /// Longest sequence (prompt + generated) per request.
    pub max_seq_len: usize,
    /// The LoRA adapters served over the model.
    pub adapters: Arc<Adapters>,
    /// The fine-tuning jobs and what trains them (with a state directory).
    pub fine_tuning: Option<Arc<FineTuning>>,
}

impl Ready {
    /// Load the model, tokenizer and template and start the engine. Blocks (run it off the
    /// async runtime).
    pub fn load(opts: &ModelOptions) -> Result<Ready, String> {
        Ready::load_with(opts, None)
    }

    /// [`Ready::load`], with the fine-tuning jobs of `jobs` started before the engine (a
    /// trainer may run inside it) and the adapters they made served.
    pub fn load_with(opts: &ModelOptions, jobs: Option<&JobsSetup>) -> Result<Ready, String> {
        let path = &opts.path;
        let threads = if opts.threads > 0 { opts.threads } else { std::thread::available_parallelism().map_or(1, |n| n.get()) };
        let placement = opts.placement.clone().unwrap_or_else(|| TensorPlacement::flat(threads));
        let share = opts.ring.as_ref().map_or_else(Share::all, |r| r.share.clone());
        let mut loaded = Loaded::load_share(path, &placement, share).map_err(|e| e.to_string())?;
        // As llama.cpp's server, a model without a template chats in ChatML.
        if let Some(w) = loaded.chatml_if_missing() {
            loaded.warnings.push(format!("{}: {w}", path.display()));
        }
        for w in &loaded.warnings {
            eprintln!("blink: warning: {w}");
        }
        let Loaded { mut model, tokenizer, template, .. } = loaded;
        let (tokenizer, template) = (Arc::new(tokenizer), Arc::new(template.unwrap_or_else(ChatTemplate::chatml)));

        let ctx = model.cfg.context_for(opts.ctx_size);
        if let Some(w) = model.cfg.context_warning(ctx) {
            eprintln!("blink: warning: {w}");
        }
        if opts.ring.is_none() {
            // A ring's devices keep the rope they load with; so does its head.
            model.fit_context(ctx);
        }
        let kv_tokens = opts.kv_budget.filter(|&k| k > 0).unwrap_or(ctx.saturating_mul(opts.parallel.max(1)));
        if kv_tokens < ctx {
            return Err(format!("--kv-budget ({kv_tokens} tokens) must be at least --ctx-size ({ctx} tokens)"));
        }
        for (name, value) in [("--parallel", opts.parallel), ("--step-tokens", opts.step_tokens), ("--queue", opts.queue)] {
            if value == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        let cfg = EngineConfig {
            n_threads: placement.n_threads(),
            kv_tokens,
            max_seq_len: ctx,
            step_tokens: opts.step_tokens,
            max_running: opts.parallel,
            max_queue: opts.queue,
            kv_type: opts.kv_type,
            swa_full: opts.swa_full,
            prefix_cache: opts.prefix_cache,
            prefix_cache_tokens: opts.prefix_cache_tokens,
            max_loras: opts.max_loras,
            slo: opts.slo,
            training: opts.training,
            latency: opts.latency.clone(),
        };

        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let model_id = file_name.strip_suffix(".gguf").unwrap_or(&file_name).to_owned();
        let mut aliases = vec![file_name.clone()];
        if let Ok(Some(name)) = model.file().opt_str("general.name") {
            aliases.push(name.to_owned());
        }
        let eog = tokenizer.eog_ids().to_vec();
        let model = Arc::new(model);
        let names: Vec<String> = std::iter::once(model_id.clone()).chain(aliases.iter().cloned()).collect();
        let adapters = Arc::new(Adapters::start(model.clone(), &opts.adapters, &names)?);
        let (fine_tuning, coserve) = match jobs {
            Some(setup) => {
                let served = ServedModel { model: &model, path, tokenizer: &tokenizer, template: &template, names, adapters: &adapters };
                let (jobs, hook) = finetune::start(setup, served)?;
                (Some(Arc::new(jobs)), hook)
            }
            None => (None, None),
        };
        let engine = match &opts.ring {
            Some(ring) => {
                if coserve.is_some() {
                    return Err("fine-tuning jobs do not run on a ring yet: drop --state-dir (or the jobs API) with --cluster".into());
                }
                let remote = (ring.connect)(model.clone(), &cfg)?;
                Engine::start_remote(model.clone(), eog, cfg, remote, ring.in_flight).map_err(|e| e.to_string())?
            }
            None => Engine::start_with(model.clone(), eog, cfg, coserve).map_err(|e| e.to_string())?,
        };
        if let Some(jobs) = &fine_tuning {
            // A co-serving engine sleeps while nothing runs: a job handed over wakes it.
            let waker = engine.clone();
            jobs.service.set_waker(Box::new(move || waker.wake()));
        }
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Ok(Ready { engine, model, path: path.clone(), tokenizer, template, model_id, aliases, created, max_seq_len: ctx, adapters, fine_tuning })
    }

    /// The base model's names: its id and aliases (adapters may not take them).
    pub fn base_names(&self) -> Vec<String> {
        std::iter::once(self.model_id.clone()).chain(self.aliases.iter().cloned()).collect()
    }

    /// Whether `name` is absent, empty, or one of the base model's names.
    pub fn is_base(&self, name: Option<&str>) -> bool {
        match name {
            None | Some("") => true,
            Some(n) => n == self.model_id || self.aliases.iter().any(|a| a == n),
        }
    }

    /// What a request with `model` and `lora` runs on: the adapter mix (`None`: the base
    /// model) and the name its answers report. 404 for a name that is neither the base
    /// model's nor a served adapter's.
    pub async fn pick(&self, model: Option<&str>, lora: Option<&[(u64, f32)]>) -> Result<(Option<Arc<LoraMix>>, String), ApiError> {
        let adapter = match model {
            m if self.is_base(m) => None,
            Some(n) if self.adapters.contains(n) => Some(n),
            Some(n) => return Err(ApiError::model_not_found(n, &self.model_id)),
            None => None,
        };
        let mix = self.adapters.resolve(adapter, lora).await?;
        Ok((mix, adapter.map_or_else(|| self.model_id.clone(), str::to_owned)))
    }

    /// Render `messages` with the chat template and tokenize the result, stripping a leading
    /// BOS text when the tokenizer adds BOS itself (as `blink run` and llama.cpp do).
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, ApiError> {
        self.template.prompt_tokens(&self.tokenizer, messages).map_err(|e| ApiError::param("messages", e.to_string()))
    }
}

/// State shared by all handlers.
pub struct AppState {
    pub opts: ServerOptions,
    pub metrics: Metrics,
    ready: OnceLock<Arc<Ready>>,
    /// Uploaded files, when the server has a state directory.
    pub files: Option<Arc<FileStore>>,
}

/// The handle handlers receive.
pub type App = Arc<AppState>;

impl AppState {
    /// The state for `opts`, with the file store of its state directory opened.
    pub fn new(opts: ServerOptions) -> Result<AppState, StoreError> {
        let files = opts.state_dir.as_deref().map(FileStore::open).transpose()?.map(Arc::new);
        Ok(AppState { opts, metrics: Metrics::default(), ready: OnceLock::new(), files })
    }

    /// The loaded model, or 503 while it loads.
    pub fn ready(&self) -> Result<Arc<Ready>, ApiError> {
        self.ready.get().cloned().ok_or_else(ApiError::loading)
    }

    /// The loaded model, if any.
    pub fn try_ready(&self) -> Option<&Arc<Ready>> {
        self.ready.get()
    }

    /// Load the model as this server runs it: the engine kept off a split trainer's CPUs
    /// and, with a state directory, the fine-tuning jobs started with it. Blocks (it loads
    /// the model and reads the state directory): run it off the async runtime.
    pub fn load(&self, model: &ModelOptions) -> Result<Ready, String> {
        let model = self.opts.engine_options(model.clone());
        let jobs = match (&self.opts.state_dir, &self.files) {
            (Some(dir), Some(files)) => Some(JobsSetup { state_dir: dir.clone(), files: files.clone(), options: self.opts.finetune.clone() }),
            _ => None,
        };
        Ready::load_with(&model, jobs.as_ref())
    }

    /// Publish the loaded model; a second call is ignored.
    pub fn set_ready(&self, ready: Ready) {
        let _ = self.ready.set(Arc::new(ready));
    }

    /// The fine-tuning jobs: 403 without a state directory, 503 while the model loads.
    pub fn jobs(&self) -> Result<Arc<FineTuning>, ApiError> {
        if self.files.is_none() {
            return Err(ApiError::forbidden("files and fine-tuning jobs need a state directory: start the server with --state-dir DIR"));
        }
        self.ready()?.fine_tuning.clone().ok_or_else(|| ApiError::internal("the fine-tuning jobs did not start"))
    }

    /// The fine-tuning jobs and their trainer, once the model is loaded.
    pub fn fine_tuning(&self) -> Option<&FineTuning> {
        self.ready.get().and_then(|r| r.fine_tuning.as_deref())
    }
}
