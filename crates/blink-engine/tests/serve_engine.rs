//! The continuous-batching engine on the real model: every request in a crowded batch gets
//! exactly the tokens it gets alone, with each step built while the previous one computes;
//! cancelled requests free their cache; shared prefixes are reused, to the token, with the
//! same results as computing them, even by requests that arrive while the prefix computes;
//! a request that arrives while a step computes joins the next one; the queue bound counts
//! only requests that must wait; a prompt moves on however many sequences decode; a request
//! that needs the whole cache is served on a cached prefix.

mod support;

use blink_engine::serve::{Engine, EngineConfig, Request, SubmitError};
use blink_engine::SamplingParams;
use support::{collect, collect_watched, config, greedy, model, next_is_token, settled, solo};

#[test]
fn batched_requests_match_their_solo_runs() {
    let (model, tok) = model();
    let stats = support::batched_requests_match_their_solo_runs(model, &tok);
    assert!(stats.steps_total > 0 && stats.f_ctrl() >= 0.0 && stats.f_ctrl() < 1.0);
    // Busy from the first step to the last, so every step but the first was built while
    // the one before it computed.
    assert!(stats.steps_total - stats.steps_planned_ahead <= 1, "{stats:?}");
    assert!(stats.beside_seconds_total > 0.0);
}

#[test]
fn cancelled_requests_free_their_cache_and_prefixes_are_reused() {
    let (model, tok) = model();
    let engine = Engine::start(model, tok.eog_ids().to_vec(), config()).unwrap();
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
        assert!(next_is_token(&mut c));
    }
    drop(c);
    settled(&engine);
}

