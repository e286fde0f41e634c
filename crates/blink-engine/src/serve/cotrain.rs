//! The engine thread's side of co-serving: the latency model that times every step, and
//! the co-served trainer with the policy that decides how much of each step it gets.
//! The step loop calls it at three places: before a step's pass (offer the step's slack
//! to the trainer), after the pass (observe its time) and after the step's output is
//! sent (run the unit the trainer took, and observe it).

use std::time::{Duration, Instant};

use blink_runtime::numa::NodePool;

use super::api::{EngineStats, LatencyKindStats};
use super::coserve::{training_budget, CoServe, RequestClock, SloTargets, StepOutlook, TrainingPolicy};
use super::latency::{LatencyModel, StepKind, UnitCost};
use super::plan::StepCost;
use super::schedule::Scheduler;
use super::EngineConfig;

/// How often the latency model's errors are copied into the engine's stats.
const ERRORS_EVERY: Duration = Duration::from_secs(1);

pub(super) struct CoTraining {
    hook: Option<Box<dyn CoServe>>,
    latency: LatencyModel,
    policy: TrainingPolicy,
    slo: SloTargets,
    /// The longest unit when no request runs.
    idle_unit: Duration,
    /// The unit the trainer took for the coming step.
    taken: Option<UnitCost>,
    errors_at: Instant,
}

impl CoTraining {
    pub fn new(cfg: &EngineConfig, hook: Option<Box<dyn CoServe>>) -> CoTraining {
        let latency = match &cfg.latency {
            Some(c) => LatencyModel::new(c.clone()),
            None => LatencyModel::uncalibrated(),
        };
        // A request arriving while a unit runs waits for it: a quarter of its TTFT target.
        let idle_unit = cfg.slo.ttft / 4;
        CoTraining { hook, latency, policy: cfg.training, slo: cfg.slo, idle_unit, taken: None, errors_at: Instant::now() }
    }

    /// Whether a trainer has work waiting.
    pub fn has_work(&mut self) -> bool {
        self.hook.as_mut().is_some_and(|h| h.has_work())
    }

    /// Offer the coming step's slack to the trainer: the step's pass is `pass` (`None`:
    /// the step has no inference rows). Returns whether it took a unit.
    pub fn offer(&mut self, sched: &Scheduler, pass: Option<&StepCost>) -> bool {
        self.taken = None;
        let Some(hook) = self.hook.as_mut() else { return false };
        if !hook.has_work() {
            return false;
        }
        let latency = &self.latency;
        let now = Instant::now();
        let step = StepOutlook { now, pass: pass.map_or(Duration::ZERO, |c| latency.predict_pass_with_margin(c)), waiting: sched.waiting() };
        // Prompts are chunked oldest first (in the running order), so a request's first
        // token waits for the prompt work left of every request ahead of it too, and for
        // the decode rows of the requests decoding now in each step that work takes.
        let live = || sched.running.iter().filter(|s| s.finished().is_none());
        let (decoding, decode_context) = live().filter(|s| s.generated > 0).fold((0, 0), |(n, c), s| (n + 1, c + s.scheduled));
        let chunk = sched.prompt_budget(decoding).max(1);
        let clocks = live().scan((0, Duration::ZERO), move |(tokens_ahead, prompts_ahead), s| {
            let left = s.n_prompt.saturating_sub(s.scheduled);
            if left == 0 {
                return Some(RequestClock { arrived: s.arrived, decoding: s.generated > 0, prefill_left: Duration::ZERO });
            }
            let own = StepCost { prompt_tokens: left, chunk_tokens_squared: left * left, decode_rows: 0, context_tokens: left * s.scheduled + left * (left + 1) / 2, adapters: 0 };
            *prompts_ahead += latency.predict_pass_with_margin(&own);
            *tokens_ahead += left;
            let steps = tokens_ahead.div_ceil(chunk);
            let beside = if decoding == 0 {
                Duration::ZERO
            } else {
                let rows = StepCost { prompt_tokens: 0, chunk_tokens_squared: 0, decode_rows: decoding * steps, context_tokens: decode_context * steps, adapters: 0 };
                latency.predict_pass_with_margin(&rows)
            };
            Some(RequestClock { arrived: s.arrived, decoding: false, prefill_left: *prompts_ahead + beside })
        });
        let free = training_budget(self.policy, &self.slo, &step, clocks, self.idle_unit);
        if free.is_zero() {
            return false;
        }
        let price = |u: &UnitCost| latency.predict_unit_with_margin(u);
        self.taken = hook.offer(free, &price);
        if self.taken.is_none() && pass.is_none() && sched.running.is_empty() && sched.waiting() == 0 {
            // Nothing fits an idle step (an uncalibrated model prices everything high):
            // the smallest unit then, or training would never start, nor the model learn.
            let smallest = |u: &UnitCost| if u.layers <= 1 { Duration::ZERO } else { Duration::MAX };
            self.taken = hook.offer(free, &smallest);
        }
        self.taken.is_some()
    }

