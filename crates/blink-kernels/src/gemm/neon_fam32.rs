//! NEON kernels (with the dot-product extension) for the 32-element formats (`Q4_0`,
//! `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`, `IQ4_NL`, `MXFP4`) against their 8-bit activations, over the interleaved
//! layout of [`super::pack`].
//!
//! The structure of the x86 kernels on 128-bit vectors: lane `l` of a packed group's eight
//! rows is 32 bytes, rows 0-3 then rows 4-7, so one `SDOT` of a half against the
//! activation's lane `l` (the by-element form, which broadcasts one 32-bit lane of a
//! register) adds that lane's products for four rows. Weights are unpacked to signed bytes
//! (`q - 8`, `q - 16`, or as stored; the unsigned quants of `Q4_1`/`Q5_1` fit as they
//! are), so no correction term is needed. Then, per output exactly in the order of
//! [`DotAcc`], so results are bit-identical to the scalar reference:
//!
//! * `Llama` order: each lane sum is converted and accumulated with one FMA by `d_w·d_a`
//!   per lane and block, the `m·s` terms go to a separate tail (multiply, then add), and
//!   the lanes are summed in `hsum8` order. A tile is half a group (four rows) × one or
//!   two activation rows: eight accumulators per row.
//! * `Block` order: the lanes add up in integers to each row's block sum, which one
//!   convert and one FMA add to the row's result, then one more FMA adds `m_w·s_a`. A tile
//!   is half a group × up to four activation rows: an accumulator and two integer chains
//!   per row. With the int8 matrix multiply (`Isa::NeonI8mm`), pairs of activation rows
//!   go through `SMMLA` instead ([`tile_mmla`]), the same block sums.
//!
//! [`DotAcc`]: crate::quant::DotAcc

#![allow(clippy::too_many_arguments)]

use std::arch::aarch64::*;
use std::ops::Range;

use super::pack::{Fields, GROUP};
use super::Out;
use crate::order::DotOrder;
use crate::neon::{f16x4_to_f32, load_f16x4, sdot_lane, smmla, splat_f16};

/// Rows per tile: half a packed group, one 128-bit vector of lane sums.
const HALF: usize = GROUP / 2;

/// A 32-element format as the kernel sees it.
trait Fam32 {
    const FIELDS: Fields;
    /// Bytes per activation block (`Q8_0`: 34, `Q8_1`: 36); quants start at `ACT_QS`.
    const ACT_BYTES: usize;
    const ACT_QS: usize;
    /// Subtracted from each unpacked quant to give the signed weight.
    const OFFSET: i8;
    /// 4-bit quants index this table ([`KVALUES_IQ4NL`](crate::quant::KVALUES_IQ4NL),
    /// [`KVALUES_MXFP4`](crate::quant::KVALUES_MXFP4)): one lookup per vector gives the
    /// signed weights.
    const LUT: Option<&'static [i8; 16]> = None;
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;
struct IQ4NL;
struct MXFP4;

macro_rules! fam32 {
    ($t:ident, $act_bytes:expr, $act_qs:expr, $offset:expr) => {
        impl Fam32 for $t {
            const FIELDS: Fields = Fields::of_packable(blink_gguf::GgmlType::$t);
            const ACT_BYTES: usize = $act_bytes;
            const ACT_QS: usize = $act_qs;
            const OFFSET: i8 = $offset;
        }
    };
}

fam32!(Q4_0, 34, 2, 8);
fam32!(Q4_1, 36, 4, 0);
fam32!(Q5_0, 34, 2, 16);
fam32!(Q5_1, 36, 4, 0);
fam32!(Q8_0, 34, 2, 0);

/// A 4-bit table format against `Q8_0`.
macro_rules! fam32_table {
    ($t:ident, $ty:ident, $table:path) => {
        impl Fam32 for $t {
            const FIELDS: Fields = Fields::of_packable(blink_gguf::GgmlType::$ty);
            const ACT_BYTES: usize = 34;
            const ACT_QS: usize = 2;
            const OFFSET: i8 = 0;
            const LUT: Option<&'static [i8; 16]> = Some(&$table);
        }
    };
}

fam32_table!(IQ4NL, IQ4_NL, crate::quant::KVALUES_IQ4NL);
fam32_table!(MXFP4, MXFP4, crate::quant::KVALUES_MXFP4);

/// The scales of rows `4h..4h + 4` at the start of a group-block as f32: f16 `d`s, or
/// `MXFP4`'s exponents as [`e8m0_half`](crate::quant::e8m0_half) reads them (`(e − 1) <<
/// 23`, the two smallest as subnormals `0x200000 << e`).
#[inline(always)]
unsafe fn weight_scales<F: Fam32>(gb: *const u8, h: usize) -> float32x4_t {
    if F::FIELDS.scale == 2 {
        return load_f16x4(gb.add(2 * HALF * h));
    }
    let p = gb.add(HALF * h);
    let e = vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8((p as *const u32).read_unaligned() as u64))));
    let normal = vshlq_n_u32::<23>(vsubq_u32(e, vdupq_n_u32(1)));
    let subnormal = vshlq_u32(vdupq_n_u32(0x0020_0000), vreinterpretq_s32_u32(e));
    vreinterpretq_f32_u32(vbslq_u32(vcgtq_u32(e, vdupq_n_u32(1)), normal, subnormal))
}

