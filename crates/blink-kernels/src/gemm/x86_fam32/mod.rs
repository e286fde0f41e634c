//! AVX2 / AVX-VNNI / AVX-512-VNNI kernels for the 32-element formats (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`,
//! `Q8_0`, `IQ4_NL`, `MXFP4`) against their 8-bit activations, over the interleaved layout of [`super::pack`]
//! (row-major matrices are packed a group at a time on the fly).
//!
//! Each block's 32 products reduce to eight exact `i32` lanes of four (VNNI `dpbusd`, on
//! AVX-512VL's 32 registers or AVX-VNNI's 16, or `maddubs` + `madd` on plain AVX2). The lane-major layout puts lane `l` of eight rows in
//! one vector, so a `dpbusd` against the activation's lane `l` broadcast gives that lane for
//! eight rows at once. Then, per output exactly in the order of [`DotAcc`] (so results are
//! bit-identical to the scalar reference):
//!
//! * `Llama` order ([`tiles::tile_lanes`]): one FMA by the eight rows' scales accumulates each
//!   lane, and the final `hsum8` over lanes becomes seven vertical adds giving eight outputs
//!   together. Every 32 products cost a `dpbusd`, a convert and an FMA.
//! * `Block` order ([`tiles::tile_block`]): the lanes add up in integers to each row's block sum,
//!   which one convert and one FMA accumulate: eight `dpbusd` and two float operations per
//!   256 products.
//!
//! [`DotAcc`]: crate::quant::DotAcc

#![allow(clippy::too_many_arguments)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::pack::{pack_group, Fields, GROUP};
use super::tiling;
use super::Layout;
use super::Out;
use crate::cpu::Isa;
use crate::order::DotOrder;

mod groups;
mod tiles;
mod words;

use groups::{groups, Ahead};

/// A 32-element format as the kernel sees it.
pub(super) trait Fam32 {
    const FIELDS: Fields;
    /// Bytes per activation block (`Q8_0`: 34, `Q8_1`: 36); quants start at `ACT_QS`.
    const ACT_BYTES: usize;
    const ACT_QS: usize;
    /// Quants are unpacked as `q + OFFSET` (unsigned); the kernel subtracts `OFFSET · Σa`.
    const OFFSET: i32;
    /// Whether every unpacked quant is below 128 (cheaper products on plain AVX2).
    const SMALL: bool = true;
    /// Quants are signed bytes, used as they are: each product is |q| · (a · sign q),
    /// whose pair sums fit in 16 bits (|q| ≤ 128, |a| ≤ 127), so no offset is needed.
    const SIGNED: bool = false;
    /// 4-bit quants index this table ([`KVALUES_IQ4NL`](crate::quant::KVALUES_IQ4NL),
    /// [`KVALUES_MXFP4`](crate::quant::KVALUES_MXFP4)), whose signed values the kernel
    /// multiplies (one in-lane shuffle per vector); such formats have one order, the block
    /// order.
    const LUT: Option<&'static [i8; 16]> = None;
    /// 8-bit quants are stored as the unsigned bytes the kernel multiplies (the int8
    /// route's [`Bytes`]), not as signed values.
    const STORED_UNSIGNED: bool = false;
    /// The largest magnitude of the quants as the kernel multiplies them.
    const LARGEST: i32 = largest_quant::<Self>();
}

/// `F`'s quants unpacked to a byte each (`q + offset`, as the kernel multiplies them) with
/// `F`'s scales: the layout of an 8-bit format. The int8 route converts a weight group into
/// it once per product ([`to_bytes`]), and every tile of the batch then loads its lanes
/// as they are, with no unpacking.
struct Bytes<F>(std::marker::PhantomData<F>);

impl<F: Fam32> Fam32 for Bytes<F> {
    const FIELDS: Fields = {
        let head = F::FIELDS.scale + if F::FIELDS.m.is_some() { 2 } else { 0 };
        let m = if F::FIELDS.m.is_some() { Some(F::FIELDS.scale) } else { None };
        Fields { block: head + 32, scale: F::FIELDS.scale, m, qh: None, qs: head, bits: 8 }
    };
    const ACT_BYTES: usize = F::ACT_BYTES;
    const ACT_QS: usize = F::ACT_QS;
    const OFFSET: i32 = F::OFFSET;
    const SMALL: bool = F::SMALL;
    const STORED_UNSIGNED: bool = true;
    const LARGEST: i32 = F::LARGEST;
}

