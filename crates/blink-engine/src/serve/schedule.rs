//! Scheduling: the queue, the running sequences, and the plan of each step.
//!
//! [`Scheduler::schedule`] runs beside each forward pass (or alone when the engine starts
//! from idle) and writes the next step's plan: it hands the previous step's events to
//! their clients, reports and releases finished sequences, takes new requests, forgets
//! cancelled ones, admits waiting requests through the admission policy (reserving their
//! whole KV need, so the cache is never over-committed) and plans prompt chunks. Between
//! two passes remain [`Scheduler::schedule_late`] (requests that came during the pass) and
//! [`Scheduler::add_decodes`] (the sampled tokens fed back); `update` folds a step's
//! output back in.
//!
//! Sequences are named by their cache id while they run: a step's rows refer to them by
//! it, and [`Scheduler::index`] finds them however the list of running sequences has
//! changed meanwhile.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use blink_model::kv_cache::{KvBlocks, PrefixKey, BLOCK_TOKENS};
use blink_model::SeqId;
use tokio::sync::mpsc::UnboundedSender;

use super::api::{EngineStats, Event, Request, Usage};
use super::plan::StepPlan;
use super::policy::{AdmissionPolicy, Candidate, Load, Verdict};
use super::sequence::Seq;
use super::{Command, EngineConfig, Occupancy};
use crate::session::FinishReason;

/// A request waiting for admission.
struct Pending {
    request: Request,
    events: UnboundedSender<Event>,
    /// When it was submitted (its TTFT runs from then).
    at: Instant,
}

/// The queue, the running sequences and their outgoing events.
pub(super) struct Scheduler {
    pub(super) cfg: EngineConfig,
    commands: Receiver<Command>,
    waiting: VecDeque<Pending>,
    pub(super) running: Vec<Seq>,
    /// Index in `running` of each cache id, refreshed whenever `running` changes.
    index: Vec<usize>,
    policy: Box<dyn AdmissionPolicy>,
    /// Events of the last step for the sequences with these cache ids, sent beside the next
    /// step (the sequences are still running then: they are released after the sends).
    pub(super) outbox: Vec<(SeqId, Event)>,
    /// Set when told to stop, or when every handle is gone and nothing is left to do.
    pub(super) stop: bool,
    disconnected: bool,
    shared_stats: Arc<Mutex<EngineStats>>,
    occupancy: Arc<Occupancy>,
    pub(super) stats: EngineStats,
    /// Where `add_decodes` starts its scan of the running sequences.
    rotation: usize,
}

