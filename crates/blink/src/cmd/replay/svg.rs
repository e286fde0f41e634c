//! The replay over time as a hand-written SVG: three panels over one time axis (seconds
//! from the start).
//!
//! 1. Load: arrivals in each second (bars, from the trace's times) and requests in flight
//!    (a step line, from each request's send to its end).
//! 2. Latency, on a log scale: each request's TTFT and TPOT as points at its arrival, the
//!    SLO targets as dashed lines, failed requests as red crosses along the top.
//! 3. Fine-tuning: committed tokens per second between successive readings of
//!    `blink_finetune_trained_tokens_total` (about one a second), or a note when the
//!    server does not export it.

use std::fmt::Write as _;

use super::run::Run;
use super::scrape::TRAINED;
use super::summary::Slo;

const W: f64 = 960.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 72.0;
const PANEL: f64 = 170.0;
const GAP: f64 = 58.0;
const PW: f64 = W - LEFT - RIGHT;
const TTFT_COLOR: &str = "#1f77b4";
const TPOT_COLOR: &str = "#ff7f0e";

/// The SVG document for `run`.
pub fn render(run: &Run, slo: Slo, title: &str) -> String {
    let last = run.outcomes.iter().map(|o| o.due.max(o.ended)).fold(run.seconds, f64::max).max(1.0);
    let xticks = ticks(0.0, last, 10);
    let end = xticks.last().copied().unwrap_or(last).max(last);
    let h = TOP + 3.0 * PANEL + 2.0 * GAP + 48.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ = writeln!(s, "<rect width=\"{W}\" height=\"{h}\" fill=\"white\"/>");
    let _ = writeln!(s, "<text x=\"{LEFT}\" y=\"24\" font-size=\"14\" font-weight=\"bold\">{}</text>", escape(title));
    let x = |t: f64| LEFT + (t / end).clamp(0.0, 1.0) * PW;
    for (i, top) in (0..3).map(|i| (i, TOP + i as f64 * (PANEL + GAP))) {
        frame(&mut s, top, &xticks, &x, i == 2);
    }
    load(&mut s, run, TOP, end, &x);
    latency(&mut s, run, slo, TOP + PANEL + GAP, &x);
    finetune(&mut s, run, TOP + 2.0 * (PANEL + GAP), &x);
    let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">seconds from the start</text>", LEFT + PW / 2.0, h - 10.0);
    s.push_str("</svg>\n");
    s
}

/// A panel's box and vertical grid; the time labels under the last one.
fn frame(s: &mut String, top: f64, xticks: &[f64], x: &dyn Fn(f64) -> f64, labels: bool) {
    for &t in xticks {
        let _ = writeln!(s, "<line x1=\"{0:.1}\" y1=\"{top}\" x2=\"{0:.1}\" y2=\"{1}\" stroke=\"#eee\"/>", x(t), top + PANEL);
        if labels {
            let _ = writeln!(s, "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>", x(t), top + PANEL + 14.0, num(t));
        }
    }
    let _ = writeln!(s, "<rect x=\"{LEFT}\" y=\"{top}\" width=\"{PW}\" height=\"{PANEL}\" fill=\"none\" stroke=\"#999\"/>");
}

/// A linear y axis from 0 to `max` over the panel at `top`: grid, labels, and the mapping.
fn linear_axis(s: &mut String, top: f64, max: f64) -> impl Fn(f64) -> f64 {
    let marks = ticks(0.0, max, 5);
    let max = marks.last().copied().unwrap_or(max).max(max);
    let y = move |v: f64| top + PANEL - (v / max).clamp(0.0, 1.0) * PANEL;
    for &v in &marks {
        let _ = writeln!(s, "<line x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#eee\"/>", y(v), LEFT + PW);
        let _ = writeln!(s, "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", LEFT - 6.0, y(v) + 4.0, num(v));
    }
    y
}

fn heading(s: &mut String, top: f64, text: &str) {
    let _ = writeln!(s, "<text x=\"{LEFT}\" y=\"{}\" font-size=\"12\" font-weight=\"bold\">{}</text>", top - 22.0, escape(text));
}

/// Legend entries along the top of a panel: `(kind, colour, text)`, kind `rect`, `line`,
/// `dash`, `dot` or `cross`.
fn legend(s: &mut String, top: f64, items: &[(&str, &str, String)]) {
    let mut at = LEFT + 260.0;
    let y = top - 10.0;
    for (kind, color, text) in items {
        match *kind {
            "rect" => {
                let _ = writeln!(s, "<rect x=\"{at}\" y=\"{}\" width=\"12\" height=\"8\" fill=\"{color}\"/>", y - 7.0);
            }
            "cross" => {
                let _ = writeln!(s, "<path d=\"M{:.1},{:.1} l6,6 m0,-6 l-6,6\" stroke=\"{color}\" stroke-width=\"1.5\"/>", at + 3.0, y - 6.0);
            }
            "dot" => {
                let _ = writeln!(s, "<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{color}\"/>", at + 6.0, y - 3.0);
            }
            dash => {
                let d = if dash == "dash" { " stroke-dasharray=\"5,3\"" } else { "" };
                let _ = writeln!(s, "<line x1=\"{at}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"{color}\" stroke-width=\"2\"{d}/>", y - 3.0, at + 14.0);
            }
        }
        let _ = writeln!(s, "<text x=\"{}\" y=\"{y}\">{}</text>", at + 18.0, escape(text));
        at += 30.0 + 6.2 * text.chars().count() as f64;
    }
}

