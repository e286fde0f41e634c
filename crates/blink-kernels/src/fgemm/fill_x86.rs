//! AVX2 panel fillers: the 32-element formats dequantized straight into a panel (each
//! value exactly as [`crate::quant::dequantize_row`] computes it: integer quant, one
//! rounding multiply by the scale, then for `Q4_1`/`Q5_1` one rounding add of the
//! minimum), and f32 rows transposed eight by eight.
//!
//! The helpers are `#[inline(always)]` without features of their own: they are only
//! called from the `#[target_feature]` entry points, into which they inline.
//!
//! Both layouts reduce to the same registers for a group of eight rows and one block:
//! "lane vectors" whose dword `r` holds row `r`'s four quant bytes of one lane (what the
//! interleaved layout of [`crate::gemm::pack`] stores; row-major blocks get there by a
//! 4×4 dword transpose), each row's fifth bits as a dword, and the eight scales and minima.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::gemm::pack::{Fields, GROUP};
use crate::gemm::{Layout, MatRef};
use crate::x86::transpose8;

use super::{KC, NR};

/// A 32-element format's fields: one of those of the interleaved layout, dequantized as
/// `(q + offset) · d (+ m)`.
#[derive(Clone, Copy)]
pub(super) struct Legacy {
    f: Fields,
}

impl Legacy {
    pub(super) fn of(w: &MatRef) -> Option<Legacy> {
        Fields::of(w.ty).map(|f| Legacy { f })
    }
}

/// Zeros standing in for a missing row (a block of any format, or `KC` floats).
static ZERO: [f32; KC] = [0.0; KC];

#[inline(always)]
unsafe fn rd16(p: *const u8) -> i16 {
    p.cast::<i16>().read_unaligned()
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> i32 {
    p.cast::<i32>().read_unaligned()
}

/// The 4×4 dword transpose inside each 128-bit half: dword `i` of output `j` is dword `j`
/// of input `i` (both halves at once).
#[inline(always)]
unsafe fn transpose4(v: [__m256i; 4]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    [_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)]
}

/// One group-block's registers: see the module doc.
struct Group {
    /// 4-bit: lanes 0..4 (low nibbles lane `l`, high nibbles lane `l + 4`); 8-bit: 0..8.
    lanes: [__m256i; 8],
    /// Bit `e` of dword `r`: the fifth bit of row `r`'s element `e`.
    qh: __m256i,
    d: __m256,
    m: __m256,
}

/// The group-block of rows `8g..8g+8`, block `b`, of a packed matrix.
#[inline(always)]
unsafe fn packed_group(q: &Legacy, gb: *const u8) -> Group {
    let f = &q.f;
    let (m_at, qh_at, qs_at) = f.packed_offsets();
    let d = _mm256_cvtph_ps(_mm_loadu_si128(gb.cast()));
    let m = if f.m.is_some() { _mm256_cvtph_ps(_mm_loadu_si128(gb.add(m_at).cast())) } else { _mm256_setzero_ps() };
    let n_lanes = if f.bits == 8 { 8 } else { 4 };
    let mut lanes = [_mm256_setzero_si256(); 8];
    for (l, v) in lanes.iter_mut().enumerate().take(n_lanes) {
        *v = _mm256_loadu_si256(gb.add(qs_at + 32 * l).cast());
    }
    let mut qh = _mm256_setzero_si256();
    if f.qh.is_some() {
        // qh[l] bit 4r+k is element 4l+k of row r.
        let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        for l in 0..8 {
            let x = _mm256_srlv_epi32(_mm256_set1_epi32(rd32(gb.add(qh_at + 4 * l))), shifts);
            qh = _mm256_or_si256(qh, _mm256_sllv_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0xf)), _mm256_set1_epi32(4 * l as i32)));
        }
    }
    Group { lanes, qh, d, m }
}

