//! LoRA's two products over adapter weights held as f16, with fixed numerics: `shrink`
//! (`t = A·x`, down to the adapter's rank) and `expand` (`y += scale · B·t`, back up to
//! the projection's width). The forward pass runs the base product first and adds the
//! delta after it, so a row without an adapter never comes here.
//!
//! Weights are stored as f16 (half the bytes the products stream) and widened to f32 as
//! they are loaded; widening is exact, so the way a path widens cannot change a bit. The
//! arithmetic is f32, written once, as scalar code over 16 lanes with `mul_add`:
//! - a shrink dot product accumulates element `k` into lane `k % 16`, in element order,
//!   then folds the lanes in a fixed tree (lane `l` plus lane `l + 8`, then `+ 4`, `+ 2`,
//!   `+ 1`);
//! - an expand output is one chain of fused multiply-adds over the rank, in rank order,
//!   then `y + scale · acc` (a multiply, then an add).
//!
//! The x86 paths compile the same bodies with FMA (and AVX-512) enabled, so `mul_add` is
//! one instruction and the 16 lanes are one or two vector registers, and widen with
//! `vcvtph2ps`; on AArch64 `mul_add` is always one instruction and widening is `fcvtl`.
//! Every path therefore gives the scalar path's bits.

use half::f16;

use crate::cpu::Isa;

/// Lanes of the shrink's partial sums (one AVX-512 register, two AVX2 ones, four NEON).
const LANES: usize = 16;
/// Rows of `A` whose dot products run side by side, sharing each load of `x`.
const SHRINK_ROWS: usize = 4;

/// `f16` bits widened to `f32`, exactly, for every finite value (adapters hold no others):
/// the magnitude's bits moved into f32's fields and scaled by 2^112, which rebiases the
/// exponent and turns an f16 subnormal into the f32 normal of the same value.
#[inline(always)]
fn widen_one(h: f16) -> f32 {
    let h = u32::from(h.to_bits());
    let magnitude = f32::from_bits((h & 0x7fff) << 13) * f32::from_bits(0x7780_0000);
    f32::from_bits(magnitude.to_bits() | (h & 0x8000) << 16)
}

/// How a path widens 16 consecutive stored weights.
trait Widen {
    /// # Safety
    /// The CPU has the features the implementation uses.
    unsafe fn widen(h: &[f16; LANES]) -> [f32; LANES];
}

/// Portable widening, element by element.
struct Portable;

impl Widen for Portable {
    #[inline(always)]
    unsafe fn widen(h: &[f16; LANES]) -> [f32; LANES] {
        h.map(widen_one)
    }
}

/// A fixed-size window of `s` starting at `at`.
#[inline(always)]
fn window<const N: usize, T>(s: &[T], at: usize) -> &[T; N] {
    s[at..at + N].try_into().expect("N elements")
}

