//! A fine-tuning run killed with SIGKILL at random moments, one of them while a checkpoint
//! is being written, and restarted with `--resume` each time, ends with an adapter (and a
//! loss curve) bit-identical to a run never interrupted.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

const ARGS: [&str; 10] = ["--epochs", "2", "--batch-tokens", "128", "--checkpoint-every", "1", "--lr", "3e-3", "--seed", "7"];

fn spawn(data: &Path, out: &Path, resume: bool) -> Child {
    let model = model_path();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blink"));
    cmd.args(["finetune", "-m", model.to_str().unwrap(), "-t", THREADS, "--data", data.to_str().unwrap(), "--out", out.to_str().unwrap()]).args(ARGS);
    if resume {
        cmd.arg("--resume");
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap()
}

fn finish(mut child: Child) {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Whether a checkpoint's temporary file is in `dir` (a save under way).
fn saving(dir: &Path) -> bool {
    std::fs::read_dir(dir).map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().contains(".tmp-"))).unwrap_or(false)
}

/// Kill -9 `child` once `moment` says so (or let it be if it ends first); whether it was
/// still running when killed.
fn kill_when(mut child: Child, moment: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        if moment() {
            child.kill().unwrap();
            child.wait().unwrap();
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
    std::fs::write(&data, all.lines().take(6).map(|l| format!("{l}\n")).collect::<String>()).unwrap();

    let whole = dir.join("whole");
    finish(spawn(&data, &whole, false));

    // Random moments from a seed named in any failure.
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    let mut s = seed;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let cut: PathBuf = dir.join("cut");
    let ckpt = cut.join("checkpoint.safetensors");
    let mut kills = 0;
    // After the first checkpoint, at a random time within a few steps' worth.
    let delay = Duration::from_millis(next() % 4000);
    let first = spawn(&data, &cut, false);
    let when = std::cell::Cell::new(None);
    kills += usize::from(kill_when(first, || {
        if when.get().is_none() && ckpt.exists() {
            when.set(Some(Instant::now() + delay));
        }
        when.get().is_some_and(|t| Instant::now() >= t)
    }));
    // While a checkpoint is being written.
    let during_save = kill_when(spawn(&data, &cut, true), || saving(&cut));
    kills += usize::from(during_save);
    // Twice more at random times from the start.
    for _ in 0..2 {
        let at = Instant::now() + Duration::from_millis(1500 + next() % 5000);
        kills += usize::from(kill_when(spawn(&data, &cut, true), || Instant::now() >= at));
    }
    finish(spawn(&data, &cut, true));
    assert!(during_save, "seed {seed}: the run ended before a checkpoint write could be interrupted");
    assert!(kills >= 3, "seed {seed}: only {kills} runs were still going when killed");
    for file in ["adapter_model.safetensors", "loss.csv"] {
        let (a, b) = (std::fs::read(whole.join(file)).unwrap(), std::fs::read(cut.join(file)).unwrap());
        assert!(a == b, "seed {seed}: {file} differs from the uninterrupted run's after {kills} kills");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
