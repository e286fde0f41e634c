//! ggml's quantized block formats with scalar reference kernels: the numerical definition
//! every faster kernel is tested against.
//!
//! The numerics reproduce llama.cpp's CPU backend on x86: weights are multiplied by
//! activations that are first converted per row to the weight type's
//! [`activation_type`](WeightType::activation_type) (`Q8_0`, `Q8_1`, `Q8_K`, or the float
//! type itself), using the AVX2 rounding rules.
//! Integer partial sums are exact; float accumulation follows llama.cpp's x86 order for
//! the 32-element and float formats ([`reduce`]), so those dots are bit-identical to it.
//! The k-quants sum whole blocks sequentially (their own, documented order).
//!
//! Row functions take byte slices in GGUF layout (any alignment) and dispatch on
//! [`GgmlType`]. Length mismatches are caller bugs and panic, as documented per function.

mod activation;
#[cfg(target_arch = "x86_64")]
mod activation_x86;
pub mod blocks;
pub mod float;
mod iquants;
mod kquants;
mod kquants_bits;
mod kquants_quantize;
mod kquants_search;
mod lattice;
mod grids;
mod legacy;
mod mxfp4;
mod numeric;
mod ternary;
mod tiled;
pub mod reduce;
pub mod rows;

use blink_gguf::GgmlType;

use crate::order::DotOrder;

pub use blocks::{
    Block, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockTQ1_0, BlockTQ2_0, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
pub use iquants::KVALUES_IQ4NL;
pub use mxfp4::{e8m0_half, KVALUES_MXFP4};
pub(crate) use lattice::Lattice;
pub use kquants_bits::{q3_scales, scale_min_k4};
pub use rows::{DotAcc, QuantBlock};
pub use tiled::{takes_tiled, vec_dot_tiled, TiledBlock, TiledWeights};

/// Why [`quantize_weights`] refused its input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// The input length is not a whole number of blocks.
    #[error("{len} values are not a whole number of {ty} blocks of {block}")]
    PartialBlock {
        ty: GgmlType,
        len: usize,
        block: usize,
    },
    /// The output buffer does not have room for the quantized row.
    #[error("{ty} output needs {needed} bytes, buffer has {actual}")]
    OutputTooSmall {
        ty: GgmlType,
        needed: usize,
        actual: usize,
    },
    /// An input value is NaN or infinite.
    #[error("input value {index} is not finite ({value})")]
    NonFinite { index: usize, value: f32 },
}

/// What a weight type brings to a matrix product, as a property of the type itself:
/// `ty.activation_type()`. [`crate::gemm::MatRef`] answers the same for a matrix.
pub trait WeightType: Copy {
    /// The activation format this type's dot product consumes (llama.cpp's
    /// `vec_dot_type`): the [`QuantBlock::Act`] of its block, so each pairing is stated
    /// once, where the block's dot product is defined; the float types multiply their own
    /// type. `Q8_1` and `Q8_K` have no weight kernel in llama.cpp; here they pair with
    /// themselves.
    fn activation_type(self) -> GgmlType;
}

impl WeightType for GgmlType {
    #[inline]
    fn activation_type(self) -> GgmlType {
        fn act<B: QuantBlock>() -> GgmlType {
            <B::Act as Block>::TYPE
        }
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 => self,
            Q4_0 => act::<BlockQ4_0>(),
            Q4_1 => act::<BlockQ4_1>(),
            Q5_0 => act::<BlockQ5_0>(),
            Q5_1 => act::<BlockQ5_1>(),
            Q8_0 => act::<BlockQ8_0>(),
            Q8_1 => act::<BlockQ8_1>(),
            Q2_K => act::<BlockQ2K>(),
            Q3_K => act::<BlockQ3K>(),
            Q4_K => act::<BlockQ4K>(),
            Q5_K => act::<BlockQ5K>(),
            Q6_K => act::<BlockQ6K>(),
            Q8_K => act::<BlockQ8K>(),
            IQ4_NL => act::<BlockIQ4NL>(),
            IQ4_XS => act::<BlockIQ4XS>(),
            MXFP4 => act::<BlockMXFP4>(),
            TQ1_0 => act::<BlockTQ1_0>(),
            TQ2_0 => act::<BlockTQ2_0>(),
            IQ2_XXS => act::<BlockIQ2XXS>(),
            IQ2_XS => act::<BlockIQ2XS>(),
            IQ2_S => act::<BlockIQ2S>(),
            IQ3_XXS => act::<BlockIQ3XXS>(),
            IQ3_S => act::<BlockIQ3S>(),
        }
    }
}

