//! AVX2 / AVX-VNNI / AVX-512-VNNI kernels for the super-block formats (`Q4_K`, `Q5_K`,
//! `Q6_K`, `IQ4_XS`) over their interleaved layout ([`super::pack::SuperFields`]), against
//! `Q8_K` activations.
//!
//! A tile is one group of eight weight rows against up to four activation rows. Each
//! 32-byte vector of quants holds four consecutive elements of the eight rows, so a
//! `maddubs` against the activation's four elements broadcast gives, in lane `r`, two
//! 16-bit pair sums of row `r`; the rows never need a horizontal sum, and a tile's eight
//! outputs of an activation row come out as one vector.
//!
//! * [`pairs`] (`Q4_K`, `Q5_K`, scales per 32 elements): the `maddubs` of a group's lanes
//!   add up in 16 bits (exact: eight of nibbles, four of five-bit quants) before one
//!   `madd` by the eight rows' scales, as llama.cpp's repacked `q4_K_8x8` does.
//! * [`lanes`] (`Q6_K`, `IQ4_XS`): llama.cpp's order keeps eight integer lanes per output
//!   (lane `k`: elements `4k..4k + 4` of every 32), so each vector gets its own `madd` by
//!   its scales into lane `k`'s accumulator, and the eight float lanes are summed at the
//!   end as `hsum_float_8` does, the eight rows at once.
//!
//! The integer sums are exact and the float steps run per output in the scalar
//! reference's order, so every output has the reference's bits
//! ([`crate::quant::vec_dot_in`]).

#![allow(clippy::too_many_arguments)]

use std::arch::x86_64::*;
use std::array::from_fn;
use std::ops::Range;

use blink_gguf::GgmlType;

use super::pack::GROUP;
use super::tiling;
use super::x86_kquant::{Ahead, Avx2, AvxVnni, Mac, Vnni};
use super::{Out, RowForm};
use crate::flavour::Flavour;

mod lanes;
mod pairs;

/// A `Q8_K` block: `d` (f32), 256 quants, 16 `i16` sums of 16 quants each.
const ACT_BYTES: usize = 292;
const ACT_QS: usize = 4;
const ACT_BSUMS: usize = 260;

/// Activation rows per tile.
const TILE_ROWS: usize = 4;

/// A super-block format's tile.
trait SuperTile {
    /// Bytes of one group-block (eight blocks).
    const GROUP_BLOCK: usize;

    /// One group of eight rows (`nb` group-blocks at `w`) against the `NA` activation rows
    /// at `a`: per activation row, the eight rows' outputs. Bit `j` of `grouped`: row `j`
    /// is computed as in a group of four ([`crate::quant::vec_dot_grouped`]); with `TILED`,
    /// every row is tiled ([`crate::quant::vec_dot_tiled`]). The next group's bytes are
    /// fetched meanwhile as `ahead` says.
    unsafe fn tile<M: Mac, const NA: usize, const TILED: bool>(nb: usize, w: *const u8, a: [*const u8; NA], grouped: u8, ahead: Ahead) -> [__m256; NA];
}

/// A form the int8 route converts each weight group into once per product, for batches:
/// the quants as the bytes the tile multiplies and the scales as its operands, so the
/// tiles of every activation row load them instead of unpacking them again.
trait Convert {
    /// Whether batches take this route (else the tiles read the packed layout).
    const ROUTE: bool;
    /// Bytes of a group-block of the packed layout converted from.
    const FROM_GROUP_BLOCK: usize;

    /// One packed group-block at `src` converted into the form's group-block at `dst`.
    unsafe fn convert_block(src: *const u8, dst: *mut u8);
}

/// Activation rows from which a product takes the int8 route.
const ROUTE_MIN_ROWS: usize = 4;

/// The `i32` at `p` in every lane.
#[inline(always)]
unsafe fn splat(p: *const u8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn load128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

/// Half `h` (0: low, 1: high) of `v`.
#[inline(always)]
unsafe fn half(v: __m256i, h: usize) -> __m128i {
    if h == 0 {
        _mm256_castsi256_si128(v)
    } else {
        _mm256_extracti128_si256::<1>(v)
    }
}

/// Bytes `8h..8h + 8` of `v` (the eight rows' byte of one field), each twice, widened to
/// `i16` (signed when `SIGNED`): a `madd` operand giving row `r` its value in lane `r`.
#[inline(always)]
unsafe fn rows_twice<const SIGNED: bool>(v: __m128i, h: usize) -> __m256i {
    let twice = if h == 0 {
        _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)
    } else {
        _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)
    };
    let b = _mm_shuffle_epi8(v, twice);
    if SIGNED {
        _mm256_cvtepi8_epi16(b)
    } else {
        _mm256_cvtepu8_epi16(b)
    }
}

