//! The engine thread's step loop, pipelined: while step n computes on the pool's own
//! threads, the engine thread builds step n+1 (`control`: hand-off of step n−1's events,
//! releases, new requests, admission, prompt chunks). Between two passes it samples step
//! n's logits, admits any request that arrived during step n into step n+1, and puts step
//! n+1's rows together: one decode row per generating sequence, then the planned prompt
//! chunks.
//!
//! Each step is timed: its wall time (from the end of the previous pass to the end of its
//! own) and its pass. `f_ctrl = 1 − pass/wall` is the share the serving stack adds to the
//! critical path.

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use blink_kernels::numa::NodePool;
use blink_model::kv_cache::KvCache;
use blink_model::{Model, Scratch, StepRow};

use super::api::{EngineStats, Event, TokenLogprobs};
use super::control::Control;
use super::{Command, EngineConfig, Occupancy};
use crate::session::FinishReason;
use crate::EngineError;

pub(super) struct Scheduler {
    model: Arc<Model>,
    eog: Vec<u32>,
    pool: NodePool,
    kv: KvCache,
    scratch: Scratch,
    rows: Vec<StepRow>,
    ctl: Control,
}

impl Scheduler {
    pub(super) fn new(
        model: Arc<Model>,
        mut eog: Vec<u32>,
        cfg: &EngineConfig,
        commands: Receiver<Command>,
        stats: Arc<Mutex<EngineStats>>,
        occupancy: Arc<Occupancy>,
    ) -> Result<Scheduler, EngineError> {
        eog.sort_unstable();
        let cfg = EngineConfig { max_running: cfg.max_running.max(1), step_tokens: cfg.step_tokens.max(1), ..cfg.clone() };
        let max_rows = cfg.step_tokens.saturating_add(cfg.max_running);
        let mut kv = model.try_new_kv_cache(cfg.kv_tokens.max(1), cfg.kv_type).map_err(EngineError::no_memory("a KV cache", cfg.kv_tokens))?;
        kv.limit_cached_tokens(cfg.cached_tokens_limit());
        let scratch = Scratch::try_new(&model, max_rows, cfg.max_running, cfg.max_seq_len.max(1), cfg.n_threads.max(1))
            .map_err(EngineError::no_memory("step buffers", max_rows))?;
        Ok(Scheduler {
            pool: model.detached_pool(cfg.n_threads.max(1)).map_err(EngineError::Threads)?,
            ctl: Control::new(cfg, commands, stats, occupancy, &kv),
            kv,
            scratch,
            rows: Vec::with_capacity(max_rows),
            eog,
            model,
        })
    }

    /// Tokens the whole cache holds.
    pub(super) fn capacity_tokens(&self) -> usize {
        self.kv.capacity_tokens()
    }

    /// Serve until told to stop (or every handle is gone and the work is done).
    pub(super) fn run(mut self) {
        // Whether the control work for the coming step has run (beside the last pass).
        let mut planned = false;
        let mut started = Instant::now();
        loop {
            if !planned {
                if self.ctl.idle() && !self.ctl.stop {
                    self.ctl.wait_for_command();
                }
                started = Instant::now();
                let decoding = self.decoding();
                self.ctl.plan_next(&mut self.kv, decoding);
            } else {
                let decoding = self.decoding();
                self.ctl.admit_late(&mut self.kv, decoding);
            }
            if self.ctl.stop {
                return;
            }
            let decoding = self.assemble();
            if self.rows.is_empty() {
                planned = false;
                if self.ctl.running.is_empty() && self.ctl.outbox.is_empty() && !self.ctl.idle() {
                    self.ctl.wait_for_room(std::time::Duration::from_millis(20));
                }
                continue;
            }
            let was_planned = planned;
            let ctl = &mut self.ctl;
            let result = self.model.forward_beside(&self.pool, &mut self.kv, &self.rows, &mut self.scratch, |blocks| {
                let t = Instant::now();
                ctl.plan_next(blocks, decoding);
                t.elapsed()
            });
            match result {
                Ok((beside, compute)) => {
                    planned = true;
                    let now = Instant::now();
                    let s = &mut self.ctl.stats;
                    s.steps_total += 1;
                    s.steps_planned_ahead += u64::from(was_planned);
                    s.beside_seconds_total += beside.as_secs_f64();
                    s.step_seconds_total += (now - started).as_secs_f64();
                    s.compute_seconds_total += compute.as_secs_f64();
                    s.last_batch_rows = self.rows.len();
                    started = now;
                    self.after_forward();
                }
                Err(e) => {
                    planned = false;
                    self.fail_step(&e.to_string());
                }
            }
        }
    }

    /// Sequences with a sampled token to feed back: the coming step's decode rows.
    fn decoding(&self) -> usize {
        self.ctl.running.iter().filter(|s| s.next.is_some()).count()
    }

    /// Put the step together: a decode row per generating sequence, then the planned
    /// prompt chunks. Returns how many rows will want logits (the next step's decode rows
    /// are at most that many).
    fn assemble(&mut self) -> usize {
        self.rows.clear();
        for seq in &mut self.ctl.running {
            if let (Some(token), None) = (seq.next, seq.done) {
                self.rows.push(StepRow::decode(token, seq.scheduled, seq.kv));
                seq.scheduled += 1;
            }
        }
        self.rows.extend_from_slice(&self.ctl.planned);
        self.ctl.planned.clear();
        self.rows.iter().filter(|r| r.logits).count()
    }

    /// Advance every sequence in the step and sample where logits are; the events go out
    /// beside the next step.
    fn after_forward(&mut self) {
        let ctl = &mut self.ctl;
        let mut j = 0;
        for row in &self.rows {
            let i = ctl.index(row.seq);
            let seq = &mut ctl.running[i];
            seq.computed += 1;
            seq.next = None;
            if !row.logits {
                continue;
            }
            let logits = self.scratch.logits_mut(j);
            j += 1;
            if seq.done.is_some() {
                continue; // cancelled while the step ran
            }
            if seq.computed == seq.n_prompt && seq.generated == 0 && ctl.cfg.prefix_cache {
                let _ = self.kv.publish_prefix(seq.kv, &seq.tokens[..seq.n_prompt]);
            }
            seq.sampler.penalize(logits);
            let token = seq.sampler.pick(logits);
            seq.sampler.accept(token);
            if !seq.ignore_eos && self.eog.binary_search(&token).is_ok() {
                seq.done = Some(FinishReason::Stop);
                continue;
            }
            let logprobs = seq.logprobs.map(|top| token_logprobs(logits, token, top));
            ctl.outbox.push((seq.kv, Event::Token { id: token, logprobs }));
            seq.tokens.push(token);
            seq.generated += 1;
            if seq.generated >= seq.max_tokens || seq.tokens.len() >= ctl.cfg.max_seq_len {
                seq.done = Some(FinishReason::Length);
            } else {
                seq.next = Some(token);
            }
        }
    }

    /// A step could not run (a bug or an inconsistent cache): fail its sequences, put the
    /// others' prompts back to be planned again, and keep serving.
    fn fail_step(&mut self, error: &str) {
        let msg = format!("forward pass failed: {error}");
        let ctl = &mut self.ctl;
        for row in &self.rows {
            let i = ctl.index(row.seq);
            let seq = &mut ctl.running[i];
            if seq.done.is_none() {
                seq.done = Some(FinishReason::Stop);
                ctl.outbox.push((seq.kv, Event::Failed(msg.clone())));
            }
        }
        for seq in &mut ctl.running {
            seq.scheduled = seq.computed;
        }
        ctl.planned.clear();
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
