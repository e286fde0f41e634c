//! AVX2 / AVX-VNNI / AVX-512-VNNI kernels for the k-quants (`Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K`),
//! `IQ4_XS`, the ternary `TQ1_0`, `TQ2_0` and the lattice formats (`IQ2_XXS`, `IQ2_XS`,
//! `IQ2_S`, `IQ3_XXS`, `IQ3_S`) against `Q8_K` activations, over row-major weights.
//!
//! The scalar reference computes, per 256-element super-block, exact integer sums (`isum`
//! of scale × group dot, and for the formats with mins `summ` from the activation's
//! `bsums`), turns them into one `f32` block value with a few multiplications, and adds
//! that to a running sum; `Q4_K` and `Q6_K` follow llama.cpp's x86 kernels instead (two
//! FMA chains, per super-block or per 64 elements for a row of a group of four; eight float
//! lanes per output, summed at the end). Here the integer sums come from `maddubs`
//! (unsigned weight × signed activation bytes, exact for quants below 64) followed by
//! `madd` (AVX2) or `dpwssd` (AVX-512 VNNI or AVX-VNNI) with the group scales. A tile (one
//! weight row × up to eight activation rows, or eight weight rows × one activation row)
//! keeps one eight-lane `i32` vector per
//! output; after each block the tile's outputs are reduced into the lanes of one vector (an
//! `hadd` tree), and the block's float operations run on those lanes in exactly the scalar
//! order. Every output therefore gets the scalar bits, whatever the tile shape or batch.
//!
//! Signed quants (`Q3_K`, `Q6_K`) are unpacked with an offset (`q + 4`, `q + 32`) that is
//! taken back through `bsums`, so activation blocks must carry `bsums` equal to the sums of
//! their quants, as `quantize_row` writes them.

#![allow(clippy::too_many_arguments)]

use std::arch::x86_64::*;
use std::array::from_fn;
use std::ops::Range;

use blink_gguf::GgmlType;

use crate::quant::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS};

mod lattice;
mod ternary;

use lattice::gemm_lattice;
use ternary::{TQ1, TQ2};

use super::tiling;
use super::{Out, RowForm};

/// A `Q8_K` block: `d` (f32), 256 quants, 16 `i16` sums of 16 quants each.
const ACT_BYTES: usize = 292;
const ACT_QS: usize = 4;
const ACT_BSUMS: usize = 260;

/// `acc + Σ p·s` over pairs of `i16` lanes, into `i32` lanes (exact for our magnitudes);
/// with VNNI also `acc + Σ u·s` over fours of unsigned by signed bytes.
pub(super) trait Mac {
    unsafe fn mac(acc: __m256i, p: __m256i, s: __m256i) -> __m256i;
    /// Whether [`Mac::dot4`] exists (`vpdpbusd`).
    const DOT4: bool = false;
    /// `acc + Σ u·s` over each `i32` lane's four bytes, `u` unsigned and `s` signed.
    #[inline(always)]
    unsafe fn dot4(_acc: __m256i, _u: __m256i, _s: __m256i) -> __m256i {
        unreachable!("no vpdpbusd on this path")
    }
}

/// `vpmaddwd` + `vpaddd`.
pub(super) struct Avx2;
/// VNNI `vpdpwssd`.
pub(super) struct Vnni;
/// AVX-VNNI's `vpdpwssd` (VEX-encoded).
pub(super) struct AvxVnni;

impl Mac for Avx2 {
    #[inline(always)]
    unsafe fn mac(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, s))
    }
}

impl Mac for AvxVnni {
    #[inline(always)]
    unsafe fn mac(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
        _mm256_dpwssd_avx_epi32(acc, p, s)
    }

    const DOT4: bool = true;

    #[inline(always)]
    unsafe fn dot4(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }
}

