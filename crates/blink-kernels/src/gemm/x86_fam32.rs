//! AVX2 / AVX-512-VNNI kernels for the 32-element formats (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`,
//! `Q8_0`) against their 8-bit activations.
//!
//! Each block's 32 products reduce to eight exact `i32` lanes of four (VNNI `dpbusd`, or
//! `maddubs` + `madd` on plain AVX2), which are converted and accumulated with one FMA per
//! block into a per-output 8-lane accumulator: exactly the order of [`DotAcc`], so results
//! are bit-identical to the scalar reference. A tile of up to 4 weight rows × 4 activation
//! rows shares every unpacked weight block and every activation load.
//!
//! [`DotAcc`]: crate::quant::DotAcc

#![allow(clippy::too_many_arguments)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::Out;
use crate::quant::reduce::hsum8;

/// One 32-element weight format, as the kernel sees it.
pub(super) trait Fam32 {
    /// Bytes per weight block.
    const BYTES: usize;
    /// Bytes per activation block (`Q8_0`: 34, `Q8_1`: 36); quants start at `ACT_QS`.
    const ACT_BYTES: usize;
    const ACT_QS: usize;
    /// Weights are stored as `q + OFFSET` in unsigned bytes; the kernel subtracts
    /// `OFFSET · Σa` per lane. Zero for the unsigned formats.
    const OFFSET: i32;
    /// Whether the block has a minimum `m` (adds `m · s_a` to the tail).
    const HAS_MIN: bool;
    /// Whether every unsigned quant is below 128 (cheaper products on plain AVX2).
    const SMALL: bool = true;

    /// The 32 quants as unsigned bytes (`q + OFFSET`), element `k` in byte `k`.
    unsafe fn unpack(block: *const u8) -> __m256i;
    /// Scale.
    unsafe fn d(block: *const u8) -> f32;
    /// Minimum (only called when `HAS_MIN`).
    unsafe fn m(block: *const u8) -> f32;
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Low nibbles of 16 bytes into bytes 0..16, high nibbles into bytes 16..32.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    let raw = _mm_loadu_si128(qs as *const __m128i);
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(raw, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    _mm256_set_m128i(hi, lo)
}

/// Bit `k` of the 32-bit word at `qh` as value 16 in byte `k`.
#[inline(always)]
unsafe fn fifth_bits(qh: *const u8) -> __m256i {
    let bits = u32::from_le_bytes([*qh, *qh.add(1), *qh.add(2), *qh.add(3)]) as i32;
    // Byte k takes word byte k/8, then tests bit k%8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits),
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(16))
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Q8_0;

impl Fam32 for Q4_0 {
    const BYTES: usize = 18;
    const ACT_BYTES: usize = 34;
    const ACT_QS: usize = 2;
    const OFFSET: i32 = 8;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        nibbles(b.add(2))
    }
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b)
    }
    #[inline(always)]
    unsafe fn m(_: *const u8) -> f32 {
        0.0
    }
}

impl Fam32 for Q4_1 {
    const BYTES: usize = 20;
    const ACT_BYTES: usize = 36;
    const ACT_QS: usize = 4;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        nibbles(b.add(4))
    }
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b)
    }
    #[inline(always)]
    unsafe fn m(b: *const u8) -> f32 {
        f16_at(b.add(2))
    }
}

impl Fam32 for Q5_0 {
    const BYTES: usize = 22;
    const ACT_BYTES: usize = 34;
    const ACT_QS: usize = 2;
    const OFFSET: i32 = 16;
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        _mm256_or_si256(nibbles(b.add(6)), fifth_bits(b.add(2)))
    }
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b)
    }
    #[inline(always)]
    unsafe fn m(_: *const u8) -> f32 {
        0.0
    }
}

impl Fam32 for Q5_1 {
    const BYTES: usize = 24;
    const ACT_BYTES: usize = 36;
    const ACT_QS: usize = 4;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        _mm256_or_si256(nibbles(b.add(8)), fifth_bits(b.add(4)))
    }
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b)
    }
    #[inline(always)]
    unsafe fn m(b: *const u8) -> f32 {
        f16_at(b.add(2))
    }
}

