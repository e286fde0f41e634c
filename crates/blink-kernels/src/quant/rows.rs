//! The per-block kernel interface and the generic loops that run it over whole rows.
//!
//! A row kernel only walks blocks in order; all numerics live in the [`QuantBlock`] impls.

use super::blocks::{read_blocks, Block, BlockQ8K};
use super::reduce::hsum8;
use crate::order::DotOrder;

/// Scalar reference kernels of one block format.
pub trait QuantBlock: Block {
    /// The activation block the dot product consumes (llama.cpp's `vec_dot_type`); the
    /// type's [`WeightType::activation_type`](super::WeightType::activation_type) is read
    /// from here.
    type Act: Block;

    /// Dequantize this block into `out[..Self::ELEMS]`.
    fn dequantize(&self, out: &mut [f32]);

    /// Quantize `x[..Self::ELEMS]` the way ggml's `quantize_row_*_ref` does (round to
    /// nearest, no importance matrix). This is what `llama-quantize` writes into files.
    fn quantize_ref(x: &[f32]) -> Self;

    /// This block's contribution to a dot product with one activation block, on its own.
    /// Formats that accumulate lane by lane define `accumulate` instead.
    #[inline]
    fn dot(&self, act: &Self::Act) -> f32 {
        let mut acc = DotAcc::default();
        self.accumulate(act, &mut acc);
        acc.finish()
    }

    /// Add this block's contribution into `acc`, in the order that defines Blink's numerics
    /// (see [`DotAcc`]). By default the block's `dot` is added to the scalar tail. Every
    /// format defines `dot` or `accumulate` (each default calls the other).
    #[inline]
    fn accumulate(&self, act: &Self::Act, acc: &mut DotAcc) {
        acc.add(self.dot(act));
    }
}

/// Accumulator of a row dot product, in a [`DotOrder`].
///
/// A 32-element block gives eight exact integer lane sums (lane `l` covers elements
/// `4l..4l+4`), a scale `d_w·d_a` and, for formats with a minimum (`Q4_1`, `Q5_1`), an
/// `m_w·s_a` term.
///
/// * `Llama`: lane `l` accumulates `fma(scale, sum_l, acc_l)` across blocks, the minimum
///   terms go to a separate tail (multiply, then add), and the row result is
///   `hsum8(lanes) + tail`: exactly what llama.cpp's AVX2/AVX-512 kernels compute.
/// * `Block`: the tail takes `fma(scale, Σ sum_l, tail)`, then `fma(m_w, s_a, tail)`; the
///   lanes stay zero, so the result is the tail.
///
/// A k-quant block adds its whole value to the tail in both orders. Every SIMD kernel must
/// reproduce these steps exactly.
#[derive(Clone, Copy, Debug, Default)]
pub struct DotAcc {
    order: DotOrder,
    lanes: [f32; 8],
    tail: f32,
}

impl DotAcc {
    pub fn new(order: DotOrder) -> DotAcc {
        DotAcc { order, ..DotAcc::default() }
    }

    /// Add a block's lane sums `sums` times `scale`.
    #[inline]
    pub fn add_block(&mut self, scale: f32, sums: &[i32; 8]) {
        match self.order {
            DotOrder::Llama => {
                for (acc, &s) in self.lanes.iter_mut().zip(sums) {
                    *acc = scale.mul_add(s as f32, *acc);
                }
            }
            DotOrder::Block => self.tail = scale.mul_add(sums.iter().sum::<i32>() as f32, self.tail),
        }
    }

    /// Add a block's whole integer sum times `scale` with one FMA, in either order (the
    /// only order of formats whose llama.cpp kernels know no other: `IQ4_NL`).
    #[inline]
    pub fn add_block_sum(&mut self, scale: f32, sum: i32) {
        self.tail = scale.mul_add(sum as f32, self.tail);
    }

    /// Add a block's `m_w · s_a` term.
    #[inline]
    pub fn add_min(&mut self, m: f32, s: f32) {
        match self.order {
            DotOrder::Llama => self.tail += m * s,
            DotOrder::Block => self.tail = m.mul_add(s, self.tail),
        }
    }

    /// Add a whole block's value.
    #[inline]
    pub fn add(&mut self, value: f32) {
        self.tail += value;
    }

    /// The row result.
    #[inline]
    pub fn finish(&self) -> f32 {
        hsum8(&self.lanes) + self.tail
    }
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
/// Blocks are accumulated in turn into a [`DotAcc`] in `order`.
pub fn vec_dot<B: QuantBlock>(order: DotOrder, n_blocks: usize, w: &[u8], act: &[u8]) -> f32 {
    let mut acc = DotAcc::new(order);
    for (wb, ab) in read_blocks::<B>(w).zip(read_blocks::<B::Act>(act)).take(n_blocks) {
        wb.accumulate(&ab, &mut acc);
    }
    acc.finish()
}

/// A `Q8_K` format whose row dot llama.cpp's x86 build computes in eight float lanes: each
/// super-block gives eight exact integer lanes, which go into the float lanes with one FMA
/// by `d_a·d` each, summed at the end as `hsum_float_8` does (`IQ4_XS`, `TQ1_0`, `TQ2_0`,
/// and the IQ2 and IQ3 formats).
pub trait EightLanes: QuantBlock<Act = BlockQ8K> {
    /// The block's eight integer lanes against `act`.
    fn lanes(&self, act: &BlockQ8K) -> [i32; 8];
    /// The block's scale `d`.
    fn scale(&self) -> f32;
    /// The factor the lanes' sum is multiplied by at the end (the IQ2 and IQ3 formats
    /// count their scales in eighths or quarters).
    const FINAL: f32 = 1.0;

    /// The block's value alone (its eight lanes summed): [`vec_dot_eight_lanes`] defines
    /// a row's order.
    fn lanes_value(&self, act: &BlockQ8K) -> f32 {
        let d = act.d * self.scale();
        Self::FINAL * hsum8(&self.lanes(act).map(|l| d * l as f32))
    }
}

/// The dot of the first `n_blocks` blocks of an [`EightLanes`] row with a `Q8_K` row.
pub fn vec_dot_eight_lanes<B: EightLanes>(n_blocks: usize, w: &[u8], act: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (wb, ab) in read_blocks::<B>(w).zip(read_blocks::<BlockQ8K>(act)).take(n_blocks) {
        let d = ab.d * wb.scale();
        for (acc, lane) in acc.iter_mut().zip(wb.lanes(&ab)) {
            *acc = d.mul_add(lane as f32, *acc);
        }
    }
    B::FINAL * hsum8(&acc)
}
