//! Seeded trace generators: arrival times of a shape at a mean rate, and request lengths.
//!
//! - `poisson`: exponential gaps of mean 1/rate.
//! - `gamma`: gamma gaps of mean 1/rate and coefficient of variation `cv` (shape 1/cv²,
//!   scale cv²/rate): cv 1 is Poisson, larger is burstier (many short gaps, a few long).
//! - `burst-light` and `burst-dense`: DeltaServe's synthetic traces (OSDI artifact,
//!   github.com/852866031/DeltaServe: `osdi_eval.md`, `eval/llama/timelines/
//!   periodic_timeline_gen.py` and the `timeline_loose.csv` / `timeline_tight.csv`
//!   schedules it wrote). A 6 s cycle of a peak and a valley: burst-light has 2 s peaks
//!   and 4 s valleys, burst-dense (the inverse) 4 s peaks and 2 s valleys. Within a
//!   phase requests are evenly spaced at the phase's rate, as there. DeltaServe's
//!   schedules use no requests in valleys (the paper says 0–1 RPS beside 8 RPS peaks);
//!   here a valley's rate is `valley_ratio` × the peak's (default 0), and the peak rate
//!   is set so the mean over whole cycles is the requested rate: peak = rate × 6 /
//!   (peak_s + valley_ratio × valley_s). The cycle starts with its peak (DeltaServe's
//!   starts with a valley after 1 s idle), so the first request is sent at once.
//!
//! Lengths are drawn log-uniformly between a minimum and a maximum (each doubling of
//! length equally likely; with the defaults 32–512 prompt tokens, mean ≈ 173, and 16–128
//! output tokens, mean ≈ 54: mostly short chat turns, a tail of long ones).
//!
//! Randomness is blink-engine's xoshiro256** (`Rng`), so a seed gives the same trace on
//! every platform and release. Arrival times, prompt lengths and output lengths draw from
//! three streams of the seed, so changing one (say the rate) leaves the others alone.

use blink_engine::rng::Rng;

use super::trace::Arrival;

/// An arrival process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    Poisson,
    Gamma { cv: f64 },
    /// Peaks of `peak_s` seconds and valleys of `valley_s` seconds, the valley's rate
    /// `valley_ratio` × the peak's.
    Burst { peak_s: f64, valley_s: f64, valley_ratio: f64 },
}

impl Shape {
    /// The shape named `name` (`poisson`, `gamma`, `burst-light`, `burst-dense`).
    pub fn named(name: &str, cv: f64, valley_ratio: f64) -> Result<Shape, String> {
        match name {
            "poisson" => Ok(Shape::Poisson),
            "gamma" if cv.is_finite() && cv > 0.0 => Ok(Shape::Gamma { cv }),
            "gamma" => Err(format!("--cv must be a positive number, got {cv}")),
            "burst-light" | "burst-dense" if !(0.0..=1.0).contains(&valley_ratio) => Err(format!("--valley-ratio must be within 0..1, got {valley_ratio}")),
            "burst-light" => Ok(Shape::Burst { peak_s: 2.0, valley_s: 4.0, valley_ratio }),
            "burst-dense" => Ok(Shape::Burst { peak_s: 4.0, valley_s: 2.0, valley_ratio }),
            other => Err(format!("unknown shape '{other}' (poisson, gamma, burst-light or burst-dense)")),
        }
    }
}

/// A length range, drawn log-uniformly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lengths {
    pub min: usize,
    pub max: usize,
}

impl Lengths {
    /// `MIN:MAX` or `N` (always N).
    pub fn parse(s: &str) -> Result<Lengths, String> {
        let num = |t: &str| t.trim().parse::<usize>().ok().filter(|&n| n > 0);
        let (min, max) = match s.split_once(':') {
            Some((a, b)) => (num(a), num(b)),
            None => (num(s), num(s)),
        };
        match (min, max) {
            (Some(min), Some(max)) if min <= max => Ok(Lengths { min, max }),
            _ => Err(format!("'{s}' is not a length: want MIN:MAX or N, positive whole numbers, MIN ≤ MAX")),
        }
    }

    fn draw(&self, rng: &mut Rng) -> usize {
        let (lo, hi) = ((self.min as f64).ln(), ((self.max + 1) as f64).ln());
        ((lo + rng.next_f64() * (hi - lo)).exp() as usize).clamp(self.min, self.max)
    }
}

/// A generated trace: `n` arrivals of `shape` at a mean of `rate` requests/s, the first at 0.
pub fn generate(shape: Shape, n: usize, rate: f64, prompts: Lengths, outputs: Lengths, seed: u64) -> Vec<Arrival> {
    let times = arrival_times(shape, n, rate, seed);
    let (mut p, mut o) = (Rng::new(stream(seed, 1)), Rng::new(stream(seed, 2)));
    times.into_iter().map(|at| Arrival { at, prompt_tokens: prompts.draw(&mut p), max_tokens: outputs.draw(&mut o) }).collect()
}

