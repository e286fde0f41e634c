//! Scalar helpers shared by the quantizers, reproducing ggml's rounding and extremum rules.

/// ggml's `nearest_int`: round to nearest, ties to even (it adds 1.5·2²³ and reads the
/// mantissa, which rounds in the FPU's default mode). Out-of-range inputs saturate
/// instead of producing garbage; ggml only calls it on values well inside `±2²²`.
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    round_even(x) as i32
}

/// `x` rounded to nearest, ties to even, as `f32::round_ties_even` (which, on a build for
/// baseline x86-64, is a call to libm's `rintf`): inside `±2²²` by ggml's addition of
/// 1.5·2²³, exact there, and by the library outside.
#[inline]
pub fn round_even(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    if x.abs() < 4_194_304.0 {
        ((x.abs() + SHIFT) - SHIFT).copysign(x)
    } else {
        x.round_ties_even()
    }
}

/// The element with the largest magnitude, keeping its sign; the first one wins ties, and
/// an all-zero (or empty) slice gives `(0.0, 0.0)`. Returns `(signed_max, abs_max)`.
#[inline]
pub fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// The largest magnitude, as `fold(max)` (NaNs are skipped).
#[inline]
pub fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Smallest and largest element, starting from `(f32::MAX, -f32::MAX)` as ggml does.
#[inline]
pub fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| {
        (if v < lo { v } else { lo }, if v > hi { v } else { hi })
    })
}

/// C's `(int)` conversion (truncation toward zero) followed by a clamp to `0..=max`.
#[inline]
pub fn trunc_clamp(x: f32, max: u8) -> u8 {
    (x as i32).clamp(0, max as i32) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-3.5), -4);
        assert_eq!(nearest_int(2.500001), 3);
        assert_eq!(nearest_int(f32::NAN), 0);
    }

    #[test]
    fn signed_absmax_keeps_first_and_sign() {
        assert_eq!(signed_absmax(&[1.0, -3.0, 3.0, 2.0]), (-3.0, 3.0));
        assert_eq!(signed_absmax(&[0.0, -0.0]), (0.0, 0.0));
        assert_eq!(min_max(&[2.0, -1.0, 5.0]), (-1.0, 5.0));
        assert_eq!(absmax(&[2.0, -7.0, 5.0]), 7.0);
        assert_eq!(trunc_clamp(16.9, 15), 15);
        assert_eq!(trunc_clamp(8.99, 15), 8);
        assert_eq!(trunc_clamp(-0.5, 15), 0);
    }
}

#[cfg(test)]
mod round_tests {
    use super::*;

    #[test]
    fn round_even_is_round_ties_even() {
        let mut s = 0x9e37_79b9u32;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let x = f32::from_bits(s);
            if x.is_finite() {
                assert_eq!(round_even(x).to_bits(), x.round_ties_even().to_bits(), "{x}");
            }
        }
        for x in [0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127.5, 4194303.5, -0.0, 0.0, 1e-30] {
            assert_eq!(round_even(x), x.round_ties_even(), "{x}");
        }
    }
}
