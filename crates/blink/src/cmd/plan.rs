//! `blink plan cluster.toml`: the ring the planner would run a model on, and its predicted
//! time per token. Each device's figures come from its `profile` file (`blink profile`
//! on that device) and the link figures the file gives; a fixed plan in the file is
//! priced as it stands.

use std::collections::BTreeMap;
use std::path::PathBuf;

use blink_cluster::plan::{layer_bytes_by_type, Breakdown};
use blink_cluster::profile::Profile;
use blink_cluster::{Cluster, ClusterFile, Link, ModelShape, Plan, Ring};
use blink_model::config::ModelConfig;
use blink_model::KvType;

use crate::common::{parse_kv_type, CliResult, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    /// The cluster file.
    #[arg(value_name = "CLUSTER.toml")]
    cluster: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    /// Context the ring is planned for: the KV cache every device holds for its layers
    /// (default: the model's training context, at most 4096).
    #[arg(short = 'c', long = "ctx-size")]
    ctx: Option<usize>,
    /// KV cache element type: f16 or f32.
    #[arg(long = "cache-type", default_value = "f16", value_parser = parse_kv_type)]
    cache_type: KvType,
    /// The most rounds of windows to consider.
    #[arg(long, default_value_t = DEFAULT_MAX_ROUNDS)]
    max_rounds: usize,
    /// Print the plan as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn main(args: Args) -> CliResult {
    let file = ClusterFile::load(&args.cluster)?;
    let gguf = args.model.open()?;
    let cfg = ModelConfig::from_gguf(&gguf)?;
    let ctx = cfg.context_for(args.ctx);
    let cluster = cluster_for(&file, &gguf, &cfg, ctx, args.cache_type, args.max_rounds)?;
    let plan = match &file.fixed {
        Some((windows, rounds)) => {
            let predicted = cluster.predict(windows, *rounds)?;
            Plan { ring: Ring::new(windows.clone(), *rounds)?, predicted }
        }
        None => cluster.plan()?,
    };
    if args.json {
        outln!("{}", serde_json::to_string(&plan_json(&cluster, &plan, file.fixed.is_some()))?)?;
        return Ok(());
    }
    print_plan(&cluster, &plan, file.fixed.is_some(), ctx)
}

/// The ring to run: the file's fixed plan as it stands, or the planner's choice (which
/// needs every device's profile), with the planner's view of the devices to re-plan
/// over later.
pub fn ring_of(file: &ClusterFile, gguf: &blink_gguf::GgufFile, cfg: &ModelConfig, ctx: usize, kv: KvType) -> CliResult<(Ring, Option<Cluster>)> {
    match &file.fixed {
        Some((windows, rounds)) => Ok((Ring::new(windows.clone(), *rounds)?, None)),
        None => {
            let cluster = cluster_for(file, gguf, cfg, ctx, kv, DEFAULT_MAX_ROUNDS)?;
            Ok((cluster.plan()?.ring, Some(cluster)))
        }
    }
}

const DEFAULT_MAX_ROUNDS: usize = 8;

/// The planner's view of the file's devices running the model at context `ctx`.
fn cluster_for(file: &ClusterFile, gguf: &blink_gguf::GgufFile, cfg: &ModelConfig, ctx: usize, kv: KvType, max_rounds: usize) -> CliResult<Cluster> {
    let kv_bytes = match kv {
        KvType::F16 => 2,
        KvType::F32 => 4,
    };
    let model = ModelShape::of(gguf, cfg, ctx, kv_bytes);
    let by_type = layer_bytes_by_type(gguf, cfg.n_layers);
    cluster_of(file, model, &by_type, head_bytes_by_type(gguf), max_rounds)
}

/// The output head's bytes by type (the tensors outside the blocks that a token's last
/// step reads: the output matrix, or the tied embedding).
fn head_bytes_by_type(gguf: &blink_gguf::GgufFile) -> BTreeMap<String, u64> {
    let head = gguf.tensor("output.weight").or_else(|| gguf.tensor("token_embd.weight"));
    head.map(|t| BTreeMap::from([(t.ty.name().to_string(), t.n_bytes)])).unwrap_or_default()
}