/// Bytes of a row of `n` elements of `ty`. Panics if `n` is not a whole number of blocks.
fn row_bytes(ty: GgmlType, n: usize) -> usize {
    assert!(
        n.is_multiple_of(ty.block_size()),
        "{n} elements are not a whole number of {ty} blocks"
    );
    n / ty.block_size() * ty.type_size()
}

/// Dequantize the whole blocks in `src` (`n = src.len() / type_size · block_size`
/// elements) into `dst[..n]`. Supports every [`GgmlType`].
///
/// Panics if `src.len()` is not a multiple of `ty.type_size()` or `dst` is shorter than `n`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    assert!(
        src.len().is_multiple_of(ty.type_size()),
        "{} bytes are not a whole number of {ty} blocks",
        src.len()
    );
    let n = src.len() / ty.type_size() * ty.block_size();
    assert!(
        dst.len() >= n,
        "{ty}: {n} values do not fit in {}",
        dst.len()
    );
    let dst = &mut dst[..n];
    use GgmlType::*;
    match ty {
        F32 => float::dequantize_f32(src, dst),
        F16 => float::dequantize_f16(src, dst),
        BF16 => float::dequantize_bf16(src, dst),
        Q4_0 => rows::dequantize::<BlockQ4_0>(src, dst),
        Q4_1 => rows::dequantize::<BlockQ4_1>(src, dst),
        Q5_0 => rows::dequantize::<BlockQ5_0>(src, dst),
        Q5_1 => rows::dequantize::<BlockQ5_1>(src, dst),
        Q8_0 => rows::dequantize::<BlockQ8_0>(src, dst),
        Q8_1 => rows::dequantize::<BlockQ8_1>(src, dst),
        Q2_K => rows::dequantize::<BlockQ2K>(src, dst),
        Q3_K => rows::dequantize::<BlockQ3K>(src, dst),
        Q4_K => rows::dequantize::<BlockQ4K>(src, dst),
        Q5_K => rows::dequantize::<BlockQ5K>(src, dst),
        Q6_K => rows::dequantize::<BlockQ6K>(src, dst),
        Q8_K => rows::dequantize::<BlockQ8K>(src, dst),
        IQ4_NL => rows::dequantize::<BlockIQ4NL>(src, dst),
        IQ4_XS => rows::dequantize::<BlockIQ4XS>(src, dst),
        MXFP4 => rows::dequantize::<BlockMXFP4>(src, dst),
        TQ1_0 => rows::dequantize::<BlockTQ1_0>(src, dst),
        TQ2_0 => rows::dequantize::<BlockTQ2_0>(src, dst),
        IQ2_XXS => rows::dequantize::<BlockIQ2XXS>(src, dst),
        IQ2_XS => rows::dequantize::<BlockIQ2XS>(src, dst),
        IQ2_S => rows::dequantize::<BlockIQ2S>(src, dst),
        IQ3_XXS => rows::dequantize::<BlockIQ3XXS>(src, dst),
        IQ3_S => rows::dequantize::<BlockIQ3S>(src, dst),
    }
}

/// Quantize an `f32` activation row into `act_ty`, writing `act_ty.row_bytes(n)` bytes to
/// the front of `dst` (`n = src.len()`).
///
/// `F32`/`F16`/`BF16` convert (round to nearest even); `Q8_0`/`Q8_1` follow llama.cpp's x86
/// `quantize_row_q8_0`/`_q8_1`; `Q8_K` its `quantize_row_q8_K`. Any other type falls back
/// to the reference weight quantizer (as [`quantize_weights`], without its checks).
///
/// Panics if `n` is not a whole number of `act_ty` blocks or `dst` is too short.
pub fn quantize_row(act_ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    let bytes = row_bytes(act_ty, src.len());
    assert!(
        dst.len() >= bytes,
        "{act_ty}: {bytes} bytes do not fit in {}",
        dst.len()
    );
    let dst = &mut dst[..bytes];
    match act_ty {
        GgmlType::Q8_0 => rows::quantize_with(src, dst, BlockQ8_0::quantize_activation),
        GgmlType::Q8_1 => rows::quantize_with(src, dst, BlockQ8_1::quantize_activation),
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q8_K if activation_x86::quantize_row_q8_k(src, dst) => {}
        _ => quantize_ref(act_ty, src, dst),
    }
}