/// Whether batches of `F` take the int8 route on `D` in the given order: the formats with
/// fifth bits, whose unpacking (a shuffle, a compare and three logic operations per two
/// lanes) costs more than the tiles' products on plain AVX2 (`Q5_0`, 16 rows: llama order
/// 31 -> 47 GMAC/s, block order 61 -> 82) and in AVX-512's llama order (53 -> 74). Nibbles
/// alone unpack in one or two operations, less than the conversion's loads and stores
/// cost (`Q4_1` 140 -> 114 in AVX-512's block order), and AVX-512's block order gains
/// nothing on `Q5_0` either. Nor does `Q4_1` in AVX2's llama order, whose two lane passes
/// unpack each block twice (128 rows: 55.5 -> 52.6 GMAC/s, medians of five alternating
/// rounds; its per-lane converts and FMAs bound it), or in AVX2's block order, nor `Q4_0`
/// (within the noise).
const fn int8_route<F: Fam32, D: Shape>(block: bool) -> bool {
    F::FIELDS.qh.is_some() && F::LUT.is_none() && (!block || D::INT8_IN_BLOCK_ORDER)
}

/// Whether batches of `ty` take the int8 route on `isa` in `order` (for `blink info`).
pub(super) fn takes_int8_route(isa: Isa, order: DotOrder, ty: blink_gguf::GgmlType) -> bool {
    use blink_gguf::GgmlType as T;
    fn of<D: Shape>(ty: T, block: bool) -> bool {
        match ty {
            T::Q4_0 => int8_route::<Q4_0, D>(block),
            T::IQ4_NL => int8_route::<IQ4NL, D>(block),
            T::MXFP4 => int8_route::<MXFP4, D>(block),
            T::Q4_1 => int8_route::<Q4_1, D>(block),
            T::Q5_0 => int8_route::<Q5_0, D>(block),
            T::Q5_1 => int8_route::<Q5_1, D>(block),
            T::Q8_0 => int8_route::<Q8_0, D>(block),
            _ => false,
        }
    }
    let block = order == DotOrder::Block || super::block_order_only(ty);
    match isa {
        Isa::Avx512Vnni => of::<Vnni>(ty, block),
        Isa::AvxVnni => of::<AvxVnni>(ty, block),
        Isa::Avx2 => of::<Avx2>(ty, block),
        _ => false,
    }
}

/// Whether batches of `ty` take the int16 route ([`words`]) on `isa` (for `blink info`):
/// `Q8_0` on plain AVX2, in either order.
pub(super) fn takes_int16_route(isa: Isa, ty: blink_gguf::GgmlType) -> bool {
    isa == Isa::Avx2 && ty == blink_gguf::GgmlType::Q8_0 && words::takes::<Q8_0>(Avx2::SIGN_TRICK)
}

/// Activation rows from which a product takes the int8 route: the conversion costs about
/// one tile's unpacking.
pub(super) const INT8_MIN_ROWS: usize = 4;

pub(super) use words::WORDS_MIN_ROWS;

/// The packed group at `src` (`n_blocks` group-blocks of `F`) as [`Bytes<F>`] in `dst`,
/// prefetching the `ahead_bytes` at `ahead` meanwhile.
#[inline(always)]
unsafe fn to_bytes<F: Fam32>(n_blocks: usize, src: *const u8, dst: &mut Vec<u8>, ahead: *const u8, ahead_bytes: usize) {
    let (from, to) = (F::FIELDS, Bytes::<F>::FIELDS);
    dst.resize(n_blocks * to.group_block(), 0);
    let (_, _, qs_at) = to.packed_offsets();
    let lines = ahead_bytes.div_ceil(64);
    let per_block = lines.div_ceil(n_blocks);
    for b in 0..n_blocks {
        for line in b * per_block..((b + 1) * per_block).min(lines) {
            _mm_prefetch::<_MM_HINT_T0>(ahead.add(64 * line) as *const i8);
        }
        let (gb, out) = (src.add(b * from.group_block()), dst.as_mut_ptr().add(b * to.group_block()));
        // The scales and minimums, as they are.
        std::ptr::copy_nonoverlapping(gb, out, qs_at);
        for l in 0..4 {
            let (lo, hi) = tiles::unpack_lanes::<F>(gb, l, false);
            _mm256_storeu_si256(out.add(qs_at + 32 * l) as *mut __m256i, lo);
            _mm256_storeu_si256(out.add(qs_at + 32 * (l + 4)) as *mut __m256i, hi);
        }
    }
}

