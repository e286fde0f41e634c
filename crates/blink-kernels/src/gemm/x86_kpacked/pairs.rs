//! `Q4_K` and `Q5_K` tiles: scales and mins per 32-element group, the groups in pairs
//! sharing each 32 bytes of nibbles (low: group `2c`, high: group `2c + 1`).
//!
//! Per group-block (packed offsets, eight times the block's): `d` at 0, `dmin` at 16,
//! the twelve bytes of packed 6-bit scales and mins at 32 (byte `k` of the rows at
//! `32 + 8k`), `Q5_K`'s fifth bits at 128 (lane `v` of every pair at `128 + 32v`: bit `j`
//! of a byte is group `j`'s), the quants after them (pair `c`, lane `v` at
//! `256c + 32v`).

use std::arch::x86_64::*;
use std::array::from_fn;

use super::{half, load, load128, rows_paired, rows_twice, splat, SuperTile, ACT_BSUMS, ACT_BYTES, ACT_QS};
use crate::gemm::x86_kquant::{Ahead, Mac};

pub(super) struct Q4K;
pub(super) struct Q5K;

impl SuperTile for Q4K {
    const GROUP_BLOCK: usize = 8 * 144;

    #[inline(always)]
    unsafe fn tile<M: Mac, const NA: usize>(nb: usize, w: *const u8, a: [*const u8; NA], grouped: u8, ahead: Ahead) -> [__m256; NA] {
        tile_pairs::<M, false, NA>(nb, w, a, grouped, ahead)
    }
}

impl SuperTile for Q5K {
    const GROUP_BLOCK: usize = 8 * 176;

    #[inline(always)]
    unsafe fn tile<M: Mac, const NA: usize>(nb: usize, w: *const u8, a: [*const u8; NA], grouped: u8, ahead: Ahead) -> [__m256; NA] {
        tile_pairs::<M, true, NA>(nb, w, a, grouped, ahead)
    }
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

/// The tile: `Q4_K` (`!FIFTH`) in llama.cpp's two FMA chains (`isum · d·d_a` and
/// `summ · dmin·d_a`, per block, or per pair of groups for a grouped row), `Q5_K`
/// (`FIFTH`) as each block's value `d·d_a·isum − dmin·d_a·summ` summed.
#[inline(always)]
unsafe fn tile_pairs<M: Mac, const FIFTH: bool, const NA: usize>(nb: usize, w0: *const u8, a: [*const u8; NA], grouped: u8, ahead: Ahead) -> [__m256; NA] {
    let (group_block, qs_at) = if FIFTH { (Q5K::GROUP_BLOCK, 384) } else { (Q4K::GROUP_BLOCK, 128) };
    // `maddubs` results a 16-bit lane holds exactly: eight of nibbles (16 · 15 · 128 <
    // 2^15), four of five-bit quants (8 · 31 · 128).
    let chain = if FIFTH { 4 } else { 8 };
    let (nib, six, top) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x3f), _mm256_set1_epi8(0x30));
    let (mut acc, mut acc_min) = ([_mm256_setzero_ps(); NA], [_mm256_setzero_ps(); NA]);
    for b in 0..nb {
        ahead.fetch(b);
        let w = w0.add(b * group_block);
        let ab: [*const u8; NA] = from_fn(|j| a[j].add(b * ACT_BYTES));
        // Byte 8g + r: group g's scale (g < 4 in `sc[0]`, else `sc[1]`) and min of row r.
        let (x0, x1, x2) = (load(w.add(32)), load(w.add(64)), load(w.add(96)));
        let sc = [_mm256_and_si256(x0, six), _mm256_or_si256(_mm256_and_si256(x2, nib), _mm256_and_si256(_mm256_srli_epi16::<2>(x0), top))];
        let mn = [_mm256_and_si256(x1, six), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(x2), nib), _mm256_and_si256(_mm256_srli_epi16::<2>(x1), top))];
        // Per activation row, the sums of its 32-element groups as `i16` pairs: lane c is
        // groups 2c and 2c + 1.
        let mut pair_sums = [[0i32; 4]; NA];
        for j in 0..NA {
            let s = _mm_hadd_epi16(load128(ab[j].add(ACT_BSUMS)), load128(ab[j].add(ACT_BSUMS + 16)));
            _mm_storeu_si128(pair_sums[j].as_mut_ptr() as *mut __m128i, s);
        }
        let d = _mm256_cvtph_ps(load128(w));
        let dmin = _mm256_cvtph_ps(load128(w.add(16)));
        let mut da = [_mm256_setzero_ps(); NA];
        for j in 0..NA {
            da[j] = _mm256_set1_ps((ab[j] as *const f32).read_unaligned());
        }
        let (mut isum, mut summ) = ([_mm256_setzero_si256(); NA], [_mm256_setzero_si256(); NA]);
        for c in 0..4 {
            let (s128, m128) = (half(sc[c / 2], c % 2), half(mn[c / 2], c % 2));
            let (s_lo, s_hi) = (rows_twice::<false>(s128, 0), rows_twice::<false>(s128, 1));
            let mins = rows_paired::<false>(m128);
            let mut pair = [_mm256_setzero_si256(); NA];
            for h in 0..8 / chain {
                let (mut lo16, mut hi16) = ([_mm256_setzero_si256(); NA], [_mm256_setzero_si256(); NA]);
                for v in h * chain..(h + 1) * chain {
                    let raw = load(w.add(qs_at + 256 * c + 32 * v));
                    let mut lo = _mm256_and_si256(raw, nib);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), nib);
                    if FIFTH {
                        let q = load(w.add(128 + 32 * v));
                        lo = _mm256_or_si256(lo, bit_to_4(q, 2 * c));
                        hi = _mm256_or_si256(hi, bit_to_4(q, 2 * c + 1));
                    }
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
                if !FIFTH && grouped & (1 << j) != 0 {
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
            let (dd, dm) = (_mm256_mul_ps(d, da[j]), _mm256_mul_ps(dmin, da[j]));
            if FIFTH {
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
    if !FIFTH {
        // (A loop, not a closure: a closure would not inherit the target features.)
        for j in 0..NA {
            acc[j] = _mm256_sub_ps(acc[j], acc_min[j]);
        }
    }
    acc
}
