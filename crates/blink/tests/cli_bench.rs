//! `blink bench` on the real model: one result per (depth, test, batch), in the table and
//! in the JSON, each a measured speed, with the threads that ran it; with `--lora N`, a
//! second result per test with its sequences spread over N random adapters, related to
//! the base result. Above the table, the route each matrix type's products take.

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
    // Above the table, the route each matrix type's products took (the default model
    // holds Q4_1 matrices and a Q8_0 embedding).
    let routes: Vec<&str> = text.lines().filter(|l| l.starts_with("route ")).collect();
    assert_eq!(routes.len(), 2, "{text}");
    assert!(routes[0].starts_with("route Q4_1: ") && routes[1].starts_with("route Q8_0: "), "{text}");
    assert!(text.lines().any(|l| l.starts_with("tiling: activation rows that overflow the L2") && l.contains("rows of 1536 columns, panels of")), "{text}");
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

#[test]
fn bench_lora_adds_an_adapter_row_after_each_base_row() {
    let model = model_path();
    let args = ["bench", "-m", model.to_str().unwrap(), "-t", THREADS, "-p", "0", "-n", "4", "--batch", "1,2", "--lora", "2", "-r", "1"];
    let out = blink(&[&args[..], &["--json"]].concat());
    ok(&out);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).expect("a JSON array");
    let got: Vec<(&str, u64, u64, u64)> = rows
        .iter()
        .map(|r| (r["test"].as_str().unwrap(), r["batch"].as_u64().unwrap(), r["loras"].as_u64().unwrap(), r["lora_rank"].as_u64().unwrap()))
        .collect();
    // Batch 1 runs its one sequence on one adapter; batch 2 spreads over both.
    assert_eq!(got, [("tg4", 1, 0, 0), ("tg4", 1, 1, 8), ("tg4", 2, 0, 0), ("tg4", 2, 2, 8)], "{rows:?}");
    for r in &rows {
        let samples = r["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 1, "{r}");
        assert!(samples.iter().all(|s| s.as_f64().is_some_and(|s| s.is_finite() && s > 0.0)), "{r}");
    }
    // The ratios go to stderr beside the JSON, one per adapter row.
    let err = stderr(&out);
    assert!(err.contains("adapters: 2 random, rank 8, on all seven projections"), "{err}");
    let ratios: Vec<&str> = err.lines().filter(|l| l.starts_with("lora: ")).collect();
    assert_eq!(ratios.len(), 2, "{err}");
    assert!(ratios[0].contains(&format!("tg4 at {THREADS} thread(s), batch 1 with 1 adapter (r8) runs at ")), "{err}");
    assert!(ratios[1].contains(&format!("tg4 at {THREADS} thread(s), batch 2 over 2 adapters (r8) runs at ")), "{err}");
    assert!(ratios.iter().all(|l| l.contains("% of the base")), "{err}");

    // The table names an adapter row by its adapters, and prints the ratios after it; a
    // prompt test gets a row with one adapter.
    let out = blink(&["bench", "-m", model.to_str().unwrap(), "-t", THREADS, "-p", "8", "-n", "4", "-d", "0,20", "--lora", "3", "--lora-rank", "4", "-r", "1"]);
    ok(&out);
    let text = stdout(&out);
    let names: Vec<&str> = text.lines().filter(|l| l.starts_with("| pp") || l.starts_with("| tg")).map(|l| l.split('|').nth(1).unwrap().trim()).collect();
    assert_eq!(
        names,
        ["pp8", "pp8 + 1 lora r4", "tg4", "tg4 + 1 lora r4", "pp8 @ d20", "pp8 + 1 lora r4 @ d20", "tg4 @ d20", "tg4 + 1 lora r4 @ d20"],
        "{text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    let last_row = lines.iter().rposition(|l| l.starts_with("| ")).unwrap();
    let ratios: Vec<&str> = lines[last_row + 1..].iter().copied().filter(|l| l.starts_with("lora: ")).collect();
    assert_eq!(ratios.len(), 4, "{text}");
    assert!(ratios[3].starts_with(&format!("lora: tg4 @ d20 at {THREADS} thread(s), batch 1 with 1 adapter (r4) runs at ")), "{text}");
}

#[test]
fn bench_lora_places_the_adapters_on_the_model_of_each_thread_count() {
    // Two simulated NUMA nodes: the model is placed afresh for each thread count, and the
    // adapters with it (adapters placed for another placement would not run on it).
    let model = model_path();
    let out = blink(&["bench", "-m", model.to_str().unwrap(), "-t", "2,3", "--numa-nodes", "2", "-p", "0", "-n", "2", "--batch", "2", "--lora", "2", "-r", "1", "--json"]);
    ok(&out);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).expect("a JSON array");
    let got: Vec<(u64, u64)> = rows.iter().map(|r| (r["threads"].as_u64().unwrap(), r["loras"].as_u64().unwrap())).collect();
    assert_eq!(got, [(2, 0), (2, 2), (3, 0), (3, 2)], "{rows:?}");
}
