//! `blink profile` and `blink plan` on the real model: the profile measures this machine
//! (every figure positive, a product rate for each weight type the model's layers use);
//! plans made from it leave out a device behind a slow link, spread a model over devices
//! that cannot hold it alone (streaming none of it when they can hold it together), price
//! a fixed plan as given, and refuse bad files by name.

mod support;

use serde_json::Value;
use support::*;

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn profile_then_plan() {
    let dir = std::env::temp_dir().join(format!("blink-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = blink(&["profile", "-t", "2"]);
    ok(&out);
    let profile: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!((profile["format"].as_str(), profile["version"].as_u64()), (Some("blink-profile"), Some(1)));
    let rates = profile["product_bytes_per_s"].as_object().unwrap();
    // SmolLM2-135M Q4_1's layers hold Q4_1 matrices (and a few Q8_0 or Q6_K ones).
    assert!(rates.contains_key("Q4_1"), "{rates:?}");
    for (ty, r) in rates {
        assert!(r.as_f64().unwrap() > 1e6, "{ty}: {r}");
    }
    let mem = &profile["memory"];
    for key in ["bandwidth_bytes_per_s", "total_bytes", "available_bytes", "budget_bytes"] {
        assert!(mem[key].as_f64().unwrap() > 0.0, "memory.{key} = {}", mem[key]);
    }
    assert!(profile["disk_read_bytes_per_s"].as_f64().unwrap() > 1e6);
    write(&dir, "dev.json", &stdout(&out));

    // Three devices with 60 MB each: the model (about 94 MB of layers) fits none alone,
    // but fits the three together; the third sits behind a 300 ms link.
    let device = |i: usize, ms: f64| format!("[[device]]\naddr = \"127.0.0.1:{}\"\nmemory = \"60MB\"\nprofile = \"dev.json\"\nlatency_ms = {ms}\nmbps = 1000\n", 9300 + i);
    let head = "token_file = \"ring.token\"\nhead_latency_ms = 0.1\nhead_mbps = 1000\n";
    let cluster = write(&dir, "ring.toml", &format!("{head}{}{}{}", device(1, 0.1), device(2, 0.1), device(3, 300.0)));
    let out = blink(&["plan", &cluster, "--json", "-c", "512"]);
    ok(&out);
    let plan: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    let windows: Vec<u64> = plan["windows"].as_array().unwrap().iter().map(|w| w.as_u64().unwrap()).collect();
    let rounds = plan["rounds"].as_u64().unwrap();
    assert_eq!(windows.iter().sum::<u64>() * rounds, 30, "{plan}");
    assert_eq!(windows[2], 0, "the device behind the slow link is left out: {plan}");
    assert!(windows[0] > 0 && windows[1] > 0, "neither near device holds the model alone: {plan}");
    assert_eq!(plan["predicted"]["disk_s"].as_f64(), Some(0.0), "{plan}");
    assert!(plan["predicted_s_per_token"].as_f64().unwrap() < 0.3, "{plan}");

    // A fixed plan is priced as it stands (the slow device in it: 300 ms more).
    let fixed = write(&dir, "fixed.toml", &format!("{head}windows = [10, 10, 10]\n{}{}{}", device(1, 0.1), device(2, 0.1), device(3, 300.0)));
    let out = blink(&["plan", &fixed, "--json", "-c", "512"]);
    ok(&out);
    let priced: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(priced["fixed"], Value::Bool(true));
    assert!(priced["predicted_s_per_token"].as_f64().unwrap() > 0.3, "{priced}");
    let text = blink(&["plan", &fixed, "-c", "512"]);
    ok(&text);
    assert!(stdout(&text).contains("fixed plan: 1 round(s)"), "{}", stdout(&text));

    // Bad files: named, no panic.
    let no_profile = write(&dir, "noprof.toml", "token_file = \"t\"\nhead_latency_ms = 1\nhead_mbps = 10\n[[device]]\naddr = \"h:1\"\nlatency_ms = 1\nmbps = 10\n");
    let broken = write(&dir, "broken.toml", "token_file = \"t\"\n[[device]\n");
    let too_small = write(&dir, "small.toml", &format!("{head}[[device]]\naddr = \"h:1\"\nmemory = \"1MB\"\nprofile = \"dev.json\"\nlatency_ms = 1\nmbps = 10\n"));
    for (file, says) in [(&no_profile, "no profile"), (&broken, "not valid"), (&too_small, "can hold the model")] {
        let out = blink(&["plan", file, "-c", "512"]);
        assert!(!out.status.success(), "{file}: {}", stdout(&out));
        let err = stderr(&out);
        assert!(err.contains(says) && !err.contains("panicked"), "{file}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
