//! The ternary formats' kernels (`TQ1_0`, `TQ2_0`; see `quant::ternary`): unsigned trits
//! against the activations, each run's activation sum taken back from `bsums`.

use std::arch::x86_64::*;

use super::{bsums_dot, load, rows_mac, u32_at, KQuant, Mac};

/// `TQ2_0`: 2-bit trits, four to a byte.
pub(super) struct TQ2;
/// `TQ1_0`: trits five to a byte as base-3 fractions (see `quant::ternary`).
pub(super) struct TQ1;

/// `acc[j] −= Σ a` per run of 32 of activation row `j` (lane `k`: `bsums[2k] +
/// bsums[2k + 1]`), which takes back the unsigned trits' `+1`.
#[inline(always)]
unsafe fn remove_trit_offset<const NA: usize>(acc: &mut [__m256i; NA], a: &[*const u8; NA]) {
    let runs = bsums_dot(a, _mm256_set1_epi16(1));
    for j in 0..NA {
        acc[j] = _mm256_sub_epi32(acc[j], runs[j]);
    }
}

impl KQuant for TQ2 {
    const BYTES: usize = 66;
    const D: usize = 64;
    const DMIN: Option<usize> = None;
    const LANES: bool = true;

    #[inline(always)]
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
        let (ones, m3) = (_mm256_set1_epi16(1), _mm256_set1_epi8(3));
        let mut acc = [_mm256_setzero_si256(); NA];
        for run in 0..2 {
            // Bits 2l of byte m: element 128·run + 32l + m.
            let mut raw = load(w.add(32 * run));
            for l in 0..4 {
                rows_mac::<M, NA>(&mut acc, _mm256_and_si256(raw, m3), ones, a, 128 * run + 32 * l);
                raw = _mm256_srli_epi16::<2>(raw);
            }
        }
        remove_trit_offset(&mut acc, a);
        (acc, [_mm256_setzero_si256(); NA])
    }
}

/// `3v` in every byte, wrapping.
#[inline(always)]
unsafe fn times3(v: __m256i) -> __m256i {
    _mm256_add_epi8(v, _mm256_add_epi8(v, v))
}

/// The top trit of each byte, `(b · 3) >> 8`: `b − 1` (saturating) halved-added twice
/// (`avg` rounds up, which the `− 1` cancels), then the top two bits.
#[inline(always)]
unsafe fn top_trits(b: __m256i) -> __m256i {
    let t = _mm256_subs_epu8(b, _mm256_set1_epi8(1));
    let three_halves = _mm256_avg_epu8(t, _mm256_avg_epu8(t, _mm256_setzero_si256()));
    _mm256_and_si256(_mm256_srli_epi16::<6>(three_halves), _mm256_set1_epi8(3))
}

impl KQuant for TQ1 {
    const BYTES: usize = 54;
    const D: usize = 52;
    const DMIN: Option<usize> = None;
    const LANES: bool = true;

    #[inline(always)]
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_si256(); NA];
        // qs[0..32]: trit n of byte m is element 32n + m.
        let mut x = load(w);
        for n in 0..5 {
            rows_mac::<M, NA>(&mut acc, top_trits(x), ones, a, 32 * n);
            x = times3(x);
        }
        // qs[32..48]: trit n of byte m is element 160 + 16n + m, two trits per vector;
        // qh[0..4]: trit n of byte j is element 240 + 4n + j.
        let p1 = _mm256_broadcastsi128_si256(_mm_loadu_si128(w.add(32) as *const __m128i));
        let p3 = times3(p1);
        let p9 = times3(p3);
        let p27 = times3(p9);
        let p81 = times3(p27);
        let h1 = _mm256_set1_epi32(u32_at(w.add(48)) as i32);
        let h3 = times3(h1);
        let h9 = times3(h3);
        let h27 = times3(h9);
        let h = _mm256_blend_epi32::<0b1000>(_mm256_blend_epi32::<0b0100>(_mm256_blend_epi32::<0b0010>(h1, h3), h9), h27);
        let last = _mm256_permute2x128_si256::<0x20>(p81, h);
        for (c, v) in [_mm256_blend_epi32::<0xf0>(p1, p3), _mm256_blend_epi32::<0xf0>(p9, p27), last].into_iter().enumerate() {
            rows_mac::<M, NA>(&mut acc, top_trits(v), ones, a, 160 + 32 * c);
        }
        remove_trit_offset(&mut acc, a);
        (acc, [_mm256_setzero_si256(); NA])
    }
}
