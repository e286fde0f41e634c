//! The engine thread's step loop: admission, batch assembly, one forward pass, sampling
//! and event hand-off, repeated while there is work.
//!
//! Admission reserves a request's whole KV need (prompt + max_tokens, less any cached
//! prefix) before it runs, so the cache is never over-committed and a running sequence
//! never stalls for memory. Each step packs one decode row per generating sequence, then
//! fills the rest of the token budget with chunks of pending prompts, so a long prompt
//! never freezes the other streams.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use blink_kernels::numa::NodePool;
use blink_model::kv_cache::KvCache;
use blink_model::{Model, Scratch, SeqId, StepRow};
use tokio::sync::mpsc::UnboundedSender;

use super::api::{EngineStats, Event, Request, TokenLogprobs, Usage};
use super::{Command, EngineConfig};
use crate::sampling::Sampler;
use crate::session::FinishReason;

/// A request waiting for admission.
struct Pending {
    request: Request,
    events: UnboundedSender<Event>,
}

/// A running sequence.
struct Seq {
    events: UnboundedSender<Event>,
    kv: SeqId,
    /// Prompt then generated tokens.
    tokens: Vec<u32>,
    n_prompt: usize,
    max_tokens: usize,
    logprobs: Option<usize>,
    ignore_eos: bool,
    /// Tokens whose keys and values are in the cache.
    computed: usize,
    generated: usize,
    cached: usize,
    sampler: Sampler,
    /// Sampled but not yet fed back.
    next: Option<u32>,
    done: Option<FinishReason>,
}

impl Seq {
    fn prefilling(&self) -> bool {
        self.computed < self.n_prompt
    }
}

pub(super) struct Scheduler {
    model: Arc<Model>,
    eog: Vec<u32>,
    cfg: EngineConfig,
    pool: NodePool,
    kv: KvCache,
    scratch: Scratch,
    rows: Vec<StepRow>,
    /// For each row with logits, the index of its sequence in `running`.
    logit_owner: Vec<usize>,
    /// For each row, the index of its sequence in `running`.
    row_owner: Vec<usize>,
    waiting: VecDeque<Pending>,
    running: Vec<Seq>,
    stats: Arc<Mutex<EngineStats>>,
    waiting_count: Arc<AtomicU64>,
    local: EngineStats,
}

impl Scheduler {
    pub(super) fn new(
        model: Arc<Model>,
        mut eog: Vec<u32>,
        cfg: &EngineConfig,
        stats: Arc<Mutex<EngineStats>>,
        waiting_count: Arc<AtomicU64>,
    ) -> Scheduler {
        eog.sort_unstable();
        let max_running = cfg.max_running.max(1);
        let step_tokens = cfg.step_tokens.max(1);
        let max_rows = step_tokens + max_running;
        let kv = model.new_kv_cache(cfg.kv_tokens.max(1), cfg.kv_type);
        let scratch = Scratch::new(&model, max_rows, max_running, cfg.max_seq_len.max(1), cfg.n_threads.max(1));
        let local = EngineStats { kv_blocks_total: kv.n_blocks(), ..Default::default() };
        Scheduler {
            // The model validated its placement when it was built, so its pool builds.
            pool: model.pool(cfg.n_threads.max(1)).expect("a pool for the model's placement"),
            kv,
            scratch,
            rows: Vec::with_capacity(max_rows),
            logit_owner: Vec::with_capacity(max_running),
            row_owner: Vec::with_capacity(max_rows),
            waiting: VecDeque::new(),
            running: Vec::with_capacity(max_running),
            stats,
            waiting_count,
            local,
            eog,
            cfg: EngineConfig { max_running, step_tokens, ..cfg.clone() },
            model,
        }
    }

    /// Tokens the whole cache holds.
    pub(super) fn capacity_tokens(&self) -> usize {
        self.kv.capacity_tokens()
    }

