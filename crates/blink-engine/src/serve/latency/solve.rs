//! Dense linear algebra for the few features of a latency model, on fixed-size arrays
//! (nothing allocated): a Cholesky solve on a subset of a symmetric positive definite
//! matrix, and non-negative least squares on normal equations by Lawson and Hanson's
//! active-set method.

/// Solves `a[S][S] · x[S] = b[S]` over the indices `S` where `on[i]`, by Cholesky, with
/// `x` zero off `S`. `None` when `a[S][S]` is not numerically positive definite.
pub fn cholesky_solve<const N: usize>(a: &[[f64; N]; N], b: &[f64; N], on: &[bool; N]) -> Option<[f64; N]> {
    let mut idx = [0usize; N];
    let mut m = 0;
    for (i, &o) in on.iter().enumerate() {
        if o {
            idx[m] = i;
            m += 1;
        }
    }
    // The factor L (a = L Lᵀ) over the subset, in its first m rows and columns.
    let mut l = [[0.0f64; N]; N];
    for i in 0..m {
        for j in 0..=i {
            let mut s = a[idx[i]][idx[j]];
            for (lik, ljk) in l[i][..j].iter().zip(&l[j][..j]) {
                s -= lik * ljk;
            }
            if i == j {
                if !(s.is_finite() && s > 0.0) {
                    return None;
                }
                l[i][i] = s.sqrt();
            } else {
                l[i][j] = s / l[j][j];
            }
        }
    }
    let mut y = [0.0f64; N];
    for i in 0..m {
        let mut s = b[idx[i]];
        for k in 0..i {
            s -= l[i][k] * y[k];
        }
        y[i] = s / l[i][i];
    }
    let mut x = [0.0f64; N];
    for i in (0..m).rev() {
        let mut s = y[i];
        for k in i + 1..m {
            s -= l[k][i] * x[idx[k]];
        }
        x[idx[i]] = s / l[i][i];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// Minimises `½ βᵀ a β − bᵀ β` over `β ≥ 0` with `β[i] = 0` where `!free[i]`: the
/// non-negative least squares solution when `a = XᵀX` and `b = Xᵀy` (`a` symmetric
/// positive definite, e.g. with a ridge on its diagonal).
///
/// Lawson and Hanson's active set: start from β = 0; repeatedly free the bound variable
/// whose gradient most wants it to grow, solve the unconstrained problem over the free
/// set, and if that solution has a non-positive entry, move from β toward it only as far
/// as the first variable reaching zero and bind the variables at zero again. Stops when no
/// bound variable would decrease the objective (the KKT conditions), or after a bounded
/// number of rounds.
pub fn nnls<const N: usize>(a: &[[f64; N]; N], b: &[f64; N], free: &[bool; N]) -> [f64; N] {
    let mut beta = [0.0f64; N];
    let mut passive = [false; N];
    // Variables that proved unable to grow (numerically) are not tried again.
    let mut candidate = *free;
    let tol = 1e-12 * b.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    for _ in 0..4 * N {
        // The objective's descent direction: w = b − aβ.
        let mut best: Option<(usize, f64)> = None;
        for j in 0..N {
            if passive[j] || !candidate[j] {
                continue;
            }
            let w = b[j] - (0..N).map(|k| a[j][k] * beta[k]).sum::<f64>();
            if w > tol && best.is_none_or(|(_, bw)| w > bw) {
                best = Some((j, w));
            }
        }
        let Some((entering, _)) = best else { break };
        passive[entering] = true;
        for round in 0..=N {
            let Some(s) = cholesky_solve(a, b, &passive) else {
                passive[entering] = false;
                candidate[entering] = false;
                break;
            };
            if (0..N).all(|i| !passive[i] || s[i] > 0.0) {
                beta = s;
                break;
            }
            if round == 0 && s[entering] <= 0.0 {
                // In exact arithmetic the entering variable grows; here it cannot.
                passive[entering] = false;
                candidate[entering] = false;
                break;
            }
            // Step from β toward s until the first passive variable reaches zero (it and
            // any other at zero are bound again).
            let mut alpha = f64::INFINITY;
            let mut hit = entering;
            for i in 0..N {
                if passive[i] && s[i] <= 0.0 {
                    let step = beta[i] / (beta[i] - s[i]);
                    if step < alpha {
                        alpha = step;
                        hit = i;
                    }
                }
            }
            for i in 0..N {
                if passive[i] {
                    beta[i] += alpha * (s[i] - beta[i]);
                    if i == hit || beta[i] <= 0.0 {
                        beta[i] = 0.0;
                        passive[i] = false;
                    }
                }
            }
        }
    }
    beta
}

/// The point of `θ ≥ 0` nearest to `theta` in the metric of `p⁻¹`: the minimiser of
/// `(θ − theta)ᵀ p⁻¹ (θ − theta)` over θ ≥ 0 (`p` symmetric positive definite). When
/// `theta` and `p` are a least squares fit and its covariance, this is the non-negative
/// least squares fit of the same data. `None` when `p` is not numerically positive
/// definite.
pub fn nearest_non_negative<const N: usize>(theta: &[f64; N], p: &[[f64; N]; N]) -> Option<[f64; N]> {
    // a = p⁻¹, column by column.
    let mut a = [[0.0f64; N]; N];
    for j in 0..N {
        let mut unit = [0.0; N];
        unit[j] = 1.0;
        let col = cholesky_solve(p, &unit, &[true; N])?;
        for i in 0..N {
            a[i][j] = col[i];
        }
    }
    // Solved in y = θ / d with d = diag(a)^(-1/2), so the matrix has a unit diagonal.
    let mut d = [0.0f64; N];
    for i in 0..N {
        if !(a[i][i].is_finite() && a[i][i] > 0.0) {
            return None;
        }
        d[i] = 1.0 / a[i][i].sqrt();
    }
    let mut scaled = [[0.0f64; N]; N];
    for i in 0..N {
        for j in 0..N {
            scaled[i][j] = 0.5 * (a[i][j] + a[j][i]) * d[i] * d[j];
        }
    }
    let b: [f64; N] = std::array::from_fn(|i| (0..N).map(|j| scaled[i][j] * theta[j] / d[j]).sum());
    let y = nnls(&scaled, &b, &[true; N]);
    let out: [f64; N] = std::array::from_fn(|i| y[i] * d[i]);
    out.iter().all(|v| v.is_finite()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_solves_a_known_system_and_its_subsets() {
        // a = M Mᵀ for M = [[2,0,0],[1,3,0],[-1,2,4]], x = [1,-2,3].
        let a = [[4.0, 2.0, -2.0], [2.0, 10.0, 5.0], [-2.0, 5.0, 21.0]];
        let x = [1.0, -2.0, 3.0];
        let b: [f64; 3] = std::array::from_fn(|i| (0..3).map(|k| a[i][k] * x[k]).sum());
        let got = cholesky_solve(&a, &b, &[true; 3]).unwrap();
        for i in 0..3 {
            assert!((got[i] - x[i]).abs() < 1e-12, "{got:?}");
        }
        // On {0, 2}: [[4, -2], [-2, 21]] · [u, v] = [1, 2] → u = 25/80, v = 10/80.
        let got = cholesky_solve(&a, &[1.0, 99.0, 2.0], &[true, false, true]).unwrap();
        assert!((got[0] - 25.0 / 80.0).abs() < 1e-12 && got[1] == 0.0 && (got[2] - 10.0 / 80.0).abs() < 1e-12, "{got:?}");
    }

    #[test]
    fn cholesky_refuses_what_is_not_positive_definite() {
        let a = [[1.0, 2.0], [2.0, 1.0]];
        assert!(cholesky_solve(&a, &[1.0, 1.0], &[true, true]).is_none());
        let a = [[1.0, f64::NAN], [f64::NAN, 1.0]];
        assert!(cholesky_solve(&a, &[1.0, 1.0], &[true, true]).is_none());
    }

    /// The KKT conditions of `nnls`'s problem: β ≥ 0, gradient zero on β > 0 and
    /// pointing outward (w ≤ 0) on β = 0.
    fn assert_kkt<const N: usize>(a: &[[f64; N]; N], b: &[f64; N], beta: &[f64; N]) {
        for j in 0..N {
            let w = b[j] - (0..N).map(|k| a[j][k] * beta[k]).sum::<f64>();
            assert!(beta[j] >= 0.0, "β[{j}] = {}", beta[j]);
            if beta[j] > 0.0 {
                assert!(w.abs() < 1e-10, "w[{j}] = {w} with β[{j}] = {}", beta[j]);
            } else {
                assert!(w <= 1e-10, "w[{j}] = {w} at the bound");
            }
        }
    }

    #[test]
    fn nnls_equals_the_unconstrained_solution_when_that_is_positive() {
        let a = [[4.0, 2.0, -2.0], [2.0, 10.0, 5.0], [-2.0, 5.0, 21.0]];
        let x = [1.0, 2.0, 3.0];
        let b: [f64; 3] = std::array::from_fn(|i| (0..3).map(|k| a[i][k] * x[k]).sum());
        let beta = nnls(&a, &b, &[true; 3]);
        for i in 0..3 {
            assert!((beta[i] - x[i]).abs() < 1e-12, "{beta:?}");
        }
        assert_kkt(&a, &b, &beta);
    }

    /// The non-negative solution by brute force: the unconstrained solution over each
    /// subset of free variables, kept if non-negative, the one of least objective.
    fn brute_force<const N: usize>(a: &[[f64; N]; N], b: &[f64; N]) -> [f64; N] {
        let objective = |x: &[f64; N]| {
            let quad: f64 = (0..N).map(|i| (0..N).map(|j| x[i] * a[i][j] * x[j]).sum::<f64>()).sum();
            0.5 * quad - (0..N).map(|i| b[i] * x[i]).sum::<f64>()
        };
        let mut best = ([0.0; N], 0.0);
        for mask in 1..1u32 << N {
            let on: [bool; N] = std::array::from_fn(|i| mask >> i & 1 == 1);
            if let Some(x) = cholesky_solve(a, b, &on) {
                if x.iter().all(|&v| v >= 0.0) && objective(&x) < best.1 {
                    best = (x, objective(&x));
                }
            }
        }
        best.0
    }

    #[test]
    fn nnls_binds_what_the_unconstrained_solution_makes_negative() {
        // Correlated columns whose unconstrained fit has a negative middle entry.
        let a = [[4.0, 2.0, -2.0], [2.0, 10.0, 5.0], [-2.0, 5.0, 21.0]];
        let x = [1.0, -2.0, 3.0];
        let b: [f64; 3] = std::array::from_fn(|i| (0..3).map(|k| a[i][k] * x[k]).sum());
        let beta = nnls(&a, &b, &[true; 3]);
        assert_eq!(beta[1], 0.0, "{beta:?}");
        assert_kkt(&a, &b, &beta);
        let reference = brute_force(&a, &b);
        for i in 0..3 {
            assert!((beta[i] - reference[i]).abs() < 1e-12, "{beta:?} vs {reference:?}");
        }
        // A variable held at zero stays there.
        let beta = nnls(&a, &b, &[true, true, false]);
        assert_eq!(beta[2], 0.0);
        assert_kkt(&[[4.0, 2.0], [2.0, 10.0]], &[b[0], b[1]], &[beta[0], beta[1]]);
    }

    #[test]
    fn nnls_matches_brute_force_on_random_problems() {
        let mut rng = crate::rng::Rng::new(7);
        let mut bound = 0;
        for _ in 0..200 {
            // a = MᵀM + ridge for a random 12×5 M, b = Mᵀy for a random y.
            let m: Vec<[f64; 5]> = (0..12).map(|_| std::array::from_fn(|_| rng.next_f64() * 2.0 - 1.0)).collect();
            let y: Vec<f64> = (0..12).map(|_| rng.next_f64() * 2.0 - 1.0).collect();
            let mut a = [[0.0; 5]; 5];
            let mut b = [0.0; 5];
            for (row, yi) in m.iter().zip(&y) {
                for i in 0..5 {
                    b[i] += row[i] * yi;
                    for j in 0..5 {
                        a[i][j] += row[i] * row[j];
                    }
                }
            }
            for (i, r) in a.iter_mut().enumerate() {
                r[i] += 1e-9;
            }
            let beta = nnls(&a, &b, &[true; 5]);
            assert_kkt(&a, &b, &beta);
            let reference = brute_force(&a, &b);
            for i in 0..5 {
                assert!((beta[i] - reference[i]).abs() < 1e-9 * (1.0 + reference[i].abs()), "{beta:?} vs {reference:?}");
            }
            bound += beta.iter().filter(|&&v| v == 0.0).count();
        }
        // The problems exercise the bounds (about half the variables end at zero).
        assert!(bound > 200, "{bound} variables bound over 200 problems");
    }

    #[test]
    fn nearest_non_negative_is_nnls_in_the_inverse_metric() {
        // p⁻¹ = a: the nearest point equals nnls(a, a·theta).
        let a = [[4.0, 2.0, -2.0], [2.0, 10.0, 5.0], [-2.0, 5.0, 21.0]];
        let mut p = [[0.0; 3]; 3];
        for j in 0..3 {
            let mut unit = [0.0; 3];
            unit[j] = 1.0;
            let col = cholesky_solve(&a, &unit, &[true; 3]).unwrap();
            for i in 0..3 {
                p[i][j] = col[i];
            }
        }
        let theta = [1.0, -2.0, 3.0];
        let b: [f64; 3] = std::array::from_fn(|i| (0..3).map(|k| a[i][k] * theta[k]).sum());
        let got = nearest_non_negative(&theta, &p).unwrap();
        let reference = brute_force(&a, &b);
        for i in 0..3 {
            assert!((got[i] - reference[i]).abs() < 1e-9, "{got:?} vs {reference:?}");
        }
        // A point already non-negative is its own nearest.
        let got = nearest_non_negative(&[1.0, 2.0, 3.0], &p).unwrap();
        for (i, v) in [1.0, 2.0, 3.0].iter().enumerate() {
            assert!((got[i] - v).abs() < 1e-9, "{got:?}");
        }
    }
}
