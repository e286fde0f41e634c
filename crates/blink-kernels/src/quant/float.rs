//! The unquantized element types `F32`, `F16` and `BF16`: conversion and dot products.
//!
//! Conversions to the 16-bit formats round to nearest, ties to even, exactly as ggml's
//! `ggml_compute_fp32_to_fp16` / `ggml_compute_fp32_to_bf16` (NaN stays NaN, quietened).
//! `F32`/`F16` weight dots follow ggml's AVX-512 order ([`dot_lanes16`]); `BF16` follows
//! ggml's AVX-512F order without the BF16 extension ([`dot_lanes16_unfused`]). These are
//! the AVX-512 build's in both flavours (the SIMD products of float weights, in `gemm`,
//! have that order only); the f32 dots a model makes outside the products (an f32
//! router's) take the flavour's order ([`dot_f32_in`], [`dot_f32_sgemm`]).

use super::reduce::{dot_float, dot_lanes16, dot_lanes16_unfused, hsum16, hsum8, Tail};
use crate::flavour::Flavour;
use half::f16;

/// Round an `f32` to the nearest `bf16` (ties to even), as bits. NaNs are forced quiet.
#[inline]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    ((bits as u64 + round as u64) >> 16) as u16
}

/// Widen `bf16` bits to `f32` (exact).
#[inline]
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Round an `f32` to the nearest `f16` (ties to even), as bits.
#[inline]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// Widen `f16` bits to `f32` (exact).
#[inline]
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

fn words<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    bytes
        .chunks_exact(N)
        .map(|c| c.try_into().expect("chunks_exact yields N bytes"))
}

/// `F32` bytes to floats.
pub fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (w, out) in words::<4>(src).zip(dst.iter_mut()) {
        *out = f32::from_le_bytes(w);
    }
}

/// `F16` bytes to floats.
pub fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (w, out) in words::<2>(src).zip(dst.iter_mut()) {
        *out = f16_bits_to_f32(u16::from_le_bytes(w));
    }
}

/// `BF16` bytes to floats.
pub fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (w, out) in words::<2>(src).zip(dst.iter_mut()) {
        *out = bf16_bits_to_f32(u16::from_le_bytes(w));
    }
}

/// Floats to `F32` bytes.
pub fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.iter().zip(dst.chunks_exact_mut(4)) {
        out.copy_from_slice(&x.to_le_bytes());
    }
}

/// Floats to `F16` bytes.
pub fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
        out.copy_from_slice(&f32_to_f16_bits(*x).to_le_bytes());
    }
}

/// Floats to `BF16` bytes.
pub fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
        out.copy_from_slice(&f32_to_bf16_bits(*x).to_le_bytes());
    }
}

/// Element `i` of an f32 row's bytes.
#[inline(always)]
fn f32_at(bytes: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap())
}

/// Dot product of two `F32` rows of `n` elements (an `F32` weight matrix's product), in
/// ggml's AVX-512 order, the elements past the last 64-element step added with an FMA
/// each ([`Tail::Fused`], as the SIMD products end).
pub fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_lanes16(n, |i| f32_at(w, i), |i| f32_at(a, i), Tail::Fused)
}

/// Dot product of two `F32` rows of `n` elements exactly as `flavour`'s
/// `ggml_vec_dot_f32`.
pub fn dot_f32_in(flavour: Flavour, n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_float(flavour, n, |i| f32_at(w, i), |i| f32_at(a, i), Tail::F32)
}

/// Dot product of two f32 rows in the order of llama.cpp's `llamafile_sgemm` (tinyBLAS),
/// which its x86 builds run for f32 matrices multiplied by a batch of two rows or more:
/// one FMA accumulator of the build's vector width (16 lanes for AVX-512, reduced as
/// `_mm512_reduce_add_ps`; 8 for AVX2, reduced as `hsum_float_8`). Rows whose length is
/// not a multiple of the width go to ggml's `vec_dot` there, so to [`dot_f32_in`] here.
pub fn dot_f32_sgemm(flavour: Flavour, n: usize, w: &[u8], a: &[u8]) -> f32 {
    match flavour {
        Flavour::Avx512 if n.is_multiple_of(16) => hsum16(&sgemm_lanes(n, w, a)),
        Flavour::Avx2 if n.is_multiple_of(8) => hsum8(&sgemm_lanes(n, w, a)),
        _ => dot_f32_in(flavour, n, w, a),
    }
}

/// tinyBLAS's accumulator of `L` lanes over two f32 rows: lane `i` sums the products of
/// elements `i`, `i + L`, … with one FMA each.
fn sgemm_lanes<const L: usize>(n: usize, w: &[u8], a: &[u8]) -> [f32; L] {
    let mut acc = [0f32; L];
    for l in (0..n).step_by(L) {
        for (i, acc) in acc.iter_mut().enumerate() {
            *acc = f32_at(w, l + i).mul_add(f32_at(a, l + i), *acc);
        }
    }
    acc
}

/// Dot product of two `F16` rows of `n` elements, in ggml's AVX-512 order.
pub fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let at = |bytes: &[u8], i: usize| f16_bits_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]));
    dot_lanes16(n, |i| at(w, i), |i| at(a, i), Tail::F64)
}

/// Dot product of two `BF16` rows of `n` elements, in ggml's AVX-512F order (two 16-lane
/// accumulators of unfused products, combined in `f64`).
pub fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let at = |bytes: &[u8], i: usize| bf16_bits_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]));
    dot_lanes16_unfused(n, |i| at(w, i), |i| at(a, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0).
        assert_eq!(f32_to_bf16_bits(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3*2^-8 is halfway too; the even neighbour is above.
        assert_eq!(f32_to_bf16_bits(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(f32_to_bf16_bits(1.0 + 1.0 / 256.0 + 1.0 / 65536.0), 0x3f81);
        assert_eq!(f32_to_bf16_bits(-2.5), 0xc020);
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7f80);
        assert_eq!(
            f32_to_bf16_bits(f32::MAX),
            0x7f80,
            "overflow rounds to infinity"
        );
        let nan = f32_to_bf16_bits(f32::from_bits(0x7f80_0001));
        assert!(bf16_bits_to_f32(nan).is_nan());
        assert_eq!(bf16_bits_to_f32(0x4049), 3.140625);
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
        assert_eq!(f32_to_f16_bits(1.0 + 1.0 / 2048.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 / 2048.0), 0x3c02);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00, "rounds up to infinity");
        assert_eq!(f16_bits_to_f32(0x0001), 2f32.powi(-24));
    }

    #[test]
    fn float_dots() {
        let w: Vec<f32> = vec![1.5, -2.0, 0.25, 8.0];
        let a: Vec<f32> = vec![2.0, 0.5, -4.0, 0.125];
        let mut wb = vec![0u8; 16];
        let mut ab = vec![0u8; 16];
        quantize_f32(&w, &mut wb);
        quantize_f32(&a, &mut ab);
        assert_eq!(dot_f32(4, &wb, &ab), 3.0 - 1.0 - 1.0 + 1.0);
        let (mut wh, mut ah) = (vec![0u8; 8], vec![0u8; 8]);
        quantize_f16(&w, &mut wh);
        quantize_f16(&a, &mut ah);
        assert_eq!(dot_f16(4, &wh, &ah), 2.0);
        quantize_bf16(&w, &mut wh);
        quantize_bf16(&a, &mut ah);
        assert_eq!(dot_bf16(3, &wh, &ah), 1.0);
    }
}
