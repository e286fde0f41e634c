//! The online refit of one part's coefficients: recursive least squares with exponential
//! forgetting, in the same relative form as the offline fit, started from the offline
//! coefficients, with guards against numerical blow-up and against outliers.
//!
//! Relative form: an observation (x, t) is the equation `(x/t) · θ = 1`, so its residual
//! is `e = (t − ŷ) / t` and every step counts by its relative error whatever its size (the
//! offline fit's 1/t² weighting). It also makes a step that took 10× its prediction (the
//! machine was preempted) count a hundredth as much, with a residual below 1.
//!
//! Coordinates: features are divided by nominal scales (`features::PASS_SCALE`,
//! `UNIT_SCALE`), so the coefficients worked on are seconds at a typical size.
//!
//! Prior: the covariance P starts diagonal, with a standard deviation of `trust` × each
//! coefficient (floored at a tenth of the largest, so a coefficient fitted at zero can
//! still move). With `trust` = 0.5 (a calibrated part) the offline model weighs as much
//! as 4 to 12 observations along a typical step's prediction (1 / (0.25 Σ fᵢ²), fᵢ the
//! share of the step's time from feature i); an uncalibrated part uses 1.0, and a first
//! observation moves it nearly all the way. Forgetting (λ = 0.995 by
//! default) scales P by 1/λ at every update, so old observations and the prior fade as λⁿ.
//!
//! Guards, after each update: P is symmetrised; each diagonal entry is bounded by 10⁴× its
//! prior (a direction no step excites would otherwise grow as λ⁻ⁿ without end, the
//! "wind-up"; the bound is loose on purpose: a tight one also binds on directions the data
//! only weakly determine, makes the fit overconfident there and leaves it biased); a
//! non-finite value anywhere resets the fit to its start.
//!
//! Outliers: past ±4× a running mean of recent clipped |residual|s (floored at 1%), an
//! observation gets Huber's weight clip/|e|, in the gain and in the information P absorbs,
//! so one wild step pulls no more than an ordinary one with the clipped residual and does
//! not make the fit overconfident. A step timed faster than predicted has a leverage that
//! grows as (ŷ/t)² under 1/t², so it is weighted down by a further t/ŷ. A lasting change
//! (drift) widens the clip by 15% a step and is followed.
//!
//! Non-negativity: the recursion itself is unconstrained (projecting its state onto θ ≥ 0
//! after each update breaks it: P then describes a fit the state no longer is, and from a
//! far start such a fit was seen to diverge). Predictions use the point of θ ≥ 0 nearest
//! to it in the metric of P⁻¹, which is the non-negative least squares fit of the same
//! (forgetting-weighted) observations: `solve::nearest_non_negative`, run only when some
//! coefficient is negative. Merely clamping a negative coefficient to zero was seen to
//! bias predictions by a few percent where features are correlated (prompt tokens, Σ
//! chunk² and context tokens of prefills).

use super::solve::nearest_non_negative;

/// How the clip follows the residuals: the running mean's rate and floor, and the clip
/// as a multiple of it.
const SCALE_RATE: f64 = 0.05;
const SCALE_FLOOR: f64 = 0.01;
const CLIP: f64 = 4.0;
/// The bound on each diagonal entry of P, as a multiple of its prior.
const P_CAP: f64 = 1e4;

/// Recursive least squares over `N` features.
#[derive(Clone, Debug)]
pub(super) struct Rls<const N: usize> {
    /// Nominal feature scales: the fit works on x / scale.
    scale: [f64; N],
    /// Coefficients × scale (seconds at the nominal size), as the recursion has them
    /// (unconstrained).
    theta: [f64; N],
    /// The non-negative coefficients predictions use: `theta` when it is ≥ 0, else the
    /// nearest non-negative point in the metric of P⁻¹.
    fitted: [f64; N],
    p: [[f64; N]; N],
    start_theta: [f64; N],
    start_p: [[f64; N]; N],
    start_residual_scale: f64,
    forgetting: f64,
    /// Running mean of recent clipped |residual|s.
    residual_scale: f64,
    resets: u64,
}

