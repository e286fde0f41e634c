//! `blink node --listen ADDR --token-file F`: serve as one device of a ring. The head
//! (`blink run|serve|bench --cluster cluster.toml`) tells it which layers to hold.

use std::path::PathBuf;

use blink_cluster::auth::Token;
use blink_cluster::node::{self, NodeOptions};
use blink_cluster::wire::MAX_PAYLOAD;

use crate::common::{resolve_threads, CliResult, KernelArgs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    /// `host:port` to listen on (port 0: any free port, printed at start).
    #[arg(long)]
    listen: String,
    /// A file holding the ring's shared token (every device and the head read the same).
    #[arg(long = "token-file", value_name = "FILE")]
    token_file: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    /// Compute threads, unless the cluster file names a number for this device (default:
    /// all available CPUs).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    #[command(flatten)]
    kernel: KernelArgs,
    #[command(flatten)]
    shim: super::cluster::ShimArgs,
    /// Read streamed windows ahead by reading them (MADV_POPULATE_READ) rather than by a
    /// hint the kernel may ignore.
    #[arg(long = "force-prefetch")]
    force_prefetch: bool,
}

pub fn main(args: Args) -> CliResult {
    args.kernel.apply()?;
    let token = Token::read(&args.token_file)?;
    let opts = NodeOptions { listen: args.listen, token, model: args.model.path()?, threads: resolve_threads(args.threads)?, max_frame: MAX_PAYLOAD, shim: args.shim.shim()?, force_prefetch: args.force_prefetch };
    Ok(node::serve(opts)?)
}
