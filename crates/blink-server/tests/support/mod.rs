//! Shared helpers of the server tests: a real server on the default model, on a loopback
//! port, in this process; a runtime for the clients; and the repository paths.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use blink_engine::serve::EngineStats;
use blink_server::client::Client;
pub use blink_server::{ModelOptions, Server, ServerOptions};
use tokio::runtime::Runtime;

/// How long a test waits for something that follows from progress it has seen (the engine
/// going idle, a connection closing) before it calls the server stuck. Only a safety net:
/// waits follow events and state, and a busy or slow machine makes them slower, never stops
/// them; this is many times what they take on a machine three times slower than a loaded
/// CI machine.
pub const STUCK: Duration = Duration::from_secs(120);

/// The runtime the servers and the test clients run on.
pub fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime")
    })
}

/// Run `f` to completion on the shared runtime.
pub fn block_on<F: Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The default model, fetched on first use.
pub fn model_path() -> PathBuf {
    blink_model::fetch::ensure_default_model().expect("the default model is needed for these tests")
}

/// Engine options for tests: two compute threads (the CI machine's size), a 1024-token context.
pub fn model_options() -> ModelOptions {
    ModelOptions { threads: 2, ctx_size: Some(1024), ..ModelOptions::new(model_path()) }
}

/// A running server.
pub struct TestServer {
    pub server: Server,
    pub url: String,
}

impl TestServer {
    /// Start a server on 127.0.0.1 with a free port and wait until the model is loaded.
    pub fn start(opts: ServerOptions, model: ModelOptions) -> TestServer {
        let server = block_on(Server::start("127.0.0.1:0", opts, model)).unwrap_or_else(|e| panic!("server start: {e}"));
        let url = format!("http://{}", server.addr());
        TestServer { server, url }
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url).expect("a valid URL")
    }

    pub fn stats(&self) -> EngineStats {
        self.server.app().try_ready().expect("loaded").engine.stats()
    }

    /// Wait until no request is running or waiting and no KV block is owned by a sequence
    /// (prefix-cache blocks have no owner); a step or two after the last request ends.
    pub fn wait_idle(&self) -> EngineStats {
        let deadline = Instant::now() + STUCK;
        loop {
            let s = self.stats();
            if s.running == 0 && s.queue_depth == 0 && s.kv_blocks_used == 0 {
                return s;
            }
            assert!(Instant::now() < deadline, "the engine did not return to idle within {STUCK:?}: {s:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One server per test binary with default options.
pub fn shared() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| TestServer::start(ServerOptions::default(), model_options()))
}

/// The golden LoRA adapters (PEFT directories and their llama.cpp GGUFs).
pub fn lora_golden() -> PathBuf {
    repo_root().join("testdata/golden/lora")
}

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("blink-server-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copy the golden adapters into `dir`: `adapter-r8/`, `adapter-r4-qv/` and
/// `adapter-r8.f32.gguf` (copies, since `--lora-dir` refuses links leading out of it).
pub fn copy_golden_adapters(dir: &Path) {
    let golden = lora_golden();
    for name in ["adapter-r8", "adapter-r4-qv"] {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        for file in ["adapter_config.json", "adapter_model.safetensors"] {
            std::fs::copy(golden.join(name).join(file), dir.join(name).join(file)).unwrap();
        }
    }
    std::fs::copy(golden.join("gguf/adapter-r8.f32.gguf"), dir.join("adapter-r8.f32.gguf")).unwrap();
}

/// A sample of `/metrics`.
pub fn metric(server: &TestServer, name: &str) -> f64 {
    let text = block_on(server.client().get("/metrics")).expect("GET /metrics").text();
    blink_server::metrics::sample(&text, name).unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// Run the Python script `tests/python/NAME` with `args`, failing with its output unless it
/// succeeds; its report is printed.
pub fn run_python(name: &str, args: &[&std::ffi::OsStr]) {
    let script = repo_root().join("tests/python").join(name);
    let out = std::process::Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{} failed ({}):\n{stdout}\n{stderr}", script.display(), out.status);
    println!("{stdout}");
}