/// Panel 1: arrivals per second and requests in flight.
fn load(s: &mut String, run: &Run, top: f64, end: f64, x: &dyn Fn(f64) -> f64) {
    heading(s, top, "load");
    let mut bins = vec![0usize; end.ceil() as usize + 1];
    let last = bins.len() - 1;
    for o in &run.outcomes {
        bins[(o.due.max(0.0) as usize).min(last)] += 1;
    }
    let mut events: Vec<(f64, i64)> = run.outcomes.iter().flat_map(|o| [(o.due + o.lateness, 1), (o.ended, -1)]).collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut now = 0i64;
    let in_flight: Vec<(f64, i64)> = events
        .iter()
        .map(|(t, d)| {
            now += d;
            (*t, now)
        })
        .collect();
    let peak = in_flight.iter().map(|p| p.1).max().unwrap_or(0).max(*bins.iter().max().unwrap_or(&0) as i64).max(1);
    let y = linear_axis(s, top, peak as f64 * 1.05);
    let mut path = format!("M{:.1},{:.1}", x(0.0), y(0.0));
    for (t, n) in &in_flight {
        let _ = write!(path, " H{:.1} V{:.1}", x(*t), y(*n as f64));
    }
    for (i, &n) in bins.iter().enumerate().filter(|(_, n)| **n > 0) {
        let (a, b) = (x(i as f64), x(i as f64 + 1.0));
        let _ = writeln!(s, "<rect x=\"{a:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#9ecae1\"/>", y(n as f64), (b - a - 1.0).max(0.5), y(0.0) - y(n as f64));
    }
    let _ = writeln!(s, "<path d=\"{path}\" fill=\"none\" stroke=\"#333\" stroke-width=\"1.2\"/>");
    legend(s, top, &[("rect", "#9ecae1", "arrivals per second".into()), ("line", "#333", "requests in flight".into())]);
}

/// Panel 2: TTFT and TPOT per request, log scale, with the targets.
fn latency(s: &mut String, run: &Run, slo: Slo, top: f64, x: &dyn Fn(f64) -> f64) {
    heading(s, top, "latency");
    let ok: Vec<_> = run.outcomes.iter().filter_map(|o| o.result.as_ref().ok().map(|t| (o.due, t))).collect();
    let values = ok.iter().flat_map(|(_, t)| [Some(t.ttft), t.tpot]).flatten().chain(slo.ttft).chain(slo.tpot).filter(|v| *v > 0.0);
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (mut lo, mut hi) = if lo <= hi { ((lo * 0.8).log10(), (hi * 1.25).log10()) } else { (-3.0, 0.0) };
    if hi - lo < 1.0 {
        let mid = (hi + lo) / 2.0;
        (lo, hi) = (mid - 0.5, mid + 0.5);
    }
    let y = |v: f64| top + PANEL - ((v.log10() - lo) / (hi - lo)).clamp(0.0, 1.0) * PANEL;
    let steps: &[f64] = if hi - lo < 2.5 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    for v in (lo.floor() as i32..=hi.floor() as i32).flat_map(|k| steps.iter().map(move |m| m * 10f64.powi(k))) {
        if (lo..=hi).contains(&v.log10()) {
            let _ = writeln!(s, "<line x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#eee\"/>", y(v), LEFT + PW);
            let _ = writeln!(s, "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", LEFT - 6.0, y(v) + 4.0, seconds(v));
        }
    }
    for (due, t) in &ok {
        let _ = writeln!(s, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"1.8\" fill=\"{TTFT_COLOR}\" fill-opacity=\"0.6\"/>", x(*due), y(t.ttft));
        if let Some(p) = t.tpot {
            let _ = writeln!(s, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"1.8\" fill=\"{TPOT_COLOR}\" fill-opacity=\"0.6\"/>", x(*due), y(p));
        }
    }
    for o in run.outcomes.iter().filter(|o| o.result.is_err()) {
        let (cx, cy) = (x(o.due), top + 6.0);
        let _ = writeln!(s, "<path d=\"M{0:.1},{1:.1} l6,6 m0,-6 l-6,6\" stroke=\"#d62728\" stroke-width=\"1.5\"/>", cx - 3.0, cy - 3.0);
    }
    let mut items = vec![("dot", TTFT_COLOR, "TTFT".to_string()), ("dot", TPOT_COLOR, "TPOT".to_string())];
    for (target, color, name) in [(slo.ttft, TTFT_COLOR, "TTFT"), (slo.tpot, TPOT_COLOR, "TPOT")] {
        if let Some(v) = target {
            let _ = writeln!(s, "<line x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"{color}\" stroke-width=\"1.5\" stroke-dasharray=\"5,3\"/>", y(v), LEFT + PW);
            items.push(("dash", color, format!("{name} target {}", seconds(v))));
        }
    }
    if run.outcomes.iter().any(|o| o.result.is_err()) {
        items.push(("cross", "#d62728", "failed".into()));
    }
    legend(s, top, &items);
}

