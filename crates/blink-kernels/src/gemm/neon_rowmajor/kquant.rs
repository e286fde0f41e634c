//! The k-quant kernels of [`super`]: `Q2_K`..`Q6_K`, `IQ4_XS`, the ternary `TQ1_0`,
//! `TQ2_0` and the lattice formats (`IQ2_XXS`, `IQ2_XS`, `IQ2_S`, `IQ3_XXS`, `IQ3_S`)
//! against `Q8_K` activations.
//!
//! Each weight block is unpacked once into its 256 signed quants in element order (the
//! reference's `quants()`) and its group scales and mins, then reused for a tile of
//! activation rows: `SDOT` gives exact per-group sums, a multiply-accumulate by the group
//! scale gives exact `isum` lanes, `summ` comes from the activation's `bsums`, and the
//! block's few float operations run in exactly the reference's order.

use std::arch::aarch64::*;
use std::array::from_fn;
use std::ops::Range;

use blink_gguf::GgmlType;

use super::{drive, Out};
use crate::gemm::RowForm;
use crate::neon::{sdot, splat_f16};
use crate::quant::{q3_scales, scale_min_k4, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS};

/// A `Q8_K` block: `d` (f32), 256 quants, 16 `i16` sums of 16 quants each.
const ACT_BYTES: usize = 292;
const ACT_QS: usize = 4;
const ACT_BSUMS: usize = 260;

/// A k-quant as the kernel sees it.
trait KQuant {
    const BYTES: usize;
    /// Offset of the f16 super-block scale `d`.
    const D: usize;
    /// Offset of the f16 `dmin`, for the formats whose value is `d·d_a·isum - dmin·d_a·summ`.
    const DMIN: Option<usize>;
    /// Elements per scale (16 or 32).
    const SUB: usize;
    /// Whether the block values are not summed but chained into two FMAs (`Q4_K`, see
    /// `quant::kquants::vec_dot_q4_k`).
    const CHAINED: bool = false;
    /// Whether each output keeps eight integer lanes apart in eight float lanes to the end
    /// (`Q6_K`, see `quant::kquants::vec_dot_q6_k`).
    const LANES: bool = false;
    /// A `LANES` format's final factor (see `quant::rows::EightLanes`).
    const FINAL: f32 = 1.0;

    /// The 256 quants in element order, sixteen per vector.
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16];
    /// The scale of each group of `SUB` elements (the first `256 / SUB` entries), and the
    /// min applying to each group of 16 (zero without mins).
    unsafe fn scales(w: *const u8) -> ([i32; 16], [i16; 16]);

    /// For a `LANES` format, one block's eight integer lanes against the activation block
    /// at `a` (lane `k`: elements `4k..4k + 4` of every 32-element piece, times scales).
    #[inline(always)]
    unsafe fn lanes(q: &[int8x16_t; 16], sc: &[i32; 16], a: *const u8) -> [i32; 8] {
        let _ = (q, sc, a);
        unreachable!("not a LANES format")
    }
}

struct Q2K;
struct Q3K;
struct Q4K;
struct Q5K;
struct Q6K;
struct IQ4XS;
struct TQ1;
struct TQ2;

#[inline(always)]
unsafe fn load(p: *const u8) -> uint8x16_t {
    vld1q_u8(p)
}