impl Mac for Vnni {
    #[inline(always)]
    unsafe fn mac(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, p, s)
    }

    const DOT4: bool = true;

    #[inline(always)]
    unsafe fn dot4(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

/// A k-quant as the kernel sees it.
trait KQuant {
    /// Bytes per block.
    const BYTES: usize;
    /// Offset of the f16 super-block scale `d`.
    const D: usize;
    /// Offset of the f16 `dmin`, for the formats whose value is `d·d_a·isum - dmin·d_a·summ`.
    const DMIN: Option<usize>;
    /// Whether the block values are not summed but chained into two FMAs (`Q4_K`, see
    /// `quant::kquants::vec_dot_q4_k`).
    const CHAINED: bool = false;
    /// Whether each output keeps its eight `isum` lanes apart in eight float lanes to the
    /// end (`Q6_K`, see `quant::kquants::vec_dot_q6_k`).
    const LANES: bool = false;
    /// A `LANES` format's final factor (see `quant::rows::EightLanes`).
    const FINAL: f32 = 1.0;

    /// For one weight block against `NA` activation blocks: per activation row, eight
    /// `i32` lanes summing to `isum`, and eight summing to `summ` (zero without mins).
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]);
    /// For a chained format: `ints`, with `isum` split over the block's four 64-element
    /// pieces (lanes `2c`, `2c + 1` of the `summ` vectors cover piece `c`).
    unsafe fn int_pieces<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([[__m256i; NA]; 4], [__m256i; NA]) {
        let (isum, summ) = Self::ints::<M, NA>(w, a);
        ([isum, [_mm256_setzero_si256(); NA], [_mm256_setzero_si256(); NA], [_mm256_setzero_si256(); NA]], summ)
    }
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned()
}

/// The `i16` word `lo` of `v`'s lower half in every lane of the lower half, and word `hi`
/// of its upper half in the upper half.
#[inline(always)]
unsafe fn words(v: __m256i, lo: i16, hi: i16) -> __m256i {
    let (lo, hi) = ((2 * lo) | ((2 * lo + 1) << 8), (2 * hi) | ((2 * hi + 1) << 8));
    _mm256_shuffle_epi8(v, _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi)))
}

/// `acc[j] += maddubs(u, a_j's 32 quants at off) · s` for every activation row.
#[inline(always)]
unsafe fn rows_mac<M: Mac, const NA: usize>(acc: &mut [__m256i; NA], u: __m256i, s: __m256i, a: &[*const u8; NA], off: usize) {
    for j in 0..NA {
        acc[j] = M::mac(acc[j], _mm256_maddubs_epi16(u, load(a[j].add(ACT_QS + off))), s);
    }
}

/// `Σ bsums·s` pairs for every activation row (lane `g` covers groups `2g`, `2g + 1`).
#[inline(always)]
unsafe fn bsums_dot<const NA: usize>(a: &[*const u8; NA], s: __m256i) -> [__m256i; NA] {
    let mut r = [_mm256_setzero_si256(); NA];
    for j in 0..NA {
        r[j] = _mm256_madd_epi16(load(a[j].add(ACT_BSUMS)), s);
    }
    r
}

/// Sixteen `i16` scales in group order as two half-broadcasts: groups 0..8 and 8..16,
/// each repeated in both 128-bit halves.
#[inline(always)]
unsafe fn halves(s16: __m256i) -> [__m256i; 2] {
    [_mm256_permute2x128_si256::<0x00>(s16, s16), _mm256_permute2x128_si256::<0x11>(s16, s16)]
}

/// `acc[j] -= (Σ bsums·s) << SHIFT`: takes back an unpacking offset of `2^SHIFT`.
#[inline(always)]
unsafe fn remove_offset<const SHIFT: i32, const NA: usize>(acc: &mut [__m256i; NA], a: &[*const u8; NA], s16: __m256i) {
    let off = bsums_dot(a, s16);
    for j in 0..NA {
        acc[j] = _mm256_sub_epi32(acc[j], _mm256_slli_epi32::<SHIFT>(off[j]));
    }
}

struct Q2K;
struct Q3K;
struct Q4K;
struct Q5K;
struct Q6K;

impl KQuant for Q2K {
    const BYTES: usize = 84;
    const D: usize = 80;
    const DMIN: Option<usize> = Some(82);

