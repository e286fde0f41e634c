//! Co-serving: the one hook between serving and training, and how much of each step it
//! may have.
//!
//! Each step, once the scheduler has planned the step's inference rows, the engine works
//! out the time the step may still take (`free`: see [`TrainingPolicy`]) and offers it to
//! the trainer with the latency model's price of a unit ([`CoServe::offer`]). The trainer
//! answers with the unit of training it will run (a few layers of a batch's forward or
//! backward, its loss head, or a few layers of the optimizer's norm or update), sized to
//! fit, or nothing. The
//! engine runs the step's pass, folds its output back and sends its tokens, then runs the
//! unit on the same threads ([`CoServe::run`]) and times both parts for the latency model.
//! When no request runs, steps are the trainer's alone. The scheduler knows nothing else
//! about training: no request waits behind it, because a unit is only offered time that
//! every running and waiting request can spare, and a request that arrives while a unit
//! runs in an idle step stops it at its next layer boundary (the rest runs in a later
//! step), so it waits at most one layer of a forward or backward, or a loss head.

use std::time::{Duration, Instant};

use blink_runtime::numa::NodePool;

use super::latency::UnitCost;

/// The trainer's side of the hook.
pub trait CoServe: Send {
    /// Whether training work is waiting (when there is none, an idle engine sleeps until a
    /// request comes or [`super::Engine::wake`] is called).
    fn has_work(&mut self) -> bool;
    /// The time the coming step may still take, and the price of a unit: the unit the
    /// trainer will run in this step, sized so its price fits `free`, or `None`.
    fn offer(&mut self, free: Duration, price: &dyn Fn(&UnitCost) -> Duration) -> Option<UnitCost>;
    /// Run the unit just accepted on the engine's threads, asking `stop` at each layer
    /// boundary whether to leave the rest for a later unit (a request has arrived).
    fn run(&mut self, pool: &NodePool, stop: &dyn Fn() -> bool) -> UnitRun;
}

/// What a unit's run did.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitRun {
    /// The part of the unit that ran (fewer layers than accepted if it was stopped;
    /// `None`: nothing ran).
    pub ran: Option<UnitCost>,
    /// The part of its time that was bookkeeping after the unit proper (a checkpoint's
    /// snapshot of the state), which the latency model leaves out of its fit: the trainer
    /// accounts for it itself when it sizes the units that come before it.
    pub bookkeeping: Duration,
}

/// The requests' latency targets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SloTargets {
    /// Time to first token.
    pub ttft: Duration,
    /// Time per output token after the first.
    pub tpot: Duration,
}

impl Default for SloTargets {
    /// One second to the first token, a tenth of a second per token after it (faster
    /// than people read).
    fn default() -> SloTargets {
        SloTargets { ttft: Duration::from_secs(1), tpot: Duration::from_millis(100) }
    }
}

/// How much of a step training may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TrainingPolicy {
    /// Whatever the targets leave: a step carrying a unit must still meet every running
    /// request's TPOT and every prefilling request's TTFT deadline, each at 0.9 of its
    /// target (DeltaServe's guard), none may wait for admission, and with the latency model's
    /// margins on every prediction.
    #[default]
    Slo,
    /// Only steps with no request running or waiting (fine-tuning in idle time only).
    IdleOnly,
    /// A unit in every step regardless of the requests (co-serving without admission
    /// control: the baseline that shows what the control buys; its units run whole).
    Always,
}

impl TrainingPolicy {
    /// Whether a request's arrival stops a unit of an idle step at its next layer boundary.
    pub fn yields_to_arrivals(self) -> bool {
        self != TrainingPolicy::Always
    }

    pub fn parse(s: &str) -> Option<TrainingPolicy> {
        match s {
            "slo" => Some(TrainingPolicy::Slo),
            "idle" => Some(TrainingPolicy::IdleOnly),
            "always" => Some(TrainingPolicy::Always),
            _ => None,
        }
    }
}

/// A running request as the training budget sees it.
#[derive(Clone, Copy, Debug)]
pub struct RequestClock {
    pub arrived: Instant,
    /// Whether its first token has been sent (it decodes now).
    pub decoding: bool,
    /// The predicted time (with margin) of the prompt work left after this step before
    /// its first token: its own and that of the requests whose prompts go before it.
    pub prefill_left: Duration,
}

