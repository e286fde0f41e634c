//! A replay's summary: latency percentiles (TTFT, TPOT, end to end), SLO attainment,
//! throughput, the engine's busy fraction, the fine-tuning rate and the latency
//! predictor's error when the server exports them, and how late the client sent; printed
//! as a table or as one JSON object.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::probe::Capacity;
use super::run::{Outcome, Run};
use super::scrape::{KindHistograms, Scrape, PREDICTOR, TRAINED};
use crate::cmd::client::{ms, percentile};

/// Latency targets; a request attains them when it did not fail and its TTFT and TPOT
/// are within those set (a request of one token has no TPOT to miss).
#[derive(Clone, Copy, Debug, Default)]
pub struct Slo {
    pub ttft: Option<f64>,
    pub tpot: Option<f64>,
}

impl Slo {
    pub fn met(&self, o: &Outcome) -> bool {
        let Ok(t) = &o.result else { return false };
        self.ttft.is_none_or(|s| t.ttft <= s) && self.tpot.is_none_or(|s| t.tpot.is_none_or(|x| x <= s))
    }

    fn any(&self) -> bool {
        self.ttft.is_some() || self.tpot.is_some()
    }
}

/// How the trace was made, for the report.
pub struct TraceInfo {
    /// `poisson`, `gamma (cv 4)`, `burst-light`, `FILE.csv`…
    pub source: String,
    pub seed: Option<u64>,
    pub offered_rps: f64,
    pub mean_prompt_tokens: f64,
    pub mean_max_tokens: f64,
}

/// p50, p95, p99 and mean.
struct Dist {
    p50: Option<f64>,
    p95: Option<f64>,
    p99: Option<f64>,
    mean: Option<f64>,
    max: Option<f64>,
}

impl Dist {
    fn of(mut v: Vec<f64>) -> Dist {
        let mean = (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let max = v.iter().copied().reduce(f64::max);
        Dist { p50: percentile(&mut v, 0.50), p95: percentile(&mut v, 0.95), p99: percentile(&mut v, 0.99), mean, max }
    }

    fn json(&self) -> Value {
        json!({"p50": self.p50, "p95": self.p95, "p99": self.p99, "mean": self.mean})
    }
}

pub struct Summary {
    pub label: Option<String>,
    trace: TraceInfo,
    requests: usize,
    completed: usize,
    errors: BTreeMap<String, usize>,
    seconds: f64,
    output_tokens: usize,
    ttft: Dist,
    tpot: Dist,
    e2e: Dist,
    lateness: Dist,
    slo: Slo,
    attained: Option<f64>,
    target_utilization: Option<f64>,
    capacity: Option<Capacity>,
    busy: Option<f64>,
    finetune_tok_s: Option<f64>,
    /// Median |relative error| per kind over the server's last steps of it (its gauge).
    predictor: Vec<(String, f64)>,
    predictor_offline: Vec<(String, f64)>,
    /// The same over every step of the run (from its histograms' first and last readings),
    /// with the number of steps: `(kind, median, steps)`.
    predictor_run: Vec<(String, f64, f64)>,
    predictor_offline_run: Vec<(String, f64, f64)>,
}

/// Sends later than this (p99) mean the client fell behind its schedule.
pub const LATE: f64 = 0.010;

impl Summary {
    pub fn new(run: &Run, trace: TraceInfo, slo: Slo, target_utilization: Option<f64>, capacity: Option<Capacity>) -> Summary {
        let ok: Vec<_> = run.outcomes.iter().filter_map(|o| o.result.as_ref().ok()).collect();
        let mut errors = BTreeMap::new();
        for e in run.outcomes.iter().filter_map(|o| o.result.as_ref().err()) {
            *errors.entry(e.clone()).or_insert(0) += 1;
        }
        let attained = slo.any().then(|| 100.0 * run.outcomes.iter().filter(|o| slo.met(o)).count() as f64 / run.outcomes.len().max(1) as f64);
        let (first, last) = (run.scrapes.first(), run.scrapes.last());
        let rate = |f: fn(&Scrape) -> Option<f64>| match (first, last) {
            (Some(a), Some(b)) if b.at > a.at => Some((f(b)? - f(a)?) / (b.at - a.at)),
            _ => None,
        };
        Summary {
            label: None,
            requests: run.outcomes.len(),
            completed: ok.len(),
            errors,
            seconds: run.seconds,
            output_tokens: ok.iter().map(|t| t.tokens).sum(),
            ttft: Dist::of(ok.iter().map(|t| t.ttft).collect()),
            tpot: Dist::of(ok.iter().filter_map(|t| t.tpot).collect()),
            e2e: Dist::of(ok.iter().map(|t| t.e2e).collect()),
            lateness: Dist::of(run.outcomes.iter().map(|o| o.lateness).collect()),
            slo,
            attained,
            target_utilization,
            capacity,
            busy: rate(|s| s.compute_seconds),
            finetune_tok_s: rate(|s| s.trained_tokens),
            predictor: run.scrapes.iter().rev().map(|s| &s.predictor_error).find(|p| !p.is_empty()).cloned().unwrap_or_default(),
            predictor_offline: run.scrapes.iter().rev().map(|s| &s.predictor_offline_error).find(|p| !p.is_empty()).cloned().unwrap_or_default(),
            predictor_run: span(first, last, |s| &s.predictor_counts),
            predictor_offline_run: span(first, last, |s| &s.predictor_offline_counts),
            trace,
        }
    }

