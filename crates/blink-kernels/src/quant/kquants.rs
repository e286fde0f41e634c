//! The k-quants `Q2_K`..`Q6_K`: dequantization and dot products with `Q8_K`, over the
//! fields [`super::kquants_bits`] reads out of a super-block.
//!
//! Scales apply to groups of 16 (`Q2_K`, `Q3_K`, `Q6_K`) or 32 (`Q4_K`, `Q5_K`) elements.
//! Dot products follow ggml's `ggml_vec_dot_q*_K_q8_K`: exact `i32` sums of
//! `scale·Σ(q_w·q_a)` per super-block, mins folded in through the activation's `bsums`,
//! then `d_w·d_a·isum - dmin_w·d_a·summins` in `f32`.

use std::array::from_fn;

use blink_gguf::QK_K;

use super::blocks::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, K_SCALE_SIZE};
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

/// `Q4_K`/`Q5_K` dot with `Q8_K`.
fn dot_scale_min(
    d: f32,
    dmin: f32,
    scales: &[u8; K_SCALE_SIZE],
    q: &[i8; QK_K],
    act: &BlockQ8K,
) -> f32 {
    let (sc, mins) = unpack_scales_mins(scales);
    let g = group16_dots(q, &act.qs);
    let isum: i32 = (0..8)
        .map(|j| sc[j] as i32 * (g[2 * j] + g[2 * j + 1]))
        .sum();
    let summ = mins_dot(act, &mins);
    d * act.d * isum as f32 - dmin * act.d * summ as f32
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
