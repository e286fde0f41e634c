//! The per-block kernel interface and the generic loops that run it over whole rows.
//!
//! A row kernel only walks blocks in order; all numerics live in the [`QuantBlock`] impls.

use super::blocks::{read_blocks, Block};

/// Scalar reference kernels of one block format.
pub trait QuantBlock: Block {
    /// The activation block the dot product consumes (llama.cpp's `vec_dot_type`).
    type Act: Block;

    /// Dequantize this block into `out[..Self::ELEMS]`.
    fn dequantize(&self, out: &mut [f32]);

    /// Quantize `x[..Self::ELEMS]` the way ggml's `quantize_row_*_ref` does (round to
    /// nearest, no importance matrix). This is what `llama-quantize` writes into files.
    fn quantize_ref(x: &[f32]) -> Self;

    /// This block's contribution to a dot product with one activation block.
    fn dot(&self, act: &Self::Act) -> f32;
}

/// Dequantize every whole block of `src` into consecutive `B::ELEMS` chunks of `dst`.
pub fn dequantize<B: QuantBlock>(src: &[u8], dst: &mut [f32]) {
    for (block, out) in read_blocks::<B>(src).zip(dst.chunks_exact_mut(B::ELEMS)) {
        block.dequantize(out);
    }
}

/// Quantize consecutive `B::ELEMS` chunks of `src` with `quantize` into blocks of `dst`.
pub fn quantize_with<B: Block>(src: &[f32], dst: &mut [u8], quantize: impl Fn(&[f32]) -> B) {
    for (x, out) in src
        .chunks_exact(B::ELEMS)
        .zip(dst.chunks_exact_mut(B::BYTES))
    {
        quantize(x).write(out);
    }
}

/// Dot product of the first `n_blocks` weight blocks with as many activation blocks.
///
/// Block contributions are summed in order into one `f32`, as ggml's generic kernels do.
pub fn vec_dot<B: QuantBlock>(n_blocks: usize, w: &[u8], act: &[u8]) -> f32 {
    read_blocks::<B>(w)
        .zip(read_blocks::<B::Act>(act))
        .take(n_blocks)
        .fold(0.0f32, |acc, (wb, ab)| acc + wb.dot(&ab))
}
