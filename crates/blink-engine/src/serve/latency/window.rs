//! Recent relative errors per kind of step: for each kind, rings of the last N errors of
//! the online and of the frozen offline model, the margin taken from them, and the order
//! statistics (median, quantile) read from them. The rings and the scratch space for
//! sorting are allocated once; recording an error allocates nothing.

use super::features::StepKind;

/// The last `capacity` values pushed, in no particular order.
pub(super) struct Ring {
    values: Box<[f64]>,
    len: usize,
    next: usize,
}

impl Ring {
    pub fn new(capacity: usize) -> Ring {
        Ring { values: vec![0.0; capacity.max(1)].into_boxed_slice(), len: 0, next: 0 }
    }

    pub fn push(&mut self, v: f64) {
        self.values[self.next] = v;
        self.next = (self.next + 1) % self.values.len();
        self.len = (self.len + 1).min(self.values.len());
    }

    pub fn values(&self) -> &[f64] {
        &self.values[..self.len]
    }
}

/// The nearest-rank `q`-quantile of `values` (the ⌈q·n⌉-th smallest, so a 0.95 quantile
/// is never below 95% of them); `values` is reordered. `values` must not be empty.
pub(super) fn quantile(values: &mut [f64], q: f64) -> f64 {
    let n = values.len();
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    *values.select_nth_unstable_by(rank - 1, f64::total_cmp).1
}

/// The median of `values` (the mean of the middle two for an even count); `values` is
/// reordered. `values` must not be empty.
pub(super) fn median(values: &mut [f64]) -> f64 {
    let n = values.len();
    let (below, upper, _) = values.select_nth_unstable_by(n / 2, f64::total_cmp);
    let upper = *upper;
    if n % 2 == 1 {
        upper
    } else {
        let lower = below.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lower + upper) / 2.0
    }
}

/// Upper bounds of the buckets [`ErrorCounts`] counts |relative errors| in: every 1% up to
/// 20% (a median interpolated within them is within a point), then coarser.
pub const ERROR_BUCKETS: [f64; 27] = [
    0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.10, 0.11, 0.12, 0.13, 0.14, 0.15, 0.16, 0.17, 0.18, 0.19, 0.20, 0.25, 0.30, 0.40, 0.50, 0.75, 1.0, 2.0,
];

/// How many |relative errors| fell in each bucket of [`ERROR_BUCKETS`] (the last count:
/// above the last bound, or not a number), and their sum: a cumulative histogram once
/// summed up, exported as such so that a client can take the median of any span of steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ErrorCounts {
    pub buckets: [u64; ERROR_BUCKETS.len() + 1],
    /// The sum of the errors counted (those above the last bound too; not-a-numbers left
    /// out).
    pub sum: f64,
}

impl ErrorCounts {
    pub fn add(&mut self, abs_error: f64) {
        let i = ERROR_BUCKETS.iter().position(|&b| abs_error <= b).unwrap_or(ERROR_BUCKETS.len());
        self.buckets[i] += 1;
        if !abs_error.is_nan() {
            self.sum += abs_error;
        }
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// One kind's prediction errors, as [`super::LatencyModel::errors`] reports them. Errors
/// are relative, `(actual − predicted) / predicted`, each taken before the observation
/// updates the online model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KindError {
    pub kind: StepKind,
    /// Observations of this kind so far (the medians cover the last window of them).
    pub count: u64,
    /// Median |relative error| of the online model; `None` before any observation.
    pub median_online: Option<f64>,
    /// Median |relative error| of the frozen offline model on the same steps.
    pub median_offline: Option<f64>,
    /// The margin predictions of this kind get: `predicted × (1 + margin)`.
    pub margin: f64,
    /// Whether `margin` is the quantile of recent errors (false: too few observations
    /// yet, it is the conservative default).
    pub margin_from_data: bool,
    /// Every |relative error| of the online and of the offline model so far, counted in
    /// buckets.
    pub online_counts: ErrorCounts,
    pub offline_counts: ErrorCounts,
}

struct KindTrack {
    online: Ring,
    offline: Ring,
    count: u64,
    online_counts: ErrorCounts,
    offline_counts: ErrorCounts,
    /// The quantile of the online model's recent under-predictions, once there are enough.
    margin: Option<f64>,
}

/// Every kind's errors and margin.
pub(super) struct ErrorTracker {
    kinds: [KindTrack; StepKind::ALL.len()],
    scratch: Vec<f64>,
    quantile: f64,
    min_samples: usize,
    default_margin: f64,
}

impl ErrorTracker {
    /// Rings of `window` errors; margins are the `quantile` of the last errors once a kind
    /// has `min_samples` of them, `default_margin` before.
    pub fn new(window: usize, quantile: f64, min_samples: usize, default_margin: f64) -> ErrorTracker {
        let window = window.max(1);
        ErrorTracker {
            kinds: std::array::from_fn(|_| KindTrack { online: Ring::new(window), offline: Ring::new(window), count: 0, online_counts: ErrorCounts::default(), offline_counts: ErrorCounts::default(), margin: None }),
            scratch: Vec::with_capacity(window),
            quantile,
            min_samples: min_samples.clamp(1, window),
            default_margin,
        }
    }

