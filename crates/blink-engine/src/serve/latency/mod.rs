//! The step latency model: how long an engine step will take, so that training work is
//! admitted only into time the requests' TTFT and TPOT targets leave free.
//!
//! A step is an inference pass (its cost is the plan's [`StepCost`]) and, optionally, one
//! training unit ([`UnitCost`]) on the same threads. The two are timed apart, so each part
//! has its own linear model over its features (`features`), and a step's time is the sum.
//!
//! - Offline: [`Coefficients::fit`] fits measured samples by non-negative least squares on
//!   relative errors (`fit`, `solve`); [`Coefficients::save`] and [`Coefficients::load`]
//!   keep them in a JSON file with the setup they were measured on (`file`).
//! - Online: [`LatencyModel`] starts from those coefficients and refits them with every
//!   observed step by recursive least squares with forgetting (`rls`), keeping the offline
//!   model frozen beside it. It tracks both models' relative errors per kind of step
//!   (`window`); the margin of a kind is a quantile of the online model's recent
//!   under-predictions.
//!
//! Nothing here starts threads or does I/O outside the coefficient file; observing a step
//! allocates nothing.

mod coefficients;
mod features;
mod file;
mod fit;
mod rls;
mod solve;
mod window;

use std::time::Duration;

pub use coefficients::{Coefficients, FitReport, KindFit, PassCoefficients, UnitCoefficients};
pub use features::{StepKind, UnitCost, UnitKind, PASS_FEATURES, UNIT_FEATURES};
pub use file::{LatencyFileError, FORMAT, VERSION};
pub use fit::Sample;
pub use window::{ErrorCounts, KindError, ERROR_BUCKETS};

use features::{pass_features, unit_features, PASS_SCALE, UNIT_SCALE};
use rls::Rls;
use window::ErrorTracker;

use crate::serve::StepCost;

/// Observations and predictions shorter than this are taken as this (a relative error
/// needs a positive prediction) or, for observations, dropped.
const MIN_SECONDS: f64 = 1e-6;

/// Settings of the online model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyConfig {
    /// RLS forgetting factor per observation of a part (0.995: the fit's memory is about
    /// the last 200 steps). Clamped to 0.9..=1.
    pub forgetting: f64,
    /// Relative errors kept per kind of step, for medians and margins.
    pub window: usize,
    /// The quantile of recent under-predictions taken as a kind's margin.
    pub margin_quantile: f64,
    /// Observations of a kind needed before its margin comes from its errors.
    pub min_margin_samples: usize,
    /// The margin of a kind with fewer observations: predictions ×1.5 until then.
    pub default_margin: f64,
}

impl Default for LatencyConfig {
    fn default() -> LatencyConfig {
        LatencyConfig { forgetting: 0.995, window: 256, margin_quantile: 0.95, min_margin_samples: 32, default_margin: 0.5 }
    }
}

/// The online latency model: predictions, observations and error figures.
///
/// Predictions come from the online fit. `..._with_margin` multiplies a prediction by
/// `1 + margin` of its kind of step: the `margin_quantile` (0.95) of the positive parts of
/// the last `window` (256) relative errors `(actual − predicted) / predicted` of that kind,
/// or `default_margin` (0.5) while the kind has fewer than `min_margin_samples` (32).
///
/// Each kind of step also has a scale of its own on the shared fit, tracked as a moving
/// average of its log ratio of measured to predicted time: a decode step, a prefill and a
/// mix of both stress the machine differently (a decode row alone streams the weights,
/// one in a batch shares them), more than one linear form captures, and a scale per kind
/// absorbs that without splitting the fit's data (or letting one noisy kind widen every
/// other kind's errors).
pub struct LatencyModel {
    offline: Coefficients,
    offline_pass: [f64; PASS_FEATURES],
    offline_unit: [f64; UNIT_FEATURES],
    pass: Rls<PASS_FEATURES>,
    unit: Rls<UNIT_FEATURES>,
    /// Per kind of step (in [`StepKind::ALL`]'s order), the factor on the shared fit.
    scale: [f64; 7],
    errors: ErrorTracker,
}

