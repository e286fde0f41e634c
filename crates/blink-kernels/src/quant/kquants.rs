//! The k-quants `Q2_K`..`Q6_K`: dequantization and dot products with `Q8_K`, over the
//! fields [`super::kquants_bits`] reads out of a super-block.
//!
//! Scales apply to groups of 16 (`Q2_K`, `Q3_K`, `Q6_K`) or 32 (`Q4_K`, `Q5_K`) elements.
//! Dot products follow ggml's `ggml_vec_dot_q*_K_q8_K`: exact `i32` sums of
//! `scale·Σ(q_w·q_a)` per super-block, mins folded in through the activation's `bsums`,
//! then `d_w·d_a·isum - dmin_w·d_a·summins` in `f32`.

use std::array::from_fn;

use blink_gguf::QK_K;

use super::blocks::{read_blocks, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, K_SCALE_SIZE};
use super::kquants_bits::{q3_scales, scale_min_k4, unpack_scales_mins};
use super::kquants_quantize as kq;
use super::rows::QuantBlock;

/// `Σ w[e]·a[e]` over each group of 16 elements.
#[inline]
fn group16_dots(w: &[i8; QK_K], a: &[i8; QK_K]) -> [i32; QK_K / 16] {
    from_fn(|g| {
        (16 * g..16 * g + 16)
            .map(|e| w[e] as i32 * a[e] as i32)
            .sum()
    })
}

/// `Σ bsums[j]·mins[j/2]`: the activation sums weighted by the per-32 mins.
#[inline]
fn mins_dot(act: &BlockQ8K, mins: &[u8; 8]) -> i32 {
    act.bsums
        .iter()
        .enumerate()
        .map(|(j, &s)| s as i32 * mins[j / 2] as i32)
        .sum()
}

/// Dequantize a `Q4_K`/`Q5_K` super-block: `(d·sc)·q - (dmin·m)` per group of 32.
fn dequantize_scale_min(
    d: f32,
    dmin: f32,
    scales: &[u8; K_SCALE_SIZE],
    q: &[i8; QK_K],
    out: &mut [f32],
) {
    for (j, (group, out)) in q.chunks_exact(32).zip(out.chunks_exact_mut(32)).enumerate() {
        let (sc, m) = scale_min_k4(scales, j);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        for (o, &v) in out.iter_mut().zip(group) {
            *o = dl * v as f32 - ml;
        }
    }
}

/// `Q4_K`/`Q5_K` against `Q8_K`: the exact integer sums of one super-block, `isum` (scales ×
/// group dots) and `summ` (mins × the activation's group sums).
fn int_sums_scale_min(scales: &[u8; K_SCALE_SIZE], q: &[i8; QK_K], act: &BlockQ8K) -> (i32, i32) {
    let (sc, mins) = unpack_scales_mins(scales);
    let g = group16_dots(q, &act.qs);
    let isum: i32 = (0..8)
        .map(|j| sc[j] as i32 * (g[2 * j] + g[2 * j + 1]))
        .sum();
    (isum, mins_dot(act, &mins))
}

/// `Q4_K`/`Q5_K` dot with `Q8_K`.
fn dot_scale_min(
    d: f32,
    dmin: f32,
    scales: &[u8; K_SCALE_SIZE],
    q: &[i8; QK_K],
    act: &BlockQ8K,
) -> f32 {
    let (isum, summ) = int_sums_scale_min(scales, q, act);
    d * act.d * isum as f32 - dmin * act.d * summ as f32
}

/// A `Q6_K` row's dot with a `Q8_K` row as llama.cpp's x86 build (AVX2) computes it: per
/// super-block eight `i32` lanes, lane `k` summing `scale · (q + 32) · a` over elements
/// `4k..4k + 4` of every 32-element piece, less `32 · scale · bsum` over the 16-element
/// groups `2k` and `2k + 1`; each lane then goes into a float lane of its own with one FMA
/// by `d_a·d`, and the lanes are summed at the end as ggml's `hsum_float_8` does.
pub fn vec_dot_q6_k(n_blocks: usize, w: &[u8], act: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (wb, ab) in read_blocks::<BlockQ6K>(w).zip(read_blocks::<BlockQ8K>(act)).take(n_blocks) {
        let q = wb.quants();
        let sc = wb.scales;
        let d = ab.d * wb.d.to_f32();
        for (k, acc) in acc.iter_mut().enumerate() {
            let mut lane = 0i32;
            for piece in 0..QK_K / 32 {
                let s = sc[2 * piece + k / 4] as i32;
                let e = 32 * piece + 4 * k;
                lane += s * (e..e + 4).map(|e| (q[e] as i32 + 32) * ab.qs[e] as i32).sum::<i32>();
            }
            lane -= 32 * (ab.bsums[2 * k] as i32 * sc[2 * k] as i32 + ab.bsums[2 * k + 1] as i32 * sc[2 * k + 1] as i32);
            *acc = d.mul_add(lane as f32, *acc);
        }
    }
    super::reduce::hsum8(&acc)
}

