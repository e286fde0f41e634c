//! `blink bench-serve`: load-test an OpenAI-compatible server with concurrent streaming clients.
//!
//! With `--url` it drives a running server; without, it starts `blink serve` in-process on a
//! free loopback port with the given model and engine flags. For each `--concurrency` level
//! it sends `--requests` streaming chat completions over a fixed set of prompts (greedy,
//! `ignore_eos` so every request generates exactly `--max-tokens`), `C` at a time, and
//! reports requests/s, output tokens/s, time to first token and time per output token
//! (p50/p99, measured by the client), and the engine's f_ctrl over the run (from /metrics:
//! the share of engine step time not spent in the forward pass).
//!
//! Each prompt is sent once before the first level, unmeasured, so every level finds the
//! same prompts in the server's prefix cache: otherwise the first level would pay for
//! computing them and the later ones would not.

use std::time::Instant;

use blink_server::client::Client;
use serde_json::json;

use crate::cmd::client::{engine_seconds, ms, percentile, ready, timed_stream, Target, Timing};
use crate::common::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// Concurrent clients to test (comma-separated).
    #[arg(long = "concurrency", value_delimiter = ',', default_value = "1,4,16")]
    concurrency: Vec<usize>,
    /// Requests per concurrency level (default: 4 × the concurrency, at least 8).
    #[arg(short = 'n', long = "requests")]
    requests: Option<usize>,
    /// Tokens generated per request.
    #[arg(long = "max-tokens", default_value_t = 64)]
    max_tokens: usize,
    #[command(flatten)]
    target: Target,
}

/// The prompt set: short questions and a few long instructions.
const PROMPTS: [&str; 8] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a ten-year-old, step by step, covering light, water, carbon dioxide and sugar, and why plants need each of them.",
    "List five prime numbers.",
    "Summarise the plot of a story in which a young inventor builds a flying machine from scrap metal, crashes it twice, learns from an old pilot how wings really work, and finally flies across the valley to bring medicine to a sick friend.",
    "Say hello.",
    "Describe how a bicycle gear system works and when a rider should change gears on hills, on flat roads and in strong wind.",
    "Give me three tips for learning a new language.",
];

pub fn main(args: Args) -> CliResult {
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        return Err("--concurrency needs positive numbers".into());
    }
    if args.max_tokens == 0 {
        return Err("--max-tokens must be at least 1".into());
    }
    let runtime = crate::common::io_runtime("blink-bench-serve")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> CliResult {
    let (url, server) = args.target.server("bench-serve").await?;
    let client = args.target.client(&url)?;
    ready(&client).await?;
    for prompt in PROMPTS {
        one(&client, prompt, 1).await?;
    }
    outln!(
        "| {:>11} | {:>8} | {:>7} | {:>10} | {:>9} | {:>9} | {:>9} | {:>9} | {:>6} |",
        "concurrency", "requests", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "f_ctrl"
    )?;
    outln!("|{:-<13}|{:->10}|{:->9}|{:->12}|{:->11}|{:->11}|{:->11}|{:->11}|{:->8}|", ":", ":", ":", ":", ":", ":", ":", ":", ":")?;
    for &c in &args.concurrency {
        let n = args.requests.unwrap_or((4 * c).max(8));
        let before = engine_counters(&client).await;
        let t0 = Instant::now();
        let samples = level(&client, c, n, args.max_tokens).await?;
        let wall = t0.elapsed().as_secs_f64();
        let after = engine_counters(&client).await;
        let f_ctrl = match (before, after) {
            (Some((s0, c0)), Some((s1, c1))) if s1 > s0 => format!("{:.3}", 1.0 - (c1 - c0) / (s1 - s0)),
            _ => "n/a".into(),
        };
        let tokens: usize = samples.iter().map(|s| s.tokens).sum();
        let mut ttft: Vec<f64> = samples.iter().map(|s| s.ttft).collect();
        let mut tpot: Vec<f64> = samples.iter().filter_map(|s| s.tpot).collect();
        outln!(
            "| {:>11} | {:>8} | {:>7.2} | {:>10.1} | {:>9} | {:>9} | {:>9} | {:>9} | {:>6} |",
            c,
            n,
            n as f64 / wall,
            tokens as f64 / wall,
            ms(percentile(&mut ttft, 0.50)),
            ms(percentile(&mut ttft, 0.99)),
            ms(percentile(&mut tpot, 0.50)),
            ms(percentile(&mut tpot, 0.99)),
            f_ctrl
        )?;
    }
    if let Some(server) = server {
        server.shutdown().await;
    }
    Ok(())
}

/// Run `n` requests, `c` at a time.
async fn level(client: &Client, c: usize, n: usize, max_tokens: usize) -> Result<Vec<Timing>, String> {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::with_capacity(c);
    for _ in 0..c {
        let (client, next) = (client.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, String>(out);
                }
                out.push(one(&client, PROMPTS[i % PROMPTS.len()], max_tokens).await?);
            }
        }));
    }
    let mut all = Vec::with_capacity(n);
    for w in workers {
        all.extend(w.await.map_err(|e| format!("a client task failed: {e}"))??);
    }
    Ok(all)
}

/// One streaming chat completion, timed.
async fn one(client: &Client, prompt: &str, max_tokens: usize) -> Result<Timing, String> {
    let body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    timed_stream(client, "/v1/chat/completions", &body).await
}

/// The engine's cumulative step and compute seconds, from /metrics.
async fn engine_counters(client: &Client) -> Option<(f64, f64)> {
    engine_seconds(&client.get("/metrics").await.ok()?.text())
}
