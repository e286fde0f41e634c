//! Reference k-quant quantizers, reproducing ggml's `quantize_row_q{2..6}_K_ref` (what
//! `llama-quantize` writes without an importance matrix); the bit packing they need is
//! [`super::kquants_bits`]'s.
//!
//! Each quantizer first searches a scale (and min) per group with [`super::kquants_search`],
//! quantizes those to 4/6/8 bits against a super-block scale stored as `f16`, then
//! re-quantizes every element against the *rounded* group scale it will be decoded with.

use std::array::from_fn;

use blink_gguf::QK_K;
use half::f16;

use super::blocks::{Block, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, K_SCALE_SIZE};
use super::kquants_bits::{pack_2bit, pack_4bit, pack_high_bits, pack_q3_scales, pack_scales_mins, q3_scales, scale_min_k4};
use super::kquants_search::{
    make_q3_quants, make_qkx2_quants, make_qx_quants, Sweep, GROUP_MAX_EPS,
};
use super::numeric::nearest_int;

/// Quantize one `Q2_K` super-block.
pub fn quantize_q2_k(x: &[f32]) -> BlockQ2K {
    const Q4SCALE: f32 = 15.0;
    let x = &x[..QK_K];
    let sweep = Sweep {
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let mut levels = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    for (j, (xs, ls)) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .enumerate()
    {
        let weights: [f32; 16] = from_fn(|i| xs[i].abs());
        (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, ls, sweep);
    }
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });

    let mut b = BlockQ2K::zeroed();
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for (packed, &s) in b.scales.iter_mut().zip(&scales) {
            *packed = nearest_int(iscale * s) as u8;
        }
        b.d = f16::from_f32(max_scale / Q4SCALE);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for (packed, &m) in b.scales.iter_mut().zip(&mins) {
            *packed |= (nearest_int(iscale * m) << 4) as u8;
        }
        b.dmin = f16::from_f32(max_min / Q4SCALE);
    }

    let (d_all, dmin_all) = (b.d.to_f32(), b.dmin.to_f32());
    for ((xs, ls), &sc) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .zip(&b.scales)
    {
        let d = d_all * (sc & 0x0f) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (sc >> 4) as f32;
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / d).clamp(0, 3) as u8;
        }
    }
    b.qs = pack_2bit(&levels);
    b
}

/// Quantize one `Q3_K` super-block.
pub fn quantize_q3_k(x: &[f32]) -> BlockQ3K {
    let x = &x[..QK_K];
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for (j, (xs, ls)) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .enumerate()
    {
        scales[j] = make_q3_quants(4, xs, ls);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }

    let mut b = BlockQ3K::zeroed();
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        // ggml stores the rounded scale in an int8 before clamping; mirror that wrap.
        let q: [u8; 16] =
            from_fn(|j| ((nearest_int(iscale * scales[j]) as i8 as i32).clamp(-32, 31) + 32) as u8);
        b.scales = pack_q3_scales(&q);
        b.d = f16::from_f32(1.0 / iscale);
    }

    let d_all = b.d.to_f32();
    for ((xs, ls), &sc) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .zip(&q3_scales(&b.scales))
    {
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = (nearest_int(v / d).clamp(-4, 3) + 4) as i8;
        }
    }
    // Levels 0..=7: bit 2 goes to `hmask`, the low two bits to `qs`.
    let levels: [u8; QK_K] = levels.map(|l| l as u8);
    b.hmask = pack_high_bits(&levels, 2);
    b.qs = pack_2bit(&levels);
    b
}

/// Per-group search and 6-bit scale/min quantization shared by `Q4_K` and `Q5_K`. Returns
/// `(d, dmin, packed scales, levels)` with levels re-quantized against the rounded scales.
fn quantize_scale_min(
    x: &[f32],
    nmax: i32,
    sweep: Sweep,
) -> (f16, f16, [u8; K_SCALE_SIZE], [u8; QK_K]) {
    let x = &x[..QK_K];
    let mut levels = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    for (j, (xs, ls)) in x
        .chunks_exact(32)
        .zip(levels.chunks_exact_mut(32))
        .enumerate()
    {
        let sum_x2 = xs.iter().fold(0f32, |acc, &v| acc + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = from_fn(|i| av_x + xs[i].abs());
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &weights, ls, sweep);
    }
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // ggml keeps the rounded values in a uint8 before clamping to 63; mirror that wrap.
    let ls: [u8; 8] = from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let packed = pack_scales_mins(&ls, &lm);
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);

    for (j, (xs, ls)) in x
        .chunks_exact(32)
        .zip(levels.chunks_exact_mut(32))
        .enumerate()
    {
        let (sc, m) = scale_min_k4(&packed, j);
        let dl = d.to_f32() * sc as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / dl).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, levels)
}

