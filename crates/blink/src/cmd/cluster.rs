//! `--cluster cluster.toml` for the commands that run a model: the ring the file fixes
//! or the planner chooses, the head's share of the model loaded here, and the devices
//! connected and assigned their windows.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blink_cluster::link::Shim;

use blink_cluster::auth::{file_sha256, Token};
use blink_cluster::head::{RingHead, RingSpec};
use blink_cluster::windows::WindowSizes;
use blink_cluster::ClusterFile;
use blink_engine::Loaded;
use blink_model::config::ModelConfig;
use blink_model::{Share, TensorPlacement};
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

/// Start the ring of the cluster file at `path` for the model `model` names (the kernel
/// path must already be fixed).
pub fn start(path: &Path, shim: &ShimArgs, model: &ModelArgs, sizes: &HeadSizes) -> CliResult<Head> {
    let file = ClusterFile::load(path)?;
    let model_path = model.path()?;
    let gguf = model.open()?;
    let cfg = ModelConfig::from_gguf(&gguf)?;
    let n_ctx = cfg.context_for(sizes.ctx);
    let ring = super::plan::ring_of(&file, &gguf, &cfg, n_ctx, sizes.kv_type)?;
    drop(gguf);
    eprintln!("blink: ring of {} device(s), windows {:?}, {} round(s)", ring.windows().len(), ring.windows(), ring.rounds());
    let head_windows = file.head.map(|h| ring.device_windows(h)).unwrap_or_default();
    let threads = sizes.threads;
    let loaded = Loaded::load_share(&model_path, &TensorPlacement::flat(threads), Share::windows(head_windows, blink_model::Matrices::Repacked))?;
    for w in &loaded.warnings {
        eprintln!("blink: warning: {w}");
    }
    let Loaded { model, tokenizer, template, .. } = loaded;
    let token = Token::read(&file.token_file)?;
    let spec = RingSpec {
        ring,
        head: file.head,
        addrs: file.devices.iter().map(|d| d.addr.clone().unwrap_or_default()).collect(),
        threads: file.devices.iter().map(|d| d.threads.unwrap_or(0)).collect(),
        memory: file.devices.iter().map(|d| d.memory.unwrap_or(0)).collect(),
        model_sha256: file_sha256(&model_path).map_err(|e| format!("{}: {e}", model_path.display()))?,
        shim: shim.shim()?,
    };
    let n_batch = sizes.n_batch.clamp(1, n_ctx);
    let sizes = WindowSizes { threads, kv_tokens: sizes.kv_tokens.unwrap_or(n_ctx), kv_type: sizes.kv_type, max_rows: n_batch, max_logit_rows: sizes.n_logits.clamp(1, n_batch), max_ctx: n_ctx };
    let ring = RingHead::start(Arc::new(model), spec, &token, sizes)?;
    Ok(Head { ring, tokenizer, template, n_ctx, n_batch })
}