    #[inline(always)]
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
        // scales[16]: scale in the low nibble, min in the high one; qs[64] at 16.
        let packed = _mm_loadu_si128(w as *const __m128i);
        let nib = _mm_set1_epi8(0x0f);
        let scales = halves(_mm256_cvtepu8_epi16(_mm_and_si128(packed, nib)));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), nib));
        let mut acc = [_mm256_setzero_si256(); NA];
        for (half, s) in scales.iter().enumerate() {
            // Piece k of this half: elements 128·half + 32k.., bits 2k of the 32 bytes.
            let mut q = load(w.add(16 + 32 * half));
            for k in 0..4 {
                let u = _mm256_and_si256(q, _mm256_set1_epi8(3));
                q = _mm256_srli_epi16::<2>(q);
                rows_mac::<M, NA>(&mut acc, u, words(*s, 2 * k as i16, 2 * k as i16 + 1), a, 128 * half + 32 * k);
            }
        }
        (acc, bsums_dot(a, mins))
    }
}

impl KQuant for Q3K {
    const BYTES: usize = 110;
    const D: usize = 108;
    const DMIN: Option<usize> = None;

    #[inline(always)]
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
        // hmask[32], qs[64] at 32, 12 bytes of 6-bit scales at 96.
        let (b0, b1, b2) = (u32_at(w.add(96)), u32_at(w.add(100)), u32_at(w.add(104)));
        let (lo, hi) = (0x0f0f_0f0f, 0x0303_0303);
        let packed = _mm_setr_epi32(
            ((b0 & lo) | ((b2 & hi) << 4)) as i32,
            ((b1 & lo) | (((b2 >> 2) & hi) << 4)) as i32,
            (((b0 >> 4) & lo) | (((b2 >> 4) & hi) << 4)) as i32,
            (((b1 >> 4) & lo) | (((b2 >> 6) & hi) << 4)) as i32,
        );
        let s16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(packed, _mm_set1_epi8(32)));
        let scales = halves(s16);
        let mut hm = load(w);
        let mut acc = [_mm256_setzero_si256(); NA];
        for (half, s) in scales.iter().enumerate() {
            let mut q = load(w.add(32 + 32 * half));
            for k in 0..4 {
                // Quant + 4 = low two bits | high-mask bit (piece 4·half + k) as 4.
                let u = _mm256_or_si256(
                    _mm256_and_si256(q, _mm256_set1_epi8(3)),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(hm), _mm256_set1_epi8(4)),
                );
                q = _mm256_srli_epi16::<2>(q);
                hm = _mm256_srli_epi16::<1>(hm);
                rows_mac::<M, NA>(&mut acc, u, words(*s, 2 * k as i16, 2 * k as i16 + 1), a, 128 * half + 32 * k);
            }
        }
        remove_offset::<2, NA>(&mut acc, a, s16);
        (acc, [_mm256_setzero_si256(); NA])
    }
}

/// The eight 6-bit scales and eight 6-bit mins of `Q4_K`/`Q5_K` (12 bytes at `p`), as
/// the bytes of two `u64`s.
#[inline(always)]
unsafe fn scales_mins_k4(p: *const u8) -> (u64, u64) {
    let (b0, b1, b2) = (u32_at(p), u32_at(p.add(4)), u32_at(p.add(8)));
    let (low6, low4, top2) = (0x3f3f_3f3f, 0x0f0f_0f0f, 0x3030_3030);
    let sc_hi = (b2 & low4) | ((b0 >> 2) & top2);
    let mn_hi = ((b2 >> 4) & low4) | ((b1 >> 2) & top2);
    ((b0 & low6) as u64 | (sc_hi as u64) << 32, (b1 & low6) as u64 | (mn_hi as u64) << 32)
}

/// `Q4_K`/`Q5_K` (`QH` = offset of the fifth bits): 32-element groups, nibbles of 64
/// elements per 32 bytes.
#[inline(always)]
unsafe fn ints_k4<M: Mac, const NA: usize, const QH: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
    let ([acc, ..], summ) = k4_sums::<M, NA, QH, false>(w, a);
    (acc, summ)
}