/// `N` dot products of rows of `a` with `x`, each in the 16-lane order.
#[inline(always)]
unsafe fn dots_body<W: Widen, const N: usize>(a: [&[f16]; N], x: &[f32]) -> [f32; N] {
    let mut acc = [[0f32; LANES]; N];
    let whole = x.len() - x.len() % LANES;
    for k in (0..whole).step_by(LANES) {
        let xs: &[f32; LANES] = window(x, k);
        for (acc, a) in acc.iter_mut().zip(&a) {
            let a = W::widen(window(a, k));
            for l in 0..LANES {
                acc[l] = a[l].mul_add(xs[l], acc[l]);
            }
        }
    }
    for (acc, a) in acc.iter_mut().zip(&a) {
        for (l, k) in (whole..x.len()).enumerate() {
            acc[l] = widen_one(a[k]).mul_add(x[k], acc[l]);
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
unsafe fn shrink_body<W: Widen>(a: &[f16], x: &[f32], t: &mut [f32]) {
    let cols = x.len();
    assert!(a.len() >= t.len() * cols, "A holds {} values, not {} rows of {cols}", a.len(), t.len());
    let row = |j: usize| &a[j * cols..(j + 1) * cols];
    let mut j = 0;
    while j + SHRINK_ROWS <= t.len() {
        let out = dots_body::<W, SHRINK_ROWS>(std::array::from_fn(|i| row(j + i)), x);
        t[j..j + SHRINK_ROWS].copy_from_slice(&out);
        j += SHRINK_ROWS;
    }
    while j < t.len() {
        t[j] = dots_body::<W, 1>([row(j)], x)[0];
        j += 1;
    }
}

/// Output columns `expand` takes at once: four vectors of independent chains, held in
/// registers for the whole pass over the rank.
const EXPAND_BLOCK: usize = 4 * LANES;

#[inline(always)]
unsafe fn expand_body<W: Widen>(bt: &[f16], ld: usize, t: &[f32], scale: f32, y: &mut [f32]) {
    let n = y.len();
    assert!(t.is_empty() || bt.len() >= (t.len() - 1) * ld + n, "Bᵀ is too short for {} rows of stride {ld}", t.len());
    let mut o = 0;
    // Each output is its own fused chain over the rank, in rank order, whatever the block,
    // so full blocks (fixed width, kept in registers) and the tail give the same bits.
    while o + EXPAND_BLOCK <= n {
        expand_columns::<W, EXPAND_BLOCK>(bt, ld, t, scale, &mut y[o..o + EXPAND_BLOCK], o);
        o += EXPAND_BLOCK;
    }
    while o + LANES <= n {
        expand_columns::<W, LANES>(bt, ld, t, scale, &mut y[o..o + LANES], o);
        o += LANES;
    }
    for (k, y) in y[o..].iter_mut().enumerate() {
        let acc = t.iter().enumerate().fold(0f32, |acc, (j, &tj)| widen_one(bt[j * ld + o + k]).mul_add(tj, acc));
        *y += scale * acc;
    }
}

/// `expand` over the `C` columns starting at `o` (`C` a multiple of [`LANES`]).
#[inline(always)]
unsafe fn expand_columns<W: Widen, const C: usize>(bt: &[f16], ld: usize, t: &[f32], scale: f32, y: &mut [f32], o: usize) {
    let mut acc = [0f32; C];
    for (j, &tj) in t.iter().enumerate() {
        for g in (0..C).step_by(LANES) {
            let b = W::widen(window(bt, j * ld + o + g));
            for l in 0..LANES {
                acc[g + l] = b[l].mul_add(tj, acc[g + l]);
            }
        }
    }
    for (y, acc) in y.iter_mut().zip(acc) {
        *y += scale * acc;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{f16, Widen, LANES};

    /// Two `vcvtph2ps` of eight lanes (F16C).
    struct F16c;
    /// One `vcvtph2ps` of sixteen lanes (AVX-512F).
    struct Avx512;

    impl Widen for F16c {
        #[inline(always)]
        unsafe fn widen(h: &[f16; LANES]) -> [f32; LANES] {
            let p = h.as_ptr() as *const __m128i;
            std::mem::transmute([_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_cvtph_ps(_mm_loadu_si128(p.add(1)))])
        }
    }

    impl Widen for Avx512 {
        #[inline(always)]
        unsafe fn widen(h: &[f16; LANES]) -> [f32; LANES] {
            std::mem::transmute(_mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i)))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn shrink_avx2(a: &[f16], x: &[f32], t: &mut [f32]) {
        super::shrink_body::<F16c>(a, x, t)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn expand_avx2(bt: &[f16], ld: usize, t: &[f32], scale: f32, y: &mut [f32]) {
        super::expand_body::<F16c>(bt, ld, t, scale, y)
    }
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub unsafe fn shrink_avx512(a: &[f16], x: &[f32], t: &mut [f32]) {
        super::shrink_body::<Avx512>(a, x, t)
    }
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub unsafe fn expand_avx512(bt: &[f16], ld: usize, t: &[f32], scale: f32, y: &mut [f32]) {
        super::expand_body::<Avx512>(bt, ld, t, scale, y)
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    use super::{f16, Widen, LANES};
    use crate::neon::f16x4_to_f32;

    /// Four `fcvtl` of four lanes.
    struct Fcvtl;

    impl Widen for Fcvtl {
        #[inline(always)]
        unsafe fn widen(h: &[f16; LANES]) -> [f32; LANES] {
            let p = h.as_ptr() as *const u16;
            std::mem::transmute([0, 4, 8, 12].map(|k| f16x4_to_f32(vld1_u16(p.add(k)))))
        }
    }

    pub fn shrink_neon(a: &[f16], x: &[f32], t: &mut [f32]) {
        // SAFETY: FCVTL is a base AArch64 instruction.
        unsafe { super::shrink_body::<Fcvtl>(a, x, t) }
    }
    pub fn expand_neon(bt: &[f16], ld: usize, t: &[f32], scale: f32, y: &mut [f32]) {
        // SAFETY: as in `shrink_neon`.
        unsafe { super::expand_body::<Fcvtl>(bt, ld, t, scale, y) }
    }
}

/// `t[j] = A[j]·x` for every `j < t.len()`: `a` is `[t.len()][x.len()]`, row-major, and
/// finite.
pub fn shrink(isa: Isa, a: &[f16], x: &[f32], t: &mut [f32]) {
    match isa {
        // SAFETY: the CPU supports the path's features (checked when it was chosen).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { x86::shrink_avx512(a, x, t) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => unsafe { x86::shrink_avx2(a, x, t) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon | Isa::NeonI8mm => arm::shrink_neon(a, x, t),
        // SAFETY: portable widening needs no feature.
        _ => unsafe { shrink_body::<Portable>(a, x, t) },
    }
}

/// `y[o] += scale · Σ_j bt[j·ld + o] · t[j]` for every `o < y.len()`: `bt` holds `Bᵀ`
/// (rank rows of stride `ld`, finite), starting at the first output column `y` covers.
pub fn expand(isa: Isa, bt: &[f16], ld: usize, t: &[f32], scale: f32, y: &mut [f32]) {
    match isa {
        // SAFETY: as in `shrink`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { x86::expand_avx512(bt, ld, t, scale, y) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => unsafe { x86::expand_avx2(bt, ld, t, scale, y) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon | Isa::NeonI8mm => arm::expand_neon(bt, ld, t, scale, y),
        // SAFETY: as in `shrink`.
        _ => unsafe { expand_body::<Portable>(bt, ld, t, scale, y) },
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

    /// The same values rounded to the f16 weights the kernels read.
    fn weights(n: usize, seed: u32) -> Vec<f16> {
        values(n, seed).into_iter().map(f16::from_f32).collect()
    }

    #[test]
    fn widening_is_exact_for_every_finite_f16() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).filter(|h| h.is_finite()).collect();
        for &h in &all {
            assert_eq!(widen_one(h).to_bits(), h.to_f32().to_bits(), "f16 bits {:#06x}", h.to_bits());
        }
        // Every path's wide conversion, through a shrink against unit vectors: each lane
        // sum is the one weight times 1.0 plus zeros.
        for isa in Isa::simd_supported() {
            for chunk in all.chunks_exact(LANES) {
                for k in 0..LANES {
                    let mut x = [0f32; LANES];
                    x[k] = 1.0;
                    let mut t = [0f32];
                    shrink(isa, chunk, &x, &mut t);
                    let want = chunk[k].to_f32();
                    assert!(t[0] == want && t[0].is_sign_negative() == want.is_sign_negative() || want == 0.0, "{isa}: f16 {:#06x} widened to {}", chunk[k].to_bits(), t[0]);
                }
            }
        }
    }

    #[test]
    fn shrink_is_the_lane_order_dot_product() {
        // cols with and without a tail; ranks with and without a partial group of rows.
        for (cols, rank) in [(576, 8), (1536, 4), (37, 5), (16, 1), (3, 7)] {
            let (a, x) = (weights(rank * cols, 1), values(cols, 2));
            let mut t = vec![0f32; rank];
            shrink(Isa::Scalar, &a, &x, &mut t);
            for j in 0..rank {
                let mut lanes = [0f32; LANES];
                for k in 0..cols {
                    lanes[k % LANES] = a[j * cols + k].to_f32().mul_add(x[k], lanes[k % LANES]);
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
            let (bt, t, y0) = (weights(rank * ld, 3), values(rank, 4), values(n, 5));
            let mut y = y0.clone();
            expand(Isa::Scalar, &bt[5..], ld, &t, 2.0, &mut y);
            for o in 0..n {
                let acc = (0..rank).fold(0f32, |acc, j| bt[5 + j * ld + o].to_f32().mul_add(t[j], acc));
                assert_eq!(y[o].to_bits(), (y0[o] + 2.0 * acc).to_bits(), "output {o} of {n}");
            }
        }
    }

    #[test]
    fn every_path_gives_the_scalar_bits() {
        let paths = Isa::simd_supported();
        for (cols, rank, n) in [(576, 8, 576), (1536, 8, 192), (41, 3, 23), (64, 16, 1), (8, 1, 15)] {
            let (a, x) = (weights(rank * cols, 6), values(cols, 7));
            let (bt, y0) = (weights(rank * (n + 3), 8), values(n, 9));
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