#[inline(always)]
unsafe fn signed(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

/// Where bit `bit` of the bytes of `v` is set: `value`, else 0.
#[inline(always)]
unsafe fn bit_value(v: uint8x16_t, bit: usize, value: u8) -> uint8x16_t {
    vandq_u8(vtstq_u8(v, vdupq_n_u8(1 << bit)), vdupq_n_u8(value))
}

/// The 2-bit fields of `Q2_K`/`Q3_K` (`qs` at `p`), in element order.
#[inline(always)]
unsafe fn two_bit_fields(p: *const u8) -> [uint8x16_t; 16] {
    let mut q = [vdupq_n_u8(0); 16];
    for c in 0..2 {
        let mut v = [load(p.add(32 * c)), load(p.add(32 * c + 16))];
        for k in 0..4 {
            for half in 0..2 {
                q[8 * c + 2 * k + half] = vandq_u8(v[half], vdupq_n_u8(3));
                v[half] = vshrq_n_u8::<2>(v[half]);
            }
        }
    }
    q
}

/// The 4-bit fields of `Q4_K`/`Q5_K` (`qs` at `p`), in element order.
#[inline(always)]
unsafe fn nibble_fields(p: *const u8) -> [uint8x16_t; 16] {
    let mut q = [vdupq_n_u8(0); 16];
    for c in 0..4 {
        let v = [load(p.add(32 * c)), load(p.add(32 * c + 16))];
        for half in 0..2 {
            q[4 * c + half] = vandq_u8(v[half], vdupq_n_u8(0x0f));
            q[4 * c + 2 + half] = vshrq_n_u8::<4>(v[half]);
        }
    }
    q
}

/// Scales and per-16 mins of `Q4_K`/`Q5_K` (packed scales at `p`).
#[inline(always)]
unsafe fn scales_mins_k4(p: *const u8) -> ([i32; 16], [i16; 16]) {
    let packed = &*(p as *const [u8; 12]);
    let pairs: [(u8, u8); 8] = from_fn(|j| scale_min_k4(packed, j));
    (from_fn(|j| if j < 8 { pairs[j].0 as i32 } else { 0 }), from_fn(|g| pairs[g / 2].1 as i16))
}

impl KQuant for Q2K {
    const BYTES: usize = 84;
    const D: usize = 80;
    const DMIN: Option<usize> = Some(82);
    const SUB: usize = 16;

    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        two_bit_fields(w.add(16)).map(|v| signed(v))
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> ([i32; 16], [i16; 16]) {
        (from_fn(|g| (*w.add(g) & 0x0f) as i32), from_fn(|g| (*w.add(g) >> 4) as i16))
    }
}

impl KQuant for Q3K {
    const BYTES: usize = 110;
    const D: usize = 108;
    const DMIN: Option<usize> = None;
    const SUB: usize = 16;

    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        let low = two_bit_fields(w.add(32));
        let hmask = [load(w), load(w.add(16))];
        // Element 128c + 32k + 16h + x: its high bit is bit 4c + k of hmask[16h + x];
        // clear means 4 is subtracted.
        from_fn(|g| {
            let (c, k, half) = (g / 8, (g % 8) / 2, g % 2);
            let minus = vbicq_u8(vdupq_n_u8(4), bit_value(hmask[half], 4 * c + k, 0xff));
            vsubq_s8(signed(low[g]), signed(minus))
        })
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> ([i32; 16], [i16; 16]) {
        let s = q3_scales(&*(w.add(96) as *const [u8; 12]));
        (s.map(|v| v as i32), [0; 16])
    }
}

impl KQuant for Q4K {
    const BYTES: usize = 144;
    const D: usize = 0;
    const DMIN: Option<usize> = Some(2);
    const SUB: usize = 32;
    const CHAINED: bool = true;

    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        nibble_fields(w.add(16)).map(|v| signed(v))
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> ([i32; 16], [i16; 16]) {
        scales_mins_k4(w.add(4))
    }
}

impl KQuant for Q5K {
    const BYTES: usize = 176;
    const D: usize = 0;
    const DMIN: Option<usize> = Some(2);
    const SUB: usize = 32;

    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        let low = nibble_fields(w.add(48));
        let qh = [load(w.add(16)), load(w.add(32))];
        // Vector 4c + 2n + h holds elements 64c + 32n + 16h + x, whose fifth bit is bit
        // 2c + n of qh[16h + x].
        from_fn(|g| {
            let (c, n, half) = (g / 4, (g % 4) / 2, g % 2);
            signed(vorrq_u8(low[g], bit_value(qh[half], 2 * c + n, 16)))
        })
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> ([i32; 16], [i16; 16]) {
        scales_mins_k4(w.add(4))
    }
}

impl KQuant for Q6K {
    const BYTES: usize = 210;
    const D: usize = 208;
    const DMIN: Option<usize> = None;
    const SUB: usize = 16;
    const LANES: bool = true;

    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        let (ql, qh) = (w, w.add(128));
        // Element 128c + 32k + 16h + x: low nibble from ql[64c + 32(k & 1) + 16h + x]
        // shifted by 4(k >> 1), high two bits from qh[32c + 16h + x] >> 2k; minus 32.
        from_fn(|g| {
            let (c, k, half) = (g / 8, (g % 8) / 2, g % 2);
            let l = load(ql.add(64 * c + 32 * (k & 1) + 16 * half));
            let low = if k >> 1 == 0 { vandq_u8(l, vdupq_n_u8(0x0f)) } else { vshrq_n_u8::<4>(l) };
            let h = load(qh.add(32 * c + 16 * half));
            let high = match k {
                0 => vshlq_n_u8::<4>(h),
                1 => vshlq_n_u8::<2>(h),
                2 => h,
                _ => vshrq_n_u8::<2>(h),
            };
            let q = vorrq_u8(low, vandq_u8(high, vdupq_n_u8(0x30)));
            vsubq_s8(signed(q), vdupq_n_s8(32))
        })
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> ([i32; 16], [i16; 16]) {
        (from_fn(|g| *(w.add(192 + g) as *const i8) as i32), [0; 16])
    }

    /// Scalar: lane k sums scale·(q + 32)·a over elements 4k..4k + 4 of every 32-element
    /// piece (lanes 0..4 from the even 16-element groups, 4..8 from the odd ones), less
    /// 32·scale·bsum of groups 2k, 2k + 1.
    #[inline(always)]
    unsafe fn lanes(q: &[int8x16_t; 16], sc: &[i32; 16], a: *const u8) -> [i32; 8] {
        let aq = a.add(ACT_QS);
        let mut halves = [vdupq_n_s32(0); 2];
        for (g, &qv) in q.iter().enumerate() {
            let dot = sdot(vdupq_n_s32(0), vaddq_s8(qv, vdupq_n_s8(32)), vld1q_s8(aq.add(16 * g) as *const i8));
            halves[g % 2] = vmlaq_n_s32(halves[g % 2], dot, sc[g]);
        }
        let mut l = [0i32; 8];
        vst1q_s32(l.as_mut_ptr(), halves[0]);
        vst1q_s32(l.as_mut_ptr().add(4), halves[1]);
        let bsum = |k: usize| (a.add(ACT_BSUMS + 2 * k) as *const i16).read_unaligned() as i32;
        from_fn(|k| l[k] - 32 * (bsum(2 * k) * sc[2 * k] + bsum(2 * k + 1) * sc[2 * k + 1]))
    }
}

/// Eight lanes of signed quants against `a` with x86's sign trick: lane `k` sums
/// `scale(v)·|q|·a` over elements `4k..4k + 4` of every 32-element run, the activation
/// negated (wrapping at −128) where `q < 0`; `scale(v)` is vector `v`'s (16 elements).
#[inline(always)]
unsafe fn sign_trick_lanes(q: &[int8x16_t; 16], a: *const u8, scale: impl Fn(usize) -> i32) -> [i32; 8] {
    let aq = a.add(ACT_QS);
    let mut halves = [vdupq_n_s32(0); 2];
    for (v, &qv) in q.iter().enumerate() {
        let av = vld1q_s8(aq.add(16 * v) as *const i8);
        let signed = vbslq_s8(vcltzq_s8(qv), vnegq_s8(av), av);
        let dot = sdot(vdupq_n_s32(0), vabsq_s8(qv), signed);
        halves[v % 2] = vmlaq_n_s32(halves[v % 2], dot, scale(v));
    }
    let mut l = [0i32; 8];
    vst1q_s32(l.as_mut_ptr(), halves[0]);
    vst1q_s32(l.as_mut_ptr().add(4), halves[1]);
    l
}

impl KQuant for IQ4XS {
    const BYTES: usize = 136;
    const D: usize = 0;
    const DMIN: Option<usize> = None;
    const SUB: usize = 32;
    const LANES: bool = true;

    /// Table values: group g's low nibbles are its elements 0..16, high ones 16..32.
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        let table = vld1q_s8(crate::quant::KVALUES_IQ4NL.as_ptr());
        from_fn(|v| {
            let raw = load(w.add(8 + 16 * (v / 2)));
            let idx = if v % 2 == 0 { vandq_u8(raw, vdupq_n_u8(0x0f)) } else { vshrq_n_u8::<4>(raw) };
            vqtbl1q_s8(table, idx)
        })
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> ([i32; 16], [i16; 16]) {
        let (sh, sl) = ((w.add(2) as *const u16).read_unaligned() as u32, (w.add(4) as *const u32).read_unaligned());
        (from_fn(|g| if g < 8 { (((sl >> (4 * g)) & 0x0f) | (((sh >> (2 * g)) & 3) << 4)) as i32 - 32 } else { 0 }), [0; 16])
    }

    /// Scalar: lane k sums scale·|v|·sign(a, v) (the negation wrapping, as x86's sign
    /// trick) over elements 4k..4k + 4 of every group.
    #[inline(always)]
    unsafe fn lanes(q: &[int8x16_t; 16], sc: &[i32; 16], a: *const u8) -> [i32; 8] {
        sign_trick_lanes(q, a, |v| sc[v / 2])
    }
}

/// Lanes of unsigned trits against `a` (see `quant::ternary`): lane `k` sums `t·a` over
/// elements `4k..4k + 4` of every 32-element run, less the run's activation sum
/// (`bsums[2k] + bsums[2k + 1]`).
#[inline(always)]
unsafe fn trit_lanes(q: &[int8x16_t; 16], a: *const u8) -> [i32; 8] {
    let aq = a.add(ACT_QS);
    let mut halves = [vdupq_n_s32(0); 2];
    for (v, &qv) in q.iter().enumerate() {
        halves[v % 2] = sdot(halves[v % 2], qv, vld1q_s8(aq.add(16 * v) as *const i8));
    }
    let mut l = [0i32; 8];
    vst1q_s32(l.as_mut_ptr(), halves[0]);
    vst1q_s32(l.as_mut_ptr().add(4), halves[1]);
    let bsum = |k: usize| (a.add(ACT_BSUMS + 2 * k) as *const i16).read_unaligned() as i32;
    from_fn(|k| l[k] - bsum(2 * k) - bsum(2 * k + 1))
}

/// The top trit of each byte, `(b · 3) >> 8`.
#[inline(always)]
unsafe fn top_trits(b: uint8x16_t) -> int8x16_t {
    let three = vdup_n_u8(3);
    let lo = vshrn_n_u16::<8>(vmull_u8(vget_low_u8(b), three));
    let hi = vshrn_n_u16::<8>(vmull_high_u8(b, vdupq_n_u8(3)));
    signed(vcombine_u8(lo, hi))
}

impl KQuant for TQ2 {
    const BYTES: usize = 66;
    const D: usize = 64;
    const DMIN: Option<usize> = None;
    const SUB: usize = 32;
    const LANES: bool = true;

    /// Bits 2l of byte m of run r: element 128r + 32l + m.
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        let mut q = [vdupq_n_s8(0); 16];
        for r in 0..2 {
            for half in 0..2 {
                let mut raw = load(w.add(32 * r + 16 * half));
                for l in 0..4 {
                    q[8 * r + 2 * l + half] = signed(vandq_u8(raw, vdupq_n_u8(3)));
                    raw = vshrq_n_u8::<2>(raw);
                }
            }
        }
        q
    }

    #[inline(always)]
    unsafe fn scales(_: *const u8) -> ([i32; 16], [i16; 16]) {
        ([0; 16], [0; 16])
    }

    #[inline(always)]
    unsafe fn lanes(q: &[int8x16_t; 16], _: &[i32; 16], a: *const u8) -> [i32; 8] {
        trit_lanes(q, a)
    }
}