/// [`ints_k4`] with `isum` split over the four 64-element pieces.
#[inline(always)]
unsafe fn ints_k4_pieces<M: Mac, const NA: usize, const QH: usize>(w: *const u8, a: &[*const u8; NA]) -> ([[__m256i; NA]; 4], [__m256i; NA]) {
    k4_sums::<M, NA, QH, true>(w, a)
}

/// The integer sums of [`ints_k4`], piece `c` into `acc[c]` when `SPLIT`, else all into
/// `acc[0]`.
#[inline(always)]
unsafe fn k4_sums<M: Mac, const NA: usize, const QH: usize, const SPLIT: bool>(w: *const u8, a: &[*const u8; NA]) -> ([[__m256i; NA]; 4], [__m256i; NA]) {
    let (sc, mn) = scales_mins_k4(w.add(4));
    let scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
    let mn = _mm_cvtsi64_si128(mn as i64);
    let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
    let qs = w.add(if QH == 0 { 16 } else { QH + 32 });
    let nib = _mm256_set1_epi8(0x0f);
    let mut hb = if QH == 0 { _mm256_setzero_si256() } else { load(w.add(QH)) };
    let mut acc = [[_mm256_setzero_si256(); NA]; 4];
    for c in 0..4 {
        let raw = load(qs.add(32 * c));
        let mut lo = _mm256_and_si256(raw, nib);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), nib);
        if QH != 0 {
            // Fifth bits of groups 2c and 2c + 1 are bits 0 and 1 of the shifted qh.
            let five = _mm256_set1_epi8(0x10);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(hb), five));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(hb), five));
            hb = _mm256_srli_epi16::<2>(hb);
        }
        let g = 2 * c as i16;
        let into = &mut acc[if SPLIT { c } else { 0 }];
        rows_mac::<M, NA>(into, lo, words(scales, g, g), a, 64 * c);
        rows_mac::<M, NA>(into, hi, words(scales, g + 1, g + 1), a, 64 * c + 32);
    }
    (acc, bsums_dot(a, mins))
}

impl KQuant for Q4K {
    const BYTES: usize = 144;
    const D: usize = 0;
    const DMIN: Option<usize> = Some(2);
    const CHAINED: bool = true;

    #[inline(always)]
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
        ints_k4::<M, NA, 0>(w, a)
    }

    #[inline(always)]
    unsafe fn int_pieces<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([[__m256i; NA]; 4], [__m256i; NA]) {
        ints_k4_pieces::<M, NA, 0>(w, a)
    }
}

impl KQuant for Q5K {
    const BYTES: usize = 176;
    const D: usize = 0;
    const DMIN: Option<usize> = Some(2);

    #[inline(always)]
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
        ints_k4::<M, NA, 16>(w, a)
    }
}

impl KQuant for Q6K {
    const BYTES: usize = 210;
    const D: usize = 208;
    const DMIN: Option<usize> = None;
    const LANES: bool = true;

    #[inline(always)]
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
        // ql[128], qh[64] at 128, 16 signed scales at 192.
        let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(192) as *const __m128i));
        let scales = halves(s16);
        let (nib, top) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
        let mut acc = [_mm256_setzero_si256(); NA];
        for (half, s) in scales.iter().enumerate() {
            let ql0 = load(w.add(64 * half));
            let ql1 = load(w.add(64 * half + 32));
            let qh = load(w.add(128 + 32 * half));
            // Quant + 32 of pieces 0..4: low nibbles of ql0, ql1, then high nibbles, each
            // with the next two bits of qh on top.
            let u = [
                _mm256_or_si256(_mm256_and_si256(ql0, nib), _mm256_and_si256(_mm256_slli_epi16::<4>(qh), top)),
                _mm256_or_si256(_mm256_and_si256(ql1, nib), _mm256_and_si256(_mm256_slli_epi16::<2>(qh), top)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), nib), _mm256_and_si256(qh, top)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), nib), _mm256_and_si256(_mm256_srli_epi16::<2>(qh), top)),
            ];
            for (k, &u) in u.iter().enumerate() {
                rows_mac::<M, NA>(&mut acc, u, words(*s, 2 * k as i16, 2 * k as i16 + 1), a, 128 * half + 32 * k);
            }
        }
        remove_offset::<5, NA>(&mut acc, a, s16);
        (acc, [_mm256_setzero_si256(); NA])
    }
}

