//! Writing LoRA adapters (`write_peft`, `write_peft_tensors`, `write_gguf`) on the shared
//! golden adapters, made by PEFT and converted by llama.cpp: what Blink writes equals those
//! files tensor by tensor, bit for bit (so the inverse Q/K row permutation is checked
//! against PyTorch's own file), it reads back equal to what was written, and bad adapters
//! or bad places give errors, never a panic.
//!
//! The golden adapters are the repository's `testdata/golden/lora` (or
//! `$BLINK_LORA_GOLDEN_DIR`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use blink_gguf::{GgmlType, GgufFile, Value};
use blink_model::config::RopeOrder;
use blink_model::lora::{read, write_gguf, write_peft, write_peft_tensors, LoraError, LoraFormat, LoraTarget, LoraTensors, PeftMeta};
use safetensors::{Dtype, SafeTensors};

mod lora_support;

use lora_support::*;

/// The name llama.cpp's converter gave each golden GGUF (from its directory's name).
fn gguf_name(name: &str) -> &'static str {
    if name == R8 {
        "Adapter R8"
    } else {
        "Adapter R4 Qv"
    }
}

fn meta() -> PeftMeta {
    PeftMeta { base_model_name_or_path: Some("HuggingFaceTB/SmolLM2-135M-Instruct".into()), lora_dropout: 0.0 }
}

/// Every tensor of a safetensors file: name → (dtype, shape, bytes); and its metadata.
type Tensors = BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

fn safetensors_of(path: &Path) -> (Tensors, Option<std::collections::HashMap<String, String>>) {
    let bytes = std::fs::read(path).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let tensors = st.iter().map(|(name, v)| (name.to_string(), (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect();
    (tensors, header.metadata().clone())
}

/// The safetensors files at `written` and `golden` hold the same tensors, bit for bit (and
/// the same metadata, if `metadata`).
fn assert_same_safetensors(written: &Path, golden: &Path, metadata: bool) {
    let (ours, our_meta) = safetensors_of(written);
    let (theirs, their_meta) = safetensors_of(golden);
    assert_eq!(ours.keys().collect::<Vec<_>>(), theirs.keys().collect::<Vec<_>>(), "the same names");
    for (name, (dtype, shape, data)) in &theirs {
        let (our_dtype, our_shape, our_data) = &ours[name];
        assert_eq!((our_dtype, our_shape), (dtype, shape), "{name}");
        assert!(our_data == data, "{name}: values differ");
    }
    if metadata {
        assert_eq!(our_meta, their_meta);
    }
}

/// Every tensor of a GGUF file: name → (type, dims, bytes).
fn gguf_tensors(file: &GgufFile) -> BTreeMap<String, (GgmlType, Vec<u64>, Vec<u8>)> {
    file.tensors().iter().map(|t| (t.name.clone(), (t.ty, t.dims.clone(), file.tensor_data(t).to_vec()))).collect()
}

/// The GGUF files at `written` and `golden` hold the same metadata (in any order) and the
/// same tensors, bit for bit.
fn assert_same_gguf(written: &Path, golden: &Path) {
    let (ours, theirs) = (GgufFile::open(written).unwrap(), GgufFile::open(golden).unwrap());
    let meta = |f: &GgufFile| f.metadata().iter().cloned().collect::<BTreeMap<String, Value>>();
    assert_eq!(meta(&ours), meta(&theirs));
    let (ours, theirs) = (gguf_tensors(&ours), gguf_tensors(&theirs));
    assert_eq!(ours.keys().collect::<Vec<_>>(), theirs.keys().collect::<Vec<_>>(), "the same names");
    for (name, (ty, dims, data)) in &theirs {
        let (our_ty, our_dims, our_data) = &ours[name];
        assert_eq!((our_ty, our_dims), (ty, dims), "{name}");
        assert!(our_data == data, "{name}: values differ");
    }
}

// ---- PEFT ----

#[test]
fn peft_written_is_pytorchs_file_bit_for_bit_and_reads_back_equal() {
    for name in [R8, R4] {
        let original = read(&golden().join(name), cfg()).unwrap();
        let dir = TempDir::new("peft");
        write_peft(dir.path(), &original, cfg(), &meta()).unwrap();
        assert_same_safetensors(&dir.path().join(MODEL), &golden().join(name).join(MODEL), true);
        assert_eq!(read(dir.path(), cfg()).unwrap(), original, "{name}");
        let names: BTreeSet<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, BTreeSet::from([CONFIG.to_string(), MODEL.to_string()]), "no temporary file is left");
    }
}

#[test]
fn peft_config_has_pefts_settings() {
    for name in [R8, R4] {
        let dir = TempDir::new("config");
        write_peft(dir.path(), &read(&golden().join(name), cfg()).unwrap(), cfg(), &meta()).unwrap();
        let ours: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join(CONFIG)).unwrap()).unwrap();
        let theirs: serde_json::Value = serde_json::from_slice(&std::fs::read(golden().join(name).join(CONFIG)).unwrap()).unwrap();
        for (key, value) in ours.as_object().unwrap() {
            if key == "target_modules" {
                let set = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|m| m.as_str().unwrap().to_string()).collect::<BTreeSet<_>>();
                assert_eq!(set(value), set(&theirs[key]), "{name}");
            } else {
                assert_eq!(value, &theirs[key], "{name}: {key}");
            }
        }
        for key in ["peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "target_modules", "bias", "fan_in_fan_out", "use_rslora", "use_dora", "base_model_name_or_path", "inference_mode", "init_lora_weights", "rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform"] {
            assert!(ours.get(key).is_some(), "{name}: {key} is written");
        }
    }
}

