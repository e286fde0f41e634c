//! `blink serve`: the OpenAI-compatible HTTP server.
//!
//! The port is bound first, so `/health` answers 503 "loading" while the model is fetched
//! and loaded; then the engine starts and the URL is printed on stdout. Ctrl-C (or SIGTERM)
//! stops accepting connections and gives in-flight requests a grace period; a second one
//! stops at once.

use std::io::Write;
use std::time::Duration;

use blink_model::KvType;
use blink_engine::serve::latency::Coefficients;
use blink_engine::serve::{SloTargets, TrainingPolicy};
use blink_server::{AdapterOptions, FinetuneMode, FinetuneOptions, ModelOptions, Ready, Server, ServerOptions};
use blink_train::jobs::JobSettings;

use crate::common::{parse_kv_type, CliResult, KernelArgs, ModelArgs, NumaArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health and the chat page.
    #[arg(long = "api-key")]
    api_key: Option<String>,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    ring: super::cluster::RingArgs,
    /// With --cluster: most steps of different sequences going round the ring at once (the
    /// running sequences share out over them), so no device waits for one step's trip.
    #[arg(long = "in-flight", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    in_flight: u64,
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = 4 << 20)]
    max_body: usize,
    /// Seconds a client gets to send a request's headers.
    #[arg(long = "header-timeout", default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a client gets to send a request's body.
    #[arg(long = "body-timeout", default_value_t = 30.0)]
    body_timeout: f64,
    /// Directory for uploaded files and fine-tuning jobs (/v1/files, /v1/fine_tuning/jobs);
    /// without it those endpoints are off.
    #[arg(long = "state-dir", value_name = "DIR")]
    state_dir: Option<std::path::PathBuf>,
    /// Largest file POST /v1/files accepts, in bytes.
    #[arg(long = "max-upload-bytes", default_value_t = 100 << 20)]
    max_upload_bytes: usize,
    #[command(flatten)]
    finetune: FinetuneArgs,
}

/// How fine-tuning jobs are trained (with --state-dir).
#[derive(clap::Args, Clone, Debug)]
pub struct FinetuneArgs {
    /// What trains the jobs: `coserve`, the engine in the time the requests' targets leave
    /// (see --slo-ttft, --slo-tpot, --coserve-policy); `split`, a thread and pool of their
    /// own beside the engine (pinned to the CPUs after the engine's when -t leaves room).
    #[arg(long = "finetune-mode", default_value = "coserve", value_parser = parse_mode)]
    finetune_mode: FinetuneMode,
    /// Threads of the fine-tuning pool.
    #[arg(long = "finetune-threads", default_value_t = 1)]
    finetune_threads: usize,
    /// The share of the time the split trainer trains (0 to 1; 1: back to back), pausing
    /// after each unit to keep to it: a trainer held to a fixed slice of the machine.
    #[arg(long = "finetune-share", default_value_t = 1.0)]
    finetune_share: f64,
    /// The learning rate a job's learning_rate_multiplier of 1 gives (default 1e-3).
    #[arg(long = "finetune-lr", hide = true)]
    finetune_lr: Option<f64>,
    /// Tokens per packed training batch (default 512).
    #[arg(long = "finetune-batch-tokens", hide = true)]
    finetune_batch_tokens: Option<usize>,
    /// The rank of the adapters jobs train (default 8; alpha is twice it).
    #[arg(long = "finetune-rank", hide = true)]
    finetune_rank: Option<usize>,
}

fn parse_mode(s: &str) -> Result<FinetuneMode, String> {
    FinetuneMode::parse(s).ok_or_else(|| format!("unknown fine-tuning mode '{s}' (use coserve or split)"))
}

