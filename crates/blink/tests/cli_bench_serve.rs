//! `blink bench-serve` on the real model, with its in-process server: one table row per
//! concurrency level, each accounting for every request and token it asked for.

mod support;

use support::*;

#[test]
fn bench_serve_reports_every_level() {
    let model = model_path();
    let out = blink(&["bench-serve", "-m", model.to_str().unwrap(), "-t", THREADS, "--concurrency", "1,3", "-n", "6", "--max-tokens", "5"]);
    ok(&out);
    let text = stdout(&out);
    let rows: Vec<Vec<String>> = text
        .lines()
        .filter(|l| l.starts_with("| ") && l.split('|').nth(1).is_some_and(|c| c.trim().parse::<usize>().is_ok()))
        .map(|l| l.split('|').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect())
        .collect();
    assert_eq!(rows.len(), 2, "one row per level:\n{text}");
    for (row, concurrency) in rows.iter().zip([1, 3]) {
        let num = |i: usize| row[i].trim_end_matches(" ms").parse::<f64>().unwrap_or_else(|_| panic!("column {i} of {row:?}"));
        assert_eq!((num(0), num(1)), (concurrency as f64, 6.0), "{row:?}");
        let (req_s, tok_s) = (num(2), num(3));
        // Every request generated exactly --max-tokens tokens (ignore_eos): tokens/s is five
        // times requests/s, up to the printed rounding (0.05 and 5 × 0.005).
        assert!(req_s > 0.0 && (tok_s - 5.0 * req_s).abs() <= 0.08, "{row:?}");
        let (ttft50, ttft99, tpot50, tpot99) = (num(4), num(5), num(6), num(7));
        assert!(0.0 < ttft50 && ttft50 <= ttft99 && 0.0 < tpot50 && tpot50 <= tpot99, "{row:?}");
        let f_ctrl = num(8);
        assert!((0.0..1.0).contains(&f_ctrl), "{row:?}");
    }
}