/// `IQ4_XS`: eight 32-element groups of 4-bit indices into the non-linear table, each with
/// a 6-bit scale. The signed values multiply the activations with llama.cpp's sign trick
/// (`maddubs(|v|, sign(a, v))`), quirk included (see `quant::iquants`).
struct IQ4XS;

impl KQuant for IQ4XS {
    const BYTES: usize = 136;
    const D: usize = 0;
    const DMIN: Option<usize> = None;
    const LANES: bool = true;

    #[inline(always)]
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
        // d at 0, scales_h (u16) at 2, scales_l[4] at 4, qs[128] at 8.
        let (sh, sl) = ((w.add(2) as *const u16).read_unaligned() as u32, u32_at(w.add(4)));
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(crate::quant::KVALUES_IQ4NL.as_ptr() as *const __m128i));
        let nib = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_si256(); NA];
        for pair in 0..4 {
            // Groups 2p and 2p + 1 in the two halves: low nibbles are each group's
            // elements 0..16, high nibbles 16..32.
            let raw = load(w.add(8 + 32 * pair));
            let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(raw, nib));
            let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(raw), nib));
            for (h, v) in [_mm256_permute2x128_si256::<0x20>(lo, hi), _mm256_permute2x128_si256::<0x31>(lo, hi)].into_iter().enumerate() {
                let g = 2 * pair + h;
                let ls = (((sl >> (4 * g)) & 0x0f) | (((sh >> (2 * g)) & 3) << 4)) as i16 - 32;
                let (s, mag) = (_mm256_set1_epi16(ls), _mm256_abs_epi8(v));
                for j in 0..NA {
                    let signed = _mm256_sign_epi8(load(a[j].add(ACT_QS + 32 * g)), v);
                    acc[j] = M::mac(acc[j], _mm256_maddubs_epi16(mag, signed), s);
                }
            }
        }
        (acc, [_mm256_setzero_si256(); NA])
    }
}

/// The weight bytes the next tile reads, fetched a share at each block of this one, so
/// that they arrive while this tile computes (the hardware prefetchers do not follow a
/// tile's rows read a block at a time).
#[derive(Clone, Copy)]
pub(super) struct Ahead {
    at: *const u8,
    lines_per_block: usize,
    lines: usize,
    l2: bool,
}

impl Ahead {
    pub(super) const NONE: Ahead = Ahead { at: std::ptr::null(), lines_per_block: 0, lines: 0, l2: false };

    /// The `bytes` at `at`, spread over `nb` blocks.
    pub(super) fn new(at: *const u8, bytes: usize, nb: usize) -> Ahead {
        let lines = bytes.div_ceil(64);
        Ahead { at, lines_per_block: lines.div_ceil(nb), lines, l2: bytes > tiling::l1_bytes() / 4 }
    }

    #[inline(always)]
    pub(super) unsafe fn fetch(self, b: usize) {
        let first = b * self.lines_per_block;
        for line in first..(first + self.lines_per_block).min(self.lines) {
            let p = self.at.wrapping_add(64 * line) as *const i8;
            if self.l2 {
                _mm_prefetch::<_MM_HINT_T1>(p);
            } else {
                _mm_prefetch::<_MM_HINT_T0>(p);
            }
        }
    }
}

/// Lane `o` of the result is the sum of the eight lanes of `v[o]`.
#[inline(always)]
unsafe fn sum_lanes(v: [__m256i; 8]) -> __m256i {
    let q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    // q0 = [v0..v3 low-half sums | v0..v3 high-half sums], q1 likewise for v4..v7.
    _mm256_add_epi32(_mm256_blend_epi32::<0xf0>(q0, q1), _mm256_permute2x128_si256::<0x21>(q0, q1))
}

