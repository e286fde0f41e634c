//! Attention of one query head over cached keys and values: one pass with an online
//! softmax, in position order.
//!
//! The numerics are those of llama.cpp's CPU flash-attention kernel, which the reference
//! outputs come from: against an f16 cache the query is rounded to f16, each score is an
//! f16 dot product in ggml's AVX-512 order ([`crate::quant::reduce::dot_lanes16`]), the
//! running maximum and sum use libm's `exp` and an FMA, and the weighted sum of values is
//! kept in f16, rounded after every update. An f32 cache keeps everything in f32.
//!
//! Callers feed positions block by block ([`attend`]); [`Online`] carries the softmax
//! state between blocks and [`Online::finish`] normalises the accumulator.

use half::f16;

use crate::cpu::Isa;
use crate::quant::reduce::dot_lanes16;

/// Running softmax state of one (query, head).
#[derive(Clone, Copy, Debug)]
pub struct Online {
    pub max: f32,
    pub sum: f32,
}

impl Default for Online {
    fn default() -> Self {
        Online { max: f32::NEG_INFINITY, sum: 0.0 }
    }
}

impl Online {
    /// Divide the accumulated values by the softmax sum.
    pub fn finish(&self, acc: &mut [f32]) {
        let inv = if self.sum == 0.0 { 0.0 } else { 1.0 / self.sum };
        acc.iter_mut().for_each(|a| *a *= inv);
    }
}