/// A `Q4_K` row's dot with a `Q8_K` row as llama.cpp's x86 build computes it. With AVX2 it
/// repacks `Q4_K` matrices (eight interleaved rows, `q4_K_8x8`); its kernels add integer
/// sums times `d·d_a` into one sum with FMAs, the mins' sums times `dmin·d_a` into
/// another, and take their difference at the end. A row it multiplies alone (`gemv`: a
/// decoded token, the last rows of a batch that are not a group of four) adds each
/// super-block's sums with one FMA each; a row in a group of four (`gemm`, `grouped`) adds
/// them per 64 elements, four FMAs each.
pub fn vec_dot_q4_k(n_blocks: usize, w: &[u8], act: &[u8], grouped: bool) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (wb, ab) in read_blocks::<BlockQ4K>(w).zip(read_blocks::<BlockQ8K>(act)).take(n_blocks) {
        let (dd, dm) = (wb.d.to_f32() * ab.d, wb.dmin.to_f32() * ab.d);
        if grouped {
            let (sc, mins) = unpack_scales_mins(&wb.scales);
            let g = group16_dots(&wb.quants(), &ab.qs);
            for c in 0..4 {
                let isum: i32 = (2 * c..2 * c + 2).map(|j| sc[j] as i32 * (g[2 * j] + g[2 * j + 1])).sum();
                let summ: i32 = (2 * c..2 * c + 2).map(|j| mins[j] as i32 * (ab.bsums[2 * j] as i32 + ab.bsums[2 * j + 1] as i32)).sum();
                acc = (isum as f32).mul_add(dd, acc);
                acc_min = (summ as f32).mul_add(dm, acc_min);
            }
        } else {
            let (isum, summ) = int_sums_scale_min(&wb.scales, &wb.quants(), &ab);
            acc = (isum as f32).mul_add(dd, acc);
            acc_min = (summ as f32).mul_add(dm, acc_min);
        }
    }
    acc - acc_min
}

impl QuantBlock for BlockQ2K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let q = self.quants();
        for ((&sc, group), out) in self
            .scales
            .iter()
            .zip(q.chunks_exact(16))
            .zip(out.chunks_exact_mut(16))
        {
            let (dl, ml) = (d * (sc & 0x0f) as f32, dmin * (sc >> 4) as f32);
            for (o, &v) in out.iter_mut().zip(group) {
                *o = dl * v as f32 - ml;
            }
        }
    }

    fn quantize_ref(x: &[f32]) -> Self {
        kq::quantize_q2_k(x)
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        let g = group16_dots(&self.quants(), &act.qs);
        let isum: i32 = self
            .scales
            .iter()
            .zip(&g)
            .map(|(&sc, &s)| (sc & 0x0f) as i32 * s)
            .sum();
        let summs: i32 = self
            .scales
            .iter()
            .zip(&act.bsums)
            .map(|(&sc, &b)| (sc >> 4) as i32 * b as i32)
            .sum();
        let dall = act.d * self.d.to_f32();
        let dmin = act.d * self.dmin.to_f32();
        dall * isum as f32 - dmin * summs as f32
    }
}

impl QuantBlock for BlockQ3K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let q = self.quants();
        for ((&sc, group), out) in q3_scales(&self.scales)
            .iter()
            .zip(q.chunks_exact(16))
            .zip(out.chunks_exact_mut(16))
        {
            let dl = d * sc as f32;
            for (o, &v) in out.iter_mut().zip(group) {
                *o = dl * v as f32;
            }
        }
    }

    fn quantize_ref(x: &[f32]) -> Self {
        kq::quantize_q3_k(x)
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        let g = group16_dots(&self.quants(), &act.qs);
        let isum: i32 = q3_scales(&self.scales)
            .iter()
            .zip(&g)
            .map(|(&sc, &s)| sc as i32 * s)
            .sum();
        self.d.to_f32() * act.d * isum as f32
    }
}

impl QuantBlock for BlockQ4K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_scale_min(
            self.d.to_f32(),
            self.dmin.to_f32(),
            &self.scales,
            &self.quants(),
            out,
        );
    }

    fn quantize_ref(x: &[f32]) -> Self {
        kq::quantize_q4_k(x)
    }

    /// One super-block's value alone. A row's dot does not sum these: it follows
    /// llama.cpp's FMA chains ([`vec_dot_q4_k`]).
    fn dot(&self, act: &BlockQ8K) -> f32 {
        dot_scale_min(
            self.d.to_f32(),
            self.dmin.to_f32(),
            &self.scales,
            &self.quants(),
            act,
        )
    }
}

impl QuantBlock for BlockQ5K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_scale_min(
            self.d.to_f32(),
            self.dmin.to_f32(),
            &self.scales,
            &self.quants(),
            out,
        );
    }

    fn quantize_ref(x: &[f32]) -> Self {
        kq::quantize_q5_k(x)
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        dot_scale_min(
            self.d.to_f32(),
            self.dmin.to_f32(),
            &self.scales,
            &self.quants(),
            act,
        )
    }
}

impl QuantBlock for BlockQ6K {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let q = self.quants();
        for ((&sc, group), out) in self
            .scales
            .iter()
            .zip(q.chunks_exact(16))
            .zip(out.chunks_exact_mut(16))
        {
            let dl = d * sc as f32;
            for (o, &v) in out.iter_mut().zip(group) {
                *o = dl * v as f32;
            }
        }
    }

    fn quantize_ref(x: &[f32]) -> Self {
        kq::quantize_q6_k(x)
    }

    /// One super-block's value alone. A row's dot does not sum these: it keeps eight
    /// float lanes as llama.cpp does ([`vec_dot_q6_k`]).
    fn dot(&self, act: &BlockQ8K) -> f32 {
        let g = group16_dots(&self.quants(), &act.qs);
        let isum: i32 = self
            .scales
            .iter()
            .zip(&g)
            .map(|(&sc, &s)| sc as i32 * s)
            .sum();
        self.d.to_f32() * act.d * isum as f32
    }
}