/// The f16 at `p + off` as f32 in every lane.
#[inline(always)]
unsafe fn f16_splat(p: *const u8, off: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16((p.add(off) as *const i16).read_unaligned()))
}

/// Lane `k`: the f16 at `p[k] + off`, as f32. (Built in registers: eight narrow stores
/// and one wide load would stall on store forwarding.)
#[inline(always)]
unsafe fn f16_gather(p: [*const u8; 8], off: usize) -> __m256 {
    let h = |k: usize| (p[k].add(off) as *const i16).read_unaligned();
    _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)))
}

/// Lane `k`: the f32 at `p[k]`.
#[inline(always)]
unsafe fn f32_gather(p: [*const u8; 8]) -> __m256 {
    let f = |k: usize| (p[k] as *const f32).read_unaligned();
    _mm256_setr_ps(f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7))
}

/// One tile over `nb` blocks: either one weight row × `NA` activation rows (`NR == 1`;
/// output `j` is activation `j`) or `NR` weight rows × one activation row (`NA == 1`;
/// output `i` is row `i`). Lane `k` of the vectors below is output `k`; lanes past the
/// tile compute copies of its last output.
#[inline(always)]
unsafe fn tile<K: KQuant, M: Mac, const NR: usize, const NA: usize>(nb: usize, w: [*const u8; NR], a: [*const u8; NA], grouped: u8, ahead: Ahead) -> [f32; 8] {
    const { assert!((NR == 1 || NA == 1) && NR * NA <= 8) };
    let (mut sum, mut sum_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    // The lanes computed as in a group of four rows (chained formats only).
    let (mut g_sum, mut g_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let pieces = K::CHAINED && grouped != 0;
    // Per output, its eight float lanes (`LANES` formats only).
    let mut lanes = [_mm256_setzero_ps(); 8];
    // Intrinsics stay out of closures: a closure would not inherit the target features,
    // so they would become calls.
    for b in 0..nb {
        ahead.fetch(b);
        let (mut iv, mut sv) = ([_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8]);
        let mut pv = [[_mm256_setzero_si256(); 8]; 4];
        let (d, dmin, da);
        if NR == 1 {
            let wb = w[0].add(b * K::BYTES);
            let ab: [*const u8; NA] = from_fn(|j| a[j].add(b * ACT_BYTES));
            if pieces {
                let (x, y) = K::int_pieces::<M, NA>(wb, &ab);
                for c in 0..4 {
                    pv[c][..NA].copy_from_slice(&x[c]);
                }
                sv[..NA].copy_from_slice(&y);
            } else {
                let (x, y) = K::ints::<M, NA>(wb, &ab);
                iv[..NA].copy_from_slice(&x);
                sv[..NA].copy_from_slice(&y);
            }
            (d, dmin) = (f16_splat(wb, K::D), f16_splat(wb, K::DMIN.unwrap_or(K::D)));
            da = f32_gather(from_fn(|k| ab[k.min(NA - 1)]));
        } else {
            let ab = [a[0].add(b * ACT_BYTES)];
            let wb: [*const u8; 8] = from_fn(|k| w[k.min(NR - 1)].add(b * K::BYTES));
            for i in 0..NR {
                if pieces {
                    let (x, y) = K::int_pieces::<M, 1>(wb[i], &ab);
                    for c in 0..4 {
                        pv[c][i] = x[c][0];
                    }
                    sv[i] = y[0];
                } else {
                    let (x, y) = K::ints::<M, 1>(wb[i], &ab);
                    (iv[i], sv[i]) = (x[0], y[0]);
                }
            }
            (d, dmin) = (f16_gather(wb, K::D), f16_gather(wb, K::DMIN.unwrap_or(K::D)));
            da = _mm256_set1_ps((ab[0] as *const f32).read_unaligned());
        }
        if K::LANES {
            // Scalar: lane-wise fma(d_a·d, lane, acc_lane) for every output.
            let mut dd = [0f32; 8];
            _mm256_storeu_ps(dd.as_mut_ptr(), _mm256_mul_ps(da, d));
            for (o, acc) in lanes.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(dd[o]), _mm256_cvtepi32_ps(iv[o]), *acc);
            }
            continue;
        }
        if K::CHAINED {
            let (dd, dm) = (_mm256_mul_ps(d, da), _mm256_mul_ps(dmin, da));
            if pieces {
                // Scalar, grouped: per piece c, fma(isum_c, d·d_a, ·) and fma(summ_c,
                // dmin·d_a, ·) (summ_c: lanes 2c, 2c + 1 of the mins' sums).
                for (c, p) in pv.iter().enumerate() {
                    let keep = _mm256_setr_epi32(-((c == 0) as i32), -((c == 0) as i32), -((c == 1) as i32), -((c == 1) as i32), -((c == 2) as i32), -((c == 2) as i32), -((c == 3) as i32), -((c == 3) as i32));
                    let mc: [__m256i; 8] = from_fn(|o| _mm256_and_si256(sv[o], keep));
                    g_sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lanes(*p)), dd, g_sum);
                    g_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lanes(mc)), dm, g_min);
                }
                iv = from_fn(|o| _mm256_add_epi32(_mm256_add_epi32(pv[0][o], pv[1][o]), _mm256_add_epi32(pv[2][o], pv[3][o])));
            }
            // Scalar: fma(isum, d·d_a, sum) and fma(summ, dmin·d_a, sum_min).
            sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lanes(iv)), dd, sum);
            sum_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lanes(sv)), dm, sum_min);
            continue;
        }
        // Scalar: d·d_a·(isum as f32) [- dmin·d_a·(summ as f32)], products left to right.
        let mut v = _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(sum_lanes(iv)));
        if K::DMIN.is_some() {
            let m = _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(sum_lanes(sv)));
            v = _mm256_sub_ps(v, m);
        }
        sum = _mm256_add_ps(sum, v);
    }
    let mut res = [0f32; 8];
    if K::LANES {
        for (r, l) in res.iter_mut().zip(&lanes) {
            let mut v = [0f32; 8];
            _mm256_storeu_ps(v.as_mut_ptr(), *l);
            *r = K::FINAL * crate::quant::reduce::hsum8(&v);
        }
        return res;
    }
    if K::CHAINED {
        _mm256_storeu_ps(res.as_mut_ptr(), _mm256_sub_ps(sum, sum_min));
        if pieces {
            let mut g = [0f32; 8];
            _mm256_storeu_ps(g.as_mut_ptr(), _mm256_sub_ps(g_sum, g_min));
            for (k, r) in res.iter_mut().enumerate() {
                // Lane k is output k (NR == 1: activation row k; else every lane is the
                // one activation row).
                if grouped & (1 << if NR == 1 { k } else { 0 }) != 0 {
                    *r = g[k];
                }
            }
        }
        return res;
    }
    _mm256_storeu_ps(res.as_mut_ptr(), sum);
    res
}