/// A cache element type.
pub trait CacheElem: Copy + Send + Sync + 'static {
    /// Whether values are rounded to f16 (an f16 cache) or kept in f32.
    const HALF: bool;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl CacheElem for f16 {
    const HALF: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl CacheElem for f32 {
    const HALF: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

/// Round `v` to the cache's precision.
#[inline(always)]
fn round<T: CacheElem>(v: f32) -> f32 {
    if T::HALF {
        f16::from_f32(v).to_f32()
    } else {
        v
    }
}

/// Prepare a query head for [`attend`]: rounded to the cache's precision.
pub fn prepare_query<T: CacheElem>(q: &[f32], out: &mut [f32]) {
    out.iter_mut().zip(q).for_each(|(o, &v)| *o = round::<T>(v));
}

/// Attend `q` (from [`prepare_query`]) over `n` positions whose keys and values are
/// consecutive rows of `q.len()` elements in `keys` and `values`, updating `state` and
/// `acc` (which starts zeroed, and is normalised by [`Online::finish`] at the end).
pub fn attend<T: CacheElem>(isa: Isa, q: &[f32], keys: &[T], values: &[T], n: usize, scale: f32, state: &mut Online, acc: &mut [f32]) {
    let hd = q.len();
    assert!(keys.len() >= n * hd && values.len() >= n * hd && acc.len() == hd);
    #[cfg(target_arch = "x86_64")]
    if T::HALF && hd % 16 == 0 && matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) {
        // SAFETY: the CPU supports AVX2/FMA/F16C (checked when the path was chosen); T is
        // f16 (HALF), so the slices are f16 bit patterns.
        unsafe {
            let k = std::slice::from_raw_parts(keys.as_ptr() as *const u16, n * hd);
            let v = std::slice::from_raw_parts(values.as_ptr() as *const u16, n * hd);
            return x86::attend_f16(q, k, v, n, scale, state, acc);
        }
    }
    #[cfg(target_arch = "aarch64")]
    if T::HALF && hd % 16 == 0 && isa == Isa::Neon {
        // SAFETY: T is f16 (HALF), so the slices are f16 bit patterns; the kernel needs
        // only base NEON.
        unsafe {
            let k = std::slice::from_raw_parts(keys.as_ptr() as *const u16, n * hd);
            let v = std::slice::from_raw_parts(values.as_ptr() as *const u16, n * hd);
            return arm::attend_f16(q, k, v, n, scale, state, acc);
        }
    }
    let _ = isa;
    attend_scalar::<T>(q, keys, values, n, scale, state, acc)
}

#[allow(clippy::too_many_arguments)]
fn attend_scalar<T: CacheElem>(q: &[f32], keys: &[T], values: &[T], n: usize, scale: f32, state: &mut Online, acc: &mut [f32]) {
    let hd = q.len();
    for t in 0..n {
        let key = &keys[t * hd..(t + 1) * hd];
        let value = &values[t * hd..(t + 1) * hd];
        let s = dot_lanes16(hd, |d| q[d], |d| key[d].to_f32(), T::HALF) * scale;
        let (ms, vs) = state.step(s);
        if ms != 1.0 {
            acc.iter_mut().for_each(|a| *a = round::<T>(*a * ms));
        }
        acc.iter_mut().zip(value).for_each(|(a, &v)| *a = round::<T>(v.to_f32().mul_add(vs, *a)));
    }
}

impl Online {
    /// Take score `s`; returns the factor to rescale the accumulator by and the weight of
    /// this position's value.
    #[inline(always)]
    fn step(&mut self, s: f32) -> (f32, f32) {
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > self.max {
            ms = (self.max - s).exp();
            self.max = s;
        } else {
            vs = (s - self.max).exp();
        }
        self.sum = self.sum.mul_add(ms, vs);
        (ms, vs)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Online;

    /// Sixteen lanes as two halves.
    #[derive(Clone, Copy)]
    struct V16(__m256, __m256);

    #[inline(always)]
    unsafe fn load16(p: *const u16) -> V16 {
        V16(_mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)), _mm256_cvtph_ps(_mm_loadu_si128(p.add(8) as *const __m128i)))
    }

    #[inline(always)]
    unsafe fn round16(v: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }

    /// `_mm512_reduce_add_ps` order over two halves: (lo+hi), then 128-bit halves, then
    /// (t0+t2) + (t1+t3).
    #[inline(always)]
    unsafe fn hsum16(v: V16) -> f32 {
        let t3 = _mm256_add_ps(v.1, v.0);
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
        _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)))
    }

    /// f16 keys and values, `hd` a multiple of 16.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_f16(q: &[f32], keys: &[u16], values: &[u16], n: usize, scale: f32, state: &mut Online, acc: &mut [f32]) {
        let hd = q.len();
        let np = hd - hd % 64;
        for t in 0..n {
            let k = keys.as_ptr().add(t * hd);
            // Score: four 16-lane FMA accumulators over 64-element steps.
            let zero = V16(_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut a = [zero; 4];
            let mut i = 0;
            while i < np {
                for (j, aj) in a.iter_mut().enumerate() {
                    let e = i + 16 * j;
                    let kv = load16(k.add(e));
                    aj.0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(e)), kv.0, aj.0);
                    aj.1 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(e + 8)), kv.1, aj.1);
                }
                i += 64;
            }
            let a0 = V16(_mm256_add_ps(a[0].0, a[2].0), _mm256_add_ps(a[0].1, a[2].1));
            let a1 = V16(_mm256_add_ps(a[1].0, a[3].0), _mm256_add_ps(a[1].1, a[3].1));
            let head = hsum16(V16(_mm256_add_ps(a0.0, a1.0), _mm256_add_ps(a0.1, a1.1)));
            let mut sum = head as f64;
            for e in np..hd {
                sum += (q[e] * half::f16::from_bits(*k.add(e)).to_f32()) as f64;
            }
            let s = sum as f32 * scale;

            let (ms, vs) = state.step(s);
            let v = values.as_ptr().add(t * hd);
            let (msv, vsv) = (_mm256_set1_ps(ms), _mm256_set1_ps(vs));
            let rescale = ms != 1.0;
            let mut d = 0;
            while d < hd {
                let ap = acc.as_mut_ptr().add(d);
                let mut x = _mm256_loadu_ps(ap);
                if rescale {
                    x = round16(_mm256_mul_ps(x, msv));
                }
                let val = _mm256_cvtph_ps(_mm_loadu_si128(v.add(d) as *const __m128i));
                _mm256_storeu_ps(ap, round16(_mm256_fmadd_ps(val, vsv, x)));
                d += 8;
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    use super::Online;
    use crate::neon::{f16x4_to_f32, round_f16};

    /// Sixteen lanes as four quarters.
    type V16 = [float32x4_t; 4];

    /// Four f16 values at `p` as f32.
    #[inline(always)]
    unsafe fn load4(p: *const u16) -> float32x4_t {
        f16x4_to_f32(vld1_u16(p))
    }

    /// [`crate::quant::reduce::hsum16`]: halves, then quarters, then (t0+t2) + (t1+t3).
    #[inline(always)]
    unsafe fn hsum16(v: V16) -> f32 {
        let t6 = vaddq_f32(vaddq_f32(v[3], v[1]), vaddq_f32(v[2], v[0]));
        let t8 = vaddq_f32(t6, vextq_f32::<2>(t6, t6));
        vgetq_lane_f32::<0>(t8) + vgetq_lane_f32::<1>(t8)
    }

    /// f16 keys and values, `hd` a multiple of 16: the x86 kernel's order on 4-lane vectors.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn attend_f16(q: &[f32], keys: &[u16], values: &[u16], n: usize, scale: f32, state: &mut Online, acc: &mut [f32]) {
        let hd = q.len();
        let np = hd - hd % 64;
        for t in 0..n {
            let k = keys.as_ptr().add(t * hd);
            // Score: four 16-lane FMA accumulators over 64-element steps.
            let mut a = [[vdupq_n_f32(0.0); 4]; 4];
            let mut i = 0;
            while i < np {
                for (j, aj) in a.iter_mut().enumerate() {
                    for (x, lane) in aj.iter_mut().enumerate() {
                        let e = i + 16 * j + 4 * x;
                        *lane = vfmaq_f32(*lane, vld1q_f32(q.as_ptr().add(e)), load4(k.add(e)));
                    }
                }
                i += 64;
            }
            let folded: V16 = std::array::from_fn(|x| vaddq_f32(vaddq_f32(a[0][x], a[2][x]), vaddq_f32(a[1][x], a[3][x])));
            let mut sum = hsum16(folded) as f64;
            for (e, &qe) in q.iter().enumerate().skip(np) {
                sum += (qe * half::f16::from_bits(*k.add(e)).to_f32()) as f64;
            }
            let s = sum as f32 * scale;

            let (ms, vs) = state.step(s);
            let v = values.as_ptr().add(t * hd);
            let (msv, vsv) = (vdupq_n_f32(ms), vdupq_n_f32(vs));
            let rescale = ms != 1.0;
            for d in (0..hd).step_by(4) {
                let ap = acc.as_mut_ptr().add(d);
                let mut x = vld1q_f32(ap);
                if rescale {
                    x = round_f16(vmulq_f32(x, msv));
                }
                vst1q_f32(ap, round_f16(vfmaq_f32(x, load4(v.add(d)), vsv)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, hd: usize, seed: u32) -> (Vec<f32>, Vec<f16>, Vec<f16>) {
        let mut s = seed | 1;
        let mut r = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 20001) as f32 / 10000.0 - 1.0
        };
        let q: Vec<f32> = (0..hd).map(|_| r() * 3.0).collect();
        let k: Vec<f16> = (0..n * hd).map(|_| f16::from_f32(r() * 4.0)).collect();
        let v: Vec<f16> = (0..n * hd).map(|_| f16::from_f32(r())).collect();
        (q, k, v)
    }

    fn run(isa: Isa, q: &[f32], k: &[f16], v: &[f16], n: usize, split: usize) -> Vec<f32> {
        let hd = q.len();
        let mut qr = vec![0f32; hd];
        prepare_query::<f16>(q, &mut qr);
        let mut acc = vec![0f32; hd];
        let mut st = Online::default();
        attend(isa, &qr, &k[..split * hd], &v[..split * hd], split, 0.125, &mut st, &mut acc);
        attend(isa, &qr, &k[split * hd..], &v[split * hd..], n - split, 0.125, &mut st, &mut acc);
        st.finish(&mut acc);
        acc
    }

    #[test]
    fn simd_equals_scalar_and_blocks_do_not_matter() {
        for (hd, n) in [(64, 37), (128, 5), (80, 20), (16, 3)] {
            let (q, k, v) = data(n, hd, (hd * n) as u32);
            let want = run(Isa::Scalar, &q, &k, &v, n, n / 2);
            assert_eq!(run(Isa::Scalar, &q, &k, &v, n, 1), want);
            for isa in [Isa::Avx2, Isa::Avx512Vnni, Isa::Neon].into_iter().filter(|i| i.supported()) {
                assert_eq!(run(isa, &q, &k, &v, n, n / 3), want, "{isa} hd {hd}");
            }
        }
    }

    #[test]
    fn attention_is_a_convex_combination_of_values() {
        let (q, k, v) = data(50, 64, 9);
        let out = run(Isa::Scalar, &q, &k, &v, 50, 10);
        for d in 0..64 {
            let col: Vec<f32> = (0..50).map(|t| v[t * 64 + d].to_f32()).collect();
            let (lo, hi) = col.iter().fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            assert!(out[d] >= lo - 1e-2 && out[d] <= hi + 1e-2, "dim {d}: {} not in [{lo}, {hi}]", out[d]);
        }
    }
}
