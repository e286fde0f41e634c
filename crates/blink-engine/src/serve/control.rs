//! The engine's control plane: everything that can happen while a step computes.
//!
//! [`Control::plan_next`] runs beside each forward pass (or alone when the engine starts
//! from idle). It hands the previous step's events to their clients, reports and releases
//! finished sequences, takes new requests, forgets cancelled ones, admits waiting requests
//! (reserving their whole KV need, so the cache is never over-committed) and plans the
//! next step's prompt chunks. What is left between two passes is sampling, admitting the
//! requests that came during the pass ([`Control::admit_late`]) and putting the rows
//! together (`scheduler`).
//!
//! Sequences are named by their cache id while they run: a step's rows refer to them by
//! it, and [`Control::index`] finds them however the list of running sequences has
//! changed meanwhile.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};

use blink_model::kv_cache::{KvBlocks, BLOCK_TOKENS};
use blink_model::{SeqId, StepRow};
use tokio::sync::mpsc::UnboundedSender;

use super::api::{EngineStats, Event, Request, Usage};
use super::{Command, EngineConfig, Occupancy};
use crate::sampling::Sampler;
use crate::session::FinishReason;

/// A request waiting for admission.
struct Pending {
    request: Request,
    events: UnboundedSender<Event>,
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
    cached: usize,
    pub(super) sampler: Sampler,
    /// Sampled but not yet fed back.
    pub(super) next: Option<u32>,
    pub(super) done: Option<FinishReason>,
}

/// The queue, the running sequences and their outgoing events.
pub(super) struct Control {
    pub(super) cfg: EngineConfig,
    commands: Receiver<Command>,
    waiting: VecDeque<Pending>,
    pub(super) running: Vec<Seq>,
    /// Index in `running` of each cache id, refreshed whenever `running` changes.
    index: Vec<usize>,
    /// Prompt rows planned for the next step, and their sequences.
    pub(super) planned: Vec<StepRow>,
    /// Events of the last step for the sequences with these cache ids, sent beside the next
    /// step (the sequences are still running then: they are released after the sends).
    pub(super) outbox: Vec<(SeqId, Event)>,
    /// Set when told to stop, or when every handle is gone and nothing is left to do.
    pub(super) stop: bool,
    disconnected: bool,
    shared_stats: Arc<Mutex<EngineStats>>,
    occupancy: Arc<Occupancy>,
    pub(super) stats: EngineStats,
}

impl Control {
    pub(super) fn new(
        cfg: EngineConfig,
        commands: Receiver<Command>,
        shared_stats: Arc<Mutex<EngineStats>>,
        occupancy: Arc<Occupancy>,
        kv: &KvBlocks,
    ) -> Control {
        let mut stats = EngineStats::default();
        stats.read_cache(kv);
        // Published at once, so the cache's size is known before the first request.
        if let Ok(mut shared) = shared_stats.lock() {
            shared.clone_from(&stats);
        }
        Control {
            planned: Vec::with_capacity(cfg.step_tokens),
            outbox: Vec::with_capacity(cfg.max_running),
            running: Vec::with_capacity(cfg.max_running),
            index: Vec::new(),
            cfg,
            commands,
            waiting: VecDeque::new(),
            stop: false,
            disconnected: false,
            shared_stats,
            occupancy,
            stats,
        }
    }

