//! Filling `B`'s panels: weight rows dequantized from their blocks (row-major or in the
//! interleaved layout of [`crate::gemm::pack`]), or f32 copied, zero past the live columns.
//! The 32-element formats go straight into the panel with AVX2 on x86 ([`fill_x86`]);
//! the others, and every format on the scalar path, through [`quant::dequantize_row`].

use std::ops::Range;

use crate::cpu::Isa;
use crate::gemm::pack::{self, Fields};
use crate::gemm::{Layout, MatRef};
use crate::quant;

#[cfg(target_arch = "x86_64")]
use super::fill_x86;
use super::{KC, NR};

/// Row `r`'s original block rebuilt from a packed group-block `src` (as
/// [`pack::unpack_block`], by whole dwords).
fn unpack_row(f: &Fields, src: &[u8], r: usize, blk: &mut [u8]) {
    let (m_at, qh_at, qs_at) = f.packed_offsets();
    blk[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    if let Some(m) = f.m {
        blk[m..m + 2].copy_from_slice(&src[m_at + 2 * r..m_at + 2 * r + 2]);
    }
    // Lane l of row r: dword r of the lane's 32 bytes (4-bit: lanes l and l + 4 together,
    // which is the original block's dword l).
    let lanes = if f.bits == 8 { 8 } else { 4 };
    for l in 0..lanes {
        let at = qs_at + 32 * l + 4 * r;
        blk[f.qs + 4 * l..f.qs + 4 * l + 4].copy_from_slice(&src[at..at + 4]);
    }
    if let Some(o) = f.qh {
        // qh[l] bit 4r+k is element 4l+k of row r.
        let qh = (0..8).fold(0u32, |h, l| {
            let at = qh_at + 4 * l;
            let word = u32::from_le_bytes([src[at], src[at + 1], src[at + 2], src[at + 3]]);
            h | ((word >> (4 * r)) & 0xf) << (4 * l)
        });
        blk[o..o + 4].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Blocks `blocks` of row `row` of `w`, dequantized into `out`.
fn dequantize_segment(w: &MatRef, row: usize, blocks: Range<usize>, out: &mut [f32]) {
    let (bs, ts) = (w.ty.block_size(), w.ty.type_size());
    let n_blocks = w.cols / bs;
    match w.layout {
        Layout::RowMajor => {
            let at = row * n_blocks * ts;
            quant::dequantize_row(w.ty, &w.bytes[at + blocks.start * ts..at + blocks.end * ts], out);
        }
        Layout::Packed => {
            let (g, r) = (row / pack::GROUP, row % pack::GROUP);
            let gb = pack::group_block(w.ty).expect("a packed matrix has a packable type");
            let mut block = [0u8; 256];
            for (i, b) in blocks.enumerate() {
                let src = &w.bytes[(g * n_blocks + b) * gb..][..gb];
                match Fields::of(w.ty) {
                    Some(f) => unpack_row(&f, src, r, &mut block),
                    None => pack::unpack_block_of(w.ty, src, r, &mut block),
                }
                quant::dequantize_row(w.ty, &block[..ts], &mut out[i * bs..(i + 1) * bs]);
            }
        }
    }
}

/// Whether `isa` fills panels with the AVX2 code (every x86 SIMD path has AVX2, FMA, F16C).
#[cfg(target_arch = "x86_64")]
fn simd(isa: Isa) -> bool {
    isa.is_x86()
}

/// Rows `ks` of `W` over columns `js` into panel-major `tile`: the panel of columns
/// `js.start + p·NR ..` at `tile[p·kc·NR ..]` (`kc = ks.len()` rows of [`NR`], zero past
/// `js`), through `tmp` (one dequantized row). `js.start` is a whole block's.
pub(super) fn weight_rows(isa: Isa, w: &MatRef, ks: Range<usize>, js: Range<usize>, tile: &mut [f32], tmp: &mut [f32]) {
    let bs = w.ty.block_size();
    debug_assert_eq!(js.start % bs, 0, "columns start on a block");
    #[cfg(target_arch = "x86_64")]
    if let (true, Some(q)) = (simd(isa), fill_x86::Legacy::of(w)) {
        if js.start.is_multiple_of(NR) && js.end.is_multiple_of(NR) {
            // SAFETY: the path's features are the CPU's (the caller's promise for `isa`).
            unsafe { fill_x86::weight_rows(&q, w, ks, js, tile) };
            return;
        }
    }
    let _ = isa;
    let kc = ks.len();
    let blocks = js.start / bs..js.end.div_ceil(bs);
    let n = js.len();
    let row = &mut tmp[..blocks.len() * bs];
    for (i, k) in ks.enumerate() {
        dequantize_segment(w, k, blocks.clone(), row);
        for p in 0..n.div_ceil(NR) {
            let dst = &mut tile[(p * kc + i) * NR..(p * kc + i + 1) * NR];
            let len = NR.min(n - p * NR);
            dst[..len].copy_from_slice(&row[p * NR..p * NR + len]);
            dst[len..].fill(0.0);
        }
    }
}

/// The panel `panel[k - ks.start][j - js.start] = W[j][k]` (`B = Wᵀ`), zero past `js`,
/// through `tmp` (`js.len()` dequantized rows of `ks.len()`). `ks` is whole blocks.
pub(super) fn weight_cols(isa: Isa, w: &MatRef, js: Range<usize>, ks: Range<usize>, panel: &mut [f32], tmp: &mut [f32]) {
    let bs = w.ty.block_size();
    #[cfg(target_arch = "x86_64")]
    if let (true, Some(q)) = (simd(isa), fill_x86::Legacy::of(w)) {
        let grouped = w.layout == Layout::RowMajor || js.start.is_multiple_of(pack::GROUP);
        if grouped && ks.start.is_multiple_of(bs) && ks.end.is_multiple_of(bs) {
            // SAFETY: as in `weight_rows`.
            unsafe { fill_x86::weight_cols(&q, w, js, ks, panel) };
            return;
        }
    }
    let kc = ks.len();
    let blocks = ks.start / bs..ks.end.div_ceil(bs);
    for (i, j) in js.clone().enumerate() {
        dequantize_segment(w, j, blocks.clone(), &mut tmp[i * kc..(i + 1) * kc]);
    }
    transpose(isa, tmp, kc, js.len(), kc, panel);
}

/// `panel[k][j] = src[j·ld + k]` for `k < kc`, `j < live`, zero for `live ≤ j < NR`.
fn transpose(isa: Isa, src: &[f32], ld: usize, live: usize, kc: usize, panel: &mut [f32]) {
    assert!(live <= NR && kc <= KC && (live == 0 || src.len() >= (live - 1) * ld + kc));
    #[cfg(target_arch = "x86_64")]
    if simd(isa) {
        // SAFETY: as in `weight_rows`; `src` holds the rows (checked above).
        unsafe { fill_x86::transpose_cols(src.as_ptr(), ld, live, kc, panel) };
        return;
    }
    let _ = isa;
    for k in 0..kc {
        let dst = &mut panel[k * NR..(k + 1) * NR];
        for (j, v) in dst[..live].iter_mut().enumerate() {
            *v = src[j * ld + k];
        }
        dst[live..].fill(0.0);
    }
}

/// The panel `panel[k][j] = data[k·ld + j]` over `ks` × `js`, zero past `js`.
pub(super) fn f32_rows(data: &[f32], ld: usize, ks: Range<usize>, js: Range<usize>, panel: &mut [f32]) {
    let live = js.len();
    for (i, k) in ks.enumerate() {
        let dst: &mut [f32; NR] = (&mut panel[i * NR..(i + 1) * NR]).try_into().unwrap();
        let src = &data[k * ld + js.start..k * ld + js.end];
        if let Ok(src) = <&[f32; NR]>::try_from(src) {
            *dst = *src;
        } else {
            dst[..live].copy_from_slice(src);
            dst[live..].fill(0.0);
        }
    }
}

/// The panel `panel[k][j] = data[j·ld + k]` over `ks` × `js`, zero past `js`.
pub(super) fn f32_cols(isa: Isa, data: &[f32], ld: usize, js: Range<usize>, ks: Range<usize>, panel: &mut [f32]) {
    transpose(isa, &data[js.start * ld + ks.start..], ld, js.len(), ks.len(), panel);
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
