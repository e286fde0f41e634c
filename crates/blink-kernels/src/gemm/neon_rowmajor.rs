//! NEON kernels (with the dot-product extension) over row-major weights: the k-quants
//! (`Q2_K`..`Q6_K`) against `Q8_K` activations, and the float types (`F32`, `F16`,
//! `BF16`) against rows of the same type. Every output gets the scalar reference's bits.
//!
//! Both share one driver: tiles of weight rows × activation rows over chunks of rows
//! that stay cached while every activation tile passes over them ([`kquant`], [`float`]).

#![allow(clippy::too_many_arguments)]

mod float;
mod kquant;

use std::array::from_fn;
use std::ops::Range;

use blink_gguf::GgmlType;

use super::{Out, RowForm};

/// `out[r][i] (+)= w_i · a_r` by tiles: `wide(weight rows, activation rows)` returns the
/// `NR × NA` results `[i][j]`; activation rows left over when fewer than `NA` remain go
/// one at a time through `narrow`, against `NR1` weight rows. Rows past the end of the
/// range repeat the last one and their results are dropped.
#[inline(always)]
unsafe fn drive<const NR: usize, const NA: usize, const NR1: usize>(
    row_bytes: usize,
    w: &[u8],
    rows: Range<usize>,
    act: &[u8],
    act_stride: usize,
    n_act: usize,
    out: Out,
    wide: impl Fn([*const u8; NR], [*const u8; NA]) -> [[f32; NA]; NR],
    narrow: impl Fn([*const u8; NR1], [*const u8; 1]) -> [[f32; 1]; NR1],
) {
    // Weight rows in chunks that stay in L1 while every activation tile passes over them.
    let chunk = super::tiling::chunk_rows(row_bytes, super::tiling::l1_bytes()).next_multiple_of(NR * NR1);
    let last = rows.end - 1;
    let row = |i: usize| w.as_ptr().add(i.min(last) * row_bytes);
    let a_row = |j: usize| act.as_ptr().add(j * act_stride);
    let put = |i: usize, j: usize, v: f32| {
        let o = out.ptr.add(j * out.ld + i);
        *o = if out.accumulate { *o + v } else { v };
    };
    for c0 in rows.clone().step_by(chunk) {
        let c1 = (c0 + chunk).min(rows.end);
        let mut j0 = 0;
        while n_act - j0 >= NA {
            for i0 in (c0..c1).step_by(NR) {
                let res = wide(from_fn(|i| row(i0 + i)), from_fn(|j| a_row(j0 + j)));
                for (i, r) in res.iter().enumerate().take(c1 - i0) {
                    r.iter().enumerate().for_each(|(j, &v)| put(i0 + i, j0 + j, v));
                }
            }
            j0 += NA;
        }
        for j in j0..n_act {
            for i0 in (c0..c1).step_by(NR1) {
                let res = narrow(from_fn(|i| row(i0 + i)), [a_row(j)]);
                for (i, r) in res.iter().enumerate().take(c1 - i0) {
                    put(i0 + i, j, r[0]);
                }
            }
        }
    }
}

/// Run the row-major kernel for `ty`; false if `ty` has none.
///
/// # Safety
/// The CPU must have NEON and the dot-product extension; `out` as for [`super::gemm`].
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn gemm_neon(ty: GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, grouped: &[RowForm], out: Out) -> bool {
    kquant::gemm(ty, cols, w, rows.clone(), act, act_stride, n_act, grouped, out) || float::gemm(ty, cols, w, rows, act, act_stride, n_act, out)
}