    /// Serve until told to stop (or every handle is gone).
    pub(super) fn run(mut self, commands: Receiver<Command>) {
        loop {
            // Idle: block for the next command. Busy: take what has arrived.
            if self.running.is_empty() && self.waiting.is_empty() {
                match commands.recv() {
                    Ok(c) => {
                        if !self.take(c) {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(c) => {
                        if !self.take(c) {
                            return;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if self.running.is_empty() && self.waiting.is_empty() {
                            return;
                        }
                        break;
                    }
                }
            }
            self.step();
        }
    }

    /// Accept a command; false means shut down.
    fn take(&mut self, c: Command) -> bool {
        match c {
            Command::Submit { request, events } => {
                self.waiting.push_back(Pending { request, events });
                true
            }
            Command::Shutdown => false,
        }
    }

    /// One iteration: drop cancelled work, admit, compute, sample, report.
    fn step(&mut self) {
        let started = Instant::now();
        self.drop_cancelled();
        self.admit();
        if !self.build_rows() {
            self.publish_stats(started, 0.0);
            return;
        }
        let compute_start = Instant::now();
        let result = self.model.forward(&self.pool, &mut self.kv, &self.rows, &mut self.scratch);
        let compute = compute_start.elapsed().as_secs_f64();
        match result {
            Ok(()) => self.after_forward(),
            Err(e) => {
                // A bug or an inconsistent cache: fail the step's sequences, keep serving.
                let msg = format!("forward pass failed: {e}");
                for &i in &self.row_owner {
                    self.running[i].done.get_or_insert(FinishReason::Stop);
                    let _ = self.running[i].events.send(Event::Failed(msg.clone()));
                }
            }
        }
        self.retire();
        self.publish_stats(started, compute);
    }

    /// Forget requests whose client has gone away.
    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|p| !p.events.is_closed());
        let gone = before - self.waiting.len();
        if gone > 0 {
            self.waiting_count.fetch_sub(gone as u64, Ordering::AcqRel);
        }
        for seq in &mut self.running {
            if seq.events.is_closed() {
                seq.done.get_or_insert(FinishReason::Stop);
            }
        }
        self.retire_quietly();
    }

    /// Admit waiting requests, in order, while their whole KV need can be reserved.
    fn admit(&mut self) {
        while self.running.len() < self.cfg.max_running {
            let Some(p) = self.waiting.front() else { break };
            let kv = self.kv.new_seq();
            let cached = if self.cfg.prefix_cache { self.kv.attach_prefix(kv, &p.request.prompt).unwrap_or(0) } else { 0 };
            let total = p.request.prompt.len() + p.request.max_tokens;
            if self.kv.reserve(kv, total).is_err() {
                self.kv.free_seq(kv);
                break;
            }
            let p = self.waiting.pop_front().expect("front exists");
            self.waiting_count.fetch_sub(1, Ordering::AcqRel);
            let mut sampler = Sampler::new(p.request.sampling.clone());
            for &t in &p.request.prompt {
                sampler.accept(t);
            }
            let n_prompt = p.request.prompt.len();
            let mut tokens = p.request.prompt;
            tokens.reserve_exact(p.request.max_tokens);
            self.running.push(Seq {
                events: p.events,
                kv,
                tokens,
                n_prompt,
                max_tokens: p.request.max_tokens,
                logprobs: p.request.logprobs,
                ignore_eos: p.request.ignore_eos,
                computed: cached,
                generated: 0,
                cached,
                sampler,
                next: None,
                done: None,
            });
        }
    }

    /// Fill `rows`: a decode row per generating sequence, then prompt chunks up to the
    /// token budget. Returns false if there is nothing to compute.
    fn build_rows(&mut self) -> bool {
        self.rows.clear();
        self.row_owner.clear();
        for (i, seq) in self.running.iter().enumerate() {
            if let Some(token) = seq.next {
                self.rows.push(StepRow { token, pos: seq.computed, seq: seq.kv, logits: true });
                self.row_owner.push(i);
            }
        }
        let mut budget = self.cfg.step_tokens.saturating_sub(self.rows.len());
        for (i, seq) in self.running.iter().enumerate() {
            if budget == 0 {
                break;
            }
            if !seq.prefilling() {
                continue;
            }
            let n = (seq.n_prompt - seq.computed).min(budget);
            for pos in seq.computed..seq.computed + n {
                let logits = pos + 1 == seq.n_prompt;
                self.rows.push(StepRow { token: seq.tokens[pos], pos, seq: seq.kv, logits });
                self.row_owner.push(i);
            }
            budget -= n;
        }
        !self.rows.is_empty()
    }

    /// Advance every sequence in the step: count computed tokens, sample where logits are.
    fn after_forward(&mut self) {
        self.logit_owner.clear();
        for (row, &i) in self.rows.iter().zip(&self.row_owner) {
            let seq = &mut self.running[i];
            seq.computed += 1;
            if row.logits {
                self.logit_owner.push(i);
            }
            if seq.next.is_some() {
                seq.next = None; // the fed-back token is now in the cache
            }
        }
        for (j, &i) in self.logit_owner.iter().enumerate() {
            let seq = &mut self.running[i];
            if seq.computed == seq.n_prompt && seq.generated == 0 && self.cfg.prefix_cache {
                let _ = self.kv.publish_prefix(seq.kv, &seq.tokens[..seq.n_prompt]);
            }
            let logits = self.scratch.logits_mut(j);
            seq.sampler.penalize(logits);
            let token = seq.sampler.pick(logits);
            seq.sampler.accept(token);
            if !seq.ignore_eos && self.eog.binary_search(&token).is_ok() {
                seq.done = Some(FinishReason::Stop);
                continue;
            }
            let logprobs = seq.logprobs.map(|top| token_logprobs(logits, token, top));
            let _ = seq.events.send(Event::Token { id: token, logprobs });
            seq.tokens.push(token);
            seq.generated += 1;
            if seq.generated >= seq.max_tokens || seq.tokens.len() >= self.cfg.max_seq_len {
                seq.done = Some(FinishReason::Length);
            } else {
                seq.next = Some(token);
            }
        }
    }

    /// Report and free finished sequences.
    fn retire(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if let Some(reason) = self.running[i].done {
                let seq = self.running.remove(i);
                let usage = Usage { prompt_tokens: seq.n_prompt, completion_tokens: seq.generated, cached_tokens: seq.cached };
                let _ = seq.events.send(Event::Finished { reason, usage });
                self.kv.free_seq(seq.kv);
                self.local.requests_finished += 1;
                self.local.prompt_tokens_total += seq.n_prompt as u64;
                self.local.prompt_tokens_cached += seq.cached as u64;
                self.local.generated_tokens_total += seq.generated as u64;
            } else {
                i += 1;
            }
        }
    }

    /// Free cancelled sequences without reporting (nobody is listening).
    fn retire_quietly(&mut self) {
        let kv = &mut self.kv;
        self.running.retain(|s| {
            let keep = !(s.done.is_some() && s.events.is_closed());
            if !keep {
                kv.free_seq(s.kv);
            }
            keep
        });
    }

    fn publish_stats(&mut self, started: Instant, compute: f64) {
        let l = &mut self.local;
        if compute > 0.0 {
            l.steps_total += 1;
            l.step_seconds_total += started.elapsed().as_secs_f64();
            l.compute_seconds_total += compute;
            l.last_batch_rows = self.rows.len();
        }
        l.queue_depth = self.waiting.len();
        l.running = self.running.len();
        l.kv_blocks_cached = self.kv.cached_blocks();
        l.kv_blocks_used = self.kv.n_blocks() - self.kv.free_blocks();
        if let Ok(mut s) = self.stats.lock() {
            s.clone_from(l);
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
