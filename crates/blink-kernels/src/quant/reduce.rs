//! The reduction orders that define Blink's float results.
//!
//! Float sums depend on their order, and a transformer amplifies last-bit differences
//! until greedy tokens flip. Blink therefore fixes every reduction to the order llama.cpp's
//! x86 kernels use, so its outputs match that reference exactly (quantized dots may opt
//! out: [`crate::order`]). The quantized dots are written for AVX2 in both of llama.cpp's
//! x86 builds; ggml's float dots (`ggml_vec_dot_f16/f32`) take the build's vector width,
//! so they come in two flavours ([`Flavour`]): 16-lane steps for the AVX-512 build
//! ([`dot_lanes16`]), 8-lane steps for the AVX2 build ([`dot_lanes8`]). Scalar code
//! emulates the orders with `mul_add`; SIMD kernels must produce identical bits.

use crate::flavour::Flavour;

/// Horizontal sum of eight lanes, as ggml's `hsum_float_8`:
/// `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
#[inline]
pub fn hsum8(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// Horizontal sum of sixteen lanes, as `_mm512_reduce_add_ps`: halves, then quarters,
/// then `(t0+t2) + (t1+t3)`.
#[inline]
pub fn hsum16(a: &[f32; 16]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|i| a[i + 8] + a[i]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[i + 4] + t3[i]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// Horizontal sum of eight lanes as ggml's AVX `GGML_F32x8_REDUCE` ends (two `hadd`s
/// after adding the 128-bit halves): `((l0+l4) + (l1+l5)) + ((l2+l6) + (l3+l7))`.
#[inline]
pub fn hsum8_hadd(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
}

/// Elements per step of the float dot product: four 16-lane accumulators.
pub const FLOAT_DOT_STEP: usize = 64;

/// Elements per step of the AVX2 build's float dot product: four 8-lane accumulators.
pub const FLOAT_DOT_STEP_AVX2: usize = 32;

/// How a float dot adds the elements past its last whole step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// In f64, each product rounded in f32 (ggml's f16 dot).
    F64,
    /// As GCC compiled ggml's f32 dot: its leftover loop vectorised in element order,
    /// each whole group of the build's narrower vectors (8 lanes for AVX-512, 4 for AVX2)
    /// adding its rounded products one by one, the last few (under a group) an FMA each.
    F32,
    /// Each with an FMA: Blink's products of `F32` weight matrices, whose SIMD kernels
    /// (in `gemm`) end so (ggml's end as [`Tail::F32`]).
    Fused,
}

/// The float dot product of `flavour`: [`dot_lanes16`] or [`dot_lanes8`].
#[inline]
pub fn dot_float(flavour: Flavour, n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32, tail: Tail) -> f32 {
    match flavour {
        Flavour::Avx512 => dot_lanes16(n, x, y, tail),
        Flavour::Avx2 => dot_lanes8(n, x, y, tail),
    }
}

/// Dot product of `n` elements in the order of ggml's AVX-512 `ggml_vec_dot_f16/f32`:
/// whole 64-element steps go into four 16-lane FMA accumulators, which are folded
/// (`a0+a2`, `a1+a3`, then `a0+a1`) and reduced with [`hsum16`]; leftover elements are
/// then added as `tail` says (groups of 8 for [`Tail::F32`]).
#[inline]
pub fn dot_lanes16(n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32, tail: Tail) -> f32 {
    let (np, a) = folded::<16>(n, &x, &y);
    finish_dot(hsum16(&a), np, n, x, y, tail, 8)
}

/// Dot product of `n` elements in the order of ggml's AVX2 `ggml_vec_dot_f16/f32`: whole
/// 32-element steps go into four 8-lane FMA accumulators (element `e` into accumulator
/// `e / 8 % 4`, lane `e % 8`), which are folded (`a0+a2`, `a1+a3`, then `a0+a1`) and
/// reduced with [`hsum8_hadd`]; leftover elements are then added as `tail` says (groups
/// of 4 for [`Tail::F32`]).
#[inline]
pub fn dot_lanes8(n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32, tail: Tail) -> f32 {
    let (np, a) = folded::<8>(n, &x, &y);
    finish_dot(hsum8_hadd(&a), np, n, x, y, tail, 4)
}

/// The whole `4·L`-element steps of `n` into four `L`-lane FMA accumulators, folded
/// (`a0+a2`, `a1+a3`, then `a0+a1`): the elements stepped over and the folded lanes.
#[inline(always)]
fn folded<const L: usize>(n: usize, x: &impl Fn(usize) -> f32, y: &impl Fn(usize) -> f32) -> (usize, [f32; L]) {
    let step = 4 * L;
    let np = n - n % step;
    let mut acc = [[0f32; L]; 4];
    for i in (0..np).step_by(step) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                let e = i + L * j + l;
                *lane = x(e).mul_add(y(e), *lane);
            }
        }
    }
    let [mut a0, mut a1, a2, a3] = acc;
    for l in 0..L {
        a0[l] += a2[l];
        a1[l] += a3[l];
    }
    for l in 0..L {
        a0[l] += a1[l];
    }
    (np, a0)
}

