//! `blink replay` on the real model, with its in-process server: a short burst-light trace
//! at half the probed capacity, its JSON summary accounting for every request and token,
//! its SVG well-formed, its saved trace replayed again from CSV; and bad input refused
//! with a clear error before any model is loaded.

mod support;

use serde_json::Value;
use support::*;

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("blink-replay-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The last stdout line as JSON.
fn summary(out: &std::process::Output) -> Value {
    let text = stdout(out);
    let last = text.lines().last().unwrap_or_else(|| panic!("no output; stderr: {}", stderr(out)));
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"))
}

fn num(v: &Value, path: &str) -> f64 {
    path.split('.').fold(v, |v, k| &v[k]).as_f64().unwrap_or_else(|| panic!("{path} is not a number in {v}"))
}

/// Every tag closed in order, attributes quoted, no stray `<` or `&` in text.
fn assert_well_formed(svg: &str) {
    assert!(svg.trim_start().starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
    let mut stack: Vec<&str> = Vec::new();
    let mut rest = svg;
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        assert!(!text.contains('>'), "stray '>' in {text:?}");
        for (i, _) in text.match_indices('&') {
            assert!(["&amp;", "&lt;", "&gt;", "&quot;"].iter().any(|e| text[i..].starts_with(e)), "stray '&' in {text:?}");
        }
        let close = rest[open..].find('>').map(|c| open + c).expect("an unclosed tag");
        let tag = &rest[open + 1..close];
        assert!(tag.matches('"').count().is_multiple_of(2) && !tag.contains('<'), "bad tag <{tag}>");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop(), Some(name.trim()), "closing </{name}>");
        } else if !tag.ends_with('/') {
            stack.push(tag.split_whitespace().next().unwrap_or(""));
        }
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty() && rest.trim().is_empty(), "unclosed: {stack:?}");
}

