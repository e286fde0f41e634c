//! Reading LoRA adapters (`blink_model::lora::read`) on the shared golden adapters, made by
//! PEFT and converted by llama.cpp: both formats give the same pairs bit for bit, values
//! match the raw file read here independently (Q and K rows permuted to the GGUF order),
//! every kind of bad file gives the right error naming what is wrong, and random damage to
//! the real files never panics.
//!
//! The golden adapters are the repository's `testdata/golden/lora` (or
//! `$BLINK_LORA_GOLDEN_DIR`).

use std::collections::HashMap;
use std::path::Path;

use blink_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use blink_model::config::RopeOrder;
use blink_model::lora::{read, LoraError, LoraFormat, LoraTarget, LoraTensors};
use proptest::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

mod lora_support;

use lora_support::*;

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

// ---- rewriting the golden adapters, for bad inputs ----

/// A safetensors file's tensors: (name, dtype, shape, bytes), in name order.
type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

fn load_peft(name: &str) -> (serde_json::Value, Tensors) {
    let config = serde_json::from_slice(&std::fs::read(peft_dir(name).join(CONFIG)).unwrap()).unwrap();
    let bytes = std::fs::read(peft_dir(name).join(MODEL)).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Tensors = st.iter().map(|(n, v)| (n.to_string(), v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    (config, tensors)
}

fn safetensors_bytes(tensors: &Tensors) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize(views, None).unwrap()
}

fn write_peft(dir: &Path, config: &serde_json::Value, tensors: &Tensors) {
    std::fs::write(dir.join(CONFIG), serde_json::to_string_pretty(config).unwrap()).unwrap();
    std::fs::write(dir.join(MODEL), safetensors_bytes(tensors)).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// adapter-r4-qv with `edit` applied, written to a directory of its own.
fn peft_variant(tag: &str, edit: impl FnOnce(&mut serde_json::Value, &mut Tensors)) -> TempDir {
    let (mut config, mut tensors) = load_peft(R4);
    edit(&mut config, &mut tensors);
    let dir = TempDir::new(tag);
    write_peft(dir.path(), &config, &tensors);
    dir
}

fn peft_error(tag: &str, edit: impl FnOnce(&mut serde_json::Value, &mut Tensors)) -> LoraError {
    let dir = peft_variant(tag, edit);
    read(dir.path(), cfg()).expect_err(tag)
}

fn tensor<'t>(tensors: &'t mut Tensors, name: &str) -> &'t mut (String, Dtype, Vec<usize>, Vec<u8>) {
    tensors.iter_mut().find(|t| t.0 == name).unwrap_or_else(|| panic!("no tensor {name}"))
}

fn add_pair(tensors: &mut Tensors, prefix: &str, a_shape: [usize; 2], b_shape: [usize; 2]) {
    for (side, shape) in [("A", a_shape), ("B", b_shape)] {
        tensors.push((format!("{prefix}.lora_{side}.weight"), Dtype::F32, shape.to_vec(), f32_bytes(&vec![0.01; shape[0] * shape[1]])));
    }
}

#[track_caller]
fn assert_format(e: &LoraError, path_ends: &str, words: &[&str]) {
    let LoraError::Format { path, reason } = e else { panic!("expected a Format error, got {e:?}") };
    assert!(path.ends_with(path_ends), "{e}: not about {path_ends}");
    let msg = e.to_string();
    for w in words {
        assert!(reason.contains(w) || msg.contains(w), "'{msg}' does not say '{w}'");
    }
}

#[track_caller]
fn assert_unsupported(e: &LoraError, words: &[&str]) {
    assert!(matches!(e, LoraError::Unsupported(_)), "expected Unsupported, got {e:?}");
    let msg = e.to_string();
    for w in words {
        assert!(msg.contains(w), "'{msg}' does not say '{w}'");
    }
}

// ---- bad PEFT adapters ----