/// The largest magnitude of `F`'s quants as the kernel multiplies them (unsigned `q +
/// offset`, or the table's signed values).
const fn largest_quant<F: Fam32 + ?Sized>() -> i32 {
    match F::LUT {
        Some(table) => {
            let mut largest = 0;
            let mut i = 0;
            while i < table.len() {
                largest = if (table[i] as i32).abs() > largest { (table[i] as i32).abs() } else { largest };
                i += 1;
            }
            largest
        }
        None if F::FIELDS.bits == 8 => 128,
        // Nibbles, and a fifth bit where the format has one.
        None if F::FIELDS.qh.is_some() => 31,
        None => 15,
    }
}

/// Whether a block-order kernel adds its lanes' 16-bit pair sums before widening them
/// (see [`tiles::tile_block`]).
const fn pairs_first<F: Fam32, D: DotU8I8>() -> bool {
    let (signed, _, small) = unsigned_form::<F, D>();
    D::PAIRS && (signed || small) && i16_lanes::<F>() >= 4
}

/// How many lanes' `maddubs` pair sums can add up in 16 bits before they are widened:
/// each pair is at most 2 · largest · 127 (activations are within ±127).
const fn i16_lanes<F: Fam32>() -> usize {
    (i16::MAX as i32 / (2 * F::LARGEST * 127)) as usize
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Q8_0;
pub(super) struct IQ4NL;
pub(super) struct MXFP4;

macro_rules! fam32 {
    ($t:ident, $act_bytes:expr, $act_qs:expr, $offset:expr, $small:expr) => {
        impl Fam32 for $t {
            const FIELDS: Fields = Fields::of_packable(blink_gguf::GgmlType::$t);
            const ACT_BYTES: usize = $act_bytes;
            const ACT_QS: usize = $act_qs;
            const OFFSET: i32 = $offset;
            const SMALL: bool = $small;
            const SIGNED: bool = Self::FIELDS.bits == 8;
        }
    };
}

fam32!(Q4_0, 34, 2, 8, true);
fam32!(Q4_1, 36, 4, 0, true);
fam32!(Q5_0, 34, 2, 16, true);
fam32!(Q5_1, 36, 4, 0, true);
fam32!(Q8_0, 34, 2, 0, true);

/// A 4-bit table format against `Q8_0`.
macro_rules! fam32_table {
    ($t:ident, $ty:ident, $table:path) => {
        impl Fam32 for $t {
            const FIELDS: Fields = Fields::of_packable(blink_gguf::GgmlType::$ty);
            const ACT_BYTES: usize = 34;
            const ACT_QS: usize = 2;
            const OFFSET: i32 = 0;
            const SIGNED: bool = true;
            const LUT: Option<&'static [i8; 16]> = Some(&$table);
        }
    };
}

fam32_table!(IQ4NL, IQ4_NL, crate::quant::KVALUES_IQ4NL);
fam32_table!(MXFP4, MXFP4, crate::quant::KVALUES_MXFP4);

/// Lane sums of unsigned × signed bytes: lane `l` = Σ u[k]·s[k] for k in 4l..4l+4.
pub(super) trait DotU8I8 {
    /// Whether 8-bit formats use the sign trick ([`Fam32::SIGNED`]) rather than being
    /// made unsigned (`q + 128`) with a precomputed `−128 · Σa` per lane.
    const SIGN_TRICK: bool;
    /// Whether a lane's sum is two steps, 16-bit pair sums ([`Self::pairs`]) and their
    /// widening ([`Self::widen`]), so that a block-order kernel can add several lanes'
    /// pairs before one widening.
    const PAIRS: bool = false;
    /// 16-bit sums of adjacent products (values below 128).
    #[inline(always)]
    unsafe fn pairs(u: __m256i, s: __m256i) -> __m256i {
        _mm256_maddubs_epi16(u, s)
    }
    /// Adjacent 16-bit values summed into 32-bit lanes.
    #[inline(always)]
    unsafe fn widen(p: __m256i) -> __m256i {
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }
    /// Any unsigned values.
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;
    /// Unsigned values below 128.
    #[inline(always)]
    unsafe fn dot_small(u: __m256i, s: __m256i) -> __m256i {
        Self::dot(u, s)
    }
    /// `init + dot(u, s)`.
    #[inline(always)]
    unsafe fn dot_from(init: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(init, Self::dot(u, s))
    }
    /// `init + dot_small(u, s)`.
    #[inline(always)]
    unsafe fn dot_small_from(init: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(init, Self::dot_small(u, s))
    }
}

/// VNNI `vpdpbusd`: exact, no saturation.
pub(super) struct Vnni;
/// AVX-VNNI's `vpdpbusd` (VEX-encoded: sixteen registers, as plain AVX2).
pub(super) struct AvxVnni;
/// [`AvxVnni`]'s kernels with the EVEX encoding of the same instruction: what a CPU with
/// AVX-512 VNNI but not AVX-VNNI (Zen 4) can test of that path, all but the encoding.
#[cfg(test)]
pub(super) struct AvxVnniOnEvex;
/// `vpmaddubsw` + `vpmaddwd`: exact for values below 128; larger ones are split.
pub(super) struct Avx2;

/// `dpbusd` products through the intrinsic `$dpbusd` (the EVEX or the VEX encoding).
macro_rules! vnni_dot {
    ($t:ty, $dpbusd:ident) => {
        impl DotU8I8 for $t {
            // `dpbusd` takes any unsigned byte, so the offset costs one broadcast load per
            // lane.
            const SIGN_TRICK: bool = false;
            #[inline(always)]
            unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
                $dpbusd(_mm256_setzero_si256(), u, s)
            }

            #[inline(always)]
            unsafe fn dot_from(init: __m256i, u: __m256i, s: __m256i) -> __m256i {
                $dpbusd(init, u, s)
            }

            #[inline(always)]
            unsafe fn dot_small_from(init: __m256i, u: __m256i, s: __m256i) -> __m256i {
                $dpbusd(init, u, s)
            }
        }
    };
}

