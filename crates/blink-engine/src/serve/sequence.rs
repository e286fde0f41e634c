//! A running sequence and its state machine. The scheduler is its one writer: it admits
//! the sequence, feeds its sampled tokens back, samples after each step that gave it
//! logits, and finishes and releases it.
//!
//! ```text
//!  admitted ─▶ Computing ──(logits; sampled)──▶ Sampled(t) ──(decode row planned)──▶ Computing
//!                  │                                 │
//!                  └──────(end, limit, cancel)───────┴──▶ Finished(reason) ──▶ released
//! ```

use blink_model::{SeqId, StepRow};
use tokio::sync::mpsc::UnboundedSender;

use super::api::Event;
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
    state: State,
}

impl Seq {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admitted(events: UnboundedSender<Event>, kv: SeqId, tokens: Vec<u32>, max_tokens: usize, logprobs: Option<usize>, ignore_eos: bool, cached: usize, sampler: Sampler) -> Seq {
        let n_prompt = tokens.len();
        Seq { events, kv, tokens, n_prompt, max_tokens, logprobs, ignore_eos, computed: cached, scheduled: cached, generated: 0, cached, sampler, state: State::Computing }
    }

    pub(super) fn state(&self) -> State {
        self.state
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

    /// The sampled token's decode row for the coming step, if it has one to feed back.
    pub(super) fn take_decode_row(&mut self) -> Option<StepRow> {
        let State::Sampled(token) = self.state else { return None };
        let row = StepRow::decode(token, self.scheduled, self.kv);
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
}
