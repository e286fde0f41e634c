//! The element-wise pieces of a layer and their derivatives, one row (or head) at a time:
//! RMS norm, rotary embedding and SwiGLU. Sums run in f64, in index order.

/// `1 / √(mean(x²) + eps)`, the factor an RMS norm scales its row by.
pub fn rms_factor(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    1.0 / ((sum / x.len() as f64) as f32 + eps).sqrt()
}

/// `out = x · rms_factor(x) · weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let r = rms_factor(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (v * r) * w;
    }
}

/// Adds to `dx` the gradient of [`rms_norm`] at `x` for an output gradient `dy`:
/// with `g = w ⊙ dy`, `dx += r·g − x·r³·(g·x)/n`.
pub fn rms_norm_backward(x: &[f32], weight: &[f32], eps: f32, dy: &[f32], dx: &mut [f32]) {
    let r = rms_factor(x, eps) as f64;
    let gx: f64 = x.iter().zip(dy).zip(weight).map(|((&v, &d), &w)| (w * d) as f64 * v as f64).sum();
    let k = r * r * r * gx / x.len() as f64;
    for (((o, &v), &d), &w) in dx.iter_mut().zip(x).zip(dy).zip(weight) {
        *o += (r * (w * d) as f64 - v as f64 * k) as f32;
    }
}

/// The two elements pair `i` of a head rotates: adjacent ones (llama.cpp's normal order)
/// or one from each half (NeoX).
#[inline]
fn pair(i: usize, half: usize, neox: bool) -> (usize, usize) {
    if neox {
        (i, i + half)
    } else {
        (2 * i, 2 * i + 1)
    }
}

/// Rotate one head by its position's `(cos, sin)` table (`n_dims` entries), as the
/// forward pass's kernel does.
pub fn rope(table: &[f32], x: &mut [f32], neox: bool) {
    let half = table.len() / 2;
    for i in 0..half {
        let (c, s) = (table[2 * i], table[2 * i + 1]);
        let (a, b) = pair(i, half, neox);
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0.mul_add(c, -(x1 * s));
        x[b] = x0.mul_add(s, x1 * c);
    }
}

/// The gradient through [`rope`], in place: the transposed rotation.
pub fn rope_backward(table: &[f32], d: &mut [f32], neox: bool) {
    let half = table.len() / 2;
    for i in 0..half {
        let (c, s) = (table[2 * i], table[2 * i + 1]);
        let (a, b) = pair(i, half, neox);
        let (d0, d1) = (d[a], d[b]);
        d[a] = d0.mul_add(c, d1 * s);
        d[b] = d1.mul_add(c, -(d0 * s));
    }
}

#[inline]
fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + (-g).exp())
}

/// `h = silu(g) · u`.
pub fn swiglu(g: &[f32], u: &[f32], h: &mut [f32]) {
    for ((h, &g), &u) in h.iter_mut().zip(g).zip(u) {
        *h = g * sigmoid(g) * u;
    }
}

/// From `dh`, the gradients of [`swiglu`]'s inputs: `dg = dh·u·silu'(g)`, `du = dh·silu(g)`.
pub fn swiglu_backward(g: &[f32], u: &[f32], dh: &[f32], dg: &mut [f32], du: &mut [f32]) {
    for i in 0..g.len() {
        let s = sigmoid(g[i]);
        du[i] = dh[i] * g[i] * s;
        dg[i] = dh[i] * u[i] * (s * (1.0 + g[i] * (1.0 - s)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Central differences of `f` along each input, in f64 from f32 steps.
    fn numeric_grad(x: &[f32], f: impl Fn(&[f32]) -> f64) -> Vec<f64> {
        (0..x.len())
            .map(|i| {
                let h = 1e-3f32;
                let (mut p, mut m) = (x.to_vec(), x.to_vec());
                p[i] += h;
                m[i] -= h;
                (f(&p) - f(&m)) / (p[i] as f64 - m[i] as f64)
            })
            .collect()
    }

    fn close(a: &[f32], b: &[f64], tol: f64) {
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            assert!((x as f64 - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
        }
    }

    const X: [f32; 8] = [0.3, -1.2, 0.7, 2.0, -0.4, 0.05, 1.1, -0.9];
    const W: [f32; 8] = [1.0, 0.5, -0.7, 1.3, 0.9, 1.1, -0.2, 0.8];
    const DY: [f32; 8] = [0.2, -0.1, 0.4, 0.3, -0.6, 0.9, 0.1, -0.3];

    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
    }

    #[test]
    fn rms_norm_gradient_matches_differences() {
        let mut dx = [0f32; 8];
        rms_norm_backward(&X, &W, 1e-5, &DY, &mut dx);
        let want = numeric_grad(&X, |x| {
            let mut y = [0f32; 8];
            rms_norm(x, &W, 1e-5, &mut y);
            dot(&y, &DY)
        });
        close(&dx, &want, 2e-3);
    }

    #[test]
    fn rope_gradient_is_the_transposed_rotation() {
        let table = [0.6, 0.8, -0.28, 0.96, 1.0, 0.0, 0.0, -1.0];
        for neox in [false, true] {
            let mut d = DY;
            rope_backward(&table, &mut d, neox);
            let want = numeric_grad(&X, |x| {
                let mut y = x.to_vec();
                rope(&table, &mut y, neox);
                dot(&y, &DY)
            });
            close(&d, &want, 2e-3);
        }
    }

    #[test]
    fn swiglu_gradients_match_differences() {
        let (mut dg, mut du) = ([0f32; 8], [0f32; 8]);
        swiglu_backward(&X, &W, &DY, &mut dg, &mut du);
        let h = |g: &[f32], u: &[f32]| {
            let mut h = [0f32; 8];
            swiglu(g, u, &mut h);
            dot(&h, &DY)
        };
        close(&dg, &numeric_grad(&X, |g| h(g, &W)), 2e-3);
        close(&du, &numeric_grad(&W, |u| h(&X, u)), 2e-3);
    }
}
