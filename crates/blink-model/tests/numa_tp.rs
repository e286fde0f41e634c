//! Tensor parallelism over simulated NUMA nodes gives bit-identical results to the flat
//! model: every part computes whole dot products of its rows, so logits match exactly and
//! greedy output on every golden prompt is the same. Node-local memory really is local.

use std::path::Path;
use std::sync::Arc;

use blink_gguf::GgufFile;
use blink_model::{KvType, Model, TensorPlacement, Scratch, StepRow};
use blink_runtime::numa::Topology;

fn golden_prompts() -> Vec<Vec<u32>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/smollm2-135m-instruct-q4_1.json");
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    g["greedy"].as_array().unwrap().iter().map(|c| c["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()).collect()
}

fn file() -> Arc<GgufFile> {
    Arc::new(GgufFile::open(blink_model::fetch::ensure_default_model().unwrap()).unwrap())
}

/// Greedy decode of `prompt` for `n` tokens; returns the tokens and every step's logits.
fn greedy(model: &Model, threads: usize, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let pool = model.pool(threads).unwrap();
    let mut kv = model.new_kv_cache(256, KvType::F16);
    let seq = kv.new_seq();
    let mut scratch = Scratch::new(model, 64, 1, 256, threads);
    let rows: Vec<StepRow> = prompt.iter().enumerate().map(|(pos, &token)| StepRow::prompt(token, pos, seq).with_logits(pos + 1 == prompt.len())).collect();
    model.forward(&pool, &mut kv, &rows, &mut scratch).unwrap();
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    for i in 0..n {
        let logits = scratch.logits(0).to_vec();
        let t = blink_model_argmax(&logits);
        all.push(logits);
        tokens.push(t);
        let row = StepRow::decode(t, prompt.len() + i, seq);
        model.forward(&pool, &mut kv, &[row], &mut scratch).unwrap();
    }
    (tokens, all)
}

fn blink_model_argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn simulated_nodes_match_the_flat_model_bit_for_bit() {
    let file = file();
    let flat = Model::from_gguf(file.clone()).unwrap();
    let prompts = golden_prompts();
    let reference: Vec<_> = prompts.iter().map(|p| greedy(&flat, 2, p, 32)).collect();
    for nodes in [2usize, 3] {
        let placement = TensorPlacement::tensor_parallel(Topology::simulated(nodes), nodes);
        let tp = Model::from_gguf_placed(file.clone(), &placement).unwrap();
        assert_eq!(tp.parts.len(), nodes);
        // Every head, row and vocabulary entry belongs to some part.
        let heads: usize = tp.split.parts.iter().map(|p| p.q_heads.len()).sum();
        assert_eq!(heads, tp.cfg.n_head);
        for (p, (want_tokens, want_logits)) in prompts.iter().zip(&reference) {
            let (tokens, logits) = greedy(&tp, nodes, p, 32);
            assert_eq!(&tokens, want_tokens, "{nodes} nodes: greedy output differs for prompt {p:?}");
            for (step, (a, b)) in logits.iter().zip(want_logits).enumerate() {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{nodes} nodes: logits differ at step {step} of prompt {p:?}");
            }
        }
    }
}

#[test]
fn column_parallel_shards_are_bit_identical_to_the_unsplit_rows() {
    // The parts' rows of each projection, multiplied alone, equal the same rows of the
    // whole matrix: shards are exact slices (checked through the weights' bytes per row).
    let file = file();
    let flat = Model::from_gguf(file.clone()).unwrap();
    let tp = Model::from_gguf_placed(file, &TensorPlacement::tensor_parallel(Topology::simulated(3), 3)).unwrap();
    let total_rows: usize = tp.parts.iter().map(|w| w.layer(0).dense().gate.rows).sum();
    assert_eq!(total_rows, flat.parts[0].layer(0).dense().gate.rows);
    let bytes: usize = tp.bytes_per_token_by_part().iter().sum();
    // Neighbouring parts may each hold a shared key/value head; nothing else is duplicated.
    assert!(bytes >= flat.bytes_per_token() && bytes < flat.bytes_per_token() * 11 / 10);
}

#[test]
fn every_page_of_each_part_lives_on_its_node() {
    // On a real topology every part's weights are copied into memory bound to its node.
    // This machine has one node, so every page must report node 0; on a multi-node machine
    // the same test checks each node's part.
    let topology = Topology::detect();
    let nodes = topology.nodes().len();
    let placement = TensorPlacement::tensor_parallel(topology.clone(), nodes);
    let model = Model::from_gguf_placed(file(), &placement).unwrap();
    let page = blink_runtime::numa::page_size();
    let mut checked = 0;
    for (i, part) in model.parts.iter().enumerate() {
        let want = topology.nodes()[i].id as i32;
        for m in part.product_matrices() {
            let bytes = m.bytes();
            let first = (bytes.as_ptr() as usize).next_multiple_of(page);
            let end = bytes.as_ptr() as usize + bytes.len();
            for addr in (first..end).step_by(page) {
                match blink_runtime::numa::node_of_page(addr as *const u8) {
                    Some(node) => {
                        assert_eq!(node, want, "part {i}: a page of {} is on node {node}, not {want}", m.name);
                        checked += 1;
                    }
                    None => panic!("this kernel does not report page placement (move_pages/get_mempolicy refused)"),
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} pages checked");
}
