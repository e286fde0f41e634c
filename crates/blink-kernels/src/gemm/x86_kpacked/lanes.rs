//! `Q6_K` and `IQ4_XS` tiles, in llama.cpp's eight integer lanes per output: lane `k`
//! sums elements `4k..4k + 4` of every 32 (each times its group's scale), goes into a
//! float lane of its own with one FMA by `d·d_a` per block, and the lanes are summed at
//! the end as `hsum_float_8` does. With the rows in the vectors' lanes, lane `k` of the
//! eight rows is one accumulator, and the final sum is seven vertical adds.
//!
//! Packed offsets (eight times the block's): `Q6_K`: low nibbles at 0 (lane `i` at
//! `32i`: bytes `4i..4i + 4` of the block's `ql`), the two high bits at 1024 (lane `i`:
//! bytes `4i..` of `qh`), the 16 signed scales at 1536 (scale `s` of the rows at
//! `1536 + 8s`), `d` at 1664. `IQ4_XS`: `d` at 0, `scales_h`'s two bytes at 16 and 24,
//! `scales_l`'s four at 32, the index nibbles at 64 (lane `i`: bytes `4i..` of `qs`).
//! Both also have the int8 route's form, [`Bytes`].

use std::arch::x86_64::*;
use std::array::from_fn;
use std::marker::PhantomData;

use super::{half, load, load128, rows_paired, rows_twice, splat, Convert, SuperTile, ACT_BSUMS, ACT_BYTES, ACT_QS};
use crate::gemm::x86_kquant::{Ahead, Mac};
use crate::quant::KVALUES_IQ4NL;

/// A format of eight lanes as the tile sees it.
pub(super) trait Lanes {
    const GROUP_BLOCK: usize;
    /// Offset of the eight rows' `d`.
    const D: usize;
    /// Quants are signed values, multiplied as `|v| · sign(a, v)` (llama.cpp's sign trick).
    const SIGNED: bool;
    /// Scales per block (one per 16 or 32 elements).
    const SCALES: usize;
    /// Quants are unpacked as `q + 32`, taken back lane by lane (see [`lane_start`]).
    const OFFSET: bool;
    /// Signed quants multiplied exactly, not with the sign trick (llama.cpp's AVX-512
    /// tiled products; only with `vpdpbusd`).
    const EXACT: bool = false;

    /// The block's scales as `madd` operands (scale `s` of row `r` in lane `r`).
    unsafe fn scales(w: *const u8) -> [__m256i; 16];
    /// Which scale multiplies lane `k` of the 32 elements `32p..`.
    fn scale_of(p: usize, k: usize) -> usize;
    /// Lane `k` of the 32 elements `32p..` of the eight rows, as multiplied.
    unsafe fn quants(w: *const u8, p: usize, k: usize) -> __m256i;
    /// With an offset: scales `2k` and `2k + 1` of the rows paired (lane `r`: row `r`'s
    /// two), against the activation's sums of groups `2k` and `2k + 1`.
    unsafe fn offset_scales(w: *const u8, k: usize) -> __m256i;
}

/// Lane `k`'s starting sum for the activation block at `a`, given `offset_scales(w, k)`:
/// with an offset, `−32 · (bsums[2k]·sc[2k] + bsums[2k + 1]·sc[2k + 1])` (llama.cpp takes
/// the offset back lane by lane with these groups' sums, not the lane's own elements'),
/// else zero.
#[inline(always)]
unsafe fn lane_start<L: Lanes>(offset_scales: __m256i, a: *const u8, k: usize) -> __m256i {
    if !L::OFFSET {
        return _mm256_setzero_si256();
    }
    let off = _mm256_madd_epi16(offset_scales, splat(a.add(ACT_BSUMS + 4 * k)));
    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(off))
}

pub(super) struct Q6K;
pub(super) struct IQ4XS;
/// `L` with its signed quants multiplied exactly ([`Lanes::EXACT`]).
pub(super) struct Exact<L>(PhantomData<L>);

impl<L: Lanes> Lanes for Exact<L> {
    const GROUP_BLOCK: usize = L::GROUP_BLOCK;
    const D: usize = L::D;
    const SIGNED: bool = L::SIGNED;
    const SCALES: usize = L::SCALES;
    const OFFSET: bool = L::OFFSET;
    const EXACT: bool = true;

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> [__m256i; 16] {
        L::scales(w)
    }

    #[inline(always)]
    fn scale_of(p: usize, k: usize) -> usize {
        L::scale_of(p, k)
    }

    #[inline(always)]
    unsafe fn quants(w: *const u8, p: usize, k: usize) -> __m256i {
        L::quants(w, p, k)
    }

    #[inline(always)]
    unsafe fn offset_scales(w: *const u8, k: usize) -> __m256i {
        L::offset_scales(w, k)
    }
}

