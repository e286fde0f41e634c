//! `Q4_K` and `Q5_K` tiles: scales and mins per 32-element group, the groups in pairs
//! sharing each 32 bytes of nibbles (low: group `2c`, high: group `2c + 1`).
//!
//! Per group-block of the packed layout (offsets eight times the block's): `d` at 0,
//! `dmin` at 16, the twelve bytes of packed 6-bit scales and mins at 32 (byte `k` of the
//! rows at `32 + 8k`), `Q5_K`'s fifth bits at 128 (lane `v` of every pair at `128 + 32v`:
//! bit `j` of a byte is group `j`'s), the quants after them (pair `c`, lane `v` at
//! `256c + 32v`). `Q5_K` also has the int8 route's form, [`Bytes`].

use std::arch::x86_64::*;
use std::array::from_fn;
use std::marker::PhantomData;

use super::{half, load, load128, rows_paired, rows_twice, splat, Convert, SuperTile, ACT_BSUMS, ACT_BYTES, ACT_QS};
use crate::gemm::x86_kquant::{Ahead, Mac};

/// A pairs format as the tile sees it.
pub(super) trait Pairs {
    const GROUP_BLOCK: usize;
    /// `maddubs` results a 16-bit lane holds exactly before the scales' `madd`: eight of
    /// nibbles (16 · 15 · 128 < 2^15), four of five-bit quants (8 · 31 · 128).
    const CHAIN: usize;
    /// llama.cpp's two FMA chains (`Q4_K`: `isum · d·d_a` and `summ · dmin·d_a`, per
    /// block, or per pair of groups for a grouped row); else each block's value
    /// `d·d_a·isum − dmin·d_a·summ` summed (`Q5_K`).
    const CHAINED: bool;
    /// What a block's scales are read from.
    type Scales: Copy;

    /// The eight rows' `d` and `dmin`.
    unsafe fn d_dmin(w: *const u8) -> (__m256, __m256);
    unsafe fn scales(w: *const u8) -> Self::Scales;
    /// Pair `c`'s scales as `madd` operands (group `2c`, group `2c + 1`) and its mins
    /// (lane `r`: row `r`'s two, against a broadcast pair of group sums).
    unsafe fn pair_scales(s: &Self::Scales, c: usize) -> (__m256i, __m256i, __m256i);
    /// Lane `v` of pair `c`: groups `2c` and `2c + 1`'s quants as multiplied.
    unsafe fn quants(w: *const u8, c: usize, v: usize) -> (__m256i, __m256i);
}

pub(super) struct Q4K;
pub(super) struct Q5K;

/// Byte `8g + r`: group `g`'s scale (`g < 4` in `[0]`, else `[1]`) and min of row `r`, out
/// of the packed 6-bit scales.
#[derive(Clone, Copy)]
pub(super) struct SixBit {
    sc: [__m256i; 2],
    mn: [__m256i; 2],
}

#[inline(always)]
unsafe fn six_bit(w: *const u8) -> SixBit {
    let (nib, six, top) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x3f), _mm256_set1_epi8(0x30));
    let (x0, x1, x2) = (load(w.add(32)), load(w.add(64)), load(w.add(96)));
    SixBit {
        sc: [_mm256_and_si256(x0, six), _mm256_or_si256(_mm256_and_si256(x2, nib), _mm256_and_si256(_mm256_srli_epi16::<2>(x0), top))],
        mn: [_mm256_and_si256(x1, six), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(x2), nib), _mm256_and_si256(_mm256_srli_epi16::<2>(x1), top))],
    }
}

#[inline(always)]
unsafe fn six_bit_pair(s: &SixBit, c: usize) -> (__m256i, __m256i, __m256i) {
    let (s128, m128) = (half(s.sc[c / 2], c % 2), half(s.mn[c / 2], c % 2));
    (rows_twice::<false>(s128, 0), rows_twice::<false>(s128, 1), rows_paired::<false>(m128))
}

