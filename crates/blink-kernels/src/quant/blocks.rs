//! The ggml quantized block layouts, byte for byte as they appear in GGUF files.
//!
//! Every block is `#[repr(C)]`, has no padding and accepts any bit pattern, so it can be
//! copied out of (and into) an arbitrary, possibly unaligned, little-endian byte slice.
//! Half-precision fields are [`half::f16`]; `Q8_K` keeps its scale as a plain `f32`.

use std::mem::size_of;

use blink_gguf::{GgmlType, QK_K};
use half::f16;

#[cfg(not(target_endian = "little"))]
compile_error!(
    "blink-kernels reads GGUF blocks in native byte order and needs a little-endian target"
);

/// Elements per block of the 32-element ("legacy") formats.
pub const QK32: usize = 32;

/// Bytes of packed 6-bit scales and mins in `Q4_K`/`Q5_K` (and of 6-bit scales in `Q3_K`).
pub const K_SCALE_SIZE: usize = 12;

/// A quantized block with a fixed byte layout.
///
/// # Safety
///
/// Implementors must be `#[repr(C)]`, contain no padding bytes, and be valid for every bit
/// pattern (only integer, `f16` and `f32` fields, or arrays of them).
pub unsafe trait Block: Copy + 'static {
    /// The ggml type this block encodes.
    const TYPE: GgmlType;
    /// Elements per block.
    const ELEMS: usize;
    /// Bytes per block.
    const BYTES: usize = size_of::<Self>();

    /// A block of zero bytes.
    fn zeroed() -> Self {
        // SAFETY: every bit pattern, including all zeros, is a valid `Self` (trait contract).
        unsafe { std::mem::zeroed() }
    }

    /// Copy a block out of the first `BYTES` bytes of `bytes` (any alignment).
    ///
    /// Panics if `bytes` is shorter than one block.
    #[inline]
    fn read(bytes: &[u8]) -> Self {
        let bytes = &bytes[..Self::BYTES];
        // SAFETY: `bytes` holds exactly `size_of::<Self>()` readable bytes, the read is
        // unaligned, and every bit pattern is a valid `Self` (trait contract).
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) }
    }

    /// The block's bytes, in file layout.
    #[inline]
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `Self` has no padding (trait contract), so all `size_of::<Self>()` bytes
        // behind `self` are initialised, and `u8` has no alignment requirement.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast::<u8>(), Self::BYTES) }
    }

    /// Write the block into the first `BYTES` bytes of `out`.
    ///
    /// Panics if `out` is shorter than one block.
    #[inline]
    fn write(&self, out: &mut [u8]) {
        out[..Self::BYTES].copy_from_slice(self.as_bytes());
    }
}

/// The blocks of a byte row, copied out one at a time. Trailing bytes short of a whole block
/// are ignored (callers check lengths first).
#[inline]
pub fn read_blocks<B: Block>(bytes: &[u8]) -> impl Iterator<Item = B> + '_ {
    bytes.chunks_exact(B::BYTES).map(B::read)
}

/// `Q4_0`: 32 weights `d * (q - 8)`, 4-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles: byte `j` holds element `j` (low) and `j + 16` (high).
    pub qs: [u8; QK32 / 2],
}

/// `Q4_1`: 32 weights `d * q + m`, 4-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Offset (the block minimum).
    pub m: f16,
    /// Nibbles, packed as in [`BlockQ4_0`].
    pub qs: [u8; QK32 / 2],
}

/// `Q5_0`: 32 weights `d * (q - 16)`, 5-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits: bit `j` of this little-endian `u32` belongs to element `j`.
    pub qh: [u8; 4],
    /// Low nibbles, packed as in [`BlockQ4_0`].
    pub qs: [u8; QK32 / 2],
}

/// `Q5_1`: 32 weights `d * q + m`, 5-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Offset (the block minimum).
    pub m: f16,
    /// Fifth bits, as in [`BlockQ5_0`].
    pub qh: [u8; 4],
    /// Low nibbles, packed as in [`BlockQ4_0`].
    pub qs: [u8; QK32 / 2],
}

/// `Q8_0`: 32 values `d * q`, 8-bit signed `q`. Also the activation format for
/// `Q4_0`/`Q5_0`/`Q8_0` weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants.
    pub qs: [i8; QK32],
}

/// `Q8_1`: as [`BlockQ8_0`] plus `s = d * Σq`. The activation format for `Q4_1`/`Q5_1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * Σ qs`, computed with the unrounded `f32` scale.
    pub s: f16,
    /// Quants.
    pub qs: [i8; QK32],
}

