//! The serving engine's public interface: requests in, token events out.
//!
//! A front end (the HTTP server) tokenizes, submits a [`Request`] and reads [`Event`]s from
//! the returned [`Submission`]. Dropping the submission (a client went away) cancels the
//! request; the engine frees its sequence at the next step. Events carry token ids only:
//! detokenization and stop strings are the front end's job, off the compute path.

use std::sync::Arc;

use blink_model::lora::LoraMix;
use serde::Serialize;

use crate::sampling::SamplingParams;
use crate::session::FinishReason;

/// One generation request, already tokenized and validated.
#[derive(Clone, Debug)]
pub struct Request {
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (≥ 1).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Return the chosen token's log-probability and this many alternatives per step.
    pub logprobs: Option<usize>,
    /// Keep generating through end-of-generation tokens.
    pub ignore_eos: bool,
    /// The adapters the request runs with (`None`: the base model). The request holds
    /// them: unloading or replacing an adapter does not change a request in flight.
    pub adapter: Option<Arc<LoraMix>>,
}

/// Log-probability information for one generated token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprobs {
    /// Natural log-probability of the chosen token.
    pub logprob: f32,
    /// The most likely tokens at this step, best first, with their log-probabilities.
    pub top: Vec<(u32, f32)>,
}

/// What the engine reports about a request, in order.
#[derive(Clone, Debug)]
pub enum Event {
    /// The request was admitted; this many of its prompt tokens came from the prefix cache.
    /// Comes before any token.
    Admitted { cached_tokens: usize },
    /// A generated token (end-of-generation tokens are not sent).
    Token { id: u32, logprobs: Option<TokenLogprobs> },
    /// Generation ended; no further events follow.
    Finished { reason: FinishReason, usage: Usage },
    /// The request failed; no further events follow.
    Failed(String),
}

/// Token accounting of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache instead of being computed.
    pub cached_tokens: usize,
}

/// Why a request was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the server is busy: {0} requests are already waiting")]
    QueueFull(usize),
    #[error("the request needs {needed} tokens of KV cache but the whole cache holds {capacity}")]
    TooLarge { needed: usize, capacity: usize },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("the engine has stopped")]
    Stopped,
}

/// A snapshot of the engine's state and counters, for metrics.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EngineStats {
    /// Requests waiting for admission.
    pub queue_depth: usize,
    /// Sequences being prefilled or decoded.
    pub running: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Blocks held only by the prefix cache (reusable).
    pub kv_blocks_cached: usize,
    /// Most blocks the prefix cache keeps without owners.
    pub kv_blocks_cached_limit: usize,
    /// Free blocks whose memory is with the OS (never touched, or given back).
    pub kv_blocks_released: usize,
    /// At most this many bytes of KV values are resident: every block's but the released.
    pub kv_resident_bytes: u64,
    /// Calls that gave free blocks' pages back to the OS, and the bytes they gave back.
    pub kv_return_calls_total: u64,
    pub kv_returned_bytes_total: u64,
    pub requests_finished: u64,
    pub prompt_tokens_total: u64,
    pub prompt_tokens_cached: u64,
    pub generated_tokens_total: u64,
    pub steps_total: u64,
    /// Rows in the last step.
    pub last_batch_rows: usize,
    /// Total wall time of steps, and the part spent in the forward pass, in seconds.
    pub step_seconds_total: f64,
    pub compute_seconds_total: f64,
    /// Steps whose control work (hand-off, admission, planning) ran beside the previous
    /// pass, and the seconds that work took there, off the critical path.
    pub steps_planned_ahead: u64,
    pub beside_seconds_total: f64,
    /// Requests admitted between two passes, into the step about to start (they arrived
    /// after the control work beside the last pass).
    pub requests_admitted_late: u64,
    /// Co-served training units run, the seconds they took, and how many of them shared
    /// their step with inference rows.
    pub train_units_total: u64,
    pub train_seconds_total: f64,
    pub train_units_beside_requests: u64,
    /// Units a request's arrival stopped at a layer boundary (the rest ran later).
    pub train_units_stopped: u64,
    /// The latency model's errors per kind of step, in [`StepKind::ALL`]'s order
    /// (refreshed about once a second).
    ///
    /// [`StepKind::ALL`]: super::latency::StepKind::ALL
    pub latency: [LatencyKindStats; 7],
}

/// The latency model's record on one kind of step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencyKindStats {
    /// Steps of this kind observed.
    pub count: u64,
    /// Median |relative error| over the recent ones: of the online (refitted) model and of
    /// the offline coefficients alone; NaN before any.
    pub median_online: f64,
    pub median_offline: f64,
    /// The margin its predictions get.
    pub margin: f64,
    /// Every |relative error| so far, of each model, counted in buckets.
    pub online_counts: super::latency::ErrorCounts,
    pub offline_counts: super::latency::ErrorCounts,
}

impl EngineStats {
    /// Take the cache's figures.
    pub(super) fn read_cache(&mut self, kv: &blink_model::kv_cache::KvBlocks) {
        self.kv_blocks_total = kv.n_blocks();
        self.kv_blocks_cached = kv.cached_blocks();
        self.kv_blocks_used = kv.n_blocks() - kv.free_blocks();
        self.kv_blocks_cached_limit = kv.cached_blocks_limit().min(kv.n_blocks());
        self.kv_blocks_released = kv.released_blocks();
        self.kv_resident_bytes = kv.resident_bytes() as u64;
        (self.kv_return_calls_total, self.kv_returned_bytes_total) = kv.returned();
    }

    /// Share of step time not spent computing: `1 − compute/step`.
    pub fn f_ctrl(&self) -> f64 {
        if self.step_seconds_total > 0.0 {
            1.0 - self.compute_seconds_total / self.step_seconds_total
        } else {
            0.0
        }
    }
}