/// The 16 fifth bits at `qh` (little-endian), bit `i` as value 16 in byte `i`.
#[inline(always)]
unsafe fn fifth_bits(qh: *const u8) -> uint8x16_t {
    const SPREAD: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const SELECT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let bits = vreinterpretq_u8_u16(vdupq_n_u16((qh as *const u16).read_unaligned()));
    let spread = vqtbl1q_u8(bits, vld1q_u8(SPREAD.as_ptr()));
    vandq_u8(vtstq_u8(spread, vld1q_u8(SELECT.as_ptr())), vdupq_n_u8(16))
}

/// Lanes `l` and `l + 4` of the four rows of half `h` of the group-block at `gb`, as
/// signed weights.
#[inline(always)]
unsafe fn unpack_lanes<F: Fam32>(gb: *const u8, h: usize, l: usize) -> (int8x16_t, int8x16_t) {
    let (_, qh_at, qs_at) = F::FIELDS.packed_offsets();
    let at = |lane: usize| gb.add(qs_at + 32 * lane + 16 * h);
    if F::FIELDS.bits == 8 {
        return (vld1q_s8(at(l) as *const i8), vld1q_s8(at(l + 4) as *const i8));
    }
    let raw = vld1q_u8(at(l));
    let mut lo = vandq_u8(raw, vdupq_n_u8(0x0f));
    let mut hi = vshrq_n_u8::<4>(raw);
    if let Some(table) = F::LUT {
        let table = vld1q_s8(table.as_ptr());
        return (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi));
    }
    if F::FIELDS.qh.is_some() {
        lo = vorrq_u8(lo, fifth_bits(gb.add(qh_at + 4 * l + 2 * h)));
        hi = vorrq_u8(hi, fifth_bits(gb.add(qh_at + 4 * (l + 4) + 2 * h)));
    }
    let offset = vdupq_n_s8(F::OFFSET);
    (vsubq_s8(vreinterpretq_s8_u8(lo), offset), vsubq_s8(vreinterpretq_s8_u8(hi), offset))
}

/// Lanes `L` and `L + 4` of one block, `Llama` order: `acc[j][lane] += scale_j · (w_lane ·
/// a_j,lane)`.
#[inline(always)]
unsafe fn lane_floats<F: Fam32, const RA: usize, const L: usize>(
    gb: *const u8,
    h: usize,
    aq: &[[int8x16_t; 2]; RA],
    scales: &[float32x4_t; RA],
    acc: &mut [[float32x4_t; 8]; RA],
) {
    let (w_lo, w_hi) = unpack_lanes::<F>(gb, h, L);
    for j in 0..RA {
        for (half, wv) in [w_lo, w_hi].into_iter().enumerate() {
            let sums = sdot_lane(vdupq_n_s32(0), wv, aq[j][half], L);
            let lane = L + 4 * half;
            acc[j][lane] = vfmaq_f32(acc[j][lane], scales[j], vcvtq_f32_s32(sums));
        }
    }
}

