//! `blink serve --state-dir` killed with SIGKILL in the middle of a fine-tuning job, then
//! started again on the same directory: the job goes back to running from its last
//! committed step, every step is logged once (none missing, none twice, the first one
//! after the restart the next one), and it ends with the very adapter (and losses) of
//! the same job run without a kill. Both ways of training: co-served by the engine (the
//! default) and split (with `-t 1 --finetune-threads 1` on two CPUs the engine's compute
//! thread and the trainer's are pinned apart).

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use blink_server::client::{Client, HttpResponse};
use serde_json::{json, Value};
use support::*;

/// A `blink serve` child process and its URL.
struct Serve {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Serve {
    fn start(state: &Path, log: PathBuf, mode: &str) -> Serve {
        let model = model_path();
        let stderr = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_blink"))
            .args(["serve", "-m", model.to_str().unwrap(), "--port", "0", "-t", "1", "-c", "512", "--finetune-threads", "1", "--finetune-mode", mode])
            .arg("--state-dir")
            .arg(state)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("blink serve starts");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let url = rx.recv_timeout(STUCK).unwrap_or_else(|_| panic!("blink serve printed no URL in {STUCK:?}: {}", std::fs::read_to_string(&log).unwrap_or_default()));
        assert!(url.starts_with("http://"), "{url}");
        Serve { child, url, log }
    }

    fn client(&self) -> Client {
        Client::new(&self.url).unwrap()
    }

    fn call(&self, r: impl std::future::Future<Output = Result<HttpResponse, String>>) -> Value {
        let r = runtime().block_on(r).unwrap_or_else(|e| panic!("{e}\n{}", self.stderr()));
        assert_eq!(r.status, 200, "{}\n{}", r.text(), self.stderr());
        r.json().unwrap()
    }

    fn get(&self, path: &str) -> Value {
        self.call(self.client().get(path))
    }

