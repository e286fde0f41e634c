//! `blink serve`: the OpenAI-compatible HTTP server.
//!
//! The port is bound first, so `/health` answers 503 "loading" while the model is fetched
//! and loaded; then the engine starts and the URL is printed on stdout. Ctrl-C (or SIGTERM)
//! stops accepting connections and gives in-flight requests a grace period; a second one
//! stops at once.

use std::io::Write;
use std::time::Duration;

use blink_model::KvType;
use blink_server::{ModelOptions, Ready, Server, ServerOptions};

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
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = 4 << 20)]
    max_body: usize,
    /// Seconds a client gets to send a request's headers.
    #[arg(long = "header-timeout", default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a client gets to send a request's body.
    #[arg(long = "body-timeout", default_value_t = 30.0)]
    body_timeout: f64,
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
    /// Do not reuse the KV cache of shared prompt prefixes.
    #[arg(long = "no-prefix-cache")]
    pub no_prefix_cache: bool,
    #[command(flatten)]
    pub kernel: KernelArgs,
    #[command(flatten)]
    pub numa: NumaArgs,
}

impl EngineArgs {
    /// Model options for the file at `path`.
    pub fn options(&self, path: std::path::PathBuf) -> CliResult<ModelOptions> {
        let threads = crate::common::resolve_threads(self.threads)?;
        Ok(ModelOptions {
            placement: Some(self.numa.placement(threads)?),
            threads: self.threads.unwrap_or(0),
            ctx_size: self.ctx_size,
            kv_budget: self.kv_budget,
            parallel: self.parallel,
            queue: self.queue,
            step_tokens: self.step_tokens,
            kv_type: self.cache_type,
            prefix_cache: !self.no_prefix_cache,
            prefix_cache_tokens: self.prefix_cache_tokens,
            ..ModelOptions::new(path)
        })
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
    let (model, engine) = (args.model.clone(), args.engine.clone());
    let ready = tokio::task::spawn_blocking(move || -> Result<Ready, String> {
        let path = model.path().map_err(|e| e.to_string())?;
        Ready::load(&engine.options(path).map_err(|e| e.to_string())?)
    });
    let ready = tokio::select! {
        r = ready => r.map_err(|e| format!("loading the model failed: {e}"))??,
        _ = shutdown_signal() => return Ok(()),
    };
    let cfg = ready.engine.config().clone();
    eprintln!(
        "blink: serving {} (context {} tokens per request, KV cache {} tokens (prefix cache {}), {} parallel, {} threads, kernel {}, {} dot order); chat page at {url}/, API at {url}/v1",
        ready.model_id,
        cfg.max_seq_len,
        cfg.kv_tokens,
        cfg.cached_tokens_limit(),
        cfg.max_running,
        cfg.n_threads,
        blink_kernels::cpu::active(),
        blink_kernels::order::active()
    );
    server.set_ready(ready);
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