/// `Q2_K`: 256 weights in 16 groups of 16, `d*sc*q - dmin*m` with 4-bit `sc`/`m`, 2-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ2K {
    /// Per group: scale in the low nibble, min in the high nibble.
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants; see `kquants` for the element order.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
}

/// `Q3_K`: 256 weights in 16 groups of 16, `d * (sc - 32) * q` with 6-bit `sc`, 3-bit signed `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ3K {
    /// High (third) bits; set means "no offset", clear means subtract 4.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the quants.
    pub qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales, packed.
    pub scales: [u8; K_SCALE_SIZE],
    /// Super-block scale.
    pub d: f16,
}

/// `Q4_K`: 256 weights in 8 groups of 32, `d*sc*q - dmin*m` with 6-bit `sc`/`m`, 4-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; K_SCALE_SIZE],
    /// 4-bit quants.
    pub qs: [u8; QK_K / 2],
}

/// `Q5_K`: as [`BlockQ4K`] with a fifth quant bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; K_SCALE_SIZE],
    /// Fifth bits.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits.
    pub qs: [u8; QK_K / 2],
}

/// `Q6_K`: 256 weights in 16 groups of 16, `d * sc * (q - 32)` with 8-bit signed `sc`, 6-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    /// Low 4 bits.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits.
    pub qh: [u8; QK_K / 4],
    /// Per-group scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

/// `IQ4_NL`: 32 weights `d * KVALUES_IQ4NL[q]`, 4-bit `q` indexing a non-linear table
/// (low nibbles hold elements 0..16, high nibbles 16..32).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; QK32 / 2],
}

/// `IQ4_XS`: 256 weights in eight groups of 32, each `d * (ls - 32) * KVALUES_IQ4NL[q]`
/// with a 6-bit group scale `ls` (low four bits in `scales_l`, high two in `scales_h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ4XS {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

/// `MXFP4` (OCP microscaling FP4): 32 weights `2^(e−128) · KVALUES_MXFP4[q]`, an 8-bit
/// power-of-two exponent `e` (E8M0, halved because the table holds doubled E2M1 values)
/// and 4-bit `q` (low nibbles: elements 0..16, high nibbles 16..32).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockMXFP4 {
    pub e: u8,
    pub qs: [u8; QK32 / 2],
}

/// `TQ1_0` (ternary, 1.69 bits a weight): 256 weights `d · (t − 1)`, trits `t ∈ {0, 1, 2}`
/// packed five to a byte (`qs`: elements 0..240) and four to a byte (`qh`: 240..256), each
/// byte a base-3 fraction scaled to 0..256 so a trit is the top of `byte · 3^n · 3`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockTQ1_0 {
    pub qs: [u8; 48],
    pub qh: [u8; 4],
    pub d: f16,
}

/// `TQ2_0` (ternary, 2.06 bits a weight): 256 weights `d · (t − 1)`, 2-bit `t` (byte `m` of
/// each 32-byte run holds elements `m`, `m + 32`, `m + 64`, `m + 96` of its 128).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockTQ2_0 {
    pub qs: [u8; QK_K / 4],
    pub d: f16,
}

/// `IQ2_XXS`: 256 weights in eight 32-element runs; per run two words: four 8-bit indices
/// into the eight-magnitude grid, then four 7-bit sign codes and a 4-bit scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ2XXS {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
}

/// `IQ2_XS`: 256 weights; per 8-element piece a 9-bit grid index and a 7-bit sign code,
/// per 16 elements a 4-bit scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ2XS {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; QK_K / 32],
}

/// `IQ2_S`: 256 weights; per 8-element piece a 10-bit grid index (low bits in `qs`, high in
/// `qh`) and a whole sign byte (`qs[32..]`), per 16 elements a 4-bit scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ2S {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}

/// `IQ3_XXS`: 256 weights; per 4-element piece an 8-bit index into the four-magnitude
/// grid, per 32-element run a word of four 7-bit sign codes and a 4-bit scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ3XXS {
    pub d: f16,
    pub qs: [u8; 3 * QK_K / 8],
}

/// `IQ3_S`: 256 weights; per 4-element piece a 9-bit grid index (low bits in `qs`, high in
/// `qh`), sign bytes per 8 elements, per 32-element run a 4-bit scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIQ3S {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}

