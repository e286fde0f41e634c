//! Turning logits into the next token.
//!
//! The chain follows llama.cpp's order: repetition/frequency/presence penalties over the
//! recent window, then top-k, top-p and min-p on the untempered distribution, then
//! temperature and a seeded draw. Temperature ≤ 0 means greedy (argmax after penalties).
//! All buffers are kept between calls, so sampling allocates nothing per token.

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// How to pick tokens. Defaults match llama.cpp's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// ≤ 0: greedy.
    pub temperature: f32,
    /// 0: off.
    pub top_k: usize,
    /// 1: off.
    pub top_p: f32,
    /// 0: off.
    pub min_p: f32,
    /// 1: off. Divides positive logits (multiplies negative ones) of recent tokens.
    pub repeat_penalty: f32,
    /// Window of recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted once per occurrence in the window.
    pub frequency_penalty: f32,
    /// Subtracted once if present in the window.
    pub presence_penalty: f32,
    /// `None`: a fresh random seed.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: None,
        }
    }
}

/// Longest penalty window (`repeat_last_n`) accepted: far past any context in use, small
/// enough that the window's buffers are always allocatable.
pub const MAX_REPEAT_LAST_N: usize = 1 << 20;

impl SamplingParams {
    /// Greedy decoding with no penalties.
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..Default::default() }
    }

    /// Check ranges; the message names the bad parameter.
    pub fn validate(&self) -> Result<(), String> {
        let finite = |name: &str, v: f32| if v.is_finite() { Ok(()) } else { Err(format!("{name} must be a finite number")) };
        finite("temperature", self.temperature)?;
        finite("top_p", self.top_p)?;
        finite("min_p", self.min_p)?;
        finite("repeat_penalty", self.repeat_penalty)?;
        finite("frequency_penalty", self.frequency_penalty)?;
        finite("presence_penalty", self.presence_penalty)?;
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(format!("repeat_penalty must be positive, got {}", self.repeat_penalty));
        }
        if self.repeat_last_n > MAX_REPEAT_LAST_N {
            return Err(format!("repeat_last_n must be at most {MAX_REPEAT_LAST_N}, got {}", self.repeat_last_n));
        }
        Ok(())
    }
}

/// A token candidate: its id and current logit.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// Per-sequence sampling state.
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// The last `repeat_last_n` accepted tokens, oldest first.
    recent: Vec<u32>,
    candidates: Vec<Candidate>,
    window: Vec<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let seed = params.seed.unwrap_or_else(Rng::entropy_seed);
        let cap = params.repeat_last_n;
        Sampler { rng: Rng::new(seed), recent: Vec::with_capacity(cap + 1), candidates: Vec::new(), window: Vec::with_capacity(cap), params }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Record a token of the sequence (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.repeat_last_n {
            self.recent.remove(0);
        }
        self.recent.push(token);
    }

    fn penalties_active(&self) -> bool {
        let p = &self.params;
        p.repeat_last_n > 0 && (p.repeat_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0)
    }

    /// Apply the repetition/frequency/presence penalties to `logits` in place.
    pub fn penalize(&mut self, logits: &mut [f32]) {
        if !self.penalties_active() || self.recent.is_empty() {
            return;
        }
        self.window.clear();
        self.window.extend_from_slice(&self.recent);
        self.window.sort_unstable();
        let p = &self.params;
        for run in self.window.chunk_by(|a, b| a == b) {
            let Some(l) = logits.get_mut(run[0] as usize) else { continue };
            if *l > 0.0 {
                *l /= p.repeat_penalty;
            } else {
                *l *= p.repeat_penalty;
            }
            *l -= run.len() as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Pick the next token from `logits` (modified in place by the penalties).
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.penalize(logits);
        self.pick(logits)
    }

    /// Pick the next token from already penalized `logits`.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        self.sample_stochastic(logits)
    }

    fn sample_stochastic(&mut self, logits: &[f32]) -> u32 {
        let p = self.params.clone();
        let c = &mut self.candidates;
        c.clear();
        let by_logit_desc = |a: &Candidate, b: &Candidate| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
        if p.top_k > 0 && p.top_k < logits.len() {
            top_k_into(logits, p.top_k, c);
        } else {
            c.extend(logits.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &logit)| Candidate { id: i as u32, logit }));
            c.sort_unstable_by(by_logit_desc);
        }
        if c.is_empty() {
            return 0;
        }

        // top-p on the untempered distribution.
        if p.top_p < 1.0 {
            let max = c[0].logit;
            let total: f64 = c.iter().map(|x| ((x.logit - max) as f64).exp()).sum();
            let mut cum = 0.0;
            let mut keep = c.len();
            for (i, x) in c.iter().enumerate() {
                cum += ((x.logit - max) as f64).exp() / total;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep.max(1));
        }
        // min-p: keep tokens whose probability is at least min_p times the best one's.
        if p.min_p > 0.0 {
            let floor = c[0].logit + p.min_p.ln();
            let keep = c.iter().take_while(|x| x.logit >= floor).count();
            c.truncate(keep.max(1));
        }
        // Temperature, then a draw.
        let max = c[0].logit / p.temperature;
        let total: f64 = c.iter().map(|x| ((x.logit / p.temperature - max) as f64).exp()).sum();
        let mut target = self.rng.next_f64() * total;
        for x in c.iter() {
            target -= ((x.logit / p.temperature - max) as f64).exp();
            if target <= 0.0 {
                return x.id;
            }
        }
        c[c.len() - 1].id
    }
}