/// Where a packed group-block of `F` keeps its minimums, its size, and whether it has
/// minimums.
#[inline(always)]
fn group_layout<F: Fam32>() -> (usize, usize, bool) {
    let (m_at, _, _) = F::FIELDS.packed_offsets();
    (m_at, F::FIELDS.group_block(), F::FIELDS.m.is_some())
}

/// One tile's operands: half `h` (four rows) of a packed group (`w`, `n_blocks`
/// group-blocks) × activation rows from `a`, `a_stride` bytes apart; results go to `out`
/// (`ld` apart), written or added, the first `live` of each row's four.
#[derive(Clone, Copy)]
struct Tile {
    n_blocks: usize,
    w: *const u8,
    h: usize,
    a: *const u8,
    a_stride: usize,
    out: *mut f32,
    ld: usize,
    accumulate: bool,
    live: usize,
}

/// One tile in the `Llama` order: rows `4h..4h + 4` of the packed group at `w` × `RA`
/// activation rows, eight float lanes each. Writes the rows below `live`.
#[inline(always)]
unsafe fn tile_lanes<F: Fam32, const RA: usize>(t: Tile) {
    let Tile { n_blocks, w, h, a, a_stride, out, ld, accumulate, live } = t;
    let (m_at, group_block, has_min) = group_layout::<F>();
    let zero = vdupq_n_f32(0.0);
    let mut acc = [[zero; 8]; RA];
    let mut tail = [zero; RA];
    for b in 0..n_blocks {
        let gb = w.add(b * group_block);
        let dw = weight_scales::<F>(gb, h);
        let mut scales = [zero; RA];
        // The activation's lanes 0..4 and 4..8, for by-lane dot products.
        let mut aq = [[vdupq_n_s8(0); 2]; RA];
        for j in 0..RA {
            let ab = a.add(j * a_stride + b * F::ACT_BYTES);
            let qs = ab.add(F::ACT_QS) as *const i8;
            aq[j] = [vld1q_s8(qs), vld1q_s8(qs.add(16))];
            scales[j] = vmulq_f32(dw, splat_f16(ab));
            if has_min {
                let mw = load_f16x4(gb.add(m_at + 2 * HALF * h));
                tail[j] = vaddq_f32(tail[j], vmulq_f32(mw, splat_f16(ab.add(2))));
            }
        }
        // Spelled out so that lanes and accumulators are constants (registers).
        lane_floats::<F, RA, 0>(gb, h, &aq, &scales, &mut acc);
        lane_floats::<F, RA, 1>(gb, h, &aq, &scales, &mut acc);
        lane_floats::<F, RA, 2>(gb, h, &aq, &scales, &mut acc);
        lane_floats::<F, RA, 3>(gb, h, &aq, &scales, &mut acc);
    }
    for j in 0..RA {
        // hsum8 over lanes, for four rows at once.
        let c = &acc[j];
        let v = vaddq_f32(
            vaddq_f32(vaddq_f32(c[0], c[4]), vaddq_f32(c[2], c[6])),
            vaddq_f32(vaddq_f32(c[1], c[5]), vaddq_f32(c[3], c[7])),
        );
        store(out.add(j * ld), vaddq_f32(v, tail[j]), live, accumulate);
    }
}

/// Lanes `L` and `L + 4` of one block, `Block` order: `sums[j][half] += w_lane · a_j,lane`.
#[inline(always)]
unsafe fn lane_ints<F: Fam32, const RA: usize, const L: usize>(gb: *const u8, h: usize, aq: &[[int8x16_t; 2]; RA], sums: &mut [[int32x4_t; 2]; RA]) {
    let (w_lo, w_hi) = unpack_lanes::<F>(gb, h, L);
    for j in 0..RA {
        for (half, wv) in [w_lo, w_hi].into_iter().enumerate() {
            sums[j][half] = sdot_lane(sums[j][half], wv, aq[j][half], L);
        }
    }
}

