//! Matrix products of quantized weights with quantized activation rows.
//!
//! `gemm` computes `out[r][i] (+)= w_i · a_r` for a range of weight rows `i` and every
//! activation row `r`, on the kernel path chosen by [`crate::cpu`]. Every path returns
//! exactly the scalar reference's bits ([`crate::quant::vec_dot`]), so a result never
//! depends on the CPU, the batch or the thread split.
//!
//! Weights come either row-major, as in the file, or repacked by [`prepare`] into the
//! interleaved layout of [`pack`] that the SIMD kernels of the 32-element formats read.
//! The k-quants and float types stay row-major; their SIMD kernels read that directly.

#[cfg(target_arch = "aarch64")]
mod neon_fam32;
#[cfg(target_arch = "aarch64")]
mod neon_rowmajor;
pub mod pack;
#[cfg(target_arch = "x86_64")]
mod x86_fam32;
#[cfg(target_arch = "x86_64")]
mod x86_float;
#[cfg(target_arch = "x86_64")]
mod x86_kquant;

use std::ops::Range;

use blink_gguf::GgmlType;

use crate::cpu::Isa;
use crate::order::DotOrder;
use crate::quant::{self, DotAcc, WeightType};
use pack::{Fields, GROUP};

/// How a weight matrix is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// As in the GGUF file: each row's blocks in order.
    RowMajor,
    /// Groups of eight rows interleaved per block ([`pack`]).
    Packed,
}

/// Where results go: element `(r, i)` is `ptr[r * ld + i]`, written or added.
#[derive(Clone, Copy)]
pub struct Out {
    pub ptr: *mut f32,
    pub ld: usize,
    pub accumulate: bool,
}

/// Write (or add) the first `live` of a tile row's `vals` at `o`: the edge of a matrix
/// whose row count is not a multiple of the tile's.
///
/// # Safety
/// `o` must be valid for `live` reads and writes.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
#[inline]
pub(crate) unsafe fn store_live(o: *mut f32, vals: &[f32], live: usize, accumulate: bool) {
    for (i, &x) in vals.iter().enumerate().take(live) {
        if accumulate {
            *o.add(i) += x;
        } else {
            *o.add(i) = x;
        }
    }
}

/// The layout `isa`'s kernels want for `ty`, and the repacked bytes if that is not the
/// file's row-major layout.
pub fn prepare(isa: Isa, ty: GgmlType, rows: usize, cols: usize, src: &[u8]) -> Option<Vec<u8>> {
    match isa {
        Isa::Avx2 | Isa::Avx512Vnni | Isa::Neon => pack::pack(ty, rows, cols, src),
        Isa::Scalar => None,
    }
}

/// Rows a thread's share of a matrix must be aligned to (packed groups never split).
pub const ROW_ALIGN: usize = GROUP;

/// `out[r][i] (+)= w_i · a_r` for weight rows `i` in `rows` and activation rows `r` in
/// `0..n_act`. `w` holds the matrix in `layout` (`cols` elements of `ty` per row); `act`
/// holds `n_act` rows quantized to `ty.activation_type()`, `act_stride` bytes apart. With a
/// packed layout, `rows` must start on a multiple of [`ROW_ALIGN`]. The 32-element formats
/// apply their block scales in `order`; other types have one order.
///
/// # Safety
/// `out.ptr` must be valid for writes at every `(r, i)` above, and no other thread may
/// touch those elements during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(isa: Isa, order: DotOrder, ty: GgmlType, layout: Layout, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    gemm_chunks(isa, order, ty, layout, cols, w, std::iter::once(rows), act, act_stride, n_act, out)
}

