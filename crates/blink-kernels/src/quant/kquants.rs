//! The k-quants `Q2_K`..`Q6_K`: unpacking, dequantization and dot products with `Q8_K`.
//!
//! Element order inside a 256-element super-block (`e` = element index):
//! * 2-bit fields (`Q2_K`, low bits of `Q3_K`): byte `32·(e/128) + e%32` of `qs`, bits
//!   `2·((e%128)/32)`.
//! * `Q3_K` high bit: bit `e/32` of `hmask[e%32]`; set means the value is used as is,
//!   clear means 4 is subtracted (so quants span -4..=3).
//! * 4-bit fields (`Q4_K`, `Q5_K`): byte `32·(e/64) + e%32`, low nibble when `(e/32)` is
//!   even, high nibble otherwise; `Q5_K`'s fifth bit is bit `e/32` of `qh[e%32]`.
//! * `Q6_K`: low nibble from `ql[64·(e/128) + e%32 + 32·(q&1)]`, shifted by `4·(q>>1)`,
//!   where `q = (e%128)/32`; high 2 bits from `qh[32·(e/128) + e%32] >> 2q`; minus 32.
//!
//! Scales apply to groups of 16 (`Q2_K`, `Q3_K`, `Q6_K`) or 32 (`Q4_K`, `Q5_K`) elements.
//! Dot products follow ggml's `ggml_vec_dot_q*_K_q8_K`: exact `i32` sums of
//! `scale·Σ(q_w·q_a)` per super-block, mins folded in through the activation's `bsums`,
//! then `d_w·d_a·isum - dmin_w·d_a·summins` in `f32`.

use std::array::from_fn;

use blink_gguf::QK_K;

use super::blocks::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, K_SCALE_SIZE};
use super::kquants_quantize as kq;
use super::rows::QuantBlock;