impl<const N: usize> Rls<N> {
    /// A fit starting at `coefficients` (natural units, ≥ 0 and finite), trusted to
    /// `trust` (relative standard deviation of each), forgetting old observations by
    /// `forgetting` per update. `residual_scale` is the typical relative error expected at
    /// first.
    pub fn new(coefficients: [f64; N], scale: [f64; N], trust: f64, forgetting: f64, residual_scale: f64) -> Rls<N> {
        let theta: [f64; N] = std::array::from_fn(|i| coefficients[i] * scale[i]);
        let floor = (0.1 * theta.iter().fold(0.0f64, |m, v| m.max(*v))).max(1e-6);
        let mut p = [[0.0; N]; N];
        for i in 0..N {
            let sd = trust * theta[i].max(floor);
            p[i][i] = sd * sd;
        }
        Rls {
            scale,
            theta,
            fitted: theta,
            p,
            start_theta: theta,
            start_p: p,
            start_residual_scale: residual_scale,
            forgetting,
            residual_scale,
            resets: 0,
        }
    }

    /// Predicted seconds for natural features `x` (by the non-negative coefficients).
    pub fn predict(&self, x: &[f64; N]) -> f64 {
        (0..N).map(|i| self.fitted[i] * (x[i] / self.scale[i])).sum()
    }

    /// Folds in one observation: features `x` (natural units) took `t` seconds (> 0).
    pub fn update(&mut self, x: &[f64; N], t: f64) {
        let z: [f64; N] = std::array::from_fn(|i| x[i] / self.scale[i] / t);
        let e = 1.0 - (0..N).map(|i| z[i] * self.theta[i]).sum::<f64>();
        // Huber's weight: past the clip the observation counts as one with the clipped
        // residual, and adds as much less information. A step faster than predicted
        // (e < 0, t = ŷ / (1 − e)) has a leverage growing as (ŷ/t)² under the 1/t²
        // weighting: it is weighted down by a further t/ŷ, which keeps its pull bounded
        // however short it was timed.
        let clip = CLIP * self.residual_scale;
        let w = if e > clip {
            clip / e
        } else if e < -clip {
            clip / (-e * (1.0 - e))
        } else {
            1.0
        };
        self.residual_scale = ((1.0 - SCALE_RATE) * self.residual_scale + SCALE_RATE * e.abs().min(clip)).max(SCALE_FLOOR);

        let pz: [f64; N] = std::array::from_fn(|i| (0..N).map(|j| self.p[i][j] * z[j]).sum());
        let denom = self.forgetting + w * (0..N).map(|i| z[i] * pz[i]).sum::<f64>();
        let lambda = self.forgetting;
        for i in 0..N {
            let gain = w * pz[i] / denom;
            self.theta[i] += gain * e;
            for (pij, pzj) in self.p[i].iter_mut().zip(&pz) {
                *pij = (*pij - gain * pzj) / lambda;
            }
        }
        for i in 0..N {
            for j in 0..i {
                let m = 0.5 * (self.p[i][j] + self.p[j][i]);
                self.p[i][j] = m;
                self.p[j][i] = m;
            }
        }
        // Bound each variance, scaling its row and column (D P D keeps P positive).
        let d: [f64; N] = std::array::from_fn(|i| {
            let cap = P_CAP * self.start_p[i][i];
            if self.p[i][i] > cap {
                (cap / self.p[i][i]).sqrt()
            } else {
                1.0
            }
        });
        if d.iter().any(|&v| v != 1.0) {
            for i in 0..N {
                for j in 0..N {
                    self.p[i][j] *= d[i] * d[j];
                }
            }
        }
        let finite = self.theta.iter().all(|v| v.is_finite()) && self.p.iter().flatten().all(|v| v.is_finite());
        if !finite || (0..N).any(|i| self.p[i][i] <= 0.0) || !e.is_finite() {
            self.reset();
            return;
        }
        self.fitted = if self.theta.iter().all(|&v| v >= 0.0) {
            self.theta
        } else {
            nearest_non_negative(&self.theta, &self.p).unwrap_or_else(|| self.theta.map(|v| v.max(0.0)))
        };
    }

    /// Back to the start (the offline coefficients and the prior).
    pub fn reset(&mut self) {
        self.theta = self.start_theta;
        self.fitted = self.start_theta;
        self.p = self.start_p;
        self.residual_scale = self.start_residual_scale;
        self.resets += 1;
    }

    /// The current (non-negative) coefficients, in natural units.
    pub fn coefficients(&self) -> [f64; N] {
        std::array::from_fn(|i| self.fitted[i] / self.scale[i])
    }

