//! The lattice formats' kernels (`IQ2_XXS`, `IQ2_XS`, `IQ2_S`, `IQ3_XXS`, `IQ3_S`; see
//! `quant::lattice`): each run decoded by the reference, its magnitudes against the
//! activations with the signs put on the activations. A batch decodes each block once
//! ([`gemm_lattice`]).

#![allow(clippy::too_many_arguments)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{gemm, load, KQuant, Mac, ACT_QS};
use crate::gemm::{Out, RowForm};
use crate::quant::Lattice;

/// A lattice format (see `quant::lattice`): each run decoded by the reference's
/// [`Lattice::run`], then its magnitudes against the activations with the signs put on
/// the activations (`(a ^ m) − m`, wrapping at −128 as `sign_epi8`).
pub(super) struct Grid<B>(std::marker::PhantomData<B>);

/// Bit `e` of `bits` as 0xff in byte `e`.
#[inline(always)]
unsafe fn bit_masks(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
}

impl<B: Lattice> KQuant for Grid<B> {
    const BYTES: usize = B::BYTES;
    const D: usize = 0;
    const DMIN: Option<usize> = None;
    const LANES: bool = true;
    const FINAL: f32 = B::UNIT;

    #[inline(always)]
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
        let block = B::read(std::slice::from_raw_parts(w, B::BYTES));
        let mut acc = [_mm256_setzero_si256(); NA];
        for r in 0..8 {
            let run = block.run(r);
            let g = run.grid;
            let mags = _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64);
            let neg = bit_masks(run.negative);
            let s = _mm256_setr_m128i(_mm_set1_epi16(run.scales[0] as i16), _mm_set1_epi16(run.scales[1] as i16));
            for j in 0..NA {
                let q = load(a[j].add(ACT_QS + 32 * r));
                let signed = _mm256_sub_epi8(_mm256_xor_si256(q, neg), neg);
                acc[j] = M::mac(acc[j], _mm256_maddubs_epi16(mags, signed), s);
            }
        }
        (acc, [_mm256_setzero_si256(); NA])
    }
}

/// A lattice block expanded for batches (`Expanded`): per run its magnitudes (32 bytes),
/// its negative elements as 0xff bytes (32) and its two odd scales (`i16`), then `d`.
const RUN_BYTES: usize = 68;
const EXPANDED_BYTES: usize = 8 * RUN_BYTES + 2;

/// Lattice blocks decoded once ([`expand_rows`]) and read by many activation tiles: a
/// prompt's product decodes each block once rather than once per tile.
struct Expanded<B>(std::marker::PhantomData<B>);

impl<B: Lattice> KQuant for Expanded<B> {
    const BYTES: usize = EXPANDED_BYTES;
    const D: usize = 8 * RUN_BYTES;
    const DMIN: Option<usize> = None;
    const LANES: bool = true;
    const FINAL: f32 = B::UNIT;

    #[inline(always)]
    unsafe fn ints<M: Mac, const NA: usize>(w: *const u8, a: &[*const u8; NA]) -> ([__m256i; NA], [__m256i; NA]) {
        let mut acc = [_mm256_setzero_si256(); NA];
        for r in 0..8 {
            let at = w.add(RUN_BYTES * r);
            let (mags, neg) = (load(at), load(at.add(32)));
            let sc = |h: usize| (at.add(64 + 2 * h) as *const i16).read_unaligned();
            let s = _mm256_setr_m128i(_mm_set1_epi16(sc(0)), _mm_set1_epi16(sc(1)));
            for j in 0..NA {
                let q = load(a[j].add(ACT_QS + 32 * r));
                let signed = _mm256_sub_epi8(_mm256_xor_si256(q, neg), neg);
                acc[j] = M::mac(acc[j], _mm256_maddubs_epi16(mags, signed), s);
            }
        }
        (acc, [_mm256_setzero_si256(); NA])
    }
}

/// Expand `rows` rows of `nb` lattice blocks at `w` into `dst` (`Expanded`'s layout).
#[inline(always)]
unsafe fn expand_rows<B: Lattice>(w: *const u8, rows: usize, nb: usize, dst: *mut u8) {
    for k in 0..rows * nb {
        let block = B::read(std::slice::from_raw_parts(w.add(k * B::BYTES), B::BYTES));
        let out = dst.add(k * EXPANDED_BYTES);
        for r in 0..8 {
            let run = block.run(r);
            let at = out.add(RUN_BYTES * r);
            let g = run.grid;
            _mm256_storeu_si256(at as *mut __m256i, _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64));
            _mm256_storeu_si256(at.add(32) as *mut __m256i, bit_masks(run.negative));
            (at.add(64) as *mut i16).write_unaligned(run.scales[0] as i16);
            (at.add(66) as *mut i16).write_unaligned(run.scales[1] as i16);
        }
        std::ptr::copy_nonoverlapping(w.add(k * B::BYTES), out.add(8 * RUN_BYTES), 2);
    }
}

thread_local! {
    /// Expanded lattice rows; reused, so steady state does not allocate.
    static EXPANDED: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Activation rows from which a lattice product expands its weights first.
const EXPAND_FROM: usize = 8;

/// [`gemm`] for a lattice format: a batch of at least [`EXPAND_FROM`] activation rows
/// runs over weight rows expanded a chunk at a time.
#[inline(always)]
pub(super) unsafe fn gemm_lattice<B: Lattice, M: Mac, const NA: usize, const NR: usize>(
    cols: usize,
    w: &[u8],
    rows: Range<usize>,
    act: &[u8],
    act_stride: usize,
    n_act: usize,
    grouped: &[RowForm],
    out: Out,
) {
    if n_act < EXPAND_FROM {
        return gemm::<Grid<B>, M, NA, NR>(cols, w, rows, act, act_stride, n_act, grouped, out);
    }
    assert!(cols.is_multiple_of(256), "lattice rows are whole super-blocks");
    let nb = cols / 256;
    let rb = nb * B::BYTES;
    assert!(w.len() >= rows.end * rb, "weights shorter than their rows");
    // A chunk's expanded rows stay in L2 while every activation tile passes over them.
    let chunk = (64 * 1024 / (nb * EXPANDED_BYTES)).clamp(1, 64);
    let mut buf = EXPANDED.take();
    buf.resize(chunk * nb * EXPANDED_BYTES, 0);
    for c0 in rows.clone().step_by(chunk) {
        let n = (rows.end - c0).min(chunk);
        expand_rows::<B>(w.as_ptr().add(c0 * rb), n, nb, buf.as_mut_ptr());
        let out = Out { ptr: out.ptr.add(c0), ..out };
        gemm::<Expanded<B>, M, NA, NR>(cols, &buf[..n * nb * EXPANDED_BYTES], 0..n, act, act_stride, n_act, grouped, out);
    }
    EXPANDED.set(buf);
}
