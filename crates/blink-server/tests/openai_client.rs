//! The official `openai` Python client against a real server on the default model
//! (tests/python/test_openai.py): chat, streaming, stop strings, logprobs, seeds, and
//! llama.cpp's golden chat cases.

mod support;

use std::process::Command;

use support::*;

#[test]
fn official_openai_python_client_passes() {
    run_script(shared());
}

/// The same checks against a server whose model is split over two simulated NUMA nodes
/// (`blink serve --numa-nodes 2`): tensor parallelism must not change any answer.
#[test]
fn official_openai_python_client_passes_with_two_numa_nodes() {
    let placement = blink_model::TensorPlacement::tensor_parallel(blink_runtime::numa::Topology::simulated(2), 2);
    let options = blink_server::ModelOptions { placement: Some(placement), ..model_options() };
    run_script(&TestServer::start(blink_server::ServerOptions::default(), options));
}

fn run_script(server: &TestServer) {
    let script = repo_root().join("tests/python/test_openai.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg("--base-url")
        .arg(format!("{}/v1", server.url))
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{} failed ({}):\n{stdout}\n{stderr}", script.display(), out.status);
    println!("{stdout}");
}