/// [`gemm`] over each range of weight rows that `rows` yields, as a thread claims them
/// (the caller's work sharing hands them out one by one); what a call does once, such as
/// converting the activations' scales, is done once for all of them.
///
/// # Safety
/// As for [`gemm`], for every range.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_chunks(isa: Isa, order: DotOrder, ty: GgmlType, layout: Layout, cols: usize, w: &[u8], rows: impl Iterator<Item = Range<usize>>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    if n_act == 0 {
        return;
    }
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut rows = rows.filter(|r| !r.is_empty());
    #[cfg(target_arch = "x86_64")]
    if layout == Layout::Packed {
        let done = match isa {
            Isa::Avx512Vnni => x86_fam32::gemm_vnni(order, ty, cols, w, &mut rows, act, act_stride, n_act, out),
            Isa::Avx2 => x86_fam32::gemm_avx2(order, ty, cols, w, &mut rows, act, act_stride, n_act, out),
            _ => false,
        };
        if done {
            return;
        }
    }
    for r in rows {
        gemm_range(isa, order, ty, layout, cols, w, r, act, act_stride, n_act, out);
    }
}

/// [`gemm`] of one nonempty range on the kernels that take one range at a time.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_range(isa: Isa, order: DotOrder, ty: GgmlType, layout: Layout, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    if layout == Layout::Packed {
        // SAFETY: `Isa::Neon` is only used once `Isa::supported()` holds, which checks
        // the NEON and dot-product features the kernel enables.
        #[cfg(target_arch = "aarch64")]
        if isa == Isa::Neon && neon_fam32::gemm_neon(order, ty, cols, w, rows.clone(), act, act_stride, n_act, out) {
            return;
        }
        return scalar_packed(order, ty, cols, w, rows, act, act_stride, n_act, out);
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: an `Isa` other than `Scalar` is only used once `Isa::supported()` holds,
        // which checks every feature these `#[target_feature]` functions enable.
        let done = match isa {
            Isa::Avx512Vnni => {
                x86_kquant::gemm_vnni(ty, cols, w, rows.clone(), act, act_stride, n_act, out)
                    || x86_float::gemm_vnni(ty, cols, w, rows.clone(), act, act_stride, n_act, out)
            }
            Isa::Avx2 => {
                x86_kquant::gemm_avx2(ty, cols, w, rows.clone(), act, act_stride, n_act, out)
                    || x86_float::gemm_avx2(ty, cols, w, rows.clone(), act, act_stride, n_act, out)
            }
            _ => false,
        };
        if done {
            return;
        }
    }
    // SAFETY: as for the packed NEON kernel above.
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon && neon_rowmajor::gemm_neon(ty, cols, w, rows.clone(), act, act_stride, n_act, out) {
        return;
    }
    scalar(order, ty, cols, w, rows, act, act_stride, n_act, out);
}

#[inline]
unsafe fn store(out: Out, r: usize, i: usize, v: f32) {
    let o = out.ptr.add(r * out.ld + i);
    if out.accumulate {
        *o += v;
    } else {
        *o = v;
    }
}

/// The reference over row-major weights: one `vec_dot_in` per output.
#[allow(clippy::too_many_arguments)]
unsafe fn scalar(order: DotOrder, ty: GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    let rb = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
    let ab = ty.activation_type().row_bytes(cols as u64).expect("whole blocks") as usize;
    for i in rows {
        let wrow = &w[i * rb..(i + 1) * rb];
        for r in 0..n_act {
            store(out, r, i, quant::vec_dot_in(order, ty, cols, wrow, &act[r * act_stride..r * act_stride + ab]));
        }
    }
}

/// The reference over packed weights: each block is put back together, then accumulated
/// exactly as `vec_dot_in` does.
#[allow(clippy::too_many_arguments)]
unsafe fn scalar_packed(order: DotOrder, ty: GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    let f = Fields::of(ty).expect("packed layout of a packable type");
    let act_ty = ty.activation_type();
    let n_blocks = cols / 32;
    let group_block = f.group_block();
    let mut block = [0u8; 34];
    for i in rows {
        let (g, k) = (i / GROUP, i % GROUP);
        for r in 0..n_act {
            let mut acc = DotAcc::new(order);
            for b in 0..n_blocks {
                pack::unpack_block(&f, &w[(g * n_blocks + b) * group_block..][..group_block], k, &mut block);
                let a = &act[r * act_stride + b * act_ty.type_size()..][..act_ty.type_size()];
                quant::accumulate_block(ty, &block[..f.block], a, &mut acc);
            }
            store(out, r, i, acc.finish());
        }
    }
}