#[test]
fn prefixes_are_reused_to_the_token_with_the_same_results() {
    let (model, tok) = model();
    let solo = |prompt: &[u32], n: usize| solo(&model, &tok, prompt, n);
    let engine = Engine::start(model.clone(), tok.eog_ids().to_vec(), config()).unwrap();
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

#[test]
fn a_burst_sharing_a_system_prompt_computes_it_once() {
    let (model, tok) = model();
    let system = "You are a careful assistant who answers in one short sentence and never guesses. ".repeat(6);
    let questions = ["Why is the sky blue?", "What makes rain fall?", "Name a red planet.", "Why is the sky blue?"];
    let prompts: Vec<Vec<u32>> = questions.iter().map(|q| tok.encode(&format!("{system}{q}"), false, true)).collect();
    let common = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    assert!(common(&prompts[0], &prompts[1]) > 64, "the system prompt should span more than a step's prompt budget");

    let solo = |prompt: &[u32]| solo(&model, &tok, prompt, 8);
    let engine = Engine::start(model.clone(), tok.eog_ids().to_vec(), config()).unwrap();
    // All at once: the first prompt takes two steps to compute, long before it is done the
    // others have arrived, and they wait for it rather than compute the system prompt again.
    let mut subs: Vec<_> = prompts.iter().map(|p| engine.submit(greedy(p.clone(), 8)).unwrap()).collect();
    let results: Vec<_> = subs.iter_mut().map(collect).collect();
    assert_eq!(results[0].2, 0);
    for i in 1..3 {
        assert_eq!(results[i].2, common(&prompts[i], &prompts[0]), "request {i} should attach the system prompt");
    }
    // The repeated question attaches all of the first request's prompt but the last token.
    assert_eq!(results[3].2, prompts[3].len() - 1);
    for (i, (tokens, _, _)) in results.iter().enumerate() {
        assert_eq!(tokens, &solo(&prompts[i]), "request {i} differs from its solo run");
    }
    settled(&engine);
}

#[test]
fn a_request_waiting_on_a_cancelled_prompt_still_runs() {
    let (model, tok) = model();
    let system = "You are a careful assistant who answers in one short sentence and never guesses. ".repeat(6);
    let leader = tok.encode(&format!("{system}Tell me a long story about the sea."), false, true);
    let follower = tok.encode(&format!("{system}What makes rain fall?"), false, true);
    let solo = solo(&model, &tok, &follower, 8);

    let engine = Engine::start(model.clone(), tok.eog_ids().to_vec(), config()).unwrap();
    for _ in 0..3 {
        // The follower waits for the leader's prompt, whose client then goes away: the
        // follower must still run, and give its own reply.
        let lead = engine.submit(greedy(leader.clone(), 50)).unwrap();
        let mut follow = engine.submit(greedy(follower.clone(), 8)).unwrap();
        drop(lead);
        assert_eq!(collect(&mut follow).0, solo);
    }
    settled(&engine);
}

#[test]
fn requests_arriving_mid_step_join_the_next_step() {
    let (model, tok) = model();
    let prompts = ["The tallest mountain on Earth is", "A recipe for bread needs", "The planets of the solar system are"];
    let prompts: Vec<Vec<u32>> = prompts.iter().map(|p| tok.encode(p, false, true)).collect();
    let solos: Vec<Vec<u32>> = prompts.iter().map(|p| solo(&model, &tok, p, 10)).collect();
    let engine = Engine::start(model.clone(), tok.eog_ids().to_vec(), config()).unwrap();
    // A long request keeps a step computing at any moment; the others arrive while one
    // does. A token event goes out as a step starts, just before the plan beside it takes
    // the requests that have arrived; once that plan's statistics are published (they count
    // one more finished step), the step computes, and a request submitted then is late.
    let long = greedy(tok.encode("Write a long story about a lighthouse keeper.", false, true), 200);
    let mut lead = engine.submit(Request { ignore_eos: true, ..long }).unwrap();
    let mut subs = Vec::new();
    for prompt in &prompts {
        assert!(next_is_token(&mut lead));
        let steps = engine.stats().steps_total;
        let deadline = std::time::Instant::now() + support::STUCK;
        while engine.stats().steps_total == steps {
            assert!(std::time::Instant::now() < deadline, "no step for {:?}: {:?}", support::STUCK, engine.stats());
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        subs.push(engine.submit(greedy(prompt.clone(), 10)).unwrap());
    }
    for (sub, solo) in subs.iter_mut().zip(&solos) {
        assert_eq!(&collect(sub).0, solo);
    }
    drop(lead);
    let stats = settled(&engine);
    assert!(stats.requests_admitted_late > 0, "no request was admitted between steps: {stats:?}");
}

#[test]
fn oversized_and_invalid_requests_are_refused() {
    let (model, tok) = model();
    let engine = Engine::start(model, tok.eog_ids().to_vec(), config()).unwrap();
    // The cache's size is published before any request.
    assert_eq!(engine.stats().kv_blocks_total * 16, 8192, "{:?}", engine.stats());
    assert!(engine.submit(greedy(vec![], 4)).is_err());
    assert!(engine.submit(greedy(vec![1; 500], 100)).is_err());
    assert!(engine.submit(greedy(vec![1, 2], 0)).is_err());
    let bad = Request { sampling: SamplingParams { top_p: 7.0, ..SamplingParams::greedy() }, ..greedy(vec![1, 2], 4) };
    assert!(engine.submit(bad).is_err());
}

/// A request that decodes for a long time (end-of-generation ignored).
fn long(prompt: Vec<u32>) -> Request {
    Request { ignore_eos: true, ..greedy(prompt, 400) }
}

#[test]
fn the_queue_bound_counts_only_requests_that_must_wait() {
    let (model, tok) = model();
    let cfg = EngineConfig { max_queue: 1, ..config() };
    let engine = Engine::start(model, tok.eog_ids().to_vec(), cfg.clone()).unwrap();
    let prompt = tok.encode("Write a long story about a lighthouse keeper.", false, true);
    // A burst as large as the free slots is taken whole, however short the queue.
    let mut running: Vec<_> = (0..cfg.max_running).map(|_| engine.submit(long(prompt.clone())).unwrap()).collect();
    for sub in &mut running {
        assert!(next_is_token(sub));
    }
    // Every slot is busy: one request may wait, the next is refused.
    let queued = engine.submit(long(prompt.clone())).unwrap();
    assert_eq!(engine.submit(long(prompt.clone())).err(), Some(SubmitError::QueueFull(1)));
    drop(queued);
    drop(running);
    settled(&engine);
}

#[test]
fn a_prompt_moves_on_while_more_sequences_decode_than_a_step_holds() {
    let (model, tok) = model();
    let prompt = tok.encode("The history of the bicycle begins in the early nineteenth century, when", false, true);
    let reply = solo(&model, &tok, &prompt, 6);
    // Six decode rows fill a four-token step.
    let cfg = EngineConfig { step_tokens: 4, ..config() };
    let engine = Engine::start(model, tok.eog_ids().to_vec(), cfg).unwrap();
    let story = tok.encode("Once upon a time", false, true);
    let mut decoding: Vec<_> = (0..6).map(|_| engine.submit(long(story.clone())).unwrap()).collect();
    for sub in &mut decoding {
        assert!(next_is_token(sub));
    }
    let mut sub = engine.submit(greedy(prompt, 6)).unwrap();
    assert_eq!(collect(&mut sub).0, reply);
    // It finished long before the others could have (the stats may still count it: they
    // are published after its last event).
    assert!(engine.stats().running >= 6, "{:?}", engine.stats());
    drop(decoding);
    settled(&engine);
}

#[test]
fn a_request_needing_the_whole_cache_runs_on_a_cached_prefix() {
    let (model, tok) = model();
    // One sequence's context is the whole cache.
    let cfg = EngineConfig { kv_tokens: 512, max_seq_len: 512, max_running: 1, ..config() };
    let engine = Engine::start(model, tok.eog_ids().to_vec(), cfg).unwrap();
    let prompt = tok.encode("The history of the bicycle begins in the early nineteenth century, when", false, true);
    assert!(prompt.len() % 16 != 0, "the prompt should end inside a block");
    let request = greedy(prompt.clone(), 512 - prompt.len());
    // A request that is never served fails here instead of hanging: each event must come
    // within `STUCK` of the one before, however long the whole request takes.
    let run = |request: Request| collect_watched(engine.submit(request).unwrap());
    let first = run(request.clone());
    // Again: its prompt is cached now, and attaching it must not keep it from the cache.
    let again = run(request);
    assert_eq!(again.0, first.0);
    settled(&engine);
}