/// One tile in the `Block` order: rows `4h..4h + 4` of the packed group at `w` × `RA`
/// activation rows, one float accumulator each. Writes the rows below `live`.
#[inline(always)]
unsafe fn tile_block<F: Fam32, const RA: usize>(t: Tile) {
    let Tile { n_blocks, w, h, a, a_stride, out, ld, accumulate, live } = t;
    let (m_at, group_block, has_min) = group_layout::<F>();
    let mut acc = [vdupq_n_f32(0.0); RA];
    for b in 0..n_blocks {
        let gb = w.add(b * group_block);
        // The activation's lanes 0..4 and 4..8, for by-lane dot products.
        let mut aq = [[vdupq_n_s8(0); 2]; RA];
        for (j, q) in aq.iter_mut().enumerate() {
            let qs = a.add(j * a_stride + b * F::ACT_BYTES + F::ACT_QS) as *const i8;
            *q = [vld1q_s8(qs), vld1q_s8(qs.add(16))];
        }
        // Each row's exact block sum, in two independent chains (lanes 0..4, 4..8).
        let mut sums = [[vdupq_n_s32(0); 2]; RA];
        // Spelled out so that lanes are constants (by-element operands).
        lane_ints::<F, RA, 0>(gb, h, &aq, &mut sums);
        lane_ints::<F, RA, 1>(gb, h, &aq, &mut sums);
        lane_ints::<F, RA, 2>(gb, h, &aq, &mut sums);
        lane_ints::<F, RA, 3>(gb, h, &aq, &mut sums);
        let dw = weight_scales::<F>(gb, h);
        for j in 0..RA {
            let ab = a.add(j * a_stride + b * F::ACT_BYTES);
            let total = vcvtq_f32_s32(vaddq_s32(sums[j][0], sums[j][1]));
            acc[j] = vfmaq_f32(acc[j], vmulq_f32(dw, splat_f16(ab)), total);
            if has_min {
                let mw = load_f16x4(gb.add(m_at + 2 * HALF * h));
                acc[j] = vfmaq_f32(acc[j], mw, splat_f16(ab.add(2)));
            }
        }
    }
    for (j, &v) in acc.iter().enumerate() {
        store(out.add(j * ld), v, live, accumulate);
    }
}

/// `[x, y, x, y]` of the f16 values at `p` and `q`, as f32.
#[inline(always)]
unsafe fn f16_pair(p: *const u8, q: *const u8) -> float32x4_t {
    let (x, y) = ((p as *const u16).read_unaligned() as u64, (q as *const u16).read_unaligned() as u64);
    f16x4_to_f32(vcreate_u16(x | y << 16 | x << 32 | y << 48))
}