impl KQuant for TQ1 {
    const BYTES: usize = 54;
    const D: usize = 52;
    const DMIN: Option<usize> = None;
    const SUB: usize = 32;
    const LANES: bool = true;

    /// Trit n of qs byte m < 32: element 32n + m; of qs byte 32 + m: 160 + 16n + m; of qh
    /// byte j: 240 + 4n + j.
    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        const POW3: [u8; 5] = [1, 3, 9, 27, 81];
        const QH_POW3: [u8; 16] = [1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27];
        let mut q = [vdupq_n_s8(0); 16];
        let (lo, hi, tail) = (load(w), load(w.add(16)), load(w.add(32)));
        for n in 0..5 {
            let p = vdupq_n_u8(POW3[n]);
            q[2 * n] = top_trits(vmulq_u8(lo, p));
            q[2 * n + 1] = top_trits(vmulq_u8(hi, p));
            q[10 + n] = top_trits(vmulq_u8(tail, p));
        }
        let qh = vreinterpretq_u8_u32(vdupq_n_u32((w.add(48) as *const u32).read_unaligned()));
        q[15] = top_trits(vmulq_u8(qh, vld1q_u8(QH_POW3.as_ptr())));
        q
    }

    #[inline(always)]
    unsafe fn scales(_: *const u8) -> ([i32; 16], [i16; 16]) {
        ([0; 16], [0; 16])
    }

    #[inline(always)]
    unsafe fn lanes(q: &[int8x16_t; 16], _: &[i32; 16], a: *const u8) -> [i32; 8] {
        trit_lanes(q, a)
    }
}

