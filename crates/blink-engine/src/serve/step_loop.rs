//! The engine thread's loop: schedule, execute, update. It is pipelined: while step n
//! computes, the scheduler writes step n+1's plan beside it (`schedule`: events of step
//! n−1, releases, new requests, admission, prompt chunks). Between two passes the
//! engine folds step n's output back in (`update`: sampling, finishing, publishing
//! prefixes), admits requests that arrived during step n into step n+1
//! (`schedule_late`) and completes its plan with the decode rows (`add_decodes`).
//!
//! With a co-served trainer (`cotrain`), each step's slack is offered to it before the
//! pass, and the unit it takes runs after the step's output has been folded back and its
//! tokens sent; a step with no inference rows is the trainer's alone, and its unit stops at
//! a layer boundary if a request is submitted meanwhile.
//!
//! Each step is timed: its wall time (from the end of the previous pass to the end of its
//! own, training units left out) and its pass. `f_ctrl = 1 − pass/wall` is the share the
//! serving stack adds to the critical path.

use std::sync::mpsc::Receiver;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blink_model::Model;

use super::api::EngineStats;
use super::coserve::CoServe;
use super::cotrain::CoTraining;
use super::execute::{Executor, RemoteSteps};
use super::plan::StepPlan;
use super::policy::FirstComeFirstServed;
use super::schedule::Scheduler;
use super::{Command, EngineConfig, Occupancy};
use crate::EngineError;

pub(super) struct StepLoop {
    eog: Vec<u32>,
    exec: Executor,
    sched: Scheduler,
    /// The plan of the step about to run (or running), and the next one's, written beside
    /// it.
    plan: StepPlan,
    next: StepPlan,
    train: CoTraining,
    /// Requests submitted and not yet admitted (those the scheduler has not taken from
    /// its commands yet among them): a co-served unit stops when one comes.
    occupancy: Arc<Occupancy>,
}

impl StepLoop {
    pub(super) fn new(
        model: Arc<Model>,
        mut eog: Vec<u32>,
        cfg: &EngineConfig,
        commands: Receiver<Command>,
        stats: Arc<Mutex<EngineStats>>,
        occupancy: Arc<Occupancy>,
        coserve: Option<Box<dyn CoServe>>,
        remote: Option<Box<dyn RemoteSteps>>,
    ) -> Result<StepLoop, EngineError> {
        eog.sort_unstable();
        let cfg = EngineConfig { max_running: cfg.max_running.max(1), step_tokens: cfg.step_tokens.max(1), max_loras: cfg.max_loras.max(1), ..cfg.clone() };
        let exec = match remote {
            Some(steps) => Executor::remote(&model, &cfg, steps)?,
            None => Executor::new(model, &cfg)?,
        };
        let max_rows = cfg.step_tokens.saturating_add(cfg.max_running);
        let plan = || StepPlan::with_capacity(max_rows, cfg.max_running, cfg.max_loras);
        let (plan, next) = (plan(), plan());
        let train = CoTraining::new(&cfg, coserve);
        let sched = Scheduler::new(cfg, commands, stats, occupancy.clone(), Box::new(FirstComeFirstServed), exec.kv());
        Ok(StepLoop { eog, exec, sched, plan, next, train, occupancy })
    }

    /// Tokens the whole cache holds.
    pub(super) fn capacity_tokens(&self) -> usize {
        self.exec.kv().capacity_tokens()
    }

    /// Whether a request has been submitted since the scheduler last looked (one more
    /// waits than its queue holds): asked between the layers of a co-served unit.
    fn arrival_watch(&self) -> impl Fn() -> bool {
        let (occupancy, queued) = (self.occupancy.clone(), self.sched.waiting() as u64);
        move || occupancy.waiting.load(Ordering::Acquire) > queued
    }

    /// Serve until told to stop (or every handle is gone and the work is done).
    pub(super) fn run(mut self) {
        // Whether the coming step's plan was written (beside the last pass).
        let mut planned = false;
        let mut started = Instant::now();
        loop {
            let decoding = self.sched.decoding();
            if !planned {
                if self.sched.idle() && !self.sched.stop && !self.train.has_work() {
                    self.sched.wait_for_command();
                }
                started = Instant::now();
                self.sched.schedule(self.exec.kv_mut(), decoding, &mut self.plan);
            } else {
                self.sched.schedule_late(self.exec.kv_mut(), decoding, &mut self.plan);
            }
            if self.sched.stop {
                return;
            }
            self.sched.add_decodes(&mut self.plan);
            if self.plan.rows.is_empty() {
                planned = false;
                if self.train.offer(&self.sched, None) {
                    let arrived = self.arrival_watch();
                    if let Some(pool) = self.exec.pool() {
                        self.train.run(pool, false, &arrived, &mut self.sched.stats);
                    }
                } else if self.sched.running.is_empty() && self.sched.outbox.is_empty() && (!self.sched.idle() || self.train.has_work()) {
                    // Requests that do not fit yet, or training that does not fit the time
                    // it may have: wait for a command instead of spinning.
                    self.sched.wait_for_room(Duration::from_millis(20));
                }
                continue;
            }
            let was_planned = planned;
            let training = self.train.offer(&self.sched, Some(&self.plan.cost));
            // The next step decodes at most the rows that want logits now.
            let decoding = self.plan.logit_rows();
            let (sched, next) = (&mut self.sched, &mut self.next);
            let result = self.exec.execute(&self.plan, |blocks| {
                let t = Instant::now();
                sched.schedule(blocks, decoding, next);
                t.elapsed()
            });
            match result {
                Ok((beside, compute)) => {
                    planned = true;
                    let now = Instant::now();
                    let s = &mut self.sched.stats;
                    s.steps_total += 1;
                    s.steps_planned_ahead += u64::from(was_planned);
                    s.beside_seconds_total += beside.as_secs_f64();
                    s.step_seconds_total += (now - started).as_secs_f64();
                    s.compute_seconds_total += compute.as_secs_f64();
                    s.last_batch_rows = self.plan.rows.len();
                    started = now;
                    self.train.observe_pass(&self.plan.cost, compute, &mut self.sched.stats);
                    let (kv, scratch) = self.exec.kv_and_scratch();
                    self.sched.update(&self.plan, kv, scratch, &self.eog);
                    if training {
                        // The step's tokens go out first; the unit's time is not the
                        // serving stack's, so the next step's wall time starts after it.
                        self.sched.send_events();
                        let arrived = self.arrival_watch();
                        if let Some(pool) = self.exec.pool() {
                            self.train.run(pool, true, &arrived, &mut self.sched.stats);
                        }
                        started = Instant::now();
                    }
                    std::mem::swap(&mut self.plan, &mut self.next);
                }
                Err(e) => {
                    planned = false;
                    self.sched.fail(&self.plan, &e.to_string());
                }
            }
        }
    }
}
