//! The 32-element formats `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0` and `Q8_1`: dequantization,
//! ggml's reference weight quantizers, and dot products with `Q8_0`/`Q8_1` activations.
//!
//! Packing: byte `j` of `qs` holds element `j` in its low nibble and element `j + 16` in its
//! high nibble; the fifth bit of element `j` is bit `j` of the little-endian `qh` word.
//!
//! Dot products take each block's eight exact `i32` lane sums, its scale `d_w·d_a` and, for
//! the `_1` formats, `m_w·s_a`, and accumulate them in the order of the [`DotAcc`].

use half::f16;

use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK32};
use super::numeric::{absmax, min_max, signed_absmax, trunc_clamp};
use super::rows::{DotAcc, QuantBlock};

const HALF: usize = QK32 / 2;

/// The two 4-bit quants of byte `j`: elements `j` and `j + 16`.
#[inline]
fn nibbles(b: u8) -> (i32, i32) {
    ((b & 0x0f) as i32, (b >> 4) as i32)
}

/// The fifth bits of elements `j` and `j + 16`, already shifted to value 16.
#[inline]
fn high_bits(qh: u32, j: usize) -> (i32, i32) {
    (
        (((qh >> j) & 1) << 4) as i32,
        (((qh >> (j + HALF)) & 1) << 4) as i32,
    )
}

/// Pack 32 quants of up to 5 bits into low nibbles and a fifth-bit word.
fn pack5(q: &[u8; QK32]) -> ([u8; HALF], [u8; 4]) {
    let mut qs = [0u8; HALF];
    let mut qh = 0u32;
    for j in 0..HALF {
        let (lo, hi) = (q[j], q[j + HALF]);
        qs[j] = (lo & 0x0f) | ((hi & 0x0f) << 4);
        qh |= ((lo as u32 >> 4) & 1) << j;
        qh |= ((hi as u32 >> 4) & 1) << (j + HALF);
    }
    (qs, qh.to_le_bytes())
}

/// Pack 32 4-bit quants into nibbles.
fn pack4(q: &[u8; QK32]) -> [u8; HALF] {
    std::array::from_fn(|j| q[j] | (q[j + HALF] << 4))
}

/// The eight lane sums of a block: lane `l` is `Σ q_w[e]·q_a[e]` for `e` in `4l..4l+4`,
/// where element `e`'s weight quant is `weight(e)`.
#[inline]
fn int_lanes(a: &[i8; QK32], weight: impl Fn(usize) -> i32) -> [i32; 8] {
    std::array::from_fn(|l| (4 * l..4 * l + 4).map(|e| weight(e) * a[e] as i32).sum())
}

/// Element `e` of a nibble-packed block (`e < 16`: low nibble of byte `e`).
#[inline]
fn nibble_at(qs: &[u8; HALF], e: usize) -> i32 {
    if e < HALF {
        (qs[e] & 0x0f) as i32
    } else {
        (qs[e - HALF] >> 4) as i32
    }
}

/// The fifth bit of element `e`, as value 16.
#[inline]
fn high_bit_at(qh: u32, e: usize) -> i32 {
    (((qh >> e) & 1) << 4) as i32
}

/// Symmetric 4/5-bit quantizer of ggml (`Q4_0`: `nmax = 8`, `Q5_0`: `nmax = 16`): the
/// signed extreme maps to `-nmax`, quants are `trunc(x/d + nmax + 0.5)` clamped.
fn quantize_symmetric(x: &[f32], nmax: f32, qmax: u8) -> (f16, [u8; QK32]) {
    let (max, _) = signed_absmax(&x[..QK32]);
    let d = max / -nmax;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = std::array::from_fn(|j| trunc_clamp(x[j] * id + (nmax + 0.5), qmax));
    (f16::from_f32(d), q)
}

/// Asymmetric 4/5-bit quantizer of ggml: `d = (max - min)/qmax`, `m = min`,
/// quants are `trunc((x - min)/d + 0.5)` clamped.
fn quantize_affine(x: &[f32], qmax: u8) -> (f16, f16, [u8; QK32]) {
    let (min, max) = min_max(&x[..QK32]);
    let d = (max - min) / qmax as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = std::array::from_fn(|j| trunc_clamp((x[j] - min) * id + 0.5, qmax));
    (f16::from_f32(d), f16::from_f32(min), q)
}