/// A lattice format (see `quant::lattice`), each run decoded by the reference's
/// [`Lattice::run`](crate::quant::Lattice::run): quants are the signed magnitudes, scales
/// one per 16 elements.
struct Grid<B>(std::marker::PhantomData<B>);

/// Bit `i` of `bits` (16 of them) as 0xff in byte `i`.
#[inline(always)]
unsafe fn bit_masks(bits: u32) -> uint8x16_t {
    const SPREAD: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const SELECT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let b = vreinterpretq_u8_u16(vdupq_n_u16(bits as u16));
    vtstq_u8(vqtbl1q_u8(b, vld1q_u8(SPREAD.as_ptr())), vld1q_u8(SELECT.as_ptr()))
}

impl<B: crate::quant::Lattice> KQuant for Grid<B> {
    const BYTES: usize = B::BYTES;
    const D: usize = 0;
    const DMIN: Option<usize> = None;
    const SUB: usize = 16;
    const LANES: bool = true;
    const FINAL: f32 = B::UNIT;

    #[inline(always)]
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16] {
        let block = B::read(std::slice::from_raw_parts(w, B::BYTES));
        let mut q = [vdupq_n_s8(0); 16];
        for r in 0..8 {
            let run = block.run(r);
            for h in 0..2 {
                let mags = vreinterpretq_s8_u8(vcombine_u8(vcreate_u8(run.grid[2 * h]), vcreate_u8(run.grid[2 * h + 1])));
                let neg = bit_masks(run.negative >> (16 * h));
                q[2 * r + h] = vbslq_s8(neg, vnegq_s8(mags), mags);
            }
        }
        q
    }

    #[inline(always)]
    unsafe fn scales(w: *const u8) -> ([i32; 16], [i16; 16]) {
        let block = B::read(std::slice::from_raw_parts(w, B::BYTES));
        (from_fn(|v| block.run(v / 2).scales[v % 2]), [0; 16])
    }

    /// Scalar: lane k sums scale·|q|·a, the activation negated (wrapping) where q < 0.
    #[inline(always)]
    unsafe fn lanes(q: &[int8x16_t; 16], sc: &[i32; 16], a: *const u8) -> [i32; 8] {
        sign_trick_lanes(q, a, |v| sc[v])
    }
}