    /// Nothing to compute, report or admit.
    pub(super) fn idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty() && self.outbox.is_empty()
    }

    /// Block until a command arrives (the engine is idle).
    pub(super) fn wait_for_command(&mut self) {
        match self.commands.recv() {
            Ok(c) => self.take(c),
            Err(_) => self.stop = true,
        }
    }

    /// Nothing runs and no waiting request fits the cache: wait for a command, or for
    /// `patience` (a waiting client may have gone meanwhile), instead of spinning.
    pub(super) fn wait_for_room(&mut self, patience: std::time::Duration) {
        match self.commands.recv_timeout(patience) {
            Ok(c) => self.take(c),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => self.disconnected = true,
        }
    }

    /// Where the sequence with cache id `kv` is in `running`.
    #[inline]
    pub(super) fn index(&self, kv: SeqId) -> usize {
        self.index[kv]
    }

    /// All the control work for the coming step; `decoding` bounds how many decode rows
    /// it will have, which the planned prompt chunks leave room for.
    pub(super) fn plan_next(&mut self, kv: &mut KvBlocks, decoding: usize) {
        self.send_events();
        self.release_finished(kv);
        self.take_commands();
        self.drop_cancelled();
        self.admit(kv);
        // What the admissions did not take back of the blocks freed above goes to the OS.
        kv.return_free_memory_if_due();
        self.refresh_index();
        self.planned.clear();
        self.plan_prompts(decoding);
        self.publish_stats(kv);
        if self.disconnected && self.idle() {
            self.stop = true;
        }
    }

    /// Between two passes: admit the requests that arrived while the last step computed,
    /// and plan their prompts into the coming step's unused budget. Without this they would
    /// wait for the step after it (`plan_next` for the coming step ran as the last one
    /// started), so under load a request's first token would come a whole step later.
    /// Does nothing more than look at the channel unless a request is there.
    pub(super) fn admit_late(&mut self, kv: &mut KvBlocks, decoding: usize) {
        let before = self.waiting.len();
        self.take_commands();
        if self.waiting.len() == before {
            return;
        }
        let running = self.running.len();
        self.admit(kv);
        self.stats.requests_admitted_late += (self.running.len() - running) as u64;
        self.refresh_index();
        self.plan_prompts(decoding);
    }

    fn send_events(&mut self) {
        for (kv, event) in self.outbox.drain(..) {
            let _ = self.running[self.index[kv]].events.send(event);
        }
    }

    /// Report and free the sequences that finished (or were cancelled) in earlier steps.
    /// None of them is in the step now computing: rows are never built for them.
    fn release_finished(&mut self, kv: &mut KvBlocks) {
        let mut i = 0;
        while i < self.running.len() {
            let Some(reason) = self.running[i].done else {
                i += 1;
                continue;
            };
            let seq = self.running.remove(i);
            if self.cfg.prefix_cache {
                // Its prompt and replies, for a later turn of the same conversation.
                let _ = kv.publish_prefix(seq.kv, &seq.tokens[..seq.computed.min(seq.tokens.len())]);
            }
            let usage = Usage { prompt_tokens: seq.n_prompt, completion_tokens: seq.generated, cached_tokens: seq.cached };
            let _ = seq.events.send(Event::Finished { reason, usage });
            kv.free_seq(seq.kv);
            self.occupancy.running.fetch_sub(1, Ordering::AcqRel);
            let s = &mut self.stats;
            s.requests_finished += 1;
            s.prompt_tokens_total += seq.n_prompt as u64;
            s.prompt_tokens_cached += seq.cached as u64;
            s.generated_tokens_total += seq.generated as u64;
        }
    }

    fn take_commands(&mut self) {
        loop {
            match self.commands.try_recv() {
                Ok(c) => self.take(c),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.disconnected = true;
                    break;
                }
            }
        }
    }

    fn take(&mut self, c: Command) {
        match c {
            Command::Submit { request, events } => self.waiting.push_back(Pending { request, events }),
            Command::Shutdown => self.stop = true,
        }
    }

    /// Forget waiting requests whose client has gone; mark running ones done (they are
    /// released by the next `plan_next`, once no step refers to them).
    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|p| !p.events.is_closed());
        let gone = before - self.waiting.len();
        if gone > 0 {
            self.occupancy.waiting.fetch_sub(gone as u64, Ordering::AcqRel);
        }
        for seq in &mut self.running {
            if seq.events.is_closed() {
                seq.done.get_or_insert(FinishReason::Stop);
            }
        }
    }

    /// Admit waiting requests, in order, while their whole KV need can be reserved. A
    /// request whose prompt shares at least a block's worth of uncached tokens with a
    /// prompt still being computed waits for that prompt to be published, then attaches it
    /// instead of computing the same tokens again (a burst of requests with one system
    /// prompt computes it once); the requests behind it go ahead.
    fn admit(&mut self, kv: &mut KvBlocks) {
        let mut i = 0;
        while i < self.waiting.len() && self.running.len() < self.cfg.max_running {
            if self.cfg.prefix_cache && self.shares_a_prefill(&self.waiting[i].request.prompt) {
                i += 1;
                continue;
            }
            let Some((id, cached)) = self.reserve(kv, &self.waiting[i].request) else { break };
            let p = self.waiting.remove(i).expect("index checked above");
            self.occupancy.running.fetch_add(1, Ordering::AcqRel);
            self.occupancy.waiting.fetch_sub(1, Ordering::AcqRel);
            let _ = p.events.send(Event::Admitted { cached_tokens: cached });
            let mut sampler = Sampler::new(p.request.sampling.clone());
            for &t in &p.request.prompt {
                sampler.accept(t);
            }
            let n_prompt = p.request.prompt.len();
            let mut tokens = p.request.prompt;
            tokens.reserve_exact(p.request.max_tokens);
            self.running.push(Seq {
                events: p.events,
                kv: id,
                tokens,
                n_prompt,
                max_tokens: p.request.max_tokens,
                logprobs: p.request.logprobs,
                ignore_eos: p.request.ignore_eos,
                computed: cached,
                scheduled: cached,
                generated: 0,
                cached,
                sampler,
                next: None,
                done: None,
            });
        }
    }

    /// A cache sequence holding `request`'s whole KV need, on a cached prefix when one
    /// fits; `None` if the cache cannot hold it now. The prefix is dropped when it is what
    /// stands in the way: attaching it pins the source of a partial-block copy, a block a
    /// request needing the whole cache cannot spare.
    fn reserve(&self, kv: &mut KvBlocks, request: &Request) -> Option<(SeqId, usize)> {
        let total = request.prompt.len() + request.max_tokens;
        if self.cfg.prefix_cache {
            let id = kv.new_seq();
            let cached = kv.attach_prefix(id, &request.prompt).unwrap_or(0);
            if kv.reserve(id, total).is_ok() {
                return Some((id, cached));
            }
            kv.free_seq(id);
        }
        let id = kv.new_seq();
        if kv.reserve(id, total).is_ok() {
            return Some((id, 0));
        }
        kv.free_seq(id);
        None
    }

    /// Whether a running prompt not yet computed (so not yet in the prefix cache) shares
    /// with `prompt` at least [`BLOCK_TOKENS`] more tokens than that prompt found cached.
    fn shares_a_prefill(&self, prompt: &[u32]) -> bool {
        // The last token is always computed (its logits are needed), so never shared.
        let usable = &prompt[..prompt.len().saturating_sub(1)];
        self.running.iter().filter(|s| s.done.is_none() && s.computed < s.n_prompt).any(|s| {
            let shared = usable.iter().zip(&s.tokens[..s.n_prompt]).take_while(|(a, b)| a == b).count();
            shared >= s.cached + BLOCK_TOKENS
        })
    }

    fn refresh_index(&mut self) {
        for (i, seq) in self.running.iter().enumerate() {
            if self.index.len() <= seq.kv {
                self.index.resize(seq.kv + 1, usize::MAX);
            }
            self.index[seq.kv] = i;
        }
    }

    /// Add chunks of pending prompts to the next step's plan, oldest request first, within
    /// the token budget left by up to `decoding` decode rows and the rows already planned.
    /// Prompts get at least a quarter of the budget however many sequences decode, so a new
    /// request moves on while more sequences decode than a step holds tokens (the step's
    /// buffers hold `step_tokens + max_running` rows).
    fn plan_prompts(&mut self, decoding: usize) {
        let floor = self.cfg.step_tokens.div_ceil(4);
        let mut budget = self.cfg.step_tokens.saturating_sub(decoding).max(floor).saturating_sub(self.planned.len());
        for seq in &mut self.running {
            if budget == 0 {
                break;
            }
            if seq.done.is_some() || seq.scheduled >= seq.n_prompt {
                continue;
            }
            let n = (seq.n_prompt - seq.scheduled).min(budget);
            for pos in seq.scheduled..seq.scheduled + n {
                let logits = pos + 1 == seq.n_prompt;
                self.planned.push(StepRow::prompt(seq.tokens[pos], pos, seq.kv).with_logits(logits));
            }
            seq.scheduled += n;
            budget -= n;
        }
    }

    fn publish_stats(&mut self, kv: &KvBlocks) {
        let s = &mut self.stats;
        s.queue_depth = self.waiting.len();
        s.running = self.running.len();
        s.read_cache(kv);
        if let Ok(mut shared) = self.shared_stats.lock() {
            shared.clone_from(s);
        }
    }
}
