//! Small element-wise operations of the forward pass, written to match ggml's numerics.

use blink_kernels::math;

/// `out = x / rms(x) * weight`, with the sum of squares accumulated in f64 as ggml does.
#[inline]
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (v * scale) * w;
    }
}

/// In-place RMS norm (used for per-head Q/K norms).
#[inline]
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = (*v * scale) * w;
    }
}

/// `gate = silu(gate) * up`, element-wise, with ggml's vectorised `exp` (whole groups of
/// 16) and libm's for the remainder, as llama.cpp's x86 build computes it.
#[inline]
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    let whole = gate.len() - gate.len() % 16;
    for (g, &u) in gate[..whole].iter_mut().zip(up) {
        *g = math::silu(*g) * u;
    }
    for (g, &u) in gate[whole..].iter_mut().zip(&up[whole..]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Softmax in place: max-subtracted exponentials, sum in f64, then one scale (as ggml).
#[inline]
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_weights_gives_unit_rms() {
        let x = [1.0f32, -2.0, 3.0, -4.0];
        let mut out = [0f32; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut x = [1.0f32, 3.0, 2.0, -50.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[2] && x[2] > x[0] && x[0] > x[3]);
    }

    #[test]
    fn swiglu_matches_definition() {
        let mut g = [0.0f32, 1.0, -1.0];
        swiglu(&mut g, &[2.0, 2.0, 2.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
    }
}