impl FinetuneArgs {
    fn options(&self) -> CliResult<FinetuneOptions> {
        if self.finetune_threads == 0 {
            return Err("--finetune-threads must be at least 1".into());
        }
        let mut settings = JobSettings::default();
        if let Some(lr) = self.finetune_lr {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(format!("--finetune-lr must be a positive number, not {lr}").into());
            }
            settings.base_lr = lr;
        }
        if let Some(tokens) = self.finetune_batch_tokens {
            if tokens == 0 {
                return Err("--finetune-batch-tokens must be at least 1".into());
            }
            settings.batch_tokens = tokens;
        }
        if let Some(rank) = self.finetune_rank {
            if rank == 0 {
                return Err("--finetune-rank must be at least 1".into());
            }
            (settings.rank, settings.alpha) = (rank, 2.0 * rank as f32);
        }
        if !(self.finetune_share > 0.0 && self.finetune_share <= 1.0) {
            return Err(format!("--finetune-share must be in (0, 1], not {}", self.finetune_share).into());
        }
        Ok(FinetuneOptions { mode: self.finetune_mode, threads: self.finetune_threads, share: self.finetune_share, settings })
    }
}

/// How the engine serves the model (shared with `blink bench-serve`).
#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    /// Longest sequence (prompt + generated) per request (default: the model's context, at most 4096; 0: the model's).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// KV cache tokens over all running sequences (default: --parallel × --ctx-size). Cache
    /// never used costs no memory, and the memory of freed blocks goes back to the OS, so a
    /// server holds what its running requests use plus what --prefix-cache-tokens keeps.
    #[arg(long = "kv-budget")]
    pub kv_budget: Option<usize>,
    /// Most tokens the prefix cache keeps in blocks no running request owns (default: a
    /// quarter of --kv-budget); beyond it the least recently used are freed.
    #[arg(long = "prefix-cache-tokens")]
    pub prefix_cache_tokens: Option<usize>,
    /// Most sequences generating at once (also `-np`).
    #[arg(long = "parallel", default_value_t = 16)]
    pub parallel: usize,
    /// Most requests waiting beyond the free --parallel slots; more are refused with 503.
    #[arg(long = "queue", default_value_t = 64)]
    pub queue: usize,
    /// Prompt tokens evaluated per engine step (chunked prefill).
    #[arg(long = "step-tokens", default_value_t = 256)]
    pub step_tokens: usize,
    /// Compute threads (default: all available CPUs).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// KV cache element type: f16 or f32.
    #[arg(long = "cache-type", default_value = "f16", value_parser = parse_kv_type)]
    pub cache_type: KvType,
    /// Keep every position of a model's sliding-window layers in the KV cache, so that any
    /// cached prefix can be reused (otherwise they keep a window's worth and give the rest
    /// of their memory back; a prefix is then reused where the window before its end is
    /// still whole).
    #[arg(long = "swa-full")]
    pub swa_full: bool,
    /// Do not reuse the KV cache of shared prompt prefixes.
    #[arg(long = "no-prefix-cache")]
    pub no_prefix_cache: bool,
    #[command(flatten)]
    pub lora: ServerLoraArgs,
    #[command(flatten)]
    pub coserve: CoServeArgs,
    #[command(flatten)]
    pub kernel: KernelArgs,
    #[command(flatten)]
    pub numa: NumaArgs,
}

/// The requests' latency targets and what co-served fine-tuning may take of each step.
#[derive(clap::Args, Clone, Debug)]
pub struct CoServeArgs {
    /// Time-to-first-token target (p99, seconds) that co-served fine-tuning must leave
    /// every request.
    #[arg(long = "slo-ttft", value_name = "SECONDS", default_value_t = 1.0)]
    pub slo_ttft: f64,
    /// Time-per-output-token target (p99, seconds).
    #[arg(long = "slo-tpot", value_name = "SECONDS", default_value_t = 0.1)]
    pub slo_tpot: f64,
    /// How much of each step fine-tuning jobs get: `slo` (what the targets leave, by the
    /// latency model), `idle` (only steps with no request), `always` (a unit in every
    /// step: no admission control).
    #[arg(long = "coserve-policy", value_name = "POLICY", default_value = "slo", value_parser = ["slo", "idle", "always"])]
    pub policy: String,
    /// The latency model's coefficients, from `blink calibrate` (default: start
    /// uncalibrated and learn while serving).
    #[arg(long = "latency", value_name = "FILE")]
    pub latency: Option<std::path::PathBuf>,
}

