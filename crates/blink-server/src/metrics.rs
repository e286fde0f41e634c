//! Prometheus metrics: server-side counters and latency histograms, plus the engine's state.
//!
//! Counters are atomics (the request counter, keyed by endpoint and status, is a small map
//! behind a mutex touched once per request). Nothing here is on the engine's compute path.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use blink_engine::serve::latency::{ErrorCounts, StepKind, ERROR_BUCKETS};
use blink_engine::serve::{EngineStats, LatencyKindStats};

use crate::adapters::AdapterStats;
use crate::finetune::FinetuneStats;

/// Time-to-first-token buckets, in seconds.
const TTFT_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Inter-token latency buckets, in seconds.
const ITL_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// A cumulative histogram with fixed buckets.
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, plus +Inf.
    counts: Vec<AtomicU64>,
    /// Sum of observations in microseconds.
    sum_us: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_us: AtomicU64::new(0) }
    }

    /// Record one observation (seconds).
    pub fn observe(&self, secs: f64) {
        let i = self.bounds.iter().position(|&b| secs <= b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add((secs.max(0.0) * 1e6) as u64, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c.load(Ordering::Relaxed);
            match self.bounds.get(i) {
                Some(b) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cum}");
                }
            }
        }
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cum}");
    }
}

/// The server's metrics.
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    /// Seconds from a request's arrival to its first generated token.
    pub ttft: Histogram,
    /// Seconds between consecutive tokens of a request.
    pub itl: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
        }
    }
}

impl Metrics {
    /// Count one answered request.
    pub fn request(&self, endpoint: &'static str, status: u16) {
        if let Ok(mut map) = self.requests.lock() {
            *map.entry((endpoint, status)).or_insert(0) += 1;
        }
    }

    /// Count the tokens of one finished generation.
    pub fn add_tokens(&self, prompt: u64, generated: u64) {
        self.prompt_tokens.fetch_add(prompt, Ordering::Relaxed);
        self.generated_tokens.fetch_add(generated, Ordering::Relaxed);
    }