#[test]
fn missing_paths_are_io_errors() {
    let nowhere = golden().join("no-such-adapter");
    assert!(matches!(read(&nowhere, cfg()), Err(LoraError::Io { path, .. }) if path == nowhere));
    let dir = TempDir::new("missing");
    let e = read(dir.path(), cfg()).unwrap_err();
    assert!(matches!(&e, LoraError::Io { path, source } if path.ends_with(CONFIG) && source.kind() == std::io::ErrorKind::NotFound), "{e:?}");
    std::fs::copy(peft_dir(R4).join(CONFIG), dir.path().join(CONFIG)).unwrap();
    let e = read(dir.path(), cfg()).unwrap_err();
    assert!(matches!(&e, LoraError::Io { path, .. } if path.ends_with(MODEL)), "{e:?}");
    assert!(e.to_string().contains(MODEL), "{e}");
    std::fs::write(dir.path().join("adapter_model.bin"), b"pickle").unwrap();
    assert_unsupported(&read(dir.path(), cfg()).unwrap_err(), &["adapter_model.bin", "safetensors"]);
    // A file that is neither format.
    let other = dir.path().join("notes.txt");
    std::fs::write(&other, b"hello").unwrap();
    assert_format(&read(&other, cfg()).unwrap_err(), "notes.txt", &["PEFT", "GGUF"]);
}

#[test]
fn malformed_json_is_a_format_error() {
    let dir = peft_variant("json", |_, _| {});
    for (text, words) in [("{ \"r\": 4, ", &["not valid JSON"][..]), ("[4, 8]", &["not a JSON object"]), ("{\"lora_alpha\": 8}", &["'r'"]), ("", &["JSON"])] {
        std::fs::write(dir.path().join(CONFIG), text).unwrap();
        assert_format(&read(dir.path(), cfg()).unwrap_err(), CONFIG, words);
    }
    std::fs::write(dir.path().join(CONFIG), [0xff, 0xfe, b'{']).unwrap();
    assert_format(&read(dir.path(), cfg()).unwrap_err(), CONFIG, &[]);
}

#[test]
fn a_truncated_safetensors_file_is_a_format_error() {
    let dir = peft_variant("truncated", |_, _| {});
    let full = std::fs::read(dir.path().join(MODEL)).unwrap();
    for len in [0, 7, 8, 100, full.len() / 2, full.len() - 1] {
        std::fs::write(dir.path().join(MODEL), &full[..len]).unwrap();
        assert_format(&read(dir.path(), cfg()).unwrap_err(), MODEL, &["safetensors"]);
    }
}

#[test]
fn a_tensor_of_the_wrong_shape_is_named_with_both_shapes() {
    let name = peft_name(3, LoraTarget::V, 'B');
    let e = peft_error("shape", |_, t| {
        let v = tensor(t, &name);
        v.2 = vec![190, 4];
        v.3.truncate(190 * 4 * 4);
    });
    assert!(matches!(&e, LoraError::Shape { tensor, expected, found } if *tensor == name && *expected == [192, 4] && *found == [190, 4]), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(&name) && msg.contains("[190, 4]") && msg.contains("[192, 4]"), "{msg}");
    // A of another input size, and a matrix with a third dimension.
    let name = peft_name(0, LoraTarget::Q, 'A');
    let e = peft_error("shape-a", |_, t| tensor(t, &name).2 = vec![4, 288, 2]);
    assert!(matches!(&e, LoraError::Shape { tensor, expected, found } if *tensor == name && *expected == [4, 576] && *found == [4, 288, 2]), "{e:?}");
}

#[test]
fn a_rank_other_than_the_configs_is_a_shape_error() {
    let e = peft_error("rank", |c, _| c["r"] = 8.into());
    let first = peft_name(0, LoraTarget::Q, 'A');
    assert!(matches!(&e, LoraError::Shape { tensor, expected, found } if *tensor == first && *expected == [8, 576] && *found == [4, 576]), "{e:?}");
    // A rank past what the projections allow, and ranks that are not positive integers.
    assert_format(&peft_error("rank-big", |c, _| c["r"] = 1000.into()), MODEL, &["rank 1000", "1..=576"]);
    for r in [serde_json::json!(0), serde_json::json!(-4), serde_json::json!(2.5), serde_json::json!("4")] {
        assert_format(&peft_error("rank-bad", |c, _| c["r"] = r.clone()), CONFIG, &["r = "]);
    }
}

