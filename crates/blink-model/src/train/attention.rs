//! Causal attention of one query head over one example, forward (keeping each row's
//! log-sum-exp of scores) and backward (recomputing the probabilities from it).

/// Rows of `d` floats, `stride` apart.
#[derive(Clone, Copy)]
pub struct Rows {
    pub ptr: *mut f32,
    pub stride: usize,
}

impl Rows {
    /// # Safety
    /// Row `i` must be inside the buffer, and nobody may write it meanwhile.
    #[inline]
    pub unsafe fn row(&self, i: usize, d: usize) -> &[f32] {
        std::slice::from_raw_parts(self.ptr.add(i * self.stride), d)
    }

    /// # Safety
    /// Row `i` must be inside the buffer, and only this caller may touch it meanwhile.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn row_mut(&self, i: usize, d: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.ptr.add(i * self.stride), d)
    }
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |s, (&x, &y)| x.mul_add(y, s))
}

/// One head's attention over `len` positions: `out[i] = Σ_{j≤i} softmax(q_i·k_j·scale) v_j`,
/// and `lse[i]` (one float per row, `stride` apart) the log-sum-exp of row `i`'s scores.
///
/// # Safety
/// The rows must be inside their buffers; `out` and `lse` rows are this caller's alone.
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward(len: usize, d: usize, scale: f32, q: Rows, k: Rows, v: Rows, out: Rows, lse: Rows, scores: &mut [f32]) {
    for i in 0..len {
        let qi = q.row(i, d);
        let s = &mut scores[..=i];
        let mut max = f32::NEG_INFINITY;
        for (j, sj) in s.iter_mut().enumerate() {
            *sj = dot(qi, k.row(j, d)) * scale;
            max = max.max(*sj);
        }
        let mut sum = 0f32;
        for sj in s.iter_mut() {
            *sj = (*sj - max).exp();
            sum += *sj;
        }
        let o = out.row_mut(i, d);
        o.fill(0.0);
        for (j, &p) in s.iter().enumerate() {
            let w = p / sum;
            for (o, &x) in o.iter_mut().zip(v.row(j, d)) {
                *o = w.mul_add(x, *o);
            }
        }
        lse.row_mut(i, 1)[0] = max + sum.ln();
    }
}

/// The gradients of [`forward`] for an output gradient `dout`: `dq` is written, `dk` and
/// `dv` are added to (heads that share a key/value head add in turn).
///
/// # Safety
/// As for [`forward`]; `dq`, `dk` and `dv` rows are this caller's alone.
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward(len: usize, d: usize, scale: f32, (q, k, v): (Rows, Rows, Rows), (out, lse): (Rows, Rows), dout: Rows, (dq, dk, dv): (Rows, Rows, Rows), scores: &mut [f32]) {
    for i in 0..len {
        let (qi, doi) = (q.row(i, d), dout.row(i, d));
        let delta = dot(doi, out.row(i, d));
        let lse_i = lse.row(i, 1)[0];
        let s = &mut scores[..=i];
        for (j, sj) in s.iter_mut().enumerate() {
            *sj = (dot(qi, k.row(j, d)) * scale - lse_i).exp();
        }
        let dqi = dq.row_mut(i, d);
        dqi.fill(0.0);
        for (j, &p) in s.iter().enumerate() {
            for (g, &x) in dv.row_mut(j, d).iter_mut().zip(doi) {
                *g = p.mul_add(x, *g);
            }
            let ds = p * (dot(doi, v.row(j, d)) - delta) * scale;
            for (g, &x) in dqi.iter_mut().zip(k.row(j, d)) {
                *g = ds.mul_add(x, *g);
            }
            for (g, &x) in dk.row_mut(j, d).iter_mut().zip(qi) {
                *g = ds.mul_add(x, *g);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32 * 2654435761u32) ^ seed.wrapping_mul(40503)) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    /// The loss `Σ out ⊙ w` for given q, k, v, in f64 through f32 forward.
    fn loss(len: usize, d: usize, q: &[f32], k: &[f32], v: &[f32], w: &[f32]) -> f64 {
        let (mut out, mut lse, mut s) = (vec![0f32; len * d], vec![0f32; len], vec![0f32; len]);
        let r = |b: &[f32]| Rows { ptr: b.as_ptr() as *mut f32, stride: d };
        unsafe { forward(len, d, 0.3, r(q), r(k), r(v), Rows { ptr: out.as_mut_ptr(), stride: d }, Rows { ptr: lse.as_mut_ptr(), stride: 1 }, &mut s) };
        out.iter().zip(w).map(|(&o, &w)| o as f64 * w as f64).sum()
    }

    #[test]
    fn gradients_match_differences() {
        let (len, d) = (5, 4);
        let (q, k, v, w) = (values(len * d, 1), values(len * d, 2), values(len * d, 3), values(len * d, 4));
        let (mut out, mut lse, mut s) = (vec![0f32; len * d], vec![0f32; len], vec![0f32; len]);
        let r = |b: &[f32]| Rows { ptr: b.as_ptr() as *mut f32, stride: d };
        let (mut dq, mut dk, mut dv) = (vec![0f32; len * d], vec![0f32; len * d], vec![0f32; len * d]);
        unsafe {
            forward(len, d, 0.3, r(&q), r(&k), r(&v), Rows { ptr: out.as_mut_ptr(), stride: d }, Rows { ptr: lse.as_mut_ptr(), stride: 1 }, &mut s);
            backward(len, d, 0.3, (r(&q), r(&k), r(&v)), (r(&out), Rows { ptr: lse.as_mut_ptr(), stride: 1 }), r(&w), (r(&dq), r(&dk), r(&dv)), &mut s);
        }
        let _ = (&mut dq, &mut dk, &mut dv);
        for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
            for i in 0..len * d {
                let h = 1e-3f32;
                let bump = |delta: f32| {
                    let (mut q2, mut k2, mut v2) = (q.clone(), k.clone(), v.clone());
                    [&mut q2, &mut k2, &mut v2][which][i] += delta;
                    loss(len, d, &q2, &k2, &v2, &w)
                };
                let want = (bump(h) - bump(-h)) / (2.0 * h as f64);
                assert!((grad[i] as f64 - want).abs() < 2e-3, "input {which} element {i}: {} vs {want}", grad[i]);
            }
        }
    }
}