impl CoServeArgs {
    fn apply(&self, opts: &mut ModelOptions) -> CliResult {
        opts.slo = SloTargets { ttft: seconds("slo-ttft", self.slo_ttft)?, tpot: seconds("slo-tpot", self.slo_tpot)? };
        opts.training = TrainingPolicy::parse(&self.policy).ok_or("--coserve-policy: slo, idle or always")?;
        if let Some(path) = &self.latency {
            opts.latency = Some(Coefficients::load(path)?);
        }
        Ok(())
    }
}

/// The adapters a server serves, and how it may load more.
#[derive(clap::Args, Clone, Debug)]
pub struct ServerLoraArgs {
    /// A LoRA adapter (PEFT directory or llama.cpp LoRA GGUF) served as NAME, picked by a
    /// request's `model: "NAME"` (as vLLM); repeatable. Without `NAME=`, as llama.cpp's
    /// server: named after its file and applied at scale 1 to requests that pick no adapter.
    #[arg(long = "lora", value_name = "NAME=PATH")]
    pub lora: Vec<String>,
    /// As llama.cpp's server: an adapter applied at SCALE to requests that pick no adapter.
    #[arg(long = "lora-scaled", num_args = 2, value_names = ["PATH", "SCALE"], allow_hyphen_values = true)]
    pub lora_scaled: Vec<String>,
    /// Allow run-time loads (`POST /v1/load_lora_adapter`) of adapters inside DIR only
    /// (default: no run-time loading).
    #[arg(long = "lora-dir", value_name = "DIR")]
    pub lora_dir: Option<std::path::PathBuf>,
    /// Most distinct adapters (or mixes) in one engine step; rows over it wait a step.
    #[arg(long = "max-loras", default_value_t = 8)]
    pub max_loras: usize,
    /// Most adapters held in memory (default: no limit); past it the least recently used
    /// idle one is evicted, and read again when a request asks for it.
    #[arg(long = "max-cpu-loras")]
    pub max_cpu_loras: Option<usize>,
}

impl ServerLoraArgs {
    fn options(&self) -> CliResult<AdapterOptions> {
        let mut preload = Vec::new();
        for arg in &self.lora {
            // NAME=PATH, unless what precedes '=' looks like a path.
            match arg.split_once('=') {
                Some((name, path)) if !name.is_empty() && !name.contains('/') => preload.push((name.to_owned(), path.into(), 0.0)),
                _ => {
                    let path = std::path::PathBuf::from(arg);
                    preload.push((blink_server::adapters::default_name(&path), path, 1.0));
                }
            }
        }
        for (path, scale) in crate::lora_args::parse_scaled(&self.lora_scaled)? {
            preload.push((blink_server::adapters::default_name(&path), path, scale));
        }
        if self.max_loras == 0 {
            return Err("--max-loras must be at least 1".into());
        }
        Ok(AdapterOptions { preload, dir: self.lora_dir.clone(), max_resident: self.max_cpu_loras })
    }
}

impl EngineArgs {
    /// Model options for the file at `path`.
    pub fn options(&self, path: std::path::PathBuf) -> CliResult<ModelOptions> {
        let threads = crate::common::resolve_threads(self.threads)?;
        let mut opts = ModelOptions {
            placement: Some(self.numa.placement(threads)?),
            threads: self.threads.unwrap_or(0),
            ctx_size: self.ctx_size,
            kv_budget: self.kv_budget,
            parallel: self.parallel,
            queue: self.queue,
            step_tokens: self.step_tokens,
            kv_type: self.cache_type,
            swa_full: self.swa_full,
            prefix_cache: !self.no_prefix_cache,
            prefix_cache_tokens: self.prefix_cache_tokens,
            max_loras: self.lora.max_loras,
            adapters: self.lora.options()?,
            ..ModelOptions::new(path)
        };
        self.coserve.apply(&mut opts)?;
        Ok(opts)
    }
}

