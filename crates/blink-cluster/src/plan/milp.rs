//! The planner's problem for a given number of rounds as a mixed-integer program (good_lp
//! over microlp). For each device d:
//! - `w_d` (integer, 0..=L/k): its window; `a_d` (binary): whether it is in the ring,
//!   with `a_d ≤ w_d ≤ (L/k)·a_d`;
//! - `r_d ≥ 0` (continuous): the bytes it reads from disk per token, `r_d ≥ w_d·k·(layer +
//!   kv) − B_d`;
//! - `s_d ≥ 0` (continuous): its stall per round, `s_d ≥ r_d/(k·disk_d) − Σ_{e≠d} w_e·t_e`;
//!
//! subject to `Σ w_d = L/k` and `w_d·(k·kv + layer) ≤ B_d`, minimising
//! `k·Σ w_d·t_d + k·Σ a_d·hop_d + (hop back to the head) + k·Σ s_d`. Minimising pushes
//! `r_d` and `s_d` down onto their bounds, so the program's objective is the time the
//! module above predicts. Times are in milliseconds and bytes in megabytes, which keeps
//! the coefficients within a few orders of magnitude of each other.

use good_lp::{microlp, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};

use super::{Cluster, PlanError};

const MS: f64 = 1e3;
const MB: f64 = 1e6;

/// The best windows over `rounds` rounds, or `None` when no split fits.
pub(super) fn solve(c: &Cluster, rounds: usize) -> Result<Option<Vec<usize>>, PlanError> {
    let m = &c.model;
    let per_round = m.n_layers / rounds;
    let k = rounds as f64;
    let (layer, kv) = (m.layer_bytes as f64 / MB, m.kv_layer_bytes as f64 / MB);
    let n = c.devices.len();

    let mut vars = ProblemVariables::new();
    let w: Vec<Variable> = (0..n).map(|_| vars.add(variable().integer().min(0).max(per_round as f64))).collect();
    let a: Vec<Variable> = (0..n).map(|_| vars.add(variable().binary())).collect();
    let r: Vec<Variable> = (0..n).map(|_| vars.add(variable().min(0))).collect();
    let s: Vec<Variable> = (0..n).map(|_| vars.add(variable().min(0))).collect();

    let t: Vec<f64> = c.devices.iter().map(|d| d.layer_s * MS).collect();
    let hop: Vec<f64> = (0..n).map(|d| c.hop(d) * MS).collect();
    let mut objective = Expression::from(0.0);
    for d in 0..n {
        objective += k * t[d] * w[d] + k * hop[d] * a[d] + k * s[d];
    }
    objective += match c.head {
        Some(h) => Expression::from(hop[h]) - hop[h] * a[h],
        None => Expression::from(c.head_link.hop_seconds(m.hidden_bytes) * MS),
    };

    let mut model = vars.minimise(objective).using(microlp);
    model.add_constraint(w.iter().map(|&x| Expression::from(x)).sum::<Expression>().eq(per_round as f64));
    for d in 0..n {
        let budget = c.budget(d) / MB;
        model.add_constraint((w[d] - a[d]).geq(0.0));
        model.add_constraint((w[d] - per_round as f64 * a[d]).leq(0.0));
        model.add_constraint(((k * kv + layer) * w[d]).leq(budget));
        model.add_constraint((r[d] - k * (layer + kv) * w[d]).geq(-budget));
        let disk = c.devices[d].disk_bytes_per_s / MB / MS; // MB per ms
        let others: Expression = (0..n).filter(|&e| e != d).map(|e| t[e] * w[e]).sum();
        model.add_constraint((s[d] - (1.0 / (k * disk)) * r[d] + others).geq(0.0));
    }
    match model.solve() {
        Ok(sol) => Ok(Some(w.iter().map(|&x| sol.value(x).round().max(0.0) as usize).collect())),
        Err(good_lp::ResolutionError::Infeasible) => Ok(None),
        Err(e) => Err(PlanError::Solver(e.to_string())),
    }
}