#[test]
fn gguf_read_and_written_as_peft_is_pytorchs_file() {
    for name in [R8, R4] {
        let dir = TempDir::new("gguf-peft");
        write_peft(dir.path(), &read(&gguf_file(name), cfg()).unwrap(), cfg(), &meta()).unwrap();
        assert_same_safetensors(&dir.path().join(MODEL), &golden().join(name).join(MODEL), true);
    }
}

#[test]
fn a_neox_model_writes_the_rows_as_they_are() {
    let mut neox = cfg().clone();
    neox.rope.order = RopeOrder::NeoX;
    let original = read(&golden().join(R8), &neox).unwrap();
    let dir = TempDir::new("neox");
    write_peft(dir.path(), &original, &neox, &meta()).unwrap();
    assert_same_safetensors(&dir.path().join(MODEL), &golden().join(R8).join(MODEL), true);
    // Written for the normal-order model instead, Q and K rows move.
    write_peft(dir.path(), &original, cfg(), &meta()).unwrap();
    let (ours, _) = safetensors_of(&dir.path().join(MODEL));
    let (theirs, _) = safetensors_of(&golden().join(R8).join(MODEL));
    let q = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
    assert!(ours[q].2 != theirs[q].2);
}

#[test]
fn gradients_are_dumped_under_peft_names_in_pytorchs_layout() {
    // PyTorch's gradients of adapter-r8, read as an adapter (so B of Q and K in GGUF order,
    // as Blink's training holds them), dumped again: the file PyTorch wrote.
    let dir = TempDir::new("grads");
    std::fs::copy(golden().join(R8).join(CONFIG), dir.path().join(CONFIG)).unwrap();
    std::fs::copy(golden().join("grads-r8.safetensors"), dir.path().join(MODEL)).unwrap();
    let grads = read(dir.path(), cfg()).unwrap();
    let dump = dir.path().join("grads.safetensors");
    write_peft_tensors(&dump, &grads, cfg()).unwrap();
    assert_same_safetensors(&dump, &golden().join("grads-r8.safetensors"), false);
    // A gradient that overflowed is dumped, not refused.
    let mut bad = grads.clone();
    bad.layers[2][LoraTarget::Up.index()].as_mut().unwrap().b[5] = f32::NAN;
    write_peft_tensors(&dump, &bad, cfg()).unwrap();
    let (tensors, _) = safetensors_of(&dump);
    let (_, _, data) = &tensors["base_model.model.model.layers.2.mlp.up_proj.lora_B.weight"];
    assert!(f32::from_le_bytes(data[20..24].try_into().unwrap()).is_nan());
}