/// ggml's reference 8-bit quantizer: `d = amax/127`, `q = roundf(x/d)` (ties away from zero).
fn quantize_q8_ref(x: &[f32]) -> (f32, [i8; QK32]) {
    let amax = absmax(&x[..QK32]);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, std::array::from_fn(|j| (x[j] * id).round() as i8))
}

impl QuantBlock for BlockQ4_0 {
    type Act = BlockQ8_0;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, &b) in self.qs.iter().enumerate() {
            let (lo, hi) = nibbles(b);
            out[j] = (lo - 8) as f32 * d;
            out[j + HALF] = (hi - 8) as f32 * d;
        }
    }

    fn quantize_ref(x: &[f32]) -> Self {
        let (d, q) = quantize_symmetric(x, 8.0, 15);
        BlockQ4_0 { d, qs: pack4(&q) }
    }

    /// One order only: llama.cpp's x86 build repacks `Q4_0` matrices (`q4_0_8x8`), whose
    /// kernels add each block's whole integer sum with one FMA.
    #[inline]
    fn accumulate(&self, act: &BlockQ8_0, acc: &mut DotAcc) {
        let sums = int_lanes(&act.qs, |e| nibble_at(&self.qs, e) - 8);
        acc.add_block_sum(self.d.to_f32() * act.d.to_f32(), sums.iter().sum());
    }
}

impl QuantBlock for BlockQ4_1 {
    type Act = BlockQ8_1;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (j, &b) in self.qs.iter().enumerate() {
            let (lo, hi) = nibbles(b);
            out[j] = lo as f32 * d + m;
            out[j + HALF] = hi as f32 * d + m;
        }
    }

    fn quantize_ref(x: &[f32]) -> Self {
        let (d, m, q) = quantize_affine(x, 15);
        BlockQ4_1 {
            d,
            m,
            qs: pack4(&q),
        }
    }

    #[inline]
    fn accumulate(&self, act: &BlockQ8_1, acc: &mut DotAcc) {
        let sums = int_lanes(&act.qs, |e| nibble_at(&self.qs, e));
        acc.add_block(self.d.to_f32() * act.d.to_f32(), &sums);
        acc.add_min(self.m.to_f32(), act.s.to_f32());
    }
}

impl QuantBlock for BlockQ5_0 {
    type Act = BlockQ8_0;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let qh = u32::from_le_bytes(self.qh);
        for (j, &b) in self.qs.iter().enumerate() {
            let ((lo, hi), (hlo, hhi)) = (nibbles(b), high_bits(qh, j));
            out[j] = ((lo | hlo) - 16) as f32 * d;
            out[j + HALF] = ((hi | hhi) - 16) as f32 * d;
        }
    }

    fn quantize_ref(x: &[f32]) -> Self {
        let (d, q) = quantize_symmetric(x, 16.0, 31);
        let (qs, qh) = pack5(&q);
        BlockQ5_0 { d, qh, qs }
    }

    #[inline]
    fn accumulate(&self, act: &BlockQ8_0, acc: &mut DotAcc) {
        let qh = u32::from_le_bytes(self.qh);
        let sums = int_lanes(&act.qs, |e| (nibble_at(&self.qs, e) | high_bit_at(qh, e)) - 16);
        acc.add_block(self.d.to_f32() * act.d.to_f32(), &sums);
    }
}

impl QuantBlock for BlockQ5_1 {
    type Act = BlockQ8_1;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        let qh = u32::from_le_bytes(self.qh);
        for (j, &b) in self.qs.iter().enumerate() {
            let ((lo, hi), (hlo, hhi)) = (nibbles(b), high_bits(qh, j));
            out[j] = (lo | hlo) as f32 * d + m;
            out[j + HALF] = (hi | hhi) as f32 * d + m;
        }
    }

    fn quantize_ref(x: &[f32]) -> Self {
        let (d, m, q) = quantize_affine(x, 31);
        let (qs, qh) = pack5(&q);
        BlockQ5_1 { d, m, qh, qs }
    }

    #[inline]
    fn accumulate(&self, act: &BlockQ8_1, acc: &mut DotAcc) {
        let qh = u32::from_le_bytes(self.qh);
        let sums = int_lanes(&act.qs, |e| nibble_at(&self.qs, e) | high_bit_at(qh, e));
        acc.add_block(self.d.to_f32() * act.d.to_f32(), &sums);
        acc.add_min(self.m.to_f32(), act.s.to_f32());
    }
}

