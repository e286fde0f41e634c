//! AVX2 / AVX-512 kernels for the float weight types `F32`, `F16` and `BF16` against
//! activation rows of the same type, over row-major weights.
//!
//! The reference orders ([`crate::quant::reduce`]) give every output a few 16-lane
//! accumulators (`F32`/`F16`: four, fused multiply-add; `BF16`: two, product then add),
//! each lane summing one residue of the element index in order. Lanes are independent, so
//! a kernel may visit them in any grouping as long as each lane sees its elements in
//! order: a tile of weight rows × activation rows runs one or more passes over the row,
//! each pass keeping `H` eight-lane halves of the accumulators of every output in
//! registers (`BF16` loads put its lanes in a permuted order, undone at the end). The
//! accumulators are then folded and reduced exactly as the reference does, and leftover
//! elements past the last whole step go through the reference's scalar code.

#![allow(clippy::too_many_arguments)]

use std::arch::x86_64::*;
use std::array::from_fn;
use std::mem::MaybeUninit;
use std::ops::Range;

use blink_gguf::GgmlType;

use super::Out;
use crate::quant::float::{bf16_bits_to_f32, f16_bits_to_f32};

/// Eight-lane halves of an output's accumulators, at most (`F32`/`F16`: four of 16 lanes).
const MAX_HALVES: usize = 8;

/// A float element type and its reference order.
trait Float {
    const BYTES: usize;
    /// Eight-lane halves of the 16-lane accumulators; a step covers `8 · HALVES` elements.
    const HALVES: usize;
    /// Whether lanes accumulate with one rounding (FMA) or two (multiply, then add).
    const FUSED: bool;

    /// Sixteen elements at `p` as `f32`, in two vectors whose lanes hold the elements in
    /// an order of the type's choosing (the same for weights and activations);
    /// [`Float::finish`] puts them back in order.
    unsafe fn load16(p: *const u8) -> [__m256; 2];
    /// Element `e` of the row at `p`.
    unsafe fn at(p: *const u8, e: usize) -> f32;
    /// The row result from the `HALVES` accumulators (in [`Float::load16`] order) and
    /// the leftover elements `np..n`.
    unsafe fn finish(acc: &[__m256], n: usize, np: usize, w: *const u8, a: *const u8) -> f32;
}

/// [`crate::quant::reduce::hsum16`] of the lanes `lo ++ hi`.
#[inline(always)]
unsafe fn hsum16(lo: __m256, hi: __m256) -> f32 {
    let t3 = _mm256_add_ps(hi, lo);
    let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
    // [t0 + t2, t1 + t3, ..], then (t0 + t2) + (t1 + t3).
    let t = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)))
}

/// The fold of [`crate::quant::reduce::dot_lanes16`]: `a0 + a2`, `a1 + a3`, then their
/// sum, reduced with `hsum16`.
#[inline(always)]
unsafe fn fold4(acc: &[__m256]) -> f32 {
    let (a0, a1) = ([_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[1], acc[5])], [_mm256_add_ps(acc[2], acc[6]), _mm256_add_ps(acc[3], acc[7])]);
    hsum16(_mm256_add_ps(a0[0], a1[0]), _mm256_add_ps(a0[1], a1[1]))
}

struct F32;
struct F16;
struct Bf16;

impl Float for F32 {
    const BYTES: usize = 4;
    const HALVES: usize = 8;
    const FUSED: bool = true;

    #[inline(always)]
    unsafe fn load16(p: *const u8) -> [__m256; 2] {
        [_mm256_loadu_ps(p as *const f32), _mm256_loadu_ps(p.add(32) as *const f32)]
    }

    #[inline(always)]
    unsafe fn at(p: *const u8, e: usize) -> f32 {
        (p.add(4 * e) as *const f32).read_unaligned()
    }

    #[inline(always)]
    unsafe fn finish(acc: &[__m256], n: usize, np: usize, w: *const u8, a: *const u8) -> f32 {
        let mut sum = fold4(acc);
        for e in np..n {
            sum = Self::at(w, e).mul_add(Self::at(a, e), sum);
        }
        sum
    }
}

impl Float for F16 {
    const BYTES: usize = 2;
    const HALVES: usize = 8;
    const FUSED: bool = true;