impl Fam32 for Q8_0 {
    const BYTES: usize = 34;
    const ACT_BYTES: usize = 34;
    const ACT_QS: usize = 2;
    const OFFSET: i32 = 128;
    const HAS_MIN: bool = false;
    const SMALL: bool = false;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        // q + 128 as an unsigned byte is q with its sign bit flipped.
        _mm256_xor_si256(_mm256_loadu_si256(b.add(2) as *const __m256i), _mm256_set1_epi8(-128))
    }
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b)
    }
    #[inline(always)]
    unsafe fn m(_: *const u8) -> f32 {
        0.0
    }
}

/// Lane sums of unsigned × signed bytes: lane `l` = Σ u[k]·s[k] for k in 4l..4l+4.
pub(super) trait DotU8I8 {
    /// Any unsigned values.
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;
    /// Unsigned values below 128.
    unsafe fn dot_small(u: __m256i, s: __m256i) -> __m256i {
        Self::dot(u, s)
    }
}

/// VNNI `vpdpbusd`: exact, no saturation.
pub(super) struct Vnni;
/// `vpmaddubsw` + `vpmaddwd`: exact while each pair of products fits in `i16`, which holds
/// for the 4/5-bit formats; `Q8_0` (unsigned values up to 255) goes through [`Avx2`]'s
/// split in [`dot_q8`].
pub(super) struct Avx2;

impl DotU8I8 for Vnni {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }
}

impl DotU8I8 for Avx2 {
    #[inline(always)]
    unsafe fn dot_small(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        // Split u into its low 7 bits and its top bit so no i16 pair sum can saturate:
        // Σ u·s = Σ (u & 127)·s + 128 · Σ (u >> 7)·s.
        let low = _mm256_and_si256(u, _mm256_set1_epi8(0x7f));
        let top = _mm256_and_si256(_mm256_srli_epi16(u, 7), _mm256_set1_epi8(1));
        let ones = _mm256_set1_epi16(1);
        let a = _mm256_madd_epi16(_mm256_maddubs_epi16(low, s), ones);
        let b = _mm256_madd_epi16(_mm256_maddubs_epi16(top, s), ones);
        _mm256_add_epi32(a, _mm256_slli_epi32(b, 7))
    }
}

/// Sum of a row of 8 `f32` lanes in [`hsum8`] order.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), v);
    hsum8(&l)
}

/// One tile: `RW` weight rows starting at `w` × `RA` activation rows starting at `a`.
#[inline(always)]
unsafe fn tile<F: Fam32, D: DotU8I8, const RW: usize, const RA: usize>(
    n_blocks: usize,
    w: *const u8,
    w_stride: usize,
    a: *const u8,
    a_stride: usize,
    out: *mut f32,
    ld: usize,
    accumulate: bool,
) {
    let mut acc = [[_mm256_setzero_ps(); RA]; RW];
    let mut tail = [[0f32; RA]; RW];
    let ones = _mm256_set1_epi8(1);
    for b in 0..n_blocks {
        let mut wq = [_mm256_setzero_si256(); RW];
        let mut dw = [0f32; RW];
        let mut mw = [0f32; RW];
        for i in 0..RW {
            let blk = w.add(i * w_stride + b * F::BYTES);
            wq[i] = F::unpack(blk);
            dw[i] = F::d(blk);
            if F::HAS_MIN {
                mw[i] = F::m(blk);
            }
        }
        for j in 0..RA {
            let ab = a.add(j * a_stride + b * F::ACT_BYTES);
            let aq = _mm256_loadu_si256(ab.add(F::ACT_QS) as *const __m256i);
            let da = f16_at(ab);
            let offset = if F::OFFSET != 0 {
                // OFFSET is a power of two: shift Σa per lane.
                _mm256_sllv_epi32(D::dot_small(ones, aq), _mm256_set1_epi32(F::OFFSET.trailing_zeros() as i32))
            } else {
                _mm256_setzero_si256()
            };
            for i in 0..RW {
                if F::HAS_MIN {
                    tail[i][j] += mw[i] * f16_at(ab.add(2));
                }
                let mut lanes = if F::SMALL { D::dot_small(wq[i], aq) } else { D::dot(wq[i], aq) };
                if F::OFFSET != 0 {
                    lanes = _mm256_sub_epi32(lanes, offset);
                }
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dw[i] * da), _mm256_cvtepi32_ps(lanes), acc[i][j]);
            }
        }
    }
    for i in 0..RW {
        for j in 0..RA {
            let v = hsum(acc[i][j]) + tail[i][j];
            let o = out.add(j * ld + i);
            if accumulate {
                *o += v;
            } else {
                *o = v;
            }
        }
    }
}