/// Bit `bit` of every byte of `q`, moved to bit 4 (16-bit shifts: nothing from the
/// neighbouring byte reaches bit 4).
#[inline(always)]
unsafe fn bit_to_4(q: __m256i, bit: usize) -> __m256i {
    let moved = match bit {
        0 => _mm256_slli_epi16::<4>(q),
        1 => _mm256_slli_epi16::<3>(q),
        2 => _mm256_slli_epi16::<2>(q),
        3 => _mm256_slli_epi16::<1>(q),
        4 => q,
        5 => _mm256_srli_epi16::<1>(q),
        6 => _mm256_srli_epi16::<2>(q),
        _ => _mm256_srli_epi16::<3>(q),
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(0x10))
}

/// The nibbles of pair `c`'s lane `v`, quants at `qs`.
#[inline(always)]
unsafe fn nibbles(qs: *const u8, c: usize, v: usize) -> (__m256i, __m256i) {
    let nib = _mm256_set1_epi8(0x0f);
    let raw = load(qs.add(256 * c + 32 * v));
    (_mm256_and_si256(raw, nib), _mm256_and_si256(_mm256_srli_epi16::<4>(raw), nib))
}

#[inline(always)]
unsafe fn d_dmin_at(w: *const u8, at: usize) -> (__m256, __m256) {
    (_mm256_cvtph_ps(load128(w.add(at))), _mm256_cvtph_ps(load128(w.add(at + 16))))
}

impl Pairs for Q4K {
    const GROUP_BLOCK: usize = 8 * 144;
    const CHAIN: usize = 8;
    const CHAINED: bool = true;
    type Scales = SixBit;

    #[inline(always)]
    unsafe fn d_dmin(w: *const u8) -> (__m256, __m256) {
        d_dmin_at(w, 0)
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> SixBit {
        six_bit(w)
    }

    #[inline(always)]
    unsafe fn pair_scales(s: &SixBit, c: usize) -> (__m256i, __m256i, __m256i) {
        six_bit_pair(s, c)
    }

    #[inline(always)]
    unsafe fn quants(w: *const u8, c: usize, v: usize) -> (__m256i, __m256i) {
        nibbles(w.add(128), c, v)
    }
}

impl Pairs for Q5K {
    const GROUP_BLOCK: usize = 8 * 176;
    const CHAIN: usize = 4;
    const CHAINED: bool = false;
    type Scales = SixBit;

    #[inline(always)]
    unsafe fn d_dmin(w: *const u8) -> (__m256, __m256) {
        d_dmin_at(w, 0)
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> SixBit {
        six_bit(w)
    }

    #[inline(always)]
    unsafe fn pair_scales(s: &SixBit, c: usize) -> (__m256i, __m256i, __m256i) {
        six_bit_pair(s, c)
    }

    #[inline(always)]
    unsafe fn quants(w: *const u8, c: usize, v: usize) -> (__m256i, __m256i) {
        let (lo, hi) = nibbles(w.add(384), c, v);
        let q = load(w.add(128 + 32 * v));
        (_mm256_or_si256(lo, bit_to_4(q, 2 * c)), _mm256_or_si256(hi, bit_to_4(q, 2 * c + 1)))
    }
}

/// A pairs format `P` as the int8 route converts a group into, once per product: per
/// block, pair `c`'s lane `v` as the bytes the tile multiplies (low groups at
/// `64(8c + v)`, high at `+ 32`), the eight groups' scales as `madd` operands at 2048
/// (`32g`), the four pairs' mins at 2304 (`32c`), `d` and `dmin` at 2432.
pub(super) struct Bytes<P>(PhantomData<P>);

impl<P: Pairs> Pairs for Bytes<P> {
    const GROUP_BLOCK: usize = 2048 + 256 + 128 + 32;
    const CHAIN: usize = P::CHAIN;
    const CHAINED: bool = P::CHAINED;
    type Scales = *const u8;

    #[inline(always)]
    unsafe fn d_dmin(w: *const u8) -> (__m256, __m256) {
        d_dmin_at(w, 2432)
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> *const u8 {
        w
    }

    #[inline(always)]
    unsafe fn pair_scales(w: &*const u8, c: usize) -> (__m256i, __m256i, __m256i) {
        (load(w.add(2048 + 64 * c)), load(w.add(2048 + 64 * c + 32)), load(w.add(2304 + 32 * c)))
    }

    #[inline(always)]
    unsafe fn quants(w: *const u8, c: usize, v: usize) -> (__m256i, __m256i) {
        (load(w.add(64 * (8 * c + v))), load(w.add(64 * (8 * c + v) + 32)))
    }
}

impl<P: Pairs> Convert for Bytes<P> {
    const ROUTE: bool = true;
    const FROM_GROUP_BLOCK: usize = P::GROUP_BLOCK;

