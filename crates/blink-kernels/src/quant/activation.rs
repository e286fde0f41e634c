//! Activation quantizers: how llama.cpp's x86 CPU backend turns an `f32` activation row into
//! `Q8_0`, `Q8_1` or `Q8_K` blocks before a quantized dot product, plus the `Q8_K` format.
//!
//! `Q8_0`/`Q8_1` follow the AVX/AVX2 `quantize_row_q8_0`/`_q8_1`, which differ from ggml's
//! reference quantizers: the multiplier is `127/amax` (not `1/(amax/127)`) and rounding is
//! to nearest with ties to even (`_mm256_round_ps`), not away from zero. `Q8_K` has a single
//! implementation (x86 calls the reference one): the signed extreme maps to `-127`.

use half::f16;

use super::blocks::{Block, BlockQ8K, BlockQ8_0, BlockQ8_1, QK32};
use super::numeric::{absmax, nearest_int, round_even, signed_absmax};
use super::rows::QuantBlock;
use blink_gguf::QK_K;

/// Scale and quants of one 32-element activation block, as the AVX2 kernel computes them.
fn quantize_q8_x86(x: &[f32]) -> (f32, [i8; QK32]) {
    let amax = absmax(&x[..QK32]);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    // `_mm256_cvtps_epi32` then saturating packs: clamp to the i8 range.
    let qs = std::array::from_fn(|j| round_even(x[j] * id).clamp(-128.0, 127.0) as i8);
    (d, qs)
}

impl BlockQ8_0 {
    /// Quantize 32 activations as llama.cpp's x86 `quantize_row_q8_0` does.
    ///
    /// Panics if `x` holds fewer than 32 values.
    pub fn quantize_activation(x: &[f32]) -> Self {
        let (d, qs) = quantize_q8_x86(x);
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs,
        }
    }
}

impl BlockQ8_1 {
    /// Quantize 32 activations as llama.cpp's x86 `quantize_row_q8_1` does; `s` is
    /// `d · Σq` with the unrounded `f32` scale.
    ///
    /// Panics if `x` holds fewer than 32 values.
    pub fn quantize_activation(x: &[f32]) -> Self {
        let (d, qs) = quantize_q8_x86(x);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        BlockQ8_1 {
            d: f16::from_f32(d),
            s: f16::from_f32(d * sum as f32),
            qs,
        }
    }
}

/// `Q8_K` is only an activation format in ggml (it has no `Q8_K × Q8_K` kernel); as a
/// "weight" it pairs with itself, using the plain integer dot product.
impl QuantBlock for BlockQ8K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = self.d * q as f32;
        }
    }

    /// ggml's `quantize_row_q8_K_ref`: `iscale = -127/max` for the signed extreme `max`,
    /// `q = min(127, nearest_int(iscale·x))`, `d = 1/iscale`, and sums per 16. An all-zero
    /// block gets `d = 0` and zero quants and sums.
    fn quantize_ref(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let (max, amax) = signed_absmax(x);
        let mut block = BlockQ8K::zeroed();
        if amax == 0.0 {
            return block;
        }
        let iscale = -127.0 / max;
        for (q, &v) in block.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (sum, group) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
            *sum = group.iter().map(|&q| q as i16).sum();
        }
        block.d = 1.0 / iscale;
        block
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        let sumi: i32 = self
            .qs
            .iter()
            .zip(&act.qs)
            .map(|(&w, &a)| w as i32 * a as i32)
            .sum();
        self.d * act.d * sumi as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_activation_rounds_ties_to_even() {
        // amax = 127 gives id = 1, so x*id is exact and the ties are real ties.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = 1.5;
        x[3] = -2.5;
        x[4] = -127.0;
        let b = BlockQ8_0::quantize_activation(&x);
        assert_eq!(&b.qs[..5], &[127, 0, 2, -2, -127]);
        assert_eq!(b.d.to_f32(), 1.0);
        let b1 = BlockQ8_1::quantize_activation(&x);
        assert_eq!(b1.qs, b.qs);
        assert_eq!(b1.s.to_f32(), 0.0);
    }

    #[test]
    fn q8_1_sum_uses_unrounded_scale() {
        // d = 1/127 is not representable in f16; s must be f16(d_f32 * 127 * 32) = 32.
        let x = [1f32; 32];
        let b = BlockQ8_1::quantize_activation(&x);
        assert!(b.qs.iter().all(|&q| q == 127));
        assert_eq!(b.s.to_f32(), 32.0);
        assert_ne!(b.d.to_f32() * 127.0 * 32.0, 32.0);
    }

    #[test]
    fn q8_k_maps_signed_extreme_to_minus_127() {
        let mut x = [0f32; 256];
        x[0] = 0.5;
        x[17] = -2.0;
        x[255] = 2.0;
        let b = BlockQ8K::quantize_ref(&x);
        // iscale = -127 / -2 = 63.5: 0.5 -> 31.75 -> 32; -2 -> -127; 2 -> 127.
        assert_eq!((b.qs[0], b.qs[17], b.qs[255]), (32, -127, 127));
        assert_eq!(b.d, 1.0 / 63.5);
        assert_eq!((b.bsums[0], b.bsums[1], b.bsums[15]), (32, -127, 127));
        let zero = BlockQ8K::quantize_ref(&[0f32; 256]);
        assert_eq!(zero, BlockQ8K::zeroed());
    }
}