/// How fast a kind's scale follows its log ratio (about the last 20 steps of the kind),
/// and the largest log ratio one step may bring: 3%, so a step (an outlier too) moves
/// the scale by at most 0.15%, and a steady bias of 10% is taken up in about 70 steps.
const SCALE_RATE: f64 = 0.05;
const SCALE_STEP: f64 = 0.03;

impl LatencyModel {
    /// A model starting from `coefficients` with the default settings.
    pub fn new(coefficients: Coefficients) -> LatencyModel {
        LatencyModel::with_config(coefficients, LatencyConfig::default())
    }

    /// A model that has measured nothing: the conservative coefficients of
    /// [`Coefficients::uncalibrated`] (a quarter second per step and more), brought down
    /// by the online fit as steps are observed; a feature no step has exercised keeps its
    /// large coefficient.
    pub fn uncalibrated() -> LatencyModel {
        LatencyModel::new(Coefficients::uncalibrated())
    }

    /// A model starting from `coefficients`. A part the report says was fitted on samples
    /// is trusted moderately (the online fit weighs it as 4 to 12 observations along a
    /// typical step, see `rls`); a part fitted on none is trusted little. A coefficient
    /// that is negative is taken as 0, and one that is not finite as its uncalibrated
    /// value.
    pub fn with_config(coefficients: Coefficients, config: LatencyConfig) -> LatencyModel {
        let mut offline = coefficients;
        let pass = sanitize(offline.pass.to_array(), PassCoefficients::uncalibrated().to_array());
        let unit = sanitize(offline.unit.to_array(), UnitCoefficients::uncalibrated().to_array());
        offline.pass = PassCoefficients::from_array(pass);
        offline.unit = UnitCoefficients::from_array(unit);
        let forgetting = if config.forgetting.is_nan() { 0.995 } else { config.forgetting.clamp(0.9, 1.0) };
        // (trust, typical relative error at first)
        let start = |samples: usize| if samples > 0 { (0.5, 0.1) } else { (1.0, 1.0) };
        let (pass_trust, pass_residual) = start(offline.fit.pass_samples);
        let (unit_trust, unit_residual) = start(offline.fit.unit_samples);
        let quantile = if config.margin_quantile.is_nan() { 0.95 } else { config.margin_quantile.clamp(0.0, 1.0) };
        let default_margin = if config.default_margin.is_finite() { config.default_margin.max(0.0) } else { 0.5 };
        LatencyModel {
            offline_pass: pass,
            offline_unit: unit,
            pass: Rls::new(pass, PASS_SCALE, pass_trust, forgetting, pass_residual),
            unit: Rls::new(unit, UNIT_SCALE, unit_trust, forgetting, unit_residual),
            scale: [1.0; 7],
            errors: ErrorTracker::new(config.window, quantile, config.min_margin_samples, default_margin),
            offline,
        }
    }

    /// The online model's time for an inference pass of this cost.
    pub fn predict_pass(&self, cost: &StepCost) -> Duration {
        duration(self.pass_seconds(cost))
    }

    /// The online model's time for this training unit.
    pub fn predict_unit(&self, cost: &UnitCost) -> Duration {
        duration(self.unit_seconds(cost))
    }

    fn pass_seconds(&self, cost: &StepCost) -> f64 {
        let scale = StepKind::of_pass(cost).map_or(1.0, |k| self.scale[k.index()]);
        self.pass.predict(&pass_features(cost)) * scale
    }

    fn unit_seconds(&self, cost: &UnitCost) -> f64 {
        self.unit.predict(&unit_features(cost)) * self.scale[StepKind::of_unit(cost).index()]
    }

    /// [`predict_pass`](Self::predict_pass) × (1 + the margin of the pass's kind). A pass
    /// without rows takes the largest pass margin.
    pub fn predict_pass_with_margin(&self, cost: &StepCost) -> Duration {
        let margin = match StepKind::of_pass(cost) {
            Some(kind) => self.margin(kind),
            None => [StepKind::Decode, StepKind::Prefill, StepKind::Mixed].map(|k| self.margin(k)).into_iter().fold(0.0, f64::max),
        };
        duration(self.pass_seconds(cost) * (1.0 + margin))
    }

