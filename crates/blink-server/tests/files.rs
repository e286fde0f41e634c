//! The files endpoints on a real server over a real socket, driven by the official `openai`
//! Python client (tests/python/test_files.py): upload, retrieve, list, content and delete;
//! a malformed upload, another purpose, an over-large upload, unknown ids and a wrong key
//! each get their 4xx while the server keeps serving; and a file survives a restart on the
//! same state directory. Without `--state-dir` the endpoints answer 403.

mod support;

use std::path::Path;

use support::*;

const KEY: &str = "files-test-key";

fn server(state: &Path) -> TestServer {
    let opts = ServerOptions { api_key: Some(KEY.into()), state_dir: Some(state.to_path_buf()), max_upload_bytes: 8192, ..ServerOptions::default() };
    TestServer::start(opts, model_options())
}

fn script(server: &TestServer, data: &Path, phase: &str) {
    let url = format!("{}/v1", server.url);
    run_python("test_files.py", &["--base-url".as_ref(), url.as_ref(), "--api-key".as_ref(), KEY.as_ref(), "--data".as_ref(), data.as_os_str(), "--phase".as_ref(), phase.as_ref()]);
}

#[test]
fn official_openai_client_uploads_files_that_survive_a_restart() {
    let dir = TempDir::new("files");
    let data = dir.0.join("train.jsonl");
    let lines: Vec<String> = std::fs::read_to_string(repo_root().join("testdata/finetune/zorbania-train.jsonl")).unwrap().lines().take(4).map(str::to_string).collect();
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let state = dir.0.join("state");
    let first = server(&state);
    script(&first, &data, "upload");
    block_on(first.server.shutdown());
    let second = server(&state);
    script(&second, &data, "restarted");
}

#[test]
fn without_a_state_dir_the_files_endpoints_say_how_to_enable_them() {
    let server = shared();
    let r = block_on(server.client().get("/v1/files")).unwrap();
    let body = r.json().unwrap();
    assert_eq!(r.status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("--state-dir"), "{body}");
}