    /// Times a non-finite value reset the fit.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    #[cfg(test)]
    pub fn covariance(&self) -> &[[f64; N]; N] {
        &self.p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    const SCALE: [f64; 3] = [1.0, 100.0, 10.0];

    fn sample(rng: &mut Rng) -> [f64; 3] {
        [1.0, (rng.next_f64() * 200.0).floor(), (rng.next_f64() * 20.0).floor()]
    }

    fn time(truth: &[f64; 3], x: &[f64; 3]) -> f64 {
        (0..3).map(|i| truth[i] * x[i]).sum()
    }

    #[test]
    fn converges_to_exact_data_from_a_wrong_start() {
        let truth = [1e-3, 2e-5, 4e-4];
        // As an uncalibrated start: little trust, a wide clip.
        let mut rls = Rls::new([3e-3, 1e-5, 1e-3], SCALE, 1.0, 0.995, 1.0);
        let mut rng = Rng::new(1);
        // The prior is forgotten as λⁿ: after 1500 observations, to 5e-4 of its weight.
        for _ in 0..1500 {
            let x = sample(&mut rng);
            rls.update(&x, time(&truth, &x));
        }
        let got = rls.coefficients();
        for i in 0..3 {
            assert!((got[i] / truth[i] - 1.0).abs() < 1e-3, "{got:?} vs {truth:?}");
        }
        assert_eq!(rls.resets(), 0);
    }

    #[test]
    fn unexcited_directions_keep_their_start_and_a_bounded_variance() {
        let truth = [1e-3, 2e-5, 4e-4];
        let start = [2e-3, 1e-4, 4e-4];
        let mut rls = Rls::new(start, SCALE, 0.5, 0.99, 0.1);
        let prior = rls.covariance()[1][1];
        let mut rng = Rng::new(2);
        for _ in 0..3000 {
            // Feature 1 is never exercised.
            let x = [1.0, 0.0, (rng.next_f64() * 20.0).floor()];
            rls.update(&x, time(&truth, &x));
        }
        let got = rls.coefficients();
        assert_eq!(got[1], start[1], "an unexcited coefficient moved");
        assert!((got[0] / truth[0] - 1.0).abs() < 1e-3 && (got[2] / truth[2] - 1.0).abs() < 1e-3, "{got:?}");
        let p = rls.covariance();
        assert!(p[1][1] <= P_CAP * prior * (1.0 + 1e-12), "P[1][1] = {} grew past the cap {}", p[1][1], P_CAP * prior);
        assert!(p[1][1] > 0.99 * P_CAP * prior, "the unexcited variance should have wound up to its cap");
    }

    #[test]
    fn coefficients_stay_non_negative_and_are_the_constrained_fit() {
        // Data from a model with a negative slope: the fit sits at the bound instead.
        let truth = [5e-3, -1e-6, 4e-4];
        let mut rls = Rls::new([1e-3, 1e-5, 1e-4], SCALE, 1.0, 0.995, 1.0);
        let mut rng = Rng::new(3);
        // The same problem offline: relative least squares under θ ≥ 0.
        let (mut a, mut b) = ([[0.0; 3]; 3], [0.0; 3]);
        for _ in 0..1500 {
            let x = sample(&mut rng);
            let t = time(&truth, &x);
            rls.update(&x, t);
            assert!(rls.coefficients().iter().all(|&c| c >= 0.0));
            for i in 0..3 {
                b[i] += x[i] / t;
                for j in 0..3 {
                    a[i][j] += x[i] * x[j] / (t * t);
                }
            }
        }
        // The recursion found the negative slope; the model holds it at zero and refits
        // the rest, as the offline non-negative fit does.
        assert!((rls.theta[1] / SCALE[1] / truth[1] - 1.0).abs() < 0.05, "{:?}", rls.theta);
        let got = rls.coefficients();
        let reference = crate::serve::latency::solve::nnls(&a, &b, &[true; 3]);
        assert_eq!(got[1], 0.0);
        assert_eq!(reference[1], 0.0);
        for i in [0, 2] {
            assert!((got[i] / reference[i] - 1.0).abs() < 2e-3, "{got:?} vs {reference:?}");
        }
    }

    #[test]
    fn non_finite_values_reset_the_fit() {
        let start = [1e-3, 2e-5, 4e-4];
        let mut rls = Rls::new(start, SCALE, 0.5, 0.995, 0.1);
        rls.update(&[1.0, f64::INFINITY, 1.0], 1e-2);
        assert_eq!(rls.resets(), 1);
        let got = rls.coefficients();
        for i in 0..3 {
            assert!((got[i] / start[i] - 1.0).abs() < 1e-12);
        }
    }
}