/// Dwords `0..4` at offset `o` of the blocks at `p[0..8]`, as lane vectors: dword `r` of
/// output `l` is dword `l` of row `r`.
#[inline(always)]
unsafe fn load4(p: &[*const u8; GROUP], o: usize) -> [__m256i; 4] {
    let x: [__m128i; 8] = std::array::from_fn(|r| _mm_loadu_si128(p[r].add(o).cast()));
    transpose4(std::array::from_fn(|r| _mm256_set_m128i(x[r + 4], x[r])))
}

/// The blocks at `p[0..8]` (one per row, row-major) as a group-block's registers.
#[inline(always)]
unsafe fn rows_group(q: &Legacy, p: &[*const u8; GROUP]) -> Group {
    let f = &q.f;
    let h16 = |o: usize| _mm_setr_epi16(rd16(p[0].add(o)), rd16(p[1].add(o)), rd16(p[2].add(o)), rd16(p[3].add(o)), rd16(p[4].add(o)), rd16(p[5].add(o)), rd16(p[6].add(o)), rd16(p[7].add(o)));
    let d = _mm256_cvtph_ps(h16(0));
    let m = match f.m {
        Some(o) => _mm256_cvtph_ps(h16(o)),
        None => _mm256_setzero_ps(),
    };
    let qh = match f.qh {
        Some(o) => _mm256_setr_epi32(rd32(p[0].add(o)), rd32(p[1].add(o)), rd32(p[2].add(o)), rd32(p[3].add(o)), rd32(p[4].add(o)), rd32(p[5].add(o)), rd32(p[6].add(o)), rd32(p[7].add(o))),
        None => _mm256_setzero_si256(),
    };
    let mut lanes = [_mm256_setzero_si256(); 8];
    lanes[..4].copy_from_slice(&load4(p, f.qs));
    if f.bits == 8 {
        lanes[4..].copy_from_slice(&load4(p, f.qs + 16));
    }
    Group { lanes, qh, d, m }
}

/// `T`: which format (const-generic so each filler is compiled for one).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;

const fn bits8(t: u8) -> bool {
    t == Q8_0
}
const fn has_m(t: u8) -> bool {
    t == Q4_1 || t == Q5_1
}
const fn has_qh(t: u8) -> bool {
    t == Q5_0 || t == Q5_1
}
const fn offset(t: u8) -> i32 {
    match t {
        Q4_0 => -8,
        Q5_0 => -16,
        _ => 0,
    }
}

/// Calls `$f::<T>($args)` for `q`'s format.
macro_rules! per_format {
    ($q:expr, $f:ident($($arg:expr),*)) => {{
        let f = &$q.f;
        match (f.bits, f.m.is_some(), f.qh.is_some()) {
            (8, _, _) => $f::<Q8_0>($($arg),*),
            (_, false, false) => $f::<Q4_0>($($arg),*),
            (_, true, false) => $f::<Q4_1>($($arg),*),
            (_, false, true) => $f::<Q5_0>($($arg),*),
            (_, true, true) => $f::<Q5_1>($($arg),*),
        }
    }};
}

/// Integer quants (fifth bit and offset applied) to values: `q · d (+ m)`, each step
/// rounded as the scalar dequantizer rounds it.
#[inline(always)]
unsafe fn scale<const T: u8>(x: __m256i, d: __m256, m: __m256) -> __m256 {
    let x = if offset(T) != 0 { _mm256_add_epi32(x, _mm256_set1_epi32(offset(T))) } else { x };
    let v = _mm256_mul_ps(_mm256_cvtepi32_ps(x), d);
    if has_m(T) {
        _mm256_add_ps(v, m)
    } else {
        v
    }
}

