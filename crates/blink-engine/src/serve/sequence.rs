//! A running sequence and its state machine. The scheduler is its one writer: it admits
//! the sequence, feeds its sampled tokens back, samples after each step that gave it
//! logits, and finishes and releases it.
//!
//! ```text
//!  admitted ─▶ Computing ──(logits; sampled)──▶ Sampled(t) ──(decode row planned)──▶ Computing
//!                  │                                 │
//!                  └──────(end, limit, cancel)───────┴──▶ Finished(reason) ──▶ released
//! ```

use std::sync::Arc;
use std::time::Instant;

use blink_model::lora::LoraMix;
use blink_model::{AdapterSlot, SeqId, StepRow};
use tokio::sync::mpsc::UnboundedSender;

use super::api::{Event, Request};
use crate::sampling::Sampler;
use crate::session::FinishReason;

/// Where a sequence stands between two steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Prompt tokens remain to be computed, or a step now computing will give its next
    /// logits.
    Computing,
    /// A token was sampled; its decode row goes into the next step.
    Sampled(u32),
    /// Done (reported and released by the next schedule, once no step refers to it).
    Finished(FinishReason),
}

/// A running sequence.
pub(super) struct Seq {
    pub(super) events: UnboundedSender<Event>,
    pub(super) kv: SeqId,
    /// Prompt then generated tokens.
    pub(super) tokens: Vec<u32>,
    pub(super) n_prompt: usize,
    pub(super) max_tokens: usize,
    pub(super) logprobs: Option<usize>,
    pub(super) ignore_eos: bool,
    /// Tokens whose keys and values are in the cache.
    pub(super) computed: usize,
    /// Tokens put into a step so far (computed, or being computed).
    pub(super) scheduled: usize,
    pub(super) generated: usize,
    /// Prompt tokens found in the prefix cache at admission.
    pub(super) cached: usize,
    pub(super) sampler: Sampler,
    /// The adapters it runs with, held until it is released.
    pub(super) adapter: Option<Arc<LoraMix>>,
    /// When its request was submitted.
    pub(super) arrived: Instant,
    /// Its rows in steps launched and not yet landed (several steps in flight): it is not
    /// released before they are back.
    pub(super) rows_in_flight: usize,
    state: State,
}

impl Seq {
    /// A sequence for `request`, on cache sequence `kv` whose first `cached` tokens came
    /// from the prefix cache.
    pub(super) fn admitted(events: UnboundedSender<Event>, kv: SeqId, request: Request, cached: usize, arrived: Instant) -> Seq {
        let mut sampler = Sampler::new(request.sampling.clone());
        for &t in &request.prompt {
            sampler.accept(t);
        }
        let mut tokens = request.prompt;
        tokens.reserve_exact(request.max_tokens);
        Seq {
            events,
            kv,
            n_prompt: tokens.len(),
            tokens,
            max_tokens: request.max_tokens,
            logprobs: request.logprobs,
            ignore_eos: request.ignore_eos,
            computed: cached,
            scheduled: cached,
            generated: 0,
            cached,
            rows_in_flight: 0,
            sampler,
            adapter: request.adapter,
            arrived,
            state: State::Computing,
        }
    }

    pub(super) fn finished(&self) -> Option<FinishReason> {
        match self.state {
            State::Finished(reason) => Some(reason),
            _ => None,
        }
    }

    /// Whether prompt tokens remain to be put into a step.
    pub(super) fn prompt_pending(&self) -> bool {
        self.finished().is_none() && self.scheduled < self.n_prompt
    }

    /// End the sequence; the first reason given stands.
    pub(super) fn finish(&mut self, reason: FinishReason) {
        if self.finished().is_none() {
            self.state = State::Finished(reason);
        }
    }

    /// A token was sampled from the sequence's logits and delivered.
    pub(super) fn sampled(&mut self, token: u32) {
        debug_assert_eq!(self.state, State::Computing);
        self.tokens.push(token);
        self.generated += 1;
        self.state = State::Sampled(token);
    }

    /// Whether it has a sampled token to feed back.
    pub(super) fn has_decode_row(&self) -> bool {
        matches!(self.state, State::Sampled(_))
    }

    /// The sampled token's decode row for the coming step, with the adapter slot the step
    /// gave its mix, if it has one to feed back.
    pub(super) fn take_decode_row(&mut self, adapter: Option<AdapterSlot>) -> Option<StepRow> {
        let State::Sampled(token) = self.state else { return None };
        let row = StepRow::decode(token, self.scheduled, self.kv).with_adapter(adapter);
        self.scheduled += 1;
        self.state = State::Computing;
        Some(row)
    }

    /// One of its rows was computed.
    pub(super) fn computed_row(&mut self) {
        self.computed += 1;
    }

    /// The step that held its rows failed: what it scheduled beyond the cache is planned
    /// again.
    pub(super) fn unschedule(&mut self) {
        self.scheduled = self.computed;
    }

    /// Start again from the first token (a new sequence whose reused prefix was lost
    /// before its first step ran).
    pub(super) fn restart(&mut self) {
        debug_assert_eq!(self.generated, 0, "only a sequence that generated nothing starts again");
        self.computed = 0;
        self.scheduled = 0;
        self.cached = 0;
    }
}
