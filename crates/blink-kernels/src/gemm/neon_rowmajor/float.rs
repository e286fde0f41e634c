//! The float kernels of [`super`]: `F32`, `F16` and `BF16` against rows of the same type.
//!
//! The reference order ([`crate::quant::reduce`]) gives each output four (or two) 16-lane
//! accumulators, each lane summing one residue of the element index in order. A tile of
//! weight rows × activation rows keeps `H` of the sixteen (or eight) four-lane quarters of
//! every output's accumulators in registers per pass over the rows; the accumulators are
//! then folded and reduced exactly as the reference does, and leftover elements go
//! through the reference's scalar code.

use std::arch::aarch64::*;
use std::array::from_fn;
use std::ops::Range;

use blink_gguf::GgmlType;

use super::{drive, Out};
use crate::neon::load_f16x4;
use crate::quant::float::{bf16_bits_to_f32, f16_bits_to_f32};

/// Four-lane quarters of an output's accumulators, at most (`F32`/`F16`: four of 16 lanes).
const MAX_QUARTERS: usize = 16;

/// A float element type and its reference order.
trait Float {
    const BYTES: usize;
    /// Four-lane quarters of the 16-lane accumulators; a step covers `4 · QUARTERS` elements.
    const QUARTERS: usize;
    /// Whether lanes accumulate with one rounding (FMA) or two (multiply, then add).
    const FUSED: bool;

    /// Four elements at `p` as `f32`.
    unsafe fn load4(p: *const u8) -> float32x4_t;
    /// Element `e` of the row at `p`.
    unsafe fn at(p: *const u8, e: usize) -> f32;
    /// The row result from the accumulators and the leftover elements `np..n`.
    unsafe fn finish(acc: &[float32x4_t; MAX_QUARTERS], n: usize, np: usize, w: *const u8, a: *const u8) -> f32;
}

/// [`crate::quant::reduce::hsum16`] of four quarters: halves, quarters, (t0+t2) + (t1+t3).
#[inline(always)]
unsafe fn hsum16(v: &[float32x4_t]) -> f32 {
    let t6 = vaddq_f32(vaddq_f32(v[3], v[1]), vaddq_f32(v[2], v[0]));
    let t8 = vaddq_f32(t6, vextq_f32::<2>(t6, t6));
    vgetq_lane_f32::<0>(t8) + vgetq_lane_f32::<1>(t8)
}

/// The fold of [`crate::quant::reduce::dot_lanes16`]: `(a0 + a2) + (a1 + a3)`, then `hsum16`.
#[inline(always)]
unsafe fn fold4(acc: &[float32x4_t; MAX_QUARTERS]) -> f32 {
    let v: [float32x4_t; 4] = from_fn(|x| vaddq_f32(vaddq_f32(acc[x], acc[8 + x]), vaddq_f32(acc[4 + x], acc[12 + x])));
    hsum16(&v)
}

struct F32;
struct F16;
struct Bf16;

impl Float for F32 {
    const BYTES: usize = 4;
    const QUARTERS: usize = 16;
    const FUSED: bool = true;

    #[inline(always)]
    unsafe fn load4(p: *const u8) -> float32x4_t {
        vreinterpretq_f32_u8(vld1q_u8(p))
    }

    #[inline(always)]
    unsafe fn at(p: *const u8, e: usize) -> f32 {
        (p.add(4 * e) as *const f32).read_unaligned()
    }

    #[inline(always)]
    unsafe fn finish(acc: &[float32x4_t; MAX_QUARTERS], n: usize, np: usize, w: *const u8, a: *const u8) -> f32 {
        let mut sum = fold4(acc);
        for e in np..n {
            sum = Self::at(w, e).mul_add(Self::at(a, e), sum);
        }
        sum
    }
}

impl Float for F16 {
    const BYTES: usize = 2;
    const QUARTERS: usize = 16;
    const FUSED: bool = true;

    #[inline(always)]
    unsafe fn load4(p: *const u8) -> float32x4_t {
        load_f16x4(p)
    }

    #[inline(always)]
    unsafe fn at(p: *const u8, e: usize) -> f32 {
        f16_bits_to_f32((p.add(2 * e) as *const u16).read_unaligned())
    }