    /// Whether the client sent late enough to matter.
    pub fn late(&self) -> Option<(f64, f64)> {
        match (self.lateness.p99, self.lateness.max) {
            (Some(p99), Some(max)) if p99 > LATE => Some((p99, max)),
            _ => None,
        }
    }

    fn rps(&self) -> f64 {
        self.completed as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }

    fn tok_s(&self) -> f64 {
        self.output_tokens as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }

    pub fn json(&self) -> Value {
        let c = self.capacity.as_ref();
        json!({
            "label": self.label,
            "trace": {
                "source": self.trace.source,
                "seed": self.trace.seed,
                "offered_rps": self.trace.offered_rps,
                "mean_prompt_tokens": self.trace.mean_prompt_tokens,
                "mean_max_tokens": self.trace.mean_max_tokens,
            },
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.requests - self.completed,
            "errors": self.errors,
            "seconds": self.seconds,
            "rps": self.rps(),
            "output_tokens": self.output_tokens,
            "output_tok_s": self.tok_s(),
            "ttft_s": self.ttft.json(),
            "tpot_s": self.tpot.json(),
            "e2e_s": self.e2e.json(),
            "slo": {"ttft_s": self.slo.ttft, "tpot_s": self.slo.tpot, "attainment_pct": self.attained},
            "utilization": {
                "target": self.target_utilization,
                "capacity_rps": c.map(|c| c.rps),
                "probe": c.map(|c| json!({"concurrency": c.concurrency, "requests": c.requests, "prompt_tokens": c.prompt_tokens, "max_tokens": c.max_tokens, "seconds": c.seconds, "engine_busy": c.busy})),
                "offered": c.map(|c| self.trace.offered_rps / c.rps),
                "engine_busy": self.busy,
            },
            "finetune_tok_s": self.finetune_tok_s,
            "latency_model_error": by_kind(&self.predictor),
            "latency_model_offline_error": by_kind(&self.predictor_offline),
            "latency_model_error_run": by_kind(&medians(&self.predictor_run)),
            "latency_model_offline_error_run": by_kind(&medians(&self.predictor_offline_run)),
            "latency_model_steps_run": by_kind(&self.predictor_run.iter().map(|(k, _, n)| (k.clone(), *n)).collect::<Vec<_>>()),
            "send_lateness_s": {"p50": self.lateness.p50, "p99": self.lateness.p99, "max": self.lateness.max},
        })
    }

    /// One line naming the run: label, requests, source, rate, seed.
    pub fn title(&self) -> String {
        let t = &self.trace;
        let seed = t.seed.map_or(String::new(), |s| format!(", seed {s}"));
        let label = self.label.as_ref().map_or(String::new(), |l| format!("{l}: "));
        format!("{label}{} requests, {} at {:.2} req/s{seed}", self.requests, t.source, t.offered_rps)
    }

