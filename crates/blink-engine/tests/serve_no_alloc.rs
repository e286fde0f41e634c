//! The serving engine's steady state allocates nothing: once a batch of requests is
//! decoding, whole steps (planning, the forward pass, sampling, sending each token) make
//! no heap allocation (a request asking for log-probabilities gets a list of them per
//! token, which does), with or without adapters. Checked with a counting global allocator,
//! which counts every thread: this file holds one test, so nothing else runs beside it.

mod support;

use std::sync::Arc;

use blink_engine::serve::{Engine, Submission};
use blink_model::lora::LoraMix;
use blink_runtime::alloc_count::{count_allocations, CountingAlloc};
use support::{config, greedy, model, next_is_token};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Takes `n` tokens from each submission, in turn.
fn take_tokens(subs: &mut [Submission], n: usize) {
    for _ in 0..n {
        for sub in subs.iter_mut() {
            assert!(next_is_token(sub), "the request ended early");
        }
    }
}

/// Four long requests decoding together, each under `adapters[i % len]` (`None`: base):
/// no heap allocation on any thread over 200 of their steps, after a warm-up.
fn decoding_allocates_nothing(adapters: &[Option<Arc<LoraMix>>], model: Arc<blink_model::Model>, tok: &blink_text::Tokenizer) {
    let engine = Engine::start(model, tok.eog_ids().to_vec(), config()).unwrap();
    let prompts = ["Tell me a long story about a dragon.", "List the planets.", "Write a poem about rain.", "Explain tides."];
    let mut subs: Vec<Submission> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut request = greedy(tok.encode(p, false, true), 400);
            request.ignore_eos = true;
            request.adapter = adapters[i % adapters.len()].clone();
            engine.submit(request).unwrap()
        })
        .collect();
    // Warm up: every request admitted, prompts done, channels and buffers at size.
    take_tokens(&mut subs, 60);
    let ((), counted) = count_allocations(|| take_tokens(&mut subs, 200));
    assert_eq!(counted.allocs, 0, "{} allocations over 200 steps of 4 sequences; the first of {} bytes", counted.allocs, counted.first_size);
}

/// One test, so nothing else runs beside the counting (the harness's own messages
/// included): the base model's batch first, then a batch over two adapters and the base.
#[test]
fn decoding_steps_of_a_batch_do_not_allocate_with_or_without_adapters() {
    let (model, tok) = model();
    decoding_allocates_nothing(&[None], model.clone(), &tok);
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/lora");
    let r8 = Arc::new(LoraMix::single(Arc::new(model.load_lora(&golden.join("adapter-r8")).unwrap())));
    let r4 = Arc::new(LoraMix::single(Arc::new(model.load_lora(&golden.join("adapter-r4-qv")).unwrap())));
    decoding_allocates_nothing(&[Some(r8), None, Some(r4)], model, &tok);
}