/// The f16 at `p` (any alignment) as f32.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    vgetq_lane_f32::<0>(splat_f16(p))
}

/// One tile: `NR` weight rows × `NA` activation rows over `nb` blocks.
#[inline(always)]
unsafe fn kquant_tile<K: KQuant, const NR: usize, const NA: usize>(nb: usize, w: [*const u8; NR], a: [*const u8; NA], grouped: [bool; NA]) -> [[f32; NA]; NR] {
    let mut sums = [[0f32; NA]; NR];
    let mut sums_min = [[0f32; NA]; NR];
    // Per output, eight float lanes (`LANES` formats only).
    let mut lanes8 = [[[0f32; 8]; NA]; NR];
    for b in 0..nb {
        let ab: [*const u8; NA] = from_fn(|j| a[j].add(b * ACT_BYTES));
        for i in 0..NR {
            let wb = w[i].add(b * K::BYTES);
            let q = K::quants(wb);
            let (sc, mins) = K::scales(wb);
            let m16 = [vld1q_s16(mins.as_ptr()), vld1q_s16(mins.as_ptr().add(8))];
            let d = f16_at(wb.add(K::D));
            let dmin = K::DMIN.map(|at| f16_at(wb.add(at)));
            for j in 0..NA {
                let aq = ab[j].add(ACT_QS);
                if K::LANES {
                    let l = K::lanes(&q, &sc, ab[j]);
                    let da = (ab[j] as *const f32).read_unaligned();
                    for (acc, &lane) in lanes8[i][j].iter_mut().zip(&l) {
                        *acc = (da * d).mul_add(lane as f32, *acc);
                    }
                    continue;
                }
                // Per 64-element piece when the row is computed as in a group of four.
                let pieces = K::CHAINED && grouped[j];
                let mut lanes = [vdupq_n_s32(0); 4];
                let per = K::SUB / 16;
                for (g, &s) in sc.iter().enumerate().take(256 / K::SUB) {
                    let mut dot = vdupq_n_s32(0);
                    for (v, &qv) in q.iter().enumerate().skip(per * g).take(per) {
                        dot = sdot(dot, qv, vld1q_s8(aq.add(16 * v) as *const i8));
                    }
                    let at = if pieces { g * K::SUB / 64 } else { 0 };
                    lanes[at] = vmlaq_n_s32(lanes[at], dot, s);
                }
                let isums = lanes.map(|l| vaddvq_s32(l));
                let isum = isums.iter().sum::<i32>();
                let da = (ab[j] as *const f32).read_unaligned();
                if let (true, Some(dmin)) = (pieces, dmin) {
                    // Scalar, grouped: per piece c, fma(isum_c, d·d_a, ·) and fma(summ_c,
                    // dmin·d_a, ·), summ_c over the piece's four 16-element sums.
                    let bsum = |k: usize| (ab[j].add(ACT_BSUMS + 2 * k) as *const i16).read_unaligned() as i32;
                    for (c, &ic) in isums.iter().enumerate() {
                        let summ: i32 = (4 * c..4 * c + 4).map(|k| bsum(k) * mins[k] as i32).sum();
                        sums[i][j] = (ic as f32).mul_add(d * da, sums[i][j]);
                        sums_min[i][j] = (summ as f32).mul_add(dmin * da, sums_min[i][j]);
                    }
                    continue;
                }
                let summ = dmin.map(|_| {
                    let bsums = ab[j].add(ACT_BSUMS);
                    let b16 = [vreinterpretq_s16_u8(load(bsums)), vreinterpretq_s16_u8(load(bsums.add(16)))];
                    let prods = vmlal_high_s16(vmull_s16(vget_low_s16(b16[0]), vget_low_s16(m16[0])), b16[0], m16[0]);
                    let prods = vmlal_high_s16(vmlal_s16(prods, vget_low_s16(b16[1]), vget_low_s16(m16[1])), b16[1], m16[1]);
                    vaddvq_s32(prods) as f32
                });
                match (dmin, summ) {
                    // Scalar: fma(isum, d·d_a, sum) and fma(summ, dmin·d_a, sum_min).
                    (Some(dmin), Some(summ)) if K::CHAINED => {
                        sums[i][j] = (isum as f32).mul_add(d * da, sums[i][j]);
                        sums_min[i][j] = summ.mul_add(dmin * da, sums_min[i][j]);
                    }
                    // Scalar: d·d_a·(isum as f32) [- dmin·d_a·(summ as f32)], products left
                    // to right.
                    (Some(dmin), Some(summ)) => sums[i][j] += d * da * isum as f32 - dmin * da * summ,
                    _ => sums[i][j] += d * da * isum as f32,
                }
            }
        }
    }
    if K::CHAINED {
        for (s, m) in sums.iter_mut().flatten().zip(sums_min.iter().flatten()) {
            *s -= m;
        }
    }
    if K::LANES {
        for (s, l) in sums.iter_mut().flatten().zip(lanes8.iter().flatten()) {
            *s = K::FINAL * crate::quant::reduce::hsum8(l);
        }
    }
    sums
}