fn cluster_of(file: &ClusterFile, model: ModelShape, by_type: &BTreeMap<String, u64>, head_by_type: BTreeMap<String, u64>, max_rounds: usize) -> CliResult<Cluster> {
    let which = |i: usize| format!("device {} ({})", i + 1, file.devices[i].name);
    let profiles = (0..file.devices.len()).map(|i| read_profile(file, i).map_err(|e| format!("{}: {e}", which(i)))).collect::<Result<Vec<_>, _>>()?;
    let mut devices = Vec::with_capacity(file.devices.len());
    for (i, (d, profile)) in file.devices.iter().zip(&profiles).enumerate() {
        // The link into a device: as the file gives it, else as the device before it measured it.
        let measured = i.checked_sub(1).and_then(|p| profiles[p].peers.iter().find(|l| Some(l.addr.as_str()) == d.addr.as_deref()));
        let link = d
            .link
            .or(measured.map(|l| Link { latency_s: l.latency_s, bytes_per_s: l.bytes_per_s }))
            .ok_or_else(|| format!("{}: no figures for the link into it (give latency_ms and mbps in its entry)", which(i)))?;
        devices.push(profile.device(&d.name, by_type, d.memory, link).map_err(|e| format!("{}: {e}", which(i)))?);
    }
    let head_link = match file.head {
        Some(h) => devices[h].link,
        None => file.head_link.ok_or("the head holds no window: give the link back into it (head_latency_ms and head_mbps)")?,
    };
    // The head's own work, priced on its entry's profile (without one, the first device's).
    let head_s = profiles[file.head.unwrap_or(0)].layer_seconds(&head_by_type)?;
    Ok(Cluster { model, devices, head: file.head, head_link, head_s, max_rounds })
}

/// Device `i`'s profile, from the file its entry names.
fn read_profile(file: &ClusterFile, i: usize) -> CliResult<Profile> {
    let d = &file.devices[i];
    let Some(path) = &d.profile else {
        return Err(format!("no profile (run `blink profile -m MODEL > {}.json` on it and name the file in its entry: profile = \"...\")", d.name).into());
    };
    let text = std::fs::read_to_string(path).map_err(|e| format!("its profile {}: {e}", path.display()))?;
    let profile: Profile = serde_json::from_str(&text).map_err(|e| format!("its profile {}: {e}", path.display()))?;
    profile.check().map_err(|e| format!("its profile {}: {e}", path.display()))?;
    Ok(profile)
}

fn plan_json(c: &Cluster, plan: &Plan, fixed: bool) -> serde_json::Value {
    serde_json::json!({
        "fixed": fixed,
        "rounds": plan.ring.rounds(),
        "windows": plan.ring.windows(),
        "devices": c.devices.iter().zip(plan.ring.windows()).enumerate().map(|(d, (dev, &w))| serde_json::json!({
            "name": dev.name,
            "window": w,
            "layers": plan.ring.device_windows(d).iter().map(|r| [r.start, r.end]).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "predicted_s_per_token": plan.predicted.total(),
        "predicted": plan.predicted,
    })
}

fn print_plan(c: &Cluster, plan: &Plan, fixed: bool, ctx: usize) -> CliResult {
    let m = &c.model;
    outln!("model: {} layers of {:.1} MiB, KV cache {:.1} MiB per layer at {ctx} tokens", m.n_layers, m.layer_bytes as f64 / MIB, m.kv_layer_bytes as f64 / MIB)?;
    outln!("{} plan: {} round(s)", if fixed { "fixed" } else { "planned" }, plan.ring.rounds())?;
    for (d, dev) in c.devices.iter().enumerate() {
        let windows = plan.ring.device_windows(d);
        let layers = if windows.is_empty() {
            "left out".to_string()
        } else {
            windows.iter().map(|r| format!("{}..{}", r.start, r.end)).collect::<Vec<_>>().join(", ")
        };
        outln!("  {:<24} window {:>3}  layers {layers}", dev.name, plan.ring.windows()[d])?;
    }
    let Breakdown { compute_s, network_s, disk_s, head_s } = plan.predicted;
    outln!(
        "predicted: {:.1} ms per token (compute {:.1}, network {:.1}, disk {:.1}, head {:.1})",
        plan.predicted.total() * 1e3,
        compute_s * 1e3,
        network_s * 1e3,
        disk_s * 1e3,
        head_s * 1e3
    )?;
    Ok(())
}

const MIB: f64 = (1u64 << 20) as f64;