    /// The Prometheus text exposition; `engine` and `adapters` are `None` while the model
    /// loads.
    pub fn render(&self, engine: Option<&EngineStats>, adapters: Option<&AdapterStats>) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str("# HELP blink_requests_total HTTP requests, by endpoint and answer status (499: the client left before the answer).\n");
        out.push_str("# TYPE blink_requests_total counter\n");
        if let Ok(map) = self.requests.lock() {
            for ((endpoint, status), n) in map.iter() {
                let _ = writeln!(out, "blink_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}");
            }
        }
        counter(&mut out, "blink_prompt_tokens_total", "Prompt tokens of finished requests.", self.prompt_tokens.load(Ordering::Relaxed) as f64);
        counter(&mut out, "blink_generated_tokens_total", "Tokens generated for finished requests.", self.generated_tokens.load(Ordering::Relaxed) as f64);
        self.ttft.render(&mut out, "blink_time_to_first_token_seconds", "Time from a request's arrival to its first token.");
        self.itl.render(&mut out, "blink_inter_token_latency_seconds", "Time between consecutive tokens of a request.");
        let Some(s) = engine else {
            gauge(&mut out, "blink_model_loaded", "1 once the model is loaded.", 0.0);
            return out;
        };
        gauge(&mut out, "blink_model_loaded", "1 once the model is loaded.", 1.0);
        gauge(&mut out, "blink_queue_depth", "Requests waiting for admission.", s.queue_depth as f64);
        gauge(&mut out, "blink_running_sequences", "Sequences being prefilled or decoded.", s.running as f64);
        gauge(&mut out, "blink_batch_rows", "Rows (tokens) in the last engine step.", s.last_batch_rows as f64);
        gauge(&mut out, "blink_kv_blocks_used", "KV cache blocks owned by running sequences.", s.kv_blocks_used as f64);
        gauge(&mut out, "blink_kv_blocks_cached", "KV cache blocks without an owner that still hold a cached prompt prefix (reusable).", s.kv_blocks_cached as f64);
        gauge(&mut out, "blink_kv_blocks_total", "KV cache blocks in all.", s.kv_blocks_total as f64);
        gauge(&mut out, "blink_kv_blocks_cached_limit", "Most KV cache blocks the prefix cache keeps without an owner (--prefix-cache-tokens).", s.kv_blocks_cached_limit as f64);
        gauge(&mut out, "blink_kv_blocks_released", "Free KV cache blocks whose memory is with the OS (never used, or given back).", s.kv_blocks_released as f64);
        gauge(&mut out, "blink_kv_resident_bytes", "Bytes of KV cache values at most resident: those of every block but the released ones.", s.kv_resident_bytes as f64);
        counter(&mut out, "blink_kv_return_calls_total", "Calls that gave the pages of free KV cache blocks back to the OS.", s.kv_return_calls_total as f64);
        counter(&mut out, "blink_kv_returned_bytes_total", "Bytes of free KV cache blocks given back to the OS.", s.kv_returned_bytes_total as f64);
        let usage = if s.kv_blocks_total > 0 { s.kv_blocks_used as f64 / s.kv_blocks_total as f64 } else { 0.0 };
        gauge(&mut out, "blink_kv_usage_ratio", "Share of KV cache blocks owned by running sequences.", usage);
        gauge(&mut out, "blink_f_ctrl", "Share of engine step time not spent in the forward pass.", s.f_ctrl());
        counter(&mut out, "blink_engine_requests_finished_total", "Requests the engine finished.", s.requests_finished as f64);
        counter(&mut out, "blink_engine_prompt_tokens_total", "Prompt tokens the engine admitted.", s.prompt_tokens_total as f64);
        counter(&mut out, "blink_engine_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache.", s.prompt_tokens_cached as f64);
        counter(&mut out, "blink_engine_generated_tokens_total", "Tokens the engine generated.", s.generated_tokens_total as f64);
        counter(&mut out, "blink_engine_steps_total", "Engine steps.", s.steps_total as f64);
        counter(&mut out, "blink_engine_step_seconds_total", "Wall time of engine steps.", s.step_seconds_total);
        counter(&mut out, "blink_engine_compute_seconds_total", "Time of engine steps spent in the forward pass.", s.compute_seconds_total);
        counter(&mut out, "blink_engine_steps_planned_ahead_total", "Engine steps built while the previous step computed.", s.steps_planned_ahead as f64);
        counter(&mut out, "blink_engine_requests_admitted_late_total", "Requests admitted between two steps, into the step about to start, having arrived after the control work beside the step before.", s.requests_admitted_late as f64);
        counter(&mut out, "blink_engine_beside_seconds_total", "Control work (hand-off, admission, planning) done while a step computed, off the critical path.", s.beside_seconds_total);
        counter(&mut out, "blink_coserve_units_total", "Co-served fine-tuning units the engine ran.", s.train_units_total as f64);
        counter(&mut out, "blink_coserve_seconds_total", "Time the engine spent in co-served fine-tuning units.", s.train_seconds_total);
        counter(&mut out, "blink_coserve_units_beside_requests_total", "Co-served fine-tuning units that shared their step with requests' rows.", s.train_units_beside_requests as f64);
        counter(&mut out, "blink_coserve_units_stopped_total", "Co-served fine-tuning units a request's arrival stopped at a layer boundary (the rest ran later).", s.train_units_stopped as f64);
        render_latency(&mut out, s);
        if let Some(a) = adapters {
            gauge(&mut out, "blink_lora_adapters", "LoRA adapters served (held in memory or not).", a.registered as f64);
            gauge(&mut out, "blink_lora_adapters_resident", "LoRA adapters held in memory (--max-cpu-loras bounds it).", a.resident as f64);
            gauge(&mut out, "blink_lora_resident_bytes", "Bytes the LoRA adapters in memory hold (each NUMA part's copy counted).", a.held_bytes as f64);
            gauge(&mut out, "blink_lora_tensor_bytes", "Bytes of the LoRA adapters in memory as f32 tensors, once each.", a.tensor_bytes as f64);
            counter(&mut out, "blink_lora_loads_total", "LoRA adapters read from disk (at start, by load requests, and again after eviction).", a.loads_total as f64);
            counter(&mut out, "blink_lora_evictions_total", "LoRA adapters evicted from memory to make room (--max-cpu-loras).", a.evictions_total as f64);
        }
        out
    }
}

/// The latency model's record per kind of step (the kinds it has seen).
fn render_latency(out: &mut String, s: &EngineStats) {
    let seen: Vec<_> = StepKind::ALL.iter().zip(&s.latency).filter(|(_, k)| k.count > 0).collect();
    type Series = (&'static str, &'static str, fn(&LatencyKindStats) -> f64);
    let series: [Series; 4] = [
        ("blink_latency_model_relative_error", "Median |relative error| of the step-time predictor (refitted online) over recent steps of a kind.", |k| k.median_online),
        ("blink_latency_model_offline_relative_error", "Median |relative error| the offline coefficients alone would have had on the same steps.", |k| k.median_offline),
        ("blink_latency_model_margin", "The margin a kind's predictions get (a quantile of its recent under-predictions).", |k| k.margin),
        ("blink_latency_model_steps_total", "Steps (or training units) of a kind the predictor has observed.", |k| k.count as f64),
    ];
    for (name, help, value) in series {
        let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (k, stats) in &seen {
            let v = value(stats);
            if v.is_finite() {
                let _ = writeln!(out, "{name}{{kind=\"{}\"}} {v}", k.name());
            }
        }
    }
    // Every step since the start, so a client can take the median over any span of them
    // (the gauges above cover only the last steps of each kind).
    type Counts = (&'static str, &'static str, fn(&LatencyKindStats) -> &ErrorCounts);
    let histograms: [Counts; 2] = [
        ("blink_latency_model_abs_error", "|Relative error| of the step-time predictor (refitted online) on every step (for the training kinds, unit) of a kind so far.", |k| &k.online_counts),
        ("blink_latency_model_offline_abs_error", "|Relative error| the offline coefficients alone would have had on every step (or training unit) of a kind so far.", |k| &k.offline_counts),
    ];
    for (name, help, counts) in histograms {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (k, stats) in &seen {
            let (c, kind) = (counts(stats), k.name());
            let mut cum = 0;
            for (i, n) in c.buckets.iter().enumerate() {
                cum += n;
                match ERROR_BUCKETS.get(i) {
                    Some(b) => writeln!(out, "{name}_bucket{{kind=\"{kind}\",le=\"{b}\"}} {cum}"),
                    None => writeln!(out, "{name}_bucket{{kind=\"{kind}\",le=\"+Inf\"}} {cum}"),
                }
                .ok();
            }
            let sum = if c.sum.is_finite() { c.sum.to_string() } else { "+Inf".into() };
            let _ = writeln!(out, "{name}_sum{{kind=\"{kind}\"}} {sum}\n{name}_count{{kind=\"{kind}\"}} {cum}");
        }
    }
}

