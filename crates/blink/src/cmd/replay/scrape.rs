//! What a replay reads from the server's `/metrics`, tolerantly: a metric the server does
//! not export (or a server without `/metrics`) is absent, never an error.
//!
//! - `blink_engine_compute_seconds_total`: seconds of forward passes, for the engine's busy
//!   fraction (its increase over wall time);
//! - `blink_finetune_trained_tokens_total`: fine-tuning tokens committed (co-serving);
//! - `blink_latency_model_relative_error{kind="..."}`: the step-time predictor's median
//!   relative error, per kind of step, over its last steps;
//! - `blink_latency_model_abs_error_bucket{kind="...",le="..."}`: the same errors of every
//!   step so far, in a cumulative histogram (two readings give a span's median).

use std::time::Instant;

use blink_server::client::Client;
use blink_server::metrics::sample;

pub const COMPUTE: &str = "blink_engine_compute_seconds_total";
pub const TRAINED: &str = "blink_finetune_trained_tokens_total";
pub const PREDICTOR: &str = "blink_latency_model_relative_error";
/// The same error for the offline (calibrated) coefficients alone.
pub const PREDICTOR_OFFLINE: &str = "blink_latency_model_offline_relative_error";
/// Histograms of every step's |relative error|, of the online and of the offline model.
pub const PREDICTOR_COUNTS: &str = "blink_latency_model_abs_error";
pub const PREDICTOR_OFFLINE_COUNTS: &str = "blink_latency_model_offline_abs_error";

/// A cumulative histogram per kind of step: `(kind, [(upper bound, steps at or below it)])`,
/// bounds in the exposition's order (the last `+Inf`).
pub type KindHistograms = Vec<(String, Vec<(f64, f64)>)>;

/// One reading of `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    /// Seconds from the replay's start.
    pub at: f64,
    pub compute_seconds: Option<f64>,
    pub trained_tokens: Option<f64>,
    /// `(kind, error)` per kind of step.
    pub predictor_error: Vec<(String, f64)>,
    pub predictor_offline_error: Vec<(String, f64)>,
    /// Every step's errors so far, per kind.
    pub predictor_counts: KindHistograms,
    pub predictor_offline_counts: KindHistograms,
    /// Whether `/metrics` answered (an empty reading otherwise, not a fresh server's).
    pub answered: bool,
}

impl Scrape {
    /// Read `/metrics` now; `at` is measured from `start`. A failed request gives a
    /// reading with nothing in it.
    pub async fn take(client: &Client, start: Instant) -> Scrape {
        let text = match client.get("/metrics").await {
            Ok(r) if r.status == 200 => r.text(),
            _ => return Scrape { at: start.elapsed().as_secs_f64(), ..Scrape::parse("") },
        };
        Scrape { at: start.elapsed().as_secs_f64(), answered: true, ..Scrape::parse(&text) }
    }

    pub fn parse(text: &str) -> Scrape {
        Scrape {
            at: 0.0,
            compute_seconds: sample(text, COMPUTE),
            trained_tokens: sample(text, TRAINED),
            predictor_error: by_label(text, PREDICTOR, "kind"),
            predictor_offline_error: by_label(text, PREDICTOR_OFFLINE, "kind"),
            predictor_counts: histograms(text, PREDICTOR_COUNTS),
            predictor_offline_counts: histograms(text, PREDICTOR_OFFLINE_COUNTS),
            answered: false,
        }
    }
}

/// The buckets of histogram `name` per value of its `kind` label.
fn histograms(text: &str, name: &str) -> KindHistograms {
    let mut out: KindHistograms = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name).and_then(|r| r.strip_prefix("_bucket{")) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let (Some(kind), Some(le), Ok(n)) = (label_value(labels, "kind"), label_value(labels, "le"), value.split_whitespace().next().unwrap_or("").parse::<f64>()) else {
            continue;
        };
        let Ok(le) = (if le == "+Inf" { Ok(f64::INFINITY) } else { le.parse::<f64>() }) else {
            continue;
        };
        match out.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, buckets)) => buckets.push((le, n)),
            None => out.push((kind, vec![(le, n)])),
        }
    }
    out
}

/// The samples of metric `name` as `(value of label, sample)`, in the exposition's order.
/// Samples without that label are left out.
pub fn by_label(text: &str, name: &str, label: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let Ok(value) = value.split_whitespace().next().unwrap_or("").parse::<f64>() else {
            continue;
        };
        if let Some(v) = label_value(labels, label) {
            out.push((v, value));
        }
    }
    out
}

/// The value of `label` in a Prometheus label set (`a="x",b="y"`, with `\"` and `\\`
/// escapes).
fn label_value(labels: &str, label: &str) -> Option<String> {
    let mut rest = labels;
    loop {
        let (key, after) = rest.split_once('=')?;
        let after = after.strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => value.push(chars.next()?.1),
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        if key.trim().trim_start_matches(',').trim() == label {
            return Some(value);
        }
        rest = &after[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn present_and_absent_metrics() {
        let text = "# HELP x\nblink_engine_compute_seconds_total 12.5\nblink_finetune_trained_tokens_total 300\n\
                    blink_latency_model_relative_error{kind=\"decode\"} 0.04\n\
                    blink_latency_model_relative_error{model=\"a,b\",kind=\"prefill \\\"x\\\"\"} 0.12 1700000000\n\
                    blink_latency_model_relative_error_count{kind=\"decode\"} 9\n";
        let s = Scrape::parse(text);
        assert_eq!((s.compute_seconds, s.trained_tokens), (Some(12.5), Some(300.0)));
        assert_eq!(s.predictor_error, vec![("decode".to_string(), 0.04), ("prefill \"x\"".to_string(), 0.12)]);
        let none = Scrape::parse("blink_requests_total{endpoint=\"/\",status=\"200\"} 1\n");
        assert_eq!((none.compute_seconds, none.trained_tokens, none.predictor_error.len()), (None, None, 0));
        assert!(Scrape::parse("").predictor_error.is_empty());
        assert!(by_label("m{kind=\"a\"} nan?\nm{kind=\"b} 1\nm{other=\"c\"} 2\n", "m", "kind").is_empty());
    }

    #[test]
    fn histograms_by_kind() {
        let text = "# TYPE blink_latency_model_abs_error histogram\n\
                    blink_latency_model_abs_error_bucket{kind=\"decode\",le=\"0.01\"} 3\n\
                    blink_latency_model_abs_error_bucket{kind=\"decode\",le=\"+Inf\"} 5\n\
                    blink_latency_model_abs_error_sum{kind=\"decode\"} 0.7\n\
                    blink_latency_model_abs_error_bucket{kind=\"mixed\",le=\"0.5\"} 1\n\
                    blink_latency_model_abs_error_bucket{kind=\"mixed\",le=\"x\"} 1\n\
                    blink_latency_model_offline_abs_error_bucket{kind=\"decode\",le=\"0.01\"} 0\n";
        let s = Scrape::parse(text);
        assert_eq!(s.predictor_counts, vec![("decode".to_string(), vec![(0.01, 3.0), (f64::INFINITY, 5.0)]), ("mixed".to_string(), vec![(0.5, 1.0)])]);
        assert_eq!(s.predictor_offline_counts, vec![("decode".to_string(), vec![(0.01, 0.0)])]);
    }
}
