//! Float matrix products for training: `C[m][n] (+)= Σ_k A[m][k] · B[k][n]` with f32
//! activations `A`, and `B` either a frozen weight matrix read from its quantized blocks
//! (as `Wᵀ` for a forward product, as `W` for the backward one) or plain f32.
//!
//! Weights are dequantized tile by tile into a small per-thread buffer and never held as
//! floats whole. Every element of `C` is one fused multiply-add chain over `k` in order,
//! starting from its old value (or zero), so every SIMD path returns the scalar bits and
//! the result does not depend on how the caller splits the columns between threads.
//!
//! The caller gives each thread a range of `C`'s columns aligned to [`col_align`]; within
//! it, columns go in panels of [`NR`], `k` in blocks of [`KC`], rows in micro-tiles.

mod tile;

pub use tile::row_window;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::ops::Range;

use crate::cpu::Isa;
use crate::gemm::MatRef;

/// Columns of one packed panel of `B`.
pub const NR: usize = 32;
/// Depth of one block of `k` (a multiple of every block size).
pub const KC: usize = 256;
/// Columns dequantized at once from a weight read as `W` (a multiple of every block size).
const NC: usize = 256;

/// Where `B` comes from.
#[derive(Clone, Copy)]
pub enum BSource<'a> {
    /// `B = Wᵀ`, `B[k][n] = W[n][k]`: `y = W·x` for rows of activations.
    WeightT(MatRef<'a>),
    /// `B = W`, `B[k][n] = W[k][n]`: `dx = Wᵀ·dy`, the backward product.
    Weight(MatRef<'a>),
    /// Row-major f32, `B[k][n] = data[k·ld + n]`.
    F32 { data: &'a [f32], ld: usize },
    /// Transposed f32, `B[k][n] = data[n·ld + k]`.
    F32T { data: &'a [f32], ld: usize },
}

impl BSource<'_> {
    /// Columns of `B`.
    pub fn n(&self) -> Option<usize> {
        match self {
            BSource::WeightT(w) => Some(w.rows),
            BSource::Weight(w) => Some(w.cols),
            BSource::F32 { .. } | BSource::F32T { .. } => None,
        }
    }
}

/// What a thread's column range must be aligned to for `b` (its blocks never split).
pub fn col_align(b: &BSource) -> usize {
    match b {
        BSource::Weight(w) => w.ty.block_size().max(NR),
        _ => NR,
    }
}

/// `C`'s columns of one call: element `(r, cols.start + j)` at `ptr[r·ld + j]`.
#[derive(Clone, Copy)]
pub struct OutF32 {
    pub ptr: *mut f32,
    pub ld: usize,
    /// Add to the old values (otherwise they are overwritten).
    pub accumulate: bool,
}

/// A thread's buffers for [`fgemm`], sized once.
pub struct FgemmScratch {
    panel: Vec<f32>,
    tile: Vec<f32>,
    block: Vec<u8>,
}

impl Default for FgemmScratch {
    fn default() -> Self {
        FgemmScratch { panel: vec![0.0; KC * NR], tile: vec![0.0; KC * NC.max(NR)], block: vec![0; 512] }
    }
}

/// Columns `cols` of `C = A·B` (or `C += A·B`) for `m` rows of `A` (`A[r][k]` at
/// `a[r·lda + k]`, `k < depth`), written through `c` (which starts at column `cols.start`).
///
/// # Safety
/// `c` must be valid for rows `0..m`, columns `cols`, and no other thread may touch those
/// elements meanwhile. `cols` must lie inside `B` and start on a multiple of [`col_align`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn fgemm(isa: Isa, a: &[f32], lda: usize, m: usize, depth: usize, b: BSource, cols: Range<usize>, c: OutF32, s: &mut FgemmScratch) {
    if m == 0 || cols.is_empty() {
        return;
    }
    assert!(m == 0 || a.len() >= (m - 1) * lda + depth, "fgemm: A is shorter than its rows");
    if depth == 0 {
        if !c.accumulate {
            for r in 0..m {
                std::slice::from_raw_parts_mut(c.ptr.add(r * c.ld), cols.len()).fill(0.0);
            }
        }
        return;
    }
    match b {
        BSource::Weight(w) => {
            // Dequantize `NC` columns of `kc` rows of W at a time; panels are read from it.
            let mut n0 = cols.start;
            while n0 < cols.end {
                let n1 = (n0 + NC).min(cols.end);
                let width = (n1 - n0).next_multiple_of(NR);
                for k0 in (0..depth).step_by(KC) {
                    let kc = KC.min(depth - k0);
                    tile::weight_rows(&w, k0..k0 + kc, n0..n1, &mut s.tile, width, &mut s.block);
                    for p0 in (0..n1 - n0).step_by(NR) {
                        let live = NR.min(n1 - n0 - p0);
                        let panel = &s.tile[p0..];
                        run_panel(isa, a, lda, m, k0, kc, panel.as_ptr(), width, c, n0 + p0 - cols.start, live);
                    }
                }
                n0 = n1;
            }
        }
        _ => {
            for p0 in cols.clone().step_by(NR) {
                let live = NR.min(cols.end - p0);
                for k0 in (0..depth).step_by(KC) {
                    let kc = KC.min(depth - k0);
                    match b {
                        BSource::WeightT(w) => tile::weight_cols(&w, p0..p0 + live, k0..k0 + kc, &mut s.panel, &mut s.tile, &mut s.block),
                        BSource::F32 { data, ld } => tile::f32_rows(data, ld, k0..k0 + kc, p0..p0 + live, &mut s.panel),
                        BSource::F32T { data, ld } => tile::f32_cols(data, ld, p0..p0 + live, k0..k0 + kc, &mut s.panel),
                        BSource::Weight(_) => unreachable!(),
                    }
                    run_panel(isa, a, lda, m, k0, kc, s.panel.as_ptr(), NR, c, p0 - cols.start, live);
                }
            }
        }
    }
}

/// One panel (`kc` × [`NR`] at `b`, rows `ldb` apart) against every row of `A`, into
/// columns `j0 .. j0 + live` of `C`. The first block of `k` starts from zero unless `C`
/// accumulates; later ones continue the chains.
#[allow(clippy::too_many_arguments)]
unsafe fn run_panel(isa: Isa, a: &[f32], lda: usize, m: usize, k0: usize, kc: usize, b: *const f32, ldb: usize, c: OutF32, j0: usize, live: usize) {
    let tile = Tile { a: a.as_ptr().add(k0), lda, kc, b, ldb, c: c.ptr.add(j0), ldc: c.ld, live, load: c.accumulate || k0 > 0 };
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => x86::rows_avx512(&tile, m),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::rows_avx2(&tile, m),
        _ => scalar_rows(&tile, m),
    }
}

