//! The buffers a pass computes in, as the pool's threads share them: f32 row matrices
//! whose columns a phase splits between threads, and each part's view of its weights,
//! buffers and cache shard.

use std::ops::Range;

use blink_kernels::gemm::Out;
use blink_runtime::pool::SharedMut;

use crate::kv_cache::{KvElem, KvLayout};
use crate::parallel::tensor::TensorPart;
use crate::weights::Weights;

/// Whether a projection overwrites its output or adds to it (residual connections).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Write {
    Set,
    Add,
}

/// A `[rows][stride]` f32 matrix shared by the pool threads.
pub(super) struct Buf<'a> {
    data: SharedMut<'a, f32>,
    stride: usize,
}

impl<'a> Buf<'a> {
    pub(super) fn new(data: &'a mut [f32], stride: usize) -> Self {
        Buf { data: SharedMut::new(data), stride }
    }

    /// Columns `cols` of row `r`.
    ///
    /// # Safety
    /// The caller owns these elements for writing in the current phase.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn cols_mut(&self, r: usize, cols: Range<usize>) -> &mut [f32] {
        self.data.slice_mut(r * self.stride + cols.start..r * self.stride + cols.end)
    }

    /// # Safety
    /// Nobody writes these elements in the current phase.
    #[inline]
    pub(super) unsafe fn cols(&self, r: usize, cols: Range<usize>) -> &[f32] {
        self.data.slice(r * self.stride + cols.start..r * self.stride + cols.end)
    }

    /// The whole of row `r`, mutable.
    ///
    /// # Safety
    /// As `cols_mut`.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn row_mut(&self, r: usize) -> &mut [f32] {
        self.cols_mut(r, 0..self.stride)
    }

    /// # Safety
    /// As `cols`.
    #[inline]
    pub(super) unsafe fn row(&self, r: usize) -> &[f32] {
        self.cols(r, 0..self.stride)
    }

    /// Where a kernel writes column `col` of row 0.
    pub(super) fn out(&self, col: usize, mode: Write) -> Out {
        // SAFETY: only forms a pointer inside the buffer; the kernel's writes are covered by
        // the caller's phase ownership.
        Out { ptr: unsafe { self.data.as_mut_ptr().add(col) }, ld: self.stride, accumulate: mode == Write::Add }
    }
}

/// One part's weights, buffers and cache shard, as seen during a step.
pub(super) struct PartView<'a, T: KvElem> {
    pub(super) w: &'a Weights,
    pub(super) part: &'a TensorPart,
    pub(super) x: Buf<'a>,
    pub(super) xn: Buf<'a>,
    pub(super) q: Buf<'a>,
    pub(super) k: Buf<'a>,
    pub(super) v: Buf<'a>,
    pub(super) attn: Buf<'a>,
    pub(super) gate: Buf<'a>,
    pub(super) up: Buf<'a>,
    pub(super) act: SharedMut<'a, u8>,
    pub(super) rope: Buf<'a>,
    pub(super) qh: Buf<'a>,
    pub(super) lora_t: Buf<'a>,
    pub(super) router: Buf<'a>,
    pub(super) moe_out: Buf<'a>,
    pub(super) moe_w: SharedMut<'a, f32>,
    pub(super) moe_idx: SharedMut<'a, u32>,
    pub(super) kc: SharedMut<'a, T>,
    pub(super) vc: SharedMut<'a, T>,
    pub(super) layout: KvLayout,
}

/// Buffers whose columns parts exchange.
#[derive(Clone, Copy)]
pub(super) enum Shared {
    /// The residual stream `x`.
    Residual,
    /// The FFN activations (`gate` after SwiGLU).
    Ffn,
    /// A block's output before its norm (`xn`, for models that norm it).
    BlockOut,
    /// The experts' outputs, a row per (row, chosen expert) slot (`moe_out`).
    ExpertOut,
}

impl<T: KvElem> PartView<'_, T> {
    pub(super) fn shared(&self, which: Shared) -> &Buf<'_> {
        match which {
            Shared::Residual => &self.x,
            Shared::Ffn => &self.gate,
            Shared::BlockOut => &self.xn,
            Shared::ExpertOut => &self.moe_out,
        }
    }
}
