//! `blink profile`: this device's figures for the ring planner, as JSON: one-row product
//! rates of each weight type the model uses, memory bandwidth, the memory this process
//! may use (within a cgroup's limit), the rate its disk reads the model file, and the
//! links to the peers named with `--peer` (`blink node`s, measured over the ring's
//! protocol).

use crate::common::{load_model, CliResult, ComputeArgs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    compute: ComputeArgs,
    /// A peer's `blink node` (host:port) to measure the link to; repeatable.
    #[arg(long = "peer", value_name = "ADDR")]
    peers: Vec<String>,
    /// The ring's token file (needed with --peer).
    #[arg(long = "token-file", value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    shim: super::cluster::ShimArgs,
}

pub fn main(args: Args) -> CliResult {
    let path = args.model.path()?;
    let threads = args.compute.threads()?;
    // The disk first: once the model is loaded, its file's pages stay cached.
    let disk = blink_cluster::profile::disk_read_rate(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let loaded = load_model(&args.model, Some(&args.compute))?;
    let pool = loaded.model.pool(threads)?;
    let mut profile = blink_cluster::profile::measure(&loaded.model, &pool, disk, &cpu_name())?;
    if !args.peers.is_empty() {
        let token = args.token_file.as_deref().ok_or("--peer needs --token-file (the ring's token)")?;
        let token = blink_cluster::auth::Token::read(token)?;
        for addr in &args.peers {
            profile.peers.push(blink_cluster::profile::peer::measure(addr, &token, args.shim.shim()?)?);
        }
    }
    outln!("{}", serde_json::to_string_pretty(&profile)?)?;
    Ok(())
}

/// The CPU's model name, as /proc/cpuinfo gives it.
fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
