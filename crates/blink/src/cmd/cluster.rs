//! `--cluster cluster.toml` for the commands that run a model: the ring the file fixes
//! or the planner chooses, the head's share of the model loaded here, and the devices
//! connected and assigned their windows.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blink_cluster::link::Shim;

use blink_cluster::auth::{file_sha256, Token};
use blink_cluster::head::{RingHead, RingSpec};
use blink_engine::RunnerConfig;
use blink_cluster::ClusterFile;
use blink_engine::Loaded;
use blink_model::config::ModelConfig;
use blink_engine::serve::{EngineConfig, RemoteSteps};
use blink_model::{Matrices, Share, TensorPlacement};
use blink_server::state::RingOption;
use blink_text::{ChatTemplate, Tokenizer};

use crate::common::{CliResult, ComputeArgs, ModelArgs};


/// Running on a ring (`run`, `bench`): the cluster file, and a slow link to imitate.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RingArgs {
    /// Run on a ring of devices (`blink node`s) as this file describes; this process is
    /// the head.
    #[arg(long, value_name = "CLUSTER.toml")]
    pub cluster: Option<PathBuf>,
    #[command(flatten)]
    pub shim: ShimArgs,
}

/// A slow link imitated on the connections into this process (the machine may have no
/// netem): per hop, as every device's own shim adds its hop.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ShimArgs {
    /// Delay every frame coming into this process by this many milliseconds.
    #[arg(long = "shim-latency-ms", value_name = "MS", default_value_t = 0.0)]
    pub latency_ms: f64,
    /// Carry frames into this process at this many megabits per second (0: unlimited).
    #[arg(long = "shim-mbps", value_name = "MBPS", default_value_t = 0.0)]
    pub mbps: f64,
}

impl ShimArgs {
    pub fn shim(&self) -> CliResult<Shim> {
        Ok(Shim::new(self.latency_ms, self.mbps)?)
    }
}

/// A ring's head, ready to run steps, and the text side of the model.
pub struct Head {
    pub ring: RingHead,
    /// The head's share of the model (adapters are placed on it, then sent on).
    pub model: Arc<blink_model::Model>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub n_ctx: usize,
    pub n_batch: usize,
}

/// What the head runs with.
pub struct HeadSizes {
    pub threads: usize,
    /// The context (`None`: the model's, at most 4096).
    pub ctx: Option<usize>,
    /// Most rows in a step.
    pub n_batch: usize,
    /// Most rows with logits in a step.
    pub n_logits: usize,
    /// Tokens each cache holds over all sequences (`None`: the context).
    pub kv_tokens: Option<usize>,
    pub kv_type: blink_model::KvType,
}

impl HeadSizes {
    /// A single conversation's sizes (`run`).
    pub fn of(compute: &ComputeArgs) -> CliResult<HeadSizes> {
        Ok(HeadSizes { threads: compute.threads()?, ctx: compute.ctx_size, n_batch: compute.batch_size, n_logits: 1, kv_tokens: None, kv_type: compute.cache_type })
    }
}

/// A ring about to start: its plan, the head's share of the model, the token.
pub struct Prepared {
    pub spec: RingSpec,
    pub token: Token,
    pub share: Share,
    /// The context the ring is planned for.
    pub n_ctx: usize,
}

/// Read the cluster file at `path` and plan the ring (or take its fixed plan) for the
/// model `model` names at context `ctx`.
pub fn prepare(path: &Path, shim: &ShimArgs, model: &ModelArgs, ctx: Option<usize>, kv_type: blink_model::KvType) -> CliResult<Prepared> {
    let file = ClusterFile::load(path)?;
    let model_path = model.path()?;
    let gguf = model.open()?;
    let cfg = ModelConfig::from_gguf(&gguf)?;
    let n_ctx = cfg.context_for(ctx);
    let (ring, cluster) = super::plan::ring_of(&file, &gguf, &cfg, n_ctx, kv_type)?;
    eprintln!("blink: ring of {} device(s), windows {:?}, {} round(s)", ring.windows().len(), ring.windows(), ring.rounds());
    let head_windows = file.head.map(|h| ring.device_windows(h)).unwrap_or_default();
    // Over the head's own budget, its windows are streamed as a node's are.
    let head_memory = file.head.and_then(|h| file.devices[h].memory).unwrap_or(0);
    let matrices = blink_cluster::head::own_matrices(&gguf, 2 * cfg.kv_dim() * kv_type.bytes(), n_ctx, &head_windows, head_memory);
    if matrices == Matrices::Streamed {
        eprintln!("blink: the head's windows exceed its memory budget: streamed from the file");
    }
    drop(gguf);
    let token = Token::read(&file.token_file)?;
    let spec = RingSpec {
        ring,
        head: file.head,
        addrs: file.devices.iter().map(|d| d.addr.clone().unwrap_or_default()).collect(),
        threads: file.devices.iter().map(|d| d.threads.unwrap_or(0)).collect(),
        memory: file.devices.iter().map(|d| d.memory.unwrap_or(0)).collect(),
        model_sha256: file_sha256(&model_path).map_err(|e| format!("{}: {e}", model_path.display()))?,
        shim: shim.shim()?,
        cluster,
    };
    Ok(Prepared { spec, token, share: Share::windows(head_windows, matrices), n_ctx })
}

/// Start the ring of the cluster file at `path` for the model `model` names (the kernel
/// path must already be fixed).
pub fn start(path: &Path, shim: &ShimArgs, model: &ModelArgs, sizes: &HeadSizes) -> CliResult<Head> {
    let p = prepare(path, shim, model, sizes.ctx, sizes.kv_type)?;
    let model_path = model.path()?;
    let loaded = Loaded::load_share(&model_path, &TensorPlacement::flat(sizes.threads), p.share)?;
    for w in &loaded.warnings {
        eprintln!("blink: warning: {w}");
    }
    let Loaded { model, tokenizer, template, .. } = loaded;
    let n_batch = sizes.n_batch.clamp(1, p.n_ctx);
    let windows = RunnerConfig {
        threads: sizes.threads,
        kv_tokens: sizes.kv_tokens.unwrap_or(p.n_ctx),
        kv_type: sizes.kv_type,
        max_rows: n_batch,
        max_logit_rows: sizes.n_logits.clamp(1, n_batch),
        max_ctx: p.n_ctx,
        // The devices' window caches keep every position anyway.
        swa_full: false,
        detached: false,
    };
    let model = Arc::new(model);
    let ring = RingHead::start(model.clone(), p.spec, &p.token, windows)?;
    Ok(Head { ring, model, tokenizer, template, n_ctx: p.n_ctx, n_batch })
}

/// `serve --cluster`: the head's share, and how the server's engine reaches the ring
/// once the share is loaded.
pub fn serving(path: &Path, shim: &ShimArgs, model: &ModelArgs, ctx: Option<usize>, kv_type: blink_model::KvType, in_flight: usize) -> CliResult<RingOption> {
    let p = prepare(path, shim, model, ctx, kv_type)?;
    let (spec, token) = (p.spec, p.token);
    let connect = move |model: Arc<blink_model::Model>, cfg: &EngineConfig| -> Result<Box<dyn RemoteSteps>, String> {
        Ok(Box::new(RingHead::start(model, spec.clone(), &token, cfg.runner_config(false))?))
    };
    Ok(RingOption { share: p.share, in_flight, connect: Arc::new(connect) })
}