/// One tile in the `Block` order on the int8 matrix multiply: rows `4h..4h + 4` of the
/// packed group at `w` × `2·PAIRS` activation rows. Lanes `l` and `l + 1` of a row hold
/// eight consecutive elements of its block, so zipping two unpacked lane vectors gives two
/// rows' eight elements each, and one `smmla` adds the 2 × 2 products of two weight rows
/// with two activation rows over them: 32 products, twice an `sdot`'s. The block sums are
/// the same integers, so the floats that follow are the block order's, bit for bit.
#[inline(always)]
unsafe fn tile_mmla<F: Fam32, const PAIRS: usize>(t: Tile) {
    let Tile { n_blocks, w, h, a, a_stride, out, ld, accumulate, live } = t;
    let (m_at, group_block, has_min) = group_layout::<F>();
    let zero = vdupq_n_f32(0.0);
    // acc[p][q]: rows 4h + 2q and 4h + 2q + 1 × activation rows 2p and 2p + 1, as
    // [r0·a0, r0·a1, r1·a0, r1·a1].
    let mut acc = [[zero; 2]; PAIRS];
    for b in 0..n_blocks {
        let gb = w.add(b * group_block);
        let act = |row: usize| a.add(row * a_stride + b * F::ACT_BYTES);
        let mut sums = [[vdupq_n_s32(0); 2]; PAIRS];
        for l in [0, 2] {
            let (lo0, hi0) = unpack_lanes::<F>(gb, h, l);
            let (lo1, hi1) = unpack_lanes::<F>(gb, h, l + 1);
            for (lane, x, y) in [(l, lo0, lo1), (l + 4, hi0, hi1)] {
                let (x, y) = (vreinterpretq_s32_s8(x), vreinterpretq_s32_s8(y));
                let rows = [vreinterpretq_s8_s32(vzip1q_s32(x, y)), vreinterpretq_s8_s32(vzip2q_s32(x, y))];
                for (p, s) in sums.iter_mut().enumerate() {
                    let q = |row: usize| act(row).add(F::ACT_QS + 4 * lane) as *const i8;
                    let pair = vcombine_s8(vld1_s8(q(2 * p)), vld1_s8(q(2 * p + 1)));
                    s[0] = smmla(s[0], rows[0], pair);
                    s[1] = smmla(s[1], rows[1], pair);
                }
            }
        }
        let dw = weight_scales::<F>(gb, h);
        let dw = [vzip1q_f32(dw, dw), vzip2q_f32(dw, dw)];
        let mw = if has_min {
            let m = load_f16x4(gb.add(m_at + 2 * HALF * h));
            [vzip1q_f32(m, m), vzip2q_f32(m, m)]
        } else {
            [zero; 2]
        };
        for (p, acc) in acc.iter_mut().enumerate() {
            let (a0, a1) = (act(2 * p), act(2 * p + 1));
            let da = f16_pair(a0, a1);
            for q in 0..2 {
                acc[q] = vfmaq_f32(acc[q], vmulq_f32(dw[q], da), vcvtq_f32_s32(sums[p][q]));
                if has_min {
                    acc[q] = vfmaq_f32(acc[q], mw[q], f16_pair(a0.add(2), a1.add(2)));
                }
            }
        }
    }
    for (p, acc) in acc.iter().enumerate() {
        store(out.add(2 * p * ld), vuzp1q_f32(acc[0], acc[1]), live, accumulate);
        store(out.add((2 * p + 1) * ld), vuzp2q_f32(acc[0], acc[1]), live, accumulate);
    }
}

/// Write (or add) a tile row's four results at `o`, the first `live` of them at an edge.
#[inline(always)]
unsafe fn store(o: *mut f32, v: float32x4_t, live: usize, accumulate: bool) {
    if live == HALF {
        let v = if accumulate { vaddq_f32(vld1q_f32(o), v) } else { v };
        vst1q_f32(o, v);
    } else {
        let mut vals = [0f32; HALF];
        vst1q_f32(vals.as_mut_ptr(), v);
        super::store_live(o, &vals, live, accumulate);
    }
}

/// `out[r][i] (+)= w_i · a_r` for `i` in `rows` (which must start on a group boundary),
/// `r` in `0..n_act`; `w` is the packed matrix. Activation rows that overflow L2 go in
/// panels ([`tiling`](super::tiling)), each against every group of a block of `rows`.
#[inline(always)]
unsafe fn gemm<F: Fam32, const BLOCK: bool>(mmla: bool, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    use super::tiling;
    let panel = tiling::panel_for(n_act, cols / 32 * F::ACT_BYTES, tiling::l2_bytes());
    // With several panels, the weights go in blocks that stay in L3 between them.
    let block = tiling::weight_block_rows(n_act, panel, cols / 32 * F::FIELDS.block, GROUP, tiling::l3_bytes());
    for rows in tiling::blocks(rows, block) {
        for p0 in (0..n_act).step_by(panel) {
            let out = Out { ptr: out.ptr.add(p0 * out.ld), ..out };
            panel_groups::<F, BLOCK>(mmla, cols, w, rows.clone(), &act[p0 * act_stride..], act_stride, (n_act - p0).min(panel), out);
        }
    }
}