/// The reference (file) quantizer of every type; lengths already checked.
fn quantize_ref(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    use GgmlType::*;
    match ty {
        F32 => float::quantize_f32(src, dst),
        F16 => float::quantize_f16(src, dst),
        BF16 => float::quantize_bf16(src, dst),
        Q4_0 => rows::quantize_with(src, dst, BlockQ4_0::quantize_ref),
        Q4_1 => rows::quantize_with(src, dst, BlockQ4_1::quantize_ref),
        Q5_0 => rows::quantize_with(src, dst, BlockQ5_0::quantize_ref),
        Q5_1 => rows::quantize_with(src, dst, BlockQ5_1::quantize_ref),
        Q8_0 => rows::quantize_with(src, dst, BlockQ8_0::quantize_ref),
        Q8_1 => rows::quantize_with(src, dst, BlockQ8_1::quantize_ref),
        Q2_K => rows::quantize_with(src, dst, BlockQ2K::quantize_ref),
        Q3_K => rows::quantize_with(src, dst, BlockQ3K::quantize_ref),
        Q4_K => rows::quantize_with(src, dst, BlockQ4K::quantize_ref),
        Q5_K => rows::quantize_with(src, dst, BlockQ5K::quantize_ref),
        Q6_K => rows::quantize_with(src, dst, BlockQ6K::quantize_ref),
        Q8_K => rows::quantize_with(src, dst, BlockQ8K::quantize_ref),
        IQ4_NL => rows::quantize_with(src, dst, BlockIQ4NL::quantize_ref),
        IQ4_XS => rows::quantize_with(src, dst, BlockIQ4XS::quantize_ref),
        MXFP4 => rows::quantize_with(src, dst, BlockMXFP4::quantize_ref),
        TQ1_0 => rows::quantize_with(src, dst, BlockTQ1_0::quantize_ref),
        TQ2_0 => rows::quantize_with(src, dst, BlockTQ2_0::quantize_ref),
        IQ2_XXS => rows::quantize_with(src, dst, BlockIQ2XXS::quantize_ref),
        IQ2_XS => rows::quantize_with(src, dst, BlockIQ2XS::quantize_ref),
        IQ2_S => rows::quantize_with(src, dst, BlockIQ2S::quantize_ref),
        IQ3_XXS => rows::quantize_with(src, dst, BlockIQ3XXS::quantize_ref),
        IQ3_S => rows::quantize_with(src, dst, BlockIQ3S::quantize_ref),
    }
}

/// Dot product of one weight row (`w`, type `ty`, `n` elements) with one activation row
/// already quantized to `ty`'s [`activation_type`](WeightType::activation_type), in
/// llama.cpp's order. Allocation-free.
///
/// Panics if `n` is not a whole number of blocks of both types, or either slice is shorter
/// than its row.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    vec_dot_in(DotOrder::Llama, ty, n, w, act)
}

