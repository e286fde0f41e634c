//! Scale searches used by ggml's reference k-quant quantizers, reproduced operation for
//! operation (same float expression order) so that quantized files match llama.cpp's
//! `quantize_row_q*_K_ref` bit for bit.
//!
//! * [`make_qx_quants`]: symmetric quants in `-nmax..nmax`, weighting errors by `x²` and
//!   trying 18 nudged scales (ggml's `rmse_type = 1`, used by `Q6_K`).
//! * [`make_q3_quants`]: symmetric quants refined by coordinate descent (`Q3_K`).
//! * [`make_qkx2_quants`]: affine quants `scale·l - min` in `0..=nmax` with a weighted
//!   least-squares fit over a sweep of scales (`Q2_K`, `Q4_K`, `Q5_K`).

use super::numeric::{nearest_int, signed_absmax};

/// Groups whose largest magnitude is below this quantize to all zeros.
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// Largest group handled by the searches (`Q4_K`/`Q5_K` use 32, the rest 16).
const MAX_GROUP: usize = 32;

/// Symmetric quantization of `x` into `levels[i] = l + nmax` with `l` in `-nmax..nmax`,
/// choosing the scale that minimises the `x²`-weighted squared error among `-nmax/max`
/// and 18 nudged variants `-(nmax ± 0.1k)/max`. Returns the scale (0 for a zero group).
pub fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    // Weighted sums Σ w·x·l and Σ w·l² with w = x², for quants at `iscale`.
    let sums = |iscale: f32| {
        x.iter().fold((0.0f32, 0.0f32), |(sumlx, suml2), &v| {
            let l = quant(iscale, v) as f32;
            let w = v * v;
            (sumlx + w * v * l, suml2 + w * l * l)
        })
    };

    let iscale = -(nmax as f32) / max;
    for (level, &v) in levels.iter_mut().zip(x) {
        *level = (quant(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (level, &v) in levels.iter_mut().zip(x) {
                *level = (quant(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric quantization of `x` into `levels[i] = l + nmax` with `l` in `-nmax..nmax`:
/// start from `-nmax/max`, then up to five passes that move single quants whenever that
/// raises `(Σw·x·l)² / Σw·l²` (w = x²). Returns the least-squares scale `Σw·x·l / Σw·l²`.
pub fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (level, &v) in levels.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *level = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (level, &v) in levels.iter_mut().zip(x) {
            let w = v * v;
            let old = *level as f32;
            let mut slx = sumlx - w * v * old;
            // Written as in ggml so that NaN skips the element too.
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            if !(slx > 0.0) {
                continue;
            }
            let mut sl2 = suml2 - w * old * old;
            let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
            if new_l == *level as i32 {
                continue;
            }
            slx += w * v * new_l as f32;
            sl2 += w * new_l as f32 * new_l as f32;
            if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                *level = new_l as i8;
                sumlx = slx;
                suml2 = sl2;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    for level in levels.iter_mut() {
        *level += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Parameters of the scale sweep in [`make_qkx2_quants`]: inverse scales
/// `(nmax + rmin + rdelta·k)/(max - min)` for `k` in `0..=nstep`.
#[derive(Clone, Copy, Debug)]
pub struct Sweep {
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    /// Minimise absolute instead of squared error.
    pub use_mad: bool,
}

/// Affine quantization `x ≈ scale·l - the_min` with `l` in `0..=nmax`, minimising the
/// `weights`-weighted error. Starts from the min/max fit, then for each swept scale
/// re-quantizes, solves the weighted least-squares `(scale, min)` (forcing `min ≤ 0`), and
/// keeps the best. Writes the quants to `levels` and returns `(scale, the_min)`, where
/// `the_min ≥ 0` is the amount subtracted.
pub fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    sweep: Sweep,
) -> (f32, f32) {
    let n = x.len();
    debug_assert!(n <= MAX_GROUP && weights.len() == n && levels.len() == n);
    let err = |diff: f32| {
        if sweep.use_mad {
            diff.abs()
        } else {
            diff * diff
        }
    };

    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }

    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for ((level, &v), &w) in levels.iter_mut().zip(x).zip(weights) {
        *level = nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
        best_error += w * err(scale * *level as f32 + min - v);
    }
    if sweep.nstep < 1 {
        return (scale, -min);
    }

    let mut aux = [0u8; MAX_GROUP];
    let aux = &mut aux[..n];
    for is in 0..=sweep.nstep {
        let iscale = (sweep.rmin + sweep.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((level, &v), &w) in aux.iter_mut().zip(x).zip(weights) {
            let l = nearest_int(iscale * (v - min)).clamp(0, nmax);
            *level = l as u8;
            let l = l as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !(det > 0.0) {
            continue;
        }
        let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
        let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if this_min > 0.0 {
            this_min = 0.0;
            this_scale = sum_xl / sum_l2;
        }
        let cur_error = aux
            .iter()
            .zip(x)
            .zip(weights)
            .fold(0.0f32, |acc, ((&l, &v), &w)| {
                acc + w * err(this_scale * l as f32 + this_min - v)
            });
        if cur_error < best_error {
            levels.copy_from_slice(aux);
            best_error = cur_error;
            scale = this_scale;
            min = this_min;
        }
    }
    (scale, -min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qx_quants_exact_grid_is_recovered() {
        // Values on the grid -4..3 times 0.5: max is -2 (-4·0.5) so iscale = 4/2 = 2.
        let x: Vec<f32> = (0..16).map(|i| ((i % 8) as f32 - 4.0) * 0.5).collect();
        let mut levels = [0i8; 16];
        let scale = make_qx_quants(4, &x, &mut levels);
        for (&l, &v) in levels.iter().zip(&x) {
            assert_eq!((l as f32 - 4.0) * scale, v);
        }
        let mut l3 = [0i8; 16];
        let s3 = make_q3_quants(4, &x, &mut l3);
        assert_eq!(l3, levels);
        assert_eq!(s3, scale);
    }

    #[test]
    fn qkx2_fits_affine_grid() {
        // x = 0.25·l - 1 for l = 0..15: exactly representable with scale .25, min 1.
        let x: Vec<f32> = (0..32).map(|i| 0.25 * (i % 16) as f32 - 1.0).collect();
        let w: Vec<f32> = x.iter().map(|v| v.abs() + 0.1).collect();
        let mut levels = [0u8; 32];
        let sweep = Sweep {
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let (scale, the_min) = make_qkx2_quants(15, &x, &w, &mut levels, sweep);
        for (&l, &v) in levels.iter().zip(&x) {
            assert!((scale * l as f32 - the_min - v).abs() < 1e-5);
        }
    }

    #[test]
    fn zero_groups() {
        let mut levels = [7i8; 16];
        assert_eq!(make_qx_quants(32, &[0.0; 16], &mut levels), 0.0);
        assert_eq!(levels, [0; 16]);
        let mut u = [7u8; 16];
        assert_eq!(
            make_qkx2_quants(
                3,
                &[0.0; 16],
                &[0.0; 16],
                &mut u,
                Sweep {
                    rmin: -0.5,
                    rdelta: 0.1,
                    nstep: 15,
                    use_mad: true
                }
            ),
            (0.0, -0.0)
        );
        assert_eq!(u, [0; 16]);
    }
}
