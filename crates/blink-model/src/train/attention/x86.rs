//! The AVX-512 and AVX2 lanes of the training attention kernels (same operations as the
//! portable lanes, so the same bits).

use std::arch::x86_64::*;

use super::{Lanes, W};

/// The last step of [`Lanes::sum`] and [`Lanes::hmax`] from eight lanes.
#[inline(always)]
unsafe fn tree8(t8: __m256, f: impl Fn(__m128, __m128) -> __m128) -> f32 {
    let t4 = f(_mm256_castps256_ps128(t8), _mm256_extractf128_ps::<1>(t8));
    let t2 = f(t4, _mm_movehl_ps(t4, t4));
    _mm_cvtss_f32(f(t2, _mm_shuffle_ps::<1>(t2, t2)))
}

/// `dst[c·ld + l] = src[l][c]` for `l, c < 8`.
#[inline(always)]
unsafe fn transpose8(src: [*const f32; 8], dst: *mut f32, ld: usize) {
    let out = blink_kernels::x86::transpose8(std::array::from_fn(|i| _mm256_loadu_ps(src[i])));
    for (c, v) in out.iter().enumerate() {
        _mm256_storeu_ps(dst.add(c * ld), *v);
    }
}

/// A 16×16 block as four 8×8 ones.
#[inline(always)]
unsafe fn transpose16(src: &[*const f32; W], dst: *mut f32, ld: usize) {
    for (hl, hc) in [(0, 0), (0, 8), (8, 0), (8, 8)] {
        transpose8(std::array::from_fn(|i| src[hl + i].add(hc)), dst.add(hc * ld + hl), ld);
    }
}

/// Sixteen lanes in one AVX-512 register.
#[derive(Clone, Copy)]
pub(super) struct Z(__m512);

impl Lanes for Z {
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        Z(_mm512_set1_ps(x))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Z(_mm512_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm512_storeu_ps(p, self.0)
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        Z(_mm512_fmadd_ps(a.0, b.0, c.0))
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        Z(_mm512_add_ps(self.0, b.0))
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        Z(_mm512_sub_ps(self.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        Z(_mm512_mul_ps(self.0, b.0))
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        Z(_mm512_div_ps(self.0, b.0))
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        Z(_mm512_max_ps(self.0, b.0))
    }
    #[inline(always)]
    unsafe fn neg(self) -> Self {
        Z(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(self.0), _mm512_set1_epi32(i32::MIN))))
    }
    #[inline(always)]
    unsafe fn pow2(self) -> Self {
        let e = _mm512_add_epi32(_mm512_cvttps_epi32(self.0), _mm512_set1_epi32(127));
        Z(_mm512_castsi512_ps(_mm512_slli_epi32::<23>(e)))
    }
    #[inline(always)]
    unsafe fn zero_below(self, x: Self, t: f32) -> Self {
        let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x.0, _mm512_set1_ps(t));
        Z(_mm512_mask_blend_ps(below, self.0, _mm512_setzero_ps()))
    }
    #[inline(always)]
    unsafe fn first(self, n: usize, fill: f32) -> Self {
        let keep: __mmask16 = if n >= W { u16::MAX } else { (1u16 << n) - 1 };
        Z(_mm512_mask_blend_ps(keep, _mm512_set1_ps(fill), self.0))
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(self.0)));
        tree8(_mm256_add_ps(_mm512_castps512_ps256(self.0), hi), |a, b| _mm_add_ps(a, b))
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(self.0)));
        tree8(_mm256_max_ps(_mm512_castps512_ps256(self.0), hi), |a, b| _mm_max_ps(a, b))
    }
    #[inline(always)]
    unsafe fn transpose_block(src: &[*const f32; W], dst: *mut f32, ld: usize) {
        transpose16(src, dst, ld)
    }
}

/// Sixteen lanes in two AVX2 registers (lanes 0..8, 8..16).
#[derive(Clone, Copy)]
pub(super) struct Y([__m256; 2]);

impl Y {
    #[inline(always)]
    unsafe fn map(self, f: impl Fn(__m256) -> __m256) -> Self {
        Y([f(self.0[0]), f(self.0[1])])
    }
    #[inline(always)]
    unsafe fn map2(self, b: Self, f: impl Fn(__m256, __m256) -> __m256) -> Self {
        Y([f(self.0[0], b.0[0]), f(self.0[1], b.0[1])])
    }
}

impl Lanes for Y {
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        Y([_mm256_set1_ps(x); 2])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Y([_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))])
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm256_storeu_ps(p, self.0[0]);
        _mm256_storeu_ps(p.add(8), self.0[1]);
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        Y([_mm256_fmadd_ps(a.0[0], b.0[0], c.0[0]), _mm256_fmadd_ps(a.0[1], b.0[1], c.0[1])])
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        self.map2(b, |x, y| _mm256_add_ps(x, y))
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        self.map2(b, |x, y| _mm256_sub_ps(x, y))
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        self.map2(b, |x, y| _mm256_mul_ps(x, y))
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        self.map2(b, |x, y| _mm256_div_ps(x, y))
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        self.map2(b, |x, y| _mm256_max_ps(x, y))
    }
    #[inline(always)]
    unsafe fn neg(self) -> Self {
        self.map(|x| _mm256_xor_ps(x, _mm256_set1_ps(-0.0)))
    }
    #[inline(always)]
    unsafe fn pow2(self) -> Self {
        self.map(|n| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)))))
    }
    #[inline(always)]
    unsafe fn zero_below(self, x: Self, t: f32) -> Self {
        let t = _mm256_set1_ps(t);
        self.map2(x, |v, x| _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LT_OQ>(x, t)))
    }
    #[inline(always)]
    unsafe fn first(self, n: usize, fill: f32) -> Self {
        let n = _mm256_set1_epi32(n.min(W) as i32);
        let fill = _mm256_set1_ps(fill);
        let lanes = [_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)];
        let keep = |h: usize| _mm256_castsi256_ps(_mm256_cmpgt_epi32(n, lanes[h]));
        Y([_mm256_blendv_ps(fill, self.0[0], keep(0)), _mm256_blendv_ps(fill, self.0[1], keep(1))])
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        tree8(_mm256_add_ps(self.0[0], self.0[1]), |a, b| _mm_add_ps(a, b))
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        tree8(_mm256_max_ps(self.0[0], self.0[1]), |a, b| _mm_max_ps(a, b))
    }
    #[inline(always)]
    unsafe fn transpose_block(src: &[*const f32; W], dst: *mut f32, ld: usize) {
        transpose16(src, dst, ld)
    }
}