/// [`vec_dot`] in `order`.
pub fn vec_dot_in(order: DotOrder, ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let act_ty = ty.activation_type();
    let (w_bytes, act_bytes) = (row_bytes(ty, n), row_bytes(act_ty, n));
    assert!(
        w.len() >= w_bytes,
        "{ty} weights: need {w_bytes} bytes, have {}",
        w.len()
    );
    assert!(
        act.len() >= act_bytes,
        "{act_ty} activations: need {act_bytes} bytes, have {}",
        act.len()
    );
    let nb = n / ty.block_size();
    use GgmlType::*;
    match ty {
        F32 => float::dot_f32(n, w, act),
        F16 => float::dot_f16(n, w, act),
        BF16 => float::dot_bf16(n, w, act),
        Q4_0 => rows::vec_dot::<BlockQ4_0>(order, nb, w, act),
        Q4_1 => rows::vec_dot::<BlockQ4_1>(order, nb, w, act),
        Q5_0 => rows::vec_dot::<BlockQ5_0>(order, nb, w, act),
        Q5_1 => rows::vec_dot::<BlockQ5_1>(order, nb, w, act),
        Q8_0 => rows::vec_dot::<BlockQ8_0>(order, nb, w, act),
        Q8_1 => rows::vec_dot::<BlockQ8_1>(order, nb, w, act),
        Q2_K => rows::vec_dot::<BlockQ2K>(order, nb, w, act),
        Q3_K => rows::vec_dot::<BlockQ3K>(order, nb, w, act),
        Q4_K => kquants::vec_dot_q4_k(nb, w, act, false),
        Q5_K => rows::vec_dot::<BlockQ5K>(order, nb, w, act),
        Q6_K => kquants::vec_dot_q6_k(nb, w, act),
        Q8_K => rows::vec_dot::<BlockQ8K>(order, nb, w, act),
        IQ4_NL => rows::vec_dot::<BlockIQ4NL>(order, nb, w, act),
        IQ4_XS => rows::vec_dot_eight_lanes::<BlockIQ4XS>(nb, w, act),
        TQ1_0 => rows::vec_dot_eight_lanes::<BlockTQ1_0>(nb, w, act),
        TQ2_0 => rows::vec_dot_eight_lanes::<BlockTQ2_0>(nb, w, act),
        IQ2_XXS => rows::vec_dot_eight_lanes::<BlockIQ2XXS>(nb, w, act),
        IQ2_XS => rows::vec_dot_eight_lanes::<BlockIQ2XS>(nb, w, act),
        IQ2_S => rows::vec_dot_eight_lanes::<BlockIQ2S>(nb, w, act),
        IQ3_XXS => rows::vec_dot_eight_lanes::<BlockIQ3XXS>(nb, w, act),
        IQ3_S => rows::vec_dot_eight_lanes::<BlockIQ3S>(nb, w, act),
        MXFP4 => rows::vec_dot::<BlockMXFP4>(order, nb, w, act),
    }
}

/// [`vec_dot_in`] for an activation row that llama.cpp multiplies in a group of four rows:
/// the same, but for `Q4_K`, whose repacked x86 kernels add such a row's sums per 64
/// elements (see `kquants::vec_dot_q4_k`).
pub fn vec_dot_grouped(order: DotOrder, ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    if ty != GgmlType::Q4_K {
        return vec_dot_in(order, ty, n, w, act);
    }
    assert!(n.is_multiple_of(ty.block_size()) && w.len() >= row_bytes(ty, n) && act.len() >= row_bytes(ty.activation_type(), n), "Q4_K dot of {n} elements: rows too short");
    kquants::vec_dot_q4_k(n / ty.block_size(), w, act, true)
}

/// Add one block's contribution to a dot product: `w` is one block of `ty`, `a` one block
/// of `ty.activation_type()`. Lets kernels over other layouts reuse the reference numerics.
pub fn accumulate_block(ty: GgmlType, w: &[u8], a: &[u8], acc: &mut DotAcc) {
    fn one<B: QuantBlock>(w: &[u8], a: &[u8], acc: &mut DotAcc) {
        B::read(w).accumulate(&B::Act::read(a), acc);
    }
    use GgmlType::*;
    match ty {
        Q4_0 => one::<BlockQ4_0>(w, a, acc),
        Q4_1 => one::<BlockQ4_1>(w, a, acc),
        Q5_0 => one::<BlockQ5_0>(w, a, acc),
        Q5_1 => one::<BlockQ5_1>(w, a, acc),
        Q8_0 => one::<BlockQ8_0>(w, a, acc),
        Q8_1 => one::<BlockQ8_1>(w, a, acc),
        Q2_K => one::<BlockQ2K>(w, a, acc),
        Q3_K => one::<BlockQ3K>(w, a, acc),
        Q4_K => one::<BlockQ4K>(w, a, acc),
        Q5_K => one::<BlockQ5K>(w, a, acc),
        Q6_K => one::<BlockQ6K>(w, a, acc),
        Q8_K => one::<BlockQ8K>(w, a, acc),
        IQ4_NL => one::<BlockIQ4NL>(w, a, acc),
        IQ4_XS => one::<BlockIQ4XS>(w, a, acc),
        MXFP4 => one::<BlockMXFP4>(w, a, acc),
        TQ1_0 => one::<BlockTQ1_0>(w, a, acc),
        TQ2_0 => one::<BlockTQ2_0>(w, a, acc),
        IQ2_XXS => one::<BlockIQ2XXS>(w, a, acc),
        IQ2_XS => one::<BlockIQ2XS>(w, a, acc),
        IQ2_S => one::<BlockIQ2S>(w, a, acc),
        IQ3_XXS => one::<BlockIQ3XXS>(w, a, acc),
        IQ3_S => one::<BlockIQ3S>(w, a, acc),
        F32 | F16 | BF16 => panic!("accumulate_block is for block-quantized types, not {ty}"),
    }
}