vnni_dot!(Vnni, _mm256_dpbusd_epi32);
vnni_dot!(AvxVnni, _mm256_dpbusd_avx_epi32);
#[cfg(test)]
vnni_dot!(AvxVnniOnEvex, _mm256_dpbusd_epi32);

impl DotU8I8 for Avx2 {
    // Unsigned bytes of 128 and more would need `dot`'s split.
    const SIGN_TRICK: bool = true;
    const PAIRS: bool = true;
    #[inline(always)]
    unsafe fn dot_small(u: __m256i, s: __m256i) -> __m256i {
        Self::widen(Self::pairs(u, s))
    }

    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        // Σ u·s = Σ (u & 127)·s + 128 · Σ (u >> 7)·s, so no i16 pair sum can saturate.
        let low = _mm256_and_si256(u, _mm256_set1_epi8(0x7f));
        let top = _mm256_and_si256(_mm256_srli_epi16(u, 7), _mm256_set1_epi8(1));
        _mm256_add_epi32(Self::dot_small(low, s), _mm256_slli_epi32(Self::dot_small(top, s), 7))
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u16).read_unaligned() as i32)))
}

/// How the kernel reads `F` on `D`: (signed quants with the sign trick, offset added to
/// make them unsigned, unsigned values all below 128).
#[inline(always)]
const fn unsigned_form<F: Fam32, D: DotU8I8>() -> (bool, i32, bool) {
    if F::SIGNED && !D::SIGN_TRICK {
        (false, 128, false)
    } else {
        (F::SIGNED, F::OFFSET, F::SMALL)
    }
}

/// Activation rows per tile when there are several, in each order, and the passes a
/// `Llama`-order tile makes over the lanes ([`tiles::tile_lanes`]).
pub(super) trait Shape {
    const LANE_PASSES: usize;
    const WIDE_LANES: usize;
    const WIDE_BLOCK: usize;
    /// The block order's, where its lanes add as pairs first ([`pairs_first`]).
    const WIDE_BLOCK_PAIRS: usize = Self::WIDE_BLOCK;
    /// Whether the block order takes the int8 route ([`int8_route`]).
    const INT8_IN_BLOCK_ORDER: bool = true;
    /// Whether a group too long for L1 goes in chunks ([`groups`]'s k-cut): on plain
    /// AVX2, whose tiles read a group twice (two lane passes) from L2 otherwise (14336
    /// columns, 16 rows: `Q8_0` 34 -> 44 GMAC/s, `Q4_1` 48.5 -> 51), not with AVX-512's
    /// registers, where the chunks' overhead weighs more than L2 reads (4096 columns:
    /// `Q4_1` 93 -> 81). AVX-VNNI keeps whole groups too (not measured: no machine here
    /// has it; its products are VNNI's).
    const K_CUT: bool = false;
    #[inline(always)]
    fn wide(block: bool, pairs_first: bool) -> usize {
        match (block, pairs_first) {
            (true, true) => Self::WIDE_BLOCK_PAIRS,
            (true, false) => Self::WIDE_BLOCK,
            (false, _) => Self::WIDE_LANES,
        }
    }
}

