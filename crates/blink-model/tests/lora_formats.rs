//! Reading LoRA adapters (`blink_model::lora::read`) on the shared golden adapters, made by
//! PEFT and converted by llama.cpp: both formats give the same pairs bit for bit, values
//! match the raw file read here independently (Q and K rows permuted to the GGUF order).
//!
//! The golden adapters are found in `$BLINK_LORA_GOLDEN_DIR`, else `testdata/golden/lora`,
//! else the `shared/golden/lora` beside the repository.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use blink_gguf::GgufFile;
use blink_model::config::RopeOrder;
use blink_model::lora::{read, LoraFormat, LoraTarget, LoraTensors};
use blink_model::ModelConfig;
use safetensors::SafeTensors;

const R8: &str = "adapter-r8";
const R4: &str = "adapter-r4-qv";
const CONFIG: &str = "adapter_config.json";
const MODEL: &str = "adapter_model.safetensors";

fn golden() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates: Vec<PathBuf> = std::env::var_os("BLINK_LORA_GOLDEN_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .chain([root.join("testdata/golden/lora"), root.join("../shared/golden/lora")])
        .collect();
    candidates.iter().find(|d| d.join(R8).is_dir()).cloned().unwrap_or_else(|| panic!("no LoRA golden data in any of {candidates:?}"))
}

fn peft_dir(name: &str) -> PathBuf {
    golden().join(name)
}

fn gguf_file(name: &str) -> PathBuf {
    golden().join("gguf").join(format!("{name}.f32.gguf"))
}

/// The default model's configuration (SmolLM2-135M: 30 layers, 9 heads, 3 KV heads).
fn cfg() -> &'static ModelConfig {
    static CFG: OnceLock<ModelConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let file = GgufFile::open(blink_model::fetch::ensure_default_model().unwrap()).unwrap();
        ModelConfig::from_gguf(&file).unwrap()
    })
}

/// A directory of the test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("blink-lora-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---- the raw safetensors file, read here without the safetensors crate ----

/// Every tensor of a float32 safetensors file: name → (shape, values).
fn raw_f32(path: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut out = HashMap::new();
    for (name, info) in header.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        assert_eq!(info["dtype"], "F32");
        let shape: Vec<usize> = info["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        let (start, end) = (info["data_offsets"][0].as_u64().unwrap() as usize, info["data_offsets"][1].as_u64().unwrap() as usize);
        let values = data[start..end].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        out.insert(name.clone(), (shape, values));
    }
    out
}

fn peft_name(layer: usize, target: LoraTarget, side: char) -> String {
    let block = if matches!(target, LoraTarget::Q | LoraTarget::K | LoraTarget::V | LoraTarget::O) { "self_attn" } else { "mlp" };
    format!("base_model.model.model.layers.{layer}.{block}.{}.lora_{side}.weight", target.peft_name())
}

