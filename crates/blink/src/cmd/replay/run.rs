//! The open-loop replay: every request of the trace is sent at its time, from a tokio task
//! of its own that sleeps until `start + timestamp` (one start instant for all, so errors
//! in timing do not accumulate), whether or not earlier requests have finished. Each
//! records how late it was sent (the client falling behind its schedule), what it
//! measured, and when it ended. Beside them a sampler reads `/metrics` about once a second
//! and reports progress on stderr every ten seconds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blink_server::client::Client;

use super::prompts::PromptStyle;
use super::scrape::Scrape;
use super::trace::Arrival;
use crate::cmd::client::{timed_stream, Timing};

/// One request's fate.
pub struct Outcome {
    /// When it was due, seconds from the start.
    pub due: f64,
    /// Seconds it was sent after it was due.
    pub lateness: f64,
    /// When it ended (its last token, or its error), seconds from the start.
    pub ended: f64,
    pub result: Result<Timing, String>,
}

/// A replay's measurements.
pub struct Run {
    /// In the trace's order.
    pub outcomes: Vec<Outcome>,
    /// `/metrics` just before the first request, about once a second during the run, and
    /// once after the last request ended.
    pub scrapes: Vec<Scrape>,
    /// Seconds from the start to the end of the last request.
    pub seconds: f64,
}

/// How far ahead of the first request the start is set, so every task is spawned and
/// waiting when it comes.
const LEAD: Duration = Duration::from_millis(50);

/// Replay `trace` against `client`.
pub async fn replay(client: &Client, trace: &[Arrival], style: &PromptStyle) -> Run {
    let path = "/v1/completions";
    let bodies: Vec<_> = trace.iter().enumerate().map(|(i, a)| style.body(i as u64, a.prompt_tokens, a.max_tokens)).collect();
    let clock = Instant::now();
    let first = Scrape::take(client, clock).await;
    let start = Instant::now() + LEAD;
    let counts = Arc::new(Counts::default());
    let mut tasks = Vec::with_capacity(trace.len());
    for (a, body) in trace.iter().zip(bodies) {
        let (client, counts, a) = (client.clone(), counts.clone(), *a);
        let due = start + Duration::from_secs_f64(a.at);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(due.into()).await;
            let lateness = due.elapsed().as_secs_f64();
            counts.sent.fetch_add(1, Ordering::Relaxed);
            let result = timed_stream(&client, path, &body).await;
            let ended = start.elapsed().as_secs_f64();
            counts.failed.fetch_add(usize::from(result.is_err()), Ordering::Relaxed);
            counts.done.fetch_add(1, Ordering::Relaxed);
            Outcome { due: a.at, lateness, ended, result }
        }));
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sampler = tokio::spawn(sample(client.clone(), start, counts, trace.len(), stopped));
    let mut outcomes = Vec::with_capacity(trace.len());
    for (t, a) in tasks.into_iter().zip(trace) {
        outcomes.push(t.await.unwrap_or_else(|e| Outcome {
            due: a.at,
            lateness: 0.0,
            ended: start.elapsed().as_secs_f64(),
            result: Err(format!("the request's task failed: {e}")),
        }));
    }
    let seconds = outcomes.iter().map(|o| o.ended).fold(0.0, f64::max);
    let _ = stop.send(());
    let mut scrapes = vec![Scrape { at: first.at - (start - clock).as_secs_f64(), ..first }];
    scrapes.extend(sampler.await.unwrap_or_default());
    scrapes.push(Scrape::take(client, start).await);
    Run { outcomes, scrapes, seconds }
}

#[derive(Default)]
struct Counts {
    sent: AtomicUsize,
    done: AtomicUsize,
    failed: AtomicUsize,
}

/// Read `/metrics` about once a second (on the second, from `start`) until stopped; a
/// progress line every ten seconds.
async fn sample(client: Client, start: Instant, counts: Arc<Counts>, total: usize, mut stopped: tokio::sync::oneshot::Receiver<()>) -> Vec<Scrape> {
    let mut out = Vec::new();
    for tick in 1u64.. {
        let next = start + Duration::from_secs(tick);
        tokio::select! {
            _ = &mut stopped => break,
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        tokio::select! {
            _ = &mut stopped => break,
            s = Scrape::take(&client, start) => out.push(s),
        }
        if tick % 10 == 0 {
            let c = |a: &AtomicUsize| a.load(Ordering::Relaxed);
            eprintln!("blink replay: {tick} s: {}/{total} sent, {} done, {} failed", c(&counts.sent), c(&counts.done), c(&counts.failed));
        }
    }
    out
}
