//! Small random models of every supported architecture (Llama, Qwen2 with Q/K/V biases,
//! Qwen3 with per-head Q/K norms and NeoX rope, Llama with linear rope scaling, SmolLM3,
//! OLMo 2, Gemma 2, Phi-3, and mixtures of experts), built as real GGUF files: each
//! loads, computes finite logits, gives the same logits for a sequence alone and inside a
//! batch (with adapters too), and the same logits split over simulated NUMA nodes. Rope
//! scaling keys and per-layer shape arrays are read as llama.cpp reads them, and a file
//! holding a tensor the engine would not use, or experts of a family without them, is
//! refused.

use std::sync::Arc;

use blink_gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};
use blink_kernels::quant::quantize_weights;
use blink_model::lora::LoraMix;
use blink_model::weights::Ffn;
use blink_model::{AdapterSlot, KvType, Model, Scratch, Step, StepRow, TensorPlacement};
use blink_runtime::numa::Topology;

const VOCAB: usize = 96;
const EMBD: usize = 64;
const FF: usize = 128;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const LAYERS: usize = 4;

struct Noise(u64);

impl Noise {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) as f32 * 2.0 - 1.0
    }

    fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

fn add_matrix(w: &mut GgufWriter, noise: &mut Noise, name: &str, ty: GgmlType, cols: usize, rows: usize) {
    let values = noise.values(cols * rows, 0.3);
    let mut bytes = vec![0u8; ty.row_bytes((cols * rows) as u64).unwrap() as usize];
    quantize_weights(ty, &values, &mut bytes).unwrap();
    w.add_tensor(name, ty, &[cols as u64, rows as u64], &bytes).unwrap();
}

/// A stack of `count` random matrices (GGUF dims `[cols, rows, count]`: a layer's experts).
fn add_experts(w: &mut GgufWriter, noise: &mut Noise, name: &str, ty: GgmlType, cols: usize, rows: usize, count: usize) {
    let values = noise.values(cols * rows * count, 0.3);
    let mut bytes = vec![0u8; ty.row_bytes((cols * rows * count) as u64).unwrap() as usize];
    quantize_weights(ty, &values, &mut bytes).unwrap();
    w.add_tensor(name, ty, &[cols as u64, rows as u64, count as u64], &bytes).unwrap();
}

fn add_vector(w: &mut GgufWriter, name: &str, values: &[f32]) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.add_tensor(name, GgmlType::F32, &[values.len() as u64], &bytes).unwrap();
}

/// A random model of `arch` with `matrix` weights, as GGUF bytes.
fn build(arch: &str, matrix: GgmlType, scaling: bool) -> Vec<u8> {
    let linear = [("rope.scaling.type", Value::from("linear")), ("rope.scaling.factor", Value::F32(4.0))];
    build_with(arch, matrix, if scaling { &linear[..] } else { &[] }, &[])
}