    fn post(&self, path: &str, body: &Value) -> Value {
        self.call(self.client().post_json(path, body))
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every event of the job, oldest first.
    fn events(&self, id: &str) -> Vec<Value> {
        let mut all = self.get(&format!("/v1/fine_tuning/jobs/{id}/events?limit=100"));
        let mut events: Vec<Value> = all["data"].as_array().unwrap().clone();
        while all["has_more"] == true {
            let after = events.last().unwrap()["id"].as_str().unwrap().to_string();
            all = self.get(&format!("/v1/fine_tuning/jobs/{id}/events?limit=100&after={after}"));
            events.extend(all["data"].as_array().unwrap().iter().cloned());
        }
        events.reverse();
        events
    }

    /// Poll the job until `done`; fails when neither its status nor its events change for
    /// [`STUCK`].
    fn wait(&self, id: &str, done: impl Fn(&Value, &[Value]) -> bool) -> (Value, Vec<Value>) {
        let (mut last, mut since) = ((String::new(), 0), Instant::now());
        loop {
            let job = self.get(&format!("/v1/fine_tuning/jobs/{id}"));
            let events = self.events(id);
            if done(&job, &events) {
                return (job, events);
            }
            let now = (job["status"].as_str().unwrap().to_string(), events.len());
            if now != last {
                (last, since) = (now, Instant::now());
            }
            assert!(since.elapsed() < STUCK, "job {id} stuck: {job}\n{events:#?}\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap())
}

/// The job's events as a dead server left them on disk, oldest first.
fn events_on_disk(state: &Path, id: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(state.join("jobs").join(id).join("events.jsonl")).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn metric_steps(events: &[Value]) -> Vec<u64> {
    events.iter().filter(|e| e["type"] == "metrics").map(|e| e["data"]["step"].as_u64().unwrap()).collect()
}

fn losses(events: &[Value]) -> Vec<f64> {
    events.iter().filter(|e| e["type"] == "metrics").map(|e| e["data"]["train_loss"].as_f64().unwrap()).collect()
}

fn is_final(job: &Value) -> bool {
    matches!(job["status"].as_str(), Some("succeeded" | "failed" | "cancelled"))
}

/// The CPUs the process's thread named `name` may run on (`/proc`'s list), if it has one.
fn thread_cpus(pid: u32, name: &str) -> Option<String> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        if std::fs::read_to_string(task.path().join("comm")).unwrap_or_default().trim() == name {
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            return status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map(|s| s.trim().to_string());
        }
    }
    None
}

const EXAMPLES: usize = 6;
const EPOCHS: u64 = 2;

#[test]
fn a_co_served_job_killed_mid_training_resumes_from_its_last_committed_step_and_ends_as_an_uninterrupted_one() {
    killed_and_restarted("coserve");
}

#[test]
fn a_split_job_killed_mid_training_resumes_from_its_last_committed_step_and_ends_as_an_uninterrupted_one() {
    killed_and_restarted("split");
}

fn killed_and_restarted(mode: &str) {
    let dir = std::env::temp_dir().join(format!("blink-serve-kill-{mode}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state");
    let data: String = std::fs::read_to_string(repo_root().join("testdata/finetune/zorbania-train.jsonl")).unwrap().lines().take(EXAMPLES).map(|l| format!("{l}\n")).collect();
    let total = EXAMPLES as u64 * EPOCHS;
    let spec = |file: &str| json!({"model": "", "training_file": file, "seed": 11, "hyperparameters": {"n_epochs": EPOCHS, "batch_size": 1}});

    let first = Serve::start(&state, dir.join("server-0.log"), mode);
    let base = first.get("/v1/models")["data"][0]["id"].as_str().unwrap().to_string();
    let file = first.call(first.client().upload_file("zorb.jsonl", data.as_bytes()))["id"].as_str().unwrap().to_string();
    let mut body = spec(&file);
    body["model"] = json!(base);
    let id = first.post("/v1/fine_tuning/jobs", &body)["id"].as_str().unwrap().to_string();

    // Killed twice: as its first step is logged, then in the middle of a step two steps
    // after the restart's first one.
    let mut server = first;
    for (life, (more, pause)) in [(1, 0), (2, 300)].into_iter().enumerate() {
        let logged = metric_steps(&server.events(&id)).len();
        let (job, _) = server.wait(&id, |j, ev| is_final(j) || metric_steps(ev).len() >= logged + more);
        std::thread::sleep(Duration::from_millis(pause));
        assert_eq!(job["status"], "running", "the job must still run when the server is killed: {job}");
        // Two CPUs: the engine's one compute thread on the first, the trainer on the second.
        let allowed = blink_runtime::affinity::allowed_cpus();
        if mode == "split" && allowed.len() >= 2 && std::env::var_os("BLINK_NO_PIN").is_none() {
            let pid = server.child.id();
            assert_eq!(thread_cpus(pid, "blink-compute-0"), Some(allowed[0].to_string()), "the engine's thread");
            assert_eq!(thread_cpus(pid, "blink-split-tra"), Some(allowed[1].to_string()), "the trainer's thread");
        }
        server.child.kill().unwrap(); // SIGKILL
        server.child.wait().unwrap();
        println!("server {life} killed with {} of {total} steps logged", metric_steps(&events_on_disk(&state, &id)).len());
        server = Serve::start(&state, dir.join(format!("server-{}.log", life + 1)), mode);
    }
    let second = server;
    let (job, events) = second.wait(&id, |j, _| is_final(j));
    assert_eq!(job["status"], "succeeded", "{job}\n{events:#?}");
    let steps = metric_steps(&events);
    assert_eq!(steps, (1..=total).collect::<Vec<u64>>(), "every step logged once, in order: {events:#?}");
    let restarts: Vec<usize> = events.iter().enumerate().filter(|(_, e)| e["message"].as_str().is_some_and(|m| m.starts_with("The server restarted"))).map(|(i, _)| i).collect();
    assert_eq!(restarts.len(), 2, "{events:#?}");
    for &restart in &restarts {
        let committed = events[restart..].iter().find_map(|e| e["message"].as_str()?.strip_prefix("Fine-tuning job running, from step ")?.parse::<u64>().ok());
        let committed = committed.unwrap_or_else(|| panic!("the job did not go back to running from a committed step: {events:#?}"));
        let logged = metric_steps(&events[..restart]).len() as u64;
        assert!(committed >= 1 && committed >= logged && committed < total, "resumed from step {committed}, {logged} logged before the kill");
        let next = metric_steps(&events[restart..]).first().copied();
        assert_eq!(next, Some(logged + 1), "the first step logged after a restart follows the last one before it");
    }

    // The same job without a kill (same file, seed and hyperparameters): the same adapter.
    let mut body = spec(&file);
    body["model"] = json!(base);
    let started = Instant::now();
    let again = second.post("/v1/fine_tuning/jobs", &body)["id"].as_str().unwrap().to_string();
    let (clean, clean_events) = second.wait(&again, |j, _| is_final(j));
    println!("the job never killed: {total} steps, {} tokens, {:.1?} from create to succeeded", clean["trained_tokens"], started.elapsed());
    assert_eq!(clean["status"], "succeeded", "{clean}");
    assert_eq!(clean["trained_tokens"], job["trained_tokens"]);
    assert_eq!(losses(&clean_events), losses(&events), "the same loss at every step");
    for f in ["adapter_model.safetensors", "adapter_config.json"] {
        let read = |job: &str| std::fs::read(state.join("jobs").join(job).join("adapter").join(f)).unwrap();
        assert!(read(&id) == read(&again), "{f} differs between the killed run and the uninterrupted one");
    }
    let chat = json!({"model": job["fine_tuned_model"], "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    second.post("/v1/chat/completions", &chat);
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
}
