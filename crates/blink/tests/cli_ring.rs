//! Rings of `blink node`s on loopback, with `blink run --cluster` as the head: greedy
//! text equal to one process's on every golden prompt (rings of 2, 3 and 4 processes,
//! one and two rounds, with and without a window on the head), and failures refused or
//! reported by name: a wrong token, another model file, garbage on the socket, a device
//! that is down, and a node killed or stopped in the middle of a generation. `serve
//! --cluster` answers as one process's server does: batched, with steps in flight, from
//! the prefix cache, and with LoRA adapters (loaded at start and at run time).

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;

/// A `blink node` on a free loopback port, killed when dropped.
struct Node {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

impl Node {
    fn start(token: &Path, model: &Path) -> Node {
        Node::start_with(token, model, "127.0.0.1:0", &[])
    }

    fn start_at(token: &Path, model: &Path, listen: &str) -> Node {
        Node::start_with(token, model, listen, &[])
    }

    fn start_with(token: &Path, model: &Path, listen: &str, extra: &[&str]) -> Node {
        let mut child = Command::new(env!("CARGO_BIN_EXE_blink"))
            .args(["node", "--listen", listen, "--token-file", token.to_str().unwrap(), "-m", model.to_str().unwrap(), "-t", "1"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("blink node starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = lines.next().expect("the node says where it listens").unwrap();
        let addr = first.split("listening on ").nth(1).and_then(|s| s.split_whitespace().next()).unwrap_or_else(|| panic!("no address in {first:?}")).to_string();
        let log = Arc::new(Mutex::new(first + "\n"));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        Node { child, addr, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("blink-ring-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_token(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A cluster file: the head's entry first when `head_window` is given, then `nodes`.
fn cluster(dir: &Path, name: &str, token: &Path, head_window: Option<usize>, nodes: &[(&Node, usize)], rounds: usize) -> PathBuf {
    let mut text = format!("token_file = {:?}\n", token.to_str().unwrap());
    let mut windows: Vec<usize> = head_window.into_iter().collect();
    windows.extend(nodes.iter().map(|(_, w)| *w));
    text += &format!("windows = {windows:?}\nrounds = {rounds}\n");
    if head_window.is_some() {
        text += "[[device]]\nhead = true\n";
    }
    for (n, _) in nodes {
        text += &format!("[[device]]\naddr = \"{}\"\n", n.addr);
    }
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn greedy(model: &Path, prompt: &str, cluster: Option<&Path>) -> std::process::Output {
    let mut args = vec!["run", "-m", model.to_str().unwrap(), "--raw", "--temp", "0", "-n", "32", "-t", "1", "-p", prompt];
    if let Some(c) = cluster {
        args.extend(["--cluster", c.to_str().unwrap()]);
    }
    blink(&args)
}

#[test]
fn rings_give_the_tokens_of_one_process() {
    let model = model_path();
    let dir = temp_dir("same");
    let token = write_token(&dir, "ring.token", "a token shared by the whole ring\n");
    let nodes: Vec<Node> = (0..3).map(|_| Node::start(&token, &model)).collect();
    let [a, b, c] = [&nodes[0], &nodes[1], &nodes[2]];
    // SmolLM2-135M has 30 layers: each ring's windows cover 30 in one round, 15 in two.
    let rings = [
        ("2 processes, 1 round", cluster(&dir, "r2k1.toml", &token, Some(12), &[(a, 18)], 1)),
        ("2 processes, 2 rounds", cluster(&dir, "r2k2.toml", &token, Some(8), &[(a, 7)], 2)),
        ("3 processes, 1 round", cluster(&dir, "r3k1.toml", &token, Some(10), &[(a, 10), (b, 10)], 1)),
        ("3 processes, 2 rounds", cluster(&dir, "r3k2.toml", &token, Some(5), &[(a, 5), (b, 5)], 2)),
        ("4 processes, 1 round", cluster(&dir, "r4k1.toml", &token, Some(6), &[(a, 8), (b, 8), (c, 8)], 1)),
        ("4 processes, 2 rounds", cluster(&dir, "r4k2.toml", &token, Some(3), &[(a, 4), (b, 4), (c, 4)], 2)),
        ("4 processes, no window on the head, 2 rounds", cluster(&dir, "r4k2h.toml", &token, None, &[(a, 5), (b, 5), (c, 5)], 2)),
    ];
    for case in golden()["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let alone = greedy(&model, prompt, None);
        ok(&alone);
        let want = stdout(&alone);
        assert!(want.starts_with(case["exact_text_owed"].as_str().unwrap()), "one process, {prompt:?}: {want:?}");
        for (name, file) in &rings {
            let out = greedy(&model, prompt, Some(file));
            assert!(out.status.success(), "{name}, {prompt:?}: {}\nnode logs:\n{}{}{}", stderr(&out), a.log(), b.log(), c.log());
            assert_eq!(stdout(&out), want, "{name}, {prompt:?}");
        }
    }
    // A device whose budget its windows exceed streams them from the file (left in the
    // map, given back after each use, the next read ahead): the same text.
    let streamed = format!(
        "token_file = {:?}\nwindows = [10, 10, 10]\nrounds = 1\n[[device]]\nhead = true\n[[device]]\naddr = \"{}\"\n[[device]]\naddr = \"{}\"\nmemory = \"20MB\"\n",
        token.to_str().unwrap(),
        a.addr,
        b.addr
    );
    std::fs::write(dir.join("streamed.toml"), streamed).unwrap();
    let case = &golden()["greedy"][0];
    let prompt = case["prompt"].as_str().unwrap();
    let out = greedy(&model, prompt, Some(&dir.join("streamed.toml")));
    ok(&out);
    assert_eq!(stdout(&out), stdout(&greedy(&model, prompt, None)), "streamed, {prompt:?}");
    assert!(b.log().contains("assigned layers [20..30] (0 of 1 windows resident, the others streamed from the file"), "{}", b.log());
    // The head over its own budget streams its windows too (two rounds: it gives each
    // back and reads the other): the same text.
    let head_streams = format!(
        "token_file = {:?}\nwindows = [5, 5, 5]\nrounds = 2\n[[device]]\nhead = true\nmemory = \"20MB\"\n[[device]]\naddr = \"{}\"\n[[device]]\naddr = \"{}\"\n",
        token.to_str().unwrap(),
        a.addr,
        b.addr
    );
    std::fs::write(dir.join("head_streams.toml"), head_streams).unwrap();
    let out = greedy(&model, prompt, Some(&dir.join("head_streams.toml")));
    ok(&out);
    assert!(stderr(&out).contains("the head's windows exceed its memory budget"), "{}", stderr(&out));
    assert_eq!(stdout(&out), stdout(&greedy(&model, prompt, None)), "the head streaming, {prompt:?}");

    // `bench --cluster`: a prompt, and four sequences in one micro-batch, then in two
    // going round at once.
    let file = rings[3].1.to_str().unwrap();
    let out = blink(&["bench", "--cluster", file, "-m", model.to_str().unwrap(), "-t", "1", "-p", "16", "-n", "8", "--batch", "4", "--in-flight", "1,2", "-r", "1"]);
    ok(&out);
    let table = stdout(&out);
    for row in ["| pp16 | 1 | 1 |", "| tg8 | 1 | 4 |", "| tg8 | 2 | 4 |"] {
        assert!(table.contains(row), "{row} missing from\n{table}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn failures_are_refused_or_reported_by_name() {
    let model = model_path();
    let dir = temp_dir("fail");
    let token = write_token(&dir, "ring.token", "a token shared by the whole ring\n");
    let other_token = write_token(&dir, "other.token", "a token no node of this ring holds\n");
    // The same model with one weight byte changed: a valid file of another hash.
    let other_model = dir.join("other.gguf");
    std::fs::copy(&model, &other_model).unwrap();
    {
        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&other_model).unwrap();
        use std::io::{Seek, SeekFrom};
        f.seek(SeekFrom::End(-100)).unwrap();
        let mut b = [0u8];
        f.read_exact(&mut b).unwrap();
        f.seek(SeekFrom::End(-100)).unwrap();
        f.write_all(&[b[0] ^ 1]).unwrap();
    }
    let good = Node::start(&token, &model);
    let stranger = Node::start(&token, &other_model);
    let prompt = "The capital of France is";

    let wrong_token = cluster(&dir, "wrong-token.toml", &other_token, Some(15), &[(&good, 15)], 1);
    let out = greedy(&model, prompt, Some(&wrong_token));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("does not hold the ring's token"), "{}", stderr(&out));

    let mismatch = cluster(&dir, "mismatch.toml", &token, Some(15), &[(&stranger, 15)], 1);
    let out = greedy(&model, prompt, Some(&mismatch));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("model hash mismatch"), "{}", stderr(&out));

    // Garbage on a node's socket: an HTTP request, then a frame of another version. The
    // node logs each and goes on serving.
    let mut s = TcpStream::connect(&good.addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let mut s = TcpStream::connect(&good.addr).unwrap();
    s.write_all(b"BLRG\x09\x00\x01\x00\x20\x00\x00\x00").unwrap();
    let _ = s.read_to_end(&mut rest);
    let fine = cluster(&dir, "fine.toml", &token, Some(15), &[(&good, 15)], 1);
    let out = greedy(&model, prompt, Some(&fine));
    ok(&out);
    let log = good.log();
    assert!(log.contains("not a Blink ring frame") && log.contains("version 9"), "{log}");

    // A device that is not there.
    let down = format!("token_file = {:?}\nwindows = [15, 15]\nrounds = 1\n[[device]]\nhead = true\n[[device]]\naddr = \"127.0.0.1:9\"\n", token.to_str().unwrap());
    std::fs::write(dir.join("down.toml"), down).unwrap();
    let out = greedy(&model, prompt, Some(&dir.join("down.toml")));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("127.0.0.1:9"), "{}", stderr(&out));

    // A node killed in the middle of a long generation, and one stopped (SIGSTOP: alive
    // but silent): the head reports each within 2 s, naming the device.
    for how in ["kill", "stop"] {
        let mut victim = Node::start(&token, &model);
        let ring = cluster(&dir, "victim.toml", &token, Some(10), &[(&good, 10), (&victim, 10)], 1);
        let mut head = Command::new(env!("CARGO_BIN_EXE_blink"))
            .args(["run", "-m", model.to_str().unwrap(), "--raw", "--temp", "0", "-n", "4000", "--ignore-eos", "-c", "4096", "-t", "1", "-p", "Hi", "--cluster", ring.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut head_out = head.stdout.take().unwrap();
        // Once text flows, the ring is running.
        let mut first = [0u8; 16];
        head_out.read_exact(&mut first).unwrap();
        match how {
            "kill" => victim.child.kill().unwrap(),
            _ => assert!(Command::new("kill").args(["-STOP", &victim.child.id().to_string()]).status().unwrap().success()),
        }
        let struck = Instant::now();
        let mut rest = Vec::new();
        head_out.read_to_end(&mut rest).unwrap();
        let waited = struck.elapsed();
        let mut err = String::new();
        head.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let _ = head.wait();
        assert!(waited < Duration::from_secs(2), "{how}: the head took {waited:?} to notice");
        assert!(err.contains(&format!("lost device 3 at {}", victim.addr)), "{how}: {err}");
        if how == "stop" {
            let _ = Command::new("kill").args(["-CONT", &victim.child.id().to_string()]).status();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `blink serve` (on a ring when `cluster` is given), its URL, killed when dropped.
struct Serve {
    child: Child,
    url: String,
    /// Where its standard error goes.
    log: PathBuf,
}

impl Serve {
    fn start(model: &Path, cluster: Option<&Path>) -> Serve {
        Serve::start_with(model, cluster, &[])
    }

    fn start_with(model: &Path, cluster: Option<&Path>, extra: &[&str]) -> Serve {
        let mut args = vec!["serve".to_string(), "-m".into(), model.to_str().unwrap().into(), "--port".into(), "0".into(), "-t".into(), "1".into(), "-c".into(), "512".into()];
        if let Some(c) = cluster {
            args.extend(["--cluster".into(), c.to_str().unwrap().into()]);
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        static SERVERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!("blink-ring-serve-{}-{n}.log", std::process::id()));
        let stderr = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_blink")).args(&args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(stderr).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("http://"), "no URL: {line:?}");
        Serve { child, url: line.trim().to_string(), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/health`: its status code and body.
    fn health(&self) -> (u16, serde_json::Value) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = blink_server::client::Client::new(&self.url).unwrap();
        let r = rt.block_on(client.get("/health")).unwrap();
        (r.status, r.json().unwrap())
    }

    /// The completion of `prompt` (greedy), or the error's message.
    fn complete(&self, prompt: &str, max_tokens: usize) -> Result<String, String> {
        self.complete_cached(prompt, max_tokens).map(|(text, _)| text)
    }

    /// The completion of `prompt` (greedy), asked again every 300 ms until the ring is
    /// back (at most 20 s).
    fn complete_once_back(&self, prompt: &str, max_tokens: usize) -> String {
        let started = Instant::now();
        loop {
            match self.complete(prompt, max_tokens) {
                Ok(t) => return t,
                Err(e) => assert!(started.elapsed() < Duration::from_secs(20), "the ring did not come back: {e}\n{}", self.log()),
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The completion of `prompt` (greedy) and the prompt tokens the server found cached.
    fn complete_cached(&self, prompt: &str, max_tokens: usize) -> Result<(String, u64), String> {
        self.complete_as("", prompt, max_tokens)
    }

    /// The completion of `prompt` (greedy) by `model` (an adapter's name, or "": the base
    /// model), and the prompt tokens the server found cached.
    fn complete_as(&self, model: &str, prompt: &str, max_tokens: usize) -> Result<(String, u64), String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = blink_server::client::Client::new(&self.url).unwrap();
        let body = serde_json::json!({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true});
        let r = rt.block_on(client.post_json("/v1/completions", &body)).map_err(|e| e.to_string())?;
        let v: serde_json::Value = r.json().map_err(|e| e.to_string())?;
        match v["choices"][0]["text"].as_str() {
            Some(t) if r.status == 200 => Ok((t.to_string(), v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0))),
            _ => Err(v["error"]["message"].as_str().unwrap_or("no message").to_string()),
        }
    }

    /// POST `body` to `path`; its status.
    fn post(&self, path: &str, body: serde_json::Value) -> u16 {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = blink_server::client::Client::new(&self.url).unwrap();
        rt.block_on(client.post_json(path, &body)).unwrap().status
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

#[test]
fn serving_on_a_ring() {
    let model = model_path();
    let dir = temp_dir("serve");
    let token = write_token(&dir, "ring.token", "a token shared by the whole ring\n");
    let a = Node::start(&token, &model);
    let mut b = Node::start(&token, &model);
    let file = cluster(&dir, "serve.toml", &token, Some(10), &[(&a, 10), (&b, 10)], 1);
    let alone = Serve::start(&model, None);
    // Requests at once, batched by the engine, as one process answers them: with one
    // step in flight, then with three (the sequences shared out over them).
    let prompts: Vec<String> = (1..=4).map(|i| format!("Count to {i}:")).collect();
    let concurrently = |server: &Serve| -> Vec<Result<String, String>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = prompts.iter().map(|p| s.spawn(|| server.complete(p, 16))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let ring = Serve::start(&model, Some(&file));
    for (p, got) in prompts.iter().zip(concurrently(&ring)) {
        assert_eq!(got.unwrap(), alone.complete(p, 16).unwrap(), "{p:?}");
    }
    drop(ring);
    let ring = Serve::start_with(&model, Some(&file), &["--in-flight", "3"]);
    for (p, got) in prompts.iter().zip(concurrently(&ring)) {
        assert_eq!(got.unwrap(), alone.complete(p, 16).unwrap(), "three steps in flight, {p:?}");
    }
    // The prefix cache on the ring: a long prompt again reuses its blocks on every device
    // (whole ones shared, the last one's leading slots copied), with the same text.
    let long = "Here is a list of the planets of the solar system, in order from the sun, with one fact about each of them: Mercury,";
    let want = alone.complete(long, 16).unwrap();
    let (first, _) = ring.complete_cached(long, 16).unwrap();
    assert_eq!(first, want);
    let (again, cached) = ring.complete_cached(long, 16).unwrap();
    assert_eq!(again, want, "the prompt again, from the ring's prefix cache");
    assert!(cached >= 16, "{cached} prompt tokens found cached");
    let (longer, cached) = ring.complete_cached(&format!("{long} Venus,"), 16).unwrap();
    assert_eq!(longer, alone.complete(&format!("{long} Venus,"), 16).unwrap(), "a longer prompt on the cached prefix");
    assert!(cached >= 16, "{cached} prompt tokens found cached");
    // A node killed during a long request: the request fails at once, naming the device,
    // and the server stays up.
    let long = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let r = ring.complete("Hi", 500);
            (r, Instant::now())
        });
        std::thread::sleep(Duration::from_millis(500));
        b.child.kill().unwrap();
        let killed = Instant::now();
        let (r, at) = h.join().unwrap();
        (r, at.saturating_duration_since(killed))
    });
    let err = long.0.unwrap_err();
    assert!(err.contains(&format!("lost device 3 at {}", b.addr)), "{err}");
    assert!(long.1 < Duration::from_secs(2), "the request failed {:?} after the kill", long.1);
    // `/health` says the ring is down, naming the device, until the head joins a ring again.
    let (status, body) = ring.health();
    assert_eq!(status, 503, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains(&format!("the ring is down: lost device 3 at {}", b.addr))), "{body}");
    // The head re-plans over the devices left: the next requests succeed, on a ring of
    // the head and the other node (the lost node's ten layers shared out: 15 and 15),
    // with the same text.
    let want = alone.complete(&prompts[0], 16).unwrap();
    let until_ok = || ring.complete_once_back(&prompts[0], 16);
    assert_eq!(until_ok(), want);
    assert!(a.log().contains("assigned layers [15..30]"), "{}", a.log());
    assert_eq!(ring.health().0, 200, "re-planned, the ring runs again");
    // Restarted on its address, the node rejoins once the ring is idle: the planned ring
    // runs again.
    let _ = b.child.wait();
    let addr = b.addr.clone();
    drop(b);
    let b = Node::start_at(&token, &model, &addr);
    let started = Instant::now();
    while !b.log().contains("assigned layers [20..30]") {
        assert!(started.elapsed() < Duration::from_secs(20), "the restarted node was not taken back: {}", b.log());
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(until_ok(), want);
    }
    assert_eq!(until_ok(), want);
    assert_eq!(ring.health().0, 200, "the planned ring runs again");
    // Killed while the ring is idle: `/health` says so within 2 s, with no request sent.
    let mut b = b;
    b.child.kill().unwrap();
    let killed = Instant::now();
    while ring.health().0 == 200 {
        assert!(killed.elapsed() < Duration::from_secs(2), "/health still ok {:?} after an idle node was killed", killed.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_planned_ring_is_planned_again_without_a_lost_device() {
    let model = model_path();
    let dir = temp_dir("planned");
    let token = write_token(&dir, "ring.token", "a token shared by the whole ring\n");
    let a = Node::start(&token, &model);
    let mut b = Node::start(&token, &model);
    // One profile of this machine for every device; budgets that need all three.
    let profile = blink(&["profile", "-m", model.to_str().unwrap(), "-t", "1"]);
    ok(&profile);
    std::fs::write(dir.join("this.json"), stdout(&profile)).unwrap();
    let entry = |addr: Option<&str>, memory: &str| {
        let place = addr.map_or("head = true\n".to_string(), |a| format!("addr = \"{a}\"\n"));
        format!("[[device]]\n{place}memory = \"{memory}\"\nprofile = \"this.json\"\nlatency_ms = 0.1\nmbps = 10000\n")
    };
    let text = format!("token_file = {:?}\n{}{}{}", token.to_str().unwrap(), entry(None, "50MB"), entry(Some(&a.addr), "30MB"), entry(Some(&b.addr), "30MB"));
    let file = dir.join("planned.toml");
    std::fs::write(&file, text).unwrap();
    let ring = Serve::start(&model, Some(&file));
    let alone = Serve::start(&model, None);
    let want = alone.complete("Count to 3:", 16).unwrap();
    assert_eq!(ring.complete("Count to 3:", 16).unwrap(), want);
    assert!(b.log().contains("assigned layers"), "the planner gave the third device windows: {}", b.log());
    // Lost, the third device's windows go to the others by the planner's program: the
    // same text.
    b.child.kill().unwrap();
    assert_eq!(ring.complete_once_back("Count to 3:", 16), want);
    assert!(ring.log().contains(&format!("re-planned the ring (by the planner) without device 3 at {}", b.addr)), "{}", ring.log());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn profile_measures_the_link_to_a_node() {
    let model = model_path();
    let dir = temp_dir("probe");
    let token = write_token(&dir, "ring.token", "a token shared by the whole ring\n");
    // 5 ms each way (the node's shim on the way in, the prober's on the way back), and
    // 80 Mbit/s.
    let node = Node::start_with(&token, &model, "127.0.0.1:0", &["--shim-latency-ms", "5", "--shim-mbps", "80"]);
    let out = blink(&["profile", "-m", model.to_str().unwrap(), "-t", "1", "--peer", &node.addr, "--token-file", token.to_str().unwrap(), "--shim-latency-ms", "5", "--shim-mbps", "80"]);
    ok(&out);
    let profile: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let link = &profile["peers"][0];
    assert_eq!(link["addr"].as_str(), Some(node.addr.as_str()));
    let (latency, rate) = (link["latency_s"].as_f64().unwrap(), link["bytes_per_s"].as_f64().unwrap());
    // A hop costs its latency and a little software; the rate is the shim's, give or take.
    assert!((0.005..0.05).contains(&latency), "latency {latency} s");
    assert!((5e6..15e6).contains(&rate), "rate {rate} B/s (80 Mbit/s is 1e7)");
    let _ = std::fs::remove_dir_all(&dir);
}

/// LoRA adapters on a ring: `run --cluster` with adapters gives one process's text, and a
/// server on a ring answers requests of several adapters and of the base model at once as
/// one process does, with adapters loaded and unloaded at run time (the devices are sent
/// each one before its first step, and let go of it once unloaded and unused).
#[test]
fn adapters_on_a_ring() {
    let model = model_path();
    let lora = repo_root().join("testdata/golden/lora");
    let (r8, qv) = (lora.join("adapter-r8"), lora.join("adapter-r4-qv"));
    let dir = temp_dir("lora");
    let token = write_token(&dir, "ring.token", "a token shared by the whole ring\n");
    let (a, b) = (Node::start(&token, &model), Node::start(&token, &model));
    let file = cluster(&dir, "lora.toml", &token, Some(5), &[(&a, 5), (&b, 5)], 2);
    let run = |cluster: Option<&Path>, extra: &[&str]| {
        let mut args = vec!["run", "-m", model.to_str().unwrap(), "--temp", "0", "-n", "16", "-t", "1", "-p", "Once upon a time"];
        args.extend(extra);
        if let Some(c) = cluster {
            args.extend(["--cluster", c.to_str().unwrap()]);
        }
        let out = blink(&args);
        ok(&out);
        stdout(&out)
    };
    let base = run(None, &[]);
    for extra in [vec!["--lora", r8.to_str().unwrap()], vec!["--lora", r8.to_str().unwrap(), "--lora-scaled", qv.to_str().unwrap(), "0.5"]] {
        let alone = run(None, &extra);
        assert_ne!(alone, base, "the adapters {extra:?} change this completion");
        assert_eq!(run(Some(&file), &extra), alone, "a ring with {extra:?}");
    }

    let r8_arg = format!("r8={}", r8.display());
    let args = ["--lora", r8_arg.as_str(), "--lora-dir", lora.to_str().unwrap()];
    let alone = Serve::start_with(&model, None, &args);
    let ring = Serve::start_with(&model, Some(&file), &[&args[..], &["--in-flight", "2"]].concat());
    let asks = [("", "Once upon a time"), ("r8", "Once upon a time"), ("r8", "Tell me a story."), ("", "Tell me a story."), ("r8", "Count to 3:")];
    let together = |server: &Serve, asks: &[(&str, &str)]| -> Vec<String> {
        std::thread::scope(|s| {
            let handles: Vec<_> = asks.iter().map(|&(m, p)| s.spawn(move || server.complete_as(m, p, 16))).collect();
            handles.into_iter().map(|h| h.join().unwrap().map(|(t, _)| t).unwrap_or_else(|e| panic!("{e}\n{}", server.log()))).collect()
        })
    };
    let want: Vec<String> = asks.iter().map(|&(m, p)| alone.complete_as(m, p, 16).unwrap().0).collect();
    assert_ne!(want[0], want[1], "the adapter changes the completion");
    assert_eq!(together(&ring, &asks), want, "the base model and an adapter at once");
    // An adapter loaded at run time, in a batch with the others.
    for server in [&alone, &ring] {
        assert_eq!(server.post("/v1/load_lora_adapter", serde_json::json!({"lora_name": "qv", "lora_path": "adapter-r4-qv"})), 200);
    }
    let asks = [("qv", "Once upon a time"), ("r8", "Once upon a time"), ("", "Once upon a time")];
    let want: Vec<String> = asks.iter().map(|&(m, p)| alone.complete_as(m, p, 16).unwrap().0).collect();
    assert_ne!(want[0], want[2], "the second adapter changes the completion");
    assert_eq!(together(&ring, &asks), want, "an adapter loaded at run time");
    // Unloaded and unused, it is let go on the devices with the next step.
    assert_eq!(ring.post("/v1/unload_lora_adapter", serde_json::json!({"lora_name": "qv"})), 200);
    assert_eq!(ring.complete_as("r8", "Once upon a time", 4).unwrap().0, alone.complete_as("r8", "Once upon a time", 4).unwrap().0);
    let started = Instant::now();
    while !(a.log().contains("let go of adapter") && b.log().contains("let go of adapter")) {
        assert!(started.elapsed() < Duration::from_secs(5), "the devices kept the unloaded adapter:\n{}\n{}", a.log(), b.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(a.log().matches("let go of adapter").count(), 1, "only the unloaded adapter is let go:\n{}", a.log());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Gemma 3 on a ring (two rounds of windows over three processes): its local layers, the
/// norms after its blocks and the rows llama.cpp computes in fours (flags that travel with
/// each row) give one process's text.
#[test]
fn gemma3_runs_on_a_ring() {
    let model = blink_model::fetch::ensure_model(&blink_model::fetch::GEMMA3_270M).expect("Gemma 3 270M is needed for this test");
    let dir = temp_dir("gemma3");
    let token = write_token(&dir, "ring.token", "a token shared by the whole ring\n");
    let (a, b) = (Node::start(&token, &model), Node::start(&token, &model));
    let file = cluster(&dir, "gemma.toml", &token, Some(3), &[(&a, 3), (&b, 3)], 2);
    for prompt in ["Once upon a time, there was a little", "The three primary colors are"] {
        let alone = greedy(&model, prompt, None);
        ok(&alone);
        let ring = greedy(&model, prompt, Some(&file));
        ok(&ring);
        assert_eq!(stdout(&ring), stdout(&alone), "{prompt:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
