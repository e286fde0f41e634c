//! Filling `B`'s panels: weight rows dequantized from their blocks (row-major or in the
//! interleaved layout of [`crate::gemm::pack`]), or f32 copied, zero past the live columns.

use std::ops::Range;

use crate::gemm::pack::{self, Fields};
use crate::gemm::{Layout, MatRef};
use crate::quant;

use super::NR;

/// Blocks `blocks` of row `row` of `w`, dequantized into `out` (`block` holds one
/// rebuilt block of a packed matrix).
fn dequantize_segment(w: &MatRef, row: usize, blocks: Range<usize>, out: &mut [f32], block: &mut [u8]) {
    let (bs, ts) = (w.ty.block_size(), w.ty.type_size());
    let n_blocks = w.cols / bs;
    match w.layout {
        Layout::RowMajor => {
            let at = row * n_blocks * ts;
            quant::dequantize_row(w.ty, &w.bytes[at + blocks.start * ts..at + blocks.end * ts], out);
        }
        Layout::Packed => {
            let f = Fields::of(w.ty).expect("a packed matrix has a packable type");
            let (g, r) = (row / pack::GROUP, row % pack::GROUP);
            for (i, b) in blocks.enumerate() {
                let at = (g * n_blocks + b) * f.group_block();
                pack::unpack_block(&f, &w.bytes[at..at + f.group_block()], r, block);
                quant::dequantize_row(w.ty, &block[..f.block], &mut out[i * bs..(i + 1) * bs]);
            }
        }
    }
}

/// `out[(k - ks.start)·width + (j - js.start)] = W[k][j]`, zero for columns past `js`.
/// `js.start` and `ks` are whole blocks' worth.
pub(super) fn weight_rows(w: &MatRef, ks: Range<usize>, js: Range<usize>, out: &mut [f32], width: usize, block: &mut [u8]) {
    let bs = w.ty.block_size();
    let blocks = js.start / bs..js.end.div_ceil(bs);
    let skip = js.start - blocks.start * bs;
    debug_assert_eq!(skip, 0, "columns start on a block");
    let n = js.len();
    for (i, k) in ks.enumerate() {
        let row = &mut out[i * width..(i + 1) * width];
        dequantize_segment(w, k, blocks.clone(), row, block);
        row[n..].fill(0.0);
    }
}

/// The panel `panel[k - ks.start][j - js.start] = W[j][k]` (`B = Wᵀ`), zero past `js`,
/// through `tmp` (`js.len()` dequantized rows of `ks.len()`).
pub(super) fn weight_cols(w: &MatRef, js: Range<usize>, ks: Range<usize>, panel: &mut [f32], tmp: &mut [f32], block: &mut [u8]) {
    let bs = w.ty.block_size();
    let kc = ks.len();
    let blocks = ks.start / bs..ks.end.div_ceil(bs);
    for (i, j) in js.clone().enumerate() {
        dequantize_segment(w, j, blocks.clone(), &mut tmp[i * kc..(i + 1) * kc], block);
    }
    let live = js.len();
    for k in 0..kc {
        let dst = &mut panel[k * NR..(k + 1) * NR];
        for (i, v) in dst.iter_mut().enumerate() {
            *v = if i < live { tmp[i * kc + k] } else { 0.0 };
        }
    }
}

/// The panel `panel[k][j] = data[k·ld + j]` over `ks` × `js`, zero past `js`.
pub(super) fn f32_rows(data: &[f32], ld: usize, ks: Range<usize>, js: Range<usize>, panel: &mut [f32]) {
    let live = js.len();
    for (i, k) in ks.enumerate() {
        let dst = &mut panel[i * NR..(i + 1) * NR];
        dst[..live].copy_from_slice(&data[k * ld + js.start..k * ld + js.end]);
        dst[live..].fill(0.0);
    }
}

/// The panel `panel[k][j] = data[j·ld + k]` over `ks` × `js`, zero past `js`.
pub(super) fn f32_cols(data: &[f32], ld: usize, js: Range<usize>, ks: Range<usize>, panel: &mut [f32]) {
    let live = js.len();
    for (i, k) in ks.enumerate() {
        let dst = &mut panel[i * NR..(i + 1) * NR];
        for (jj, v) in dst.iter_mut().enumerate() {
            *v = if jj < live { data[(js.start + jj) * ld + k] } else { 0.0 };
        }
    }
}

/// Rows `rows` of `w` as a matrix of their own (for a packed matrix, `rows.start` must
/// begin a group of [`pack::GROUP`]).
pub fn row_window<'a>(w: &MatRef<'a>, rows: Range<usize>) -> MatRef<'a> {
    assert!(rows.end <= w.rows, "row window {rows:?} outside {} rows", w.rows);
    let n_blocks = w.cols / w.ty.block_size();
    let bytes = match w.layout {
        Layout::RowMajor => {
            let rb = n_blocks * w.ty.type_size();
            &w.bytes[rows.start * rb..rows.end * rb]
        }
        Layout::Packed => {
            assert!(rows.start.is_multiple_of(pack::GROUP), "a packed window starts on a group");
            let gb = n_blocks * w.ty.type_size() * pack::GROUP;
            &w.bytes[rows.start / pack::GROUP * gb..rows.end.div_ceil(pack::GROUP) * gb]
        }
    };
    MatRef { ty: w.ty, layout: w.layout, rows: rows.len(), cols: w.cols, bytes }
}
