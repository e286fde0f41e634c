//! `MXFP4`, the OCP microscaling 4-bit float format (gpt-oss's experts): 32 E2M1 values
//! under one shared power-of-two scale, against `Q8_0` activations.
//!
//! The 4-bit codes index [`KVALUES_MXFP4`], the E2M1 values doubled so they are integers;
//! the scale is the E8M0 exponent halved to match ([`e8m0_half`]). Every product is an
//! exact integer, and `d_w·d_a` is exact too (a power of two times an f16) except where it
//! leaves the normal range. llama.cpp's x86 build repacks `MXFP4` matrices (`mxfp4_8x8`,
//! as `IQ4_NL`), whose kernels add each block's integer sum times `d_w·d_a` with one FMA in
//! one chain per output: that is this format's only order.

use super::blocks::{BlockMXFP4, BlockQ8_0, QK32};
use super::rows::{DotAcc, QuantBlock};

/// The sixteen values a 4-bit `MXFP4` code stands for: E2M1 (sign, two exponent bits,
/// one mantissa bit) doubled.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An E8M0 exponent's value halved, `2^(e−128)`, as ggml's `ggml_e8m0_to_fp32_half`
/// computes it (the two smallest exponents are subnormal floats).
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e as u32) - 1) << 23 };
    f32::from_bits(bits)
}

/// The block's 32 codes (low nibbles: elements 0..16).
#[inline]
fn codes(qs: &[u8; QK32 / 2]) -> [u8; QK32] {
    std::array::from_fn(|e| if e < 16 { qs[e] & 0x0f } else { qs[e - 16] >> 4 })
}

/// The code whose value times `d` is nearest `x`, the first of equals (ggml's
/// `best_index_mxfp4`).
fn best_code(x: f32, d: f32) -> u8 {
    let mut best = (0u8, (KVALUES_MXFP4[0] as f32 * d - x).abs());
    for (i, &v) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (v as f32 * d - x).abs();
        if err < best.1 {
            best = (i as u8, err);
        }
    }
    best.0
}

impl QuantBlock for BlockMXFP4 {
    type Act = BlockQ8_0;

    fn dequantize(&self, out: &mut [f32]) {
        let d = e8m0_half(self.e);
        for (o, c) in out[..QK32].iter_mut().zip(codes(&self.qs)) {
            *o = KVALUES_MXFP4[c as usize] as f32 * d;
        }
    }

    /// ggml's `quantize_row_mxfp4_ref`: the exponent puts the largest magnitude in the
    /// table's top octave (`⌊log2 amax⌋ − 2`, so `amax/d` is 8 to 16 against a top value
    /// of 12), then each value takes its nearest code.
    fn quantize_ref(x: &[f32]) -> Self {
        let x = &x[..QK32];
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // ggml converts the float to u8 unchecked; below 2^-125 that is out of range, and
        // here saturates to 0 (no real weight block is that small).
        let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8 } else { 0 };
        let d = e8m0_half(e);
        let mut qs = [0u8; QK32 / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = best_code(x[j], d) | (best_code(x[16 + j], d) << 4);
        }
        BlockMXFP4 { e, qs }
    }

    #[inline]
    fn accumulate(&self, act: &BlockQ8_0, acc: &mut DotAcc) {
        let sum: i32 = codes(&self.qs).iter().zip(&act.qs).map(|(&c, &a)| KVALUES_MXFP4[c as usize] as i32 * a as i32).sum();
        acc.add_block_sum(act.d.to_f32() * e8m0_half(self.e), sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_exponents_are_powers_of_two_down_to_the_subnormals() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(130), 4.0);
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(255), 2f32.powi(127));
    }

    #[test]
    fn a_block_round_trips_to_its_nearest_values() {
        let x: Vec<f32> = (0..QK32).map(|i| ((i as f32 * 0.61).sin() * 3.0 - 0.4) * 0.01).collect();
        let b = BlockMXFP4::quantize_ref(&x);
        let mut y = [0f32; QK32];
        b.dequantize(&mut y);
        let d = e8m0_half(b.e);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // The largest value lands in the table's top octave, 8d ≤ amax < 16d (its top
        // value, 12, clips the rest, as in ggml).
        assert!(8.0 * d <= amax && amax < 16.0 * d, "{amax} against scale {d}");
        for (&a, &q) in x.iter().zip(&y) {
            let nearest = KVALUES_MXFP4.iter().map(|&v| (v as f32 * d - a).abs()).fold(f32::INFINITY, f32::min);
            assert_eq!((q - a).abs(), nearest, "{a} became {q}");
        }
        assert_eq!(BlockMXFP4::quantize_ref(&[0.0; QK32]), BlockMXFP4 { e: 0, qs: [0; 16] });
    }
}