/// Panel 3: the fine-tuning rate.
fn finetune(s: &mut String, run: &Run, top: f64, x: &dyn Fn(f64) -> f64) {
    heading(s, top, "fine-tuning (committed tokens/s)");
    let points: Vec<(f64, f64)> = run.scrapes.iter().filter_map(|r| Some((r.at, r.trained_tokens?))).collect();
    let rates: Vec<(f64, f64, f64)> = points.windows(2).filter(|w| w[1].0 > w[0].0).map(|w| (w[0].0, w[1].0, (w[1].1 - w[0].1).max(0.0) / (w[1].0 - w[0].0))).collect();
    if rates.is_empty() {
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#666\">no fine-tuning metric ({TRAINED} is not exported)</text>",
            LEFT + PW / 2.0,
            top + PANEL / 2.0
        );
        return;
    }
    let y = linear_axis(s, top, rates.iter().map(|r| r.2).fold(0.0, f64::max).max(1.0) * 1.05);
    let mut path = format!("M{:.1},{:.1}", x(rates[0].0), y(rates[0].2));
    for (a, b, r) in &rates {
        let _ = write!(path, " V{:.1} H{:.1} V{:.1} H{:.1}", y(*r), x(*a), y(*r), x(*b));
    }
    let _ = writeln!(s, "<path d=\"{path}\" fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"1.5\"/>");
    legend(s, top, &[("line", "#2ca02c", "tokens/s between readings".into())]);
}

/// About `n` round tick values from `lo` to `hi`.
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return vec![lo];
    }
    let raw = (hi - lo) / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let mut out = Vec::new();
    let mut v = (lo / step).ceil() * step;
    while v <= hi + step * 1e-9 {
        out.push(v);
        v += step;
    }
    if out.last().is_some_and(|&l| l < hi) {
        out.push(out.last().unwrap() + step);
    }
    out
}

/// A tick number without trailing zeros.
fn num(v: f64) -> String {
    let s = format!("{:.3}", v);
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Seconds as `500 µs`, `20 ms` or `1.5 s`.
fn seconds(v: f64) -> String {
    if v >= 1.0 {
        format!("{} s", num(v))
    } else if v >= 1e-3 {
        format!("{} ms", num(v * 1e3))
    } else {
        format!("{} µs", num(v * 1e6))
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::super::run::Outcome;
    use super::super::scrape::Scrape;
    use super::*;
    use crate::cmd::client::Timing;

    fn run(trained: bool) -> Run {
        let ok = |due: f64, ttft: f64| Outcome { due, lateness: 0.001, ended: due + 0.5, result: Ok(Timing { ttft, tpot: Some(0.02), e2e: 0.5, tokens: 10 }) };
        let failed = Outcome { due: 1.5, lateness: 0.0, ended: 1.6, result: Err("HTTP 503".into()) };
        let scrape = |at: f64, n: f64| Scrape { at, trained_tokens: trained.then_some(n), ..Scrape::default() };
        Run { outcomes: vec![ok(0.0, 0.05), ok(0.2, 0.08), failed, ok(2.5, 0.3)], scrapes: vec![scrape(0.0, 0.0), scrape(1.0, 100.0), scrape(2.0, 100.0), scrape(3.1, 400.0)], seconds: 3.0 }
    }

    #[test]
    fn three_panels_with_points_targets_failures_and_the_training_rate() {
        let svg = render(&run(true), Slo { ttft: Some(0.2), tpot: None }, "t <1>");
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        assert!(svg.contains(">t &lt;1&gt;</text>"));
        assert_eq!(svg.matches("<circle").count(), 2 * 3 + 2, "TTFT and TPOT of three requests, two legend dots");
        assert!(svg.contains("TTFT target 200 ms") && !svg.contains("TPOT target"));
        assert_eq!(svg.matches("stroke=\"#d62728\"").count(), 2, "one failure, its legend");
        assert!(svg.contains("tokens/s between readings") && !svg.contains("no fine-tuning metric"));
        let none = render(&run(false), Slo::default(), "t");
        assert!(none.contains("no fine-tuning metric") && !none.contains("target"));
    }

    #[test]
    fn round_ticks() {
        assert_eq!(ticks(0.0, 9.3, 10), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        assert_eq!(ticks(0.0, 42.0, 5), vec![0.0, 10.0, 20.0, 30.0, 40.0, 50.0]);
        assert_eq!(ticks(0.0, 0.0, 5), vec![0.0]);
        assert_eq!((num(2.5), num(10.0), seconds(0.4), seconds(2.0), seconds(0.0005)), ("2.5".into(), "10".into(), "400 ms".into(), "2 s".into(), "500 µs".into()));
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
