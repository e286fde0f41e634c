//! The speed matrix kept working (issue 49): the random-weight files of real shapes
//! (crates/blink-model/examples/synth_model.rs, compiled in here as a module) carry the
//! tensor-type mix `llama-quantize` gives each preset, Blink loads and runs a one-layer
//! slice of every shape in Q4_0 and Q4_K_M, and scripts/bench_matrix.py's `--smoke` run
//! makes its table from them. The expected mixes are written out below from llama.cpp's
//! rules (src/llama-quant.cpp) and were checked against `llama-quantize --dry-run` on these
//! shapes; they are not read from the generator.

mod support;

#[path = "../../blink-model/examples/synth_model.rs"]
#[allow(dead_code)]
mod synth_model;

use std::path::{Path, PathBuf};
use std::process::Command;

use blink_gguf::{GgmlType, GgufFile};
use support::*;

use synth_model::{Preset, SHAPES};

fn shape(name: &str) -> synth_model::Shape {
    *SHAPES.iter().find(|s| s.name == name).unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Each tensor's type, by name: the plan's for a full shape.
fn planned(name: &str, preset: Preset) -> Vec<(String, GgmlType)> {
    let s = shape(name);
    synth_model::plan(&s, s.n_layers, 49152, preset).into_iter().map(|t| (t.name, t.ty)).collect()
}

/// Llama-3.2-1B's shape in Q4_K_M, as llama-quantize makes it without an importance
/// matrix: Q4_K, but Q6_K for the tied embedding (the LM head) and for attn_v and
/// ffn_down in the layers `use_more_bits(i, 16)` picks (the first and last eighth, and
/// every third layer from the second eighth on: 0, 1, 4, 7, 10, 13, 14, 15); vectors F32.
#[test]
fn llama_1b_q4_k_m_is_llama_quantizes_mix() {
    let more_bits = [0, 1, 4, 7, 10, 13, 14, 15];
    let got = planned("llama-1b", Preset::Q4KM);
    assert_eq!(got.len(), 3 + 16 * 9);
    for (name, ty) in &got {
        let want = match name.as_str() {
            "token_embd.weight" => GgmlType::Q6_K,
            "output_norm.weight" | "rope_freqs.weight" => GgmlType::F32,
            _ => {
                let (layer, role) = name.strip_prefix("blk.").unwrap().split_once('.').unwrap();
                let layer: usize = layer.parse().unwrap();
                match role {
                    "attn_norm.weight" | "ffn_norm.weight" => GgmlType::F32,
                    "attn_v.weight" | "ffn_down.weight" if more_bits.contains(&layer) => GgmlType::Q6_K,
                    _ => GgmlType::Q4_K,
                }
            }
        };
        assert_eq!(*ty, want, "{name}");
    }
}

/// Gemma-3-1B in Q4_K_M: its 1152-wide rows hold no whole 256-element block, so the
/// embedding is Q8_0, Q4_K falls back to Q5_0 and Q6_K to Q8_0 on those rows (attn_q,
/// attn_k, attn_v, ffn_gate, ffn_up); attn_output (1024 wide) and ffn_down (6912 wide)
/// keep Q4_K and Q6_K. More bits in layers 0-2, 5, 8, 11, 14, 17, 20, 22-25 of 26.
#[test]
fn gemma3_1b_q4_k_m_is_llama_quantizes_mix() {
    let more_bits = [0, 1, 2, 5, 8, 11, 14, 17, 20, 22, 23, 24, 25];
    let got = planned("gemma3-1b", Preset::Q4KM);
    assert_eq!(got.len(), 2 + 26 * 13);
    for (name, ty) in &got {
        let want = match name.as_str() {
            "token_embd.weight" => GgmlType::Q8_0,
            "output_norm.weight" => GgmlType::F32,
            _ => {
                let (layer, role) = name.strip_prefix("blk.").unwrap().split_once('.').unwrap();
                let more = more_bits.contains(&layer.parse::<usize>().unwrap());
                match role {
                    r if r.ends_with("norm.weight") => GgmlType::F32,
                    "attn_v.weight" if more => GgmlType::Q8_0,
                    "ffn_down.weight" if more => GgmlType::Q6_K,
                    "attn_output.weight" | "ffn_down.weight" => GgmlType::Q4_K,
                    _ => GgmlType::Q5_0,
                }
            }
        };
        assert_eq!(*ty, want, "{name}");
    }
}

/// Qwen2.5-1.5B in IQ4_XS and Llama-3.1-8B in Q4_0: 12 query heads share 2 K/V heads
/// (6 ≥ 4), so every attn_v is Q5_K; ffn_down is Q5_K in the first eighth of the layers
/// (0-2 of 28); the LM head Q6_K; biases F32. Llama-3.1-8B has its own output matrix,
/// which is Q6_K, while its embedding stays Q4_0.
#[test]
fn iq4_xs_and_an_untied_head_are_llama_quantizes_mix() {
    for (name, ty) in planned("qwen2-1.5b", Preset::IQ4XS) {
        let want = match name.as_str() {
            "token_embd.weight" => GgmlType::Q6_K,
            n if !n.ends_with(".weight") || n.ends_with("norm.weight") => GgmlType::F32,
            n if n.ends_with("attn_v.weight") => GgmlType::Q5_K,
            "blk.0.ffn_down.weight" | "blk.1.ffn_down.weight" | "blk.2.ffn_down.weight" => GgmlType::Q5_K,
            _ => GgmlType::IQ4_XS,
        };
        assert_eq!(ty, want, "{name}");
    }
    for (name, ty) in planned("llama-8b", Preset::Q4_0) {
        let want = match name.as_str() {
            "output.weight" => GgmlType::Q6_K,
            n if n.ends_with("norm.weight") || n == "rope_freqs.weight" => GgmlType::F32,
            _ => GgmlType::Q4_0,
        };
        assert_eq!(ty, want, "{name}");
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let err = synth_model::run(&args(&["--shape", "llama-70b", "--preset", "Q4_K_M", "--dry-run"])).unwrap_err();
    assert!(err.starts_with("unknown shape 'llama-70b' (shapes: llama-1b, qwen2-1.5b, gemma3-1b, llama-8b)"), "{err}");
    let err = synth_model::run(&args(&["--shape", "llama-1b", "--preset", "Q3_K_M", "--dry-run"])).unwrap_err();
    assert!(err.starts_with("unknown preset 'Q3_K_M'"), "{err}");
    let err = synth_model::run(&args(&["--shape", "llama-1b", "--type", "Q8_K", "--dry-run"])).unwrap_err();
    assert_eq!(err, "Q8_K is an activation type, not one for weights");
    let err = synth_model::run(&args(&["--shape", "llama-1b", "--preset", "Q4_0", "--layers", "17", "--dry-run"])).unwrap_err();
    assert_eq!(err, "--layers must be 1 to 16 for llama-1b");
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("blink-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn matrix_script(extra: &[&str]) -> std::process::Output {
    let script = repo_root().join("scripts/bench_matrix.py");
    Command::new("python3").arg(script).args(extra).output().expect("python3 runs scripts/bench_matrix.py")
}

fn types_of(path: &Path) -> Vec<(String, GgmlType)> {
    GgufFile::open(path).unwrap().tensors().iter().map(|t| (t.name.clone(), t.ty)).collect()
}

/// The script's smoke run end to end: it names the files and the generator's arguments,
/// the generator makes them (a one-layer slice of each shape, Q4_0 and Q4_K_M), Blink
/// loads and runs each, and the script prints a row per file with measured speeds.
#[test]
fn smoke_slices_of_every_shape_load_and_run() {
    model_path(); // the vocabulary's source, fetched once
    let dir = Scratch::new("synth-matrix");
    let cache = dir.0.to_str().unwrap();
    let plan = matrix_script(&["--smoke", "--cache", cache, "--dry-run"]);
    assert!(plan.status.success(), "{}", String::from_utf8_lossy(&plan.stderr));
    let files: Vec<serde_json::Value> = String::from_utf8(plan.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(files.len(), 8, "four shapes in two presets");
    for f in &files {
        let a: Vec<String> = f["synth_args"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
        synth_model::run(&a).unwrap_or_else(|e| panic!("synth_model {a:?}: {e}"));
        assert!(Path::new(f["file"].as_str().unwrap()).exists());
    }
    // One slice's types, read back: one layer is the last eighth, so it gets more bits.
    let q4km = files.iter().map(|f| PathBuf::from(f["file"].as_str().unwrap())).find(|p| p.to_str().unwrap().contains("llama-1b.") && p.to_str().unwrap().ends_with(".Q4_K_M.gguf")).unwrap();
    let want: Vec<(String, GgmlType)> = [
        ("output_norm.weight", GgmlType::F32),
        ("rope_freqs.weight", GgmlType::F32),
        ("token_embd.weight", GgmlType::Q6_K),
        ("blk.0.attn_k.weight", GgmlType::Q4_K),
        ("blk.0.attn_norm.weight", GgmlType::F32),
        ("blk.0.attn_output.weight", GgmlType::Q4_K),
        ("blk.0.attn_q.weight", GgmlType::Q4_K),
        ("blk.0.attn_v.weight", GgmlType::Q6_K),
        ("blk.0.ffn_down.weight", GgmlType::Q6_K),
        ("blk.0.ffn_gate.weight", GgmlType::Q4_K),
        ("blk.0.ffn_norm.weight", GgmlType::F32),
        ("blk.0.ffn_up.weight", GgmlType::Q4_K),
    ]
    .map(|(n, t)| (n.to_string(), t))
    .to_vec();
    assert_eq!(types_of(&q4km), want);

    let out = matrix_script(&["--smoke", "--cache", cache, "--blink", env!("CARGO_BIN_EXE_blink"), "--threads", THREADS, "--synth", "/nonexistent/synth_model"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}\n{}", text, String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("CPU: "), "{text}");
    for shape in ["llama-1b", "qwen2-1.5b", "gemma3-1b", "llama-8b"] {
        for preset in ["Q4_0", "Q4_K_M"] {
            let rows: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!("| {shape} {preset}, 1 layer"))).collect();
            assert_eq!(rows.len(), 2, "a speed row and a 16-sequence row for {shape} {preset}:\n{text}");
            for row in rows {
                let cells: Vec<&str> = row.split('|').map(str::trim).collect();
                let blink: f64 = cells[3].parse().unwrap_or_else(|_| panic!("a speed in {row}"));
                assert!(blink > 0.0, "{row}");
            }
        }
    }
}

/// The same arguments give the same bytes, whatever the thread count; another seed, others.
#[test]
fn same_seed_same_bytes() {
    model_path();
    let dir = Scratch::new("synth-seed");
    let make = |name: &str, extra: &[&str]| {
        let path = dir.0.join(name);
        let mut a = args(&["--shape", "gemma3-1b", "--preset", "Q4_0", "--layers", "1", "--vocab", "300", "-o", path.to_str().unwrap()]);
        a.extend(args(extra));
        synth_model::run(&a).unwrap();
        std::fs::read(path).unwrap()
    };
    let one = make("a.gguf", &["--threads", "1"]);
    assert_eq!(one, make("b.gguf", &["--threads", "2"]));
    assert_ne!(one, make("c.gguf", &["--threads", "2", "--seed", "2"]));
    let file = GgufFile::from_bytes(one).unwrap();
    assert_eq!(file.get_array("tokenizer.ggml.tokens").unwrap().len(), 300);
    assert_eq!(file.tensor("token_embd.weight").unwrap().dims, [1152, 300]);
}