impl Scheduler {
    pub(super) fn new(
        cfg: EngineConfig,
        commands: Receiver<Command>,
        shared_stats: Arc<Mutex<EngineStats>>,
        occupancy: Arc<Occupancy>,
        policy: Box<dyn AdmissionPolicy>,
        kv: &KvBlocks,
    ) -> Scheduler {
        let mut stats = EngineStats::default();
        stats.read_cache(kv);
        // Published at once, so the cache's size is known before the first request.
        if let Ok(mut shared) = shared_stats.lock() {
            shared.clone_from(&stats);
        }
        Scheduler {
            policy,
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
            rotation: 0,
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

    /// Write the coming step's plan (its decode rows come later, from
    /// [`Scheduler::add_decodes`]): send the last step's events, release what finished,
    /// take commands, admit and plan prompt chunks. `decoding` bounds how many decode rows
    /// it will have, which the chunks leave room for.
    pub(super) fn schedule(&mut self, kv: &mut KvBlocks, decoding: usize, plan: &mut StepPlan) {
        plan.clear();
        self.send_events();
        self.release_finished(kv, plan);
        self.take_commands();
        self.drop_cancelled();
        self.admit(kv, decoding, plan);
        // What the admissions did not take back of the blocks freed above goes to the OS.
        kv.return_free_memory_if_due();
        self.refresh_index();
        self.plan_prompts(decoding, plan);
        self.publish_stats(kv);
        if self.disconnected && self.idle() {
            self.stop = true;
        }
    }

    /// Between two passes: admit the requests that arrived while the last step computed,
    /// and plan their prompts into the coming step's unused budget. Without this they would
    /// wait for the step after it (`schedule` for the coming step ran as the last one
    /// started), so under load a request's first token would come a whole step later.
    /// Does nothing more than look at the channel unless a request is there.
    pub(super) fn schedule_late(&mut self, kv: &mut KvBlocks, decoding: usize, plan: &mut StepPlan) {
        let before = self.waiting.len();
        self.take_commands();
        if self.waiting.len() == before {
            return;
        }
        let running = self.running.len();
        self.admit(kv, decoding, plan);
        self.stats.requests_admitted_late += (self.running.len() - running) as u64;
        self.refresh_index();
        self.plan_prompts(decoding, plan);
    }

    /// `plan`'s step was launched (`+1`) or landed (`-1`): count its rows in flight.
    pub(super) fn in_flight(&mut self, plan: &StepPlan, launched: bool) {
        for row in &plan.rows {
            let i = self.index(row.seq);
            let seq = &mut self.running[i];
            seq.rows_in_flight = if launched { seq.rows_in_flight + 1 } else { seq.rows_in_flight - 1 };
        }
    }

    /// Sequences with a sampled token to feed back: the coming step's decode rows.
    pub(super) fn decoding(&self) -> usize {
        self.running.iter().filter(|s| s.has_decode_row()).count()
    }

    /// Complete the plan with a decode row per sequence that has a sampled token, ahead of
    /// the prompt chunks. A sequence whose adapters find no slot left (`max_loras`) keeps
    /// its token for a later step; the scan starts one sequence further on each step, so
    /// every adapter's turn comes.
    pub(super) fn add_decodes(&mut self, plan: &mut StepPlan) {
        self.add_decodes_upto(plan, usize::MAX);
    }

    /// [`Scheduler::add_decodes`], with at most `most` decode rows: a share of the
    /// sequences, when several steps are in flight.
    pub(super) fn add_decodes_upto(&mut self, plan: &mut StepPlan, most: usize) {
        let n = self.running.len();
        self.rotation = if n == 0 { 0 } else { (self.rotation + 1) % n };
        let mut added = 0;
        for k in 0..n {
            let seq = &mut self.running[(self.rotation + k) % n];
            if !seq.has_decode_row() || added == most {
                continue;
            }
            added += 1;
            if let Some(slot) = plan.slot_for(seq.adapter.as_ref(), self.cfg.max_loras) {
                plan.push_decode(seq.take_decode_row(slot).expect("a sampled token"));
            }
        }
        plan.seal();
    }

    /// Requests waiting for admission.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Send the last step's token events now (before training work, so clients do not
    /// wait for it).
    pub(super) fn send_events(&mut self) {
        for (kv, event) in self.outbox.drain(..) {
            let _ = self.running[self.index[kv]].events.send(event);
        }
    }

    /// Report and free the sequences that finished (or were cancelled) in earlier steps.
    /// None of them is in the step now computing: rows are never built for them.
    fn release_finished(&mut self, kv: &mut KvBlocks, plan: &mut StepPlan) {
        let mut i = 0;
        while i < self.running.len() {
            let Some(reason) = self.running[i].finished().filter(|_| self.running[i].rows_in_flight == 0) else {
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
            plan.released.push(seq.kv);
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
            Command::Submit { request, events, at } => self.waiting.push_back(Pending { request, events, at }),
            Command::Wake => {}
            Command::Shutdown => self.stop = true,
        }
    }

    /// Forget waiting requests whose client has gone; mark running ones done (they are
    /// released by the next `schedule`, once no step refers to them).
    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|p| !p.events.is_closed());
        let gone = before - self.waiting.len();
        if gone > 0 {
            self.occupancy.waiting.fetch_sub(gone as u64, Ordering::AcqRel);
        }
        for seq in &mut self.running {
            if seq.events.is_closed() {
                seq.finish(FinishReason::Stop);
            }
        }
    }

    /// Admit waiting requests, as the policy decides, while their whole KV need can be
    /// reserved. A request whose prompt shares at least a block's worth of uncached tokens
    /// with a prompt still being computed is flagged to the policy: admitted once that
    /// prompt is published, it attaches the tokens instead of computing them again (a burst
    /// of requests with one system prompt computes it once).
    fn admit(&mut self, kv: &mut KvBlocks, decoding: usize, plan: &mut StepPlan) {
        let mut i = 0;
        while i < self.waiting.len() && self.running.len() < self.cfg.max_running {
            let request = &self.waiting[i].request;
            let candidate = Candidate {
                prompt_tokens: request.prompt.len(),
                max_tokens: request.max_tokens,
                shares_a_prefill: self.cfg.prefix_cache && self.shares_a_prefill(request),
            };
            let verdict = match self.policy.consider(&candidate, &self.load(decoding)) {
                Verdict::Admit => match self.reserve(kv, request) {
                    Some(reserved) => {
                        self.start(i, reserved, plan);
                        continue;
                    }
                    None => self.policy.no_room(&candidate),
                },
                other => other,
            };
            match verdict {
                Verdict::Stop => break,
                Verdict::Skip | Verdict::Admit => i += 1,
            }
        }
    }

    /// Start the `i`-th waiting request on its reserved cache sequence.
    fn start(&mut self, i: usize, (id, cached): (SeqId, usize), plan: &mut StepPlan) {
        let p = self.waiting.remove(i).expect("a waiting request's index");
        self.occupancy.running.fetch_add(1, Ordering::AcqRel);
        self.occupancy.waiting.fetch_sub(1, Ordering::AcqRel);
        let _ = p.events.send(Event::Admitted { cached_tokens: cached });
        self.running.push(Seq::admitted(p.events, id, p.request, cached, p.at));
        plan.admitted.push(id);
    }

    /// The prompt tokens a step with `decoding` decode rows may take.
    pub(super) fn prompt_budget(&self, decoding: usize) -> usize {
        self.policy.prompt_budget(&self.load(decoding))
    }

    fn load(&self, decoding: usize) -> Load {
        Load { running: self.running.len(), max_running: self.cfg.max_running, decoding, step_tokens: self.cfg.step_tokens }
    }

    /// A cache sequence holding `request`'s whole KV need, on a cached prefix when one
    /// fits; `None` if the cache cannot hold it now. The prefix is dropped when it is what
    /// stands in the way: attaching it pins the source of a partial-block copy, a block a
    /// request needing the whole cache cannot spare.
    fn reserve(&self, kv: &mut KvBlocks, request: &Request) -> Option<(SeqId, usize)> {
        let total = request.prompt.len() + request.max_tokens;
        let key = prefix_key(request.adapter.as_deref());
        if self.cfg.prefix_cache {
            let id = kv.new_seq_with(key);
            let cached = kv.attach_prefix(id, &request.prompt).unwrap_or(0);
            if kv.reserve(id, total).is_ok() {
                return Some((id, cached));
            }
            kv.free_seq(id);
        }
        let id = kv.new_seq_with(key);
        if kv.reserve(id, total).is_ok() {
            return Some((id, 0));
        }
        kv.free_seq(id);
        None
    }

    /// Whether a running prompt not yet computed (so not yet in the prefix cache) shares
    /// with `prompt` at least [`BLOCK_TOKENS`] more tokens than that prompt found cached.
    fn shares_a_prefill(&self, request: &Request) -> bool {
        // The last token is always computed (its logits are needed), so never shared.
        let prompt = &request.prompt;
        let usable = &prompt[..prompt.len().saturating_sub(1)];
        let key = prefix_key(request.adapter.as_deref());
        let prefilling = |s: &&Seq| s.finished().is_none() && s.computed < s.n_prompt && prefix_key(s.adapter.as_deref()) == key;
        self.running.iter().filter(prefilling).any(|s| {
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

    /// Add chunks of pending prompts to the plan, oldest request first, within the prompt
    /// budget the policy gives a step with up to `decoding` decode rows, less the prompt
    /// rows already planned (the step's buffers hold `step_tokens + max_running` rows).
    fn plan_prompts(&mut self, decoding: usize, plan: &mut StepPlan) {
        let mut budget = self.policy.prompt_budget(&self.load(decoding)).saturating_sub(plan.cost.prompt_tokens);
        for seq in &mut self.running {
            if budget == 0 {
                break;
            }
            if !seq.prompt_pending() {
                continue;
            }
            // Prompts whose adapters find no slot left wait for a later step.
            let Some(slot) = plan.slot_for(seq.adapter.as_ref(), self.cfg.max_loras) else { continue };
            let n = (seq.n_prompt - seq.scheduled).min(budget);
            plan.push_chunk(seq.kv, seq.scheduled, &seq.tokens[seq.scheduled..seq.scheduled + n], seq.n_prompt, slot);
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

/// The prefix-cache key of a sequence run with `mix`: blocks computed under one adapter
/// are never attached by a sequence under another.
fn prefix_key(mix: Option<&blink_model::lora::LoraMix>) -> PrefixKey {
    match mix {
        Some(m) if !m.is_empty() => PrefixKey::adapter(m.key()),
        _ => PrefixKey::BASE,
    }
}
