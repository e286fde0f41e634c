//! Helpers shared by the engine's tests on the real model.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use blink_engine::serve::{Engine, EngineConfig, Event, Request, SloTargets, TrainingPolicy};
use blink_engine::{FinishReason, GenerateParams, SamplingParams, Session, SessionConfig};
use blink_model::{KvType, Model};
use blink_text::tokenizer::Tokenizer;

pub fn model() -> (Arc<Model>, Tokenizer) {
    let path = blink_model::fetch::ensure_default_model().unwrap();
    let model = Model::load(&path).unwrap();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    (Arc::new(model), tok)
}

pub fn config() -> EngineConfig {
    EngineConfig {
        n_threads: 2,
        kv_tokens: 8192,
        max_seq_len: 512,
        step_tokens: 64,
        max_running: 8,
        max_queue: 64,
        kv_type: KvType::F16,
        swa_full: false,
        prefix_cache: true,
        prefix_cache_tokens: None,
        max_loras: 4,
        slo: SloTargets::default(),
        training: TrainingPolicy::default(),
        latency: None,
    }
}

pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { prompt, max_tokens, sampling: SamplingParams::greedy(), logprobs: None, ignore_eos: false, adapter: None }
}

/// The first `max_tokens` greedy tokens of `prompt` from a single-sequence session: the
/// reference a served request must equal.
pub fn solo(model: &Model, tok: &Tokenizer, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut s = Session::new(model, &SessionConfig { n_ctx: 512, n_threads: 2, n_batch: 64, kv_type: KvType::F16, swa_full: false }).unwrap();
    let params = GenerateParams { max_tokens: Some(max_tokens), sampling: SamplingParams::greedy(), ..Default::default() };
    s.generate(tok, prompt, &params, &mut |_| {}).unwrap().tokens
}

/// The next token event of a submission (skipping its admission); `false` if the next
/// event is not a token.
pub fn next_is_token(sub: &mut blink_engine::serve::Submission) -> bool {
    loop {
        match sub.blocking_next() {
            Some(Event::Admitted { .. }) => continue,
            e => return matches!(e, Some(Event::Token { .. })),
        }
    }
}

/// How long a test waits for the engine to show any progress (an event, a change of state)
/// before it calls the engine stuck. Only a safety net: waits follow the engine's events and
/// state, and a busy or slow machine makes progress slower, never stop; this is many times
/// what the slowest step takes on a machine three times slower than a loaded CI machine.
pub const STUCK: Duration = Duration::from_secs(120);

/// Collect a submission's tokens and finish reason.
pub fn collect(sub: &mut blink_engine::serve::Submission) -> (Vec<u32>, FinishReason, usize) {
    collect_events(|| sub.blocking_next())
}

/// As [`collect`], but failing if the engine sends no event for [`STUCK`] (a request that
/// is never served fails the test instead of hanging it). The request may take as long as
/// it needs, as long as its events keep coming.
pub fn collect_watched(sub: blink_engine::serve::Submission) -> (Vec<u32>, FinishReason, usize) {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut sub = sub;
    std::thread::spawn(move || loop {
        let event = sub.blocking_next();
        let last = !matches!(event, Some(Event::Admitted { .. } | Event::Token { .. }));
        if tx.send(event).is_err() || last {
            return;
        }
    });
    let mut seen = 0;
    collect_events(|| {
        let event = rx.recv_timeout(STUCK).unwrap_or_else(|_| panic!("no event from the engine for {STUCK:?} after {seen} events: it is stuck"));
        seen += 1;
        event
    })
}