/// Element `e` of the group's eight rows, into `out[e·NR ..][..8]`, for every `e` (lane by
/// lane, the four bytes of a lane with immediate shifts).
#[inline(always)]
unsafe fn emit_cols<const T: u8>(g: &Group, out: *mut f32) {
    let (low, one) = (_mm256_set1_epi32(0xf), _mm256_set1_epi32(1));
    // The fifth bit of element `e`, as 16, from `qh` already shifted right by `e - sh`.
    let fifth = |qh: __m256i| _mm256_slli_epi32::<4>(_mm256_and_si256(qh, one));
    macro_rules! put {
        ($e:expr, $x:expr) => {
            _mm256_storeu_ps(out.add($e * NR), scale::<T>($x, g.d, g.m))
        };
    }
    if bits8(T) {
        for l in 0..8 {
            let v = g.lanes[l];
            macro_rules! byte {
                ($k:literal) => {
                    put!(4 * l + $k, _mm256_srai_epi32::<24>(_mm256_slli_epi32::<{ 24 - 8 * $k }>(v)))
                };
            }
            byte!(0);
            byte!(1);
            byte!(2);
            byte!(3);
        }
    } else {
        for l in 0..4 {
            let v = g.lanes[l];
            // Bits 4l.. of each row's fifth-bit word at bit 0.
            let qh = if has_qh(T) { _mm256_srlv_epi32(g.qh, _mm256_set1_epi32(4 * l as i32)) } else { g.qh };
            macro_rules! nibbles {
                ($k:literal) => {{
                    let mut lo = _mm256_and_si256(_mm256_srli_epi32::<{ 8 * $k }>(v), low);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi32::<{ 8 * $k + 4 }>(v), low);
                    if has_qh(T) {
                        lo = _mm256_or_si256(lo, fifth(_mm256_srli_epi32::<$k>(qh)));
                        hi = _mm256_or_si256(hi, fifth(_mm256_srli_epi32::<{ 16 + $k }>(qh)));
                    }
                    put!(4 * l + $k, lo);
                    put!(16 + 4 * l + $k, hi);
                }};
            }
            nibbles!(0);
            nibbles!(1);
            nibbles!(2);
            nibbles!(3);
        }
    }
}

/// One row's block from its quant bytes (`qs[0]`: 16 bytes, plus `qs[1]` for 8-bit),
/// fifth bits, scale and minimum, into `out[..32]`.
#[inline(always)]
unsafe fn emit_row<const T: u8>(qs: [__m128i; 2], qh: i32, d: __m256, m: __m256, out: *mut f32) {
    let nib = _mm_set1_epi8(0xf);
    let bytes = if bits8(T) { qs } else { [_mm_and_si128(qs[0], nib), _mm_and_si128(_mm_srli_epi16::<4>(qs[0]), nib)] };
    let seq = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for c in 0..4 {
        let src = bytes[c / 2];
        let src = if c % 2 == 1 { _mm_unpackhi_epi64(src, src) } else { src };
        let mut x = if bits8(T) { _mm256_cvtepi8_epi32(src) } else { _mm256_cvtepu8_epi32(src) };
        if has_qh(T) {
            let sh = _mm256_add_epi32(seq, _mm256_set1_epi32(8 * c as i32));
            let h = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(qh), sh), _mm256_set1_epi32(1));
            x = _mm256_or_si256(x, _mm256_slli_epi32::<4>(h));
        }
        _mm256_storeu_ps(out.add(8 * c), scale::<T>(x, d, m));
    }
}

/// `panel[k - ks.start][j - js.start] = W[j][k]` (`B = Wᵀ`), zero past `js`. `js` holds at
/// most [`NR`] rows (from a multiple of [`GROUP`] if packed); `ks` is whole blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weight_cols(q: &Legacy, w: &MatRef, js: Range<usize>, ks: Range<usize>, panel: &mut [f32]) {
    per_format!(q, weight_cols_t(q, w, js, ks, panel))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weight_cols_t<const T: u8>(q: &Legacy, w: &MatRef, js: Range<usize>, ks: Range<usize>, panel: &mut [f32]) {
    let f = &q.f;
    let n_blocks = w.cols / 32;
    let blocks = ks.start / 32..ks.end / 32;
    assert!(js.len() <= NR && panel.len() >= ks.len() * NR && blocks.end <= n_blocks);
    let bytes = w.bytes.as_ptr();
    let out = panel.as_mut_ptr();
    let groups = (js.len().div_ceil(GROUP)).min(NR / GROUP);
    for jg in groups..NR / GROUP {
        for k in 0..ks.len() {
            _mm256_storeu_ps(out.add(k * NR + GROUP * jg), _mm256_setzero_ps());
        }
    }
    // Block by block, the four groups of rows of each (the panel's rows one at a time).
    for (i, b) in blocks.enumerate() {
        for jg in 0..groups {
            let j0 = js.start + GROUP * jg;
            let g = match w.layout {
                Layout::Packed => {
                    let at = (j0 / GROUP * n_blocks + b) * f.group_block();
                    assert!(at + f.group_block() <= w.bytes.len());
                    packed_group(q, bytes.add(at))
                }
                Layout::RowMajor => {
                    assert!(((js.end - 1) * n_blocks + b + 1) * f.block <= w.bytes.len());
                    let p = std::array::from_fn(|r| if j0 + r < js.end { bytes.add(((j0 + r) * n_blocks + b) * f.block) } else { ZERO.as_ptr().cast() });
                    rows_group(q, &p)
                }
            };
            emit_cols::<T>(&g, out.add(i * 32 * NR + GROUP * jg));
        }
    }
}

