//! The continuous-batching engine on the real model: every request in a crowded batch gets
//! exactly the tokens it gets alone, with each step built while the previous one computes;
//! cancelled requests free their cache; shared prefixes are reused, to the token, with the
//! same results as computing them.

use std::sync::Arc;

use blink_engine::serve::{Engine, EngineConfig, Event, Request};
use blink_engine::{FinishReason, GenerateParams, SamplingParams, Session, SessionConfig};
use blink_model::tokenizer::Tokenizer;
use blink_model::{KvType, Model};

fn model() -> (Arc<Model>, Tokenizer) {
    let path = blink_model::fetch::ensure_default_model().unwrap();
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    (Arc::new(model), tok)
}

fn config() -> EngineConfig {
    EngineConfig {
        n_threads: 2,
        kv_tokens: 8192,
        max_seq_len: 512,
        step_tokens: 64,
        max_running: 8,
        max_queue: 64,
        kv_type: KvType::F16,
        prefix_cache: true,
    }
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { prompt, max_tokens, sampling: SamplingParams::greedy(), logprobs: None, ignore_eos: false }
}

/// Collect a submission's tokens and finish reason.
fn collect(sub: &mut blink_engine::serve::Submission) -> (Vec<u32>, FinishReason, usize) {
    let mut tokens = Vec::new();
    loop {
        match sub.blocking_next().expect("stream ends with Finished") {
            Event::Token { id, .. } => tokens.push(id),
            Event::Finished { reason, usage } => {
                assert_eq!(usage.completion_tokens, tokens.len());
                return (tokens, reason, usage.cached_tokens);
            }
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
}

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "List three animals that live in the ocean, and explain in detail how each of them breathes, eats and sleeps, with examples",
    "In 1492,",
];

#[test]
fn batched_requests_match_their_solo_runs() {
    let (model, tok) = model();
    // Solo references from a single-sequence session.
    let solo: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| {
            let mut s = Session::new(&model, &SessionConfig { n_ctx: 512, n_threads: 2, n_batch: 64, kv_type: KvType::F16 });
            let params = GenerateParams { max_tokens: Some(24), sampling: SamplingParams::greedy(), ..Default::default() };
            s.generate(&tok, &tok.encode(p, false, true), &params, &mut |_| {}).unwrap().tokens
        })
        .collect();
    let engine = Engine::start(model.clone(), tok.eog_ids().to_vec(), config());
    // All at once, so prefills and decodes of different sequences share steps.
    let mut subs: Vec<_> = PROMPTS.iter().map(|p| engine.submit(greedy(tok.encode(p, false, true), 24)).unwrap()).collect();
    for (i, sub) in subs.iter_mut().enumerate() {
        let (tokens, _, _) = collect(sub);
        assert_eq!(tokens, solo[i], "prompt {:?} differs in a batch", PROMPTS[i]);
    }
    let stats = settled(&engine);
    assert!(stats.steps_total > 0 && stats.f_ctrl() >= 0.0 && stats.f_ctrl() < 1.0);
    // Busy from the first step to the last, so every step but the first was built while
    // the one before it computed.
    assert!(stats.steps_total - stats.steps_planned_ahead <= 1, "{stats:?}");
    assert!(stats.beside_seconds_total > 0.0);
}

#[test]
fn cancelled_requests_free_their_cache_and_prefixes_are_reused() {
    let (model, tok) = model();
    let engine = Engine::start(model, tok.eog_ids().to_vec(), config());
    let system = "You are a helpful assistant. Answer briefly and precisely, and never make things up. ".repeat(3);
    let prompt = |q: &str| tok.encode(&format!("{system}{q}"), false, true);

    // First request computes the shared prefix; the second reuses it.
    let mut a = engine.submit(greedy(prompt("What is the sun?"), 4)).unwrap();
    let (_, _, cached_a) = collect(&mut a);
    let mut b = engine.submit(greedy(prompt("What is the moon?"), 4)).unwrap();
    let (_, _, cached_b) = collect(&mut b);
    assert_eq!(cached_a, 0);
    assert!(cached_b >= 32, "the shared system prompt should come from the cache, got {cached_b}");

    // A long request dropped mid-stream frees its sequence.
    let mut c = engine.submit(greedy(prompt("Tell me a long story."), 400)).unwrap();
    for _ in 0..3 {
        assert!(matches!(c.blocking_next(), Some(Event::Token { .. })));
    }
    drop(c);
    settled(&engine);
}

#[test]
fn prefixes_are_reused_to_the_token_with_the_same_results() {
    let (model, tok) = model();
    let solo = |prompt: &[u32], n: usize| {
        let mut s = Session::new(&model, &SessionConfig { n_ctx: 512, n_threads: 2, n_batch: 64, kv_type: KvType::F16 });
        let params = GenerateParams { max_tokens: Some(n), sampling: SamplingParams::greedy(), ..Default::default() };
        s.generate(&tok, prompt, &params, &mut |_| {}).unwrap().tokens
    };
    let engine = Engine::start(model.clone(), tok.eog_ids().to_vec(), config());
    let run = |prompt: &[u32]| {
        let mut sub = engine.submit(greedy(prompt.to_vec(), 12)).unwrap();
        let (tokens, _, cached) = collect(&mut sub);
        settled(&engine);
        (tokens, cached)
    };
    let first = tok.encode("The history of the bicycle begins in the early nineteenth century, when inventors in Europe tried to build a machine that a person could ride without a horse, and", false, true);
    assert!(first.len() % 16 != 0 && first.len() > 16, "the prompt should end inside a block: {}", first.len());
    let (reply, cached) = run(&first);
    assert_eq!((reply.clone(), cached), (solo(&first, 12), 0));

    // The same prompt again: everything but the last token comes from the cache, the tail
    // of the last block copied from the first request's.
    assert_eq!(run(&first), (reply.clone(), first.len() - 1));

    // Diverging inside a block: the common tokens are reused, the rest computed.
    let mut other = first.clone();
    let split = first.len() - 3;
    other.truncate(split);
    other.extend(tok.encode(" a German baron rode a wooden", false, false));
    let (tokens, cached) = run(&other);
    assert_eq!(cached, split);
    assert_eq!(tokens, solo(&other, 12));

    // A next turn: the first request's prompt and reply were published when it finished.
    let mut next = first.clone();
    next.extend(&reply);
    next.extend(tok.encode(" Tell me more.", false, false));
    let (tokens, cached) = run(&next);
    assert_eq!(cached, first.len() + reply.len() - 1, "the reply's last token was never fed back, so it is not cached");
    assert_eq!(tokens, solo(&next, 12));
}

/// Wait until the engine has nothing running and holds no cache blocks (stats are published
/// at the end of each step, just after the last events).
fn settled(engine: &Engine) -> blink_engine::serve::EngineStats {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let s = engine.stats();
        if s.running == 0 && s.kv_blocks_used == 0 {
            return s;
        }
        assert!(std::time::Instant::now() < deadline, "the engine still holds work or cache: {s:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn oversized_and_invalid_requests_are_refused() {
    let (model, tok) = model();
    let engine = Engine::start(model, tok.eog_ids().to_vec(), config());
    assert!(engine.submit(greedy(vec![], 4)).is_err());
    assert!(engine.submit(greedy(vec![1; 500], 100)).is_err());
    assert!(engine.submit(greedy(vec![1, 2], 0)).is_err());
    let bad = Request { sampling: SamplingParams { top_p: 7.0, ..SamplingParams::greedy() }, ..greedy(vec![1, 2], 4) };
    assert!(engine.submit(bad).is_err());
}
