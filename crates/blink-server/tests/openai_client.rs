//! The official `openai` Python client against a real server on the default model
//! (tests/python/test_openai.py): chat, streaming, stop strings, logprobs, seeds, and
//! llama.cpp's golden chat cases.

mod support;

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
    let url = format!("{}/v1", server.url);
    run_python("test_openai.py", &["--base-url".as_ref(), url.as_ref()]);
}