/// The 2-bit field of element `e` in a `Q2_K`/`Q3_K` `qs` array.
#[inline]
fn two_bits(qs: &[u8; QK_K / 4], e: usize) -> u8 {
    (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3
}

/// The 4-bit field of element `e` in a `Q4_K`/`Q5_K` `qs` array.
#[inline]
fn nibble(qs: &[u8; QK_K / 2], e: usize) -> u8 {
    (qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0x0f
}

/// Bit `e/32` of `bits[e%32]`: the high bit of element `e` in `Q3_K`/`Q5_K`.
#[inline]
fn high_bit(bits: &[u8; QK_K / 8], e: usize) -> u8 {
    (bits[e % 32] >> (e / 32)) & 1
}

/// Scale and min of group `j` (0..8) from the packed 6-bit `Q4_K`/`Q5_K` scales: groups
/// 0..4 sit in the low 6 bits of bytes `j` and `j+4`; groups 4..8 keep their low 4 bits
/// in byte `j+4` and their top 2 bits in the spare bits 6..7 of bytes `j-4` and `j`.
#[inline]
pub fn scale_min_k4(scales: &[u8; K_SCALE_SIZE], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// The sixteen `Q3_K` scales, already offset to -32..=31: low 4 bits of scale `j` are
/// nibble `j/8` of byte `j%8`; the top 2 bits are bits `2·(j/4)` of byte `8 + j%4`.
#[inline]
pub fn q3_scales(scales: &[u8; K_SCALE_SIZE]) -> [i8; 16] {
    from_fn(|j| {
        let low = (scales[j % 8] >> (4 * (j / 8))) & 0x0f;
        let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// `Σ w[e]·a[e]` over each group of 16 elements.
#[inline]
fn group16_dots(w: &[i8; QK_K], a: &[i8; QK_K]) -> [i32; QK_K / 16] {
    from_fn(|g| {
        (16 * g..16 * g + 16)
            .map(|e| w[e] as i32 * a[e] as i32)
            .sum()
    })
}

/// `Σ bsums[j]·mins[j/2]`: the activation sums weighted by the per-32 mins.
#[inline]
fn mins_dot(act: &BlockQ8K, mins: &[u8; 8]) -> i32 {
    act.bsums
        .iter()
        .enumerate()
        .map(|(j, &s)| s as i32 * mins[j / 2] as i32)
        .sum()
}

impl BlockQ2K {
    /// The 256 quants (0..=3) in element order.
    pub fn quants(&self) -> [i8; QK_K] {
        from_fn(|e| two_bits(&self.qs, e) as i8)
    }
}

impl BlockQ3K {
    /// The 256 quants (-4..=3) in element order.
    pub fn quants(&self) -> [i8; QK_K] {
        from_fn(|e| two_bits(&self.qs, e) as i8 - if high_bit(&self.hmask, e) == 1 { 0 } else { 4 })
    }
}

impl BlockQ4K {
    /// The 256 quants (0..=15) in element order.
    pub fn quants(&self) -> [i8; QK_K] {
        from_fn(|e| nibble(&self.qs, e) as i8)
    }

    /// The eight 6-bit `(scales, mins)`.
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        unpack_scales_mins(&self.scales)
    }
}

impl BlockQ5K {
    /// The 256 quants (0..=31) in element order.
    pub fn quants(&self) -> [i8; QK_K] {
        from_fn(|e| (nibble(&self.qs, e) | (high_bit(&self.qh, e) << 4)) as i8)
    }

    /// The eight 6-bit `(scales, mins)`.
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        unpack_scales_mins(&self.scales)
    }
}

impl BlockQ6K {
    /// The 256 quants (-32..=31) in element order.
    pub fn quants(&self) -> [i8; QK_K] {
        from_fn(|e| {
            let (chunk, l, quarter) = (e / 128, e % 32, (e % 128) / 32);
            let low = (self.ql[64 * chunk + l + 32 * (quarter & 1)] >> (4 * (quarter >> 1))) & 0x0f;
            let high = (self.qh[32 * chunk + l] >> (2 * quarter)) & 3;
            (low | (high << 4)) as i8 - 32
        })
    }
}

fn unpack_scales_mins(packed: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let pairs: [(u8, u8); 8] = from_fn(|j| scale_min_k4(packed, j));
    (pairs.map(|p| p.0), pairs.map(|p| p.1))
}

/// Dequantize a `Q4_K`/`Q5_K` super-block: `(d·sc)·q - (dmin·m)` per group of 32.
fn dequantize_scale_min(
    d: f32,
    dmin: f32,
    scales: &[u8; K_SCALE_SIZE],
    q: &[i8; QK_K],
    out: &mut [f32],
) {
    for (j, (group, out)) in q.chunks_exact(32).zip(out.chunks_exact_mut(32)).enumerate() {
        let (sc, m) = scale_min_k4(scales, j);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        for (o, &v) in out.iter_mut().zip(group) {
            *o = dl * v as f32 - ml;
        }
    }
}

/// `Q4_K`/`Q5_K` dot with `Q8_K`.
fn dot_scale_min(
    d: f32,
    dmin: f32,
    scales: &[u8; K_SCALE_SIZE],
    q: &[i8; QK_K],
    act: &BlockQ8K,
) -> f32 {
    let (sc, mins) = unpack_scales_mins(scales);
    let g = group16_dots(q, &act.qs);
    let isum: i32 = (0..8)
        .map(|j| sc[j] as i32 * (g[2 * j] + g[2 * j + 1]))
        .sum();
    let summ = mins_dot(act, &mins);
    d * act.d * isum as f32 - dmin * act.d * summ as f32
}

impl QuantBlock for BlockQ2K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let q = self.quants();
        for ((&sc, group), out) in self
            .scales
            .iter()
            .zip(q.chunks_exact(16))
            .zip(out.chunks_exact_mut(16))
        {
            let (dl, ml) = (d * (sc & 0x0f) as f32, dmin * (sc >> 4) as f32);
            for (o, &v) in out.iter_mut().zip(group) {
                *o = dl * v as f32 - ml;
            }
        }
    }

    fn quantize_ref(x: &[f32]) -> Self {
        kq::quantize_q2_k(x)
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        let g = group16_dots(&self.quants(), &act.qs);
        let isum: i32 = self
            .scales
            .iter()
            .zip(&g)
            .map(|(&sc, &s)| (sc & 0x0f) as i32 * s)
            .sum();
        let summs: i32 = self
            .scales
            .iter()
            .zip(&act.bsums)
            .map(|(&sc, &b)| (sc >> 4) as i32 * b as i32)
            .sum();
        let dall = act.d * self.d.to_f32();
        let dmin = act.d * self.dmin.to_f32();
        dall * isum as f32 - dmin * summs as f32
    }
}

impl QuantBlock for BlockQ3K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let q = self.quants();
        for ((&sc, group), out) in q3_scales(&self.scales)
            .iter()
            .zip(q.chunks_exact(16))
            .zip(out.chunks_exact_mut(16))
        {
            let dl = d * sc as f32;
            for (o, &v) in out.iter_mut().zip(group) {
                *o = dl * v as f32;
            }
        }
    }

    fn quantize_ref(x: &[f32]) -> Self {
        kq::quantize_q3_k(x)
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        let g = group16_dots(&self.quants(), &act.qs);
        let isum: i32 = q3_scales(&self.scales)
            .iter()
            .zip(&g)
            .map(|(&sc, &s)| sc as i32 * s)
            .sum();
        self.d.to_f32() * act.d * isum as f32
    }
}

