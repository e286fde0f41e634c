//! A fine-tuning run killed with SIGKILL at random moments, one of them while a checkpoint
//! is being written, and restarted with `--resume` each time, ends with an adapter (and a
//! loss curve) bit-identical to a run never interrupted.

mod support;

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;

// With dropout, so that the resumed run must also draw the masks the uninterrupted one drew.
const ARGS: [&str; 12] = ["--epochs", "3", "--batch-tokens", "128", "--checkpoint-every", "1", "--lr", "3e-3", "--seed", "7", "--dropout", "0.1"];

fn command(data: &Path, out: &Path, resume: bool) -> Command {
    let model = model_path();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blink"));
    cmd.args(["finetune", "-m", model.to_str().unwrap(), "-t", THREADS, "--data", data.to_str().unwrap(), "--out", out.to_str().unwrap()]).args(ARGS);
    if resume {
        cmd.arg("--resume");
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd
}

/// Run to the end, successfully.
fn finish(data: &Path, out: &Path, resume: bool) {
    let out = command(data, out, resume).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A run, and the last step its progress lines reported (0 before the first).
struct Run {
    child: Child,
    step: Arc<AtomicU64>,
}

fn spawn(data: &Path, out: &Path, resume: bool) -> Run {
    let mut child = command(data, out, resume).spawn().unwrap();
    let step = Arc::new(AtomicU64::new(0));
    let (stderr, seen) = (child.stderr.take().unwrap(), step.clone());
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("step ").and_then(|r| r.split('/').next()).and_then(|n| n.parse().ok()) {
                seen.store(n, Ordering::SeqCst);
            }
        }
    });
    Run { child, step }
}

/// Whether a checkpoint's temporary file is in `dir` (a save under way).
fn saving(dir: &Path) -> bool {
    std::fs::read_dir(dir).map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().contains(".tmp-"))).unwrap_or(false)
}

/// Kill -9 the run `delay` after `moment` first holds for the last step it reported (or
/// let it be if it ends first); whether it was still running when killed.
fn kill_when(mut run: Run, delay: Duration, moment: impl Fn(u64) -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut armed: Option<Instant> = None;
    while Instant::now() < deadline {
        if run.child.try_wait().unwrap().is_some() {
            return false;
        }
        if armed.is_none() && moment(run.step.load(Ordering::SeqCst)) {
            armed = Some(Instant::now() + delay);
        }
        if armed.is_some_and(|t| Instant::now() >= t) {
            run.child.kill().unwrap();
            run.child.wait().unwrap();
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    panic!("the run neither ended nor reached the moment in 300 s");
}

#[test]
fn runs_killed_at_random_moments_resume_to_the_uninterrupted_adapter() {
    let dir = std::env::temp_dir().join(format!("blink-ft-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let all = std::fs::read_to_string(repo_root().join("testdata/finetune/zorbania-train.jsonl")).unwrap();
    let data = dir.join("train.jsonl");
    std::fs::write(&data, all.lines().take(12).map(|l| format!("{l}\n")).collect::<String>()).unwrap();

    let whole = dir.join("whole");
    finish(&data, &whole, false);

    // Random moments from a seed named in any failure, counted in the run's own steps so
    // they fall inside it however fast it trains: a step, then a delay within a step.
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    let mut s = seed;
    let mut next = move |n: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % n
    };
    let cut = dir.join("cut");
    let mut kills = 0;
    let (k, delay) = (1 + next(3), Duration::from_millis(next(300)));
    kills += usize::from(kill_when(spawn(&data, &cut, false), delay, |step| step >= k));
    // While a checkpoint is being written.
    let during_save = kill_when(spawn(&data, &cut, true), Duration::ZERO, |_| saving(&cut));
    kills += usize::from(during_save);
    // Twice more, a random number of steps into the resumed run.
    for _ in 0..2 {
        let (k, delay) = (next(3), Duration::from_millis(next(300)));
        let first = std::cell::Cell::new(0);
        kills += usize::from(kill_when(spawn(&data, &cut, true), delay, |step| {
            if first.get() == 0 {
                first.set(step);
            }
            step > 0 && step >= first.get() + k
        }));
    }
    finish(&data, &cut, true);
    assert!(during_save, "seed {seed}: the run ended before a checkpoint write could be interrupted");
    assert!(kills >= 3, "seed {seed}: only {kills} runs were still going when killed");
    for file in ["adapter_model.safetensors", "loss.csv"] {
        let (a, b) = (std::fs::read(whole.join(file)).unwrap(), std::fs::read(cut.join(file)).unwrap());
        assert!(a == b, "seed {seed}: {file} differs from the uninterrupted run's after {kills} kills");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