    #[inline(always)]
    unsafe fn load16(p: *const u8) -> [__m256; 2] {
        [_mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)), _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i))]
    }

    #[inline(always)]
    unsafe fn at(p: *const u8, e: usize) -> f32 {
        f16_bits_to_f32((p.add(2 * e) as *const u16).read_unaligned())
    }

    #[inline(always)]
    unsafe fn finish(acc: &[__m256], n: usize, np: usize, w: *const u8, a: *const u8) -> f32 {
        let mut sum = fold4(acc) as f64;
        for e in np..n {
            sum += (Self::at(w, e) * Self::at(a, e)) as f64;
        }
        sum as f32
    }
}

impl Float for Bf16 {
    const BYTES: usize = 2;
    const HALVES: usize = 4;
    const FUSED: bool = false;

    /// Elements 0..4 and 8..12 in the first vector, 4..8 and 12..16 in the second: one
    /// unpack each puts the 16 bits on top of a zero low half.
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> [__m256; 2] {
        let x = _mm256_loadu_si256(p as *const __m256i);
        let z = _mm256_setzero_si256();
        [_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x))]
    }

    #[inline(always)]
    unsafe fn at(p: *const u8, e: usize) -> f32 {
        bf16_bits_to_f32((p.add(2 * e) as *const u16).read_unaligned())
    }

    #[inline(always)]
    unsafe fn finish(acc: &[__m256], n: usize, np: usize, w: *const u8, a: *const u8) -> f32 {
        // Lanes 0..8 of a 16-lane accumulator are the low halves of its two vectors.
        let (lo0, hi0) = (_mm256_permute2f128_ps::<0x20>(acc[0], acc[1]), _mm256_permute2f128_ps::<0x31>(acc[0], acc[1]));
        let (lo1, hi1) = (_mm256_permute2f128_ps::<0x20>(acc[2], acc[3]), _mm256_permute2f128_ps::<0x31>(acc[2], acc[3]));
        let mut sum = 0f64;
        sum += hsum16(lo0, hi0) as f64;
        sum += hsum16(lo1, hi1) as f64;
        for e in np..n {
            sum += (Self::at(w, e) * Self::at(a, e)) as f64;
        }
        sum as f32
    }
}

/// Accumulators of a tile: per weight row, activation row and eight-lane half.
type Halves<const NR: usize, const NA: usize> = [[[MaybeUninit<__m256>; MAX_HALVES]; NA]; NR];

/// One pass of a tile over the first `np` elements: halves `first..first + H` of every
/// output's accumulators, held in registers, then written to `dst`.
#[inline(always)]
unsafe fn pass<T: Float, const NR: usize, const NA: usize, const H: usize>(
    np: usize,
    first: usize,
    w: &[*const u8; NR],
    a: &[*const u8; NA],
    dst: &mut Halves<NR, NA>,
) {
    let mut acc = [[[_mm256_setzero_ps(); H]; NA]; NR];
    for s in (0..np).step_by(8 * T::HALVES) {
        for h in (0..H).step_by(2) {
            let at = (s + 8 * (first + h)) * T::BYTES;
            // Plain loops, not closures: a closure would not inherit the target features,
            // and the intrinsics inside it would become calls.
            let mut wv = [[_mm256_setzero_ps(); 2]; NR];
            for i in 0..NR {
                wv[i] = T::load16(w[i].add(at));
            }
            for j in 0..NA {
                let av = T::load16(a[j].add(at));
                for i in 0..NR {
                    for k in 0..2 {
                        let c = &mut acc[i][j][h + k];
                        *c = if T::FUSED {
                            _mm256_fmadd_ps(wv[i][k], av[k], *c)
                        } else {
                            _mm256_add_ps(*c, _mm256_mul_ps(wv[i][k], av[k]))
                        };
                    }
                }
            }
        }
    }
    for i in 0..NR {
        for j in 0..NA {
            for h in 0..H {
                // Volatile (with the reads in `tile`), so finished accumulators go to
                // memory: kept in registers across the unrolled passes, as the compiler
                // otherwise does, they leave too few for the next pass's hot loop.
                // SAFETY: a valid, aligned element of `dst`.
                std::ptr::write_volatile(dst[i][j][first + h].as_mut_ptr(), acc[i][j][h]);
            }
        }
    }
}