impl Shape for Vnni {
    // 32 vector registers. Lanes: 16 accumulators, 2 weight lanes and temporaries (three
    // rows spill: measured 52 against 74 GMAC/s). Block: three per activation row (an
    // accumulator, two integer chains), the weight lanes and temporaries.
    const LANE_PASSES: usize = 1;
    const WIDE_LANES: usize = 2;
    const WIDE_BLOCK: usize = 4;
    const INT8_IN_BLOCK_ORDER: bool = false;
}

// AVX2's sixteen registers with Vnni's products: the lanes in two passes of two rows,
// the block order's three registers per row two rows at a time. (Not measured: no machine
// here has AVX-VNNI; the shapes are AVX2's, which fit its registers.)
macro_rules! avx_vnni_shape {
    ($t:ty) => {
        impl Shape for $t {
            const LANE_PASSES: usize = 2;
            const WIDE_LANES: usize = 2;
            const WIDE_BLOCK: usize = 2;
        }
    };
}

avx_vnni_shape!(AvxVnni);
#[cfg(test)]
avx_vnni_shape!(AvxVnniOnEvex);

impl Shape for Avx2 {
    // 16 vector registers. Lanes, in two passes: 4 accumulators and a scale per activation
    // row, a weight lane and temporaries (one pass over all eight lanes holds only one
    // row: 8 accumulators). Block: three per activation row, the weight lanes and
    // temporaries (three rows spill); adding 16-bit pairs first, two 16-bit sums and an
    // accumulator per row, and three rows fit (Q4_1: 89 -> 94 GMAC/s).
    const LANE_PASSES: usize = 2;
    const WIDE_LANES: usize = 2;
    const WIDE_BLOCK: usize = 2;
    const WIDE_BLOCK_PAIRS: usize = 3;
    const K_CUT: bool = true;
}