/// The `k` largest logits, best first (ties by lower id), in one pass: a candidate enters
/// only if it beats the current k-th, so almost every logit costs one comparison.
fn top_k_into(logits: &[f32], k: usize, out: &mut Vec<Candidate>) {
    let better = |a: &Candidate, b: &Candidate| a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    for (i, &logit) in logits.iter().enumerate() {
        if logit.is_nan() {
            continue;
        }
        let cand = Candidate { id: i as u32, logit };
        if out.len() == k {
            if !better(&cand, &out[k - 1]) {
                continue;
            }
            out.pop();
        }
        let at = out.partition_point(|x| better(x, &cand));
        out.insert(at, cand);
    }
}

/// Index of the largest value (the first one on ties); NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    // Two passes the compiler vectorises: the maximum over sixteen lanes, then the first
    // position holding it. NaNs never win, as in a scalar `v > best` scan.
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = if v > *m { v } else { *m };
        }
    }
    let best = rest.iter().chain(&lanes).fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if best == f32::NEG_INFINITY {
        return 0;
    }
    // The first chunk holding it (a branch-free test per chunk), then its place there.
    for (c, chunk) in logits.chunks(LANES).enumerate() {
        if chunk.iter().fold(false, |hit, &v| hit | (v == best)) {
            return (c * LANES + chunk.iter().position(|&v| v == best).unwrap_or(0)) as u32;
        }
    }
    0
}

/// Natural-log probabilities of `logits` (log-softmax, computed in f64).
pub fn log_softmax_at(logits: &[f32], token: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[token] as f64 - max - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_is_the_first_best_of_a_scalar_scan() {
        let scalar = |l: &[f32]| {
            let (mut best, mut best_v) = (0, f32::NEG_INFINITY);
            for (i, &v) in l.iter().enumerate() {
                if v > best_v {
                    (best, best_v) = (i, v);
                }
            }
            best as u32
        };
        let mut s = 0x9e37_79b9u32;
        for n in [1usize, 5, 16, 17, 33, 100, 49152] {
            for round in 0..20 {
                let l: Vec<f32> = (0..n)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 17;
                        s ^= s << 5;
                        match s % 97 {
                            0 if round % 2 == 0 => f32::NAN,
                            1 => f32::NEG_INFINITY,
                            2 => 3.0, // ties: the first wins
                            v => (v % 7) as f32 * 0.5 - 1.0,
                        }
                    })
                    .collect();
                assert_eq!(argmax(&l), scalar(&l), "n {n} round {round}");
            }
        }
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    fn logits() -> Vec<f32> {
        vec![1.0, 5.0, 3.0, 4.9, -2.0, 0.5]
    }

    #[test]
    fn greedy_picks_the_max() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&mut logits()), 1);
    }

    #[test]
    fn repeat_penalty_can_flip_greedy_choice() {
        let mut s = Sampler::new(SamplingParams { repeat_penalty: 1.5, ..SamplingParams::greedy() });
        s.accept(1);
        assert_eq!(s.sample(&mut logits()), 3);
    }

    #[test]
    fn frequency_and_presence_penalties_subtract() {
        let mut s = Sampler::new(SamplingParams { frequency_penalty: 0.1, presence_penalty: 0.5, ..SamplingParams::greedy() });
        s.accept(1);
        s.accept(1);
        let mut l = logits();
        s.sample(&mut l);
        assert!((l[1] - (5.0 - 0.2 - 0.5)).abs() < 1e-6);
        assert_eq!(l[3], 4.9);
    }

    #[test]
    fn same_seed_same_draws() {
        let params = SamplingParams { temperature: 1.5, top_k: 0, top_p: 1.0, min_p: 0.0, seed: Some(42), ..Default::default() };
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..50).map(|_| s.sample(&mut logits())).collect::<Vec<_>>()
        };
        assert_eq!(draw(&params), draw(&params));
        let other = SamplingParams { seed: Some(43), ..params.clone() };
        assert_ne!(draw(&params), draw(&other));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(SamplingParams { temperature: 2.0, top_k: 1, seed: Some(1), ..Default::default() });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits()), 1);
        }
    }

    #[test]
    fn min_p_and_top_p_restrict_the_support() {
        // min_p 0.5 keeps tokens within ln(2) of the best logit: ids 1 and 3.
        let mut s = Sampler::new(SamplingParams { temperature: 5.0, top_k: 0, top_p: 1.0, min_p: 0.5, seed: Some(3), ..Default::default() });
        for _ in 0..200 {
            assert!(matches!(s.sample(&mut logits()), 1 | 3));
        }
        // A tiny top_p keeps only the best token.
        let mut s = Sampler::new(SamplingParams { temperature: 5.0, top_k: 0, top_p: 0.01, min_p: 0.0, seed: Some(3), ..Default::default() });
        for _ in 0..50 {
            assert_eq!(s.sample(&mut logits()), 1);
        }
    }

    #[test]
    fn one_pass_top_k_equals_a_full_sort() {
        let mut rng = Rng::new(5);
        for k in [1usize, 3, 40] {
            // Coarse values so ties occur.
            let logits: Vec<f32> = (0..5000).map(|_| (rng.next_u64() % 200) as f32 / 10.0).collect();
            let mut fast = Vec::new();
            top_k_into(&logits, k, &mut fast);
            let mut all: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let want: Vec<(u32, f32)> = all.into_iter().take(k).collect();
            let got: Vec<(u32, f32)> = fast.iter().map(|c| (c.id, c.logit)).collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn log_softmax_normalises() {
        let l = logits();
        let total: f64 = (0..l.len()).map(|i| log_softmax_at(&l, i).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
    }
}