    /// Records one observation's relative errors and updates the kind's margin.
    pub fn record(&mut self, kind: StepKind, online: f64, offline: f64) {
        let k = &mut self.kinds[kind.index()];
        k.online.push(online);
        k.offline.push(offline);
        k.online_counts.add(online.abs());
        k.offline_counts.add(offline.abs());
        k.count += 1;
        if k.online.values().len() >= self.min_samples {
            self.scratch.clear();
            self.scratch.extend(k.online.values().iter().map(|e| e.max(0.0)));
            k.margin = Some(quantile(&mut self.scratch, self.quantile));
        }
    }

    pub fn margin(&self, kind: StepKind) -> f64 {
        self.kinds[kind.index()].margin.unwrap_or(self.default_margin)
    }

    /// A kind's counts so far: of the online model's errors, then of the offline one's.
    pub fn counts(&self, kind: StepKind) -> (ErrorCounts, ErrorCounts) {
        let k = &self.kinds[kind.index()];
        (k.online_counts, k.offline_counts)
    }

    /// Every kind's figures, in [`StepKind::ALL`]'s order.
    pub fn report(&mut self) -> [KindError; 7] {
        StepKind::ALL.map(|kind| {
            let k = &self.kinds[kind.index()];
            let mut abs_median = |ring: &Ring| {
                (!ring.values().is_empty()).then(|| {
                    self.scratch.clear();
                    self.scratch.extend(ring.values().iter().map(|e| e.abs()));
                    median(&mut self.scratch)
                })
            };
            KindError {
                kind,
                count: k.count,
                median_online: abs_median(&k.online),
                median_offline: abs_median(&k.offline),
                margin: k.margin.unwrap_or(self.default_margin),
                margin_from_data: k.margin.is_some(),
                online_counts: k.online_counts,
                offline_counts: k.offline_counts,
            }
        })
    }

    /// Capacity of the scratch space and of every ring, for tests that nothing grows.
    #[cfg(test)]
    pub fn capacities(&self) -> (usize, usize) {
        (self.scratch.capacity(), self.kinds[0].online.values.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_last_values() {
        let mut r = Ring::new(3);
        assert!(r.values().is_empty());
        for v in 1..=5 {
            r.push(v as f64);
        }
        let mut got = r.values().to_vec();
        got.sort_by(f64::total_cmp);
        assert_eq!(got, [3.0, 4.0, 5.0]);
    }

    #[test]
    fn order_statistics() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.95), 95.0);
        assert_eq!(quantile(&mut v, 0.951), 96.0);
        assert_eq!(quantile(&mut v, 1.0), 100.0);
        assert_eq!(quantile(&mut v, 0.0), 1.0);
        assert_eq!(median(&mut v), 50.5);
        let mut v = vec![3.0, 1.0, 2.0];
        assert_eq!(median(&mut v), 2.0);
        assert_eq!(median(&mut [7.0]), 7.0);
    }

    #[test]
    fn margin_is_the_default_until_enough_errors_then_the_quantile_of_under_predictions() {
        let mut t = ErrorTracker::new(100, 0.9, 10, 0.5);
        for i in 0..9 {
            t.record(StepKind::Decode, 0.01 * i as f64, 0.0);
        }
        assert_eq!(t.margin(StepKind::Decode), 0.5);
        assert!(!t.report()[0].margin_from_data);
        t.record(StepKind::Decode, 0.09, 0.0);
        // 0.00 … 0.09: the ⌈0.9·10⌉ = 9th smallest is 0.08.
        assert!((t.margin(StepKind::Decode) - 0.08).abs() < 1e-15);
        // Over-predictions count as zero: 90 more at −0.2 leave 10 positive of 100.
        for _ in 0..90 {
            t.record(StepKind::Decode, -0.2, 0.0);
        }
        assert_eq!(t.margin(StepKind::Decode), 0.0);
        // Other kinds are untouched.
        assert_eq!(t.margin(StepKind::Prefill), 0.5);
        let r = t.report();
        assert_eq!(r[0].count, 100);
        assert_eq!(r[0].median_online, Some(0.2));
        assert_eq!(r[0].median_offline, Some(0.0));
        assert_eq!(r[1].median_online, None);
        assert_eq!(t.capacities(), (100, 100));
        // Since the start, every error in its bucket: 0.00 and 0.01 in the first
        // (bounds are inclusive), 0.02 … 0.09 one each, the 90 at 0.2 in the 20% bucket.
        let c = r[0].online_counts;
        assert_eq!((c.buckets[0], c.buckets[1], c.buckets[8], c.buckets[19], c.count()), (2, 1, 1, 90, 100));
        assert!((c.sum - (0.45 + 18.0)).abs() < 1e-9, "{}", c.sum);
        assert_eq!((r[0].offline_counts.buckets[0], r[0].offline_counts.count()), (100, 100));
        assert_eq!(r[1].online_counts.count(), 0);
    }

    #[test]
    fn error_counts_put_large_and_broken_errors_in_the_last_bucket() {
        let mut c = ErrorCounts::default();
        for e in [0.105, 2.0, 2.5, f64::INFINITY, f64::NAN] {
            c.add(e);
        }
        assert_eq!((c.buckets[10], c.buckets[26], c.buckets[27], c.count()), (1, 1, 3, 5));
        assert_eq!(c.sum, f64::INFINITY);
    }
}