impl QuantBlock for BlockQ4K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_scale_min(
            self.d.to_f32(),
            self.dmin.to_f32(),
            &self.scales,
            &self.quants(),
            out,
        );
    }

    fn quantize_ref(x: &[f32]) -> Self {
        kq::quantize_q4_k(x)
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        dot_scale_min(
            self.d.to_f32(),
            self.dmin.to_f32(),
            &self.scales,
            &self.quants(),
            act,
        )
    }
}

impl QuantBlock for BlockQ5K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_scale_min(
            self.d.to_f32(),
            self.dmin.to_f32(),
            &self.scales,
            &self.quants(),
            out,
        );
    }

    fn quantize_ref(x: &[f32]) -> Self {
        kq::quantize_q5_k(x)
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        dot_scale_min(
            self.d.to_f32(),
            self.dmin.to_f32(),
            &self.scales,
            &self.quants(),
            act,
        )
    }
}

impl QuantBlock for BlockQ6K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let q = self.quants();
        for ((&sc, group), out) in self
            .scales
            .iter()
            .zip(q.chunks_exact(16))
            .zip(out.chunks_exact_mut(16))
        {
            let dl = d * sc as f32;
            for (o, &v) in out.iter_mut().zip(group) {
                *o = dl * v as f32;
            }
        }
    }

    fn quantize_ref(x: &[f32]) -> Self {
        kq::quantize_q6_k(x)
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        let g = group16_dots(&self.quants(), &act.qs);
        let isum: i32 = self
            .scales
            .iter()
            .zip(&g)
            .map(|(&sc, &s)| sc as i32 * s)
            .sum();
        self.d.to_f32() * act.d * isum as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::Block;

    #[test]
    fn q4_k_scale_packing_round_trips() {
        // Pack distinct 6-bit scales/mins the way the format describes, then unpack.
        let sc: [u8; 8] = [1, 22, 33, 44, 55, 63, 7, 40];
        let mn: [u8; 8] = [63, 2, 17, 30, 41, 9, 60, 0];
        let packed = kq::pack_scales_mins(&sc, &mn);
        let (s2, m2) = unpack_scales_mins(&packed);
        assert_eq!((s2, m2), (sc, mn));
    }

    #[test]
    fn q3_k_scales_round_trip() {
        let want: [i8; 16] = from_fn(|j| (j as i8 * 4) - 32);
        let packed = kq::pack_q3_scales(&want.map(|s| (s + 32) as u8));
        assert_eq!(q3_scales(&packed), want);
    }

    #[test]
    fn q6_k_quant_order() {
        // ql all 0x21 (low nibble 1, high nibble 2), qh = 0b11_10_01_00 per byte:
        // quarter 0 -> high 0, quarter 1 -> 1, quarter 2 -> 2, quarter 3 -> 3.
        let mut b = BlockQ6K::zeroed();
        b.ql = [0x21; 128];
        b.qh = [0b1110_0100; 64];
        let q = b.quants();
        assert_eq!(q[0], 1 - 32);
        assert_eq!(q[32], 1 + 16 - 32);
        assert_eq!(q[64], 2 + 32 - 32);
        assert_eq!(q[96], 2 + 48 - 32);
        assert_eq!(q[128 + 31], 1 - 32);
    }
}
