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
//! it, `k` goes in blocks of [`KC`] and rows in blocks of at most `MC`, whose slice of `A`
//! is packed once into micro-panels of a kernel's rows (`[k][rows]`: one stream that stays
//! in L2), unless the range is only a few panels wide and `A` is read in place. Columns go
//! in panels of [`NR`]: a panel of `B` (`KC × NR`, contiguous, dequantized straight into
//! that layout) stays in L1 while every micro-tile of rows runs against it. Blocking only
//! reorders whole chains, so it never changes a bit.

mod tile;

pub use tile::row_window;
#[cfg(target_arch = "x86_64")]
mod fill_x86;
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
/// Most rows of `A` packed at once (`MC · KC` floats stay in L2).
const MC: usize = 768;
/// Up to this many columns, `A` is read in place: packing it would cost more than the
/// few panels that reuse it save.
const DIRECT_COLS: usize = 3 * NR;

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

/// A thread's buffers for [`fgemm`]: the panels of `B` (512 KiB with the rows they come
/// through) sized once, packed `A` grown to the largest block of rows seen (at most
/// `MC · KC` floats).
pub struct FgemmScratch {
    /// Panels of `B`, each `KC × NR` (`NC / NR` of them for a weight read as `W`).
    panel: Vec<f32>,
    /// Dequantized weight rows on their way into panels.
    tmp: Vec<f32>,
    /// The packed block of `A`.
    apack: Vec<f32>,
}

impl Default for FgemmScratch {
    fn default() -> Self {
        FgemmScratch { panel: vec![0.0; KC * NC.max(NR)], tmp: vec![0.0; KC * NC.max(NR)], apack: Vec::new() }
    }
}

/// Rows per micro-tile of `isa`'s kernel (0: the scalar path, which reads `A` in place).
fn micro_rows(isa: Isa) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => x86::MR_512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => x86::MR_256,
        _ => 0,
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
    let mr = micro_rows(isa);
    // Blocks of rows as even as the limit allows, whole micro-tiles each.
    let m_blocks = m.div_ceil(MC);
    let mc = if mr == 0 { m } else { m.div_ceil(m_blocks).next_multiple_of(mr) };
    for m0 in (0..m).step_by(mc) {
        let mb = mc.min(m - m0);
        let a_rows = &a[m0 * lda..];
        let c_rows = OutF32 { ptr: c.ptr.add(m0 * c.ld), ..c };
        for k0 in (0..depth).step_by(KC) {
            let kc = KC.min(depth - k0);
            let rows = if mr == 0 || cols.len() <= DIRECT_COLS {
                Rows { a: a_rows.as_ptr().add(k0), lda, packed: false, m: mb, kc }
            } else {
                if s.apack.len() < mb * kc {
                    s.apack.resize(mc.min(m) * KC.min(depth), 0.0);
                }
                assert!((mb - 1) * lda + k0 + kc <= a_rows.len());
                pack_a(isa, a_rows, lda, mb, k0, kc, mr, &mut s.apack[..mb * kc]);
                Rows { a: s.apack.as_ptr(), lda: 0, packed: true, m: mb, kc }
            };
            let load = c.accumulate || k0 > 0;
            match b {
                BSource::Weight(w) => {
                    // `NC` columns of `kc` rows of W dequantized at once, panel by panel.
                    for n0 in cols.clone().step_by(NC) {
                        let n1 = (n0 + NC).min(cols.end);
                        tile::weight_rows(isa, &w, k0..k0 + kc, n0..n1, &mut s.panel, &mut s.tmp);
                        for (i, p0) in (n0..n1).step_by(NR).enumerate() {
                            let live = NR.min(n1 - p0);
                            run_panel(isa, &rows, s.panel[i * kc * NR..].as_ptr(), NR, c_rows, p0 - cols.start, live, load);
                        }
                    }
                }
                _ => {
                    for p0 in cols.clone().step_by(NR) {
                        let live = NR.min(cols.end - p0);
                        let (js, ks) = (p0..p0 + live, k0..k0 + kc);
                        if let (BSource::F32 { data, ld }, true) = (b, live == NR && mb <= mr) {
                            // One micro-tile reads each value of the panel once: in place.
                            assert!((k0 + kc - 1) * ld + p0 + NR <= data.len());
                            run_panel(isa, &rows, data.as_ptr().add(k0 * ld + p0), ld, c_rows, p0 - cols.start, live, load);
                            continue;
                        }
                        match b {
                            BSource::WeightT(w) => tile::weight_cols(isa, &w, js, ks, &mut s.panel, &mut s.tmp),
                            BSource::F32 { data, ld } => tile::f32_rows(data, ld, ks, js, &mut s.panel),
                            BSource::F32T { data, ld } => tile::f32_cols(isa, data, ld, js, ks, &mut s.panel),
                            BSource::Weight(_) => unreachable!(),
                        }
                        run_panel(isa, &rows, s.panel.as_ptr(), NR, c_rows, p0 - cols.start, live, load);
                    }
                }
            }
        }
    }
}

/// Rows `0..m` of `A` over one block of `k`: packed micro-panels of the kernel's rows, or
/// `A` itself at the block's first `k`, rows `lda` apart.
pub(crate) struct Rows {
    pub a: *const f32,
    pub lda: usize,
    pub packed: bool,
    pub m: usize,
    pub kc: usize,
}

/// Rows `0..m` of `a` over `k0 .. k0 + kc` into `out` as micro-panels of `mr` rows, each
/// `[k][rows]` (the last one holds the remaining rows, with that many per `k`).
#[allow(clippy::too_many_arguments)]
fn pack_a(isa: Isa, a: &[f32], lda: usize, m: usize, k0: usize, kc: usize, mr: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.is_x86() {
        assert!(out.len() >= m * kc && (m - 1) * lda + k0 + kc <= a.len());
        // SAFETY: the path's features are the CPU's; the bounds are checked above.
        unsafe { fill_x86::pack_a(a.as_ptr(), lda, m, k0, kc, mr, out.as_mut_ptr()) };
        return;
    }
    let _ = isa;
    for r0 in (0..m).step_by(mr) {
        let rows = mr.min(m - r0);
        let dst = &mut out[r0 * kc..(r0 + rows) * kc];
        let src = &a[r0 * lda + k0..];
        for r in 0..rows {
            for k in 0..kc {
                dst[k * rows + r] = src[r * lda + k];
            }
        }
    }
}

/// One panel (`kc` × [`NR`] at `b`, rows `ldb` apart) against every row of `rows`, into
/// columns `j0 .. j0 + live` of `C`. Unless `load`, the chains start from zero.
#[allow(clippy::too_many_arguments)]
unsafe fn run_panel(isa: Isa, rows: &Rows, b: *const f32, ldb: usize, c: OutF32, j0: usize, live: usize, load: bool) {
    let tile = Tile { a: rows.a, lda: rows.lda, packed: rows.packed, kc: rows.kc, b, ldb, c: c.ptr.add(j0), ldc: c.ld, live, load };
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => x86::rows_avx512(&tile, rows.m),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => x86::rows_avx2(&tile, rows.m),
        _ => {
            debug_assert!(!tile.packed, "only the SIMD kernels read packed A");
            scalar_rows(&tile, rows.m)
        }
    }
}

/// One panel's product for some rows: what a micro-kernel is handed.
pub(crate) struct Tile {
    /// `A`: packed micro-panels, or at the block's first `k` with rows `lda` apart.
    pub a: *const f32,
    pub lda: usize,
    pub packed: bool,
    pub kc: usize,
    /// The panel, `kc` rows of [`NR`] values, `ldb` apart.
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