/// The fine-tuning jobs' figures (a server with a state directory).
pub fn render_finetune(out: &mut String, s: &FinetuneStats) {
    counter(out, "blink_finetune_trained_tokens_total", "Training tokens of the fine-tuning steps committed (checkpointed) since the server started.", s.trained_tokens as f64);
    let _ = writeln!(out, "# HELP blink_finetune_jobs Fine-tuning jobs, by status.\n# TYPE blink_finetune_jobs gauge");
    for (status, n) in &s.jobs {
        let _ = writeln!(out, "blink_finetune_jobs{{status=\"{status}\"}} {n}");
    }
}

fn counter(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
}

fn gauge(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// Read one unlabelled sample from a Prometheus text exposition.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_counters_histograms_and_engine_gauges() {
        let m = Metrics::default();
        m.request("/v1/completions", 200);
        m.request("/v1/completions", 200);
        m.request("/v1/completions", 400);
        m.add_tokens(10, 5);
        m.ttft.observe(0.2);
        m.itl.observe(0.02);
        let mut stats = EngineStats { running: 3, step_seconds_total: 2.0, compute_seconds_total: 1.5, kv_resident_bytes: 1 << 20, train_units_total: 7, ..Default::default() };
        let mut online_counts = ErrorCounts::default();
        for e in [0.004, 0.03, 0.035, 3.0] {
            online_counts.add(e);
        }
        stats.latency[0] = LatencyKindStats { count: 12, median_online: 0.04, median_offline: 0.3, margin: 0.1, online_counts, ..Default::default() };
        stats.latency[4] = LatencyKindStats { count: 3, median_online: f64::NAN, median_offline: f64::NAN, margin: 0.5, ..Default::default() };
        let adapters = AdapterStats { resident: 2, held_bytes: 1000, ..Default::default() };
        let text = m.render(Some(&stats), Some(&adapters));
        assert!(text.contains("blink_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2"), "{text}");
        assert!(text.contains("blink_time_to_first_token_seconds_bucket{le=\"0.25\"} 1"), "{text}");
        assert!(text.contains("blink_time_to_first_token_seconds_bucket{le=\"0.1\"} 0"), "{text}");
        assert_eq!(sample(&text, "blink_generated_tokens_total"), Some(5.0));
        assert_eq!(sample(&text, "blink_running_sequences"), Some(3.0));
        assert_eq!(sample(&text, "blink_f_ctrl"), Some(0.25));
        assert_eq!(sample(&text, "blink_kv_resident_bytes"), Some(1048576.0));
        assert_eq!(sample(&text, "blink_time_to_first_token_seconds_count"), Some(1.0));
        assert_eq!(sample(&text, "blink_lora_resident_bytes"), Some(1000.0));
        assert_eq!(sample(&text, "blink_coserve_units_total"), Some(7.0));
        // Kinds observed only; no NaN ever printed.
        assert!(text.contains("blink_latency_model_relative_error{kind=\"decode\"} 0.04"), "{text}");
        assert!(text.contains("blink_latency_model_offline_relative_error{kind=\"decode\"} 0.3"), "{text}");
        assert!(text.contains("blink_latency_model_margin{kind=\"train_head\"} 0.5"), "{text}");
        assert!(!text.contains("NaN") && !text.contains("kind=\"prefill\""), "{text}");
        // Every step's error in a cumulative histogram per kind (bounds inclusive).
        for (le, n) in [("0.01", 1), ("0.02", 1), ("0.03", 2), ("0.04", 3), ("2", 3), ("+Inf", 4)] {
            let line = format!("blink_latency_model_abs_error_bucket{{kind=\"decode\",le=\"{le}\"}} {n}\n");
            assert!(text.contains(&line), "{line}{text}");
        }
        assert!(text.contains("blink_latency_model_abs_error_count{kind=\"decode\"} 4\n"), "{text}");
        assert!(text.contains("blink_latency_model_abs_error_sum{kind=\"decode\"} 3.069"), "{text}");
        assert!(text.contains("blink_latency_model_offline_abs_error_count{kind=\"decode\"} 0\n"), "{text}");
        assert!(text.contains("blink_latency_model_abs_error_count{kind=\"train_head\"} 0\n"), "{text}");
        assert_eq!(sample(&m.render(None, None), "blink_model_loaded"), Some(0.0));
    }
}
