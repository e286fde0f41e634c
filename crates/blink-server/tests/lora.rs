//! LoRA serving on the real model and the golden adapters: the official `openai` Python
//! client through adapters (tests/python/test_lora.py: completions and chat, streamed or
//! not, run-time load, in-place reload and unload while requests run, `/v1/models`,
//! llama.cpp's `/lora-adapters` and `lora` field, and every bad input's 4xx), flat and on two
//! simulated NUMA nodes; and `--max-cpu-loras`, which evicts the least recently used idle
//! adapter and reads it again on demand with the same answers.

mod support;

use blink_server::AdapterOptions;
use serde_json::json;
use support::*;

fn lora_server(dir: &std::path::Path, max_resident: Option<usize>, placement: Option<blink_model::TensorPlacement>) -> TestServer {
    let adapters = AdapterOptions { preload: vec![("r8".into(), lora_golden().join("adapter-r8"), 0.0)], dir: Some(dir.to_path_buf()), max_resident };
    TestServer::start(ServerOptions::default(), ModelOptions { adapters, placement, ..model_options() })
}

fn run_script(server: &TestServer, dir: &std::path::Path) {
    let url = format!("{}/v1", server.url);
    run_python("test_lora.py", &["--base-url".as_ref(), url.as_ref(), "--lora-dir".as_ref(), dir.as_os_str()]);
}

#[test]
fn official_openai_python_client_through_adapters() {
    let dir = TempDir::new("lora");
    copy_golden_adapters(&dir.0);
    let server = lora_server(&dir.0, None, None);
    run_script(&server, &dir.0);
    assert_eq!(metric(&server, "blink_lora_adapters"), 1.0, "the script unloads what it loads");
}

#[test]
fn official_openai_python_client_through_adapters_on_two_numa_nodes() {
    let dir = TempDir::new("lora-numa");
    copy_golden_adapters(&dir.0);
    let placement = blink_model::TensorPlacement::tensor_parallel(blink_runtime::numa::Topology::simulated(2), 2);
    let server = lora_server(&dir.0, None, Some(placement));
    run_script(&server, &dir.0);
}

fn complete(server: &TestServer, model: &str) -> String {
    let body = json!({"model": model, "prompt": "Once upon a time, there was a little", "max_tokens": 12, "temperature": 0});
    let r = block_on(server.client().post_json("/v1/completions", &body)).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()["choices"][0]["text"].as_str().unwrap().to_owned()
}

fn load(server: &TestServer, name: &str, path: &str) {
    let r = block_on(server.client().post_json("/v1/load_lora_adapter", &json!({"lora_name": name, "lora_path": path}))).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn past_max_cpu_loras_the_least_recently_used_idle_adapter_is_evicted_and_read_again() {
    let dir = TempDir::new("lora-evict");
    copy_golden_adapters(&dir.0);
    let server = lora_server(&dir.0, Some(2), None);
    let r8 = complete(&server, "r8");
    load(&server, "r4", "adapter-r4-qv");
    let r4 = complete(&server, "r4");
    assert_ne!(r4, r8);
    assert_eq!((metric(&server, "blink_lora_adapters_resident"), metric(&server, "blink_lora_evictions_total")), (2.0, 0.0));
    // A third adapter evicts r8, the least recently used.
    load(&server, "gguf", "adapter-r8.f32.gguf");
    assert_eq!(complete(&server, "gguf"), r8);
    assert_eq!(metric(&server, "blink_lora_adapters"), 3.0);
    assert_eq!(metric(&server, "blink_lora_adapters_resident"), 2.0);
    assert_eq!(metric(&server, "blink_lora_evictions_total"), 1.0);
    let models = block_on(server.client().get("/v1/models")).unwrap().json().unwrap();
    let resident: Vec<(String, bool)> = models["data"].as_array().unwrap()[1..]
        .iter()
        .map(|m| (m["id"].as_str().unwrap().to_owned(), m["meta"]["resident"].as_bool().unwrap()))
        .collect();
    assert_eq!(resident, [("r8".to_owned(), false), ("r4".to_owned(), true), ("gguf".to_owned(), true)]);
    // Asked for again, r8 is read back (evicting r4) and answers as before.
    assert_eq!(complete(&server, "r8"), r8);
    assert_eq!(metric(&server, "blink_lora_evictions_total"), 2.0);
    assert_eq!(complete(&server, "r4"), r4);
    assert_eq!(metric(&server, "blink_lora_adapters_resident"), 2.0);
}