/// As [`build`], with `meta` (keys after `{arch}.`) set and `vectors` (f32 tensors of
/// that many values) added.
fn build_with(arch: &str, matrix: GgmlType, meta: &[(&str, Value)], vectors: &[(&str, usize)]) -> Vec<u8> {
    let mut noise = Noise(0x1234_5678_9abc_def1 ^ arch.len() as u64);
    let mut w = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    w.add("general.architecture", Value::from(arch)).unwrap();
    let base = [
        ("block_count", Value::U32(LAYERS as u32)),
        ("context_length", Value::U32(256)),
        ("embedding_length", Value::U32(EMBD as u32)),
        ("feed_forward_length", Value::U32(FF as u32)),
        ("attention.head_count", Value::U32(HEADS as u32)),
        ("attention.head_count_kv", Value::U32(KV_HEADS as u32)),
        ("attention.key_length", Value::U32(HEAD_DIM as u32)),
        ("rope.freq_base", Value::F32(10000.0)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ("vocab_size", Value::U32(VOCAB as u32)),
    ];
    // `meta` replaces a base key of the same name.
    for (key, value) in base.iter().filter(|(key, _)| meta.iter().all(|(m, _)| m != key)).chain(meta) {
        w.add(k(key), value.clone()).unwrap();
    }
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    add_matrix(&mut w, &mut noise, "token_embd.weight", GgmlType::Q8_0, EMBD, VOCAB);
    add_vector(&mut w, "output_norm.weight", &noise.values(EMBD, 1.0));
    for l in 0..LAYERS {
        let n = |s: &str| format!("blk.{l}.{s}");
        let pre_norms = arch != "olmo2";
        if pre_norms {
            add_vector(&mut w, &n("attn_norm.weight"), &noise.values(EMBD, 1.0));
        }
        if arch == "phi3" {
            add_matrix(&mut w, &mut noise, &n("attn_qkv.weight"), matrix, EMBD, q + 2 * kv);
        } else {
            add_matrix(&mut w, &mut noise, &n("attn_q.weight"), matrix, EMBD, q);
            add_matrix(&mut w, &mut noise, &n("attn_k.weight"), matrix, EMBD, kv);
            add_matrix(&mut w, &mut noise, &n("attn_v.weight"), matrix, EMBD, kv);
        }
        add_matrix(&mut w, &mut noise, &n("attn_output.weight"), matrix, q, EMBD);
        if arch == "qwen2" {
            add_vector(&mut w, &n("attn_q.bias"), &noise.values(q, 0.5));
            add_vector(&mut w, &n("attn_k.bias"), &noise.values(kv, 0.5));
            add_vector(&mut w, &n("attn_v.bias"), &noise.values(kv, 0.5));
        }
        match arch {
            "qwen3" | "qwen3moe" => {
                add_vector(&mut w, &n("attn_q_norm.weight"), &noise.values(HEAD_DIM, 1.0));
                add_vector(&mut w, &n("attn_k_norm.weight"), &noise.values(HEAD_DIM, 1.0));
            }
            "olmo2" => {
                add_vector(&mut w, &n("attn_q_norm.weight"), &noise.values(q, 1.0));
                add_vector(&mut w, &n("attn_k_norm.weight"), &noise.values(kv, 1.0));
            }
            _ => {}
        }
        if matches!(arch, "olmo2" | "gemma2") {
            add_vector(&mut w, &n("post_attention_norm.weight"), &noise.values(EMBD, 1.0));
            add_vector(&mut w, &n("post_ffw_norm.weight"), &noise.values(EMBD, 1.0));
        }
        if pre_norms {
            add_vector(&mut w, &n("ffn_norm.weight"), &noise.values(EMBD, 1.0));
        }
        let experts = meta.iter().find(|(k, _)| *k == "expert_count").map(|(_, v)| match v {
            Value::U32(n) => *n as usize,
            _ => unreachable!(),
        });
        if let Some(count) = experts {
            let router: Vec<u8> = noise.values(EMBD * count, 1.0).iter().flat_map(|v| v.to_le_bytes()).collect();
            w.add_tensor(n("ffn_gate_inp.weight"), GgmlType::F32, &[EMBD as u64, count as u64], &router).unwrap();
            add_experts(&mut w, &mut noise, &n("ffn_gate_exps.weight"), matrix, EMBD, FF, count);
            add_experts(&mut w, &mut noise, &n("ffn_up_exps.weight"), matrix, EMBD, FF, count);
            add_experts(&mut w, &mut noise, &n("ffn_down_exps.weight"), matrix, FF, EMBD, count);
        } else if arch == "phi3" {
            add_matrix(&mut w, &mut noise, &n("ffn_up.weight"), matrix, EMBD, 2 * FF);
        } else {
            add_matrix(&mut w, &mut noise, &n("ffn_gate.weight"), matrix, EMBD, FF);
            add_matrix(&mut w, &mut noise, &n("ffn_up.weight"), matrix, EMBD, FF);
        }
        if experts.is_none() {
            add_matrix(&mut w, &mut noise, &n("ffn_down.weight"), matrix, FF, EMBD);
        }
    }
    if arch == "olmo2" {
        add_matrix(&mut w, &mut noise, "output.weight", GgmlType::Q8_0, EMBD, VOCAB);
    }
    for &(name, len) in vectors {
        add_vector(&mut w, name, &noise.values(len, 0.5));
    }
    w.to_bytes()
}

/// Logits of every position of each sequence, computed as one batch of all sequences.
fn logits(model: &Model, threads: usize, seqs: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let pool = model.pool(threads).unwrap();
    let total: usize = seqs.iter().map(Vec::len).sum();
    let mut kv = model.new_kv_cache(total + 64, KvType::F16);
    let ids: Vec<usize> = seqs.iter().map(|_| kv.new_seq()).collect();
    let mut scratch = Scratch::new(model, total, total, 64, threads);
    let rows: Vec<StepRow> = seqs
        .iter()
        .zip(&ids)
        .flat_map(|(s, &seq)| s.iter().enumerate().map(move |(pos, &token)| StepRow::prompt(token, pos, seq).with_logits(true)))
        .collect();
    model.forward(&pool, &mut kv, &rows, &mut scratch).unwrap();
    (0..total).map(|i| scratch.logits(i).to_vec()).collect()
}

fn check(arch: &str, matrix: GgmlType, scaling: bool) {
    check_file(arch, build(arch, matrix, scaling));
}

fn check_file(arch: &str, bytes: Vec<u8>) {
    let file = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    let flat = Model::from_gguf(file.clone()).unwrap();
    let a: Vec<u32> = vec![5, 17, 33, 2, 90, 41, 7];
    let b: Vec<u32> = vec![60, 61, 62];
    let alone = logits(&flat, 2, std::slice::from_ref(&a));
    assert_eq!(logits(&flat, 3, std::slice::from_ref(&a)), alone, "{arch}: threads changed the result");
    assert!(alone.iter().flatten().all(|v| v.is_finite()), "{arch}: non-finite logits");
    assert!(alone[0] != alone[1], "{arch}: logits do not depend on the input");
    // The same sequence inside a batch with another: identical bits.
    let batched = logits(&flat, 2, &[b.clone(), a.clone()]);
    assert_eq!(&batched[b.len()..], &alone[..], "{arch}: batch changed the result");
    // Split over 2 and 3 simulated nodes: identical bits.
    for nodes in [2usize, 3] {
        let tp = Model::from_gguf_placed(file.clone(), &TensorPlacement::tensor_parallel(Topology::simulated(nodes), nodes)).unwrap();
        assert_eq!(logits(&tp, nodes, std::slice::from_ref(&a)), alone, "{arch}: {nodes} nodes changed the result");
    }
}

#[test]
fn llama_runs_batched_and_split() {
    check("llama", GgmlType::Q4_1, false);
}

#[test]
fn llama_with_linear_rope_scaling_runs() {
    check("llama", GgmlType::Q8_0, true);
}

#[test]
fn qwen2_with_biases_runs() {
    check("qwen2", GgmlType::Q4_0, false);
}

#[test]
fn qwen3_with_qk_norms_runs() {
    check("qwen3", GgmlType::Q5_1, false);
}

#[test]
fn smollm3_without_rope_on_every_fourth_layer_runs() {
    check("smollm3", GgmlType::Q4_0, false);
}

#[test]
fn olmo2_with_whole_qk_norms_and_post_norms_only_runs() {
    // Three nodes split Q and K so that each part norms rows it only partly computed.
    check("olmo2", GgmlType::Q8_0, false);
}

#[test]
fn gemma2_with_soft_capped_scores_and_a_short_window_runs() {
    let meta = [("attention.sliding_window", Value::U32(4)), ("attn_logit_softcapping", Value::F32(3.0))];
    check_file("gemma2", build_with("gemma2", GgmlType::Q8_0, &meta, &[]));
    // The cap changes the scores' weights; a window as long as the sequence does nothing.
    let run = |meta: &[(&str, Value)]| {
        let model = Model::from_gguf(Arc::new(GgufFile::from_bytes(build_with("gemma2", GgmlType::Q8_0, meta, &[])).unwrap())).unwrap();
        logits(&model, 2, &[vec![5, 17, 33, 2, 90, 41, 7]])
    };
    let capped = run(&meta);
    assert_ne!(capped, run(&[meta[0].clone(), ("attn_logit_softcapping", Value::F32(300.0))]));
    assert_ne!(capped, run(&[("attention.sliding_window", Value::U32(7)), meta[1].clone()]));
    assert_eq!(run(&[("attention.sliding_window", Value::U32(7)), meta[1].clone()]), run(&[("attention.sliding_window", Value::U32(64)), meta[1].clone()]));
}

/// Logits of every position of `prompt`, computed `chunk` rows a step.
fn logits_in_chunks(model: &Model, threads: usize, prompt: &[u32], chunk: usize) -> Vec<Vec<f32>> {
    let pool = model.pool(threads).unwrap();
    let mut kv = model.new_kv_cache(prompt.len() + 64, KvType::F16);
    let seq = kv.new_seq();
    let mut scratch = Scratch::new(model, chunk, chunk, 64, threads);
    let mut out = Vec::new();
    for (c, tokens) in prompt.chunks(chunk).enumerate() {
        let rows: Vec<StepRow> = tokens.iter().enumerate().map(|(i, &token)| StepRow::prompt(token, c * chunk + i, seq).with_logits(true)).collect();
        model.forward(&pool, &mut kv, &rows, &mut scratch).unwrap();
        out.extend((0..rows.len()).map(|i| scratch.logits(i).to_vec()));
    }
    out
}

#[test]
fn a_prompt_longer_than_its_window_attends_rows_together_as_alone() {
    // 40 rows at 2 threads: a prompt's consecutive rows attend together (three rows of two
    // heads an item), each taking the first positions of its window alone, then the
    // positions they share (none in a window of 2), then its own last ones. Five rows a
    // step are too few to go together: each row attends alone.
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % VOCAB as u32).collect();
    // Two prompts in one step, 20 and 21 rows: an item spans both, in two runs.
    let (first, second) = (prompt[..20].to_vec(), prompt[19..].to_vec());
    for window in [2u32, 3, 4, 21] {
        let meta = [("attention.sliding_window", Value::U32(window)), ("attn_logit_softcapping", Value::F32(30.0))];
        let model = Model::from_gguf(Arc::new(GgufFile::from_bytes(build_with("gemma2", GgmlType::Q8_0, &meta, &[])).unwrap())).unwrap();
        let together = logits(&model, 2, std::slice::from_ref(&prompt));
        assert_eq!(together, logits_in_chunks(&model, 2, &prompt, 5), "window {window}");
        assert!(together.iter().flatten().all(|v| v.is_finite()));
        let both = logits(&model, 2, &[first.clone(), second.clone()]);
        let alone = [logits_in_chunks(&model, 2, &first, 5), logits_in_chunks(&model, 2, &second, 5)].concat();
        assert_eq!(both, alone, "window {window}, two prompts");
    }
}