/// Row `i` of a GGUF-ordered Q or K with heads of `head_dim` rows is this row of the Hugging
/// Face order: even rows of a head come from its first half, odd rows from its second.
fn hf_row(i: usize, head_dim: usize) -> usize {
    let (head, within) = (i / head_dim, i % head_dim);
    head * head_dim + (within % 2) * (head_dim / 2) + within / 2
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every pair of `t` equals the raw file's, B of Q and K permuted when `permuted`.
fn assert_matches_raw(t: &LoraTensors, raw: &HashMap<String, (Vec<usize>, Vec<f32>)>, permuted: bool) {
    let head_dim = cfg().head_dim;
    let mut pairs = 0;
    for layer in 0..cfg().n_layers {
        for target in LoraTarget::ALL {
            let Some(pair) = t.pair(layer, target) else {
                assert!(!raw.contains_key(&peft_name(layer, target, 'A')), "layer {layer} {target:?} was not read");
                continue;
            };
            pairs += 1;
            let (a_shape, a) = &raw[&peft_name(layer, target, 'A')];
            let (b_shape, b) = &raw[&peft_name(layer, target, 'B')];
            assert_eq!((a_shape.clone(), b_shape.clone()), (vec![pair.rank, pair.cols], vec![pair.rows, pair.rank]));
            assert_eq!(bits(&pair.a), bits(a), "A of layer {layer} {target:?}");
            let qk = matches!(target, LoraTarget::Q | LoraTarget::K);
            for row in 0..pair.rows {
                let src = if qk && permuted { hf_row(row, head_dim) } else { row };
                let r = pair.rank;
                assert_eq!(bits(&pair.b[row * r..(row + 1) * r]), bits(&b[src * r..(src + 1) * r]), "B row {row} of layer {layer} {target:?}");
            }
        }
    }
    assert_eq!(pairs * 2, raw.len(), "every tensor of the file is in a pair");
}

// ---- the golden adapters ----

#[test]
fn peft_r8_has_every_target_of_every_layer() {
    let t = read(&peft_dir(R8), cfg()).unwrap();
    assert_eq!((t.format, t.alpha, t.rslora), (LoraFormat::Peft, 16.0, false));
    assert_eq!(t.layers.len(), 30);
    assert_eq!(t.targets(), LoraTarget::ALL.to_vec());
    for layer in 0..30 {
        for target in LoraTarget::ALL {
            let p = t.pair(layer, target).unwrap_or_else(|| panic!("layer {layer} {target:?}"));
            assert_eq!((p.rank, p.rows, p.cols), (8, target.shape(cfg()).0, target.shape(cfg()).1));
            assert_eq!((p.a.len(), p.b.len()), (8 * p.cols, p.rows * 8));
        }
    }
    assert_eq!(t.pair_scale(8), 2.0);
    let file_bytes: u64 = SafeTensors::deserialize(&std::fs::read(peft_dir(R8).join(MODEL)).unwrap()).unwrap().iter().map(|(_, v)| v.data().len() as u64).sum();
    assert_eq!(t.tensor_bytes() as u64, file_bytes);
    // Per layer, A: 8 × (six inputs of 576 + down's 1536); B: 8 × (q, o: 576; k, v: 192;
    // gate, up: 1536; down: 576). Four bytes each, 30 layers.
    assert_eq!(file_bytes, 30 * 4 * 8 * (6 * 576 + 1536 + 3 * 576 + 2 * 192 + 2 * 1536));
}

#[test]
fn peft_values_are_the_files_with_q_and_k_rows_permuted() {
    let raw = raw_f32(&peft_dir(R8).join(MODEL));
    let t = read(&peft_dir(R8), cfg()).unwrap();
    // Spot checks by hand first. V is not permuted: B[17][2] of layer 5 is the file's.
    let (_, v_b) = &raw[&peft_name(5, LoraTarget::V, 'B')];
    let (_, v_a) = &raw[&peft_name(5, LoraTarget::V, 'A')];
    let v = t.pair(5, LoraTarget::V).unwrap();
    assert_eq!(v.b[17 * 8 + 2].to_bits(), v_b[17 * 8 + 2].to_bits());
    assert_eq!(v.a[3 * 576 + 100].to_bits(), v_a[3 * 576 + 100].to_bits());
    // Q of layer 7: GGUF row 75 is head 1 (rows 64..128), row 11 within it, odd, so the
    // second half's row 5: Hugging Face row 64 + 32 + 5 = 101.
    let (_, q_b) = &raw[&peft_name(7, LoraTarget::Q, 'B')];
    let q = t.pair(7, LoraTarget::Q).unwrap();
    assert_eq!(bits(&q.b[75 * 8..76 * 8]), bits(&q_b[101 * 8..102 * 8]));
    assert_eq!(bits(&q.b[74 * 8..75 * 8]), bits(&q_b[69 * 8..70 * 8]), "row 10 of head 1 is its first half's row 5");
    assert_ne!(bits(&q.b[75 * 8..76 * 8]), bits(&q_b[75 * 8..76 * 8]));
    // Then every value of every pair.
    assert_matches_raw(&t, &raw, true);
}

#[test]
fn a_neox_model_takes_the_rows_as_they_are() {
    let mut neox = cfg().clone();
    neox.rope.order = RopeOrder::NeoX;
    let t = read(&peft_dir(R8), &neox).unwrap();
    assert_matches_raw(&t, &raw_f32(&peft_dir(R8).join(MODEL)), false);
}

#[test]
fn peft_r4_qv_has_only_q_and_v() {
    let t = read(&peft_dir(R4), cfg()).unwrap();
    assert_eq!((t.format, t.alpha, t.rslora), (LoraFormat::Peft, 8.0, false));
    assert_eq!(t.layers.len(), 30);
    assert_eq!(t.targets(), vec![LoraTarget::Q, LoraTarget::V]);
    for layer in &t.layers {
        for target in LoraTarget::ALL {
            assert_eq!(layer[target.index()].as_ref().map(|p| p.rank), matches!(target, LoraTarget::Q | LoraTarget::V).then_some(4));
        }
    }
    assert_eq!(t.pair_scale(4), 2.0);
    assert_eq!(t.tensor_bytes(), 30 * 4 * 4 * (576 + 576 + 576 + 192));
    assert_matches_raw(&t, &raw_f32(&peft_dir(R4).join(MODEL)), true);
}

#[test]
fn gguf_adapters_equal_their_peft_originals_bit_for_bit() {
    for name in [R8, R4] {
        let peft = read(&peft_dir(name), cfg()).unwrap();
        let gguf = read(&gguf_file(name), cfg()).unwrap();
        assert_eq!(gguf.format, LoraFormat::Gguf);
        assert_eq!((gguf.alpha.to_bits(), gguf.rslora), (peft.alpha.to_bits(), peft.rslora), "{name}");
        assert_eq!(gguf.layers.len(), peft.layers.len());
        for layer in 0..cfg().n_layers {
            for target in LoraTarget::ALL {
                match (peft.pair(layer, target), gguf.pair(layer, target)) {
                    (None, None) => {}
                    (Some(p), Some(g)) => {
                        assert_eq!((p.rank, p.rows, p.cols), (g.rank, g.rows, g.cols));
                        assert_eq!(bits(&p.a), bits(&g.a), "{name} A of layer {layer} {target:?}");
                        assert_eq!(bits(&p.b), bits(&g.b), "{name} B of layer {layer} {target:?}");
                    }
                    (p, g) => panic!("{name} layer {layer} {target:?}: PEFT {} GGUF {}", p.is_some(), g.is_some()),
                }
            }
        }
        assert_eq!(LoraTensors { format: LoraFormat::Peft, ..gguf }, peft);
    }
}

#[test]
fn either_file_of_a_peft_directory_names_it() {
    let whole = read(&peft_dir(R4), cfg()).unwrap();
    assert_eq!(read(&peft_dir(R4).join(CONFIG), cfg()).unwrap(), whole);
    assert_eq!(read(&peft_dir(R4).join(MODEL), cfg()).unwrap(), whole);
    // A GGUF is known by its magic, whatever its name.
    let dir = TempDir::new("named");
    let renamed = dir.path().join("adapter.bin");
    std::fs::copy(gguf_file(R4), &renamed).unwrap();
    assert_eq!(read(&renamed, cfg()).unwrap().format, LoraFormat::Gguf);
}
