//! Updating: a step's output folded back into its sequences. Every row's sequence counts
//! it computed; where a row has logits, its sequence samples a token (which is queued to
//! its client), finishes on an end-of-generation token or its length limit, and a prompt
//! just completed is published to the prefix cache.

use blink_model::kv_cache::KvCache;
use blink_model::Scratch;

use super::api::{Event, TokenLogprobs};
use super::plan::StepPlan;
use super::schedule::Scheduler;
use crate::session::FinishReason;

impl Scheduler {
    /// Fold the output of `plan`'s step (its logits in `scratch`) back in; `eog` are the
    /// end-of-generation tokens, sorted. The events go out beside the next step.
    pub(super) fn update(&mut self, plan: &StepPlan, kv: &mut KvCache, scratch: &mut Scratch, eog: &[u32]) {
        let prefix_cache = self.cfg.prefix_cache;
        let max_seq_len = self.cfg.max_seq_len;
        let mut j = 0;
        for row in &plan.rows {
            let i = self.index(row.seq);
            let seq = &mut self.running[i];
            seq.computed_row();
            if !row.logits {
                continue;
            }
            let logits = scratch.logits_mut(j);
            j += 1;
            if seq.finished().is_some() {
                continue; // cancelled while the step ran
            }
            if seq.computed == seq.n_prompt && seq.generated == 0 && prefix_cache {
                let _ = kv.publish_prefix(seq.kv, &seq.tokens[..seq.n_prompt]);
            }
            seq.sampler.penalize(logits);
            let token = seq.sampler.pick(logits);
            seq.sampler.accept(token);
            if !seq.ignore_eos && eog.binary_search(&token).is_ok() {
                seq.finish(FinishReason::Stop);
                continue;
            }
            let logprobs = seq.logprobs.map(|top| token_logprobs(logits, token, top));
            self.outbox.push((seq.kv, Event::Token { id: token, logprobs }));
            seq.sampled(token);
            if seq.generated >= seq.max_tokens || seq.tokens.len() >= max_seq_len {
                seq.finish(FinishReason::Length);
            }
        }
    }

    /// `plan`'s step did not run because the devices' caches were emptied first: its
    /// sequences, all new, start again from their first token (what they reused of the
    /// prefix cache is gone), and the others' prompts are planned again.
    pub(super) fn restart(&mut self, plan: &StepPlan, kv: &mut KvCache) {
        for row in &plan.rows {
            let i = self.index(row.seq);
            let seq = &mut self.running[i];
            if seq.computed > 0 || seq.scheduled > 0 {
                let _ = kv.truncate(seq.kv, 0);
                seq.restart();
            }
        }
        for seq in &mut self.running {
            seq.unschedule();
        }
    }

    /// `plan`'s step could not run (a bug or an inconsistent cache): fail its sequences,
    /// put the others' prompts back to be planned again, and keep serving.
    pub(super) fn fail(&mut self, plan: &StepPlan, error: &str) {
        let msg = format!("forward pass failed: {error}");
        for row in &plan.rows {
            let i = self.index(row.seq);
            let seq = &mut self.running[i];
            // Its values are not to be trusted: none of them is published for reuse.
            seq.computed = 0;
            if seq.finished().is_none() {
                seq.finish(FinishReason::Stop);
                self.outbox.push((seq.kv, Event::Failed(msg.clone())));
            }
        }
        for seq in &mut self.running {
            seq.unschedule();
        }
    }
}

/// Log-probabilities (log-softmax of the penalized logits, before temperature and
/// truncation) of the chosen token and of the `top` most likely tokens, best first.
/// Allocates one small vector; only requests that ask for log-probabilities pay for it.
fn token_logprobs(logits: &[f32], chosen: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    let lp = |l: f32| (l as f64 - lse) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if best.len() < top || l > best[best.len() - 1].1 {
                let at = best.partition_point(|&(_, v)| v >= l);
                best.insert(at, (i as u32, l));
                best.truncate(top);
            }
        }
    }
    TokenLogprobs { logprob: lp(logits[chosen as usize]), top: best.into_iter().map(|(id, l)| (id, lp(l))).collect() }
}