fn collect_events(mut next: impl FnMut() -> Option<Event>) -> (Vec<u32>, FinishReason, usize) {
    let mut tokens = Vec::new();
    loop {
        match next().expect("stream ends with Finished") {
            Event::Admitted { .. } => {}
            Event::Token { id, .. } => tokens.push(id),
            Event::Finished { reason, usage } => {
                assert_eq!(usage.completion_tokens, tokens.len());
                return (tokens, reason, usage.cached_tokens);
            }
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
}

pub const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "List three animals that live in the ocean, and explain in detail how each of them breathes, eats and sleeps, with examples",
    "In 1492,",
];

/// Submit every prompt of [`PROMPTS`] at once, so prefills and decodes of different
/// sequences share steps, and check each gets exactly the greedy tokens of a solo
/// session. Returns the engine's settled statistics.
pub fn batched_requests_match_their_solo_runs(model: Arc<Model>, tok: &Tokenizer) -> blink_engine::serve::EngineStats {
    // Solo references from a single-sequence session.
    let solo: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| solo(&model, tok, &tok.encode(p, false, true), 24))
        .collect();
    let engine = Engine::start(model.clone(), tok.eog_ids().to_vec(), config()).unwrap();
    let mut subs: Vec<_> = PROMPTS.iter().map(|p| engine.submit(greedy(tok.encode(p, false, true), 24)).unwrap()).collect();
    for (i, sub) in subs.iter_mut().enumerate() {
        let (tokens, _, _) = collect(sub);
        assert_eq!(tokens, solo[i], "prompt {:?} differs in a batch", PROMPTS[i]);
    }
    settled(&engine)
}

/// Wait until the engine has nothing running and holds no cache blocks (stats are published
/// at the end of each step, just after the last events; settling takes a step or two).
pub fn settled(engine: &Engine) -> blink_engine::serve::EngineStats {
    let deadline = Instant::now() + STUCK;
    loop {
        let s = engine.stats();
        if s.running == 0 && s.kv_blocks_used == 0 {
            return s;
        }
        assert!(Instant::now() < deadline, "the engine still holds work or cache after {STUCK:?}: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}


/// llama.cpp's reference for the default model from the build of `flavour`
/// (testdata/golden: `.json` the AVX-512 build's, `.avx2.json` the AVX2 build's).
pub fn golden(flavour: blink_kernels::flavour::Flavour) -> serde_json::Value {
    let name = match flavour {
        blink_kernels::flavour::Flavour::Avx512 => "smollm2-135m-instruct-q4_1.json",
        blink_kernels::flavour::Flavour::Avx2 => "smollm2-135m-instruct-q4_1.avx2.json",
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Greedy generation of each case of `flavour`'s reference gives llama.cpp's ids, at
/// least up to the owed prefix; reports how far the two engines keep agreeing.
pub fn greedy_ids_match_llama_cpp(flavour: blink_kernels::flavour::Flavour) {
    let (model, tok) = model();
    let cfg = SessionConfig { n_ctx: 256, n_threads: 2, n_batch: 64, kv_type: KvType::F16, swa_full: false };
    let mut report = Vec::new();
    for case in golden(flavour)["greedy"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        assert_eq!(tok.encode(case["prompt"].as_str().unwrap(), true, true), prompt);
        let want = ids(&case["ids"]);
        let owed = case["exact_tokens_owed"].as_u64().unwrap() as usize;
        let mut session = Session::new(&model, &cfg).unwrap();
        let params = GenerateParams { max_tokens: Some(want.len()), sampling: SamplingParams::greedy(), ..Default::default() };
        let g = session.generate(&tok, &prompt, &params, &mut |_| {}).unwrap();
        // llama.cpp's ids end with EOS when it stopped there; ours leave it out.
        let mut got = g.tokens.clone();
        if g.finish == FinishReason::Stop && want.last() == tok.eos().as_ref() {
            got.push(tok.eos().unwrap());
        }
        let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        report.push(format!("{:?}: {agree}/{} tokens agree (owed {owed})", case["prompt"].as_str().unwrap(), want.len()));
        assert!(agree >= owed, "{flavour}: prompt {:?}: only {agree} tokens agree, {owed} owed\n got  {got:?}\n want {want:?}", case["prompt"]);
    }
    eprintln!("{} ({flavour} flavour):\n{}", flavour.build(), report.join("\n"));
}
