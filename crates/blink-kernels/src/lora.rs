//! LoRA's two products over float adapter weights, with fixed numerics: `shrink`
//! (`t = A·x`, down to the adapter's rank) and `expand` (`y += scale · B·t`, back up to
//! the projection's width). The forward pass runs the base product first and adds the
//! delta after it, so a row without an adapter never comes here.
//!
//! The bodies are written once, as scalar code over 16 lanes with `mul_add`:
//! - a shrink dot product accumulates element `k` into lane `k % 16`, in element order,
//!   then folds the lanes in a fixed tree (lane `l` plus lane `l + 8`, then `+ 4`, `+ 2`,
//!   `+ 1`);
//! - an expand output is one chain of fused multiply-adds over the rank, in rank order,
//!   then `y + scale · acc` (a multiply, then an add).
//!
//! The x86 paths compile the same bodies with FMA (and AVX-512) enabled, so `mul_add` is
//! one instruction and the 16 lanes are one or two vector registers; on AArch64 `mul_add`
//! is always one instruction. Every path therefore gives the scalar path's bits.

use crate::cpu::Isa;

/// Lanes of the shrink's partial sums (one AVX-512 register, two AVX2 ones, four NEON).
const LANES: usize = 16;
/// Rows of `A` whose dot products run side by side, sharing each load of `x`.
const SHRINK_ROWS: usize = 4;

/// `N` dot products of rows of `a` with `x`, each in the 16-lane order.
#[inline(always)]
fn dots_body<const N: usize>(a: [&[f32]; N], x: &[f32]) -> [f32; N] {
    let mut acc = [[0f32; LANES]; N];
    let whole = x.len() - x.len() % LANES;
    for k in (0..whole).step_by(LANES) {
        let xs = &x[k..k + LANES];
        for (acc, a) in acc.iter_mut().zip(&a) {
            let a = &a[k..k + LANES];
            for l in 0..LANES {
                acc[l] = a[l].mul_add(xs[l], acc[l]);
            }
        }
    }
    for (acc, a) in acc.iter_mut().zip(&a) {
        for (l, k) in (whole..x.len()).enumerate() {
            acc[l] = a[k].mul_add(x[k], acc[l]);
        }
    }
    acc.map(|mut lanes| {
        let mut half = LANES / 2;
        while half > 0 {
            for l in 0..half {
                lanes[l] += lanes[l + half];
            }
            half /= 2;
        }
        lanes[0]
    })
}

#[inline(always)]
fn shrink_body(a: &[f32], x: &[f32], t: &mut [f32]) {
    let cols = x.len();
    assert!(a.len() >= t.len() * cols, "A holds {} values, not {} rows of {cols}", a.len(), t.len());
    let row = |j: usize| &a[j * cols..(j + 1) * cols];
    let mut j = 0;
    while j + SHRINK_ROWS <= t.len() {
        let out = dots_body::<SHRINK_ROWS>(std::array::from_fn(|i| row(j + i)), x);
        t[j..j + SHRINK_ROWS].copy_from_slice(&out);
        j += SHRINK_ROWS;
    }
    while j < t.len() {
        t[j] = dots_body::<1>([row(j)], x)[0];
        j += 1;
    }
}

/// Output columns `expand` takes at once: four vectors of independent chains, held in
/// registers for the whole pass over the rank.
const EXPAND_BLOCK: usize = 4 * LANES;

#[inline(always)]
fn expand_body(bt: &[f32], ld: usize, t: &[f32], scale: f32, y: &mut [f32]) {
    let n = y.len();
    assert!(t.is_empty() || bt.len() >= (t.len() - 1) * ld + n, "Bᵀ is too short for {} rows of stride {ld}", t.len());
    let mut o = 0;
    // Each output is its own fused chain over the rank, in rank order, whatever the block,
    // so full blocks (fixed width, kept in registers) and the tail give the same bits.
    while o + EXPAND_BLOCK <= n {
        expand_columns::<EXPAND_BLOCK>(bt, ld, t, scale, &mut y[o..o + EXPAND_BLOCK], o);
        o += EXPAND_BLOCK;
    }
    while o + LANES <= n {
        expand_columns::<LANES>(bt, ld, t, scale, &mut y[o..o + LANES], o);
        o += LANES;
    }
    for (k, y) in y[o..].iter_mut().enumerate() {
        let acc = t.iter().enumerate().fold(0f32, |acc, (j, &tj)| bt[j * ld + o + k].mul_add(tj, acc));
        *y += scale * acc;
    }
}

