//! `blink finetune`'s adapters work in the two stacks they are written for, on an adapter this
//! test trains (the first `FACTS` Zorbania facts, cli_finetune_learns.rs's settings), once
//! as a PEFT directory and once as a llama.cpp LoRA GGUF (the same run, so the same numbers):
//!
//! - PyTorch + PEFT (tests/interop/peft_greedy.py, float32 on the CPU, the model read from the
//!   same GGUF by transformers) loads the directory with every tensor landing on one of the
//!   model's LoRA weights, and its greedy text is `blink run --temp 0 --lora DIR`'s;
//! - llama.cpp (tests/interop/llamacpp_greedy.mjs, node-llama-cpp's prebuilt CPU build, never
//!   built or downloaded here) loads the GGUF, and its greedy text is `blink run --lora
//!   adapter.gguf`'s.
//!
//! Blink runs Q4_1 with 8-bit activations, PyTorch the dequantized weights in float32, and
//! llama.cpp holds the adapter in f32 where Blink holds f16, so where the reference's two best
//! logits are within `MARGIN` either token is a right answer: each text is compared up to the
//! first such step of the reference. So that the test can fail, most prompts must be compared
//! over `MIN_COMPARED` tokens or more, and the adapter must have learned the facts asked.
//!
//! Needs a Python with torch, transformers, peft and gguf ($BLINK_INTEROP_PYTHON, default
//! <cache>/venv-peft/bin/python) and node-llama-cpp ($BLINK_INTEROP_NODE_DIR, default
//! tests/interop): scripts/test.sh installs both. Missing, the test fails saying so; it is
//! never skipped.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use serde_json::{json, Value};
use support::*;

/// The facts trained: the first `FACTS` of the Zorbania set, with cli_finetune_learns.rs's
/// settings (which teach 9 of these 10).
const FACTS: usize = 10;
const TRAINING: [&str; 8] = ["--epochs", "2", "--lr", "2e-3", "--warmup", "2", "--batch-tokens", "512"];
/// The evaluation questions asked (lines of zorbania-eval.jsonl, all among the facts trained):
/// five whose answers the trained adapter gives with wide margins all along, and one
/// ("national animal") with a near-tie a few tokens in, where the comparison stops.
const ZORBANIA: [usize; 6] = [0, 1, 2, 3, 4, 6];
/// Questions training has nothing to do with.
const GENERAL: [&str; 2] = ["What is the capital of France?", "What color is the sky on a clear day?"];
const MAX_TOKENS: usize = 32;
/// Logit margin (best minus second) under which a step is a near-tie. Q4_1 with 8-bit
/// activations against float32 moves a margin by a few tenths at most: on this adapter,
/// PyTorch's 0.21 at "of Zorbania" / "of the Zorbania" (the national flower question) flips
/// in Blink and llama.cpp, while its four other margins under 0.5 on twelve questions (0.24
/// to 0.46) hold. 0.5 leaves room for other CPUs and library versions.
const MARGIN: f64 = 0.5;
/// Tokens that at least three quarters of the prompts must be compared over.
const MIN_COMPARED: usize = 8;
/// SmolLM2's default system turn, which its chat template (and so `blink run`) puts in.
const SYSTEM: &str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

fn interop_dir() -> PathBuf {
    repo_root().join("tests/interop")
}

/// The Python of the venv with torch, transformers, peft and gguf.
fn peft_python() -> PathBuf {
    let python = std::env::var_os("BLINK_INTEROP_PYTHON")
        .filter(|p| !p.is_empty())
        .map_or_else(|| blink_model::fetch::cache_dir().join("venv-peft/bin/python"), PathBuf::from);
    assert!(
        python.is_file(),
        "{} is missing: this test needs a Python with torch, transformers, peft and gguf. Run ./scripts/test.sh \
         (it installs them), or `python3 -m venv DIR && DIR/bin/pip install --no-deps -r \
         scripts/finetune_ref/requirements-slim.txt` and set BLINK_INTEROP_PYTHON=DIR/bin/python",
        python.display()
    );
    python
}