/// [`gemm`] of one panel of activation rows.
#[inline(always)]
unsafe fn panel_groups<F: Fam32, const BLOCK: bool>(mmla: bool, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    assert!(rows.start.is_multiple_of(GROUP), "row ranges of packed matrices start on a group");
    let n_blocks = cols / 32;
    let group_bytes = n_blocks * F::FIELDS.group_block();
    assert!(w.len() >= rows.end.div_ceil(GROUP) * group_bytes, "packed weights shorter than their rows");
    assert!(act.len() >= (n_act - 1) * act_stride + n_blocks * F::ACT_BYTES, "activations too short");
    for g in (rows.start..rows.end).step_by(GROUP) {
        let wg = w.as_ptr().add(g / GROUP * group_bytes);
        for h in 0..2 {
            let first = g + HALF * h;
            if first >= rows.end {
                break;
            }
            let live = (rows.end - first).min(HALF);
            let ot = |j: usize| out.ptr.add(j * out.ld + first);
            let at = |j: usize| act.as_ptr().add(j * act_stride);
            let tile = |j: usize| Tile { n_blocks, w: wg, h, a: at(j), a_stride: act_stride, out: ot(j), ld: out.ld, accumulate: out.accumulate, live };
            let mut j = 0;
            macro_rules! tile {
                ($ra:literal) => {{
                    if BLOCK {
                        tile_block::<F, $ra>(tile(j));
                    } else {
                        tile_lanes::<F, $ra>(tile(j));
                    }
                    j += $ra;
                }};
            }
            // On the int8 matrix multiply, the block order's tiles take pairs of
            // activation rows.
            if BLOCK && mmla {
                while n_act - j >= 4 {
                    tile_mmla::<F, 2>(tile(j));
                    j += 4;
                }
                if n_act - j >= 2 {
                    tile_mmla::<F, 1>(tile(j));
                    j += 2;
                }
            }
            // Block tiles hold four activation rows; lane tiles, with eight accumulators
            // per row, two.
            while BLOCK && n_act - j >= 4 {
                tile!(4);
            }
            while n_act - j >= 2 {
                tile!(2);
            }
            while j < n_act {
                tile!(1);
            }
        }
    }
}

/// Run the packed kernel for `ty`; false if `ty` has none. With `mmla`, the block order
/// runs on the int8 matrix multiply ([`tile_mmla`]).
///
/// # Safety
/// The CPU must have NEON and the dot-product extension, and with `mmla` the int8 matrix
/// multiply; `out` as for [`super::gemm`].
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn gemm_neon(mmla: bool, order: DotOrder, ty: blink_gguf::GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) -> bool {
    use blink_gguf::GgmlType as T;
    macro_rules! run {
        ($f:ty) => {
            match order {
                DotOrder::Llama => gemm::<$f, false>(mmla, cols, w, rows, act, act_stride, n_act, out),
                DotOrder::Block => gemm::<$f, true>(mmla, cols, w, rows, act, act_stride, n_act, out),
            }
        };
    }
    match ty {
        // One order: llama.cpp's x86 one (repacked `q4_0_8x8`, `iq4_nl_8x8`, `mxfp4_8x8`) is the block
        // order.
        T::Q4_0 => gemm::<Q4_0, true>(mmla, cols, w, rows, act, act_stride, n_act, out),
        T::IQ4_NL => gemm::<IQ4NL, true>(mmla, cols, w, rows, act, act_stride, n_act, out),
        T::MXFP4 => gemm::<MXFP4, true>(mmla, cols, w, rows, act, act_stride, n_act, out),
        T::Q4_1 => run!(Q4_1),
        T::Q5_0 => run!(Q5_0),
        T::Q5_1 => run!(Q5_1),
        T::Q8_0 => run!(Q8_0),
        _ => return false,
    }
    true
}