/// `expand` over the `W` columns starting at `o`.
#[inline(always)]
fn expand_columns<const W: usize>(bt: &[f32], ld: usize, t: &[f32], scale: f32, y: &mut [f32], o: usize) {
    let mut acc = [0f32; W];
    for (j, &tj) in t.iter().enumerate() {
        let b: &[f32; W] = bt[j * ld + o..j * ld + o + W].try_into().expect("W columns");
        for l in 0..W {
            acc[l] = b[l].mul_add(tj, acc[l]);
        }
    }
    for (y, acc) in y.iter_mut().zip(acc) {
        *y += scale * acc;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn shrink_avx2(a: &[f32], x: &[f32], t: &mut [f32]) {
        super::shrink_body(a, x, t)
    }
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn expand_avx2(bt: &[f32], ld: usize, t: &[f32], scale: f32, y: &mut [f32]) {
        super::expand_body(bt, ld, t, scale, y)
    }
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub unsafe fn shrink_avx512(a: &[f32], x: &[f32], t: &mut [f32]) {
        super::shrink_body(a, x, t)
    }
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub unsafe fn expand_avx512(bt: &[f32], ld: usize, t: &[f32], scale: f32, y: &mut [f32]) {
        super::expand_body(bt, ld, t, scale, y)
    }
}

/// `t[j] = A[j]·x` for every `j < t.len()`: `a` is `[t.len()][x.len()]`, row-major.
pub fn shrink(isa: Isa, a: &[f32], x: &[f32], t: &mut [f32]) {
    match isa {
        // SAFETY: the CPU supports the path's features (checked when it was chosen).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { x86::shrink_avx512(a, x, t) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::shrink_avx2(a, x, t) },
        _ => shrink_body(a, x, t),
    }
}

/// `y[o] += scale · Σ_j bt[j·ld + o] · t[j]` for every `o < y.len()`: `bt` holds `Bᵀ`
/// (rank rows of stride `ld`), starting at the first output column `y` covers.
pub fn expand(isa: Isa, bt: &[f32], ld: usize, t: &[f32], scale: f32, y: &mut [f32]) {
    match isa {
        // SAFETY: as in `shrink`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { x86::expand_avx512(bt, ld, t, scale, y) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::expand_avx2(bt, ld, t, scale, y) },
        _ => expand_body(bt, ld, t, scale, y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values with awkward magnitudes, so that any change of summation order shows.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let m = (s % 20_001) as f32 / 10_000.0 - 1.0;
                m * [1.0, 1e-3, 37.0, 1e4][(s >> 20) as usize % 4]
            })
            .collect()
    }

    #[test]
    fn shrink_is_the_lane_order_dot_product() {
        // cols with and without a tail; ranks with and without a partial group of rows.
        for (cols, rank) in [(576, 8), (1536, 4), (37, 5), (16, 1), (3, 7)] {
            let (a, x) = (values(rank * cols, 1), values(cols, 2));
            let mut t = vec![0f32; rank];
            shrink(Isa::Scalar, &a, &x, &mut t);
            for j in 0..rank {
                let mut lanes = [0f32; LANES];
                for k in 0..cols {
                    lanes[k % LANES] = a[j * cols + k].mul_add(x[k], lanes[k % LANES]);
                }
                let fold = |l: [f32; LANES]| {
                    let p8: Vec<f32> = (0..8).map(|i| l[i] + l[i + 8]).collect();
                    let p4: Vec<f32> = (0..4).map(|i| p8[i] + p8[i + 4]).collect();
                    let p2: Vec<f32> = (0..2).map(|i| p4[i] + p4[i + 2]).collect();
                    p2[0] + p2[1]
                };
                assert_eq!(t[j].to_bits(), fold(lanes).to_bits(), "cols {cols} rank {rank} row {j}");
            }
        }
    }

    #[test]
    fn expand_is_one_fused_chain_per_output() {
        // A tail only, vectors and a tail, and full blocks, vectors and a tail.
        for (rank, ld, n) in [(8, 100, 37), (8, 200, 150), (3, 70, 64)] {
            let (bt, t, y0) = (values(rank * ld, 3), values(rank, 4), values(n, 5));
            let mut y = y0.clone();
            expand(Isa::Scalar, &bt[5..], ld, &t, 2.0, &mut y);
            for o in 0..n {
                let acc = (0..rank).fold(0f32, |acc, j| bt[5 + j * ld + o].mul_add(t[j], acc));
                assert_eq!(y[o].to_bits(), (y0[o] + 2.0 * acc).to_bits(), "output {o} of {n}");
            }
        }
    }

    #[test]
    fn every_path_gives_the_scalar_bits() {
        let paths: Vec<Isa> = [Isa::Avx2, Isa::Avx512Vnni, Isa::Neon].into_iter().filter(|i| i.supported()).collect();
        for (cols, rank, n) in [(576, 8, 576), (1536, 8, 192), (41, 3, 23), (64, 16, 1), (8, 1, 15)] {
            let (a, x) = (values(rank * cols, 6), values(cols, 7));
            let (bt, y0) = (values(rank * (n + 3), 8), values(n, 9));
            let mut t_ref = vec![0f32; rank];
            shrink(Isa::Scalar, &a, &x, &mut t_ref);
            let mut y_ref = y0.clone();
            expand(Isa::Scalar, &bt[3..], n + 3, &t_ref, 0.7, &mut y_ref);
            for &isa in &paths {
                let mut t = vec![0f32; rank];
                shrink(isa, &a, &x, &mut t);
                assert_eq!(t.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), t_ref.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{isa} shrink, cols {cols}");
                let mut y = y0.clone();
                expand(isa, &bt[3..], n + 3, &t_ref, 0.7, &mut y);
                assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), y_ref.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{isa} expand, n {n}");
            }
        }
    }
}