/// One panel's product for some rows: what a micro-kernel is handed.
pub(crate) struct Tile {
    /// `A` at the block's first `k`, rows `lda` apart.
    pub a: *const f32,
    pub lda: usize,
    pub kc: usize,
    /// The panel, `kc` rows of [`NR`] values, `ldb` apart (zero past `live`).
    pub b: *const f32,
    pub ldb: usize,
    /// `C` at the panel's first column.
    pub c: *mut f32,
    pub ldc: usize,
    /// Columns of `C` to write.
    pub live: usize,
    /// Continue from `C`'s values rather than zero.
    pub load: bool,
}

/// The portable definition: each element one `mul_add` chain in `k` order.
unsafe fn scalar_rows(t: &Tile, m: usize) {
    for r in 0..m {
        let mut acc = [0f32; NR];
        let c = t.c.add(r * t.ldc);
        if t.load {
            for (j, v) in acc.iter_mut().enumerate().take(t.live) {
                *v = *c.add(j);
            }
        }
        let a = t.a.add(r * t.lda);
        for k in 0..t.kc {
            let x = *a.add(k);
            let b = std::slice::from_raw_parts(t.b.add(k * t.ldb), NR);
            for (v, &w) in acc.iter_mut().zip(b) {
                *v = x.mul_add(w, *v);
            }
        }
        for (j, &v) in acc.iter().enumerate().take(t.live) {
            *c.add(j) = v;
        }
    }
}

#[cfg(test)]
mod tests;