#[test]
fn a_layer_past_the_models_is_a_wrong_base() {
    let e = peft_error("layer", |_, t| add_pair(t, "base_model.model.model.layers.30.self_attn.q_proj", [4, 576], [576, 4]));
    assert!(matches!(&e, LoraError::WrongBase(m) if m == "adapter has layer 30, the model has 30 layers"), "{e:?}");
    let e = peft_error("layer-huge", |_, t| add_pair(t, "base_model.model.model.layers.99999999999999999999999.mlp.up_proj", [4, 576], [1536, 4]));
    assert!(matches!(&e, LoraError::WrongBase(m) if m.contains("99999999999999999999999")), "{e:?}");
}

#[test]
fn targets_blink_does_not_change_are_unsupported() {
    let e = peft_error("lm-head", |_, t| add_pair(t, "base_model.model.lm_head", [4, 576], [49152, 4]));
    assert_unsupported(&e, &["lm_head", "base_model.model.lm_head.lora_A.weight"]);
    let e = peft_error("embed", |_, t| {
        t.push(("base_model.model.model.embed_tokens.lora_embedding_A".into(), Dtype::F32, vec![4, 8], f32_bytes(&[0.0; 32])));
    });
    assert_unsupported(&e, &["embed_tokens"]);
    let e = peft_error("norm", |_, t| add_pair(t, "base_model.model.model.layers.0.input_layernorm", [4, 576], [576, 4]));
    assert_unsupported(&e, &["input_layernorm"]);
    let e = peft_error("stray", |_, t| t.push(("extra.thing".into(), Dtype::F32, vec![2], f32_bytes(&[0.0; 2]))));
    assert_unsupported(&e, &["'extra.thing'"]);
    let e = peft_error("dora", |_, t| t.push((format!("{}.lora_magnitude_vector", "base_model.model.model.layers.0.self_attn.q_proj"), Dtype::F32, vec![576], f32_bytes(&[1.0; 576]))));
    assert_unsupported(&e, &["lora_magnitude_vector"]);
    let e = peft_error("listed", |c, _| c["target_modules"] = serde_json::json!(["q_proj", "v_proj", "lm_head"]));
    assert_unsupported(&e, &["lm_head"]);
    // A listed module the tensors do not have is fine, and so is a pattern.
    for targets in [serde_json::json!(["q_proj", "v_proj", "down_proj"]), serde_json::json!(".*\\.(q|v)_proj"), serde_json::json!("all-linear")] {
        let dir = peft_variant("listed-ok", |c, _| c["target_modules"] = targets);
        assert_eq!(read(dir.path(), cfg()).unwrap().targets(), vec![LoraTarget::Q, LoraTarget::V]);
    }
}

#[test]
fn configurations_blink_does_not_run_are_unsupported() {
    let cases: [(&str, serde_json::Value); 9] = [
        ("fan_in_fan_out", true.into()),
        ("use_dora", true.into()),
        ("bias", "all".into()),
        ("lora_bias", true.into()),
        ("rank_pattern", serde_json::json!({"q_proj": 8})),
        ("alpha_pattern", serde_json::json!({"v_proj": 2})),
        ("modules_to_save", serde_json::json!(["lm_head"])),
        ("peft_type", "LOHA".into()),
        ("alora_invocation_tokens", serde_json::json!([1, 2])),
    ];
    for (key, value) in cases {
        let e = peft_error(key, |c, _| c[key] = value);
        assert_unsupported(&e, &[key, CONFIG]);
    }
    // Settings of the wrong type are malformed.
    for (key, value) in [("fan_in_fan_out", serde_json::json!("no")), ("use_rslora", serde_json::json!(1)), ("bias", serde_json::json!(false)), ("rank_pattern", serde_json::json!([])), ("target_modules", serde_json::json!(7))] {
        assert_format(&peft_error(key, |c, _| c[key] = value), CONFIG, &[key]);
    }
}