    /// [`predict_unit`](Self::predict_unit) × (1 + the margin of the unit's kind).
    pub fn predict_unit_with_margin(&self, cost: &UnitCost) -> Duration {
        duration(self.unit_seconds(cost) * (1.0 + self.margin(StepKind::of_unit(cost))))
    }

    /// The margin predictions of `kind` get.
    pub fn margin(&self, kind: StepKind) -> f64 {
        self.errors.margin(kind)
    }

    /// An inference pass of this cost took `actual`: records both models' errors on it and
    /// refits the online model. A pass without rows, or shorter than a microsecond, is
    /// ignored. Allocates nothing.
    pub fn observe_pass(&mut self, cost: &StepCost, actual: Duration) {
        if let Some(kind) = StepKind::of_pass(cost) {
            observe(&mut self.pass, &mut self.scale[kind.index()], &self.offline_pass, &mut self.errors, kind, &pass_features(cost), actual);
        }
    }

    /// A training unit took `actual`; as [`observe_pass`](Self::observe_pass).
    pub fn observe_unit(&mut self, cost: &UnitCost, actual: Duration) {
        let kind = StepKind::of_unit(cost);
        observe(&mut self.unit, &mut self.scale[kind.index()], &self.offline_unit, &mut self.errors, kind, &unit_features(cost), actual);
    }

    /// Each kind of step's figures (in [`StepKind::ALL`]'s order): observations, median
    /// |relative error| of the online and the offline model over the last window, and the
    /// margin. Sorts into a scratch buffer kept for it and allocates nothing; cheap enough
    /// for every second.
    pub fn errors(&mut self) -> [KindError; 7] {
        self.errors.report()
    }

    /// Every |relative error| of a kind so far, counted in buckets: the online model's,
    /// then the offline one's. A copy; cheap enough for every step.
    pub fn error_counts(&self, kind: StepKind) -> (ErrorCounts, ErrorCounts) {
        self.errors.counts(kind)
    }

    /// The online model's current coefficients, with the offline ones' setup and report.
    pub fn coefficients(&self) -> Coefficients {
        Coefficients {
            pass: PassCoefficients::from_array(self.pass.coefficients()),
            unit: UnitCoefficients::from_array(self.unit.coefficients()),
            setup: self.offline.setup.clone(),
            fit: self.offline.fit.clone(),
        }
    }

    /// The offline coefficients the model started from (frozen).
    pub fn offline(&self) -> &Coefficients {
        &self.offline
    }

    /// Times a numerical fault reset the online fit to the offline coefficients.
    pub fn resets(&self) -> u64 {
        self.pass.resets() + self.unit.resets()
    }
}

/// Record both models' errors on a step of `kind` that took `actual`, then refit the shared
/// fit on the time as the kind's scale leaves it, and move the scale.
#[allow(clippy::too_many_arguments)]
fn observe<const N: usize>(rls: &mut Rls<N>, scale: &mut f64, offline: &[f64; N], errors: &mut ErrorTracker, kind: StepKind, x: &[f64; N], actual: Duration) {
    let t = actual.as_secs_f64();
    if t < MIN_SECONDS {
        return;
    }
    let online = (rls.predict(x) * *scale).max(MIN_SECONDS);
    let frozen = (0..N).map(|i| offline[i] * x[i]).sum::<f64>().max(MIN_SECONDS);
    errors.record(kind, (t - online) / online, (t - frozen) / frozen);
    rls.update(x, t / *scale);
    *scale *= (SCALE_RATE * (t / online).ln().clamp(-SCALE_STEP, SCALE_STEP)).exp();
}

/// Coefficients fit to start from: negatives as 0, non-finite values as `fallback`'s.
fn sanitize<const N: usize>(c: [f64; N], fallback: [f64; N]) -> [f64; N] {
    std::array::from_fn(|i| if c[i].is_finite() { c[i].max(0.0) } else { fallback[i] })
}

/// `secs` as a duration: negative as zero, too large or NaN as the longest duration (a
/// broken prediction must not admit work).
fn duration(secs: f64) -> Duration {
    if secs.is_nan() {
        Duration::MAX
    } else {
        Duration::try_from_secs_f64(secs.max(0.0)).unwrap_or(Duration::MAX)
    }
}
