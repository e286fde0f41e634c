//! The default model's weights under another architecture, made as
//! `scripts/llamacpp_ref/make_synthetic.py` made the files
//! llama.cpp ran for `testdata/golden/synthetic-<arch>.json`: keep the two in step.

use std::path::PathBuf;

use blink_gguf::{GgmlType, GgufFile, GgufWriter, Value};

use super::model_path;

/// Gemma 2's sliding window in these files.
pub const GEMMA2_WINDOW: u32 = 16;
/// Layers kept, and experts per layer, in the mixture-of-experts files.
const MOE_LAYERS: usize = 12;
const N_EXPERT: usize = 8;

/// Write the default model as `name` (an architecture, or `mixtral`: `llama` with experts)
/// to a temporary file (the caller removes it).
pub fn synthetic(name: &str) -> PathBuf {
    let moe = matches!(name, "qwen3moe" | "mixtral");
    let arch = if name == "mixtral" { "llama" } else { name };
    let src = GgufFile::open(model_path()).unwrap();
    let mut w = GgufWriter::new();
    let key = |k: &str| k.strip_prefix("llama.").map_or_else(|| k.to_string(), |rest| format!("{arch}.{rest}"));
    for (k, v) in src.metadata() {
        match k.as_str() {
            "general.alignment" => {}
            "general.architecture" => w.add(k.clone(), Value::String(arch.into())).unwrap(),
            "llama.context_length" if arch == "phi3" => {}
            "llama.block_count" if moe => w.add(key(k), Value::U32(MOE_LAYERS as u32)).unwrap(),
            _ => w.add(key(k), v.clone()).unwrap(),
        }
    }
    let n_ff = src.get_u32("llama.feed_forward_length").unwrap();
    let extra: &[(&str, Value)] = match arch {
        "granite" => &[("embedding_scale", Value::F32(1.5)), ("residual_scale", Value::F32(1.25)), ("attention.scale", Value::F32(0.1)), ("logit_scale", Value::F32(0.5))],
        "gemma2" => &[("attention.sliding_window", Value::U32(GEMMA2_WINDOW)), ("attn_logit_softcapping", Value::F32(2.0)), ("final_logit_softcapping", Value::F32(30.0))],
        "phi3" => &[("context_length", Value::U32(2048)), ("rope.scaling.original_context_length", Value::U32(1024)), ("rope.scaling.attn_factor", Value::F32(1.190_238_1))],
        _ => &[],
    };
    let experts = [("expert_count", Value::U32(N_EXPERT as u32)), ("expert_used_count", Value::U32(2)), ("expert_feed_forward_length", Value::U32(n_ff))];
    let experts = if !moe { &[][..] } else if arch == "qwen3moe" { &experts[..] } else { &experts[..2] };
    for (k, v) in extra.iter().chain(experts) {
        w.add(format!("{arch}.{k}"), v.clone()).unwrap();
    }
    let n_layers = src.get_u32("llama.block_count").unwrap() as usize;
    let n_embd = src.get_u32("llama.embedding_length").unwrap() as usize;
    let heads = src.get_u32("llama.attention.head_count").unwrap() as usize;
    let head_dim = n_embd / heads;
    let kv_width = src.get_u32("llama.attention.head_count_kv").unwrap() as usize * (n_embd / heads);
    let tensor = |name: &str| {
        let t = src.tensors().iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name} in the default model"));
        (t.ty, t.dims.clone(), src.tensor_data(t).to_vec())
    };
    let add = |w: &mut GgufWriter, name: String, (ty, dims, data): (GgmlType, Vec<u64>, Vec<u8>)| w.add_tensor_owned(name, ty, &dims, data).unwrap();
    // Row-major tensors one after another along their rows.
    let stacked = |names: &[String]| {
        let parts: Vec<_> = names.iter().map(|n| tensor(n)).collect();
        let rows = parts.iter().map(|p| p.1[1]).sum();
        (parts[0].0, vec![parts[0].1[0], rows], parts.iter().flat_map(|p| p.2.clone()).collect())
    };
    for t in src.tensors() {
        let name = t.name.as_str();
        let Some((blk, rest)) = name.strip_prefix("blk.").and_then(|s| s.split_once('.')).map(|(i, rest)| (format!("blk.{i}."), rest)) else {
            add(&mut w, name.to_string(), tensor(name));
            continue;
        };
        let layer: usize = blk[4..blk.len() - 1].parse().unwrap();
        if moe && layer >= MOE_LAYERS {
            continue;
        }
        match (arch, rest) {
            (_, "ffn_gate.weight" | "ffn_up.weight" | "ffn_down.weight") if moe => {
                let kind = rest.strip_suffix(".weight").unwrap();
                if kind == "ffn_gate" {
                    // Row e: token (1000 + 37e + l)'s embedding times 8.
                    let (ty, dims, data) = tensor("token_embd.weight");
                    let row = ty.row_bytes(dims[0]).unwrap() as usize;
                    let mut router = Vec::with_capacity(N_EXPERT * n_embd * 4);
                    for e in 0..N_EXPERT {
                        let t = 1000 + 37 * e + layer;
                        let mut v = vec![0f32; n_embd];
                        blink_kernels::quant::dequantize_row(ty, &data[t * row..(t + 1) * row], &mut v);
                        router.extend(v.iter().flat_map(|x| (x * 8.0).to_le_bytes()));
                    }
                    add(&mut w, format!("{blk}ffn_gate_inp.weight"), (GgmlType::F32, vec![n_embd as u64, N_EXPERT as u64], router));
                }
                let parts: Vec<_> = (0..N_EXPERT).map(|e| tensor(&format!("blk.{}.{rest}", (layer + e) % n_layers))).collect();
                let dims = vec![parts[0].1[0], parts[0].1[1], N_EXPERT as u64];
                add(&mut w, format!("{blk}{kind}_exps.weight"), (parts[0].0, dims, parts.iter().flat_map(|p| p.2.clone()).collect()));
            }
            ("qwen3moe", "attn_norm.weight") => {
                add(&mut w, name.to_string(), tensor(name));
                let (ty, _, data) = tensor(name);
                for norm in ["attn_q_norm.weight", "attn_k_norm.weight"] {
                    add(&mut w, format!("{blk}{norm}"), (ty, vec![head_dim as u64], data[..head_dim * 4].to_vec()));
                }
            }
            ("olmo2", "attn_norm.weight") => {
                add(&mut w, format!("{blk}post_attention_norm.weight"), tensor(name));
                add(&mut w, format!("{blk}attn_q_norm.weight"), tensor(name));
            }
            ("olmo2", "ffn_norm.weight") => {
                add(&mut w, format!("{blk}post_ffw_norm.weight"), tensor(name));
                let (ty, _, data) = tensor(name);
                add(&mut w, format!("{blk}attn_k_norm.weight"), (ty, vec![kv_width as u64], data[..kv_width * 4].to_vec()));
            }
            ("gemma2", "attn_norm.weight" | "ffn_norm.weight") => {
                add(&mut w, name.to_string(), tensor(name));
                let post = if rest == "attn_norm.weight" { "post_attention_norm.weight" } else { "post_ffw_norm.weight" };
                add(&mut w, format!("{blk}{post}"), tensor(name));
            }
            ("phi3", "attn_q.weight") => add(&mut w, format!("{blk}attn_qkv.weight"), stacked(&["attn_q", "attn_k", "attn_v"].map(|p| format!("{blk}{p}.weight")))),
            ("phi3", "ffn_up.weight") => add(&mut w, name.to_string(), stacked(&["ffn_gate", "ffn_up"].map(|p| format!("{blk}{p}.weight")))),
            ("phi3", "attn_k.weight" | "attn_v.weight" | "ffn_gate.weight") => {}
            _ => add(&mut w, name.to_string(), tensor(name)),
        }
    }
    if arch == "olmo2" {
        add(&mut w, "output.weight".into(), tensor("token_embd.weight"));
    }
    if arch == "phi3" {
        let half = head_dim / 2;
        for (name, long) in [("rope_factors_long.weight", true), ("rope_factors_short.weight", false)] {
            // As the script: short near 1, long growing with the dimension.
            let f: Vec<u8> = (0..half).map(|i| if long { 1.0 + 0.02 * i as f64 } else { 1.0 + 0.001 * (i % 5) as f64 } as f32).flat_map(f32::to_le_bytes).collect();
            add(&mut w, name.into(), (GgmlType::F32, vec![half as u64], f));
        }
    }
    let path = std::env::temp_dir().join(format!("blink-{name}-{}.gguf", std::process::id()));
    w.write(&path).unwrap();
    path
}