#[test]
fn a_missing_partner_is_named() {
    let b = peft_name(2, LoraTarget::V, 'B');
    let e = peft_error("partner", |_, t| t.retain(|x| x.0 != b));
    assert_format(&e, MODEL, &[&b, "missing"]);
    let a = peft_name(29, LoraTarget::Q, 'A');
    assert_format(&peft_error("partner-a", |_, t| t.retain(|x| x.0 != a)), MODEL, &[&a, "missing"]);
}

#[test]
fn non_finite_values_are_format_errors_naming_the_tensor() {
    let name = peft_name(4, LoraTarget::Q, 'A');
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = peft_error("nan", |_, t| tensor(t, &name).3[40..44].copy_from_slice(&bad.to_le_bytes()));
        assert_format(&e, MODEL, &[&name, "non-finite", "element 10"]);
    }
}

#[test]
fn bad_alphas_are_format_errors() {
    for alpha in ["NaN", "Infinity", "1e999", "0", "-8", "\"8\"", "null"] {
        let dir = peft_variant("alpha", |_, _| {});
        let text = std::fs::read_to_string(peft_dir(R4).join(CONFIG)).unwrap().replace("\"lora_alpha\": 8", &format!("\"lora_alpha\": {alpha}"));
        std::fs::write(dir.path().join(CONFIG), text).unwrap();
        assert_format(&read(dir.path(), cfg()).unwrap_err(), CONFIG, &[]);
    }
    // f64 alphas past f32's range are not finite either.
    assert_format(&peft_error("alpha-big", |c, _| c["lora_alpha"] = 1e300.into()), CONFIG, &["lora_alpha"]);
}

#[test]
fn an_adapter_without_pairs_is_a_format_error() {
    assert_format(&peft_error("empty", |_, t| t.clear()), MODEL, &["no LoRA pairs"]);
}

#[test]
fn rslora_scales_by_the_root_of_the_rank() {
    let dir = peft_variant("rslora", |c, _| c["use_rslora"] = true.into());
    let t = read(dir.path(), cfg()).unwrap();
    assert!(t.rslora);
    assert_eq!(t.pair_scale(4), 4.0);
}

#[test]
fn half_precision_tensors_are_read_exactly() {
    let f32s = read(&peft_dir(R4), cfg()).unwrap();
    for (dtype, round) in [(Dtype::F16, (|x: f32| half::f16::from_f32(x).to_f32()) as fn(f32) -> f32), (Dtype::BF16, |x: f32| half::bf16::from_f32(x).to_f32())] {
        let dir = peft_variant("half", |_, t| {
            for x in t.iter_mut() {
                let bytes: Vec<u8> = f32_values(&x.3)
                    .into_iter()
                    .flat_map(|v| if dtype == Dtype::F16 { half::f16::from_f32(v).to_le_bytes() } else { half::bf16::from_f32(v).to_le_bytes() })
                    .collect();
                (x.1, x.3) = (dtype, bytes);
            }
        });
        let halves = read(dir.path(), cfg()).unwrap();
        for (h, f) in halves.layers.iter().flatten().zip(f32s.layers.iter().flatten()) {
            let (h, f) = (h.as_ref().map(|p| (bits(&p.a), bits(&p.b))), f.as_ref().map(|p| (p.a.iter().map(|&x| round(x).to_bits()).collect(), p.b.iter().map(|&x| round(x).to_bits()).collect())));
            assert_eq!(h, f, "{dtype:?}");
        }
    }
    let name = peft_name(0, LoraTarget::V, 'A');
    let e = peft_error("f64", |_, t| {
        let v = tensor(t, &name);
        (v.1, v.3) = (Dtype::F64, f32_values(&v.3).iter().flat_map(|&x| f64::from(x).to_le_bytes()).collect());
    });
    assert_unsupported(&e, &[&name, "F64"]);
}

// ---- bad GGUF adapters ----

/// Metadata and tensors (name, type, ggml dims, bytes) of a GGUF file.
type GgufParts = (Vec<(String, Value)>, Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>);

fn load_gguf(name: &str) -> GgufParts {
    let f = GgufFile::open(gguf_file(name)).unwrap();
    let tensors = f.tensors().iter().map(|t| (t.name.clone(), t.ty, t.dims.clone(), f.tensor_data(t).to_vec())).collect();
    (f.metadata().to_vec(), tensors)
}