/// Quantize one `Q4_K` super-block.
pub fn quantize_q4_k(x: &[f32]) -> BlockQ4K {
    let sweep = Sweep {
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    let (d, dmin, scales, levels) = quantize_scale_min(x, 15, sweep);
    BlockQ4K {
        d,
        dmin,
        scales,
        qs: pack_4bit(&levels),
    }
}

/// Quantize one `Q5_K` super-block.
pub fn quantize_q5_k(x: &[f32]) -> BlockQ5K {
    let sweep = Sweep {
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    let (d, dmin, scales, levels) = quantize_scale_min(x, 31, sweep);
    BlockQ5K {
        d,
        dmin,
        scales,
        qh: pack_high_bits(&levels, 4),
        qs: pack_4bit(&levels),
    }
}

/// Quantize one `Q6_K` super-block.
pub fn quantize_q6_k(x: &[f32]) -> BlockQ6K {
    let x = &x[..QK_K];
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for (j, (xs, ls)) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .enumerate()
    {
        scales[j] = make_qx_quants(32, xs, ls);
        if scales[j].abs() > max_abs_scale {
            max_abs_scale = scales[j].abs();
            max_scale = scales[j];
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        return BlockQ6K::zeroed();
    }

    let mut b = BlockQ6K::zeroed();
    let iscale = -128.0 / max_scale;
    b.d = f16::from_f32(1.0 / iscale);
    for (packed, &s) in b.scales.iter_mut().zip(&scales) {
        *packed = nearest_int(iscale * s).min(127) as i8;
    }

    let d_all = b.d.to_f32();
    for ((xs, ls), &sc) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .zip(&b.scales)
    {
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = (nearest_int(v / d).clamp(-32, 31) + 32) as i8;
        }
    }

    // Levels 0..=63. Per 128 elements: `ql` byte i (0..64) holds elements i (low nibble)
    // and i + 64 (high); `qh` byte i (0..32) holds bits 4..5 of elements i + 32k at 2k.
    let levels: [u8; QK_K] = levels.map(|l| l as u8);
    for c in 0..QK_K / 128 {
        let lv = &levels[128 * c..128 * (c + 1)];
        for i in 0..64 {
            b.ql[64 * c + i] = (lv[i] & 0x0f) | ((lv[i + 64] & 0x0f) << 4);
        }
        for i in 0..32 {
            b.qh[32 * c + i] =
                (0..4).fold(0u8, |acc, k| acc | (((lv[i + 32 * k] >> 4) & 3) << (2 * k)));
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::rows::QuantBlock;

    fn ramp() -> Vec<f32> {
        (0..QK_K)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect()
    }

    #[test]
    fn quantizers_approximate_input() {
        let x = ramp();
        let mut y = vec![0f32; QK_K];
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / QK_K as f32).sqrt();
        let check = |name: &str, y: &[f32], tol: f32| {
            let err =
                (x.iter().zip(y).map(|(a, b)| (a - b) * (a - b)).sum::<f32>() / QK_K as f32).sqrt();
            assert!(err < tol * rms, "{name}: rmse {err} vs rms {rms}");
        };
        quantize_q2_k(&x).dequantize(&mut y);
        check("q2_k", &y, 0.35);
        quantize_q3_k(&x).dequantize(&mut y);
        check("q3_k", &y, 0.2);
        quantize_q4_k(&x).dequantize(&mut y);
        check("q4_k", &y, 0.1);
        quantize_q5_k(&x).dequantize(&mut y);
        check("q5_k", &y, 0.05);
        quantize_q6_k(&x).dequantize(&mut y);
        check("q6_k", &y, 0.025);
    }
}