#[test]
fn rslora_and_dropout_are_recorded() {
    let mut t = read(&golden().join(R4), cfg()).unwrap();
    t.rslora = true;
    t.alpha = 0.3;
    let dir = TempDir::new("rslora");
    write_peft(dir.path(), &t, cfg(), &PeftMeta { base_model_name_or_path: None, lora_dropout: 0.05 }).unwrap();
    assert_eq!(read(dir.path(), cfg()).unwrap(), t);
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join(CONFIG)).unwrap()).unwrap();
    assert_eq!((&config["use_rslora"], &config["lora_alpha"], &config["lora_dropout"]), (&serde_json::json!(true), &serde_json::json!(0.3), &serde_json::json!(0.05)));
    assert!(config["base_model_name_or_path"].is_null());
    assert!(config["layers_to_transform"].is_null());
}

#[test]
fn an_adapter_on_some_layers_names_them() {
    let mut t = read(&golden().join(R4), cfg()).unwrap();
    for (layer, slots) in t.layers.iter_mut().enumerate() {
        if layer % 10 != 3 {
            *slots = Default::default();
        }
    }
    let dir = TempDir::new("layers");
    write_peft(dir.path(), &t, cfg(), &meta()).unwrap();
    assert_eq!(read(dir.path(), cfg()).unwrap(), t);
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join(CONFIG)).unwrap()).unwrap();
    assert_eq!(config["layers_to_transform"], serde_json::json!([3, 13, 23]));
    assert_eq!(config["target_modules"], serde_json::json!(["q_proj", "v_proj"]));
}

// ---- GGUF ----

#[test]
fn gguf_written_is_llamacpps_file_bit_for_bit_and_reads_back_equal() {
    for name in [R8, R4] {
        let original = read(&gguf_file(name), cfg()).unwrap();
        let dir = TempDir::new("gguf");
        let path = dir.path().join("adapter.gguf");
        write_gguf(&path, &original, cfg(), Some(gguf_name(name))).unwrap();
        assert_same_gguf(&path, &gguf_file(name));
        assert_eq!(read(&path, cfg()).unwrap(), original, "{name}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left");
    }
}

#[test]
fn peft_written_as_gguf_is_llamacpps_conversion() {
    for name in [R8, R4] {
        let peft = read(&golden().join(name), cfg()).unwrap();
        let dir = TempDir::new("peft-gguf");
        let path = dir.path().join("adapter.gguf");
        write_gguf(&path, &peft, cfg(), Some(gguf_name(name))).unwrap();
        assert_same_gguf(&path, &gguf_file(name));
        assert_eq!(read(&path, cfg()).unwrap(), LoraTensors { format: LoraFormat::Gguf, ..peft });
    }
}

#[test]
fn gguf_of_an_rslora_adapter_scales_its_pairs_the_same() {
    let mut t = read(&golden().join(R4), cfg()).unwrap();
    t.rslora = true;
    let dir = TempDir::new("gguf-rslora");
    let path = dir.path().join("a.gguf");
    write_gguf(&path, &t, cfg(), None).unwrap();
    let back = read(&path, cfg()).unwrap();
    assert_eq!((back.alpha, back.rslora), (16.0, false), "8 · √4");
    assert_eq!(back.pair_scale(4), t.pair_scale(4));
    assert_eq!(GgufFile::open(&path).unwrap().get("general.name"), None);
}

// ---- errors ----