fn gguf_bytes((meta, tensors): &GgufParts) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add(k.clone(), v.clone()).unwrap();
    }
    for (n, ty, dims, data) in tensors {
        w.add_tensor(n.clone(), *ty, dims, data).unwrap();
    }
    w.to_bytes()
}

/// adapter-r4-qv's GGUF with `edit` applied, read.
fn gguf_variant(edit: impl FnOnce(&mut GgufParts)) -> Result<LoraTensors, LoraError> {
    let mut parts = load_gguf(R4);
    edit(&mut parts);
    let dir = TempDir::new("gguf");
    let path = dir.path().join("adapter.gguf");
    std::fs::write(&path, gguf_bytes(&parts)).unwrap();
    read(&path, cfg())
}

fn set_meta(parts: &mut GgufParts, key: &str, value: Option<Value>) {
    parts.0.retain(|(k, _)| k != key);
    if let Some(v) = value {
        parts.0.push((key.into(), v));
    }
}

fn gguf_tensor<'t>(parts: &'t mut GgufParts, name: &str) -> &'t mut (String, GgmlType, Vec<u64>, Vec<u8>) {
    parts.1.iter_mut().find(|t| t.0 == name).unwrap_or_else(|| panic!("no tensor {name}"))
}

#[test]
fn a_gguf_that_is_not_an_adapter_is_a_format_error() {
    let e = gguf_variant(|p| set_meta(p, "general.type", Some(Value::String("model".into())))).unwrap_err();
    assert_format(&e, "adapter.gguf", &["'model'", "not 'adapter'"]);
    let e = gguf_variant(|p| set_meta(p, "general.type", None)).unwrap_err();
    assert_format(&e, "adapter.gguf", &["general.type"]);
    // The base model itself.
    let model = blink_model::fetch::ensure_default_model().unwrap();
    assert!(matches!(read(&model, cfg()), Err(LoraError::Format { .. })));
    let e = gguf_variant(|p| set_meta(p, "adapter.type", Some(Value::String("control_vector".into())))).unwrap_err();
    assert_unsupported(&e, &["control_vector"]);
    // A truncated GGUF.
    let dir = TempDir::new("gguf-cut");
    let path = dir.path().join("cut.gguf");
    std::fs::write(&path, &std::fs::read(gguf_file(R4)).unwrap()[..5000]).unwrap();
    assert_format(&read(&path, cfg()).unwrap_err(), "cut.gguf", &[]);
}

#[test]
fn a_gguf_for_another_architecture_is_a_wrong_base() {
    let e = gguf_variant(|p| set_meta(p, "general.architecture", Some(Value::String("qwen2".into())))).unwrap_err();
    assert!(matches!(&e, LoraError::WrongBase(m) if m.contains("'qwen2'") && m.contains("'llama'")), "{e:?}");
    let e = gguf_variant(|p| {
        for t in p.1.iter_mut() {
            t.0 = t.0.replace("blk.29.", "blk.31.");
        }
    })
    .unwrap_err();
    assert!(matches!(&e, LoraError::WrongBase(m) if m == "adapter has layer 31, the model has 30 layers"), "{e:?}");
}

#[test]
fn a_gguf_without_alpha_scales_each_pair_by_one() {
    for alpha in [None, Some(Value::F32(0.0))] {
        let t = gguf_variant(|p| set_meta(p, "adapter.lora.alpha", alpha)).unwrap();
        assert_eq!((t.alpha, t.pair_scale(4)), (4.0, 1.0));
    }
    for alpha in [Value::F32(f32::NAN), Value::F32(-1.0), Value::String("8".into())] {
        assert_format(&gguf_variant(|p| set_meta(p, "adapter.lora.alpha", Some(alpha))).unwrap_err(), "adapter.gguf", &["adapter.lora.alpha"]);
    }
}