/// `out[r][i] (+)= w_i · a_r` for `i` in `rows`, `r` in `0..n_act`, tiled 4 × 4.
#[inline(always)]
unsafe fn gemm<F: Fam32, D: DotU8I8>(cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    let n_blocks = cols / 32;
    let w_stride = n_blocks * F::BYTES;
    assert!(w.len() >= rows.end * w_stride, "weights shorter than their rows");
    assert!(n_act == 0 || act.len() >= (n_act - 1) * act_stride + n_blocks * F::ACT_BYTES, "activations too short");
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let mut i = rows.start;
    while i < rows.end {
        let rw = (rows.end - i).min(4);
        let mut j = 0;
        while j < n_act {
            let ra = if n_act - j >= 4 { 4 } else { 1 };
            let (wt, at, ot) = (wp.add(i * w_stride), ap.add(j * act_stride), out.ptr.add(j * out.ld + i));
            macro_rules! run {
                ($rw:literal, $ra:literal) => {
                    tile::<F, D, $rw, $ra>(n_blocks, wt, w_stride, at, act_stride, ot, out.ld, out.accumulate)
                };
            }
            match (rw, ra) {
                (4, 4) => run!(4, 4),
                (4, _) => run!(4, 1),
                (_, 4) => run!(1, 4),
                _ => run!(1, 1),
            }
            j += ra;
        }
        i += if rw == 4 { 4 } else { 1 };
    }
}

/// Dispatch for the AVX-512-VNNI path.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemm_vnni(ty: blink_gguf::GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) -> bool {
    use blink_gguf::GgmlType as T;
    match ty {
        T::Q4_0 => gemm::<Q4_0, Vnni>(cols, w, rows, act, act_stride, n_act, out),
        T::Q4_1 => gemm::<Q4_1, Vnni>(cols, w, rows, act, act_stride, n_act, out),
        T::Q5_0 => gemm::<Q5_0, Vnni>(cols, w, rows, act, act_stride, n_act, out),
        T::Q5_1 => gemm::<Q5_1, Vnni>(cols, w, rows, act, act_stride, n_act, out),
        T::Q8_0 => gemm::<Q8_0, Vnni>(cols, w, rows, act, act_stride, n_act, out),
        _ => return false,
    }
    true
}

/// Dispatch for the AVX2 path.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm_avx2(ty: blink_gguf::GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) -> bool {
    use blink_gguf::GgmlType as T;
    match ty {
        T::Q4_0 => gemm::<Q4_0, Avx2>(cols, w, rows, act, act_stride, n_act, out),
        T::Q4_1 => gemm::<Q4_1, Avx2>(cols, w, rows, act, act_stride, n_act, out),
        T::Q5_0 => gemm::<Q5_0, Avx2>(cols, w, rows, act, act_stride, n_act, out),
        T::Q5_1 => gemm::<Q5_1, Avx2>(cols, w, rows, act, act_stride, n_act, out),
        T::Q8_0 => gemm::<Q8_0, Avx2>(cols, w, rows, act, act_stride, n_act, out),
        _ => return false,
    }
    true
}