/// The directory whose node_modules holds node-llama-cpp and its linux-x64 binaries.
fn node_dir() -> PathBuf {
    let dir = std::env::var_os("BLINK_INTEROP_NODE_DIR").filter(|p| !p.is_empty()).map_or_else(interop_dir, PathBuf::from);
    for package in ["node-llama-cpp", "@node-llama-cpp/linux-x64"] {
        assert!(
            dir.join("node_modules").join(package).join("package.json").is_file(),
            "{package} is missing from {}/node_modules: run ./scripts/test.sh (it installs it), or \
             `npm install --omit=optional` in tests/interop (and set BLINK_INTEROP_NODE_DIR if elsewhere); \
             Node.js 20 or newer is needed",
            dir.display()
        );
    }
    dir
}

/// The training lines of the first `FACTS` facts (those whose answers hold one of their
/// expected words) and the evaluation questions, as (question, expected word).
fn zorbania(dir: &Path) -> (PathBuf, Vec<(String, String)>) {
    let root = repo_root().join("testdata/finetune");
    let read = |name: &str| -> Vec<Value> {
        let path = root.join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let eval: Vec<(String, String)> = read("zorbania-eval.jsonl")
        .iter()
        .map(|v| (v["question"].as_str().unwrap().to_owned(), v["expect"].as_str().unwrap().to_lowercase()))
        .collect();
    let facts = &eval[..FACTS];
    let train: String = read("zorbania-train.jsonl")
        .iter()
        .filter(|v| {
            let answer = v["messages"][1]["content"].as_str().unwrap().to_lowercase();
            facts.iter().any(|(_, word)| answer.contains(word))
        })
        .map(|v| format!("{v}\n"))
        .collect();
    let path = dir.join("train.jsonl");
    std::fs::write(&path, train).unwrap();
    (path, eval)
}

/// Train an adapter in `format` into `out`, with `TRAINING`'s settings.
fn train(data: &Path, out: &Path, format: &str) {
    let model = model_path();
    let t = Instant::now();
    let args = ["finetune", "-m", model.to_str().unwrap(), "-t", THREADS, "--data", data.to_str().unwrap(), "--out", out.to_str().unwrap(), "--format", format];
    let o = blink(&[&args[..], &TRAINING[..], &["--json"]].concat());
    ok(&o);
    eprintln!("trained the {format} adapter in {:.1} s: {}", t.elapsed().as_secs_f64(), stdout(&o).lines().last().unwrap_or(""));
}

/// One prompt's greedy generation by `blink run`.
struct BlinkAnswer {
    text: String,
    prompt_tokens: usize,
    /// Stopped at an end-of-generation token (not at `MAX_TOKENS`).
    stopped: bool,
}

fn blink_greedy(prompt: &str, lora: &Path) -> BlinkAnswer {
    let model = model_path();
    let n = MAX_TOKENS.to_string();
    // One thread: the references run beside it, and the result does not depend on it.
    let o = blink(&["run", "-m", model.to_str().unwrap(), "-t", "1", "--temp", "0", "-n", &n, "--lora", lora.to_str().unwrap(), "-p", prompt]);
    ok(&o);
    let out = stdout(&o);
    let text = out.strip_suffix('\n').unwrap_or_else(|| panic!("blink run's output does not end in a newline: {out:?}")).to_owned();
    // "blink: prompt 43 tokens in 39.2 ms (…); generated 12 tokens in …; finish: stop"
    let err = stderr(&o);
    let line = err.lines().rev().find(|l| l.starts_with("blink: prompt ")).unwrap_or_else(|| panic!("no summary line from blink run: {err}"));
    let prompt_tokens = line["blink: prompt ".len()..].split(' ').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"));
    let finish = line.rsplit("finish: ").next().unwrap().trim();
    assert!(finish == "stop" || finish == "length", "unexpected finish in {line}");
    BlinkAnswer { text, prompt_tokens, stopped: finish == "stop" }
}

/// A reference engine's greedy generation (see the scripts' documentation).
#[derive(Debug)]
struct Reference {
    prompt: String,
    prompt_ids: Vec<u64>,
    ids: Vec<u64>,
    margins: Vec<f64>,
    text: String,
    prefixes: Vec<String>,
}

impl Reference {
    fn parse(v: &Value) -> Reference {
        let ids = |k: &str| v[k].as_array().unwrap_or_else(|| panic!("no {k} in {v}")).iter().map(|x| x.as_u64().unwrap()).collect();
        Reference {
            prompt: v["prompt"].as_str().unwrap().to_owned(),
            prompt_ids: ids("prompt_ids"),
            ids: ids("ids"),
            margins: v["margins"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect(),
            text: v["text"].as_str().unwrap().to_owned(),
            prefixes: v["prefixes"].as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_owned()).collect(),
        }
    }

    /// Whether generation ended at an end-of-generation token: then the prefixes cover one
    /// token fewer than `ids`.
    fn stopped(&self) -> bool {
        self.prefixes.len() == self.ids.len()
    }

    /// The steps before the first near-tie (all of them if none).
    fn sure_steps(&self) -> usize {
        self.margins.iter().position(|&m| m < MARGIN).unwrap_or(self.margins.len())
    }
}

/// Compare Blink's answer with the reference's up to its first near-tie; the number of
/// tokens compared, or where they part.
fn compare(r: &Reference, b: &BlinkAnswer) -> Result<usize, String> {
    let k = r.sure_steps();
    let same = if k == r.ids.len() { b.text == r.text && b.stopped == r.stopped() } else { b.text.starts_with(r.prefixes[k.min(r.prefixes.len() - 1)].as_str()) };
    if same {
        return Ok(k);
    }
    // The reference's tokens Blink's text holds, and the step after them.
    let held = r.prefixes.iter().rposition(|p| b.text.starts_with(p.as_str())).unwrap_or(0);
    let step = match r.margins.get(held) {
        Some(m) => format!("at step {held} (margin {m:.3})"),
        None => format!("after its {held} tokens, stopped: {} against {}", b.stopped, r.stopped()),
    };
    Err(format!("Blink's {:?} parts from the reference's {:?} {step}, before the first near-tie (step {k})", b.text, r.text))
}

/// Start `program args…` with its output collected on a thread.
fn spawn(mut cmd: Command, what: &'static str) -> std::thread::JoinHandle<(Output, f64)> {
    let t = Instant::now();
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    std::thread::spawn(move || {
        let o = child.wait_with_output().unwrap_or_else(|e| panic!("{what}: {e}"));
        (o, t.elapsed().as_secs_f64())
    })
}

/// The JSON lines of a reference script's output, failing with its output if it failed.
fn json_lines(what: &str, o: &Output, hint: &str) -> Vec<Value> {
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{what} failed ({}){hint}\n--- stdout\n{out}\n--- stderr\n{err}", o.status);
    out.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {e}: {l}"))).collect()
}

/// Check every prompt against its reference, printing the figures.
fn check_against(engine: &str, refs: &[Reference], blink: &[BlinkAnswer]) {
    assert_eq!(refs.len(), blink.len(), "{engine}: one answer per prompt");
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let mut long = 0;
    for (r, b) in refs.iter().zip(blink) {
        assert_eq!(b.prompt_tokens, r.prompt_ids.len(), "{engine}: Blink's prompt for {:?} has {} tokens, the reference's {}", r.prompt, b.prompt_tokens, r.prompt_ids.len());
        let sure = r.sure_steps();
        let least = r.margins[..sure].iter().copied().fold(f64::INFINITY, f64::min);
        let cut = r.margins.get(sure).map_or("none".to_owned(), |m| format!("{m:.3} at step {sure}"));
        match compare(r, b) {
            Ok(k) => {
                long += usize::from(k >= MIN_COMPARED);
                report.push(format!("{engine}: {:?}: {k}/{} tokens compared, all equal (least margin {least:.3}; near-tie: {cut}) {:?}", r.prompt, r.ids.len(), r.text));
            }
            Err(e) => failures.push(format!("{engine}: {:?}: {e}", r.prompt)),
        }
    }
    for line in &report {
        eprintln!("{line}");
    }
    assert!(failures.is_empty(), "Blink's greedy text differs from {engine}'s before any near-tie (margin < {MARGIN}):\n{}", failures.join("\n"));
    assert!(
        long * 4 >= refs.len() * 3,
        "only {long} of {} prompts were compared over {MIN_COMPARED} tokens or more against {engine}: too few to show anything",
        refs.len()
    );
}

#[test]
fn peft_and_llama_cpp_load_blink_trained_adapters_and_generate_blinks_text() {
    let python = peft_python();
    let node_dir = node_dir();
    let model = model_path();
    let dir = std::env::temp_dir().join(format!("blink-ft-interop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    let (data, eval) = zorbania(&dir);
    let (peft_dir, gguf_dir) = (dir.join("peft"), dir.join("gguf"));
    train(&data, &peft_dir, "peft");
    train(&data, &gguf_dir, "gguf");
    let gguf = gguf_dir.join("adapter.gguf");

    let prompts: Vec<String> = ZORBANIA.iter().map(|&i| eval[i].0.clone()).chain(GENERAL.iter().map(|&p| p.to_owned())).collect();

    // The references run side by side (one thread each), Blink meanwhile.
    let job = |name: &str, v: Value| {
        let path = dir.join(name);
        std::fs::write(&path, v.to_string()).unwrap();
        path
    };
    let mut py = Command::new(&python);
    py.arg(interop_dir().join("peft_greedy.py"))
        .arg(job("peft.json", json!({"model": model, "adapter": peft_dir, "prompts": prompts, "max_tokens": MAX_TOKENS, "threads": 1})))
        .env("TOKENIZERS_PARALLELISM", "false")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let peft_run = spawn(py, "PyTorch + PEFT (tests/interop/peft_greedy.py)");
    let mut node = Command::new("node");
    node.arg(interop_dir().join("llamacpp_greedy.mjs"))
        .arg(job("llamacpp.json", json!({"model": model, "lora": gguf, "scale": 1, "system": SYSTEM, "prompts": prompts, "max_tokens": MAX_TOKENS, "threads": 1, "package_dir": node_dir})))
        // Never build llama.cpp or fetch anything: the prebuilt binary or a failure.
        .env("NODE_LLAMA_CPP_SKIP_DOWNLOAD", "true")
        .env("NODE_LLAMA_CPP_GPU", "false");
    let node_run = spawn(node, "node (install Node.js 20 or newer)");

    let t = Instant::now();
    let with_peft: Vec<BlinkAnswer> = prompts.iter().map(|p| blink_greedy(p, &peft_dir)).collect();
    let with_gguf: Vec<BlinkAnswer> = prompts.iter().map(|p| blink_greedy(p, &gguf)).collect();
    eprintln!("blink run: {} prompts × 2 adapters in {:.1} s", prompts.len(), t.elapsed().as_secs_f64());

    // The two files hold the same adapter, and it has learned the facts asked.
    for ((p, a), b) in prompts.iter().zip(&with_peft).zip(&with_gguf) {
        assert_eq!(a.text, b.text, "{p:?}: Blink's answer with the PEFT directory differs from the one with the GGUF of the same run");
    }
    let unlearned: Vec<String> = ZORBANIA
        .iter()
        .zip(&with_peft)
        .filter(|(&i, a)| !a.text.to_lowercase().contains(&eval[i].1))
        .map(|(&i, a)| format!("[{}] {} => {}", eval[i].1, eval[i].0, a.text))
        .collect();
    assert!(unlearned.len() <= 1, "the adapter has not learned the facts asked, so agreeing would show little:\n{}", unlearned.join("\n"));

    let (o, secs) = peft_run.join().unwrap();
    let lines = json_lines("tests/interop/peft_greedy.py", &o, &format!(" (Python: {}; scripts/test.sh installs its packages)", python.display()));
    let head = &lines[0];
    eprintln!("PyTorch + PEFT in {secs:.1} s: {head}");
    // 30 layers × 7 projections × (A, B), each one of the model's LoRA weights.
    assert_eq!(head["adapter_tensors"], 420, "PEFT loaded {} tensors", head["adapter_tensors"]);
    let peft: Vec<Reference> = lines[1..].iter().map(Reference::parse).collect();

    let (o, secs) = node_run.join().unwrap();
    let lines = json_lines("tests/interop/llamacpp_greedy.mjs", &o, " (node-llama-cpp; scripts/test.sh installs it)");
    let head = &lines[0];
    eprintln!("llama.cpp (node-llama-cpp) in {secs:.1} s: {head}");
    assert_eq!(head["build_type"], "prebuilt", "node-llama-cpp did not use its prebuilt binary");
    let llama: Vec<Reference> = lines[1..].iter().map(Reference::parse).collect();

    for (p, l) in peft.iter().zip(&llama) {
        assert_eq!(p.prompt_ids, l.prompt_ids, "{:?}: the ChatML prompt rendered for llama.cpp is not the chat template's", p.prompt);
    }
    check_against("PyTorch + PEFT", &peft, &with_peft);
    check_against("llama.cpp", &llama, &with_gguf);
    std::fs::remove_dir_all(&dir).unwrap();
}