#[test]
fn phi3_with_fused_tensors_and_rope_factors_runs() {
    let half = HEAD_DIM / 2;
    let vectors = [("rope_factors_short.weight", half), ("rope_factors_long.weight", half)];
    let meta = [("rope.scaling.original_context_length", Value::U32(64)), ("rope.scaling.attn_factor", Value::F32(1.19))];
    let bytes = || build_with("phi3", GgmlType::Q4_1, &meta, &vectors);
    check_file("phi3", bytes());
    // The long factors apply past the original context only.
    let mut model = Model::from_gguf(Arc::new(GgufFile::from_bytes(bytes()).unwrap())).unwrap();
    let seq = [vec![5u32, 17, 33, 2, 90, 41, 7]];
    let short = logits(&model, 2, &seq);
    model.fit_context(64);
    assert_eq!(logits(&model, 2, &seq), short);
    model.fit_context(65);
    let long = logits(&model, 2, &seq);
    assert_ne!(long, short);
    assert_eq!(long[0], short[0], "position 0 turns by nothing either way");
}

#[test]
fn mixtures_of_experts_run_batched_and_split() {
    // Eight experts, two per token: each row's choice (and sum) is its own whatever the
    // batch, and the same split over two and three nodes (each holding its own experts
    // whole: 4 + 4, 3 + 3 + 2).
    let moe = [("expert_count", Value::U32(8)), ("expert_used_count", Value::U32(2))];
    check_file("qwen3moe", build_with("qwen3moe", GgmlType::Q4_1, &moe, &[]));
    check_file("llama", build_with("llama", GgmlType::Q8_0, &moe, &[]));
    // One expert per token, and every expert: the softmax weights, normed.
    let all = [("expert_count", Value::U32(8)), ("expert_used_count", Value::U32(8))];
    check_file("llama", build_with("llama", GgmlType::Q4_0, &all, &[]));
    let one = [("expert_count", Value::U32(8)), ("expert_used_count", Value::U32(1))];
    check_file("llama", build_with("llama", GgmlType::Q4_0, &one, &[]));
    // Two experts over three nodes: one node holds none and only sums what the others send.
    let two = [("expert_count", Value::U32(2)), ("expert_used_count", Value::U32(2))];
    check_file("qwen3moe", build_with("qwen3moe", GgmlType::Q8_0, &two, &[]));
}