/// `out[r][i] (+)= w_i · a_r` for `i` in each range of `rows`, `r` in `0..n_act`. `w` is
/// the packed matrix (each range must start on a group boundary), or with `ROW_MAJOR` the
/// file's row-major one, each group of which is packed on the fly into a buffer that
/// stays in L1 (no repacked copy: a mapped or streamed window).
#[inline(always)]
unsafe fn gemm<F: Fam32, D: DotU8I8 + Shape, const BLOCK: bool, const ROW_MAJOR: bool>(cols: usize, w: &[u8], rows: &mut dyn Iterator<Item = Range<usize>>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    let Some(first) = rows.next() else {
        return;
    };
    let n_blocks = cols / 32;
    let group_bytes = n_blocks * F::FIELDS.group_block();
    assert!(act.len() >= (n_act - 1) * act_stride + n_blocks * F::ACT_BYTES, "activations too short");
    // Taken out and put back (no closure: it would not inherit this function's target
    // features, and the kernels would not inline).
    let mut scales = ACT_SCALES.take();
    scales.clear();
    for j in 0..n_act {
        for b in 0..n_blocks {
            let ab = act.as_ptr().add(j * act_stride + b * F::ACT_BYTES);
            let s = if F::FIELDS.m.is_some() { f16_at(ab.add(2)) } else { 0.0 };
            scales.extend_from_slice(&[f16_at(ab), s]);
        }
    }
    let mut offsets = ACT_OFFSETS.take();
    offsets.clear();
    let (_, offset, _) = unsigned_form::<F, D>();
    if offset != 0 {
        // −offset · Σa for every activation row and block: per lane of four in the lanes
        // order, per block in the block order.
        let shift = _mm256_set1_epi32(offset.trailing_zeros() as i32);
        for j in 0..n_act {
            for b in 0..n_blocks {
                let q = act.as_ptr().add(j * act_stride + b * F::ACT_BYTES + F::ACT_QS);
                let sums = D::dot_small(_mm256_set1_epi8(1), _mm256_loadu_si256(q as *const __m256i));
                let negated = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_sllv_epi32(sums, shift));
                let mut lanes = [0i32; 8];
                _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, negated);
                if BLOCK {
                    offsets.push(lanes.iter().sum());
                } else {
                    offsets.extend_from_slice(&lanes);
                }
            }
        }
    }
    let mut group = Vec::new();
    if ROW_MAJOR {
        group = GROUP_BUF.take();
        group.resize(group_bytes, 0);
    }
    // The int8 route: each group converted once, its tiles then load bytes.
    let int8 = int8_route::<F, D>(BLOCK) && n_act >= INT8_MIN_ROWS;
    // Or the int16 route: each group chunk widened once per panel, and the panel's
    // activation rows (`words`).
    let words = words::takes::<F>(D::SIGN_TRICK) && n_act >= WORDS_MIN_ROWS && n_blocks > 0;
    let mut bytes = if int8 || words { BYTES_BUF.take() } else { Vec::new() };
    let bytes_group = n_blocks * Bytes::<F>::FIELDS.group_block();
    let mut act_words = if words { ACT_WORDS.take() } else { Vec::new() };
    let mut partial = if words { PARTIAL.take() } else { Vec::new() };
    // Activation rows that overflow L2 go in panels of half of it (`tiling`); each claimed
    // range of weight groups runs against one panel after another.
    let act_row_bytes = n_blocks * if words { words::ACT_WORDS_BLOCK } else { F::ACT_BYTES };
    let panel = tiling::panel_for(n_act, act_row_bytes, tiling::l2_bytes());
    // The rows widened once if they are one panel, else each panel as it comes (so the
    // widened rows never outgrow a panel).
    if words && panel >= n_act {
        words::widen_activations::<F>(act.as_ptr(), act_stride, n_act, n_blocks, &mut act_words);
    }
    let per_row = if BLOCK { n_blocks } else { 8 * n_blocks };
    let (all_act, all_scales, all_offsets, all_out) = (act, &scales[..], &offsets[..], out);
    // With several panels, the weights go in blocks that stay in L3 between them.
    let block = tiling::weight_block_rows(n_act, panel, n_blocks * F::FIELDS.block, GROUP, tiling::l3_bytes());
    let all_n_act = n_act;
    for rows in std::iter::once(first).chain(rows).flat_map(|claimed| tiling::blocks(claimed, block)) {
        for p0 in (0..n_act).step_by(panel) {
            let n_act = (n_act - p0).min(panel);
            let act = &all_act[p0 * act_stride..];
            if words && panel < all_n_act {
                words::widen_activations::<F>(act.as_ptr(), act_stride, n_act, n_blocks, &mut act_words);
            }
            let act_words = &act_words[..];
            let (scales, offsets) = (&all_scales[2 * p0 * n_blocks..], if all_offsets.is_empty() { all_offsets } else { &all_offsets[p0 * per_row..] });
            let out = Out { ptr: all_out.ptr.add(p0 * all_out.ld), ..all_out };
            if ROW_MAJOR {
                let row_bytes = n_blocks * F::FIELDS.block;
                for g in rows.clone().step_by(GROUP) {
                    let live = (rows.end - g).min(GROUP);
                    // A group's rows are one run of memory, and the groups follow each other:
                    // the run `AHEAD` groups on is asked for while this one is packed, a few
                    // lines per block.
                    let ahead = ((g + AHEAD * GROUP) * row_bytes).min(w.len())..((g + (AHEAD + 1) * GROUP) * row_bytes).min(w.len());
                    if live == GROUP && F::FIELDS.qh.is_none() {
                        assert!(w.len() >= (g + GROUP) * row_bytes, "row-major weights shorter than their rows");
                        pack_whole_group::<F>(n_blocks, w.as_ptr().add(g * row_bytes), row_bytes, group.as_mut_ptr(), w.as_ptr().add(ahead.start), ahead.len());
                    } else {
                        for line in ahead.step_by(64) {
                            _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(line) as *const i8);
                        }
                        pack_group(&F::FIELDS, cols, w, g..g + live, &mut group);
                    }
                    let out = Out { ptr: out.ptr.add(g), ..out };
                    if words {
                        words::group_tiles::<F, BLOCK>(n_blocks, group.as_ptr(), &mut bytes, act_words, n_act, scales, live, out, (std::ptr::null(), 0), &mut partial);
                    } else if int8 {
                        to_bytes::<F>(n_blocks, group.as_ptr(), &mut bytes, std::ptr::null(), 0);
                        groups::<Bytes<F>, D, BLOCK>(n_blocks, bytes_group, &bytes, 0..live, act, act_stride, n_act, scales, offsets, out);
                    } else {
                        groups::<F, D, BLOCK>(n_blocks, group_bytes, &group, 0..live, act, act_stride, n_act, scales, offsets, out);
                    }
                }
                continue;
            }
            assert!(rows.start.is_multiple_of(GROUP), "row ranges of packed matrices start on a group");
            assert!(w.len() >= rows.end.div_ceil(GROUP) * group_bytes, "packed weights shorter than their rows");
            if int8 || words {
                for g in rows.clone().step_by(GROUP) {
                    let live = (rows.end - g).min(GROUP);
                    let at = g / GROUP * group_bytes;
                    // The next group (this thread's next chunk most likely starts there too) is
                    // asked for while this one converts.
                    let next = (at + group_bytes).min(w.len())..(at + 2 * group_bytes).min(w.len());
                    let out = Out { ptr: out.ptr.add(g), ..out };
                    if words {
                        words::group_tiles::<F, BLOCK>(n_blocks, w.as_ptr().add(at), &mut bytes, act_words, n_act, scales, live, out, (w.as_ptr().add(next.start), next.len()), &mut partial);
                        continue;
                    }
                    to_bytes::<F>(n_blocks, w.as_ptr().add(at), &mut bytes, w.as_ptr().add(next.start), next.len());
                    groups::<Bytes<F>, D, BLOCK>(n_blocks, bytes_group, &bytes, 0..live, act, act_stride, n_act, scales, offsets, out);
                }
                continue;
            }
            groups::<F, D, BLOCK>(n_blocks, group_bytes, w, rows.clone(), act, act_stride, n_act, scales, offsets, out);
        }
    }
    if ROW_MAJOR {
        GROUP_BUF.set(group);
    }
    if int8 || words {
        BYTES_BUF.set(bytes);
    }
    if words {
        ACT_WORDS.set(act_words);
        PARTIAL.set(partial);
    }
    ACT_SCALES.set(scales);
    ACT_OFFSETS.set(offsets);
}