    /// The step's pass took `time`.
    pub fn observe_pass(&mut self, cost: &StepCost, time: Duration, stats: &mut EngineStats) {
        self.latency.observe_pass(cost, time);
        if let Some(kind) = StepKind::of_pass(cost) {
            self.keep_counts(kind, stats);
        }
        self.refresh_errors(stats);
    }

    /// Run the unit taken for this step on `pool`; returns its time. A unit in a step of
    /// its own (no request running: it was sized to the idle cap, not to any request's
    /// slack) stops at a layer boundary once `arrived` says a request has come, unless the
    /// policy runs units whole. A unit beside requests runs whole: it fits their slack,
    /// and cutting it at every arrival of a busy period would trade training for switches
    /// between training and inference, which cost both.
    pub fn run(&mut self, pool: &NodePool, beside_requests: bool, arrived: &dyn Fn() -> bool, stats: &mut EngineStats) -> Duration {
        let (Some(taken), Some(hook)) = (self.taken.take(), self.hook.as_mut()) else { return Duration::ZERO };
        let never = || false;
        let stop = if self.policy.yields_to_arrivals() && !beside_requests { arrived } else { &never };
        let t = Instant::now();
        let run = hook.run(pool, stop);
        let time = t.elapsed();
        if let Some(ran) = run.ran {
            self.latency.observe_unit(&ran, time.saturating_sub(run.bookkeeping));
            self.keep_counts(StepKind::of_unit(&ran), stats);
            stats.train_units_stopped += u64::from(ran.layers < taken.layers);
        }
        stats.train_units_total += 1;
        stats.train_seconds_total += time.as_secs_f64();
        stats.train_units_beside_requests += u64::from(beside_requests);
        self.refresh_errors(stats);
        time
    }

    /// A kind's error counts into the stats at every observation (the medians wait for
    /// [`Self::refresh_errors`]), so a reader's two readings bound exactly the steps
    /// between them, the last one of a busy period too.
    fn keep_counts(&self, kind: StepKind, stats: &mut EngineStats) {
        let s = &mut stats.latency[kind.index()];
        (s.online_counts, s.offline_counts) = self.latency.error_counts(kind);
        s.count = s.online_counts.count();
    }

    fn refresh_errors(&mut self, stats: &mut EngineStats) {
        if self.errors_at.elapsed() < ERRORS_EVERY {
            return;
        }
        self.errors_at = Instant::now();
        for e in self.latency.errors() {
            let i = StepKind::ALL.iter().position(|&k| k == e.kind).expect("a kind of StepKind::ALL");
            stats.latency[i] = LatencyKindStats {
                count: e.count,
                median_online: e.median_online.unwrap_or(f64::NAN),
                median_offline: e.median_offline.unwrap_or(f64::NAN),
                margin: e.margin,
                online_counts: e.online_counts,
                offline_counts: e.offline_counts,
            };
        }
    }
}
