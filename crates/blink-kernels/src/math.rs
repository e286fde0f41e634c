//! Element-wise transcendental functions with fixed, platform-independent results.
//!
//! `exp` and `silu` follow ggml's vectorised routines (range reduction, then a degree-5
//! polynomial evaluated with FMAs), so SwiGLU and softmax give the same bits as llama.cpp's
//! x86 builds. The two builds' routines share the reduction and the polynomial's odd part
//! but end differently ([`Flavour`]): the AVX-512 one adds the polynomial's 1 before
//! scaling by `2^n` in one rounding (`vscalefps`); the AVX2 one builds `2^n` from its
//! bits and takes `k + k·p` in one FMA, with a two-step scale past `2^±126`. Scalar code
//! and every SIMD path compute these same operations.

use crate::flavour::Flavour;

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

/// `e^x` as `flavour`'s `ggml_v_expf` computes it (within about 1.5 ulp of the true value).
#[inline]
pub fn expf(flavour: Flavour, x: f32) -> f32 {
    match flavour {
        Flavour::Avx512 => expf_avx512(x),
        Flavour::Avx2 => expf_avx2(x),
    }
}

/// `x · sigmoid(x) = x / (1 + e^-x)`, as `flavour`'s `ggml_v_silu`.
#[inline]
pub fn silu(flavour: Flavour, x: f32) -> f32 {
    x / (1.0 + expf(flavour, 0.0 - x))
}

/// Lanes of `flavour`'s vectorised `exp`: sixteen for the AVX-512 build, eight for AVX2.
/// ggml takes whole groups of these through [`expf`] and the rest through libm.
pub fn exp_lanes(flavour: Flavour) -> usize {
    match flavour {
        Flavour::Avx512 => 16,
        Flavour::Avx2 => 8,
    }
}