#[test]
fn gguf_tensors_of_the_wrong_shape_type_or_values_are_named() {
    let b = "blk.3.attn_v.weight.lora_b";
    let e = gguf_variant(|p| {
        let t = gguf_tensor(p, b);
        t.2 = vec![4, 190];
        t.3.truncate(4 * 190 * 4);
    })
    .unwrap_err();
    assert!(matches!(&e, LoraError::Shape { tensor, expected, found } if tensor == b && *expected == [4, 192] && *found == [4, 190]), "{e:?}");
    // B's rank must be A's.
    let e = gguf_variant(|p| {
        let t = gguf_tensor(p, b);
        t.2 = vec![3, 192];
        t.3.truncate(3 * 192 * 4);
    })
    .unwrap_err();
    assert!(matches!(&e, LoraError::Shape { tensor, expected, found } if tensor == b && *expected == [4, 192] && *found == [3, 192]), "{e:?}");
    let a = "blk.0.attn_q.weight.lora_a";
    let e = gguf_variant(|p| {
        let t = gguf_tensor(p, a);
        (t.1, t.3) = (GgmlType::Q8_0, vec![0; 4 * 576 / 32 * 34]);
    })
    .unwrap_err();
    assert_unsupported(&e, &[a, "Q8_0"]);
    let e = gguf_variant(|p| gguf_tensor(p, a).3[0..4].copy_from_slice(&f32::NAN.to_le_bytes())).unwrap_err();
    assert_format(&e, "adapter.gguf", &[a, "non-finite"]);
    let e = gguf_variant(|p| p.1.retain(|t| t.0 != a)).unwrap_err();
    assert_format(&e, "adapter.gguf", &[a, "missing"]);
}

#[test]
fn gguf_targets_blink_does_not_change_are_unsupported() {
    let pair = |p: &mut GgufParts, base: &str, a: [u64; 2], b: [u64; 2]| {
        for (side, dims) in [("a", a), ("b", b)] {
            p.1.push((format!("{base}.weight.lora_{side}"), GgmlType::F32, dims.to_vec(), vec![0; (dims[0] * dims[1] * 4) as usize]));
        }
    };
    let e = gguf_variant(|p| pair(p, "output", [576, 4], [4, 49152])).unwrap_err();
    assert_unsupported(&e, &["'output'"]);
    let e = gguf_variant(|p| pair(p, "blk.0.attn_norm", [576, 4], [4, 576])).unwrap_err();
    assert_unsupported(&e, &["attn_norm"]);
    let e = gguf_variant(|p| p.1.push(("blk.0.attn_q.bias".into(), GgmlType::F32, vec![576], vec![0; 576 * 4]))).unwrap_err();
    assert_unsupported(&e, &["blk.0.attn_q.bias"]);
}

#[test]
fn f16_gguf_tensors_are_read_exactly() {
    let f32s = read(&gguf_file(R4), cfg()).unwrap();
    let t = gguf_variant(|p| {
        for t in p.1.iter_mut() {
            (t.1, t.3) = (GgmlType::F16, f32_values(&t.3).into_iter().flat_map(|v| half::f16::from_f32(v).to_le_bytes()).collect());
        }
    })
    .unwrap();
    let round = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_f32().to_bits()).collect::<Vec<_>>();
    for (h, f) in t.layers.iter().flatten().zip(f32s.layers.iter().flatten()) {
        assert_eq!(h.as_ref().map(|p| (bits(&p.a), bits(&p.b))), f.as_ref().map(|p| (round(&p.a), round(&p.b))));
    }
}

// ---- random damage to the real files: an answer, never a panic ----

/// `bytes` with each (in head, where, value) written: in the first `head` bytes when in
/// head (where the structure is), anywhere otherwise; then cut to `cut` if it is shorter.
fn damage(mut bytes: Vec<u8>, head: usize, edits: &[(bool, prop::sample::Index, u8)], cut: Option<prop::sample::Index>) -> Vec<u8> {
    for (in_head, at, value) in edits {
        let span = if *in_head { head.min(bytes.len()) } else { bytes.len() };
        if span > 0 {
            let i = at.index(span);
            bytes[i] = *value;
        }
    }
    if let Some(cut) = cut {
        let len = cut.index(bytes.len() + 1);
        bytes.truncate(len);
    }
    bytes
}