impl Lanes for Q6K {
    const GROUP_BLOCK: usize = 8 * 210;
    const D: usize = 1664;
    const SIGNED: bool = false;
    const SCALES: usize = 16;
    const OFFSET: bool = true;

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> [__m256i; 16] {
        let mut s = [_mm256_setzero_si256(); 16];
        for (i, s) in s.iter_mut().enumerate() {
            *s = rows_twice::<true>(load128(w.add(1536 + 16 * (i / 2))), i % 2);
        }
        s
    }

    #[inline(always)]
    fn scale_of(p: usize, k: usize) -> usize {
        2 * p + k / 4
    }

    /// Quant + 32 (0..64): half `n = p / 4` of the block; piece `p % 4` of it takes the
    /// low (pieces 0, 1) or high nibbles of `ql` lane `16n + 8(p % 2) + k`, and bits
    /// `2(p % 4)..` of `qh` lane `8n + k` on top.
    #[inline(always)]
    unsafe fn quants(w: *const u8, p: usize, k: usize) -> __m256i {
        let (n, piece) = (p / 4, p % 4);
        let nib = _mm256_set1_epi8(0x0f);
        let ql = load(w.add(32 * (16 * n + 8 * (piece % 2) + k)));
        let low = if piece < 2 { _mm256_and_si256(ql, nib) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(ql), nib) };
        let qh = load(w.add(1024 + 32 * (8 * n + k)));
        let moved = match piece {
            0 => _mm256_slli_epi16::<4>(qh),
            1 => _mm256_slli_epi16::<2>(qh),
            2 => qh,
            _ => _mm256_srli_epi16::<2>(qh),
        };
        _mm256_or_si256(low, _mm256_and_si256(moved, _mm256_set1_epi8(0x30)))
    }

    #[inline(always)]
    unsafe fn offset_scales(w: *const u8, k: usize) -> __m256i {
        rows_paired::<true>(load128(w.add(1536 + 16 * k)))
    }
}

impl Lanes for IQ4XS {
    const GROUP_BLOCK: usize = 8 * 136;
    const D: usize = 0;
    const SIGNED: bool = true;
    const SCALES: usize = 8;
    const OFFSET: bool = false;

    /// Group `g`'s scale: `scales_l`'s nibble `g % 2` of byte `g / 2`, with bits `2g..` of
    /// `scales_h` on top, less 32.
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> [__m256i; 16] {
        let nib = _mm256_set1_epi8(0x0f);
        let low = load(w.add(32));
        // scales_h's low byte twice, then its high byte twice (per 64-bit quarter).
        let high = _mm256_permute4x64_epi64::<0b01_01_00_00>(_mm256_castsi128_si256(load128(w.add(16))));
        let two = _mm256_set1_epi8(3);
        let even_hi = _mm256_and_si256(_mm256_srlv_epi64(high, _mm256_setr_epi64x(0, 4, 0, 4)), two);
        let odd_hi = _mm256_and_si256(_mm256_srlv_epi64(high, _mm256_setr_epi64x(2, 6, 2, 6)), two);
        let bias = _mm256_set1_epi8(32);
        // Byte 8t + r: group 2t's scale (`even`) and group 2t + 1's (`odd`) of row r.
        let even = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(low, nib), _mm256_slli_epi16::<4>(even_hi)), bias);
        let odd = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(low), nib), _mm256_slli_epi16::<4>(odd_hi)), bias);
        let mut s = [_mm256_setzero_si256(); 16];
        for t in 0..4 {
            s[2 * t] = rows_twice::<true>(half(even, t / 2), t % 2);
            s[2 * t + 1] = rows_twice::<true>(half(odd, t / 2), t % 2);
        }
        s
    }

    #[inline(always)]
    fn scale_of(p: usize, _k: usize) -> usize {
        p
    }

    /// The table's values of group `p`'s elements `4k..4k + 4`: lane `4p + k % 4`'s low
    /// (`k < 4`) or high nibbles.
    #[inline(always)]
    unsafe fn quants(w: *const u8, p: usize, k: usize) -> __m256i {
        let raw = load(w.add(64 + 32 * (4 * p + k % 4)));
        let nib = _mm256_set1_epi8(0x0f);
        let idx = if k < 4 { _mm256_and_si256(raw, nib) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(raw), nib) };
        let table = _mm256_broadcastsi128_si256(load128(KVALUES_IQ4NL.as_ptr() as *const u8));
        _mm256_shuffle_epi8(table, idx)
    }

    #[inline(always)]
    unsafe fn offset_scales(_w: *const u8, _k: usize) -> __m256i {
        _mm256_setzero_si256()
    }
}