/// Seconds as a duration, refusing nonsense.
pub fn seconds(name: &str, s: f64) -> CliResult<Duration> {
    Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero()).ok_or_else(|| format!("--{name} must be a positive number of seconds").into())
}

pub fn main(args: Args) -> CliResult {
    args.engine.kernel.apply()?;
    let opts = ServerOptions {
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_body: args.max_body,
        header_timeout: seconds("header-timeout", args.header_timeout)?,
        body_timeout: seconds("body-timeout", args.body_timeout)?,
        state_dir: args.state_dir.clone(),
        max_upload_bytes: args.max_upload_bytes,
        finetune: args.finetune.options()?,
        ..ServerOptions::default()
    };
    let runtime = crate::common::io_runtime("blink-http")?;
    runtime.block_on(serve(args, opts))
}

async fn serve(args: Args, opts: ServerOptions) -> CliResult {
    let server = Server::bind((args.host.as_str(), args.port), opts)
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", args.host, args.port))?;
    let url = format!("http://{}", server.addr());
    eprintln!("blink: listening on {url}; loading the model (/health answers 503 until it is ready)");
    let (model, engine, ring, app) = (args.model.clone(), args.engine.clone(), args.ring.clone(), server.app().clone());
    let in_flight = args.in_flight as usize;
    if in_flight > 1 && ring.cluster.is_none() {
        return Err("--in-flight is for a ring (--cluster): one process runs one step at a time".into());
    }
    let ready = tokio::task::spawn_blocking(move || -> Result<Ready, String> {
        let path = model.path().map_err(|e| e.to_string())?;
        let mut opts = engine.options(path).map_err(|e| e.to_string())?;
        if let Some(file) = &ring.cluster {
            opts.ring = Some(super::cluster::serving(file, &ring.shim, &model, engine.ctx_size, engine.cache_type, in_flight).map_err(|e| e.to_string())?);
        }
        app.load(&opts)
    });
    let ready = tokio::select! {
        r = ready => r.map_err(|e| format!("loading the model failed: {e}"))??,
        _ = shutdown_signal() => return Ok(()),
    };
    let cfg = ready.engine.config().clone();
    eprintln!(
        "blink: serving {} (context {} tokens per request, KV cache {} tokens (prefix cache {}), {} parallel, {} threads, kernel {}, dot order {}); chat page at {url}/, API at {url}/v1",
        ready.model_id,
        cfg.max_seq_len,
        cfg.kv_tokens,
        cfg.cached_tokens_limit(),
        cfg.max_running,
        cfg.n_threads,
        blink_kernels::cpu::active(),
        crate::cmd::info::order_line(blink_kernels::cpu::active(), blink_kernels::order::active())
    );
    for a in ready.adapters.list() {
        eprintln!("blink: adapter '{}' (id {}, rank {}, alpha {}, default scale {}) from {}", a.name, a.id, a.rank, a.alpha, a.scale, a.path.display());
    }
    server.set_ready(ready);
    if let (Some(dir), Some(_)) = (&args.state_dir, server.app().fine_tuning()) {
        let f = &server.app().opts.finetune;
        eprintln!("blink: fine-tuning jobs in {} ({} trainer, {} thread(s))", dir.display(), f.mode.as_str(), f.threads);
    }
    outln!("{url}")?;
    let _ = std::io::stdout().flush();
    shutdown_signal().await;
    eprintln!("blink: shutting down; in-flight requests get 10 s to finish (Ctrl-C again to stop now)");
    tokio::select! {
        _ = server.shutdown() => eprintln!("blink: stopped"),
        _ = shutdown_signal() => eprintln!("blink: stopped without waiting"),
    }
    Ok(())
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
