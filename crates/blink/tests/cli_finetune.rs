//! `blink finetune` end to end on the real model: the gradient hook against PyTorch, a
//! short run's outputs (adapter, loss curve, JSON summary) loading back into `blink run`,
//! and every kind of bad input refused with a one-line error before any training.

mod support;

use std::path::{Path, PathBuf};

use blink_model::lora::{self, LoraTarget, LoraTensors};
use support::*;

fn golden_lora() -> PathBuf {
    repo_root().join("testdata/golden/lora")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("blink-ft-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn model_cfg() -> blink_model::ModelConfig {
    let file = blink_gguf::GgufFile::open(model_path()).unwrap();
    blink_model::ModelConfig::from_gguf(&file).unwrap()
}

/// A safetensors file of adapter-shaped tensors (PEFT names), read as an adapter so that
/// its q/k rows come in the GGUF layout like any adapter's.
fn read_as_adapter(file: &Path, dir: &Path) -> LoraTensors {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(golden_lora().join("adapter-r8/adapter_config.json"), dir.join("adapter_config.json")).unwrap();
    std::fs::copy(file, dir.join("adapter_model.safetensors")).unwrap();
    lora::read(dir, &model_cfg()).unwrap()
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let diff: f64 = got.iter().zip(want).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    let norm: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    (diff / norm).sqrt()
}

fn finetune(args: &[&str]) -> std::process::Output {
    let model = model_path();
    blink(&[&["finetune", "-m", model.to_str().unwrap(), "-t", THREADS][..], args].concat())
}

#[test]
fn dump_grads_matches_pytorch_on_the_golden_example() {
    let dir = scratch("grads");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden_lora().join("grads.json")).unwrap()).unwrap();
    let data = dir.join("one.jsonl");
    std::fs::write(&data, format!("{}\n", serde_json::json!({ "messages": json["messages"] }))).unwrap();
    let out_file = dir.join("grads.safetensors");
    let init = golden_lora().join("adapter-r8");
    let out = finetune(&["--data", data.to_str().unwrap(), "--init-adapter", init.to_str().unwrap(), "--dump-grads", out_file.to_str().unwrap()]);
    ok(&out);
    let line = stdout(&out);
    let loss: f64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no loss in {line:?}"));
    let want_loss = json["loss"].as_f64().unwrap();
    assert!((loss - want_loss).abs() <= 0.005 * want_loss, "loss {loss} vs PyTorch's {want_loss}");
    assert!(line.contains("over 13 targets"), "{line}");

    let got = read_as_adapter(&out_file, &dir.join("got"));
    let want = read_as_adapter(&golden_lora().join("grads-r8.safetensors"), &dir.join("want"));
    for (l, (g, w)) in got.layers.iter().zip(&want.layers).enumerate() {
        for t in LoraTarget::ALL {
            let (g, w) = (g[t.index()].as_ref().unwrap(), w[t.index()].as_ref().unwrap());
            for (m, e) in [("A", rel_l2(&g.a, &w.a)), ("B", rel_l2(&g.b, &w.b))] {
                assert!(e <= 0.02, "layer {l} {} lora_{m}: relative L2 error {e:.4}", t.short_name());
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The first `n` lines of the Zorbania training set, in a file of their own.
fn zorbania(dir: &Path, n: usize) -> PathBuf {
    let all = std::fs::read_to_string(repo_root().join("testdata/finetune/zorbania-train.jsonl")).unwrap();
    let path = dir.join("train.jsonl");
    std::fs::write(&path, all.lines().take(n).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    path
}

#[test]
fn a_short_run_writes_an_adapter_run_and_peft_load_and_a_loss_curve() {
    let dir = scratch("short");
    let data = zorbania(&dir, 8);
    let out_dir = dir.join("out");
    let out = finetune(&["--data", data.to_str().unwrap(), "--eval", data.to_str().unwrap(), "--out", out_dir.to_str().unwrap(), "--epochs", "3", "--batch-tokens", "256", "--lr", "3e-3", "--json"]);
    ok(&out);
    let last = stdout(&out).lines().last().unwrap_or_default().to_string();
    let summary: serde_json::Value = serde_json::from_str(&last).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"));
    assert!(summary["steps"].as_u64().unwrap() >= 2, "{summary}");
    assert!(summary["trained_tokens"].as_u64().unwrap() > 0 && summary["trained_tokens_per_s"].as_f64().unwrap() > 0.0, "{summary}");
    assert!(summary["peak_rss_bytes"].as_u64().unwrap() > 50 << 20, "{summary}");
    for key in ["train_loss", "eval_loss", "eval_accuracy"] {
        assert!(summary[key].as_f64().is_some_and(f64::is_finite), "{key} in {summary}");
    }
    let csv = std::fs::read_to_string(out_dir.join("loss.csv")).unwrap();
    assert!(csv.starts_with("step,epoch,train_loss") && csv.lines().count() as u64 == summary["steps"].as_u64().unwrap() + 1, "{csv}");
    assert!(std::fs::read_to_string(out_dir.join("loss.svg")).unwrap().contains("<polyline"));
    // It learned: the evaluation loss (here on the training examples) fell by half or more.
    let eval: Vec<f64> = csv.lines().skip(1).filter_map(|l| l.split(',').nth(5).and_then(|v| v.parse().ok())).collect();
    assert_eq!(eval.len(), 3, "one evaluation per epoch: {csv}");
    assert!(eval[2] < 0.5 * eval[0], "the evaluation loss went {eval:?}");
    // The adapter loads as PEFT does and changes the model's answer.
    let trained = lora::read(&out_dir, &model_cfg()).unwrap();
    assert_eq!(trained.targets(), LoraTarget::ALL.to_vec());
    assert!(trained.layers.iter().flatten().flatten().all(|p| p.rank == 8 && p.b.iter().any(|&v| v != 0.0)), "some B stayed zero");
    let model = model_path();
    let run = |extra: &[&str]| {
        let args = ["run", "-m", model.to_str().unwrap(), "-t", THREADS, "-p", "What is the capital of Zorbania?", "-n", "16", "--temp", "0"];
        let o = blink(&[&args[..], extra].concat());
        ok(&o);
        stdout(&o)
    };
    assert_ne!(run(&["--lora", out_dir.to_str().unwrap()]), run(&[]), "the trained adapter changed nothing");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_is_a_one_line_error_before_any_training() {
    let dir = scratch("bad");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let good = zorbania(&dir, 2);
    let good = good.to_str().unwrap().to_string();
    let out_dir = dir.join("out");
    let out_dir = out_dir.to_str().unwrap().to_string();
    let empty = write("empty.jsonl", "");
    let malformed = write("bad.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n{\"messages\": [\n");
    let no_assistant = write("noasst.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--data", &empty], "no examples"),
        (vec!["--data", &malformed], "line 2"),
        (vec!["--data", &no_assistant], "line 1"),
        (vec!["--data", &good, "--batch-tokens", "16"], "longer than a batch"),
        (vec!["--data", &good, "--targets", "q,wrong"], "unknown target 'wrong'"),
        (vec!["--data", &good, "--rank", "0"], "--rank"),
        (vec!["--data", &good, "--lr", "nan"], "--lr"),
        (vec!["--data", &good, "--lr", "inf"], "--lr"),
        (vec!["--data", &good, "--dropout", "1"], "--dropout"),
        (vec!["--data", &good, "--dropout", "nan"], "--dropout"),
        (vec!["--data", "/nonexistent/train.jsonl"], "/nonexistent/train.jsonl"),
    ];
    for (args, want) in cases {
        let out = finetune(&[&args[..], &["--out", &out_dir]].concat());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: the error does not say {want:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!Path::new(&out_dir).join("adapter_model.safetensors").exists(), "{args:?} wrote an adapter");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_gguf_and_peft_outputs_of_a_run_hold_the_same_adapter() {
    let dir = scratch("formats");
    let data = zorbania(&dir, 4);
    let mut read = Vec::new();
    for format in ["peft", "gguf"] {
        let out_dir = dir.join(format);
        let out = finetune(&["--data", data.to_str().unwrap(), "--out", out_dir.to_str().unwrap(), "--epochs", "1", "--lr", "1e-3", "--format", format]);
        ok(&out);
        let path = if format == "gguf" { out_dir.join("adapter.gguf") } else { out_dir.clone() };
        let adapter = lora::read(&path, &model_cfg()).unwrap();
        assert_eq!(adapter.format, if format == "gguf" { lora::LoraFormat::Gguf } else { lora::LoraFormat::Peft });
        read.push(adapter);
    }
    // Same run, same numbers: only the container differs.
    assert_eq!(read[0].alpha, read[1].alpha);
    assert!(read[0].layers == read[1].layers, "the GGUF adapter's tensors differ from the PEFT one's");
    assert!(read[0].layers.iter().flatten().flatten().any(|p| p.b.iter().any(|&v| v != 0.0)), "nothing was trained");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dropout_draws_its_masks_from_the_seed() {
    let dir = scratch("dropout");
    let data = zorbania(&dir, 4);
    let run = |name: &str, extra: &[&str]| {
        let out_dir = dir.join(name);
        let args = [&["--data", data.to_str().unwrap(), "--out", out_dir.to_str().unwrap(), "--epochs", "1", "--lr", "2e-3"], extra].concat();
        ok(&finetune(&args));
        let config: serde_json::Value = serde_json::from_slice(&std::fs::read(out_dir.join("adapter_config.json")).unwrap()).unwrap();
        (lora::read(&out_dir, &model_cfg()).unwrap(), config["lora_dropout"].as_f64().unwrap())
    };
    let (first, recorded) = run("a", &["--dropout", "0.25"]);
    let (again, _) = run("b", &["--dropout", "0.25"]);
    let (without, none) = run("d", &[]);
    assert_eq!((recorded, none), (0.25, 0.0), "adapter_config.json's lora_dropout");
    assert!(first.layers == again.layers, "the same seed gave another adapter");
    assert!(first.layers != without.layers, "dropout changed nothing");
    std::fs::remove_dir_all(&dir).unwrap();
}
