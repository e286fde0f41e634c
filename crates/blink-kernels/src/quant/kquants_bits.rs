//! The bit layout of the k-quant super-blocks (`Q2_K`..`Q6_K`), both ways: reading quants
//! and 6-bit scales out of a block, and packing them in. The dot products and dequantizers
//! ([`super::kquants`]) read through it, the quantizers ([`super::kquants_quantize`])
//! write through it, and neither needs the other.
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

use std::array::from_fn;

use blink_gguf::QK_K;

use super::blocks::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, K_SCALE_SIZE};

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

/// The eight `(scales, mins)` of packed `Q4_K`/`Q5_K` scales (see [`scale_min_k4`]).
#[inline]
pub fn unpack_scales_mins(packed: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let pairs: [(u8, u8); 8] = from_fn(|j| scale_min_k4(packed, j));
    (pairs.map(|p| p.0), pairs.map(|p| p.1))
}

impl BlockQ2K {
    /// The 256 quants (0..=3) in element order.
    #[inline]
    pub fn quants(&self) -> [i8; QK_K] {
        from_fn(|e| two_bits(&self.qs, e) as i8)
    }
}

impl BlockQ3K {
    /// The 256 quants (-4..=3) in element order.
    #[inline]
    pub fn quants(&self) -> [i8; QK_K] {
        from_fn(|e| two_bits(&self.qs, e) as i8 - if high_bit(&self.hmask, e) == 1 { 0 } else { 4 })
    }
}

impl BlockQ4K {
    /// The 256 quants (0..=15) in element order.
    #[inline]
    pub fn quants(&self) -> [i8; QK_K] {
        from_fn(|e| nibble(&self.qs, e) as i8)
    }

    /// The eight 6-bit `(scales, mins)`.
    #[inline]
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        unpack_scales_mins(&self.scales)
    }
}

impl BlockQ5K {
    /// The 256 quants (0..=31) in element order.
    #[inline]
    pub fn quants(&self) -> [i8; QK_K] {
        from_fn(|e| (nibble(&self.qs, e) | (high_bit(&self.qh, e) << 4)) as i8)
    }

    /// The eight 6-bit `(scales, mins)`.
    #[inline]
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        unpack_scales_mins(&self.scales)
    }
}

impl BlockQ6K {
    /// The 256 quants (-32..=31) in element order.
    #[inline]
    pub fn quants(&self) -> [i8; QK_K] {
        from_fn(|e| {
            let (chunk, l, quarter) = (e / 128, e % 32, (e % 128) / 32);
            let low = (self.ql[64 * chunk + l + 32 * (quarter & 1)] >> (4 * (quarter >> 1))) & 0x0f;
            let high = (self.qh[32 * chunk + l] >> (2 * quarter)) & 3;
            (low | (high << 4)) as i8 - 32
        })
    }
}

/// Pack 256 2-bit levels: byte `32c + i` holds elements `128c + i + 32k` in bits `2k`.
pub fn pack_2bit(levels: &[u8; QK_K]) -> [u8; QK_K / 4] {
    from_fn(|b| {
        let base = 128 * (b / 32) + b % 32;
        (0..4).fold(0u8, |acc, k| acc | ((levels[base + 32 * k] & 3) << (2 * k)))
    })
}

/// Pack 256 4-bit levels: byte `32c + i` holds elements `64c + i` (low) and `64c + i + 32`.
pub fn pack_4bit(levels: &[u8; QK_K]) -> [u8; QK_K / 2] {
    from_fn(|b| {
        let base = 64 * (b / 32) + b % 32;
        (levels[base] & 0x0f) | ((levels[base + 32] & 0x0f) << 4)
    })
}

/// Pack the high bits of 256 levels: bit `e/32` of byte `e%32` is bit `shift` of level `e`.
pub fn pack_high_bits(levels: &[u8; QK_K], shift: u32) -> [u8; QK_K / 8] {
    let mut bits = [0u8; QK_K / 8];
    for (e, &l) in levels.iter().enumerate() {
        bits[e % 32] |= ((l >> shift) & 1) << (e / 32);
    }
    bits
}

/// Pack eight 6-bit scales and mins into the 12-byte `Q4_K`/`Q5_K` layout (see
/// [`scale_min_k4`]).
pub fn pack_scales_mins(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut packed = [0u8; K_SCALE_SIZE];
    packed[..4].copy_from_slice(&scales[..4]);
    packed[4..8].copy_from_slice(&mins[..4]);
    for j in 4..8 {
        packed[j + 4] = (scales[j] & 0x0f) | ((mins[j] & 0x0f) << 4);
        packed[j - 4] |= (scales[j] >> 4) << 6;
        packed[j] |= (mins[j] >> 4) << 6;
    }
    packed
}

/// Pack sixteen 6-bit (already offset by 32) `Q3_K` scales (see [`q3_scales`]).
pub fn pack_q3_scales(scales: &[u8; 16]) -> [u8; K_SCALE_SIZE] {
    let mut packed = [0u8; K_SCALE_SIZE];
    for (j, &s) in scales.iter().enumerate() {
        packed[j % 8] |= (s & 0x0f) << (4 * (j / 8));
        packed[8 + j % 4] |= ((s >> 4) & 3) << (2 * (j / 4));
    }
    packed
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
        let packed = pack_scales_mins(&sc, &mn);
        let (s2, m2) = unpack_scales_mins(&packed);
        assert_eq!((s2, m2), (sc, mn));
    }

    #[test]
    fn q3_k_scales_round_trip() {
        let want: [i8; 16] = from_fn(|j| (j as i8 * 4) - 32);
        let packed = pack_q3_scales(&want.map(|s| (s + 32) as u8));
        assert_eq!(q3_scales(&packed), want);
    }

    #[test]
    fn packers_invert_unpackers() {
        let levels: [u8; QK_K] = from_fn(|e| (e * 7 % 64) as u8);
        let mut b = BlockQ5K::zeroed();
        let l5 = levels.map(|l| l & 31);
        b.qs = pack_4bit(&l5);
        b.qh = pack_high_bits(&l5, 4);
        assert_eq!(b.quants().map(|q| q as u8), l5);

        let mut b2 = BlockQ2K::zeroed();
        let l2 = levels.map(|l| l & 3);
        b2.qs = pack_2bit(&l2);
        assert_eq!(b2.quants().map(|q| q as u8), l2);
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
