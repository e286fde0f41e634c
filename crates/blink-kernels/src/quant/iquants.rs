//! The non-linear 4-bit formats `IQ4_NL` (32-element blocks, `Q8_0` activations) and
//! `IQ4_XS` (256-element super-blocks of eight 32-element groups with 6-bit scales, `Q8_K`
//! activations): each 4-bit quant indexes [`KVALUES_IQ4NL`].
//!
//! The dot products follow llama.cpp's x86 build. `IQ4_NL` matrices are repacked there
//! (`iq4_nl_8x8`, as `Q4_0`), whose kernels add each block's exact integer sum times
//! `d·d_a` with one FMA, in one chain per output: that is this format's only order.
//! `IQ4_XS` keeps eight integer lanes per super-block (lane `k`: elements `4k..4k+4` of
//! every group, times the group's scale) in eight float lanes ([`EightLanes`]). Its
//! products are llama.cpp's sign trick, `|v| · sign(a, v)` in bytes: an activation of −128
//! against a negative value wraps, so that product comes out as `128 · v` rather than
//! `−128 · v` ([`signed_product`]). `Q8_K` rows hold a −128 in every block (the element of
//! largest magnitude), so this is part of the definition.

use half::f16;

use super::blocks::{BlockIQ4NL, BlockIQ4XS, BlockQ8K, BlockQ8_0, QK32};
use super::rows::{DotAcc, EightLanes, QuantBlock};
use blink_gguf::QK_K;

/// The sixteen values a 4-bit `IQ4_NL`/`IQ4_XS` quant stands for.
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// Below this a group's largest magnitude counts as all zeros (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// The 32 table indices of a group stored as 16 bytes (low nibbles: elements 0..16).
#[inline]
pub(super) fn indices(qs: &[u8]) -> [u8; 32] {
    std::array::from_fn(|e| if e < 16 { qs[e] & 0x0f } else { qs[e - 16] >> 4 })
}

/// The table index nearest `x` (ties to the upper of two neighbours only when strictly
/// nearer, as ggml's `best_index_int8`).
fn best_index(x: f32) -> u8 {
    let v = &KVALUES_IQ4NL;
    if x <= v[0] as f32 {
        return 0;
    }
    if x >= v[15] as f32 {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v[mid] as f32 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - (v[hi - 1] as f32) < v[hi] as f32 - x { hi as u8 - 1 } else { hi as u8 }
}

/// ggml's search for one 32-element group's scale (`quantize_row_iq4_nl_impl`, no
/// importance weights: each element weighs `x²`), trying `ntry` scales either side of the
/// first guess. Returns the scale; `l` gets the indices for it.
fn group_scale(x: &[f32], ntry: i32, l: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let v0 = KVALUES_IQ4NL[0] as f32;
    let sums = |id: f32, l: Option<&mut [u8]>| {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        let mut out = l;
        for (j, &xj) in x.iter().enumerate() {
            let i = best_index(id * xj);
            if let Some(l) = out.as_deref_mut() {
                l[j] = i;
            }
            let q = KVALUES_IQ4NL[i as usize] as f32;
            let w = xj * xj;
            sumqx += w * q * xj;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d0 = if ntry > 0 { -max / v0 } else { max / v0 };
    let (sumqx, sumq2) = sums(1.0 / d0, Some(l));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        let (sumqx, sumq2) = sums((itry as f32 + v0) / max, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Pack a group's 32 indices into 16 bytes.
fn pack(l: &[u8], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = l[j] | (l[16 + j] << 4);
    }
}

impl QuantBlock for BlockIQ4NL {
    type Act = BlockQ8_0;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, i) in out[..QK32].iter_mut().zip(indices(&self.qs)) {
            *o = d * KVALUES_IQ4NL[i as usize] as f32;
        }
    }

    /// ggml's `quantize_row_iq4_nl_ref` (the scale refined once, no wider search).
    fn quantize_ref(x: &[f32]) -> Self {
        let mut l = [0u8; QK32];
        let d = group_scale(&x[..QK32], -1, &mut l);
        let mut qs = [0u8; QK32 / 2];
        pack(&l, &mut qs);
        BlockIQ4NL { d: f16::from_f32(d), qs }
    }

    #[inline]
    fn accumulate(&self, act: &BlockQ8_0, acc: &mut DotAcc) {
        let sum: i32 = indices(&self.qs).iter().zip(&act.qs).map(|(&i, &a)| KVALUES_IQ4NL[i as usize] as i32 * a as i32).sum();
        acc.add_block_sum(self.d.to_f32() * act.d.to_f32(), sum);
    }
}

impl BlockIQ4XS {
    /// Group `g`'s 6-bit scale, less 32.
    #[inline]
    pub fn group_scale(&self, g: usize) -> i32 {
        let low = (self.scales_l[g / 2] >> (4 * (g % 2))) & 0x0f;
        let high = ((self.scales_h >> (2 * g)) & 3) as u8;
        (low | (high << 4)) as i32 - 32
    }
}

impl QuantBlock for BlockIQ4XS {
    type Act = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (g, out) in out[..QK_K].chunks_exact_mut(32).enumerate() {
            let dl = d * self.group_scale(g) as f32;
            for (o, i) in out.iter_mut().zip(indices(&self.qs[16 * g..16 * g + 16])) {
                *o = dl * KVALUES_IQ4NL[i as usize] as f32;
            }
        }
    }

    /// ggml's `quantize_row_iq4_xs_ref`: each group's scale searched (seven tries either
    /// side), then all eight as 6-bit multiples of one super-block scale.
    fn quantize_ref(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; QK_K / 32];
        let (mut max_scale, mut amax_scale) = (0f32, 0f32);
        for (g, s) in scales.iter_mut().enumerate() {
            *s = group_scale(&x[32 * g..32 * g + 32], 7, &mut l[32 * g..32 * g + 32]);
            if s.abs() > amax_scale {
                amax_scale = s.abs();
                max_scale = *s;
            }
        }
        let d = -max_scale / 32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut block = BlockIQ4XS { d: f16::from_f32(d), scales_h: 0, scales_l: [0; QK_K / 64], qs: [0; QK_K / 2] };
        for (g, &s) in scales.iter().enumerate() {
            let ls = super::numeric::nearest_int(id * s).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for (j, &xj) in x[32 * g..32 * g + 32].iter().enumerate() {
                l[32 * g + j] = best_index(idl * xj);
            }
            let ls = (ls + 32) as u8;
            block.scales_l[g / 2] |= (ls & 0x0f) << (4 * (g % 2));
            block.scales_h |= ((ls >> 4) as u16) << (2 * g);
        }
        for g in 0..QK_K / 32 {
            pack(&l[32 * g..32 * g + 32], &mut block.qs[16 * g..16 * g + 16]);
        }
        block
    }

    fn dot(&self, act: &BlockQ8K) -> f32 {
        self.lanes_value(act)
    }
}