/// What the coming step looks like to the training budget.
#[derive(Clone, Copy, Debug)]
pub struct StepOutlook {
    pub now: Instant,
    /// The step's inference pass, predicted with its margin (zero: no inference rows).
    pub pass: Duration,
    /// Requests waiting for admission.
    pub waiting: usize,
}

/// The share of each target a step carrying training may use (DeltaServe's guard).
const TARGET_GUARD: f64 = 0.9;

/// The time training may have in the coming step: see [`TrainingPolicy`]. `idle_unit`
/// bounds a unit when no request runs (one that arrives then waits at most that long).
pub fn training_budget(policy: TrainingPolicy, slo: &SloTargets, step: &StepOutlook, requests: impl Iterator<Item = RequestClock>, idle_unit: Duration) -> Duration {
    let mut requests = requests.peekable();
    let idle = requests.peek().is_none() && step.waiting == 0;
    match policy {
        TrainingPolicy::Always => return idle_unit,
        TrainingPolicy::IdleOnly => return if idle { idle_unit } else { Duration::ZERO },
        TrainingPolicy::Slo => {}
    }
    if step.waiting > 0 {
        return Duration::ZERO;
    }
    let mut free = idle_unit;
    for r in requests {
        let room = if r.decoding {
            // The step is one token of every decoding request; 0.9 of the target, as for
            // the TTFT, leaves room for the step's work outside the pass and the unit
            // (sampling, streaming, scheduling).
            slo.tpot.mul_f64(TARGET_GUARD).saturating_sub(step.pass)
        } else {
            // Its first token comes after this step and the prompt work it has left.
            let deadline = r.arrived + slo.ttft.mul_f64(TARGET_GUARD);
            deadline.saturating_duration_since(step.now).saturating_sub(step.pass).saturating_sub(r.prefill_left)
        };
        free = free.min(room);
    }
    free
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn outlook(now: Instant, pass_ms: u64, waiting: usize) -> StepOutlook {
        StepOutlook { now, pass: MS(pass_ms), waiting }
    }

    #[test]
    fn the_budget_is_what_every_request_can_spare() {
        let slo = SloTargets { ttft: MS(1000), tpot: MS(100) };
        let now = Instant::now();
        let idle_unit = MS(250);
        let budget = |step: StepOutlook, reqs: &[RequestClock]| training_budget(TrainingPolicy::Slo, &slo, &step, reqs.iter().copied(), idle_unit);
        // Idle: one unit's cap.
        assert_eq!(budget(outlook(now, 0, 0), &[]), idle_unit);
        // Decoding requests leave 0.9 of the TPOT less the pass.
        let dec = RequestClock { arrived: now - MS(5000), decoding: true, prefill_left: Duration::ZERO };
        assert_eq!(budget(outlook(now, 30, 0), &[dec, dec]), MS(60));
        // A pass longer than that leaves nothing.
        assert_eq!(budget(outlook(now, 95, 0), &[dec]), Duration::ZERO);
        // A prefilling request: 0.9 × TTFT from its arrival, less the pass and what is left.
        let pre = RequestClock { arrived: now - MS(500), decoding: false, prefill_left: MS(100) };
        assert_eq!(budget(outlook(now, 50, 0), &[pre]), MS(250).min(MS(900 - 500 - 50 - 100)));
        let late = RequestClock { arrived: now - MS(850), ..pre };
        assert_eq!(budget(outlook(now, 50, 0), &[late]), Duration::ZERO);
        // Anyone waiting for admission: nothing.
        assert_eq!(budget(outlook(now, 0, 1), &[]), Duration::ZERO);
    }

    #[test]
    fn the_baselines_ignore_or_wait_for_requests() {
        let slo = SloTargets::default();
        let now = Instant::now();
        let dec = [RequestClock { arrived: now, decoding: true, prefill_left: Duration::ZERO }];
        let step = outlook(now, 500, 3);
        assert_eq!(training_budget(TrainingPolicy::Always, &slo, &step, dec.iter().copied(), MS(250)), MS(250));
        assert_eq!(training_budget(TrainingPolicy::IdleOnly, &slo, &step, dec.iter().copied(), MS(250)), Duration::ZERO);
        assert_eq!(training_budget(TrainingPolicy::IdleOnly, &slo, &outlook(now, 0, 0), std::iter::empty(), MS(250)), MS(250));
    }
}
