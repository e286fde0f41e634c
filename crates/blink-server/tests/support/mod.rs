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