impl QuantBlock for BlockQ8_0 {
    type Act = BlockQ8_0;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }

    /// ggml's `quantize_row_q8_0_ref` (used for `Q8_0` weight files). Activations use
    /// [`BlockQ8_0::quantize_activation`], which rounds differently.
    fn quantize_ref(x: &[f32]) -> Self {
        let (d, qs) = quantize_q8_ref(x);
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs,
        }
    }

    #[inline]
    fn accumulate(&self, act: &BlockQ8_0, acc: &mut DotAcc) {
        let sums = int_lanes(&act.qs, |e| self.qs[e] as i32);
        acc.add_block(self.d.to_f32() * act.d.to_f32(), &sums);
    }
}

/// `Q8_1` is an activation format; ggml has no `Q8_1 × Q8_1` kernel. This impl treats it
/// as a weight with itself as activation, ignoring `s` (it carries no weight information).
impl QuantBlock for BlockQ8_1 {
    type Act = BlockQ8_1;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }

    /// ggml's `quantize_row_q8_1_ref`; activations use [`BlockQ8_1::quantize_activation`].
    fn quantize_ref(x: &[f32]) -> Self {
        let (d, qs) = quantize_q8_ref(x);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        BlockQ8_1 {
            d: f16::from_f32(d),
            s: f16::from_f32(sum as f32 * d),
            qs,
        }
    }

    fn dot(&self, act: &BlockQ8_1) -> f32 {
        let sumi: i32 = self
            .qs
            .iter()
            .zip(&act.qs)
            .map(|(&w, &a)| w as i32 * a as i32)
            .sum();
        self.d.to_f32() * act.d.to_f32() * sumi as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_packs_low_then_high_half() {
        // x[j] = j - 16 spans -16..15; max |x| is at j = 0 (-16), so d = 2 and q = x/2 + 8.
        let x: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
        let b = BlockQ4_0::quantize_ref(&x);
        assert_eq!(b.d.to_f32(), 2.0);
        // Element 0 -> q 0, element 16 -> q 8 (x = 0): byte 0 = 0x80.
        assert_eq!(b.qs[0], 0x80);
        let mut y = [0f32; 32];
        b.dequantize(&mut y);
        for (j, (&a, &b)) in x.iter().zip(&y).enumerate() {
            assert!((a - b).abs() <= 1.0, "element {j}: {a} vs {b}");
        }
    }

    #[test]
    fn q5_1_high_bits_land_in_qh() {
        // Ramp 0..31: min 0, d = 1, q = j.
        let x: Vec<f32> = (0..32).map(|j| j as f32).collect();
        let b = BlockQ5_1::quantize_ref(&x);
        assert_eq!((b.d.to_f32(), b.m.to_f32()), (1.0, 0.0));
        // Elements 16..31 have bit 4 set: qh = 0xffff0000.
        assert_eq!(u32::from_le_bytes(b.qh), 0xffff_0000);
        let mut y = [0f32; 32];
        b.dequantize(&mut y);
        assert_eq!(y.to_vec(), x);
    }

    #[test]
    fn zero_block_quantizes_to_zero() {
        let x = [0f32; 32];
        let mut y = [1f32; 32];
        BlockQ4_0::quantize_ref(&x).dequantize(&mut y);
        assert_eq!(y, [0f32; 32]);
        BlockQ5_1::quantize_ref(&x).dequantize(&mut y);
        assert_eq!(y, [0f32; 32]);
        BlockQ8_0::quantize_ref(&x).dequantize(&mut y);
        assert_eq!(y, [0f32; 32]);
    }

    #[test]
    fn q8_ref_rounds_half_away_from_zero() {
        // amax = 127 gives d = 1: the 0.5 and -2.5 ties round away from zero.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = -2.5;
        let b = BlockQ8_0::quantize_ref(&x);
        assert_eq!(&b.qs[..3], &[127, 1, -3]);
        let b1 = BlockQ8_1::quantize_ref(&x);
        assert_eq!(b1.s.to_f32(), 125.0);
    }
}