/// Bytes `0..8` and `8..16` of `v` interleaved and widened to `i16` (signed when
/// `SIGNED`): lane `r` holds row `r`'s two values, a `madd` operand against a broadcast
/// pair.
#[inline(always)]
unsafe fn rows_paired<const SIGNED: bool>(v: __m128i) -> __m256i {
    let b = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15));
    if SIGNED {
        _mm256_cvtepi8_epi16(b)
    } else {
        _mm256_cvtepu8_epi16(b)
    }
}

/// Write (or add) the first `live` outputs of `v` at `o`.
#[inline(always)]
unsafe fn store(o: *mut f32, v: __m256, live: usize, accumulate: bool) {
    if live == GROUP {
        let v = if accumulate { _mm256_add_ps(_mm256_loadu_ps(o), v) } else { v };
        _mm256_storeu_ps(o, v);
    } else {
        let mut vals = [0f32; GROUP];
        _mm256_storeu_ps(vals.as_mut_ptr(), v);
        super::store_live(o, &vals, live, accumulate);
    }
}

/// `out[r][i] (+)= w_i · a_r` for `i` in each range of `rows` (each starting on a group),
/// `r` in `0..n_act`: every group of a claimed range against every activation tile.
#[inline(always)]
unsafe fn gemm<K: SuperTile, C: SuperTile + Convert, M: Mac, const TILED: bool>(cols: usize, w: &[u8], rows: &mut dyn Iterator<Item = Range<usize>>, act: &[u8], act_stride: usize, n_act: usize, forms: &[RowForm], out: Out) {
    assert!(cols.is_multiple_of(256), "super-block rows are whole blocks");
    let nb = cols / 256;
    let group_bytes = nb * K::GROUP_BLOCK;
    assert!(act.len() >= (n_act - 1) * act_stride + nb * ACT_BYTES, "activations too short");
    // Bit j: activation row j0 + j is computed as in a group of four.
    let mask = |j0: usize, n: usize| (0..n).filter(|&j| forms.get(j0 + j).is_some_and(|f| f.grouped)).fold(0u8, |m, j| m | 1 << j);
    let arow = |j: usize| act.as_ptr().add(j * act_stride);
    // Activation rows that overflow L2 go in panels of half of it; with several panels,
    // the weights go in blocks that stay in L3 between them (`tiling`).
    let panel = tiling::panel_for(n_act, nb * ACT_BYTES, tiling::l2_bytes());
    let block = tiling::weight_block_rows(n_act, panel, group_bytes / GROUP, GROUP, tiling::l3_bytes());
    let route = C::ROUTE && n_act >= ROUTE_MIN_ROWS;
    let mut converted = if route { CONVERTED.take() } else { Vec::new() };
    if route {
        converted.resize(nb * C::GROUP_BLOCK, 0);
    }
    for rows in rows.flat_map(|claimed| tiling::blocks(claimed, block)) {
        assert!(rows.start.is_multiple_of(GROUP), "row ranges of packed matrices start on a group");
        assert!(w.len() >= rows.end.div_ceil(GROUP) * group_bytes, "packed weights shorter than their rows");
        for p0 in (0..n_act).step_by(panel) {
            let p1 = (p0 + panel).min(n_act);
            for g in rows.clone().step_by(GROUP) {
                let live = (rows.end - g).min(GROUP);
                let at = g / GROUP * group_bytes;
                let gw = w.as_ptr().add(at);
                // The first tile of a group fetches the next one (most likely this thread's
                // next, or the next claim's).
                let next = (at + group_bytes).min(w.len())..(at + 2 * group_bytes).min(w.len());
                let mut ahead = Ahead::new(w.as_ptr().add(next.start), next.len(), nb);
                if route {
                    // The next group is fetched while this one converts.
                    for b in 0..nb {
                        ahead.fetch(b);
                        C::convert_block(gw.add(b * C::FROM_GROUP_BLOCK), converted.as_mut_ptr().add(b * C::GROUP_BLOCK));
                    }
                    ahead = Ahead::NONE;
                }
                let mut j0 = p0;
                while j0 < p1 {
                    let na = (p1 - j0).min(TILE_ROWS);
                    let res = if route { tiles::<C, M, TILED>(nb, converted.as_ptr(), na, j0, &arow, mask(j0, na), ahead) } else { tiles::<K, M, TILED>(nb, gw, na, j0, &arow, mask(j0, na), ahead) };
                    for (j, &v) in res.iter().take(na).enumerate() {
                        store(out.ptr.add((j0 + j) * out.ld + g), v, live, out.accumulate);
                    }
                    ahead = Ahead::NONE;
                    j0 += na;
                }
            }
        }
    }
    if route {
        CONVERTED.set(converted);
    }
}

