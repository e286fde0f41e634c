//! AVX2 / AVX-512-VNNI kernels for the 32-element formats (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`,
//! `Q8_0`) against their 8-bit activations, over the interleaved layout of [`super::pack`].
//!
//! Each block's 32 products reduce to eight exact `i32` lanes of four (VNNI `dpbusd`, or
//! `maddubs` + `madd` on plain AVX2), which are converted and accumulated with one FMA per
//! block into a per-output 8-lane accumulator: exactly the order of [`DotAcc`], so results
//! are bit-identical to the scalar reference. A tile is one group of eight weight rows ×
//! up to `RA` activation rows; the eight scales (and minima) of a group-block are loaded
//! and converted together.
//!
//! [`DotAcc`]: crate::quant::DotAcc

#![allow(clippy::too_many_arguments)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::pack::{Fields, GROUP};
use super::Out;
use crate::quant::reduce::hsum8;

/// How a format's quants become 32 unsigned bytes, and how its activations look.
pub(super) trait Fam32 {
    const FIELDS: Fields;
    /// Bytes per activation block (`Q8_0`: 34, `Q8_1`: 36); quants start at `ACT_QS`.
    const ACT_BYTES: usize;
    const ACT_QS: usize;
    /// Quants are unpacked as `q + OFFSET` (unsigned); the kernel subtracts `OFFSET · Σa`.
    const OFFSET: i32;
    /// Whether every unpacked quant is below 128 (cheaper products on plain AVX2).
    const SMALL: bool = true;

    /// The 32 quants of one row as unsigned bytes, element `k` in byte `k`.
    unsafe fn unpack(qs: *const u8, qh: *const u8) -> __m256i;
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
    let bits = (qh as *const i32).read_unaligned();
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

macro_rules! fam32 {
    ($t:ident, $ty:ident, $act_bytes:expr, $act_qs:expr, $offset:expr, $small:expr, |$qs:ident, $qh:ident| $unpack:expr) => {
        impl Fam32 for $t {
            const FIELDS: Fields = match Fields::of(blink_gguf::GgmlType::$ty) {
                Some(f) => f,
                None => panic!("not a packable type"),
            };
            const ACT_BYTES: usize = $act_bytes;
            const ACT_QS: usize = $act_qs;
            const OFFSET: i32 = $offset;
            const SMALL: bool = $small;
            #[inline(always)]
            unsafe fn unpack($qs: *const u8, $qh: *const u8) -> __m256i {
                $unpack
            }
        }
    };
}

fam32!(Q4_0, Q4_0, 34, 2, 8, true, |qs, _qh| nibbles(qs));
fam32!(Q4_1, Q4_1, 36, 4, 0, true, |qs, _qh| nibbles(qs));
fam32!(Q5_0, Q5_0, 34, 2, 16, true, |qs, qh| _mm256_or_si256(nibbles(qs), fifth_bits(qh)));
fam32!(Q5_1, Q5_1, 36, 4, 0, true, |qs, qh| _mm256_or_si256(nibbles(qs), fifth_bits(qh)));
// q + 128 as an unsigned byte is q with its sign bit flipped.
fam32!(Q8_0, Q8_0, 34, 2, 128, false, |qs, _qh| _mm256_xor_si256(
    _mm256_loadu_si256(qs as *const __m256i),
    _mm256_set1_epi8(-128)
));

/// Lane sums of unsigned × signed bytes: lane `l` = Σ u[k]·s[k] for k in 4l..4l+4.
pub(super) trait DotU8I8 {
    /// Any unsigned values.
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;
    /// Unsigned values below 128.
    #[inline(always)]
    unsafe fn dot_small(u: __m256i, s: __m256i) -> __m256i {
        Self::dot(u, s)
    }
}

/// VNNI `vpdpbusd`: exact, no saturation.
pub(super) struct Vnni;
/// `vpmaddubsw` + `vpmaddwd`: exact for values below 128; larger ones are split.
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
        // Σ u·s = Σ (u & 127)·s + 128 · Σ (u >> 7)·s, so no i16 pair sum can saturate.
        let low = _mm256_and_si256(u, _mm256_set1_epi8(0x7f));
        let top = _mm256_and_si256(_mm256_srli_epi16(u, 7), _mm256_set1_epi8(1));
        _mm256_add_epi32(Self::dot_small(low, s), _mm256_slli_epi32(Self::dot_small(top, s), 7))
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u16).read_unaligned() as i32)))
}

