//! The client side of the load-driving commands (`bench-serve`, `replay`): which server to
//! drive (one at `--url`, or `blink serve` started in-process with the model and engine
//! flags), timing one streamed request, the engine's time counters from `/metrics`, and
//! percentiles.

use std::time::{Duration, Instant};

use blink_server::client::Client;
use blink_server::metrics::sample;
use blink_server::{Server, ServerOptions};
use serde_json::Value;

use crate::cmd::serve::EngineArgs;
use crate::common::{CliResult, ModelArgs};

/// The server a command drives.
#[derive(clap::Args)]
pub struct Target {
    /// A running server (http://HOST:PORT); default: start one in-process.
    #[arg(long)]
    pub url: Option<String>,
    /// API key to send.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl Target {
    /// The server's URL, and the server when it is started here (on the runtime that polls
    /// this, a free loopback port). `who` names the command in the line saying so.
    pub async fn server(&self, who: &str) -> CliResult<(String, Option<Server>)> {
        if let Some(url) = &self.url {
            return Ok((url.clone(), None));
        }
        self.engine.kernel.apply()?;
        let path = self.model.path()?;
        let server = Server::start("127.0.0.1:0", ServerOptions::default(), self.engine.options(path)?).await?;
        let url = format!("http://{}", server.addr());
        eprintln!("blink {who}: started a server at {url} (kernel {}, {} dot order)", blink_kernels::cpu::active(), blink_kernels::order::active());
        Ok((url, Some(server)))
    }

    /// A client for `url`, sending `--api-key` to a server given with `--url`.
    pub fn client(&self, url: &str) -> CliResult<Client> {
        let key = self.url.as_ref().and(self.api_key.clone());
        Ok(Client::new(url)?.with_api_key(key))
    }
}

/// Check that the server answers and is ready: `/health` must answer 200, or 404 for a
/// server without that endpoint.
pub async fn ready(client: &Client) -> CliResult {
    let health = client.get("/health").await.map_err(|e| format!("the server cannot be reached: {e}"))?;
    match health.status {
        200 | 404 => Ok(()),
        s => Err(format!("the server is not ready: /health answered {s}").into()),
    }
}

/// What one streamed request measured, from just before it was sent.
pub struct Timing {
    /// Seconds to the first token.
    pub ttft: f64,
    /// Mean seconds between tokens after the first (`None` for fewer than two tokens).
    pub tpot: Option<f64>,
    /// Seconds to the end of the stream.
    pub e2e: f64,
    /// Tokens generated: the usage the server reported, else the token events counted.
    pub tokens: usize,
}

/// POST `body` to `path` as a streaming request and time its tokens. Chat streams
/// (`choices[0].delta.content`) count events with text; completion streams
/// (`choices[0].text`) also count an event with empty text and no finish reason (a token
/// whose bytes do not end a character yet). An error event is an error.
pub async fn timed_stream(client: &Client, path: &str, body: &Value) -> Result<Timing, String> {
    let start = Instant::now();
    let mut stream = client.stream(path, body).await?;
    let (mut first, mut last, mut events, mut usage): (Option<Duration>, Option<Duration>, usize, Option<usize>) = (None, None, 0, None);
    while let Some(data) = stream.next_event().await? {
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&data).map_err(|e| format!("bad event ({e}): {data}"))?;
        if let Some(err) = v.get("error") {
            return Err(format!("the server reported an error: {err}"));
        }
        if is_token_event(&v["choices"][0]) {
            let now = start.elapsed();
            first.get_or_insert(now);
            last = Some(now);
            events += 1;
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            usage = Some(n as usize);
        }
    }
    let e2e = start.elapsed();
    let first = first.unwrap_or(e2e);
    let last = last.unwrap_or(first);
    let tokens = usage.unwrap_or(events);
    let tpot = (tokens > 1).then(|| (last - first).as_secs_f64() / (tokens - 1) as f64);
    Ok(Timing { ttft: first.as_secs_f64(), tpot, e2e: e2e.as_secs_f64(), tokens })
}

fn is_token_event(choice: &Value) -> bool {
    if let Some(text) = choice["text"].as_str() {
        return !text.is_empty() || choice["finish_reason"].is_null();
    }
    choice["delta"]["content"].as_str().is_some_and(|c| !c.is_empty())
}

/// The engine's cumulative step and compute (forward pass) seconds, from a `/metrics` text.
pub fn engine_seconds(metrics: &str) -> Option<(f64, f64)> {
    Some((sample(metrics, "blink_engine_step_seconds_total")?, sample(metrics, "blink_engine_compute_seconds_total")?))
}

/// The `q` quantile of `v` (nearest rank; sorts `v`); `None` when empty.
pub fn percentile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    Some(v[i.min(v.len() - 1)])
}

/// Seconds as milliseconds for a table, `n/a` for none.
pub fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |s| format!("{:.1} ms", s * 1e3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn token_events_of_both_stream_shapes() {
        assert!(is_token_event(&json!({"text": "a", "finish_reason": null})));
        assert!(is_token_event(&json!({"text": "", "finish_reason": null})), "a token that ends no character yet");
        assert!(!is_token_event(&json!({"text": "", "finish_reason": "length"})));
        assert!(is_token_event(&json!({"text": "z", "finish_reason": "length"})), "vLLM's last token carries the reason");
        assert!(is_token_event(&json!({"delta": {"content": "x"}})));
        assert!(!is_token_event(&json!({"delta": {"role": "assistant", "content": ""}})));
        assert!(!is_token_event(&Value::Null));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&mut v, 0.5), Some(3.0));
        assert_eq!(percentile(&mut v, 0.99), Some(5.0));
        assert_eq!(percentile(&mut [], 0.5), None);
    }
}
