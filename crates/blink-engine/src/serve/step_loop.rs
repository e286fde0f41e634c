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
//! A remote executor that keeps several steps in flight (a ring of devices) runs
//! [`StepLoop::run_in_flight`] instead: up to its depth, steps of different sequences
//! (each a share of the decoding sequences, and prompt chunks) are launched one after
//! another, and each is folded back as it lands, its sequences then free for the next.
//!
//! Each step is timed: its wall time (from the end of the previous pass to the end of its
//! own, training units left out) and its pass. `f_ctrl = 1 − pass/wall` is the share the
//! serving stack adds to the critical path.

use std::collections::VecDeque;
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
    /// With several steps in flight: a plan for each.
    flight_plans: Vec<StepPlan>,
    train: CoTraining,
    /// Requests submitted and not yet admitted (those the scheduler has not taken from
    /// its commands yet among them): a co-served unit stops when one comes.
    occupancy: Arc<Occupancy>,
}

impl StepLoop {
    // The engine's channels and shared state, and the two kinds of work beside inference
    // (co-served training, or a ring's steps): each is the loop's own.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        model: Arc<Model>,
        mut eog: Vec<u32>,
        cfg: &EngineConfig,
        commands: Receiver<Command>,
        stats: Arc<Mutex<EngineStats>>,
        occupancy: Arc<Occupancy>,
        coserve: Option<Box<dyn CoServe>>,
        remote: Option<(Box<dyn RemoteSteps>, usize)>,
    ) -> Result<StepLoop, EngineError> {
        eog.sort_unstable();
        let cfg = EngineConfig { max_running: cfg.max_running.max(1), step_tokens: cfg.step_tokens.max(1), max_loras: cfg.max_loras.max(1), ..cfg.clone() };
        let exec = match remote {
            Some((steps, depth)) => Executor::remote(&model, &cfg, steps, depth)?,
            None => Executor::new(model, &cfg)?,
        };
        let max_rows = cfg.step_tokens.saturating_add(cfg.max_running);
        let new_plan = || StepPlan::with_capacity(max_rows, cfg.max_running, cfg.max_loras);
        let (plan, next) = (new_plan(), new_plan());
        let flight_plans = if exec.depth() > 1 { (0..exec.depth()).map(|_| new_plan()).collect() } else { Vec::new() };
        let train = CoTraining::new(&cfg, coserve);
        let sched = Scheduler::new(cfg, commands, stats, occupancy.clone(), Box::new(FirstComeFirstServed), exec.kv());
        Ok(StepLoop { eog, exec, sched, plan, next, flight_plans, train, occupancy })
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
        if self.exec.depth() > 1 {
            return self.run_in_flight();
        }
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
                Err(EngineError::CachesEmptied) => {
                    planned = false;
                    self.sched.restart(&self.plan, self.exec.kv_mut());
                }
                Err(e) => {
                    planned = false;
                    self.sched.fail(&self.plan, &e.to_string());
                }
            }
        }
    }

    /// Serve with up to the executor's depth of steps in flight: launch steps while there
    /// is room and work (each takes a share of the sequences with a token to feed back,
    /// so the sequences spread over the steps in flight), then land the step that comes
    /// back, fold it in and send its tokens.
    fn run_in_flight(mut self) {
        let depth = self.exec.depth();
        let mut spare = std::mem::take(&mut self.flight_plans);
        let mut flights: VecDeque<(u64, StepPlan, Instant)> = VecDeque::with_capacity(depth);
        loop {
            while flights.len() < depth {
                if flights.is_empty() && self.sched.idle() && !self.sched.stop {
                    self.sched.wait_for_command();
                }
                let mut plan = spare.pop().expect("a plan for every step in flight");
                let share = self.sched.running.len().div_ceil(depth).max(1);
                let decoding = self.sched.decoding().min(share);
                self.sched.schedule(self.exec.kv_mut(), decoding, &mut plan);
                if self.sched.stop {
                    return;
                }
                self.sched.add_decodes_upto(&mut plan, share);
                if plan.rows.is_empty() {
                    spare.push(plan);
                    break;
                }
                match self.exec.launch(&plan) {
                    Ok(id) => {
                        self.sched.in_flight(&plan, true);
                        flights.push_back((id, plan, Instant::now()));
                    }
                    Err(EngineError::CachesEmptied) => {
                        self.sched.restart(&plan, self.exec.kv_mut());
                        spare.push(plan);
                    }
                    Err(e) => {
                        self.sched.fail(&plan, &e.to_string());
                        spare.push(plan);
                    }
                }
            }
            if flights.is_empty() {
                if self.sched.running.is_empty() && self.sched.outbox.is_empty() && !self.sched.idle() {
                    // Requests that do not fit yet: wait for a command instead of spinning.
                    self.sched.wait_for_room(Duration::from_millis(20));
                }
                continue;
            }
            match self.exec.land() {
                Ok(id) => {
                    let Some(at) = flights.iter().position(|f| f.0 == id) else {
                        // Not a step of ours: the executor is confused; fail them all.
                        self.fail_flights(&mut flights, &mut spare, &format!("step {id} came back, which was not in flight"));
                        continue;
                    };
                    let (_, plan, launched) = flights.remove(at).expect("a step in flight");
                    let s = &mut self.sched.stats;
                    s.steps_total += 1;
                    s.step_seconds_total += launched.elapsed().as_secs_f64();
                    s.compute_seconds_total += launched.elapsed().as_secs_f64();
                    s.last_batch_rows = plan.rows.len();
                    self.sched.in_flight(&plan, false);
                    let (kv, scratch) = self.exec.kv_and_scratch();
                    self.sched.update(&plan, kv, scratch, &self.eog);
                    self.sched.send_events();
                    spare.push(plan);
                }
                Err(e) => self.fail_flights(&mut flights, &mut spare, &e.to_string()),
            }
        }
    }

    /// Every step in flight failed (a remote executor's error fails them all).
    fn fail_flights(&mut self, flights: &mut VecDeque<(u64, StepPlan, Instant)>, spare: &mut Vec<StepPlan>, error: &str) {
        for (_, plan, _) in flights.drain(..) {
            self.sched.in_flight(&plan, false);
            self.sched.fail(&plan, error);
            spare.push(plan);
        }
    }
}
