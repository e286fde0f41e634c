//! Element-wise transcendental functions with fixed, platform-independent results.
//!
//! `exp` and `silu` follow ggml's vectorised AVX-512 routine (range reduction, then a
//! degree-5 polynomial evaluated with FMAs), so SwiGLU gives the same bits as llama.cpp's
//! x86 build. Scalar code and every SIMD path compute these same operations.

/// The constants of ggml's `exp` (range reduction, then a degree-5 polynomial), for
/// kernels elsewhere that evaluate the same recipe on their own lanes.
pub mod exp_poly {
    /// Round-to-integer shift: `1.5 · 2^23`.
    pub const SHIFT: f32 = 12_582_912.0;
    /// log2(e).
    pub const LOG2_E: f32 = f32::from_bits(0x3fb8_aa3b);
    /// ln(2) split in a high and a low part for an exact range reduction.
    pub const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
    pub const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    /// Polynomial coefficients of `2^f` on the reduced range.
    pub const C1: f32 = f32::from_bits(0x3f7f_fff6);
    pub const C2: f32 = f32::from_bits(0x3eff_fedb);
    pub const C3: f32 = f32::from_bits(0x3e2a_af33);
    pub const C4: f32 = f32::from_bits(0x3d2b_9f17);
    pub const C5: f32 = f32::from_bits(0x3c07_2010);
}

use exp_poly::*;

/// `2^e` for `-126 ≤ e ≤ 127`.
#[inline]
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// `j · 2^k` with a single rounding for integer-valued `|k| ≤ 192` (as `_mm512_scalef_ps`),
/// given `j` in [0.5, 2).
#[inline]
fn scale_by_pow2(j: f32, k: f32) -> f32 {
    let k = k as i32;
    if k > 127 {
        (j * pow2(64)) * pow2(k - 64)
    } else if k < -126 {
        // j · 2^-64 is exact; only the last product rounds.
        let rest = k + 64;
        if rest < -126 {
            0.0
        } else {
            (j * pow2(-64)) * pow2(rest)
        }
    } else {
        j * pow2(k)
    }
}

/// `e^x` as ggml's `ggml_v_expf` computes it (within about 1.5 ulp of the true value).
#[inline]
pub fn expf(x: f32) -> f32 {
    let z = x.mul_add(LOG2_E, SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    let j = C5.mul_add(b, C4).mul_add(u, C3.mul_add(b, C2)).mul_add(u, C1.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scale_by_pow2(j, n)
}

/// `x · sigmoid(x) = x / (1 + e^-x)`, as ggml's `ggml_v_silu`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// [`expf`] and [`silu`] eight lanes at a time with AVX2 and FMA: the same operations in
/// the same order, so the same bits.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`silu`] of each lane.
    #[inline(always)]
    pub(crate) unsafe fn silu8(x: __m256) -> __m256 {
        let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    /// [`expf`] of each lane.
    #[inline(always)]
    pub(crate) unsafe fn expf8(x: __m256) -> __m256 {
        let set = _mm256_set1_ps;
        let shift = set(SHIFT);
        let n = _mm256_sub_ps(_mm256_fmadd_ps(x, set(LOG2_E), shift), shift);
        let b = _mm256_fnmadd_ps(n, set(LN2_LO), _mm256_fnmadd_ps(n, set(LN2_HI), x));
        let u = _mm256_mul_ps(b, b);
        let odd = _mm256_fmadd_ps(_mm256_fmadd_ps(set(C5), b, set(C4)), u, _mm256_fmadd_ps(set(C3), b, set(C2)));
        let j = _mm256_fmadd_ps(odd, u, _mm256_fmadd_ps(set(C1), b, set(1.0)));
        // Where every n is a normal exponent, 2^n is built from its bits and the product
        // rounds once, as in `scale_by_pow2`; otherwise (or for NaN) lane by lane.
        let normal = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(n, set(-126.0)), _mm256_cmp_ps::<_CMP_LE_OQ>(n, set(127.0)));
        if _mm256_movemask_ps(normal) == 0xff {
            let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)));
            return _mm256_mul_ps(j, _mm256_castsi256_ps(pow2));
        }
        let (mut js, mut ns) = ([0f32; 8], [0f32; 8]);
        _mm256_storeu_ps(js.as_mut_ptr(), j);
        _mm256_storeu_ps(ns.as_mut_ptr(), n);
        for (j, &n) in js.iter_mut().zip(&ns) {
            *j = if n.abs() > 192.0 {
                if n <= 0.0 { 0.0 } else { f32::INFINITY }
            } else {
                scale_by_pow2(*j, n)
            };
        }
        _mm256_loadu_ps(js.as_ptr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_close_to_libm_everywhere() {
        let mut x = -100.0f32;
        while x < 88.0 {
            let (a, b) = (expf(x), x.exp());
            let ulp = (b.to_bits() as i64 - a.to_bits() as i64).abs();
            assert!(ulp <= 2, "expf({x}) = {a}, libm {b}");
            x += 0.0137;
        }
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(200.0), f32::INFINITY);
    }

    #[test]
    fn silu_limits() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(20.0) - 20.0).abs() < 1e-5);
        assert!(silu(-100.0).abs() < 1e-30);
        assert!((silu(1.0) - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
    }
}
