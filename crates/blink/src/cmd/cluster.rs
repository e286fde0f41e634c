//! `--cluster cluster.toml` for the commands that run a model: the ring the file fixes
//! or the planner chooses, the head's share of the model loaded here, and the devices
//! connected and assigned their windows.

use std::path::Path;
use std::sync::Arc;

use blink_cluster::auth::{file_sha256, Token};
use blink_cluster::head::{RingHead, RingSpec};
use blink_cluster::windows::WindowSizes;
use blink_cluster::ClusterFile;
use blink_engine::Loaded;
use blink_model::config::ModelConfig;
use blink_model::{Share, TensorPlacement};
use blink_text::{ChatTemplate, Tokenizer};

use crate::common::{CliResult, ComputeArgs, ModelArgs};

/// A ring's head, ready to run steps, and the text side of the model.
pub struct Head {
    pub ring: RingHead,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub n_ctx: usize,
    pub n_batch: usize,
}

/// Start the ring of the cluster file at `path` for the model `model` names.
pub fn start(path: &Path, model: &ModelArgs, compute: &ComputeArgs) -> CliResult<Head> {
    compute.kernel.apply()?;
    let file = ClusterFile::load(path)?;
    let model_path = model.path()?;
    let gguf = model.open()?;
    let cfg = ModelConfig::from_gguf(&gguf)?;
    let n_ctx = cfg.context_for(compute.ctx_size);
    let ring = super::plan::ring_of(&file, &gguf, &cfg, n_ctx, compute.cache_type)?;
    drop(gguf);
    let head_windows = file.head.map(|h| ring.device_windows(h)).unwrap_or_default();
    let threads = compute.threads()?;
    let loaded = Loaded::load_share(&model_path, &TensorPlacement::flat(threads), Share::windows(head_windows, false))?;
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
        model_sha256: file_sha256(&model_path).map_err(|e| format!("{}: {e}", model_path.display()))?,
    };
    let n_batch = compute.batch_size.clamp(1, n_ctx);
    let sizes = WindowSizes { threads, kv_tokens: n_ctx, kv_type: compute.cache_type, max_rows: n_batch, max_logit_rows: 1, max_ctx: n_ctx };
    let ring = RingHead::start(Arc::new(model), spec, &token, sizes)?;
    Ok(Head { ring, tokenizer, template, n_ctx, n_batch })
}
