//! `e^x` with the bits of glibc's `expf`, eight lanes at a time (AVX2 + FMA).
//!
//! llama.cpp's CPU attention weighs each position by libm's `expf`, so matching its softmax
//! bit for bit means computing what glibc computes: since 2.28, a table-driven algorithm in
//! double precision (x·32/ln2 split into an integer k and a remainder r, a 32-entry table
//! of 2^(i/32), a cubic in r), built for x86-64 with FMA. This is that sequence of
//! operations, fused where that build fuses, so the results are identical; inputs off its
//! main path (|x| ≥ 88, infinities, NaN) are handed to libm itself.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// 2^(i/32) for i in 0..32 as f64 bits, less `i << 47` (added back with the exponent).
const TABLE: [u64; 32] = [
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
];
/// 32/ln 2.
const INV_LN2_N: u64 = 0x40471547652b82fe;
/// Rounds a double of magnitude below 2^51 to an integer in its low bits: 1.5 · 2^52.
const SHIFT: u64 = 0x4338000000000000;
/// The cubic's coefficients, highest degree first (the constant term is 1).
const C0: u64 = 0x3ebc6af84b912394;
const C1: u64 = 0x3f2ebfce50fac4f3;
const C2: u64 = 0x3f962e42ff0c52d6;
/// Inputs whose top 12 bits (less the sign) exceed this leave the main path.
const MAIN_PATH_TOP: i32 = 0x42a;

/// `e^x` of each lane, as glibc's `expf`.
#[inline(always)]
pub unsafe fn expf8(x: __m256) -> __m256 {
    let lo = main_path4(_mm256_castps256_ps128(x));
    let hi = main_path4(_mm256_extractf128_ps::<1>(x));
    let y = _mm256_set_m128(hi, lo);
    let top = _mm256_and_si256(_mm256_srli_epi32::<20>(_mm256_castps_si256(x)), _mm256_set1_epi32(0x7ff));
    let off = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(MAIN_PATH_TOP))));
    if off == 0 {
        return y;
    }
    let (mut xs, mut ys) = ([0f32; 8], [0f32; 8]);
    _mm256_storeu_ps(xs.as_mut_ptr(), x);
    _mm256_storeu_ps(ys.as_mut_ptr(), y);
    for i in 0..8 {
        if off & (1 << i) != 0 {
            ys[i] = xs[i].exp();
        }
    }
    _mm256_loadu_ps(ys.as_ptr())
}

/// The main path for four lanes, in double precision.
#[inline(always)]
unsafe fn main_path4(x: __m128) -> __m128 {
    let c = |bits: u64| _mm256_set1_pd(f64::from_bits(bits));
    let (inv, shift) = (c(INV_LN2_N), c(SHIFT));
    let xd = _mm256_cvtps_pd(x);
    // x·32/ln2 = k + r: k rounded to nearest in the low bits of kd, r exact-ish by FMA.
    let kd = _mm256_fmadd_pd(inv, xd, shift);
    let ki = _mm256_castpd_si256(kd);
    let kd = _mm256_sub_pd(kd, shift);
    let r = _mm256_fmsub_pd(inv, xd, kd);
    // s = 2^(k/32): the table's entry for k mod 32, with k/32's integer part as exponent.
    let entry = _mm256_i64gather_epi64::<8>(TABLE.as_ptr() as *const i64, _mm256_and_si256(ki, _mm256_set1_epi64x(31)));
    let s = _mm256_castsi256_pd(_mm256_add_epi64(entry, _mm256_slli_epi64::<47>(ki)));
    // 2^(r/32) ≈ C0·r³ + C1·r² + C2·r + 1, then times s.
    let z = _mm256_fmadd_pd(c(C0), r, c(C1));
    let r2 = _mm256_mul_pd(r, r);
    let y = _mm256_fmadd_pd(r, c(C2), _mm256_set1_pd(1.0));
    let y = _mm256_mul_pd(_mm256_fmadd_pd(z, r2, y), s);
    _mm256_cvtpd_ps(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn check(bits: impl Iterator<Item = u32>) {
        let mut lanes = [0f32; 8];
        let mut n = 0;
        for b in bits {
            lanes[n] = f32::from_bits(b);
            n += 1;
            if n == 8 {
                let mut out = [0f32; 8];
                _mm256_storeu_ps(out.as_mut_ptr(), expf8(_mm256_loadu_ps(lanes.as_ptr())));
                for (x, y) in lanes.iter().zip(out) {
                    let want = x.exp();
                    assert!(y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()), "expf({x:e}) = {y:e}, libm {want:e}");
                }
                n = 0;
            }
        }
    }

    #[test]
    fn equals_libm_across_every_range() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("no AVX2+FMA on this CPU: the SIMD expf cannot run here");
            return;
        }
        // A sample of every bit pattern (both signs, every exponent, off-path lanes mixed
        // into vectors of main-path ones), and every float in the softmax's usual range.
        unsafe {
            check((0..u32::MAX).step_by(4099));
            check((0..1u32 << 21).map(|i| (-20.0f32).to_bits() - i * 256));
            check([0.0f32, -0.0, 88.7, 88.8, -87.4, -103.5, -104.0, -1e30, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -1e-40, 0.5, -0.5, 1.0].into_iter().map(f32::to_bits));
        }
    }
}