/// A lanes format `L` as the int8 route converts a group into, once per product: per
/// block, lane `k` of the 32 elements `32p..` as the bytes the tile multiplies (at
/// `32(8p + k)`), the scales as `madd` operands at 2048 (`32s`), the offset's paired
/// scales after them (`32k`), `d` last.
pub(super) struct Bytes<L>(PhantomData<L>);

impl<L: Lanes> Bytes<L> {
    const SCALES_AT: usize = 2048;
    const OFFSETS_AT: usize = Self::SCALES_AT + 32 * L::SCALES;
    const D_AT: usize = Self::OFFSETS_AT + if L::OFFSET { 256 } else { 0 };
}

impl<L: Lanes> Lanes for Bytes<L> {
    const GROUP_BLOCK: usize = Self::D_AT + 16;
    const D: usize = Self::D_AT;
    const SIGNED: bool = L::SIGNED;
    const SCALES: usize = L::SCALES;
    const OFFSET: bool = L::OFFSET;
    const EXACT: bool = L::EXACT;

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> [__m256i; 16] {
        let mut s = [_mm256_setzero_si256(); 16];
        for (i, s) in s.iter_mut().enumerate().take(L::SCALES) {
            *s = load(w.add(Self::SCALES_AT + 32 * i));
        }
        s
    }

    #[inline(always)]
    fn scale_of(p: usize, k: usize) -> usize {
        L::scale_of(p, k)
    }

    #[inline(always)]
    unsafe fn quants(w: *const u8, p: usize, k: usize) -> __m256i {
        load(w.add(32 * (8 * p + k)))
    }

    #[inline(always)]
    unsafe fn offset_scales(w: *const u8, k: usize) -> __m256i {
        load(w.add(Self::OFFSETS_AT + 32 * k))
    }
}

impl<L: Lanes> Convert for Bytes<L> {
    const ROUTE: bool = true;
    const FROM_GROUP_BLOCK: usize = L::GROUP_BLOCK;

    #[inline(always)]
    unsafe fn convert_block(src: *const u8, dst: *mut u8) {
        for p in 0..8 {
            for k in 0..8 {
                _mm256_storeu_si256(dst.add(32 * (8 * p + k)) as *mut __m256i, L::quants(src, p, k));
            }
        }
        let s = L::scales(src);
        for (i, s) in s.iter().enumerate().take(L::SCALES) {
            _mm256_storeu_si256(dst.add(Self::SCALES_AT + 32 * i) as *mut __m256i, *s);
        }
        if L::OFFSET {
            for k in 0..8 {
                _mm256_storeu_si256(dst.add(Self::OFFSETS_AT + 32 * k) as *mut __m256i, L::offset_scales(src, k));
            }
        }
        _mm_storeu_si128(dst.add(Self::D_AT) as *mut __m128i, load128(src.add(L::D)));
    }
}

macro_rules! lanes_tile {
    ($t:ty) => {
        impl SuperTile for $t {
            const GROUP_BLOCK: usize = <$t as Lanes>::GROUP_BLOCK;

            #[inline(always)]
            unsafe fn tile<M: Mac, const NA: usize, const TILED: bool>(nb: usize, w: *const u8, a: [*const u8; NA], _grouped: u8, ahead: Ahead) -> [__m256; NA] {
                tile_lanes::<$t, M, NA, TILED>(nb, w, a, ahead)
            }
        }
    };
}

lanes_tile!(Q6K);
lanes_tile!(IQ4XS);
lanes_tile!(Bytes<Q6K>);
lanes_tile!(Bytes<IQ4XS>);
lanes_tile!(Exact<IQ4XS>);
lanes_tile!(Bytes<Exact<IQ4XS>>);