/// One tile: `NR` weight rows × `NA` activation rows over `n` elements, `H` halves of the
/// accumulators per pass. Result `[i][j]` is row `i` · activation `j`.
#[inline(always)]
unsafe fn tile<T: Float, const NR: usize, const NA: usize, const H: usize>(n: usize, w: [*const u8; NR], a: [*const u8; NA]) -> [[f32; NA]; NR] {
    const { assert!(T::HALVES % H == 0 && H.is_multiple_of(2)) };
    let np = n - n % (8 * T::HALVES);
    // Every output's first `T::HALVES` entries are written by the passes; the rest stay
    // unused (left uninitialised: zeroing them costs as much as a short row).
    let mut halves: Halves<NR, NA> = [[[MaybeUninit::uninit(); MAX_HALVES]; NA]; NR];
    for first in (0..T::HALVES).step_by(H) {
        pass::<T, NR, NA, H>(np, first, &w, &a, &mut halves);
    }
    let mut res = [[0f32; NA]; NR];
    for i in 0..NR {
        for j in 0..NA {
            let mut acc = [_mm256_setzero_ps(); MAX_HALVES];
            for (h, v) in acc.iter_mut().enumerate().take(T::HALVES) {
                // SAFETY: the passes wrote entries `0..T::HALVES` (volatile: see `pass`).
                *v = std::ptr::read_volatile(halves[i][j][h].as_ptr());
            }
            res[i][j] = T::finish(&acc[..T::HALVES], n, np, w[i], a[j]);
        }
    }
    res
}

/// `out[r][i] (+)= w_i · a_r` with `NR × NA` tiles (`H` halves per pass); activation rows
/// left over when fewer than `NA` remain go one at a time against `NR1` rows (`H1`).
#[inline(always)]
unsafe fn gemm<T: Float, const NR: usize, const NA: usize, const H: usize, const NR1: usize, const H1: usize>(
    cols: usize,
    w: &[u8],
    rows: Range<usize>,
    act: &[u8],
    act_stride: usize,
    n_act: usize,
    out: Out,
) {
    let rb = cols * T::BYTES;
    assert!(w.len() >= rows.end * rb, "weights shorter than their rows");
    assert!(act.len() >= (n_act - 1) * act_stride + rb, "activations too short");
    // Float rows are wide (2 or 4 bytes an element): a chunk of them fills an eighth of
    // L2 (128 KiB of a 1 MiB L2, as the constant before it) and stays there while every
    // activation tile passes.
    let chunk = super::tiling::chunk_rows(rb, super::tiling::l2_bytes() / 4).next_multiple_of(NR * NR1);
    let last = rows.end - 1;
    let row = |i: usize| w.as_ptr().add(i.min(last) * rb);
    let put = |i: usize, j: usize, v: f32| {
        let o = out.ptr.add(j * out.ld + i);
        *o = if out.accumulate { *o + v } else { v };
    };
    for c0 in rows.clone().step_by(chunk) {
        let c1 = (c0 + chunk).min(rows.end);
        let mut j0 = 0;
        while n_act - j0 >= NA {
            for i0 in (c0..c1).step_by(NR) {
                // Rows past the end repeat the last one; their results are dropped.
                let res = tile::<T, NR, NA, H>(cols, from_fn(|i| row(i0 + i)), from_fn(|j| act.as_ptr().add((j0 + j) * act_stride)));
                for (i, r) in res.iter().enumerate().take(c1 - i0) {
                    r.iter().enumerate().for_each(|(j, &v)| put(i0 + i, j0 + j, v));
                }
            }
            j0 += NA;
        }
        for j in j0..n_act {
            for i0 in (c0..c1).step_by(NR1) {
                let res = tile::<T, NR1, 1, H1>(cols, from_fn(|i| row(i0 + i)), [act.as_ptr().add(j * act_stride)]);
                for (i, r) in res.iter().enumerate().take(c1 - i0) {
                    put(i0 + i, j, r[0]);
                }
            }
        }
    }
}

macro_rules! dispatch {
    ($name:ident, $features:literal, $($ty:ident => $t:ident ($($shape:literal),*)),*) => {
        /// Run the row-major float kernel for `ty`; false if `ty` has none.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(ty: GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) -> bool {
            match ty {
                $(GgmlType::$ty => gemm::<$t, $($shape),*>(cols, w, rows, act, act_stride, n_act, out),)*
                _ => return false,
            }
            true
        }
    };
}

// Shapes (NR, NA, H, NR1, H1), chosen by measurement: the NR·NA·H accumulators and the
// loaded rows fit the vector registers (AVX2 has 16, AVX-512VL 32); NR1 × 1 tiles serve
// the last activation rows (and single-row products, which are memory-bound).
dispatch!(gemm_vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", F32 => F32(3, 3, 2, 8, 2), F16 => F16(3, 3, 2, 4, 4), BF16 => Bf16(2, 6, 2, 4, 4));
dispatch!(gemm_avx2, "avx2,fma,f16c", F32 => F32(2, 3, 2, 4, 2), F16 => F16(2, 2, 2, 2, 4), BF16 => Bf16(2, 2, 2, 2, 4));
