//! The capacity probe behind `--utilization`: how many requests per second the server
//! completes when it is never idle.
//!
//! Closed loop: `concurrency` clients (by default the in-process server's `--parallel`, the
//! most sequences it runs at once) each send `rounds` requests back to back, all of the
//! trace's mean shape (mean prompt and output lengths, rounded) with fresh prompts, and
//! the capacity is the requests completed over the wall time from the first send to the
//! last end. The same clients start together, so the rounds stay in step and the tail of
//! the last round is as full as the rest. The mean shape stands for the mix: a mix costs
//! slightly more per request than its mean when prompt cost grows faster than linearly.

use std::time::Instant;

use blink_server::client::Client;

use super::prompts::PromptStyle;
use super::scrape::Scrape;
use crate::cmd::client::timed_stream;

/// What the probe found.
#[derive(Clone, Debug)]
pub struct Capacity {
    /// Requests completed per second.
    pub rps: f64,
    pub concurrency: usize,
    pub requests: usize,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub seconds: f64,
    /// The engine's busy fraction during the probe, if the server exports it.
    pub busy: Option<f64>,
}

/// Prompts of the probe are numbered from here (plus a nonce), apart from the trace's.
const FIRST_INDEX: u64 = 1 << 40;

pub async fn probe(client: &Client, style: &PromptStyle, concurrency: usize, rounds: usize, prompt_tokens: usize, max_tokens: usize) -> Result<Capacity, String> {
    let clock = Instant::now();
    // Fresh prompts on every probe, even of the same seed against the same server: ones it
    // has seen would come from its prefix cache and make it look faster than it is.
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64 % (1 << 30)) << 8;
    let first = FIRST_INDEX + nonce;
    let before = Scrape::take(client, clock).await;
    let t0 = Instant::now();
    let mut clients = Vec::with_capacity(concurrency);
    for c in 0..concurrency {
        let (client, bodies) = (client.clone(), (0..rounds).map(|r| style.body(first + (r * concurrency + c) as u64, prompt_tokens, max_tokens)).collect::<Vec<_>>());
        clients.push(tokio::spawn(async move {
            for body in bodies {
                timed_stream(&client, "/v1/completions", &body).await?;
            }
            Ok::<_, String>(())
        }));
    }
    for c in clients {
        c.await.map_err(|e| format!("a probe client failed: {e}"))?.map_err(|e| format!("the capacity probe failed: {e}"))?;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let after = Scrape::take(client, clock).await;
    let busy = match (before.compute_seconds, after.compute_seconds) {
        (Some(a), Some(b)) if after.at > before.at => Some((b - a) / (after.at - before.at)),
        _ => None,
    };
    let requests = concurrency * rounds;
    Ok(Capacity { rps: requests as f64 / seconds, concurrency, requests, prompt_tokens, max_tokens, seconds, busy })
}