/// Quantize `f32` weights into `ty` with ggml's reference quantizers (`quantize_row_*_ref`:
/// round to nearest, no importance matrix — what `llama-quantize` writes without
/// `--imatrix`). Supports every [`GgmlType`]; writes `ty.row_bytes(src.len())` bytes to the
/// front of `dst`.
pub fn quantize_weights(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let block = ty.block_size();
    if !src.len().is_multiple_of(block) {
        return Err(QuantError::PartialBlock {
            ty,
            len: src.len(),
            block,
        });
    }
    let needed = src.len() / block * ty.type_size();
    if dst.len() < needed {
        return Err(QuantError::OutputTooSmall {
            ty,
            needed,
            actual: dst.len(),
        });
    }
    if let Some((index, &value)) = src.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(QuantError::NonFinite { index, value });
    }
    quantize_ref(ty, src, &mut dst[..needed]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_dot_types_match_llama_cpp() {
        use GgmlType::*;
        for (w, a) in [
            (F32, F32),
            (F16, F16),
            (BF16, BF16),
            (Q4_0, Q8_0),
            (Q4_1, Q8_1),
            (Q5_0, Q8_0),
        ] {
            assert_eq!(w.activation_type(), a);
        }
        for (w, a) in [
            (Q5_1, Q8_1),
            (Q8_0, Q8_0),
            (Q2_K, Q8_K),
            (Q3_K, Q8_K),
            (Q4_K, Q8_K),
            (Q5_K, Q8_K),
            (Q6_K, Q8_K),
        ] {
            assert_eq!(w.activation_type(), a);
        }
    }

    #[test]
    fn quantize_weights_rejects_bad_input() {
        let mut out = vec![0u8; 64];
        assert_eq!(
            quantize_weights(GgmlType::Q4_0, &[0.0; 31], &mut out),
            Err(QuantError::PartialBlock {
                ty: GgmlType::Q4_0,
                len: 31,
                block: 32
            })
        );
        assert_eq!(
            quantize_weights(GgmlType::Q8_0, &[0.0; 64], &mut out),
            Err(QuantError::OutputTooSmall {
                ty: GgmlType::Q8_0,
                needed: 68,
                actual: 64
            })
        );
        let mut x = [0.0f32; 32];
        x[5] = f32::NAN;
        assert!(matches!(
            quantize_weights(GgmlType::Q4_0, &x, &mut out),
            Err(QuantError::NonFinite { index: 5, .. })
        ));
    }

    /// Garbage in (NaN, infinities, extremes, subnormals) must not panic anywhere.
    #[test]
    fn extreme_inputs_do_not_panic() {
        let specials = [f32::NAN, f32::INFINITY, -f32::INFINITY, f32::MAX, -f32::MAX, 1e-40, -0.0, 3.0];
        let x: Vec<f32> = (0..512).map(|i| specials[(i * 7 + i / 5) % specials.len()]).collect();
        let tiny: Vec<f32> = (0..512).map(|i| (i as f32 - 256.0) * 1e-42).collect();
        let huge: Vec<f32> = (0..512).map(|i| (i as f32 - 256.0) * 1e36).collect();
        for ty in GgmlType::ALL {
            for input in [&x, &tiny, &huge] {
                let act_ty = ty.activation_type();
                let mut w = vec![0u8; row_bytes(ty, 512)];
                let mut a = vec![0u8; row_bytes(act_ty, 512)];
                quantize_row(ty, input, &mut w);
                quantize_row(act_ty, input, &mut a);
                let _ = quantize_weights(ty, input, &mut w);
                let mut y = vec![0f32; 512];
                dequantize_row(ty, &w, &mut y);
                let _ = vec_dot(ty, 512, &w, &a);
            }
        }
    }

    #[test]
    fn empty_rows_are_fine() {
        for ty in GgmlType::ALL {
            dequantize_row(ty, &[], &mut []);
            quantize_row(ty, &[], &mut []);
            assert_eq!(vec_dot(ty, 0, &[], &[]), 0.0);
            quantize_weights(ty, &[], &mut []).unwrap();
        }
    }
}