#[inline(always)]
unsafe fn kquant_gemm<K: KQuant>(cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, grouped: &[RowForm], out: Out) {
    assert!(cols.is_multiple_of(256), "k-quant rows are whole super-blocks");
    let nb = cols / 256;
    let rb = nb * K::BYTES;
    assert!(w.len() >= rows.end * rb, "weights shorter than their rows");
    assert!(act.len() >= (n_act - 1) * act_stride + nb * ACT_BYTES, "activations too short");
    // An activation row's flag, found from its address.
    let flag = |p: *const u8| grouped.get((p as usize - act.as_ptr() as usize) / act_stride.max(1)).is_some_and(|f| f.grouped);
    drive::<1, 4, 1>(rb, w, rows, act, act_stride, n_act, out, |w, a| kquant_tile::<K, 1, 4>(nb, w, a, a.map(flag)), |w, a| kquant_tile::<K, 1, 1>(nb, w, a, a.map(flag)));
}

/// Run the kernel for `ty`; false if `ty` is not a k-quant.
#[inline(always)]
pub(super) unsafe fn gemm(ty: GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, grouped: &[RowForm], out: Out) -> bool {
    match ty {
        GgmlType::Q2_K => kquant_gemm::<Q2K>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::Q3_K => kquant_gemm::<Q3K>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::Q4_K => kquant_gemm::<Q4K>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::Q5_K => kquant_gemm::<Q5K>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::Q6_K => kquant_gemm::<Q6K>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::IQ4_XS => kquant_gemm::<IQ4XS>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::TQ1_0 => kquant_gemm::<TQ1>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::TQ2_0 => kquant_gemm::<TQ2>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::IQ2_XXS => kquant_gemm::<Grid<BlockIQ2XXS>>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::IQ2_XS => kquant_gemm::<Grid<BlockIQ2XS>>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::IQ2_S => kquant_gemm::<Grid<BlockIQ2S>>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::IQ3_XXS => kquant_gemm::<Grid<BlockIQ3XXS>>(cols, w, rows, act, act_stride, n_act, grouped, out),
        GgmlType::IQ3_S => kquant_gemm::<Grid<BlockIQ3S>>(cols, w, rows, act, act_stride, n_act, grouped, out),
        _ => return false,
    }
    true
}
