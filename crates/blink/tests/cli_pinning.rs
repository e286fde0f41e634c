//! Compute threads of a tensor-parallel model are pinned to their node's CPUs, and
//! `BLINK_NO_PIN=1` leaves them free: read from /proc while `blink chat` waits for input.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// The `Cpus_allowed_list` of `pid`'s thread named `name`, once it exists (the chat starts
/// it as it loads the model); fails at once if the chat ends first.
fn thread_cpus(child: &mut Child, name: &str) -> String {
    let deadline = Instant::now() + STUCK;
    let tasks = format!("/proc/{}/task", child.id());
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the chat ended ({status}) before it had a thread {name}");
        }
        for task in std::fs::read_dir(&tasks).unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim() == name {
                let status = std::fs::read_to_string(task.path().join("status")).unwrap();
                return status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
            }
        }
        assert!(Instant::now() < deadline, "no thread {name} in {tasks} after {STUCK:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A chat on two simulated nodes, one thread each, waiting for its first message.
fn waiting_chat(no_pin: bool) -> Child {
    let model = model_path();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blink"));
    cmd.args(["chat", "-m", model.to_str().unwrap(), "--numa-nodes", "2", "-t", "2"]);
    if no_pin {
        cmd.env("BLINK_NO_PIN", "1");
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

#[test]
fn compute_threads_are_pinned_to_their_node_unless_asked_not_to() {
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let allowed = own.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    let cpus = blink_runtime::numa::parse_cpulist(&allowed).unwrap();
    assert!(cpus.len() >= 2, "this test needs two CPUs to tell pinned threads from free ones, has {allowed}");

    // Thread 1 is the second simulated node's.
    let second = blink_runtime::numa::Topology::simulated(2).nodes()[1].cpus.clone();
    for (no_pin, expected) in [(false, blink_runtime::numa::format_cpulist(&second)), (true, allowed.clone())] {
        let mut child = waiting_chat(no_pin);
        let got = thread_cpus(&mut child, "blink-compute-1");
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
        assert_eq!(got, expected, "BLINK_NO_PIN {no_pin}: the compute thread may run on {got}");
    }
}
