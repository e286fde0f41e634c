//! `blink calibrate` on the real model: a quick sweep writes a coefficient file that has a
//! fitted coefficient for every feature and samples of every kind of step (the optimizer's
//! norm and update units among them), whose fit explains its own samples, and that `blink
//! replay --latency` loads; a broken file is refused by name.

mod support;

use serde_json::Value;
use support::*;

#[test]
fn calibrate_writes_a_file_serve_loads_and_fits_every_kind_of_step() {
    let dir = std::env::temp_dir().join(format!("blink-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("latency.json");
    let out = blink(&["calibrate", "--quick", "-t", "2", "--out", file.to_str().unwrap()]);
    ok(&out);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(v["format"], "blink-latency-model");
    assert_eq!(v["version"], 2);
    assert_eq!(v["fit"]["unexercised"], Value::Array(vec![]), "the sweep left features unmeasured: {}", v["fit"]);
    for part in ["pass", "unit"] {
        for (name, c) in v[part].as_object().unwrap() {
            let c = c.as_f64().unwrap_or(-1.0);
            assert!(c.is_finite() && c >= 0.0, "{part}.{name} = {c}");
        }
    }
    for name in ["optimizer_param", "norm_param", "forward_row_layer", "backward_row_layer", "head_row"] {
        assert!(v["unit"][name].as_f64().unwrap() > 0.0, "unit.{name} was fitted to 0: {}", v["unit"]);
    }
    let kinds: Vec<&Value> = v["fit"]["kinds"].as_array().unwrap().iter().collect();
    let names: Vec<&str> = kinds.iter().map(|k| k["kind"].as_str().unwrap()).collect();
    assert_eq!(names, ["decode", "prefill", "mixed", "train_forward", "train_head", "train_backward", "optimizer"]);
    for k in &kinds {
        // A fit that explains its own samples: on a shared, noisy machine a kind's median
        // error stays well under a half (a broken feature is off by whole factors).
        let median = k["median_abs_error"].as_f64().unwrap();
        assert!(k["count"].as_u64().unwrap() >= 3 && median < 0.5, "{k}");
    }

    // The file is what serve and replay load; a file of another version is refused by name.
    let loaded = blink(&["replay", "--latency", file.to_str().unwrap(), "-n", "4", "--rate", "4", "--prompt-tokens", "16", "--output-tokens", "4", "--json"]);
    ok(&loaded);
    let old = dir.join("old.json");
    std::fs::write(&old, std::fs::read_to_string(&file).unwrap().replace("\"version\": 2", "\"version\": 1")).unwrap();
    let refused = blink(&["replay", "--latency", old.to_str().unwrap(), "-n", "4", "--rate", "4", "--json"]);
    assert!(!refused.status.success());
    let err = stderr(&refused);
    assert!(err.contains("old.json") && err.contains("version 1") && err.contains("blink calibrate"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