    /// The readable report.
    pub fn table(&self) -> String {
        let mut out = format!("{}, over {:.1} s\n\n", self.title(), self.seconds);
        out += "| latency | p50 | p95 | p99 | mean |\n|:--|--:|--:|--:|--:|\n";
        for (name, d) in [("TTFT", &self.ttft), ("TPOT", &self.tpot), ("end to end", &self.e2e)] {
            out += &format!("| {name} | {} | {} | {} | {} |\n", ms(d.p50), ms(d.p95), ms(d.p99), ms(d.mean));
        }
        out += "\n| measure | value |\n|:--|:--|\n";
        let mut row = |k: &str, v: String| out += &format!("| {k} | {v} |\n");
        row("requests", format!("{} completed, {} failed", self.completed, self.requests - self.completed));
        row("throughput", format!("{:.2} req/s, {:.1} output tok/s", self.rps(), self.tok_s()));
        if self.slo.any() {
            let mut targets = Vec::new();
            targets.extend(self.slo.ttft.map(|s| format!("TTFT ≤ {}", ms(Some(s)))));
            targets.extend(self.slo.tpot.map(|s| format!("TPOT ≤ {}", ms(Some(s)))));
            row(&format!("SLO attainment ({})", targets.join(", ")), format!("{:.1}%", self.attained.unwrap_or(0.0)));
        }
        if let Some(c) = &self.capacity {
            row("capacity (probe)", format!("{:.2} req/s ({} requests of {} + {} tokens, {} at a time, {:.1} s)", c.rps, c.requests, c.prompt_tokens, c.max_tokens, c.concurrency, c.seconds));
        }
        let offered = match (&self.capacity, self.target_utilization) {
            (Some(_), Some(u)) => format!("offered {u:.2} of capacity"),
            _ => "offered: not measured (--utilization probes it)".into(),
        };
        let busy = self.busy.map_or("engine busy: absent (no blink_engine_compute_seconds_total)".into(), |b| format!("engine busy {b:.3}"));
        row("utilization", format!("{offered}; {busy}"));
        row("fine-tuning", self.finetune_tok_s.map_or(format!("absent (no {TRAINED})"), |r| format!("{r:.1} tok/s committed")));
        let predictor = percentages(&self.predictor);
        row("latency model error (last steps)", if predictor.is_empty() { format!("absent (no {PREDICTOR})") } else { predictor });
        if !self.predictor_run.is_empty() {
            row("latency model error (every step of the run)", percentages(&medians(&self.predictor_run)));
        }
        row("send lateness", format!("p50 {}, p99 {}, max {}", ms(self.lateness.p50), ms(self.lateness.p99), ms(self.lateness.max)));
        let mut errors: Vec<(&String, &usize)> = self.errors.iter().collect();
        errors.sort_by(|a, b| b.1.cmp(a.1));
        for (e, n) in errors.iter().take(5) {
            out += &format!("\n{n} request(s) failed: {e}");
        }
        if errors.len() > 5 {
            out += &format!("\n… and {} other errors", errors.len() - 5);
        }
        out
    }
}

/// Figures per kind as a JSON object (`null` when there are none).
fn by_kind(figures: &[(String, f64)]) -> Option<serde_json::Map<String, Value>> {
    (!figures.is_empty()).then(|| figures.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
}

/// Figures per kind as `decode 4.2%, prefill 7.0%`.
fn percentages(figures: &[(String, f64)]) -> String {
    figures.iter().map(|(k, v)| format!("{k} {:.1}%", v * 100.0)).collect::<Vec<_>>().join(", ")
}

/// The medians of `span_medians` without their counts.
fn medians(figures: &[(String, f64, f64)]) -> Vec<(String, f64)> {
    figures.iter().map(|(k, m, _)| (k.clone(), *m)).collect()
}

/// [`span_medians`] of the histograms `of` picks from the first and last readings, where
/// both answered (nothing otherwise: a failed first reading is not a fresh server).
fn span(first: Option<&Scrape>, last: Option<&Scrape>, of: fn(&Scrape) -> &KindHistograms) -> Vec<(String, f64, f64)> {
    match (first, last) {
        (Some(a), Some(b)) if a.answered && b.answered => span_medians(of(a), of(b)),
        _ => Vec::new(),
    }
}

/// Per kind, the median of the steps a cumulative histogram counted between two readings
/// (`before` may lack a kind: none then), interpolated within its bucket as Prometheus's
/// `histogram_quantile` does (the largest finite bound where it falls past them), and the
/// number of those steps. Kinds with no step between the readings, or whose counts went
/// down (the server restarted), are left out.
fn span_medians(before: &KindHistograms, after: &KindHistograms) -> Vec<(String, f64, f64)> {
    let mut out = Vec::new();
    for (kind, buckets) in after {
        let earlier = before.iter().find(|(k, _)| k == kind).map(|(_, b)| b.as_slice()).unwrap_or(&[]);
        let counts: Vec<(f64, f64)> = buckets
            .iter()
            .map(|&(le, n)| (le, n - earlier.iter().find(|&&(l, _)| l == le).map_or(0.0, |&(_, m)| m)))
            .collect();
        let Some(&(_, total)) = counts.last() else { continue };
        if total <= 0.0 || counts.iter().any(|&(_, n)| n < 0.0) {
            continue;
        }
        let half = total / 2.0;
        let (mut lower, mut below) = (0.0, 0.0);
        for &(le, n) in &counts {
            if n >= half {
                // (n > below here: `below` is under half.)
                let median = if le.is_finite() { lower + (le - lower) * (half - below) / (n - below) } else { lower };
                out.push((kind.clone(), median, total));
                break;
            }
            (lower, below) = (le, n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_medians_interpolate_within_the_bucket() {
        let h = |c: [f64; 4]| vec![(0.01, c[0]), (0.02, c[1]), (0.05, c[2]), (f64::INFINITY, c[3])];
        let before = vec![("decode".to_string(), h([10.0, 10.0, 10.0, 10.0])), ("mixed".to_string(), h([3.0, 3.0, 3.0, 3.0]))];
        // 20 new steps: 4 at most 1%, 6 in (1%, 2%], 8 in (2%, 5%], 2 above: the 10th
        // is the last of the second bucket.
        let after = vec![("decode".to_string(), h([14.0, 20.0, 28.0, 30.0])), ("prefill".to_string(), h([0.0, 0.0, 4.0, 4.0])), ("mixed".to_string(), h([1.0, 1.0, 1.0, 1.0]))];
        let m = span_medians(&before, &after);
        // A kind new since the first reading: all 4 in (2%, 5%], the 2nd halfway. One
        // whose counts went down (a restart) is left out.
        let near = |got: &(String, f64, f64), kind: &str, median: f64, steps: f64| got.0 == kind && (got.1 - median).abs() < 1e-12 && got.2 == steps;
        assert!(m.len() == 2 && near(&m[0], "decode", 0.02, 20.0) && near(&m[1], "prefill", 0.035, 4.0), "{m:?}");
        // With nothing before every step counts; past the finite bounds, the last one.
        let m = span_medians(&Vec::new(), &vec![("decode".to_string(), h([0.0, 1.0, 1.0, 5.0]))]);
        assert_eq!(m, vec![("decode".to_string(), 0.05, 5.0)]);
        // No step between the readings: nothing.
        assert!(span_medians(&after, &after).is_empty());
        // A first reading that failed is not a fresh server: no span at all.
        let reading = |answered| Scrape { predictor_counts: after.clone(), answered, ..Scrape::parse("") };
        assert!(span(Some(&reading(false)), Some(&reading(true)), |s| &s.predictor_counts).is_empty());
        let fresh = Scrape { answered: true, ..Scrape::parse("") };
        assert_eq!(span(Some(&fresh), Some(&reading(true)), |s| &s.predictor_counts).len(), 3);
    }
}
