//! The offline calibration fit: coefficients from measured samples by non-negative least
//! squares on relative errors.
//!
//! Each part (inference passes, training units) is fitted on its own samples. A sample
//! (x, t) is weighted by 1/t², i.e. the fit minimises Σ ((x·θ − t) / t)², the squared
//! relative errors, so a 2 ms decode step counts as much as a 2 s prefill. The normal
//! equations are formed in f64 over columns scaled to unit root mean square (for
//! conditioning; a feature no sample exercises is left out and gets 0), with a ridge of
//! 1e-9 on the unit diagonal, and solved under θ ≥ 0 by Lawson and Hanson's active set
//! (`solve::nnls`): a coefficient the unconstrained fit would make negative is held at
//! zero and the others are refitted without it, exactly (not clamped after the fact).

use std::time::Duration;

use super::coefficients::{Coefficients, FitReport, KindFit, PassCoefficients, UnitCoefficients, PASS_NAMES, UNIT_NAMES};
use super::features::{pass_features, unit_features, StepKind, UnitCost};
use super::solve::nnls;
use super::window::{median, quantile};
use super::MIN_SECONDS;
use crate::serve::StepCost;

/// The ridge added to the diagonal of the scaled normal matrix (whose diagonal is 1).
const RIDGE: f64 = 1e-9;

/// One measurement for the offline fit.
#[derive(Clone, Copy, Debug)]
pub enum Sample {
    /// An inference pass of this cost took `time`.
    Pass { cost: StepCost, time: Duration },
    /// A training unit of this cost took `time`.
    Unit { cost: UnitCost, time: Duration },
}

impl Coefficients {
    /// Fits both parts on `samples` (see the module's notes). Samples faster than a
    /// microsecond and passes without rows are dropped. A part without samples keeps the
    /// uncalibrated coefficients (its count in the report is 0). `setup` is left empty for
    /// the caller to fill.
    pub fn fit(samples: &[Sample]) -> Coefficients {
        let mut pass_rows = Vec::new();
        let mut unit_rows = Vec::new();
        for s in samples {
            match *s {
                Sample::Pass { cost, time } => {
                    if let Some(kind) = StepKind::of_pass(&cost) {
                        if time.as_secs_f64() >= MIN_SECONDS {
                            pass_rows.push((kind, pass_features(&cost), time.as_secs_f64()));
                        }
                    }
                }
                Sample::Unit { cost, time } => {
                    if time.as_secs_f64() >= MIN_SECONDS {
                        unit_rows.push((StepKind::of_unit(&cost), unit_features(&cost), time.as_secs_f64()));
                    }
                }
            }
        }
        let mut report = FitReport { pass_samples: pass_rows.len(), unit_samples: unit_rows.len(), ..FitReport::default() };
        let pass = match fit_part(&pass_rows) {
            Some((theta, exercised)) => {
                note_unexercised(&mut report, &PASS_NAMES, &exercised);
                report_kinds(&mut report, &pass_rows, &theta);
                PassCoefficients::from_array(theta)
            }
            None => PassCoefficients::uncalibrated(),
        };
        let unit = match fit_part(&unit_rows) {
            Some((theta, exercised)) => {
                note_unexercised(&mut report, &UNIT_NAMES, &exercised);
                report_kinds(&mut report, &unit_rows, &theta);
                UnitCoefficients::from_array(theta)
            }
            None => UnitCoefficients::uncalibrated(),
        };
        Coefficients { pass, unit, setup: serde_json::Map::new(), fit: report }
    }
}

/// The non-negative relative least squares fit of `rows` (kind, features, seconds), in
/// natural units, with which features any row exercised; `None` without rows.
fn fit_part<const N: usize>(rows: &[(StepKind, [f64; N], f64)]) -> Option<([f64; N], [bool; N])> {
    if rows.is_empty() {
        return None;
    }
    let n = rows.len() as f64;
    // Each row as the equation (x / t) · θ = 1; columns scaled to unit RMS.
    let mut scale = [0.0f64; N];
    for (_, x, t) in rows {
        for j in 0..N {
            scale[j] += (x[j] / t) * (x[j] / t);
        }
    }
    for s in &mut scale {
        *s = (*s / n).sqrt();
    }
    let exercised: [bool; N] = std::array::from_fn(|j| scale[j] > 0.0 && scale[j].is_finite());
    let mut a = [[0.0f64; N]; N];
    let mut b = [0.0f64; N];
    for (_, x, t) in rows {
        let u: [f64; N] = std::array::from_fn(|j| if exercised[j] { x[j] / t / scale[j] } else { 0.0 });
        for i in 0..N {
            b[i] += u[i] / n;
            for j in 0..N {
                a[i][j] += u[i] * u[j] / n;
            }
        }
    }
    for (i, row) in a.iter_mut().enumerate() {
        row[i] += if exercised[i] { RIDGE } else { 1.0 };
    }
    let beta = nnls(&a, &b, &exercised);
    let theta = std::array::from_fn(|j| if exercised[j] { beta[j] / scale[j] } else { 0.0 });
    Some((theta, exercised))
}

fn note_unexercised(report: &mut FitReport, names: &[&str], exercised: &[bool]) {
    report.unexercised.extend(names.iter().zip(exercised).filter(|(_, &e)| !e).map(|(n, _)| n.to_string()));
}

/// Adds each kind's fit errors over `rows` under `theta` to the report.
fn report_kinds<const N: usize>(report: &mut FitReport, rows: &[(StepKind, [f64; N], f64)], theta: &[f64; N]) {
    for kind in StepKind::ALL {
        let mut errors: Vec<f64> = rows
            .iter()
            .filter(|r| r.0 == kind)
            .map(|(_, x, t)| {
                let predicted = (0..N).map(|j| theta[j] * x[j]).sum::<f64>().max(MIN_SECONDS);
                ((t - predicted) / predicted).abs()
            })
            .collect();
        if errors.is_empty() {
            continue;
        }
        let max_abs_error = errors.iter().copied().fold(0.0, f64::max);
        report.kinds.push(KindFit {
            kind,
            count: errors.len(),
            median_abs_error: median(&mut errors),
            p95_abs_error: quantile(&mut errors, 0.95),
            max_abs_error,
        });
    }
}