fn edits() -> impl Strategy<Value = Vec<(bool, prop::sample::Index, u8)>> {
    prop::collection::vec((prop::bool::weighted(0.8), any::<prop::sample::Index>(), any::<u8>()), 1..6)
}

fn cut() -> impl Strategy<Value = Option<prop::sample::Index>> {
    prop::option::weighted(0.2, any::<prop::sample::Index>())
}

/// A JSON value to put in a config field.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::json;
    prop::sample::select(vec![
        json!(null), json!(true), json!(false), json!(0), json!(-1), json!(4), json!(8), json!(577), json!(2.5), json!(1e308),
        json!(18446744073709551615u64), json!(""), json!("none"), json!("q_proj"), json!([]), json!(["q_proj"]), json!([1]), json!({}), json!({"q_proj": 2}),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn damaged_safetensors_never_panic(edits in edits(), cut in cut()) {
        let bytes = std::fs::read(peft_dir(R4).join(MODEL)).unwrap();
        let head = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let dir = TempDir::new("fuzz-st");
        std::fs::copy(peft_dir(R4).join(CONFIG), dir.path().join(CONFIG)).unwrap();
        std::fs::write(dir.path().join(MODEL), damage(bytes, head, &edits, cut)).unwrap();
        let _ = read(dir.path(), cfg());
    }

    #[test]
    fn damaged_configs_never_panic(edits in edits(), cut in cut(), fields in prop::collection::vec((prop::sample::select(vec!["r", "lora_alpha", "use_rslora", "fan_in_fan_out", "use_dora", "bias", "rank_pattern", "target_modules", "peft_type", "modules_to_save"]), json_value()), 0..4)) {
        let (mut config, _) = load_peft(R4);
        for (key, value) in fields {
            config[key] = value;
        }
        let text = serde_json::to_vec_pretty(&config).unwrap();
        let len = text.len();
        let text = if edits.len() > 3 { damage(text, len, &edits, cut) } else { text };
        let dir = TempDir::new("fuzz-json");
        std::fs::copy(peft_dir(R4).join(MODEL), dir.path().join(MODEL)).unwrap();
        std::fs::write(dir.path().join(CONFIG), text).unwrap();
        let _ = read(dir.path(), cfg());
    }

    #[test]
    fn hostile_safetensors_headers_never_panic(which in any::<prop::sample::Index>(), dims in prop::collection::vec(prop::sample::select(vec![0u64, 1, 2, 4, 190, 192, 576, 1 << 32, 1 << 62, u64::MAX]), 0..4), dtype in prop::sample::select(vec!["F32", "F16", "BF16", "F64", "I8", "BOOL", "F4", "X"]), end_shift in prop::sample::select(vec![0i64, 0, -4, 4, -1 << 20, 1 << 40])) {
        // One tensor's entry of the header given another shape, type or end offset, the
        // data left as it was.
        let bytes = std::fs::read(peft_dir(R4).join(MODEL)).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let names: Vec<String> = header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect();
        let entry = &mut header[&names[which.index(names.len())]];
        entry["shape"] = serde_json::json!(dims);
        entry["dtype"] = serde_json::json!(dtype);
        let end = entry["data_offsets"][1].as_i64().unwrap();
        entry["data_offsets"][1] = serde_json::json!(end.saturating_add(end_shift).max(0));
        let text = serde_json::to_vec(&header).unwrap();
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&text);
        out.extend_from_slice(&bytes[8 + n..]);
        let dir = TempDir::new("fuzz-header");
        std::fs::copy(peft_dir(R4).join(CONFIG), dir.path().join(CONFIG)).unwrap();
        std::fs::write(dir.path().join(MODEL), out).unwrap();
        let _ = read(dir.path(), cfg());
    }

    #[test]
    fn damaged_gguf_adapters_never_panic(edits in edits(), cut in cut()) {
        let bytes = std::fs::read(gguf_file(R4)).unwrap();
        let head = GgufFile::open(gguf_file(R4)).unwrap().data_offset() as usize;
        let dir = TempDir::new("fuzz-gguf");
        let path = dir.path().join("adapter.gguf");
        std::fs::write(&path, damage(bytes, head, &edits, cut)).unwrap();
        let _ = read(&path, cfg());
    }
}