/// `out[r][i] (+)= w_i · a_r`: activation rows in groups of `NA` (then of 4) against one
/// weight row at a time; the last 1..=3 activation rows one at a time against `NR`
/// weight rows.
#[inline(always)]
unsafe fn gemm<K: KQuant, M: Mac, const NA: usize, const NR: usize>(
    cols: usize,
    w: &[u8],
    rows: Range<usize>,
    act: &[u8],
    act_stride: usize,
    n_act: usize,
    grouped: &[RowForm],
    out: Out,
) {
    assert!(cols.is_multiple_of(256), "k-quant rows are whole super-blocks");
    // Bit j: activation row j0 + j is computed as in a group of four.
    let mask = |j0: usize, n: usize| (0..n).filter(|&j| grouped.get(j0 + j).is_some_and(|f| f.grouped)).fold(0u8, |m, j| m | 1 << j);
    let nb = cols / 256;
    let rb = nb * K::BYTES;
    assert!(w.len() >= rows.end * rb, "weights shorter than their rows");
    assert!(act.len() >= (n_act - 1) * act_stride + nb * ACT_BYTES, "activations too short");
    // Weight rows in chunks that stay in L1 while every activation tile passes over them.
    let chunk = tiling::chunk_rows(rb, tiling::l1_bytes()).min(64).next_multiple_of(NR);
    let last = rows.end - 1;
    let row = |i: usize| w.as_ptr().add(i.min(last) * rb);
    let arow = |j: usize| act.as_ptr().add(j * act_stride);
    let put = |i: usize, j: usize, v: f32| {
        let o = out.ptr.add(j * out.ld + i);
        *o = if out.accumulate { *o + v } else { v };
    };
    // Activation rows that overflow L2 in panels of half of it (`tiling`), each against
    // every chunk.
    let panel = tiling::panel_for(n_act, nb * ACT_BYTES, tiling::l2_bytes());
    // With several panels, the weights go in blocks that stay in L3 between them.
    let block = tiling::weight_block_rows(n_act, panel, rb, chunk, tiling::l3_bytes());
    for (rows, p0) in tiling::blocks(rows, block).flat_map(|rows| (0..n_act).step_by(panel).map(move |p0| (rows.clone(), p0))) {
        let p1 = (p0 + panel).min(n_act);
        for c0 in rows.clone().step_by(chunk) {
            let c1 = (c0 + chunk).min(rows.end);
            let mut j0 = p0;
            while j0 < p1 {
                let left = p1 - j0;
                if left >= 4 {
                    let na = if left >= NA { NA } else { 4 };
                    for i in c0..c1 {
                        let ahead = if i + 1 < rows.end { Ahead::new(row(i + 1), rb, nb) } else { Ahead::NONE };
                        let res = if na == NA {
                            tile::<K, M, 1, NA>(nb, [row(i)], from_fn(|j| arow(j0 + j)), mask(j0, na), ahead)
                        } else {
                            tile::<K, M, 1, 4>(nb, [row(i)], from_fn(|j| arow(j0 + j)), mask(j0, na), ahead)
                        };
                        res.iter().take(na).enumerate().for_each(|(j, &v)| put(i, j0 + j, v));
                    }
                    j0 += na;
                } else {
                    for i0 in (c0..c1).step_by(NR) {
                        // Rows past the end repeat the last one; their results are dropped.
                        let next = (i0 + NR).min(rows.end);
                        let ahead = Ahead::new(row(next), (rows.end - next).min(NR) * rb, nb);
                        let res = tile::<K, M, NR, 1>(nb, from_fn(|i| row(i0 + i)), [arow(j0)], mask(j0, 1), ahead);
                        res.iter().take(c1 - i0).enumerate().for_each(|(i, &v)| put(i0 + i, j0, v));
                    }
                    j0 += 1;
                }
            }
        }
    }
}