    #[inline(always)]
    unsafe fn convert_block(src: *const u8, dst: *mut u8) {
        let s = P::scales(src);
        for c in 0..4 {
            for v in 0..8 {
                let (lo, hi) = P::quants(src, c, v);
                _mm256_storeu_si256(dst.add(64 * (8 * c + v)) as *mut __m256i, lo);
                _mm256_storeu_si256(dst.add(64 * (8 * c + v) + 32) as *mut __m256i, hi);
            }
            let (s_lo, s_hi, mins) = P::pair_scales(&s, c);
            _mm256_storeu_si256(dst.add(2048 + 64 * c) as *mut __m256i, s_lo);
            _mm256_storeu_si256(dst.add(2048 + 64 * c + 32) as *mut __m256i, s_hi);
            _mm256_storeu_si256(dst.add(2304 + 32 * c) as *mut __m256i, mins);
        }
        let (d, dmin) = P::d_dmin(src);
        _mm_storeu_si128(dst.add(2432) as *mut __m128i, _mm256_cvtps_ph::<0>(d));
        _mm_storeu_si128(dst.add(2448) as *mut __m128i, _mm256_cvtps_ph::<0>(dmin));
    }
}

/// `Q4_K` takes no int8 route: its nibbles unpack in three operations per two lanes,
/// about what loading them as bytes would cost.
impl Convert for Q4K {
    const ROUTE: bool = false;
    const FROM_GROUP_BLOCK: usize = <Self as Pairs>::GROUP_BLOCK;