#[test]
fn experts_are_split_by_expert_and_held_whole() {
    let moe = [("expert_count", Value::U32(8)), ("expert_used_count", Value::U32(2))];
    let file = Arc::new(GgufFile::from_bytes(build_with("qwen3moe", GgmlType::Q4_1, &moe, &[])).unwrap());
    let tp = Model::from_gguf_placed(file, &TensorPlacement::tensor_parallel(Topology::simulated(3), 3)).unwrap();
    let owned: Vec<_> = tp.split.parts.iter().map(|p| p.experts.clone()).collect();
    assert_eq!(owned, [0..3, 3..6, 6..8]);
    for (part, weights) in tp.split.parts.iter().zip(&tp.parts) {
        let Ffn::Experts(ex) = &weights.layer(0).ffn else { panic!("a layer of experts") };
        assert_eq!(ex.experts.len(), part.experts.len());
        for f in &ex.experts {
            assert_eq!((f.gate.rows, f.up.rows, f.down.rows), (FF, FF, EMBD), "whole experts");
        }
    }
}

#[test]
fn k_quant_and_float_weights_run() {
    // 64-wide rows cannot hold 256-element k-quant blocks, so these use the float types.
    check("llama", GgmlType::F16, false);
    check("qwen2", GgmlType::BF16, false);
    check("llama", GgmlType::F32, false);
}