impl EightLanes for BlockIQ4XS {
    fn lanes(&self, act: &BlockQ8K) -> [i32; 8] {
        iq4_xs_lanes(self, act)
    }

    fn scale(&self) -> f32 {
        self.d.to_f32()
    }
}

/// `|v| · sign(a, v)` with the byte negation wrapping, as `_mm256_sign_epi8` computes it.
#[inline]
pub(super) fn signed_product(v: i8, a: i8) -> i32 {
    let s = if v < 0 { a.wrapping_neg() } else { a };
    v.unsigned_abs() as i32 * s as i32
}

/// A super-block's eight integer lanes: lane `k` sums `scale_g · v[q] · a` (as
/// [`signed_product`]) over elements `4k..4k + 4` of every group `g`.
#[inline]
fn iq4_xs_lanes(w: &BlockIQ4XS, a: &BlockQ8K) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for g in 0..QK_K / 32 {
        let idx = indices(&w.qs[16 * g..16 * g + 16]);
        let s = w.group_scale(g);
        for (k, lane) in lanes.iter_mut().enumerate() {
            let e = 4 * k;
            let sum: i32 = (e..e + 4).map(|e| signed_product(KVALUES_IQ4NL[idx[e] as usize], a.qs[32 * g + e])).sum();
            *lane += s * sum;
        }
    }
    lanes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::Block;

    fn wave(n: usize, phase: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 * 0.37 + phase).sin() * 1.7 + (i % 7) as f32 * 0.05) * 0.02).collect()
    }

    #[test]
    fn round_trips_stay_close() {
        let x = wave(QK_K, 0.3);
        let mut y = vec![0f32; QK_K];
        BlockIQ4XS::quantize_ref(&x).dequantize(&mut y);
        let err = x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / x.iter().map(|a| a * a).sum::<f32>();
        assert!(err < 0.01, "IQ4_XS relative error {err}");
        for g in 0..QK_K / 32 {
            let mut y = [0f32; QK32];
            BlockIQ4NL::quantize_ref(&x[32 * g..32 * g + 32]).dequantize(&mut y);
            let err = x[32 * g..].iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / x[32 * g..32 * g + 32].iter().map(|a| a * a).sum::<f32>();
            assert!(err < 0.02, "IQ4_NL relative error {err}");
        }
    }

    #[test]
    fn nearest_index_is_nearest() {
        for x in (-1400..1400).map(|i| i as f32 * 0.1) {
            let i = best_index(x) as usize;
            let best = KVALUES_IQ4NL.iter().map(|&v| (v as f32 - x).abs()).fold(f32::INFINITY, f32::min);
            assert_eq!((KVALUES_IQ4NL[i] as f32 - x).abs(), best, "{x}");
        }
    }

    #[test]
    fn dots_equal_the_dequantized_sums_closely() {
        let w = wave(QK_K, 0.1);
        let a = wave(QK_K, 1.9);
        let wb = BlockIQ4XS::quantize_ref(&w);
        let ab = BlockQ8K::quantize_ref(&a);
        let (mut wd, mut ad) = (vec![0f32; QK_K], vec![0f32; QK_K]);
        wb.dequantize(&mut wd);
        ab.dequantize(&mut ad);
        let exact: f32 = wd.iter().zip(&ad).map(|(x, y)| x * y).sum();
        let got = crate::quant::rows::vec_dot_eight_lanes::<BlockIQ4XS>(1, wb.as_bytes(), ab.as_bytes());
        assert!((got - exact).abs() <= 1e-4 * exact.abs().max(1e-3), "{got} vs {exact}");
        assert_eq!(wb.dot(&ab), got);
    }
}