#[test]
fn writing_where_no_file_can_be_is_an_io_error() {
    let t = read(&golden().join(R4), cfg()).unwrap();
    let dir = TempDir::new("nowhere");
    let missing = dir.path().join("no-such-dir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for place in [&missing, &file] {
        let e = write_peft(place, &t, cfg(), &meta()).unwrap_err();
        assert!(matches!(&e, LoraError::Io { path, .. } if path.starts_with(place)), "{e:?}");
        let e = write_gguf(&place.join("a.gguf"), &t, cfg(), None).unwrap_err();
        assert!(matches!(&e, LoraError::Io { path, .. } if path.starts_with(place)), "{e:?}");
        let e = write_peft_tensors(&place.join("g.safetensors"), &t, cfg()).unwrap_err();
        assert!(matches!(e, LoraError::Io { .. }), "{e:?}");
    }
    let e = write_gguf(dir.path(), &t, cfg(), None).unwrap_err();
    assert!(matches!(e, LoraError::Io { .. }), "a directory in the way: {e:?}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "nothing was left behind");
}

#[test]
fn adapters_that_would_not_read_back_are_refused() {
    let t = read(&golden().join(R8), cfg()).unwrap();
    let dir = TempDir::new("refused");
    let refused = |edit: &dyn Fn(&mut LoraTensors)| -> [LoraError; 2] {
        let mut bad = t.clone();
        edit(&mut bad);
        [write_peft(dir.path(), &bad, cfg(), &meta()).unwrap_err(), write_gguf(&dir.path().join("a.gguf"), &bad, cfg(), None).unwrap_err()]
    };
    for e in refused(&|t| t.layers.truncate(29)) {
        assert!(matches!(&e, LoraError::WrongBase(m) if m.contains("29 layers")), "{e:?}");
    }
    for e in refused(&|t| t.layers.iter_mut().for_each(|l| *l = Default::default())) {
        assert!(matches!(&e, LoraError::Format { reason, .. } if reason.contains("no LoRA pairs")), "{e:?}");
    }
    for e in refused(&|t| t.layers[4][LoraTarget::K.index()].as_mut().unwrap().a[7] = f32::INFINITY) {
        assert!(matches!(&e, LoraError::Format { reason, .. } if reason.contains("layer 4 k_proj lora_A") && reason.contains("inf")), "{e:?}");
    }
    for e in refused(&|t| t.alpha = f32::NAN) {
        assert!(matches!(&e, LoraError::Format { reason, .. } if reason.contains("lora_alpha")), "{e:?}");
    }
    for e in refused(&|t| {
        let p = t.layers[1][LoraTarget::O.index()].as_mut().unwrap();
        p.cols = 1536;
        p.a = vec![0.0; 8 * 1536];
    }) {
        assert!(matches!(&e, LoraError::Shape { tensor, expected, found } if tensor == "layer 1 o_proj lora_A" && expected == &[8, 576] && found == &[8, 1536]), "{e:?}");
    }
    for e in refused(&|t| {
        t.layers[0][LoraTarget::V.index()].as_mut().unwrap().b.pop();
    }) {
        assert!(matches!(&e, LoraError::WrongBase(m) if m.contains("layer 0 v_proj lora_B")), "{e:?}");
    }
    // One rank only in PEFT; GGUF has a rank per pair.
    let mut mixed = read(&golden().join(R4), cfg()).unwrap();
    let r8 = &t.layers[6][LoraTarget::V.index()];
    mixed.layers[6][LoraTarget::V.index()] = r8.clone();
    let e = write_peft(dir.path(), &mixed, cfg(), &meta()).unwrap_err();
    assert!(matches!(&e, LoraError::Unsupported(m) if m.contains("[4, 8]")), "{e:?}");
    let path = dir.path().join("mixed.gguf");
    write_gguf(&path, &mixed, cfg(), None).unwrap();
    assert_eq!(read(&path, cfg()).unwrap(), LoraTensors { format: LoraFormat::Gguf, ..mixed.clone() });
    mixed.rslora = true;
    assert!(matches!(write_gguf(&path, &mixed, cfg(), None), Err(LoraError::Unsupported(_))));
    let e = write_peft(dir.path(), &t, cfg(), &PeftMeta { lora_dropout: 1.5, ..meta() }).unwrap_err();
    assert!(matches!(&e, LoraError::Format { reason, .. } if reason.contains("lora_dropout")), "{e:?}");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("mixed.gguf")], "a refused adapter writes nothing");
}
