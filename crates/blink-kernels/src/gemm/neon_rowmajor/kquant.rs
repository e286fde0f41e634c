//! The k-quant kernels of [`super`]: `Q2_K`..`Q6_K` against `Q8_K` activations.
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
use crate::neon::{sdot, splat_f16};
use crate::quant::{q3_scales, scale_min_k4};

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

    /// The 256 quants in element order, sixteen per vector.
    unsafe fn quants(w: *const u8) -> [int8x16_t; 16];
    /// The scale of each group of `SUB` elements (the first `256 / SUB` entries), and the
    /// min applying to each group of 16 (zero without mins).
    unsafe fn scales(w: *const u8) -> ([i32; 16], [i16; 16]);
}

struct Q2K;
struct Q3K;
struct Q4K;
struct Q5K;
struct Q6K;

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
}

/// The f16 at `p` (any alignment) as f32.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    vgetq_lane_f32::<0>(splat_f16(p))
}

/// One tile: `NR` weight rows × `NA` activation rows over `nb` blocks.
#[inline(always)]
unsafe fn kquant_tile<K: KQuant, const NR: usize, const NA: usize>(nb: usize, w: [*const u8; NR], a: [*const u8; NA]) -> [[f32; NA]; NR] {
    let mut sums = [[0f32; NA]; NR];
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
                let mut lanes = vdupq_n_s32(0);
                let per = K::SUB / 16;
                for (g, &s) in sc.iter().enumerate().take(256 / K::SUB) {
                    let mut dot = vdupq_n_s32(0);
                    for (v, &qv) in q.iter().enumerate().skip(per * g).take(per) {
                        dot = sdot(dot, qv, vld1q_s8(aq.add(16 * v) as *const i8));
                    }
                    lanes = vmlaq_n_s32(lanes, dot, s);
                }
                let isum = vaddvq_s32(lanes);
                let da = (ab[j] as *const f32).read_unaligned();
                // Scalar: d·d_a·(isum as f32) [- dmin·d_a·(summ as f32)], products left to right.
                let mut v = d * da * isum as f32;
                if let Some(dmin) = dmin {
                    let bsums = ab[j].add(ACT_BSUMS);
                    let b16 = [vreinterpretq_s16_u8(load(bsums)), vreinterpretq_s16_u8(load(bsums.add(16)))];
                    let prods = vmlal_high_s16(vmull_s16(vget_low_s16(b16[0]), vget_low_s16(m16[0])), b16[0], m16[0]);
                    let prods = vmlal_high_s16(vmlal_s16(prods, vget_low_s16(b16[1]), vget_low_s16(m16[1])), b16[1], m16[1]);
                    v -= dmin * da * vaddvq_s32(prods) as f32;
                }
                sums[i][j] += v;
            }
        }
    }
    sums
}

#[inline(always)]
unsafe fn kquant_gemm<K: KQuant>(cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) {
    assert!(cols % 256 == 0, "k-quant rows are whole super-blocks");
    let nb = cols / 256;
    let rb = nb * K::BYTES;
    assert!(w.len() >= rows.end * rb, "weights shorter than their rows");
    assert!(act.len() >= (n_act - 1) * act_stride + nb * ACT_BYTES, "activations too short");
    drive::<1, 4, 1>(rb, w, rows, act, act_stride, n_act, out, |w, a| kquant_tile::<K, 1, 4>(nb, w, a), |w, a| kquant_tile::<K, 1, 1>(nb, w, a));
}

/// Run the kernel for `ty`; false if `ty` is not a k-quant.
#[inline(always)]
pub(super) unsafe fn gemm(ty: GgmlType, cols: usize, w: &[u8], rows: Range<usize>, act: &[u8], act_stride: usize, n_act: usize, out: Out) -> bool {
    match ty {
        GgmlType::Q2_K => kquant_gemm::<Q2K>(cols, w, rows, act, act_stride, n_act, out),
        GgmlType::Q3_K => kquant_gemm::<Q3K>(cols, w, rows, act, act_stride, n_act, out),
        GgmlType::Q4_K => kquant_gemm::<Q4K>(cols, w, rows, act, act_stride, n_act, out),
        GgmlType::Q5_K => kquant_gemm::<Q5K>(cols, w, rows, act, act_stride, n_act, out),
        GgmlType::Q6_K => kquant_gemm::<Q6K>(cols, w, rows, act, act_stride, n_act, out),
        _ => return false,
    }
    true
}