/// One tile of `na` (1 to [`TILE_ROWS`]) activation rows from `j0` against the group at
/// `w`.
#[inline(always)]
unsafe fn tiles<K: SuperTile, M: Mac, const TILED: bool>(nb: usize, w: *const u8, na: usize, j0: usize, arow: &impl Fn(usize) -> *const u8, grouped: u8, ahead: Ahead) -> [__m256; TILE_ROWS] {
    let mut res = [_mm256_setzero_ps(); TILE_ROWS];
    match na {
        1 => res[..1].copy_from_slice(&K::tile::<M, 1, TILED>(nb, w, [arow(j0)], grouped, ahead)),
        2 => res[..2].copy_from_slice(&K::tile::<M, 2, TILED>(nb, w, from_fn(|j| arow(j0 + j)), grouped, ahead)),
        3 => res[..3].copy_from_slice(&K::tile::<M, 3, TILED>(nb, w, from_fn(|j| arow(j0 + j)), grouped, ahead)),
        _ => res = K::tile::<M, TILE_ROWS, TILED>(nb, w, from_fn(|j| arow(j0 + j)), grouped, ahead),
    }
    res
}

thread_local! {
    /// One weight group in the int8 route's form ([`Convert`]); reused, so steady state
    /// does not allocate.
    static CONVERTED: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

macro_rules! dispatch {
    ($name:ident, $mac:ty, $features:literal) => {
        /// Run the packed super-block kernel for `ty`, every activation row tiled as
        /// `tiled`'s build computes it if that is set; false if `ty` has no such kernel.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(ty: GgmlType, cols: usize, w: &[u8], rows: &mut dyn Iterator<Item = Range<usize>>, act: &[u8], act_stride: usize, n_act: usize, forms: &[RowForm], tiled: Option<Flavour>, out: Out) -> bool {
            use GgmlType::*;
            match (ty, tiled) {
                (Q4_K, None) => gemm::<pairs::Q4K, pairs::Q4K, $mac, false>(cols, w, rows, act, act_stride, n_act, forms, out),
                (Q5_K, None) => gemm::<pairs::Q5K, pairs::Bytes<pairs::Q5K>, $mac, false>(cols, w, rows, act, act_stride, n_act, forms, out),
                (Q5_K, Some(_)) => gemm::<pairs::Q5K, pairs::Bytes<pairs::Q5K>, $mac, true>(cols, w, rows, act, act_stride, n_act, forms, out),
                (Q6_K, None) => gemm::<lanes::Q6K, lanes::Bytes<lanes::Q6K>, $mac, false>(cols, w, rows, act, act_stride, n_act, forms, out),
                (Q6_K, Some(_)) => gemm::<lanes::Q6K, lanes::Bytes<lanes::Q6K>, $mac, true>(cols, w, rows, act, act_stride, n_act, forms, out),
                (IQ4_XS, None) => gemm::<lanes::IQ4XS, lanes::Bytes<lanes::IQ4XS>, $mac, false>(cols, w, rows, act, act_stride, n_act, forms, out),
                // The sign trick's products are the AVX2 build's, the AVX-512 build's exact
                // (with `vpdpbusd` only).
                (IQ4_XS, Some(Flavour::Avx2)) => gemm::<lanes::IQ4XS, lanes::Bytes<lanes::IQ4XS>, $mac, true>(cols, w, rows, act, act_stride, n_act, forms, out),
                (IQ4_XS, Some(Flavour::Avx512)) if <$mac as Mac>::DOT4 => gemm::<lanes::Exact<lanes::IQ4XS>, lanes::Bytes<lanes::Exact<lanes::IQ4XS>>, $mac, true>(cols, w, rows, act, act_stride, n_act, forms, out),
                _ => return false,
            }
            true
        }
    };
}

dispatch!(gemm_vnni, Vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
dispatch!(gemm_avx2, Avx2, "avx2,fma,f16c");
dispatch!(gemm_avx_vnni, AvxVnni, "avx2,fma,f16c,avxvnni");