/// Rows `ks` of `W` over columns `js` (whole blocks) into panel-major `tile`: panel `p`
/// (columns `js.start + p·NR ..`) at `tile[p·kc·NR ..]`, `kc = ks.len()` rows of [`NR`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weight_rows(q: &Legacy, w: &MatRef, ks: Range<usize>, js: Range<usize>, tile: &mut [f32]) {
    per_format!(q, weight_rows_t(q, w, ks, js, tile))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weight_rows_t<const T: u8>(q: &Legacy, w: &MatRef, ks: Range<usize>, js: Range<usize>, tile: &mut [f32]) {
    let f = &q.f;
    let n_blocks = w.cols / 32;
    let kc = ks.len();
    let blocks = js.start / 32..js.end / 32;
    assert!(tile.len() >= blocks.len() * kc * NR && blocks.end <= n_blocks);
    let bytes = w.bytes.as_ptr();
    let tile = tile.as_mut_ptr();
    match w.layout {
        Layout::RowMajor => {
            assert!(ks.end * n_blocks * f.block <= w.bytes.len());
            for (i, k) in ks.enumerate() {
                for (p, b) in blocks.clone().enumerate() {
                    let blk = bytes.add((k * n_blocks + b) * f.block);
                    let qs = [_mm_loadu_si128(blk.add(f.qs).cast()), if bits8(T) { _mm_loadu_si128(blk.add(f.qs + 16).cast()) } else { _mm_setzero_si128() }];
                    let qh = if has_qh(T) { rd32(blk.add(f.qh.unwrap_or(0))) } else { 0 };
                    let h2f = |o: usize| _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(rd16(blk.add(o)) as i32))));
                    let d = h2f(0);
                    let m = if has_m(T) { h2f(f.m.unwrap_or(0)) } else { _mm256_setzero_ps() };
                    emit_row::<T>(qs, qh, d, m, tile.add((p * kc + i) * NR));
                }
            }
        }
        Layout::Packed => {
            for g in ks.start / GROUP..ks.end.div_ceil(GROUP) {
                for (p, b) in blocks.clone().enumerate() {
                    let at = (g * n_blocks + b) * f.group_block();
                    assert!(at + f.group_block() <= w.bytes.len());
                    let grp = packed_group(q, bytes.add(at));
                    // Dword l of row r's quants, back in the original block's byte order.
                    let lo = transpose4([grp.lanes[0], grp.lanes[1], grp.lanes[2], grp.lanes[3]]);
                    let hi = transpose4([grp.lanes[4], grp.lanes[5], grp.lanes[6], grp.lanes[7]]);
                    let half = |v: __m256i, r: usize| if r < 4 { _mm256_castsi256_si128(v) } else { _mm256_extracti128_si256::<1>(v) };
                    let (mut d, mut m, mut qh) = ([0f32; 8], [0f32; 8], [0i32; 8]);
                    _mm256_storeu_ps(d.as_mut_ptr(), grp.d);
                    _mm256_storeu_ps(m.as_mut_ptr(), grp.m);
                    _mm256_storeu_si256(qh.as_mut_ptr().cast(), grp.qh);
                    for r in 0..GROUP {
                        let k = g * GROUP + r;
                        if k < ks.start || k >= ks.end {
                            continue;
                        }
                        let qs = [half(lo[r % 4], r), half(hi[r % 4], r)];
                        emit_row::<T>(qs, qh[r], _mm256_set1_ps(d[r]), _mm256_set1_ps(m[r]), tile.add((p * kc + k - ks.start) * NR));
                    }
                }
            }
        }
    }
}