/// Eight f16 values at `p` as f32.
#[inline(always)]
unsafe fn f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// One tile: rows `r0..r0 + RW` of a packed group × `RA` activation rows. Writes the
/// rows below `live`.
#[inline(always)]
unsafe fn tile<F: Fam32, D: DotU8I8, const RW: usize, const RA: usize>(
    n_blocks: usize,
    w: *const u8,
    r0: usize,
    a: *const u8,
    a_stride: usize,
    out: *mut f32,
    ld: usize,
    accumulate: bool,
    live: usize,
) {
    let fields = F::FIELDS;
    let (m_at, qh_at, qs_at) = fields.packed_offsets();
    let group_block = GROUP * fields.block;
    let has_min = fields.m.is_some();
    let mut acc = [[_mm256_setzero_ps(); RW]; RA];
    let mut tail = [_mm256_setzero_ps(); RA];
    let ones = _mm256_set1_epi8(1);
    for b in 0..n_blocks {
        let gb = w.add(b * group_block);
        let dw = f16x8(gb);
        let mw = if has_min { f16x8(gb.add(m_at)) } else { _mm256_setzero_ps() };
        let wq: [__m256i; RW] = std::array::from_fn(|i| {
            let row = r0 + i;
            F::unpack(gb.add(qs_at + row * fields.qs_len), gb.add(qh_at + 4 * row))
        });
        for j in 0..RA {
            let ab = a.add(j * a_stride + b * F::ACT_BYTES);
            let aq = _mm256_loadu_si256(ab.add(F::ACT_QS) as *const __m256i);
            let scales = _mm256_mul_ps(dw, _mm256_set1_ps(f16_at(ab)));
            if has_min {
                tail[j] = _mm256_add_ps(tail[j], _mm256_mul_ps(mw, _mm256_set1_ps(f16_at(ab.add(2)))));
            }
            let offset = if F::OFFSET != 0 {
                // OFFSET is a power of two: shift Σa per lane.
                _mm256_sllv_epi32(D::dot_small(ones, aq), _mm256_set1_epi32(F::OFFSET.trailing_zeros() as i32))
            } else {
                _mm256_setzero_si256()
            };
            for i in 0..RW {
                let mut lanes = if F::SMALL { D::dot_small(wq[i], aq) } else { D::dot(wq[i], aq) };
                if F::OFFSET != 0 {
                    lanes = _mm256_sub_epi32(lanes, offset);
                }
                let scale = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32((r0 + i) as i32));
                acc[j][i] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lanes), acc[j][i]);
            }
        }
    }
    for j in 0..RA {
        let mut tails = [0f32; GROUP];
        _mm256_storeu_ps(tails.as_mut_ptr(), tail[j]);
        for i in 0..RW.min(live.saturating_sub(r0)) {
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), acc[j][i]);
            let v = hsum8(&l) + tails[r0 + i];
            let o = out.add(j * ld + r0 + i);
            if accumulate {
                *o += v;
            } else {
                *o = v;
            }
        }
    }
}

/// Tile shape: weight rows per pass over a group, activation rows per pass.
pub(super) trait Shape {
    /// Several activation rows: (rows, acts).
    const WIDE: (usize, usize);
}

impl Shape for Vnni {
    // 32 vector registers: 16 accumulators + 4 weight rows + temporaries.
    const WIDE: (usize, usize) = (4, 4);
}

impl Shape for Avx2 {
    // 16 vector registers: 8 accumulators + 4 weight rows + temporaries.
    const WIDE: (usize, usize) = (4, 2);
}

/// `out[r][i] (+)= w_i · a_r` for `i` in `rows` (which must start on a group boundary),
/// `r` in `0..n_act`; `w` is the packed matrix.
#[inline(always)]
unsafe fn gemm<F: Fam32, D: DotU8I8 + Shape>(cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    assert!(rows.start % GROUP == 0, "row ranges of packed matrices start on a group");
    let n_blocks = cols / 32;
    let group_bytes = n_blocks * GROUP * F::FIELDS.block;
    assert!(w.len() >= rows.end.div_ceil(GROUP) * group_bytes, "packed weights shorter than their rows");
    assert!(act.len() >= (n_act - 1) * act_stride + n_blocks * F::ACT_BYTES, "activations too short");
    let (rw, ra) = D::WIDE;
    for g in (rows.start..rows.end).step_by(GROUP) {
        let live = (rows.end - g).min(GROUP);
        let wg = w.as_ptr().add(g / GROUP * group_bytes);
        let ot = |j: usize| out.ptr.add(j * out.ld + g);
        let at = |j: usize| act.as_ptr().add(j * act_stride);
        let mut j = 0;
        // Several activation rows: half-groups × `ra` rows.
        while n_act - j >= ra {
            for r0 in (0..live).step_by(rw) {
                match D::WIDE {
                    (4, 4) => tile::<F, D, 4, 4>(n_blocks, wg, r0, at(j), act_stride, ot(j), out.ld, out.accumulate, live),
                    _ => tile::<F, D, 4, 2>(n_blocks, wg, r0, at(j), act_stride, ot(j), out.ld, out.accumulate, live),
                }
            }
            j += ra;
        }
        // The rest one at a time, a whole group per pass.
        while j < n_act {
            tile::<F, D, GROUP, 1>(n_blocks, wg, 0, at(j), act_stride, ot(j), out.ld, out.accumulate, live);
            j += 1;
        }
    }
}

macro_rules! dispatch {
    ($name:ident, $dot:ty, $features:literal) => {
        /// Run the packed kernel for `ty`; false if `ty` has none.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(ty: blink_gguf::GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) -> bool {
            use blink_gguf::GgmlType as T;
            match ty {
                T::Q4_0 => gemm::<Q4_0, $dot>(cols, w, rows, act, act_stride, n_act, out),
                T::Q4_1 => gemm::<Q4_1, $dot>(cols, w, rows, act, act_stride, n_act, out),
                T::Q5_0 => gemm::<Q5_0, $dot>(cols, w, rows, act, act_stride, n_act, out),
                T::Q5_1 => gemm::<Q5_1, $dot>(cols, w, rows, act, act_stride, n_act, out),
                T::Q8_0 => gemm::<Q8_0, $dot>(cols, w, rows, act, act_stride, n_act, out),
                _ => return false,
            }
            true
        }
    };
}

dispatch!(gemm_vnni, Vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
dispatch!(gemm_avx2, Avx2, "avx2,fma,f16c");
