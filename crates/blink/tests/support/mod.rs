//! Shared helpers of the CLI tests: the real model, the golden data, and running `blink`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use blink_kernels::cpu::Isa;
use blink_kernels::flavour::Flavour;

/// The default model, fetched on first use exactly as `blink` does.
pub fn model_path() -> PathBuf {
    blink_model::fetch::ensure_default_model().expect("the default model is needed for these tests")
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// llama.cpp's reference outputs for the default model, from the build whose results the
/// default kernel path reproduces on this CPU.
pub fn golden() -> serde_json::Value {
    reference("smollm2-135m-instruct-q4_1", default_flavour())
}

/// The flavour of llama.cpp's definitions the default kernel path reproduces on this CPU.
pub fn default_flavour() -> Flavour {
    Flavour::of(Isa::best())
}

/// llama.cpp's reference outputs `testdata/golden/{stem}.json` as `flavour`'s build
/// computes them (`{stem}.json`: the AVX-512 build; `{stem}.avx2.json`: the AVX2 build).
pub fn reference(stem: &str, flavour: Flavour) -> serde_json::Value {
    let name = match flavour {
        Flavour::Avx512 => format!("{stem}.json"),
        Flavour::Avx2 => format!("{stem}.avx2.json"),
    };
    let path = repo_root().join("testdata/golden").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden JSON parses")
}

/// The runs, besides the default path's, that hold each flavour to its build's
/// reference: the x86 path of that flavour, where this CPU has it and it is not the
/// default, and the scalar path with `--llama-flavour`. A path this CPU lacks is said by
/// name on stderr.
pub fn flavour_runs() -> Vec<(Flavour, Vec<&'static str>)> {
    let mut runs = Vec::new();
    for (f, isa) in [(Flavour::Avx512, Isa::Avx512Vnni), (Flavour::Avx2, Isa::Avx2)] {
        if !isa.supported() {
            eprintln!("note: this CPU has no {isa} path; {} is checked on the scalar path only", f.build());
        } else if isa != Isa::best() {
            runs.push((f, vec!["--kernel", isa.name()]));
        }
        runs.push((f, vec!["--kernel", "scalar", "--llama-flavour", f.name()]));
    }
    runs
}

/// Run the `blink` binary with `args`.
pub fn blink(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blink"))
        .args(args)
        .env("BLINK_LOG", "")
        .output()
        .expect("blink runs")
}

/// Run the `blink` binary with `args`, `input` on its standard input.
pub fn blink_with_stdin(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_blink"))
        .args(args)
        .env("BLINK_LOG", "")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("blink runs");
    child.stdin.take().unwrap().write_all(input).expect("blink reads its input");
    child.wait_with_output().expect("blink runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Assert `blink` succeeded, showing its stderr if not.
pub fn ok(o: &Output) {
    assert!(o.status.success(), "blink failed ({}): {}", o.status, stderr(o));
}

/// Threads for tests: two, the size of the machines this runs on.
pub const THREADS: &str = "2";

/// How long a child `blink` may make no progress at all (no output, no CPU time) before a
/// test calls it stuck. Only a safety net: a slow or busy machine makes a child's progress
/// slower, never stop it, and this is many times the longest pause of a child that works
/// (a scheduler gives every runnable process the CPU within a fraction of a second).
pub const STUCK: std::time::Duration = std::time::Duration::from_secs(120);

/// The CPU time `pid` has used so far, in clock ticks (user and system, all its threads);
/// `None` once it has exited (a zombie, or reaped).
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, in parentheses: state, then 10 fields, then utime and stime.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if matches!(fields.first(), Some(&("Z" | "X"))) {
        return None;
    }
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Kills a child that makes no progress for [`STUCK`]: neither output (counted through
/// [`Watchdog::output`]) nor CPU time. A stuck child (waiting for input that never comes,
/// or deadlocked) is killed, which ends its output and any write to it, so the test fails
/// with what it saw instead of hanging; a child that computes or writes is left to take as
/// long as it needs. Stops once the child has exited, or when dropped.
pub struct Watchdog {
    output: std::sync::Arc<std::sync::atomic::AtomicU64>,
    fired: std::sync::Arc<std::sync::atomic::AtomicBool>,
    _stop: std::sync::mpsc::Sender<()>,
}

impl Watchdog {
    pub fn start(pid: u32) -> Watchdog {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::{mpsc, Arc};
        use std::time::{Duration, Instant};
        let output = Arc::new(AtomicU64::new(0));
        let fired = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = mpsc::channel::<()>();
        let (out, fire) = (output.clone(), fired.clone());
        std::thread::spawn(move || {
            let progress = || (out.load(Ordering::Relaxed), cpu_ticks(pid));
            let (mut seen, mut since) = (progress(), Instant::now());
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(Duration::from_millis(200)) {
                let now = progress();
                if now.1.is_none() {
                    return; // exited
                }
                if now != seen {
                    (seen, since) = (now, Instant::now());
                } else if since.elapsed() > STUCK {
                    fire.store(true, Ordering::Relaxed);
                    // SAFETY: signalling our own child, running a moment ago, so not
                    // reaped (it is reaped only after it exits).
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                    return;
                }
            }
        });
        Watchdog { output, fired, _stop: stop }
    }

    /// A counter to bump at each piece of the child's output.
    pub fn output(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.output.clone()
    }

    /// Whether the child was killed for making no progress.
    pub fn fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::Relaxed)
    }
}
pub mod synthetic;

/// `blink perplexity` on the golden text gives llama.cpp's chunk by chunk, to the four
/// decimals both print, at the micro-batch size where llama.cpp computes what Blink does
/// (testdata/golden/perplexity-ubatch.json: the case of `ctx` and `ubatch`, which Blink's
/// `-ub` follows), with a context of `ctx` tokens evaluated in steps of `batch`: on the
/// default path, against the build it reproduces on this CPU.
pub fn perplexity_equals_llama_cpps_at_its_ubatch(model: &std::path::Path, name: &str, (ctx, ubatch): (usize, usize), batch: usize) {
    perplexity_equals_builds_at_its_ubatch(model, name, (ctx, ubatch), batch, default_flavour(), &[]);
}

/// The same with `extra` arguments, against `flavour`'s build (a case's `avx2` figures are
/// the AVX2 build's).
pub fn perplexity_equals_builds_at_its_ubatch(model: &std::path::Path, name: &str, (ctx, ubatch): (usize, usize), batch: usize, flavour: Flavour, extra: &[&str]) {
    let path = repo_root().join("testdata/golden/perplexity-ubatch.json");
    let golden: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let case = golden["cases"].as_array().unwrap().iter().find(|c| c["model"] == name && c["ctx"] == ctx && c["ubatch"] == ubatch).unwrap_or_else(|| panic!("no case for {name} at {ctx}, -ub {ubatch}"));
    let figures = match flavour {
        Flavour::Avx512 => case,
        Flavour::Avx2 => &case["avx2"],
    };
    let text = repo_root().join("testdata/golden/gpl-3-excerpt.txt");
    let (ctx, ubatch, batch) = (ctx.to_string(), ubatch.to_string(), batch.to_string());
    let mut args = vec!["perplexity", "-m", model.to_str().unwrap(), "-f", text.to_str().unwrap(), "-c", &ctx, "-ub", &ubatch, "-b", &batch, "-t", THREADS];
    args.extend(extra);
    let out = blink(&args);
    ok(&out);
    let chunks = stderr(&out).lines().find(|l| l.starts_with("[1]")).map(str::to_string).expect("a line of chunk figures");
    let want = figures["chunks"].as_str().unwrap();
    assert_eq!(chunks, want, "{name} {extra:?}: {} at -ub {}", flavour.build(), case["ubatch"]);
    let final_line = stdout(&out).lines().last().unwrap_or_default().to_string();
    assert!(final_line.contains(&format!("PPL = {:.4}", figures["ppl"].as_f64().unwrap())), "{final_line}");
}

/// [`flavour_runs`] on a SIMD path (the scalar path takes minutes over a perplexity
/// text; said on stderr).
pub fn simd_flavour_runs() -> Vec<(Flavour, Vec<&'static str>)> {
    let (simd, scalar): (Vec<_>, Vec<_>) = flavour_runs().into_iter().partition(|(_, extra)| !extra.contains(&"scalar"));
    for (f, _) in scalar {
        eprintln!("note: {} is not checked on the scalar path here (minutes over the text)", f.build());
    }
    simd
}