/// Groups ahead of the one being packed whose rows a row-major product prefetches.
const AHEAD: usize = 2;

/// [`pack_group`] of eight whole rows of a format without fifth bits, whose lanes are
/// four bytes moved whole: per block, the rows' 16-byte runs of quants are transposed as
/// 8 × 4 words into four vectors of one lane each (twice for the 32 bytes of `Q8_0`).
///
/// The `ahead_bytes` at `ahead` are prefetched meanwhile, spread over the blocks.
///
/// # Safety
/// `src` must hold eight rows of `row_bytes`, and `dst` `n_blocks` group-blocks.
#[inline(always)]
unsafe fn pack_whole_group<F: Fam32>(n_blocks: usize, src: *const u8, row_bytes: usize, dst: *mut u8, ahead: *const u8, ahead_bytes: usize) {
    let f = F::FIELDS;
    let (m_at, _, qs_at) = f.packed_offsets();
    assert!(8 * row_bytes <= i32::MAX as usize, "rows too long to gather");
    let halves = if f.bits == 8 { 2 } else { 1 };
    let rb = row_bytes as i32;
    let rows_at = _mm256_setr_epi32(0, rb, 2 * rb, 3 * rb, 4 * rb, 5 * rb, 6 * rb, 7 * rb);
    // Per 128-bit half (four rows' words `d m`): the four `d`s, then the four `m`s.
    const D_THEN_M: __m256i = unsafe { std::mem::transmute::<[u8; 32], __m256i>([0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]) };
    let lines = ahead_bytes.div_ceil(64);
    let per_block = lines.div_ceil(n_blocks);
    for b in 0..n_blocks {
        for line in b * per_block..((b + 1) * per_block).min(lines) {
            _mm_prefetch::<_MM_HINT_T0>(ahead.add(64 * line) as *const i8);
        }
        let gb = dst.add(b * f.group_block());
        let blk = |r: usize| src.add(r * row_bytes + b * f.block);
        if f.scale == 1 {
            // One byte each (`MXFP4`'s exponents).
            for r in 0..GROUP {
                *gb.add(r) = *blk(r);
            }
        } else {
            // Each row's first four bytes (`d`, then `m` or two quant bytes) in one gather;
            // the `d`s, then the `m`s, drawn out of them in row order.
            let heads = _mm256_i32gather_epi32::<1>(src.add(b * f.block) as *const i32, rows_at);
            let split = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(heads, D_THEN_M));
            if f.m.is_some() {
                debug_assert_eq!((f.m, m_at), (Some(2), 2 * GROUP));
                _mm256_storeu_si256(gb as *mut __m256i, split);
            } else {
                _mm_storeu_si128(gb as *mut __m128i, _mm256_castsi256_si128(split));
            }
        }
        for h in 0..halves {
            let run = |r: usize| blk(r).add(f.qs + 16 * h) as *const __m128i;
            // Rows r and r + 4 in the two halves of one vector.
            let pair = |r: usize| _mm256_loadu2_m128i(run(r + 4), run(r));
            let (a, b, c, d) = (pair(0), pair(1), pair(2), pair(3));
            let (ab_lo, ab_hi) = (_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
            let (cd_lo, cd_hi) = (_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
            let lanes = [
                _mm256_unpacklo_epi64(ab_lo, cd_lo),
                _mm256_unpackhi_epi64(ab_lo, cd_lo),
                _mm256_unpacklo_epi64(ab_hi, cd_hi),
                _mm256_unpackhi_epi64(ab_hi, cd_hi),
            ];
            for (l, v) in lanes.into_iter().enumerate() {
                _mm256_storeu_si256(gb.add(qs_at + 32 * (4 * h + l)) as *mut __m256i, v);
            }
        }
    }
}

thread_local! {
    /// Each activation row's block scales (`d`, and `s` for `Q8_1`) as f32, converted once
    /// per product instead of once per weight group; reused, so steady state does not
    /// allocate.
    static ACT_SCALES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// Each activation row's `−offset · Σa` per lane and block, for unsigned forms with an
    /// offset; likewise reused.
    static ACT_OFFSETS: std::cell::Cell<Vec<i32>> = const { std::cell::Cell::new(Vec::new()) };
    /// Each activation row's running sums between the chunks of a k-cut product
    /// ([`tiles::Chunk`]); likewise reused.
    static PARTIAL: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// One weight group packed on the fly from a row-major matrix; likewise reused.
    static GROUP_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    /// Activation rows widened for the int16 route ([`words`]); likewise reused.
    static ACT_WORDS: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    /// One weight group converted for the int8 route ([`Bytes`]) or widened for the int16
    /// route; likewise reused.
    static BYTES_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

macro_rules! dispatch {
    ($name:ident, $dot:ty, $features:literal) => {
        /// Run the kernel for `ty` over `layout`; false if `ty` has none.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(order: DotOrder, ty: blink_gguf::GgmlType, layout: Layout, cols: usize, w: &[u8], rows: &mut dyn Iterator<Item = Range<usize>>, act: &[u8], act_stride: usize, n_act: usize, out: Out) -> bool {
            use blink_gguf::GgmlType as T;
            macro_rules! run {
                ($f:ty) => {
                    match (order, layout) {
                        (DotOrder::Llama, Layout::Packed) => gemm::<$f, $dot, false, false>(cols, w, rows, act, act_stride, n_act, out),
                        (DotOrder::Block, Layout::Packed) => gemm::<$f, $dot, true, false>(cols, w, rows, act, act_stride, n_act, out),
                        (DotOrder::Llama, Layout::RowMajor) => gemm::<$f, $dot, false, true>(cols, w, rows, act, act_stride, n_act, out),
                        (DotOrder::Block, Layout::RowMajor) => gemm::<$f, $dot, true, true>(cols, w, rows, act, act_stride, n_act, out),
                    }
                };
            }
            match ty {
                // One order: llama.cpp's (repacked `q4_0_8x8`) is the block order.
                T::Q4_0 => match layout {
                    Layout::Packed => gemm::<Q4_0, $dot, true, false>(cols, w, rows, act, act_stride, n_act, out),
                    Layout::RowMajor => gemm::<Q4_0, $dot, true, true>(cols, w, rows, act, act_stride, n_act, out),
                },
                T::Q4_1 => run!(Q4_1),
                T::Q5_0 => run!(Q5_0),
                T::Q5_1 => run!(Q5_1),
                T::Q8_0 => run!(Q8_0),
                T::IQ4_NL => match layout {
                    Layout::Packed => gemm::<IQ4NL, $dot, true, false>(cols, w, rows, act, act_stride, n_act, out),
                    Layout::RowMajor => gemm::<IQ4NL, $dot, true, true>(cols, w, rows, act, act_stride, n_act, out),
                },
                T::MXFP4 => match layout {
                    Layout::Packed => gemm::<MXFP4, $dot, true, false>(cols, w, rows, act, act_stride, n_act, out),
                    Layout::RowMajor => gemm::<MXFP4, $dot, true, true>(cols, w, rows, act, act_stride, n_act, out),
                },
                _ => return false,
            }
            true
        }
    };
}

dispatch!(gemm_vnni, Vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
dispatch!(gemm_avx2, Avx2, "avx2,fma,f16c");
dispatch!(gemm_avx_vnni, AvxVnni, "avx2,fma,f16c,avxvnni");
#[cfg(test)]
dispatch!(gemm_avx_vnni_on_evex, AvxVnniOnEvex, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");

#[cfg(test)]
mod tests;