#[test]
fn rope_scaling_reads_llama_cpp_defaults_and_old_keys() {
    let run = |meta: &[(&str, Value)]| {
        let model = Model::from_gguf(Arc::new(GgufFile::from_bytes(build_with("llama", GgmlType::Q8_0, meta, &[])).unwrap())).unwrap();
        logits(&model, 2, &[vec![5, 17, 33, 2, 90, 41, 7]])
    };
    let linear = run(&[("rope.scaling.type", Value::from("linear")), ("rope.scaling.factor", Value::F32(4.0))]);
    assert_ne!(linear, run(&[]), "scaling should change the logits");
    // No type means linear; the factor may come under its old name.
    assert_eq!(run(&[("rope.scaling.factor", Value::F32(4.0))]), linear);
    assert_eq!(run(&[("rope.scale_linear", Value::F32(4.0))]), linear);
    // A factor of 0 means none.
    assert_eq!(run(&[("rope.scaling.factor", Value::F32(0.0))]), run(&[]));
}

#[test]
fn tensors_the_engine_would_not_use_are_refused() {
    let load = |arch: &str, meta: &[(&str, Value)], vectors: &[(&str, usize)]| {
        Model::from_gguf(Arc::new(GgufFile::from_bytes(build_with(arch, GgmlType::Q8_0, meta, vectors)).unwrap())).err().map(|e| e.to_string())
    };
    for (arch, tensor, len) in [("llama", "blk.0.attn_output.bias", EMBD), ("llama", "blk.1.ffn_down.bias", EMBD), ("qwen2", "output.bias", VOCAB), ("llama", "blk.0.attn_q_norm.weight", HEAD_DIM)] {
        let e = load(arch, &[], &[(tensor, len)]).unwrap_or_else(|| panic!("{arch} with {tensor} loaded"));
        assert!(e.contains(&format!("tensor '{tensor}'")), "{e}");
    }
    let e = load("qwen2", &[("expert_count", Value::U32(8)), ("expert_used_count", Value::U32(2))], &[]).expect("experts of another family are refused");
    assert!(e.contains("mixture-of-experts qwen2"), "{e}");
}

#[test]
fn per_layer_shape_arrays_are_read_when_every_layer_agrees() {
    let model = |meta: &[(&str, Value)]| Model::from_gguf(Arc::new(GgufFile::from_bytes(build_with("llama", GgmlType::Q8_0, meta, &[])).unwrap()));
    let per_layer = |v: usize| Value::Array(Array::I32(vec![v as i32; LAYERS]));
    let seq = [vec![5, 17, 33, 2, 90, 41, 7]];
    let scalar = logits(&model(&[]).unwrap(), 2, &seq);
    let arrays = model(&[
        ("feed_forward_length", per_layer(FF)),
        ("attention.head_count", per_layer(HEADS)),
        ("attention.head_count_kv", Value::Array(Array::U32(vec![KV_HEADS as u32; LAYERS]))),
    ]);
    assert_eq!(logits(&arrays.unwrap(), 2, &seq), scalar);
    let refused = |meta: &[(&str, Value)]| model(meta).err().expect("refused").to_string();
    let varying = refused(&[("attention.head_count_kv", Value::Array(Array::U32(vec![2, 4, 2, 2])))]);
    assert!(varying.contains("head_count_kv varies by layer"), "{varying}");
    let short = refused(&[("feed_forward_length", Value::Array(Array::U32(vec![FF as u32])))]);
    assert!(short.contains("1 per-layer values for 4 layers"), "{short}");
    let floats = refused(&[("attention.head_count", Value::Array(Array::F32(vec![4.0; LAYERS])))]);
    assert!(floats.contains("array[f32]"), "{floats}");
}