/// The seed of stream `k` of `seed`.
pub fn stream(seed: u64, k: u64) -> u64 {
    seed ^ k.wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// `n` arrival times of `shape` at a mean of `rate`/s, the first at 0. A Poisson or gamma
/// trace at another rate is the same trace on another time scale; a burst trace keeps its
/// 6 s cycle and puts more requests in each peak.
pub fn arrival_times(shape: Shape, n: usize, rate: f64, seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(stream(seed, 0));
    let mut t = 0.0;
    let mut gaps = |gap: &mut dyn FnMut(&mut Rng) -> f64| -> Vec<f64> {
        (0..n)
            .map(|i| {
                if i > 0 {
                    t += gap(&mut rng);
                }
                t / rate
            })
            .collect()
    };
    match shape {
        Shape::Poisson => gaps(&mut exponential),
        Shape::Gamma { cv } => {
            let k = 1.0 / (cv * cv);
            gaps(&mut |rng| gamma(rng, k) / k)
        }
        Shape::Burst { peak_s, valley_s, valley_ratio } => {
            let peak = rate * (peak_s + valley_s) / (peak_s + valley_ratio * valley_s);
            (0..n).map(|i| burst_time(i as f64, peak_s, valley_s, peak, valley_ratio * peak)).collect()
        }
    }
}

/// When the `k`-th request (from 0) of a peak-valley cycle arrives: the time at which the
/// cumulative rate (the integral of the piecewise-constant rate from 0) reaches `k`.
fn burst_time(k: f64, peak_s: f64, valley_s: f64, peak: f64, valley: f64) -> f64 {
    let per_cycle = peak * peak_s + valley * valley_s;
    let cycles = (k / per_cycle).floor();
    let left = k - cycles * per_cycle;
    let start = cycles * (peak_s + valley_s);
    let in_peak = peak * peak_s;
    if left < in_peak {
        start + left / peak
    } else {
        // Only reachable with requests in valleys (valley > 0).
        start + peak_s + (left - in_peak) / valley
    }
}

/// Exp(1).
fn exponential(rng: &mut Rng) -> f64 {
    -(1.0 - rng.next_f64()).ln()
}

/// Standard normal (Box–Muller; one of the pair used).
fn normal(rng: &mut Rng) -> f64 {
    let (u, v) = (1.0 - rng.next_f64(), rng.next_f64());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// Gamma(k, 1) by Marsaglia and Tsang's method; below shape 1 through
/// Gamma(k + 1) × U^(1/k).
fn gamma(rng: &mut Rng, k: f64) -> f64 {
    if k < 1.0 {
        let u = 1.0 - rng.next_f64();
        return gamma(rng, k + 1.0) * u.powf(1.0 / k);
    }
    let d = k - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = 1.0 - rng.next_f64();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Lengths = Lengths { min: 32, max: 512 };
    const O: Lengths = Lengths { min: 16, max: 128 };

    fn gaps(t: &[f64]) -> Vec<f64> {
        t.windows(2).map(|w| w[1] - w[0]).collect()
    }

    fn mean_cv(v: &[f64]) -> (f64, f64) {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64;
        (m, var.sqrt() / m)
    }

    #[test]
    fn a_seed_gives_the_same_trace_and_another_seed_another() {
        for shape in [Shape::Poisson, Shape::Gamma { cv: 4.0 }, Shape::Burst { peak_s: 2.0, valley_s: 4.0, valley_ratio: 0.0 }] {
            let a = generate(shape, 200, 5.0, P, O, 7);
            assert_eq!(a, generate(shape, 200, 5.0, P, O, 7), "{shape:?}");
            assert_ne!(a, generate(shape, 200, 5.0, P, O, 8), "{shape:?}");
            assert_eq!(a[0].at, 0.0);
            assert!(a.windows(2).all(|w| w[0].at <= w[1].at), "{shape:?}: in time order");
        }
        // The lengths do not depend on the rate or the shape.
        let (x, y) = (generate(Shape::Poisson, 50, 1.0, P, O, 3), generate(Shape::Gamma { cv: 2.0 }, 50, 9.0, P, O, 3));
        assert!(x.iter().zip(&y).all(|(a, b)| (a.prompt_tokens, a.max_tokens) == (b.prompt_tokens, b.max_tokens)));
    }

    #[test]
    fn poisson_gaps_have_the_rate_and_cv_one() {
        let t = arrival_times(Shape::Poisson, 40_000, 8.0, 1);
        let (m, cv) = mean_cv(&gaps(&t));
        assert!((m * 8.0 - 1.0).abs() < 0.02, "mean gap {m}");
        assert!((cv - 1.0).abs() < 0.03, "cv {cv}");
        // Counts per second are Poisson: variance ≈ mean.
        let mut counts = vec![0.0; t.last().unwrap().ceil() as usize + 1];
        for x in &t {
            counts[*x as usize] += 1.0;
        }
        counts.pop();
        let (cm, ccv) = mean_cv(&counts);
        assert!((cm - 8.0).abs() < 0.2 && ((ccv * cm).powi(2) / cm - 1.0).abs() < 0.1, "per-second counts: mean {cm}, cv {ccv}");
    }

    #[test]
    fn gamma_gaps_have_the_rate_and_cv() {
        for (cv, tol) in [(1.0, 0.03), (2.0, 0.06), (4.0, 0.12)] {
            let t = arrival_times(Shape::Gamma { cv }, 200_000, 5.0, 2);
            let (m, got) = mean_cv(&gaps(&t));
            assert!((m * 5.0 - 1.0).abs() < 0.03, "cv {cv}: mean gap {m}");
            assert!((got / cv - 1.0).abs() < tol, "cv {cv}: got {got}");
        }
    }

    #[test]
    fn gamma_samples_have_their_moments() {
        let mut rng = Rng::new(3);
        for k in [0.0625, 0.5, 1.0, 3.0] {
            let v: Vec<f64> = (0..100_000).map(|_| gamma(&mut rng, k)).collect();
            let (m, cv) = mean_cv(&v);
            assert!((m / k - 1.0).abs() < 0.05 && (cv * k.sqrt() - 1.0).abs() < 0.05, "k {k}: mean {m}, cv {cv}");
        }
    }

    #[test]
    fn bursts_have_deltaserves_peaks_and_valleys() {
        let light = Shape::named("burst-light", 4.0, 0.0).unwrap();
        let t = arrival_times(light, 600, 5.0, 0);
        // Mean 5/s over a 6 s cycle, all in the 2 s peaks: 15/s, 30 per peak, evenly spaced.
        assert!(t.iter().all(|x| x % 6.0 < 2.0 - 1e-9), "all in peaks");
        assert!(gaps(&t[..30]).iter().all(|g| (g - 1.0 / 15.0).abs() < 1e-9));
        assert!((t[30] - 6.0).abs() < 1e-9, "the next peak starts a cycle later: {}", t[30]);
        assert_eq!(t.iter().filter(|x| **x < 60.0).count(), 300, "5/s over whole cycles");

        let dense = Shape::named("burst-dense", 4.0, 0.25).unwrap();
        let t = arrival_times(dense, 6000, 6.0, 0);
        // Peak rate 6 × 6 / (4 + 0.25 × 2) = 8/s, valley 2/s: 32 + 4 per cycle.
        let in_peak = t.iter().filter(|x| *x % 6.0 < 4.0 - 1e-9).count() as f64;
        assert!((in_peak / t.len() as f64 - 32.0 / 36.0).abs() < 0.01, "{in_peak}");
        let cycles = t.last().unwrap() / 6.0;
        assert!((t.len() as f64 / cycles / 36.0 - 1.0).abs() < 0.01);
        assert!(Shape::named("burst-dense", 4.0, 1.5).is_err() && Shape::named("wave", 4.0, 0.0).is_err() && Shape::named("gamma", 0.0, 0.0).is_err());
    }

    #[test]
    fn lengths_are_log_uniform_within_their_range() {
        let mut rng = Rng::new(5);
        let v: Vec<usize> = (0..100_000).map(|_| P.draw(&mut rng)).collect();
        assert!(v.iter().all(|&n| (32..=512).contains(&n)));
        let mean = v.iter().sum::<usize>() as f64 / v.len() as f64;
        assert!((mean - 173.0).abs() < 3.0, "mean {mean}");
        // Each doubling equally likely: a quarter in each of 32–63, 64–127, 128–255, 256–512.
        let quarter = v.iter().filter(|&&n| (64..128).contains(&n)).count() as f64 / v.len() as f64;
        assert!((quarter - 0.25).abs() < 0.01, "{quarter}");
        assert_eq!(Lengths::parse("8").unwrap(), Lengths { min: 8, max: 8 });
        assert_eq!(Lengths::parse("16:128").unwrap(), O);
        assert!(Lengths::parse("0:4").is_err() && Lengths::parse("9:4").is_err() && Lengths::parse("a").is_err());
        let fixed: Vec<usize> = (0..10).map(|_| Lengths { min: 8, max: 8 }.draw(&mut rng)).collect();
        assert!(fixed.iter().all(|&n| n == 8));
    }
}