/// `Q8_K`: 256 values `d * q` plus per-16 sums of `q`. The activation format of the k-quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    /// Scale (full `f32`).
    pub d: f32,
    /// Quants.
    pub qs: [i8; QK_K],
    /// `bsums[j] = Σ qs[16j..16j+16]`.
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(size_of::<BlockQ2K>() == 84);
const _: () = assert!(size_of::<BlockQ3K>() == 110);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ5K>() == 176);
const _: () = assert!(size_of::<BlockQ6K>() == 210);
const _: () = assert!(size_of::<BlockQ8K>() == 292);
const _: () = assert!(size_of::<BlockIQ4NL>() == 18);
const _: () = assert!(size_of::<BlockIQ4XS>() == 136);
const _: () = assert!(size_of::<BlockMXFP4>() == 17);
const _: () = assert!(size_of::<BlockTQ1_0>() == 54);
const _: () = assert!(size_of::<BlockTQ2_0>() == 66);
const _: () = assert!(size_of::<BlockIQ2XXS>() == 66);
const _: () = assert!(size_of::<BlockIQ2XS>() == 74);
const _: () = assert!(size_of::<BlockIQ2S>() == 82);
const _: () = assert!(size_of::<BlockIQ3XXS>() == 98);
const _: () = assert!(size_of::<BlockIQ3S>() == 110);

macro_rules! impl_block {
    ($($ty:ident => $gg:ident, $elems:expr;)*) => {$(
        // SAFETY: `#[repr(C)]`, fields are integers/f16/f32 (any bit pattern valid), and the
        // size assertions above equal the sum of the field sizes, so there is no padding.
        unsafe impl Block for $ty {
            const TYPE: GgmlType = GgmlType::$gg;
            const ELEMS: usize = $elems;
        }
    )*};
}

impl_block! {
    BlockQ4_0 => Q4_0, QK32;
    BlockQ4_1 => Q4_1, QK32;
    BlockQ5_0 => Q5_0, QK32;
    BlockQ5_1 => Q5_1, QK32;
    BlockQ8_0 => Q8_0, QK32;
    BlockQ8_1 => Q8_1, QK32;
    BlockQ2K => Q2_K, QK_K;
    BlockQ3K => Q3_K, QK_K;
    BlockQ4K => Q4_K, QK_K;
    BlockQ5K => Q5_K, QK_K;
    BlockQ6K => Q6_K, QK_K;
    BlockQ8K => Q8_K, QK_K;
    BlockIQ4NL => IQ4_NL, QK32;
    BlockIQ4XS => IQ4_XS, QK_K;
    BlockMXFP4 => MXFP4, QK32;
    BlockTQ1_0 => TQ1_0, QK_K;
    BlockTQ2_0 => TQ2_0, QK_K;
    BlockIQ2XXS => IQ2_XXS, QK_K;
    BlockIQ2XS => IQ2_XS, QK_K;
    BlockIQ2S => IQ2_S, QK_K;
    BlockIQ3XXS => IQ3_XXS, QK_K;
    BlockIQ3S => IQ3_S, QK_K;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<B: Block>() {
        assert_eq!(B::BYTES, B::TYPE.type_size(), "{}", B::TYPE);
        assert_eq!(B::ELEMS, B::TYPE.block_size(), "{}", B::TYPE);
        assert_eq!(
            B::TYPE.row_bytes(4 * B::ELEMS as u64),
            Some(4 * B::BYTES as u64)
        );
    }

    #[test]
    fn block_geometry_matches_ggml_types() {
        check::<BlockQ4_0>();
        check::<BlockQ4_1>();
        check::<BlockQ5_0>();
        check::<BlockQ5_1>();
        check::<BlockQ8_0>();
        check::<BlockQ8_1>();
        check::<BlockQ2K>();
        check::<BlockQ3K>();
        check::<BlockQ4K>();
        check::<BlockQ5K>();
        check::<BlockQ6K>();
        check::<BlockQ8K>();
        check::<BlockMXFP4>();
        check::<BlockTQ1_0>();
        check::<BlockTQ2_0>();
        check::<BlockIQ2XXS>();
        check::<BlockIQ2XS>();
        check::<BlockIQ2S>();
        check::<BlockIQ3XXS>();
        check::<BlockIQ3S>();
    }

    #[test]
    fn read_write_round_trip_unaligned() {
        let bytes: Vec<u8> = (0..=BlockQ8K::BYTES as u32)
            .map(|i| (i * 37 + 11) as u8)
            .collect();
        // Offset by one byte so the f32 field is misaligned.
        let b = BlockQ8K::read(&bytes[1..]);
        assert_eq!(
            b.d.to_bits(),
            u32::from_le_bytes(bytes[1..5].try_into().unwrap())
        );
        assert_eq!(
            b.bsums[15],
            i16::from_le_bytes([bytes[1 + 290], bytes[1 + 291]])
        );
        let mut out = vec![0u8; BlockQ8K::BYTES];
        b.write(&mut out);
        assert_eq!(out, bytes[1..1 + BlockQ8K::BYTES]);
        assert_eq!(BlockQ4_1::zeroed().as_bytes(), &[0u8; 20]);
    }
}
