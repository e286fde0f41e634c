//! The ternary formats of BitNet b1.58 and TriLM models, `TQ1_0` and `TQ2_0`: 256 weights
//! `d · (t − 1)` with trits `t ∈ {0, 1, 2}`, against `Q8_K` activations.
//!
//! Both dots follow llama.cpp's x86 kernels ([`EightLanes`]): the unsigned trits multiply
//! the activations (`maddubs`), so integer lane `k` sums `t·a` over elements `4k..4k + 4`
//! of every 32-element run, and the `−1` comes back through the activation's `bsums`,
//! lane `k` taking `bsums[2k] + bsums[2k + 1]` (the sum of run `k`'s activations, not of
//! the lane's own elements; the lanes' total is what it must be). `TQ2_0` can store a
//! fourth value, 3, which no quantizer writes; it is read as the SIMD paths read it
//! (`d · 2`).

use half::f16;

use super::blocks::{BlockQ8K, BlockTQ1_0, BlockTQ2_0};
use super::rows::{EightLanes, QuantBlock};
use blink_gguf::QK_K;

/// `3^n` for the five trits of a byte.
const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `n` (0: the most significant) of a `TQ1_0` byte: the byte is a base-3 fraction
/// times 256, so multiplying by `3^n` (mod 256) brings trit `n` to the top, and `· 3 >> 8`
/// reads it.
#[inline]
fn trit(byte: u8, n: usize) -> u8 {
    ((byte.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as u8
}

/// Up to five trits (the most significant first) as a `TQ1_0` byte: `⌈q · 256 / 243⌉`.
#[inline]
fn trit_byte(trits: impl Iterator<Item = u8>, count: usize) -> u8 {
    let mut q = 0u16;
    for t in trits {
        q = q * 3 + t as u16;
    }
    // Four trits sit in the top four places.
    for _ in count..5 {
        q *= 3;
    }
    (q * 256).div_ceil(243) as u8
}

/// A weight's trit: `round(x / d) + 1` (ties away from zero, as `lroundf`). `|x / d| ≤ 1`
/// for finite rows; the clamp keeps non-finite ones (unchecked activations) in range.
#[inline]
fn to_trit(x: f32, id: f32) -> u8 {
    ((x * id).round().clamp(-1.0, 1.0) as i32 + 1) as u8
}

/// The largest magnitude of a super-block (its scale) and its inverse.
fn scale_of(x: &[f32]) -> (f32, f32) {
    let d = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// Lane `k`: `Σ t·a` over elements `4k..4k + 4` of every 32-element run, less the sum of
/// run `k`'s activations.
#[inline]
fn lanes_of(trits: &[u8; QK_K], act: &BlockQ8K) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (e, (&t, &a)) in trits.iter().zip(&act.qs).enumerate() {
        lanes[(e % 32) / 4] += t as i32 * a as i32;
    }
    for (k, lane) in lanes.iter_mut().enumerate() {
        *lane -= act.bsums[2 * k] as i32 + act.bsums[2 * k + 1] as i32;
    }
    lanes
}

fn dequantize_trits(trits: &[u8; QK_K], d: f16, out: &mut [f32]) {
    let d = d.to_f32();
    for (o, &t) in out[..QK_K].iter_mut().zip(trits) {
        *o = (t as i32 - 1) as f32 * d;
    }
}

impl BlockTQ1_0 {
    /// The 256 trits in element order: five per `qs` byte (bytes 0..32 give elements
    /// `32n + m`, bytes 32..48 elements `160 + 16n + m`), four per `qh` byte (`240 + 4n + j`).
    pub fn trits(&self) -> [u8; QK_K] {
        let mut t = [0u8; QK_K];
        for n in 0..5 {
            for m in 0..32 {
                t[32 * n + m] = trit(self.qs[m], n);
            }
            for m in 0..16 {
                t[160 + 16 * n + m] = trit(self.qs[32 + m], n);
            }
        }
        for n in 0..4 {
            for j in 0..4 {
                t[240 + 4 * n + j] = trit(self.qh[j], n);
            }
        }
        t
    }
}

impl QuantBlock for BlockTQ1_0 {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_trits(&self.trits(), self.d, out);
    }

    /// ggml's `quantize_row_tq1_0_ref`: `d` is the largest magnitude, each weight the trit
    /// nearest `x / d`.
    fn quantize_ref(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let (d, id) = scale_of(x);
        let mut b = BlockTQ1_0 { qs: [0; 48], qh: [0; 4], d: f16::from_f32(d) };
        for m in 0..32 {
            b.qs[m] = trit_byte((0..5).map(|n| to_trit(x[32 * n + m], id)), 5);
        }
        for m in 0..16 {
            b.qs[32 + m] = trit_byte((0..5).map(|n| to_trit(x[160 + 16 * n + m], id)), 5);
        }
        for j in 0..4 {
            b.qh[j] = trit_byte((0..4).map(|n| to_trit(x[240 + 4 * n + j], id)), 4);
        }
        b
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        self.lanes_value(act)
    }
}

impl BlockTQ2_0 {
    /// The 256 2-bit values in element order: bits `2l` of byte `m` of run `j` hold element
    /// `128j + 32l + m`.
    pub fn trits(&self) -> [u8; QK_K] {
        std::array::from_fn(|e| (self.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3)
    }
}

impl QuantBlock for BlockTQ2_0 {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_trits(&self.trits(), self.d, out);
    }

    /// ggml's `quantize_row_tq2_0_ref`: `d` is the largest magnitude, each weight the trit
    /// nearest `x / d`.
    fn quantize_ref(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let (d, id) = scale_of(x);
        let mut b = BlockTQ2_0 { qs: [0; QK_K / 4], d: f16::from_f32(d) };
        for (e, &v) in x.iter().enumerate() {
            b.qs[32 * (e / 128) + e % 32] |= to_trit(v, id) << (2 * ((e % 128) / 32));
        }
        b
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        self.lanes_value(act)
    }
}

/// What both ternary formats share: their dot is [`EightLanes`] over their trits.
macro_rules! trit_lanes {
    ($($t:ty),*) => {$(
        impl EightLanes for $t {
            fn lanes(&self, act: &BlockQ8K) -> [i32; 8] {
                lanes_of(&self.trits(), act)
            }

            fn scale(&self) -> f32 {
                self.d.to_f32()
            }
        }
    )*};
}

trit_lanes!(BlockTQ1_0, BlockTQ2_0);

#[cfg(test)]
mod tests {
    use super::*;

    fn ternary(seed: u32) -> Vec<f32> {
        (0..QK_K as u32).map(|i| [-0.5f32, 0.0, 0.5][((i * 7 + seed) % 3) as usize] * (1.0 + 0.1 * ((i % 3) as f32))).collect()
    }

    #[test]
    fn ternary_weights_round_trip_exactly() {
        // Values that are exactly d · {−1, 0, 1} come back as they were.
        let x: Vec<f32> = (0..QK_K as u32).map(|i| [-0.25f32, 0.0, 0.25][((i * 7 + i / 5) % 3) as usize]).collect();
        let mut y = vec![0f32; QK_K];
        BlockTQ1_0::quantize_ref(&x).dequantize(&mut y);
        assert_eq!(x, y);
        BlockTQ2_0::quantize_ref(&x).dequantize(&mut y);
        assert_eq!(x, y);
    }

    #[test]
    fn every_five_trit_byte_reads_back() {
        for q in 0..243u16 {
            let digits: Vec<u8> = (0..5).rev().map(|p| (q / 3u16.pow(p) % 3) as u8).collect();
            let byte = trit_byte(digits.iter().copied(), 5);
            let back: Vec<u8> = (0..5).map(|n| trit(byte, n)).collect();
            assert_eq!(back, digits, "{q}");
        }
    }

    #[test]
    fn dots_equal_the_dequantized_sums() {
        let w = ternary(1);
        let a: Vec<f32> = (0..QK_K).map(|i| ((i as f32 * 0.37).sin() * 1.3) * 0.1).collect();
        let ab = BlockQ8K::quantize_ref(&a);
        let mut ad = vec![0f32; QK_K];
        ab.dequantize(&mut ad);
        let check = |wd: &[f32], got: f32| {
            let exact: f32 = wd.iter().zip(&ad).map(|(x, y)| x * y).sum();
            assert!((got - exact).abs() <= 1e-4 * exact.abs().max(1e-3), "{got} vs {exact}");
        };
        let mut wd = vec![0f32; QK_K];
        let b1 = BlockTQ1_0::quantize_ref(&w);
        b1.dequantize(&mut wd);
        check(&wd, b1.dot(&ab));
        let b2 = BlockTQ2_0::quantize_ref(&w);
        b2.dequantize(&mut wd);
        check(&wd, b2.dot(&ab));
    }
}