/// The default model with each matrix (embeddings included) dequantized and quantized
/// again to the type `pick` gives for its name and row length, by Blink's reference
/// quantizers, to a temporary file (the caller removes it).
pub fn requantized(name: &str, pick: fn(&str, usize) -> GgmlType) -> PathBuf {
    let src = GgufFile::open(model_path()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        if k != "general.alignment" {
            w.add(k.clone(), v.clone()).unwrap();
        }
    }
    for t in src.tensors() {
        let data = src.tensor_data(t);
        if t.dims.len() != 2 {
            w.add_tensor_owned(t.name.clone(), t.ty, &t.dims, data.to_vec()).unwrap();
            continue;
        }
        let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let ty = pick(&t.name, cols);
        let mut values = vec![0f32; cols * rows];
        blink_kernels::quant::dequantize_row(t.ty, data, &mut values);
        let mut out = vec![0u8; ty.row_bytes((cols * rows) as u64).unwrap() as usize];
        // Row by row: a row is whole blocks of the new type.
        let rb = out.len() / rows;
        for (x, o) in values.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
            blink_kernels::quant::quantize_weights(ty, x, o).unwrap();
        }
        w.add_tensor_owned(t.name.clone(), ty, &t.dims, out).unwrap();
    }
    let path = std::env::temp_dir().join(format!("blink-{name}-{}.gguf", std::process::id()));
    w.write(&path).unwrap();
    path
}