    unsafe fn convert_block(_src: *const u8, _dst: *mut u8) {
        unreachable!("Q4_K has no int8 route")
    }
}

macro_rules! pairs_tile {
    ($t:ty) => {
        impl SuperTile for $t {
            const GROUP_BLOCK: usize = <$t as Pairs>::GROUP_BLOCK;

            #[inline(always)]
            unsafe fn tile<M: Mac, const NA: usize, const TILED: bool>(nb: usize, w: *const u8, a: [*const u8; NA], grouped: u8, ahead: Ahead) -> [__m256; NA] {
                tile_pairs::<$t, M, NA, TILED>(nb, w, a, grouped, ahead)
            }
        }
    };
}

pairs_tile!(Q4K);
pairs_tile!(Q5K);
pairs_tile!(Bytes<Q5K>);

/// The tile: per block and pair of groups, each group's lanes summed in 16 bits over
/// `CHAIN` lanes at a time, then scaled per row by one `madd`; the mins' sums from the
/// activation's group sums; the float steps per output in the scalar order (with `TILED`,
/// [`crate::quant::vec_dot_tiled`]'s).
// `c` picks the weights' pair as well as the activations' sums.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_pairs<P: Pairs, M: Mac, const NA: usize, const TILED: bool>(nb: usize, w0: *const u8, a: [*const u8; NA], grouped: u8, ahead: Ahead) -> [__m256; NA] {
    let (mut acc, mut acc_min) = ([_mm256_setzero_ps(); NA], [_mm256_setzero_ps(); NA]);
    for b in 0..nb {
        ahead.fetch(b);
        let w = w0.add(b * P::GROUP_BLOCK);
        let ab: [*const u8; NA] = from_fn(|j| a[j].add(b * ACT_BYTES));
        let scales = P::scales(w);
        // Per activation row, the sums of its 32-element groups as `i16` pairs: lane c is
        // groups 2c and 2c + 1.
        let mut pair_sums = [[0i32; 4]; NA];
        for j in 0..NA {
            let s = _mm_hadd_epi16(load128(ab[j].add(ACT_BSUMS)), load128(ab[j].add(ACT_BSUMS + 16)));
            _mm_storeu_si128(pair_sums[j].as_mut_ptr() as *mut __m128i, s);
        }
        let (d, dmin) = P::d_dmin(w);
        let mut da = [_mm256_setzero_ps(); NA];
        for j in 0..NA {
            da[j] = _mm256_set1_ps((ab[j] as *const f32).read_unaligned());
        }
        let (mut isum, mut summ) = ([_mm256_setzero_si256(); NA], [_mm256_setzero_si256(); NA]);
        for c in 0..4 {
            let (s_lo, s_hi, mins) = P::pair_scales(&scales, c);
            let mut pair = [_mm256_setzero_si256(); NA];
            if M::DOT4 {
                // Each group's exact sum in 32 bits (four quants a lane), times its scale.
                let (mut lo32, mut hi32) = ([_mm256_setzero_si256(); NA], [_mm256_setzero_si256(); NA]);
                for v in 0..8 {
                    let (lo, hi) = P::quants(w, c, v);
                    for j in 0..NA {
                        let at = ab[j].add(ACT_QS + 64 * c + 4 * v);
                        lo32[j] = M::dot4(lo32[j], lo, splat(at));
                        hi32[j] = M::dot4(hi32[j], hi, splat(at.add(32)));
                    }
                }
                // The scales as `madd` operands hold each row's scale in both halves of
                // its lane.
                let (sl, sh) = (_mm256_srli_epi32::<16>(s_lo), _mm256_srli_epi32::<16>(s_hi));
                for j in 0..NA {
                    pair[j] = _mm256_add_epi32(_mm256_mullo_epi32(lo32[j], sl), _mm256_mullo_epi32(hi32[j], sh));
                }
            }
            for h in 0..if M::DOT4 { 0 } else { 8 / P::CHAIN } {
                let (mut lo16, mut hi16) = ([_mm256_setzero_si256(); NA], [_mm256_setzero_si256(); NA]);
                for v in h * P::CHAIN..(h + 1) * P::CHAIN {
                    let (lo, hi) = P::quants(w, c, v);
                    for j in 0..NA {
                        let at = ab[j].add(ACT_QS + 64 * c + 4 * v);
                        lo16[j] = _mm256_add_epi16(lo16[j], _mm256_maddubs_epi16(lo, splat(at)));
                        hi16[j] = _mm256_add_epi16(hi16[j], _mm256_maddubs_epi16(hi, splat(at.add(32))));
                    }
                }
                for j in 0..NA {
                    pair[j] = M::mac(M::mac(pair[j], lo16[j], s_lo), hi16[j], s_hi);
                }
            }
            for j in 0..NA {
                let m = _mm256_madd_epi16(mins, _mm256_set1_epi32(pair_sums[j][c]));
                if !TILED && P::CHAINED && grouped & (1 << j) != 0 {
                    // Scalar, grouped: fma(isum_c, d·d_a, acc), fma(summ_c, dmin·d_a, acc_min).
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair[j]), _mm256_mul_ps(d, da[j]), acc[j]);
                    acc_min[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, da[j]), acc_min[j]);
                } else {
                    isum[j] = _mm256_add_epi32(isum[j], pair[j]);
                    summ[j] = _mm256_add_epi32(summ[j], m);
                }
            }
        }
        for j in 0..NA {
            if TILED {
                // Scalar: fma(fma(−dmin, summ, isum·d), d_a, acc).
                let r = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(summ[j]), _mm256_mul_ps(_mm256_cvtepi32_ps(isum[j]), d));
                acc[j] = _mm256_fmadd_ps(r, da[j], acc[j]);
                continue;
            }
            let (dd, dm) = (_mm256_mul_ps(d, da[j]), _mm256_mul_ps(dmin, da[j]));
            if !P::CHAINED {
                // Scalar: d·d_a·isum − dmin·d_a·summ, added to the row's sum.
                let v = _mm256_sub_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(isum[j])), _mm256_mul_ps(dm, _mm256_cvtepi32_ps(summ[j])));
                acc[j] = _mm256_add_ps(acc[j], v);
            } else if grouped & (1 << j) == 0 {
                // Scalar: fma(isum, d·d_a, acc), fma(summ, dmin·d_a, acc_min).
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), dd, acc[j]);
                acc_min[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(summ[j]), dm, acc_min[j]);
            }
        }
    }
    if P::CHAINED && !TILED {
        // (A loop, not a closure: a closure would not inherit the target features.)
        for j in 0..NA {
            acc[j] = _mm256_sub_ps(acc[j], acc_min[j]);
        }
    }
    acc
}
