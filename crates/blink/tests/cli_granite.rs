//! `blink` on a Granite model against llama.cpp (testdata/golden/granite-synthetic.json):
//! the default model's weights under Granite's architecture with its four multipliers
//! (embeddings, block outputs, attention scores, logits), made here as
//! `scripts/llamacpp_ref/make_granite.py` made the file llama.cpp ran. Greedy text up to
//! the first near-tie, perplexity within 1%, and the same text over two simulated nodes.

mod support;

use std::path::PathBuf;

use blink_gguf::{GgufFile, GgufWriter, Value};
use support::*;

/// The Granite file: the default model's metadata under `granite.`, its multipliers, and
/// its tensors as they are.
fn granite() -> PathBuf {
    let src = GgufFile::open(model_path()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        match k.as_str() {
            "general.alignment" => {}
            "general.architecture" => w.add(k.clone(), Value::String("granite".into())).unwrap(),
            _ => w.add(k.strip_prefix("llama.").map_or_else(|| k.clone(), |rest| format!("granite.{rest}")), v.clone()).unwrap(),
        }
    }
    for (k, v) in [("embedding_scale", 1.5f32), ("residual_scale", 1.25), ("attention.scale", 0.1), ("logit_scale", 0.5)] {
        w.add(format!("granite.{k}"), Value::F32(v)).unwrap();
    }
    for t in src.tensors() {
        w.add_tensor_owned(t.name.clone(), t.ty, &t.dims, src.tensor_data(t).to_vec()).unwrap();
    }
    let path = std::env::temp_dir().join(format!("blink-granite-{}.gguf", std::process::id()));
    w.write(&path).unwrap();
    path
}

fn reference() -> serde_json::Value {
    let path = repo_root().join("testdata/golden/granite-synthetic.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn granite_gives_llama_cpps_text_and_perplexity() {
    let model = granite();
    let m = model.to_str().unwrap();
    let r = reference();
    for case in r["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let owed = case["exact_text_owed"].as_str().unwrap();
        for extra in [&[][..], &["--numa-nodes", "2"][..]] {
            let mut args = vec!["run", "-m", m, "--raw", "--temp", "0", "-n", "32", "-t", THREADS, "-p", prompt];
            args.extend(extra);
            let out = blink(&args);
            ok(&out);
            assert!(stdout(&out).starts_with(owed), "{extra:?} prompt {prompt:?}\n  owed: {owed:?}\n  got:  {:?}", stdout(&out));
        }
    }
    let case = &r["perplexity"][0];
    let text = repo_root().join("testdata/golden").join(case["name"].as_str().unwrap());
    let out = blink(&["perplexity", "-m", m, "-f", text.to_str().unwrap(), "-c", "512", "-t", THREADS]);
    ok(&out);
    let ppl: f64 = stdout(&out).lines().last().and_then(|l| l.split("PPL = ").nth(1)).and_then(|s| s.split_whitespace().next()).and_then(|s| s.parse().ok()).expect("a PPL line");
    let want = case["ppl"].as_f64().unwrap();
    eprintln!("granite perplexity: blink {ppl:.4}, llama.cpp {want:.4}");
    assert!((ppl - want).abs() / want < 0.01, "PPL {ppl} vs llama.cpp {want}");
    let _ = std::fs::remove_file(&model);
}
