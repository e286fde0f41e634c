//! The opt-in block dot order (`--dot-order block`) on the real model, in its own process
//! since the order is fixed once per process: a request's tokens still do not depend on
//! what else is in the batch, and generation is still deterministic.

mod support;

use blink_kernels::order::{self, DotOrder};

#[test]
fn block_order_keeps_batch_invariance_and_determinism() {
    order::force(DotOrder::Block).unwrap();
    let (model, tok) = support::model();
    assert_eq!(order::active(), DotOrder::Block);
    support::batched_requests_match_their_solo_runs(model.clone(), &tok);
    // The same request twice, alone, gives the same tokens.
    let engine = blink_engine::serve::Engine::start(model, tok.eog_ids().to_vec(), support::config()).unwrap();
    let prompt = tok.encode(support::PROMPTS[1], false, true);
    let runs: Vec<_> = (0..2).map(|_| support::collect(&mut engine.submit(support::greedy(prompt.clone(), 24)).unwrap()).0).collect();
    assert_eq!(runs[0], runs[1]);
}