/// `panel[k·NR + j] = src[j·ld + k]` for `j < live`, `k < kc` (zero for `live ≤ j < NR`).
///
/// # Safety
/// `src` must hold `live` rows of `kc` floats, `ld` apart; `kc ≤ KC`, `live ≤ NR`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn transpose_cols(src: *const f32, ld: usize, live: usize, kc: usize, panel: &mut [f32]) {
    assert!(kc <= KC && live <= NR && panel.len() >= kc * NR);
    let out = panel.as_mut_ptr();
    let k8 = kc / 8 * 8;
    for jg in 0..NR / 8 {
        let rows: [*const f32; 8] = std::array::from_fn(|i| if 8 * jg + i < live { src.add((8 * jg + i) * ld) } else { ZERO.as_ptr() });
        let out = out.add(8 * jg);
        for k in (0..k8).step_by(8) {
            let t = transpose8(std::array::from_fn(|i| _mm256_loadu_ps(rows[i].add(k))));
            for (i, v) in t.iter().enumerate() {
                _mm256_storeu_ps(out.add((k + i) * NR), *v);
            }
        }
        for k in k8..kc {
            for (i, row) in rows.iter().enumerate() {
                *out.add(k * NR + i) = *row.add(k);
            }
        }
    }
}

/// Rows `0..m` of `a` over `k0 .. k0 + kc` as micro-panels of `mr` rows, `[k][rows]`
/// (see `super::pack_a`), eight rows by eight `k` at a time.
///
/// # Safety
/// `a` must hold `m` rows of `k0 + kc` floats, `lda` apart; `out` `m · kc` floats.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_a(a: *const f32, lda: usize, m: usize, k0: usize, kc: usize, mr: usize, out: *mut f32) {
    let k8 = kc / 8 * 8;
    for r0 in (0..m).step_by(mr) {
        let rows = mr.min(m - r0);
        let dst = out.add(r0 * kc);
        let src = a.add(r0 * lda + k0);
        for g in (0..rows).step_by(8) {
            let n = 8.min(rows - g);
            let p: [*const f32; 8] = std::array::from_fn(|i| if i < n { src.add((g + i) * lda) } else { ZERO.as_ptr() });
            for k in (0..k8).step_by(8) {
                let t = transpose8(std::array::from_fn(|i| _mm256_loadu_ps(p[i].add(k))));
                if n == 8 {
                    for (i, v) in t.iter().enumerate() {
                        _mm256_storeu_ps(dst.add((k + i) * rows + g), *v);
                    }
                } else {
                    // Fewer than eight rows (AVX2's three-row panels): through a buffer, as
                    // masked stores are slow on AMD cores (microcoded on Zen 1-3).
                    let mut buf = [0f32; 64];
                    for (i, v) in t.iter().enumerate() {
                        _mm256_storeu_ps(buf.as_mut_ptr().add(8 * i), *v);
                    }
                    // A copy of a constant length inlines; of `n` floats it would call memmove.
                    macro_rules! copy_rows {
                        ($($len:literal)*) => {
                            match n {
                                $($len => for (i, lanes) in buf.chunks_exact(8).enumerate() {
                                    std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst.add((k + i) * rows + g), $len);
                                },)*
                                _ => unreachable!("a group holds 1 to 7 rows here"),
                            }
                        };
                    }
                    copy_rows!(1 2 3 4 5 6 7);
                }
            }
        }
        for k in k8..kc {
            for r in 0..rows {
                *dst.add(k * rows + r) = *src.add(r * lda + k);
            }
        }
    }
}