/// The range reduction both flavours share, `x = n·ln2 + b` with `n` an integer and
/// `|b| ≤ ln2/2`, and the polynomial's terms past the linear one: `(z, n, b, u, odd)`
/// with `z` the shifted product whose low bits hold `n`, `u = b²` and
/// `odd = (c5·b + c4)·u + (c3·b + c2)`, each step one FMA.
#[inline(always)]
fn reduce(x: f32) -> (f32, f32, f32, f32, f32) {
    let z = x.mul_add(LOG2_E, SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    (z, n, b, u, C5.mul_add(b, C4).mul_add(u, C3.mul_add(b, C2)))
}

/// The AVX-512 build's `exp`: `1 + c1·b + u·odd` rounded, then scaled by `2^n` exactly.
#[inline]
fn expf_avx512(x: f32) -> f32 {
    let (_, n, b, u, odd) = reduce(x);
    let j = odd.mul_add(u, C1.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scale_by_pow2(j, n)
}

/// The AVX2 build's `exp`: `p = c1·b (rounded) + u·odd`, then `k + k·p` in one FMA with
/// `k = 2^n` built from `n`'s bits; past `|n| > 126` (where `2^n` has no normal f32) `2^n`
/// is split in two powers, `s1·(s2 + s2·p)`, and past 192 it is `s1·s1` (0 or ∞).
#[inline]
fn expf_avx2(x: f32) -> f32 {
    let (z, n, b, u, odd) = reduce(x);
    let p = odd.mul_add(u, C1 * b);
    // `n << 23`: the exponent field of 2^n, less the bias.
    let e = z.to_bits() << 23;
    // A NaN `n` takes this branch.
    if n.abs() <= 126.0 || n.is_nan() {
        let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
        return p.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    if n.abs() > 192.0 {
        return s1 * s1;
    }
    let s2 = f32::from_bits(e.wrapping_sub(g));
    s2.mul_add(p, s2) * s1
}

/// [`expf`] and [`silu`] eight lanes at a time with AVX2 and FMA: the same operations in
/// the same order, so the same bits (`AVX2_BUILD` picks the flavour).
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`silu`] of each lane.
    #[inline(always)]
    pub(crate) unsafe fn silu8<const AVX2_BUILD: bool>(x: __m256) -> __m256 {
        let e = expf8::<AVX2_BUILD>(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    /// [`expf`] of each lane.
    #[inline(always)]
    pub(crate) unsafe fn expf8<const AVX2_BUILD: bool>(x: __m256) -> __m256 {
        if AVX2_BUILD {
            expf8_avx2(x)
        } else {
            expf8_avx512(x)
        }
    }

    /// [`reduce`] of each lane.
    #[inline(always)]
    unsafe fn reduce8(x: __m256) -> [__m256; 5] {
        let set = _mm256_set1_ps;
        let shift = set(SHIFT);
        let z = _mm256_fmadd_ps(x, set(LOG2_E), shift);
        let n = _mm256_sub_ps(z, shift);
        let b = _mm256_fnmadd_ps(n, set(LN2_LO), _mm256_fnmadd_ps(n, set(LN2_HI), x));
        let u = _mm256_mul_ps(b, b);
        let odd = _mm256_fmadd_ps(_mm256_fmadd_ps(set(C5), b, set(C4)), u, _mm256_fmadd_ps(set(C3), b, set(C2)));
        [z, n, b, u, odd]
    }

    /// `f` of each lane of `x`, one at a time (the rare lanes past the common range).
    #[inline(always)]
    unsafe fn by_lane(x: __m256, f: fn(f32) -> f32) -> __m256 {
        let mut v = [0f32; 8];
        _mm256_storeu_ps(v.as_mut_ptr(), x);
        v.iter_mut().for_each(|v| *v = f(*v));
        _mm256_loadu_ps(v.as_ptr())
    }

    /// [`expf_avx512`] of each lane.
    #[inline(always)]
    unsafe fn expf8_avx512(x: __m256) -> __m256 {
        let set = _mm256_set1_ps;
        let [_, n, b, u, odd] = reduce8(x);
        let j = _mm256_fmadd_ps(odd, u, _mm256_fmadd_ps(set(C1), b, set(1.0)));
        // Where every n is a normal exponent, 2^n is built from its bits and the product
        // rounds once, as in `scale_by_pow2`; otherwise (or for NaN) lane by lane.
        let normal = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(n, set(-126.0)), _mm256_cmp_ps::<_CMP_LE_OQ>(n, set(127.0)));
        if _mm256_movemask_ps(normal) == 0xff {
            let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)));
            return _mm256_mul_ps(j, _mm256_castsi256_ps(pow2));
        }
        by_lane(x, expf_avx512)
    }

    /// [`expf_avx2`] of each lane.
    #[inline(always)]
    unsafe fn expf8_avx2(x: __m256) -> __m256 {
        let set = _mm256_set1_ps;
        let [z, n, b, u, odd] = reduce8(x);
        let p = _mm256_fmadd_ps(odd, u, _mm256_mul_ps(set(C1), b));
        // Where no |n| passes 126, `k = 2^n` from n's bits and `k + k·p` (NaNs too);
        // otherwise lane by lane.
        let far = _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_andnot_ps(set(-0.0), n), set(126.0));
        if _mm256_movemask_ps(far) == 0 {
            let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
            let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(set(1.0))));
            return _mm256_fmadd_ps(p, k, k);
        }
        by_lane(x, expf_avx2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_close_to_libm_everywhere() {
        for f in Flavour::ALL {
            let mut x = -103.0f32;
            while x < 88.0 {
                let (a, b) = (expf(f, x), x.exp());
                // Past e^-87 the results are subnormal: an ulp there is a larger share.
                let ulp = (b.to_bits() as i64 - a.to_bits() as i64).abs();
                assert!(ulp <= 2 || (x < -87.0 && ulp <= 8), "{f}: expf({x}) = {a}, libm {b}");
                x += 0.0137;
            }
            assert_eq!(expf(f, 0.0), 1.0);
            assert_eq!(expf(f, -200.0), 0.0);
            assert_eq!(expf(f, 200.0), f32::INFINITY);
            assert_eq!(expf(f, f32::NEG_INFINITY), 0.0);
            assert!(expf(f, f32::NAN).is_nan());
        }
    }

    /// The flavours part in the last bit only (on about a quarter of these arguments).
    #[test]
    fn the_flavours_differ_by_rounding_only() {
        let (mut differ, mut n) = (0, 0);
        let mut x = -80.0f32;
        while x < 80.0 {
            let (a, b) = (expf(Flavour::Avx512, x), expf(Flavour::Avx2, x));
            assert!((a.to_bits() as i64 - b.to_bits() as i64).abs() <= 1, "{x}: {a} vs {b}");
            differ += (a != b) as usize;
            n += 1;
            x += 0.00731;
        }
        assert!(differ > 0 && differ < n / 2, "{differ} of {n} differ");
    }

    #[test]
    fn silu_limits() {
        for f in Flavour::ALL {
            assert_eq!(silu(f, 0.0), 0.0);
            assert!((silu(f, 20.0) - 20.0).abs() < 1e-5);
            assert!(silu(f, -100.0).abs() < 1e-30);
            assert!((silu(f, 1.0) - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
        }
    }

    /// The eight-lane kernels against the scalar definitions on every 4093rd f32 bit
    /// pattern (every exponent, both signs, infinities and NaNs), each in every lane.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn eight_lanes_equal_the_scalar_definitions() {
        use std::arch::x86_64::*;
        if !crate::cpu::Isa::Avx2.supported() {
            eprintln!("eight_lanes_equal_the_scalar_definitions: this CPU has no AVX2; nothing to check");
            return;
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn lanes(f: Flavour, x: &[f32; 8]) -> [[f32; 8]; 2] {
            let v = _mm256_loadu_ps(x.as_ptr());
            let (e, s) = match f {
                Flavour::Avx512 => (x86::expf8::<false>(v), x86::silu8::<false>(v)),
                Flavour::Avx2 => (x86::expf8::<true>(v), x86::silu8::<true>(v)),
            };
            let mut out = [[0f32; 8]; 2];
            _mm256_storeu_ps(out[0].as_mut_ptr(), e);
            _mm256_storeu_ps(out[1].as_mut_ptr(), s);
            out
        }
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let xs: Vec<f32> = (0..=u32::MAX).step_by(4093).map(f32::from_bits).collect();
        for f in Flavour::ALL {
            // Ordinary neighbours, so that lanes past the common range are mixed with others.
            for (i, chunk) in xs.chunks(7).enumerate() {
                let mut x = [(i % 50) as f32 * 0.37 - 9.0; 8];
                x[..chunk.len()].copy_from_slice(chunk);
                x.rotate_left(i % 8);
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                let [e, s] = unsafe { lanes(f, &x) };
                for l in 0..8 {
                    assert!(same(e[l], expf(f, x[l])), "{f}: exp({:e}) = {:e}, scalar {:e}", x[l], e[l], expf(f, x[l]));
                    assert!(same(s[l], silu(f, x[l])), "{f}: silu({:e}) = {:e}, scalar {:e}", x[l], s[l], silu(f, x[l]));
                }
            }
        }
    }
}