/// Every row's last logits, prefilling all `prompts` in one step, each with its mix.
fn logits_with(model: &Model, threads: usize, prompts: &[(Vec<u32>, Option<Arc<LoraMix>>)]) -> Vec<Vec<f32>> {
    let pool = model.pool(threads).unwrap();
    let total: usize = prompts.iter().map(|(p, _)| p.len()).sum();
    let mut kv = model.new_kv_cache(total + 64, KvType::F16);
    let mut scratch = Scratch::new(model, total, prompts.len(), 64, threads);
    let mut mixes = Vec::new();
    let mut rows = Vec::new();
    for (ids, mix) in prompts {
        let seq = kv.new_seq();
        let slot = mix.as_ref().map(|m| {
            mixes.push(m.clone());
            AdapterSlot((mixes.len() - 1) as u16)
        });
        rows.extend(ids.iter().enumerate().map(|(p, &t)| StepRow::prompt(t, p, seq).with_logits(p + 1 == ids.len()).with_adapter(slot)));
    }
    model.step(&pool, &mut kv, &Step::whole(&rows, model.cfg.n_layers).with_adapters(&mixes), &mut scratch).unwrap();
    (0..prompts.len()).map(|i| scratch.logits(i).to_vec()).collect()
}

/// A random adapter on each new family (on every projection; on attention alone for a
/// model with experts, whose FFN adapters are refused): it changes its rows, a row gets
/// alone what it gets among rows of the base model and of the adapter, and two simulated
/// nodes give the flat model's bits.
#[test]
fn adapters_on_the_new_families_do_not_depend_on_their_batch_mates() {
    use blink_model::lora::{LoraTarget, LoraTensors};
    let moe = [("expert_count", Value::U32(8)), ("expert_used_count", Value::U32(2))];
    let window = [("attention.sliding_window", Value::U32(4))];
    let cases: [(&str, &[(&str, Value)]); 5] = [("olmo2", &[]), ("gemma2", &window), ("smollm3", &[]), ("phi3", &[]), ("qwen3moe", &moe)];
    for (arch, meta) in cases {
        let file = Arc::new(GgufFile::from_bytes(build_with(arch, GgmlType::Q8_0, meta, &[])).unwrap());
        let run = |model: &Model, threads: usize| {
            let targets: &[LoraTarget] = if model.cfg.moe.is_some() { &[LoraTarget::Q, LoraTarget::K, LoraTarget::V, LoraTarget::O] } else { &LoraTarget::ALL };
            if model.cfg.moe.is_some() {
                let all = LoraTensors::random(&model.cfg, 4, 8.0, &LoraTarget::ALL, 0.05, 3);
                assert!(model.place_lora(&all).is_err(), "{arch}: an adapter on the experts' FFN is refused");
            }
            let tensors = LoraTensors::random(&model.cfg, 4, 8.0, targets, 0.05, 7);
            let mix = Arc::new(LoraMix::single(Arc::new(model.place_lora(&tensors).unwrap())));
            let prompt = |i: u32| vec![5 + i, 17, 33, 2, 90, 41, 7];
            let prompts = vec![(prompt(0), None), (prompt(0), Some(mix.clone())), (prompt(1), Some(mix.clone())), (prompt(2), None)];
            let together = logits_with(model, threads, &prompts);
            assert_ne!(together[0], together[1], "{arch}: the adapter must change its rows");
            for (i, p) in prompts.iter().enumerate() {
                assert_eq!(logits_with(model, threads, std::slice::from_ref(p))[0], together[i], "{arch}: sequence {i} alone differs");
            }
            together
        };
        let flat = run(&Model::from_gguf(file.clone()).unwrap(), 2);
        let split = Model::from_gguf_placed(file, &TensorPlacement::tensor_parallel(Topology::simulated(2), 2)).unwrap();
        assert_eq!(run(&split, 2), flat, "{arch}: two simulated nodes differ");
    }
}
