//! Rotary position embedding: per-position angle tables and their application to heads.
//!
//! The angles follow ggml's recipe exactly (theta advanced by repeated multiplication,
//! optional per-dimension frequency divisors, linear and YaRN scaling), because a
//! different rounding of the angles shifts logits enough to flip near-tied tokens.

use blink_kernels::cpu::Isa;
use blink_kernels::ops;

use crate::config::{RopeConfig, RopeOrder, RopeScaling};

/// What a forward pass needs to rotate heads at any position.
#[derive(Clone, Debug)]
pub struct Rope {
    order: RopeOrder,
    n_dims: usize,
    theta_scale: f32,
    freq_scale: f32,
    ext_factor: f32,
    mscale: f32,
    corr_dims: [f32; 2],
    freq_factors: Option<Vec<f32>>,
}

impl Rope {
    pub fn new(cfg: &RopeConfig, freq_factors: Option<Vec<f32>>) -> Rope {
        let n_dims = cfg.n_dims;
        let theta_scale = cfg.freq_base.powf(-2.0 / n_dims as f32);
        let (freq_scale, ext_factor, corr_dims) = match cfg.scaling {
            RopeScaling::None => (1.0, 0.0, [0.0, 0.0]),
            RopeScaling::Linear { factor } => (1.0 / factor, 0.0, [0.0, 0.0]),
            RopeScaling::Yarn { factor, original_ctx, ext_factor, beta_fast, beta_slow } => {
                let corr = yarn_corr_dims(n_dims, original_ctx, cfg.freq_base, beta_fast, beta_slow);
                (1.0 / factor, ext_factor, corr)
            }
        };
        let mscale = cfg.attn_factor;
        Rope { order: cfg.order, n_dims, theta_scale, freq_scale, ext_factor, mscale, corr_dims, freq_factors }
    }

    /// Rotated dimensions per head.
    pub fn n_dims(&self) -> usize {
        self.n_dims
    }

    /// Fill `table[..n_dims]` with (cos, sin) pairs for position `pos`.
    pub fn angles(&self, pos: usize, table: &mut [f32]) {
        let mut theta = pos as f32;
        for i in 0..self.n_dims / 2 {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            let (c, s) = self.yarn(theta / ff, 2 * i);
            table[2 * i] = c;
            table[2 * i + 1] = s;
            theta *= self.theta_scale;
        }
    }

    fn yarn(&self, theta_extrap: f32, i0: usize) -> (f32, f32) {
        let theta_interp = self.freq_scale * theta_extrap;
        let mut theta = theta_interp;
        let mut mscale = self.mscale;
        if self.ext_factor != 0.0 {
            let y = (i0 as f32 / 2.0 - self.corr_dims[0]) / (self.corr_dims[1] - self.corr_dims[0]).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            let mix = ramp * self.ext_factor;
            theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
            mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
        }
        (theta.cos() * mscale, theta.sin() * mscale)
    }

    /// Rotate one head `x` (length ≥ n_dims) in place with the angles of its position.
    #[inline]
    pub fn apply(&self, isa: Isa, table: &[f32], x: &mut [f32]) {
        ops::rope(isa, &table[..self.n_dims], x, self.order == RopeOrder::NeoX);
    }
}

/// The dimension range over which YaRN blends interpolation and extrapolation.
fn yarn_corr_dims(n_dims: usize, n_ctx_orig: u32, base: f32, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
    let corr_dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln())
    };
    let start = corr_dim(beta_fast).floor().max(0.0);
    let end = corr_dim(beta_slow).ceil().min(n_dims as f32 - 1.0);
    [start, end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(order: RopeOrder) -> Rope {
        Rope::new(&RopeConfig { order, n_dims: 8, freq_base: 10000.0, scaling: RopeScaling::None, attn_factor: 1.0, original_ctx: 4096 }, None)
    }

    #[test]
    fn position_zero_is_identity() {
        let r = rope(RopeOrder::Normal);
        let mut t = [0f32; 8];
        r.angles(0, &mut t);
        let mut x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        r.apply(Isa::Scalar, &t, &mut x);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    }

    #[test]
    fn rotation_preserves_pair_norms() {
        for order in [RopeOrder::Normal, RopeOrder::NeoX] {
            let r = rope(order);
            let mut t = [0f32; 8];
            r.angles(1234, &mut t);
            let mut x = [1.0, -2.0, 3.0, 0.5, 5.0, 6.0, -7.0, 8.0];
            let before = x;
            r.apply(Isa::Scalar, &t, &mut x);
            let pairs: [(usize, usize); 4] = match order {
                RopeOrder::Normal => [(0, 1), (2, 3), (4, 5), (6, 7)],
                RopeOrder::NeoX => [(0, 4), (1, 5), (2, 6), (3, 7)],
            };
            for (a, b) in pairs {
                let n0 = before[a].hypot(before[b]);
                let n1 = x[a].hypot(x[b]);
                assert!((n0 - n1).abs() < 1e-4, "{order:?}: {n0} vs {n1}");
            }
            // The first pair turns by exactly `pos` radians.
            let (c, s) = (t[0], t[1]);
            assert!((c - 1234f32.cos()).abs() < 1e-6 && (s - 1234f32.sin()).abs() < 1e-6);
        }
    }
}
