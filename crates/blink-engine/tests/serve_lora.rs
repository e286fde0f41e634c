//! The serving engine with LoRA adapters, on the real model and the golden PEFT/llama.cpp
//! adapters: eight concurrent requests over three adapters (one a stack of two) and the
//! base model each get, token for token, what they get alone in a session, flat and on two
//! simulated NUMA nodes, and also when a step may hold only one adapter mix (the others
//! wait); the prefix cache gives a prompt's blocks only to requests under the same adapter.

mod support;

use std::path::PathBuf;
use std::sync::Arc;

use blink_engine::serve::{Engine, EngineConfig, Request};
use blink_engine::{GenerateParams, SamplingParams, Session, SessionConfig};
use blink_gguf::GgufFile;
use blink_model::lora::LoraMix;
use blink_model::{KvType, Model, TensorPlacement};
use blink_runtime::numa::Topology;
use blink_text::tokenizer::Tokenizer;
use support::{collect, collect_watched, config, greedy, settled, PROMPTS};

const MAX_TOKENS: usize = 16;

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/lora").join(name)
}

/// The three adapter mixes every test uses, placed on `model`: the r=8 PEFT adapter on
/// all seven projections, the r=4 q/v adapter from its llama.cpp GGUF, and both stacked
/// at other scales.
fn mixes(model: &Model) -> [Option<Arc<LoraMix>>; 4] {
    let r8 = Arc::new(model.load_lora(&golden("adapter-r8")).unwrap());
    let r4 = Arc::new(model.load_lora(&golden("gguf/adapter-r4-qv.f32.gguf")).unwrap());
    let stacked = LoraMix::new([(r8.clone(), 0.5), (r4.clone(), 1.5)]);
    [None, Some(Arc::new(LoraMix::single(r8))), Some(Arc::new(LoraMix::single(r4))), Some(Arc::new(stacked))]
}

fn with_adapter(prompt: Vec<u32>, max_tokens: usize, adapter: &Option<Arc<LoraMix>>) -> Request {
    Request { adapter: adapter.clone(), ..greedy(prompt, max_tokens) }
}

/// The greedy tokens of `prompt` under `adapter` in a single-sequence session.
fn alone(model: &Model, tok: &Tokenizer, prompt: &[u32], adapter: &Option<Arc<LoraMix>>) -> Vec<u32> {
    let mut s = Session::new(model, &SessionConfig { n_ctx: 512, n_threads: 2, n_batch: 64, kv_type: KvType::F16, swa_full: false }).unwrap();
    s.set_adapter(adapter.clone()).unwrap();
    let params = GenerateParams { max_tokens: Some(MAX_TOKENS), sampling: SamplingParams::greedy(), ..Default::default() };
    s.generate(tok, prompt, &params, &mut |_| {}).unwrap().tokens
}

/// Submit the eight prompts at once, prompt `i` under mix `(i + i / 4) % 4` (so every
/// prompt meets every mix somewhere), and check each against its run alone.
fn eight_requests_match_alone(model: Arc<Model>, tok: &Tokenizer, cfg: EngineConfig) {
    let mixes = mixes(&model);
    let work: Vec<(Vec<u32>, &Option<Arc<LoraMix>>)> =
        PROMPTS.iter().enumerate().map(|(i, p)| (tok.encode(p, false, true), &mixes[(i + i / 4) % 4])).collect();
    let expected: Vec<Vec<u32>> = work.iter().map(|(p, m)| alone(&model, tok, p, m)).collect();
    // The adapters must show in the tokens (a prompt may sit where they change nothing
    // within 16 greedy tokens, so this asks it of several, not of one).
    let changed = work.iter().zip(&expected).filter(|((p, m), e)| m.is_some() && alone(&model, tok, p, &None) != **e).count();
    assert!(changed >= 3, "the adapters change the greedy tokens of only {changed} of the 6 prompts that run under one");

    let engine = Engine::start(model, tok.eog_ids().to_vec(), cfg).unwrap();
    let subs: Vec<_> = work.iter().map(|(p, m)| engine.submit(with_adapter(p.clone(), MAX_TOKENS, m)).unwrap()).collect();
    for (i, sub) in subs.into_iter().enumerate() {
        let (tokens, _, _) = collect_watched(sub);
        assert_eq!(tokens, expected[i], "prompt {i} ({:?}) in the batch differs from alone", PROMPTS[i]);
    }
    settled(&engine);
}

#[test]
fn requests_over_three_adapters_and_the_base_match_their_runs_alone() {
    let (model, tok) = support::model();
    eight_requests_match_alone(model, &tok, config());
}

#[test]
fn with_one_adapter_mix_per_step_the_others_wait_and_still_match() {
    let (model, tok) = support::model();
    eight_requests_match_alone(model, &tok, EngineConfig { max_loras: 1, ..config() });
}

#[test]
fn on_two_simulated_nodes_requests_over_adapters_match_their_runs_alone() {
    let path = blink_model::fetch::ensure_default_model().unwrap();
    let placement = TensorPlacement::tensor_parallel(Topology::simulated(2), 2);
    let model = Model::from_gguf_placed(Arc::new(GgufFile::open(&path).unwrap()), &placement).unwrap();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    eight_requests_match_alone(Arc::new(model), &tok, config());
}

#[test]
fn the_prefix_cache_never_gives_one_adapters_blocks_to_another() {
    let (model, tok) = support::model();
    let [base, r8, r4, _] = mixes(&model);
    // The same file placed again is another adapter as far as the cache knows.
    let r8_again = Some(Arc::new(LoraMix::single(Arc::new(model.load_lora(&golden("adapter-r8")).unwrap()))));
    let system = "You are a helpful assistant. Answer briefly and precisely, and never make things up. ".repeat(3);
    let prompt = tok.encode(&format!("{system}What is the moon?"), false, true);
    let expected = |m: &Option<Arc<LoraMix>>| alone(&model, &tok, &prompt, m);
    let engine = Engine::start(model.clone(), tok.eog_ids().to_vec(), config()).unwrap();
    let run = |m: &Option<Arc<LoraMix>>| {
        let mut sub = engine.submit(with_adapter(prompt.clone(), MAX_TOKENS, m)).unwrap();
        let (tokens, _, cached) = collect(&mut sub);
        settled(&engine);
        (tokens, cached)
    };
    let (first, cached) = run(&r8);
    assert_eq!((first, cached), (expected(&r8), 0));
    for (name, m) in [("base", &base), ("r4", &r4), ("r8 placed again", &r8_again)] {
        let (tokens, cached) = run(m);
        assert_eq!(cached, 0, "{name} attached blocks computed under r8");
        assert_eq!(tokens, expected(m), "{name}");
    }
    let (tokens, cached) = run(&r8);
    assert!(cached >= 32, "r8's own prompt should come from the cache, got {cached}");
    assert_eq!(tokens, expected(&r8));
}