/// A float dot's leftover elements `np..n` after its vector steps summed to `head`, as
/// `tail` says (`group`: the lanes of [`Tail::F32`]'s groups).
#[inline]
fn finish_dot(head: f32, np: usize, n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32, tail: Tail, group: usize) -> f32 {
    match tail {
        Tail::F64 => {
            let mut sum = head as f64;
            for e in np..n {
                sum += (x(e) * y(e)) as f64;
            }
            sum as f32
        }
        Tail::F32 | Tail::Fused => {
            let rounded = if tail == Tail::F32 { n - (n - np) % group } else { np };
            let mut sum = head;
            for e in np..rounded {
                sum += x(e) * y(e);
            }
            for e in rounded..n {
                sum = x(e).mul_add(y(e), sum);
            }
            sum
        }
    }
}

/// Elements per step of the `BF16` dot product: two 16-lane accumulators.
pub const BF16_DOT_STEP: usize = 32;

/// Dot product of `n` elements in the order of ggml's AVX-512F `ggml_vec_dot_bf16` (its
/// path without the BF16 extension): whole 32-element steps go into two 16-lane
/// accumulators, each lane adding the rounded product (`acc + x·y`, no FMA); each
/// accumulator is reduced with [`hsum16`] and added to an `f64` sum, leftover products
/// (rounded in `f32`) are added to it one by one, and the sum is rounded to `f32`.
#[inline]
pub fn dot_lanes16_unfused(n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32) -> f32 {
    let np = n - n % BF16_DOT_STEP;
    let mut acc = [[0f32; 16]; 2];
    for i in (0..np).step_by(BF16_DOT_STEP) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                let e = i + 16 * j + l;
                *lane += x(e) * y(e);
            }
        }
    }
    let mut sum = 0f64;
    for a in &acc {
        sum += hsum16(a) as f64;
    }
    for e in np..n {
        sum += (x(e) * y(e)) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_exact_on_integers() {
        let l: [f32; 8] = std::array::from_fn(|i| i as f32);
        assert_eq!(hsum8(&l), 28.0);
        let a: [f32; 16] = std::array::from_fn(|i| i as f32);
        assert_eq!(hsum16(&a), 120.0);
        let x: Vec<f32> = (0..100).map(|i| (i % 7) as f32).collect();
        let want: f32 = x.iter().map(|v| v * v).sum();
        for tail in [Tail::F64, Tail::F32, Tail::Fused] {
            assert_eq!(dot_lanes16(100, |i| x[i], |i| x[i], tail), want);
            assert_eq!(dot_lanes8(100, |i| x[i], |i| x[i], tail), want);
        }
        assert_eq!(hsum8_hadd(&l), 28.0);
        assert_eq!(dot_lanes16_unfused(100, |i| x[i], |i| x[i]), want);
    }

    #[test]
    fn hsum8_groups_lanes_like_ggml() {
        // 1e8 + 1 - 1e8 depends on grouping: ggml adds lane 0 to lane 4 first.
        let mut l = [0f32; 8];
        l[0] = 1e8;
        l[4] = -1e8;
        l[2] = 1.0;
        assert_eq!(hsum8(&l), 1.0);
        // The AVX build's reduce pairs lane 0+4 with 1+5 first: 1e8 + 1 is lost to rounding.
        l = [0f32; 8];
        l[0] = 1e8;
        l[1] = 1.0;
        l[2] = -1e8;
        assert_eq!(hsum8_hadd(&l), 0.0);
        assert_eq!(hsum8(&l), 1.0);
    }
}