macro_rules! dispatch {
    ($name:ident, $mac:ty, $features:literal, $na:literal, $nr:literal) => {
        /// Run the row-major k-quant kernel for `ty`; false if `ty` has none.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(ty: GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, grouped: &[RowForm], out: Out) -> bool {
            match ty {
                GgmlType::Q2_K => gemm::<Q2K, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::Q3_K => gemm::<Q3K, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::Q4_K => gemm::<Q4K, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::Q5_K => gemm::<Q5K, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::Q6_K => gemm::<Q6K, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::IQ4_XS => gemm::<IQ4XS, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::TQ1_0 => gemm::<TQ1, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::TQ2_0 => gemm::<TQ2, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::IQ2_XXS => gemm_lattice::<BlockIQ2XXS, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::IQ2_XS => gemm_lattice::<BlockIQ2XS, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::IQ2_S => gemm_lattice::<BlockIQ2S, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::IQ3_XXS => gemm_lattice::<BlockIQ3XXS, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                GgmlType::IQ3_S => gemm_lattice::<BlockIQ3S, $mac, $na, $nr>(cols, w, rows, act, act_stride, n_act, grouped, out),
                _ => return false,
            }
            true
        }
    };
}

dispatch!(gemm_vnni, Vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", 8, 8);
dispatch!(gemm_avx2, Avx2, "avx2,fma,f16c", 8, 8);
dispatch!(gemm_avx_vnni, AvxVnni, "avx2,fma,f16c,avxvnni", 8, 8);
