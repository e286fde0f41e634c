//! `blink bench` on the real model: one result per (depth, test, batch), in the table and
//! in the JSON, each a measured speed, with the threads that ran it.

mod support;

use support::*;

#[test]
fn bench_reports_every_test_at_every_depth() {
    let model = model_path();
    let args = ["bench", "-m", model.to_str().unwrap(), "-t", THREADS, "-p", "8", "-n", "4", "-d", "0,20", "--batch", "1,2", "-r", "2"];
    let out = blink(&[&args[..], &["--json"]].concat());
    ok(&out);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).expect("a JSON array");
    let got: Vec<(String, u64, u64)> =
        rows.iter().map(|r| (r["test"].as_str().unwrap().to_string(), r["depth"].as_u64().unwrap(), r["batch"].as_u64().unwrap())).collect();
    let want: Vec<(String, u64, u64)> = [0, 20]
        .into_iter()
        .flat_map(|d| [("pp8", d, 1), ("tg4", d, 1), ("tg4", d, 2)])
        .map(|(t, d, b)| (t.to_string(), d, b))
        .collect();
    assert_eq!(got, want);
    for r in &rows {
        let samples: Vec<f64> = r["samples"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap()).collect();
        assert_eq!(samples.len(), 2, "{r}");
        assert!(samples.iter().all(|&s| s.is_finite() && s > 0.0), "{r}");
        let mean = samples.iter().sum::<f64>() / 2.0;
        assert!((r["tok_s"].as_f64().unwrap() - mean).abs() <= 1e-9 * mean, "{r}");
    }

    // The table names a test at a depth as llama-bench does.
    let out = blink(&args);
    ok(&out);
    let text = stdout(&out);
    let names: Vec<&str> = text.lines().filter(|l| l.starts_with("| pp") || l.starts_with("| tg")).map(|l| l.split('|').nth(1).unwrap().trim()).collect();
    assert_eq!(names, ["pp8", "tg4", "tg4", "pp8 @ d20", "tg4 @ d20", "tg4 @ d20"], "{text}");
}

#[test]
fn bench_reports_the_threads_that_ran() {
    // Two simulated NUMA nodes need a thread each, whatever -t asks for.
    let model = model_path();
    let out = blink(&["bench", "-m", model.to_str().unwrap(), "-t", "1", "--numa-nodes", "2", "-p", "8", "-n", "4", "-r", "1", "--json", "--bandwidth"]);
    ok(&out);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).expect("a JSON array");
    assert_eq!(rows[0]["threads"], 2, "{rows:?}");
    let err = stderr(&out);
    assert!(err.contains("each of the 2 NUMA nodes needs a thread: running 2 threads"), "{err}");
    // The bandwidth bound is measured, and the decode row related to it, at what ran.
    assert!(err.contains("bandwidth: 2 thread(s)") && err.contains("tg4 at 2 thread(s)"), "{err}");
}