#[test]
fn replay_reports_every_request_and_draws_it() {
    let model = model_path();
    let dir = temp_dir("run");
    let (svg, csv) = (dir.join("replay.svg"), dir.join("trace.csv"));
    let out = blink(&[
        "replay", "-m", model.to_str().unwrap(), "-t", THREADS,
        "--shape", "burst-light", "-n", "30", "--utilization", "0.5", "--probe-concurrency", "4",
        "--prompt-tokens", "16:48", "--output-tokens", "4:12", "--seed", "7",
        "--slo-ttft", "2", "--slo-tpot", "0.5",
        "--json", "--svg", svg.to_str().unwrap(), "--save-trace", csv.to_str().unwrap(),
    ]);
    ok(&out);
    let s = summary(&out);
    assert_eq!((s["requests"].as_u64(), s["completed"].as_u64(), s["failed"].as_u64()), (Some(30), Some(30), Some(0)), "{s}");
    assert_eq!((s["trace"]["source"].as_str(), s["trace"]["seed"].as_u64()), (Some("burst-light"), Some(7)));

    // The saved trace: 30 requests in the 2 s peaks of 6 s cycles; every request generated
    // exactly its max_tokens (ignore_eos).
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<Vec<f64>> = text.lines().skip(1).map(|l| l.split(',').map(|f| f.parse().unwrap()).collect()).collect();
    assert_eq!(rows.len(), 30, "{text}");
    assert!(rows.windows(2).all(|w| w[0][0] <= w[1][0]) && rows.iter().all(|r| r[0] % 6.0 < 2.0), "{text}");
    assert!(rows.iter().all(|r| (16.0..=48.0).contains(&r[1]) && (4.0..=12.0).contains(&r[2])), "{text}");
    let want_tokens: f64 = rows.iter().map(|r| r[2]).sum();
    assert_eq!(num(&s, "output_tokens"), want_tokens, "{s}");
    assert!((num(&s, "output_tok_s") * num(&s, "seconds") - want_tokens).abs() < 1e-6 * want_tokens.max(1.0), "{s}");

    // Offered at half the probed capacity; the engine was busy some of the time.
    let capacity = num(&s, "utilization.capacity_rps");
    assert!(capacity > 0.0 && (num(&s, "trace.offered_rps") / capacity - 0.5).abs() < 1e-9, "{s}");
    assert_eq!(s["utilization"]["probe"]["requests"].as_u64(), Some(8));
    let busy = num(&s, "utilization.engine_busy");
    assert!(busy > 0.0 && busy <= 1.05, "{s}");
    assert!(num(&s, "rps") > 0.0);
    for d in ["ttft_s", "tpot_s", "e2e_s"] {
        let (p50, p95, p99) = (num(&s, &format!("{d}.p50")), num(&s, &format!("{d}.p95")), num(&s, &format!("{d}.p99")));
        assert!(0.0 < p50 && p50 <= p95 && p95 <= p99, "{d}: {s}");
    }
    assert!(num(&s, "ttft_s.p99") <= num(&s, "e2e_s.p99"));
    let attained = num(&s, "slo.attainment_pct");
    assert!((0.0..=100.0).contains(&attained) && num(&s, "slo.ttft_s") == 2.0, "{s}");
    assert!(num(&s, "send_lateness_s.max") >= 0.0);
    // Not exported yet, or exported: either way reported, never an error.
    assert!(s["finetune_tok_s"].is_null() || num(&s, "finetune_tok_s") >= 0.0, "{s}");
    assert!(s["latency_model_error"].is_null() || s["latency_model_error"].is_object(), "{s}");
    // Blink's server exports every step's predictor errors, so the run's own medians are
    // there, a decode step's at least (30 requests of 4-12 tokens), over the run's steps
    // alone (not the probe's before it): no more passes with decode rows than tokens made.
    for key in ["latency_model_error_run", "latency_model_offline_error_run"] {
        let run = s[key].as_object().unwrap_or_else(|| panic!("{key}: {s}"));
        assert!(run.contains_key("decode") && run.values().all(|v| v.as_f64().is_some_and(|e| e >= 0.0)), "{key}: {s}");
    }
    let steps = |kind: &str| s["latency_model_steps_run"][kind].as_f64().unwrap_or(0.0);
    assert!(steps("decode") > 0.0 && steps("decode") + steps("mixed") <= want_tokens, "{s}");

    let picture = std::fs::read_to_string(&svg).unwrap();
    assert_well_formed(&picture);
    for heading in [">load<", ">latency<", ">fine-tuning (committed tokens/s)<", ">TTFT target 2 s<"] {
        assert!(picture.contains(heading), "{heading}");
    }
    assert!(picture.matches("<circle").count() >= 2 * 30, "a TTFT and a TPOT point per request");

    // The same trace from its CSV, its first 10 requests at 20/s, as text.
    let out = blink(&["replay", "-m", model.to_str().unwrap(), "-t", THREADS, "--trace", csv.to_str().unwrap(), "-n", "10", "--rate", "20", "--text-prompts", "--json"]);
    ok(&out);
    let s = summary(&out);
    assert_eq!((s["completed"].as_u64(), s["trace"]["seed"].as_u64()), (Some(10), None), "{s}");
    // Without --slo-* flags, attainment is against the engine's default targets (1 s, 0.1 s).
    assert!((num(&s, "trace.offered_rps") - 20.0).abs() < 1e-6 && num(&s, "slo.ttft_s") == 1.0 && num(&s, "slo.tpot_s") == 0.1, "{s}");
    assert!(s["utilization"]["capacity_rps"].is_null());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = temp_dir("bad");
    let csv = dir.join("bad.csv");
    std::fs::write(&csv, "timestamp_s,prompt_tokens,max_tokens\n0,10,4\n0.5,ten,4\n").unwrap();
    let csv = csv.to_str().unwrap();
    for (args, want) in [
        (vec!["--trace", csv], "bad.csv: line 3: prompt_tokens \"ten\" is not a positive whole number"),
        (vec!["--rate", "1", "-n", "0"], "--requests must be at least 1"),
        (vec!["--utilization", "1.5"], "--utilization must be within (0, 1]"),
        (vec!["--utilization", "0"], "--utilization must be within (0, 1]"),
        (vec!["--rate", "-2"], "--rate must be a positive number"),
        (vec!["-n", "5"], "a generated trace needs --rate R"),
        (vec!["--rate", "1", "--shape", "square"], "unknown shape 'square'"),
        (vec!["--rate", "1", "--prompt-tokens", "9:3"], "--prompt-tokens: '9:3' is not a length"),
        (vec!["--rate", "1", "--svg", "/nonexistent-blink-dir/r.svg"], "--svg: /nonexistent-blink-dir is not a directory"),
        (vec!["--rate", "1", "--url", "http://127.0.0.1:9"], "the server cannot be reached: cannot connect to 127.0.0.1:9"),
    ] {
        let out = blink(&[&["replay"], args.as_slice()].concat());
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        assert!(err.starts_with("error: ") && err.contains(want) && !err.contains("panicked"), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
