//! Adapter memory on the real server: 100 loaded r=8 adapters on all seven projections hold
//! no more than their tensors' own size plus 5%, as `/metrics` reports it and as the
//! process's resident memory shows it; and after 100 adapters are loaded and unloaded, the
//! process's memory is back to its baseline. One test in its own binary, so no other test's
//! allocations move the process's memory.

mod support;

use blink_server::AdapterOptions;
use serde_json::{json, Value};
use support::*;

fn rss_anon() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).expect("RssAnon in /proc/self/status");
    line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() * 1024.0
}

/// The bytes of the f32 tensors in a safetensors file, from its header alone.
fn safetensors_tensor_bytes(path: &std::path::Path) -> f64 {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(_, t)| {
            assert_eq!(t["dtype"], "F32");
            t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).product::<u64>() as f64 * 4.0
        })
        .sum()
}

fn post(server: &TestServer, path: &str, body: Value) {
    let r = block_on(server.client().post_json(path, &body)).unwrap();
    assert_eq!(r.status, 200, "{path}: {}", r.text());
}

#[test]
fn a_hundred_adapters_hold_their_tensors_and_give_their_memory_back() {
    let golden = lora_golden();
    let adapters = AdapterOptions { dir: Some(golden.clone()), ..AdapterOptions::default() };
    let server = TestServer::start(ServerOptions::default(), ModelOptions { adapters, ..model_options() });
    let one = safetensors_tensor_bytes(&golden.join("adapter-r8/adapter_model.safetensors"));
    let config: Value = serde_json::from_str(&std::fs::read_to_string(golden.join("adapter-r8/adapter_config.json")).unwrap()).unwrap();
    assert_eq!((config["r"].as_u64(), config["target_modules"].as_array().map(Vec::len)), (Some(8), Some(7)), "r=8 on all seven");

    // Warm the allocator and the engine with one load, one request and one unload.
    let generate = |model: &str| {
        let body = json!({"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0});
        post(&server, "/v1/completions", body);
    };
    post(&server, "/v1/load_lora_adapter", json!({"lora_name": "warm", "lora_path": "adapter-r8"}));
    generate("warm");
    post(&server, "/v1/unload_lora_adapter", json!({"lora_name": "warm"}));
    server.wait_idle();
    let baseline = rss_anon();

    for i in 0..100 {
        post(&server, "/v1/load_lora_adapter", json!({"lora_name": format!("a{i}"), "lora_path": "adapter-r8"}));
    }
    generate("a99");
    server.wait_idle();
    let tensors = 100.0 * one;
    assert_eq!(metric(&server, "blink_lora_adapters_resident"), 100.0);
    assert_eq!(metric(&server, "blink_lora_tensor_bytes"), tensors, "the tensor bytes /metrics reports are the files' own");
    let held = metric(&server, "blink_lora_resident_bytes");
    assert!(held <= 1.05 * tensors, "100 adapters hold {held} bytes, over their tensors' {tensors} + 5%");
    assert_eq!(held, tensors / 2.0, "adapters are held as f16, half their f32 tensors' bytes");
    let grown = rss_anon() - baseline;
    assert!(grown <= 1.05 * tensors + 16e6, "the process grew {grown} bytes for 100 adapters of {tensors} bytes of tensors");

    for i in 0..100 {
        post(&server, "/v1/unload_lora_adapter", json!({"lora_name": format!("a{i}")}));
    }
    assert_eq!(metric(&server, "blink_lora_adapters"), 0.0);
    let after = rss_anon();
    assert!(after <= baseline + 16e6, "after unloading 100 adapters the process holds {after} bytes, its baseline was {baseline}");
    println!("one adapter {one} bytes; 100 held {held} ({:.1}% of their tensors); process grew {grown}, then {:.1} MB over baseline", 100.0 * held / tensors, (after - baseline) / 1e6);
}
