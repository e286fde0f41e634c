//! AdamW over flat f32 tensors, with PyTorch's `torch.optim.AdamW` semantics (decoupled
//! weight decay, bias-corrected moments, `eps` added after the square root).
//!
//! One step `t` (1-based) with gradient `g`, for every element:
//! `p *= 1 - lr·wd; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
//!  p -= lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + eps)`,
//! which is `p -= lr · m̂ / (sqrt(v̂) + eps)`. The operations run in the order of torch's
//! single-tensor implementation: scalar factors computed in f64 and rounded to f32 once, `m`
//! updated as torch's `lerp` does, then element-wise f32 arithmetic (no fused multiply-adds).
//! The moments are f32, one pair of buffers per tensor, exposed for checkpoints.

use super::OptimError;

/// AdamW's hyper-parameters (PyTorch's names and defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamWConfig {
    /// `lr` and `weight_decay`, with betas (0.9, 0.999) and eps 1e-8.
    pub fn new(lr: f64, weight_decay: f64) -> AdamWConfig {
        AdamWConfig { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay }
    }

    /// The ranges torch accepts: `lr`, `eps`, `weight_decay` ≥ 0 and betas in [0, 1).
    pub fn validate(&self) -> Result<(), OptimError> {
        let bad = |what: &str, v: f64| Err(OptimError::Setting(format!("{what} is {v}")));
        for (what, v) in [("lr", self.lr), ("eps", self.eps), ("weight_decay", self.weight_decay)] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(what, v);
            }
        }
        for (what, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return bad(what, v);
            }
        }
        Ok(())
    }
}

impl Default for AdamWConfig {
    /// torch's defaults: lr 1e-3, weight decay 1e-2.
    fn default() -> AdamWConfig {
        AdamWConfig::new(1e-3, 1e-2)
    }
}

/// AdamW's state over a fixed list of tensors: the step count and both moments.
#[derive(Clone, Debug)]
pub struct AdamW {
    config: AdamWConfig,
    steps: u64,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// The factors of the step begun last (a step taken tensor by tensor).
    factors: Option<Factors>,
}

impl AdamW {
    /// Zero state for tensors of `sizes` elements.
    pub fn new(config: AdamWConfig, sizes: &[usize]) -> Result<AdamW, OptimError> {
        config.validate()?;
        let zeros = || sizes.iter().map(|&n| vec![0f32; n]).collect::<Vec<_>>();
        Ok(AdamW { config, steps: 0, m: zeros(), v: zeros(), factors: None })
    }

    /// State restored from a checkpoint: `steps` taken, first moments `m`, second moments `v`.
    pub fn from_state(config: AdamWConfig, steps: u64, m: Vec<Vec<f32>>, v: Vec<Vec<f32>>) -> Result<AdamW, OptimError> {
        config.validate()?;
        if m.len() != v.len() || m.iter().zip(&v).any(|(a, b)| a.len() != b.len()) {
            return Err(OptimError::Shape("the first and second moments differ in shape".into()));
        }
        Ok(AdamW { config, steps, m, v, factors: None })
    }

    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// Sets the learning rate for the next steps (what a schedule does).
    pub fn set_lr(&mut self, lr: f64) -> Result<(), OptimError> {
        AdamWConfig { lr, ..self.config }.validate()?;
        self.config.lr = lr;
        Ok(())
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn n_tensors(&self) -> usize {
        self.m.len()
    }

    /// Tensor `i`'s first and second moments.
    pub fn moments(&self, i: usize) -> Option<(&[f32], &[f32])> {
        Some((self.m.get(i)?.as_slice(), self.v.get(i)?.as_slice()))
    }

    /// One step over all tensors: `params[i]` moves by `grads[i]`. Nothing changes unless
    /// every shape matches the state's.
    pub fn step<P: AsMut<[f32]>, G: AsRef<[f32]>>(&mut self, params: &mut [P], grads: &[G]) -> Result<(), OptimError> {
        let n = self.m.len();
        if params.len() != n || grads.len() != n {
            return Err(OptimError::Shape(format!(
                "the optimizer holds {n} tensors, given {} parameters and {} gradients",
                params.len(),
                grads.len()
            )));
        }
        for (i, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            let (p, g, want) = (p.as_mut().len(), g.as_ref().len(), self.m[i].len());
            if p != want || g != want {
                return Err(OptimError::Shape(format!("tensor {i} has {want} elements, its parameter {p} and gradient {g}")));
            }
        }
        self.begin_step();
        for (i, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            self.update(i, p.as_mut(), g.as_ref())?;
        }
        Ok(())
    }

    /// Begin a step taken a few tensors at a time ([`AdamW::update`] each): counts it and
    /// fixes its factors at the current learning rate. The same arithmetic as [`AdamW::step`].
    pub fn begin_step(&mut self) {
        self.steps += 1;
        self.factors = Some(Factors::new(&self.config, self.steps));
    }

    /// Tensor `i`'s share of the step begun last: `p` moves by `g`.
    pub fn update(&mut self, i: usize, p: &mut [f32], g: &[f32]) -> Result<(), OptimError> {
        let Some(k) = &self.factors else { return Err(OptimError::Shape("an update outside a step".into())) };
        let (m, v) = match (self.m.get_mut(i), self.v.get_mut(i)) {
            (Some(m), Some(v)) if m.len() == p.len() && g.len() == p.len() => (m, v),
            _ => return Err(OptimError::Shape(format!("tensor {i}: the optimizer holds no tensor of {} elements there", p.len()))),
        };
        k.apply(p, g, m, v);
        Ok(())
    }
}

/// One step's scalar factors, computed in f64 and rounded to f32 once, as torch does.
#[derive(Clone, Debug)]
struct Factors {
    decay: Option<f32>,
    w1: f32,
    small_w1: bool,
    beta2: f32,
    c2: f32,
    step_size: f32,
    bc2_sqrt: f32,
    eps: f32,
}

impl Factors {
    fn new(c: &AdamWConfig, t: u64) -> Factors {
        let t = t as f64;
        let bc1 = 1.0 - c.beta1.powf(t);
        let bc2 = 1.0 - c.beta2.powf(t);
        let w1 = 1.0 - c.beta1;
        Factors {
            decay: (c.weight_decay != 0.0).then_some((1.0 - c.lr * c.weight_decay) as f32),
            w1: w1 as f32,
            small_w1: w1.abs() < 0.5,
            beta2: c.beta2 as f32,
            c2: (1.0 - c.beta2) as f32,
            step_size: (c.lr / bc1) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            eps: c.eps as f32,
        }
    }

    fn apply(&self, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        if let Some(d) = self.decay {
            p.iter_mut().for_each(|x| *x *= d);
        }
        // torch's lerp(m, g, w): the form that is exact at its nearer end.
        let w1 = self.w1;
        if self.small_w1 {
            m.iter_mut().zip(g).for_each(|(m, &g)| *m += w1 * (g - *m));
        } else {
            m.iter_mut().zip(g).for_each(|(m, &g)| *m = g - (g - *m) * (1.0 - w1));
        }
        for (v, &g) in v.iter_mut().zip(g) {
            *v = *v * self.beta2 + self.c2 * g * g;
        }
        for ((p, &m), &v) in p.iter_mut().zip(m.iter()).zip(v.iter()) {
            let denom = v.sqrt() / self.bc2_sqrt + self.eps;
            *p -= self.step_size * m / denom;
        }
    }
}
