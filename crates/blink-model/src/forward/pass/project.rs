//! The one door every projection goes through: `Pass::project` quantizes the input rows
//! to the activation format of each matrix and runs the product over the rows the node's
//! threads claim; the adapters add their `scale · B(A·x)` to the rows that have one
//! (`lora`), inside the same phases, and nowhere else.

use std::ops::Range;

use blink_gguf::GgmlType;
use blink_kernels::gemm::{self, ActRows, RowForm};
use blink_kernels::ops;
use blink_runtime::numa::NodeWorker;

use super::buffers::{Buf, PartView, Write};
use super::{Pass, StoreOf};
use crate::lora::LoraTarget;
use crate::weights::Matrix;

/// One product of a projection: the matrix, where its result goes (buffer, first column,
/// set or add), and the (layer, target) whose adapter pairs apply to it, if any.
pub(super) type Product<'p, 'a> = (&'p Matrix, &'p Buf<'a>, usize, Write, Option<(usize, LoraTarget)>);

/// Weight bytes per activation row a claimed chunk of a projection covers at least.
const CHUNK_BYTES: usize = 64 << 10;
/// Output columns a claimed chunk covers at least when adapters add to it: enough that
/// the expand's calls over a big batch's rows and pairs stay few and wide.
const DELTA_CHUNK: usize = 128;

impl<T: StoreOf> Pass<'_, T> {
    /// Multiply `count` rows of `input` (width `cols`) by each of the part's matrices,
    /// writing or adding the results at a column offset of its output. Activations are
    /// quantized once per distinct format; group barriers separate quantization from the
    /// products and the products from what follows. The adapters' shrinks run beside the
    /// first quantization, and their expands after the base product of each chunk of
    /// columns, on the thread that computed it.
    /// `forms[r]`: how llama.cpp computes row `r` (see [`Scratch`](crate::Scratch)).
    pub(super) fn project(&self, w: &NodeWorker, me: &PartView<T>, input: &Buf, (cols, count): (usize, usize), forms: &[RowForm], outputs: &[Product]) {
        let adapters = self.adapters_apply(outputs);
        debug_assert!(!adapters || count == self.rows.len(), "adapters apply to the step's own rows");
        let mut quantized: Option<GgmlType> = None;
        for (product, &(m, out, col, mode, site)) in outputs.iter().enumerate() {
            let mat = m.mat_ref();
            let act_ty = mat.activation_type();
            if quantized != Some(act_ty) {
                if quantized.is_some() {
                    w.group_barrier();
                }
                self.quantize_rows(w, me, input, cols, 0..count, act_ty);
                if adapters && quantized.is_none() {
                    self.adapter_shrinks(w, me, input, cols, outputs);
                }
                w.group_barrier();
                quantized = Some(act_ty);
            }
            // Rows go out in chunks the node's threads claim, so a thread that runs slower
            // computes fewer of them; a chunk streams at least `CHUNK_BYTES` of weights
            // per activation row (shorter runs cost the hardware prefetcher its stride).
            let row_bytes = m.bytes().len() / m.rows.max(1);
            let with_deltas = adapters && site.is_some();
            let min_chunk = (CHUNK_BYTES / (row_bytes * count).max(1)).max(if with_deltas { DELTA_CHUNK } else { 0 });
            let rows = w.claim(m.rows, gemm::ROW_ALIGN, min_chunk);
            // SAFETY: act is read-only in this phase (written before the last barrier).
            let act = unsafe { ActRows { ty: act_ty, bytes: me.act.slice(0..count * self.act_stride), stride: self.act_stride, count, forms } };
            let dst = out.out(col, mode);
            if with_deltas {
                // Chunk by chunk, so each chunk's deltas follow its base product at once.
                for chunk in rows {
                    // SAFETY: this thread alone writes columns `col + chunk` of `out`.
                    unsafe { gemm::product(self.isa, self.order, &mat, &act, std::iter::once(chunk.clone()), dst) };
                    self.adapter_expand(w, me, product, outputs, chunk);
                }
            } else {
                // SAFETY: this thread alone writes columns `col + r` of `out` for each range
                // `r` it claims.
                unsafe { gemm::product(self.isa, self.order, &mat, &act, rows, dst) };
            }
        }
        w.group_barrier();
    }

    /// Rows `rows` of `input` (their first `cols` columns) quantized to `ty`, into the same
    /// rows of `act`; the node's threads split them.
    pub(super) fn quantize_rows(&self, w: &NodeWorker, me: &PartView<T>, input: &Buf, cols: usize, rows: Range<usize>, ty: GgmlType) {
        let bytes = ty.row_bytes(cols as u64).expect("checked at load") as usize;
        for r in w.share(rows.len(), 1) {
            let r = rows.start + r;
            // SAFETY: input rows are read-only here (written by this thread or before a
            // barrier); act rows are split between the node's threads.
            unsafe {
                let dst = me.act.slice_mut(r * self.act_stride..r * self.act_stride + bytes);
                ops::quantize_row(self.isa, ty, input.cols(r, 0..cols), dst);
            }
        }
    }
}