    #[inline(always)]
    unsafe fn finish(acc: &[float32x4_t; MAX_QUARTERS], n: usize, np: usize, w: *const u8, a: *const u8) -> f32 {
        let mut sum = fold4(acc) as f64;
        for e in np..n {
            sum += (Self::at(w, e) * Self::at(a, e)) as f64;
        }
        sum as f32
    }
}

impl Float for Bf16 {
    const BYTES: usize = 2;
    const QUARTERS: usize = 8;
    const FUSED: bool = false;

    #[inline(always)]
    unsafe fn load4(p: *const u8) -> float32x4_t {
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vreinterpret_u16_u8(vld1_u8(p))))
    }

    #[inline(always)]
    unsafe fn at(p: *const u8, e: usize) -> f32 {
        bf16_bits_to_f32((p.add(2 * e) as *const u16).read_unaligned())
    }

    #[inline(always)]
    unsafe fn finish(acc: &[float32x4_t; MAX_QUARTERS], n: usize, np: usize, w: *const u8, a: *const u8) -> f32 {
        let mut sum = 0f64;
        sum += hsum16(&acc[..4]) as f64;
        sum += hsum16(&acc[4..8]) as f64;
        for e in np..n {
            sum += (Self::at(w, e) * Self::at(a, e)) as f64;
        }
        sum as f32
    }
}

/// One tile: `NR` weight rows × `NA` activation rows over `n` elements, `H` quarters of
/// the accumulators per pass. Result `[i][j]` is row `i` · activation `j`.
#[inline(always)]
unsafe fn float_tile<T: Float, const NR: usize, const NA: usize, const H: usize>(n: usize, w: [*const u8; NR], a: [*const u8; NA]) -> [[f32; NA]; NR] {
    const { assert!(T::QUARTERS % H == 0) };
    let step = 4 * T::QUARTERS;
    let np = n - n % step;
    let zero = vdupq_n_f32(0.0);
    let mut quarters = [[[zero; MAX_QUARTERS]; NA]; NR];
    for pass in 0..T::QUARTERS / H {
        let mut acc = [[[zero; H]; NA]; NR];
        for s in (0..np).step_by(step) {
            for h in 0..H {
                let at = (s + 4 * (pass * H + h)) * T::BYTES;
                let wv: [float32x4_t; NR] = from_fn(|i| T::load4(w[i].add(at)));
                for j in 0..NA {
                    let av = T::load4(a[j].add(at));
                    for (acc_i, &wi) in acc.iter_mut().zip(&wv) {
                        let c = &mut acc_i[j][h];
                        *c = if T::FUSED { vfmaq_f32(*c, wi, av) } else { vaddq_f32(*c, vmulq_f32(wi, av)) };
                    }
                }
            }
        }
        for i in 0..NR {
            for j in 0..NA {
                quarters[i][j][pass * H..pass * H + H].copy_from_slice(&acc[i][j]);
            }
        }
    }
    from_fn(|i| from_fn(|j| T::finish(&quarters[i][j], n, np, w[i], a[j])))
}

#[inline(always)]
unsafe fn float_gemm<T: Float>(cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    let rb = cols * T::BYTES;
    assert!(w.len() >= rows.end * rb, "weights shorter than their rows");
    assert!(act.len() >= (n_act - 1) * act_stride + rb, "activations too short");
    // Sixteen accumulator registers either way (NR·NA·H), of the 32.
    drive::<2, 2, 4>(rb, w, rows, act, act_stride, n_act, out, |w, a| float_tile::<T, 2, 2, 4>(cols, w, a), |w, a| float_tile::<T, 4, 1, 4>(cols, w, a));
}

/// Run the kernel for `ty`; false if `ty` is not a float type.
#[inline(always)]
pub(super) unsafe fn gemm(ty: GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) -> bool {
    match ty {
        GgmlType::F32 => float_gemm::<F32>(cols, w, rows, act, act_stride, n_act, out),
        GgmlType::F16 => float_gemm::<F16>(cols, w, rows, act, act_stride, n_act, out),
        GgmlType::BF16 => float_gemm::<Bf16>(cols, w, rows, act, act_stride, n_act, out),
        _ => return false,
    }
    true
}
