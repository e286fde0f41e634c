//! The jobs' executor as the serving engine's co-serving hook: it answers the engine's
//! offer of a step's free time with a unit of the running job, priced by the engine's
//! latency model, and runs it on the engine's threads.

use std::time::Duration;

use blink_engine::serve::latency::{UnitCost, UnitKind};
use blink_engine::serve::{CoServe, UnitRun};
use blink_model::train;
use blink_runtime::numa::NodePool;

use super::units::{Accepted, Executor};
use crate::run::Unit;

/// Fine-tuning jobs co-served by the engine.
pub struct CoServedJobs {
    executor: Executor,
}

impl CoServedJobs {
    pub fn new(executor: Executor) -> CoServedJobs {
        CoServedJobs { executor }
    }
}

impl CoServe for CoServedJobs {
    fn has_work(&mut self) -> bool {
        self.executor.has_work()
    }

    fn offer(&mut self, free: Duration, price: &dyn Fn(&UnitCost) -> Duration) -> Option<UnitCost> {
        self.executor.offer(free, &|a| price(&cost_of(a))).map(|a| cost_of(&a))
    }

    fn run(&mut self, pool: &NodePool, stop: &dyn Fn() -> bool) -> UnitRun {
        let (ran, bookkeeping) = self.executor.run(pool, stop);
        UnitRun { ran: ran.map(|a| cost_of(&a)), bookkeeping }
    }
}

/// What the latency model prices a unit by.
pub fn cost_of(a: &Accepted) -> UnitCost {
    match a.unit {
        Unit::Batch(s) => {
            let kind = match s.kind {
                train::UnitKind::Forward => UnitKind::Forward,
                train::UnitKind::Head => UnitKind::Head,
                train::UnitKind::Backward => UnitKind::Backward,
            };
            UnitCost { kind, rows: s.rows, attn: s.attn, layers: a.layers, head_rows: s.head_rows, params: 0 }
        }
        Unit::GradNorm { layers, params } => optimizer(UnitKind::GradNorm, a.layers, layers, params),
        Unit::Optimizer { layers, params } => optimizer(UnitKind::Optimizer, a.layers, layers, params),
    }
}

/// An optimizer unit over `taken` of the `layers` left, which hold `params` parameters
/// (the same number in each layer).
fn optimizer(kind: UnitKind, taken: usize, layers: usize, params: usize) -> UnitCost {
    let params = if taken >= layers { params } else { params / layers.max(1) * taken };
    UnitCost { kind, rows: 0, attn: 0, layers: taken, head_rows: 0, params }
}