/// A tiled block's exact sum `s1` per activation row, with `vpdpbusd`: per run of four
/// bytes sharing a scale, the rows' sums in 32 bits, times the scale.
#[inline(always)]
unsafe fn tiled_sums<L: Lanes, M: Mac, const NA: usize>(w: *const u8, ab: [*const u8; NA], scales: &[__m256i; 16]) -> [__m256i; NA] {
    let mut s = [_mm256_setzero_si256(); NA];
    if L::OFFSET {
        for k in 0..8 {
            let offsets = L::offset_scales(w, k);
            for j in 0..NA {
                s[j] = _mm256_add_epi32(s[j], lane_start::<L>(offsets, ab[j], k));
            }
        }
    }
    // Lanes sharing a scale: Q6_K's four per 16 elements, IQ4_XS's eight per 32.
    let per = 8 * L::SCALES.min(8) / L::SCALES;
    let bias = _mm256_set1_epi8(-128);
    for p in 0..8 {
        for k0 in (0..8).step_by(per) {
            let mut t = [_mm256_setzero_si256(); NA];
            for k in k0..k0 + per {
                let q = L::quants(w, p, k);
                // Exact: q + 128 as unsigned bytes, the 128·Σa taken back below; else the
                // sign trick, |q| against a·sign(q).
                let u = if !L::SIGNED { q } else if L::EXACT { _mm256_xor_si256(q, bias) } else { _mm256_abs_epi8(q) };
                for j in 0..NA {
                    let x = splat(ab[j].add(ACT_QS + 32 * p + 4 * k));
                    let x = if L::SIGNED && !L::EXACT { _mm256_sign_epi8(x, q) } else { x };
                    t[j] = M::dot4(t[j], u, x);
                }
            }
            if L::SIGNED && L::EXACT {
                for j in 0..NA {
                    let sums = ab[j].add(ACT_BSUMS + 4 * p) as *const i16;
                    let group = sums.read_unaligned() as i32 + sums.add(1).read_unaligned() as i32;
                    t[j] = _mm256_sub_epi32(t[j], _mm256_set1_epi32(128 * group));
                }
            }
            let sc = _mm256_srai_epi32::<16>(scales[L::scale_of(p, k0)]);
            for j in 0..NA {
                s[j] = _mm256_add_epi32(s[j], _mm256_mullo_epi32(t[j], sc));
            }
        }
    }
    s
}

/// The tile: per block, lane `k` of every activation row over the block's eight 32-element
/// pieces, then one FMA by `d·d_a` into float lane `k`. With `TILED`, the lanes' sums are
/// added up per block and take [`crate::quant::vec_dot_tiled`]'s steps in one float lane.
#[inline(always)]
unsafe fn tile_lanes<L: Lanes, M: Mac, const NA: usize, const TILED: bool>(nb: usize, w0: *const u8, a: [*const u8; NA], ahead: Ahead) -> [__m256; NA] {
    let mut lanes = [[_mm256_setzero_ps(); NA]; 8];
    let mut da = [_mm256_setzero_ps(); NA];
    for b in 0..nb {
        ahead.fetch(b);
        let w = w0.add(b * L::GROUP_BLOCK);
        let ab: [*const u8; NA] = from_fn(|j| a[j].add(b * ACT_BYTES));
        let scales = L::scales(w);
        let d = _mm256_cvtph_ps(load128(w.add(L::D)));
        // Scalar: d_a · d.
        let mut dd = [_mm256_setzero_ps(); NA];
        for j in 0..NA {
            da[j] = _mm256_set1_ps((ab[j] as *const f32).read_unaligned());
            dd[j] = _mm256_mul_ps(da[j], d);
        }
        if TILED && M::DOT4 {
            let s1 = tiled_sums::<L, M, NA>(w, ab, &scales);
            for j in 0..NA {
                // Scalar: fma(s1·d, d_a, acc).
                lanes[0][j] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s1[j]), d), da[j], lanes[0][j]);
            }
            continue;
        }
        let mut block = [_mm256_setzero_si256(); NA];
        for (k, lane) in lanes.iter_mut().enumerate() {
            let offsets = if L::OFFSET { L::offset_scales(w, k) } else { _mm256_setzero_si256() };
            let mut sum = [_mm256_setzero_si256(); NA];
            for j in 0..NA {
                sum[j] = lane_start::<L>(offsets, ab[j], k);
            }
            for p in 0..8 {
                let q = L::quants(w, p, k);
                let s = scales[L::scale_of(p, k)];
                let mag = if L::SIGNED { _mm256_abs_epi8(q) } else { q };
                for j in 0..NA {
                    let x = splat(ab[j].add(ACT_QS + 32 * p + 4 * k));
                    let x = if L::SIGNED { _mm256_sign_epi8(x, q) } else { x };
                    sum[j] = M::mac(sum[j], _mm256_maddubs_epi16(mag, x), s);
                }
            }
            for j in 0..NA {
                if TILED {
                    block[j] = _mm256_add_epi32(block[j], sum[j]);
                } else {
                    // Scalar: fma(d_a·d, lane, acc).
                    lane[j] = _mm256_fmadd_ps(dd[j], _mm256_cvtepi32_ps(sum[j]), lane[j]);
                }
            }
        }
        if TILED {
            for j in 0..NA {
                // Scalar: fma(s1·d, d_a, acc).
                lanes[0][j] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(block[j]), d), da[j], lanes[0][j]);
            }
        }
    }
    if TILED {
        return lanes[0];
    }
    // hsum8 per row: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). (Loops, not
    // closures, around intrinsics: a closure would not inherit the target features.)
    let mut out = [_mm256_setzero_ps(); NA];
    for (j, o) in out.iter_mut().enumerate() {
        let l = [lanes[0][j], lanes[1][j], lanes[2][j], lanes[3][j], lanes[4][j], lanes[5][j], lanes[6][j], lanes[7][j]];
        *o = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])), _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])));
    }
    out
}
