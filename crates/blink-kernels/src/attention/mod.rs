//! Attention of query heads over cached keys and values: one pass with an online softmax,
//! in position order.
//!
//! The numerics are those of llama.cpp's CPU flash-attention kernel, which the reference
//! outputs come from: against an f16 cache the query is rounded to f16, each score is an
//! f16 dot product in the order of the [`Flavour`]'s build of ggml
//! ([`crate::quant::reduce::dot_float`]: 16-lane steps for AVX-512, 8-lane steps for
//! AVX2), the running maximum and sum use libm's `exp` and an FMA, and the weighted sum
//! of values is kept in f16, rounded after every update. An f32 cache keeps everything in
//! f32. Only the scores depend on the flavour.
//!
//! Callers feed positions block by block ([`attend`], or [`attend_heads`] for the query
//! heads that share one key/value head, of one row or of several rows of a prompt);
//! [`Online`] carries the softmax state between blocks and [`Online::finish`] normalises
//! the accumulator. The scalar `attend_scalar` defines the results; the SIMD kernels equal
//! it bit for bit.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::cpu::Isa;
use crate::flavour::Flavour;
use crate::quant::reduce::{dot_float, Tail};

/// Positions the SIMD kernels score together before they add the values: the horizontal
/// sums of the scores go eight at a time, and the softmax's `exp` calls overlap.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const CHUNK: usize = 16;

/// How a raw score `q·k` becomes a softmax input: times `mul`, then, with a cap `c`,
/// `c · tanh(s)` (Gemma 2's soft-capping, with `1/c` folded into `mul` as ggml folds it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    pub mul: f32,
    pub cap: Option<f32>,
}

impl Scale {
    /// Scores times `scale`, then soft-capped at `cap` if any.
    pub fn new(scale: f32, cap: Option<f32>) -> Scale {
        match cap {
            Some(c) => Scale { mul: scale / c, cap: Some(c) },
            None => Scale { mul: scale, cap: None },
        }
    }

    /// The cap applied to a scaled score (libm's `tanhf`, as ggml's).
    #[inline(always)]
    fn cap(self, s: f32) -> f32 {
        match self.cap {
            Some(c) => c * s.tanh(),
            None => s,
        }
    }
}

impl From<f32> for Scale {
    fn from(mul: f32) -> Scale {
        Scale { mul, cap: None }
    }
}

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
    /// `dst[i] = from_f32(src[i])`, converted in bulk (SIMD where the CPU has it).
    fn from_f32_slice(src: &[f32], dst: &mut [Self]);
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
    #[inline]
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len());
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") {
            // SAFETY: the CPU has F16C; `dst` holds f16 bit patterns, as many as `src`.
            return unsafe { x86::to_f16(src, dst.as_mut_ptr() as *mut u16) };
        }
        dst.convert_from_f32_slice(src);
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
    #[inline]
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
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
    if !T::HALF {
        out.copy_from_slice(q);
        return;
    }
    assert_eq!(q.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has F16C; `out` is as long as `q`.
        return unsafe { x86::round_f16_slice(q, out) };
    }
    // Through f16 and back in bulk, a stack chunk at a time.
    let mut half = [f16::ZERO; 64];
    for (q, out) in q.chunks(half.len()).zip(out.chunks_mut(half.len())) {
        let half = &mut half[..q.len()];
        half.convert_from_f32_slice(q);
        half.convert_to_f32_slice(out);
    }
}

/// Attend `q` (from [`prepare_query`]) over `n` positions whose keys and values are
/// consecutive rows of `q.len()` elements in `keys` and `values`, updating `state` and
/// `acc` (which starts zeroed, and is normalised by [`Online::finish`] at the end), with
/// `flavour`'s scores.
#[allow(clippy::too_many_arguments)]
pub fn attend<T: CacheElem>(isa: Isa, flavour: Flavour, q: &[f32], keys: &[T], values: &[T], n: usize, scale: impl Into<Scale>, state: &mut Online, acc: &mut [f32]) {
    attend_heads(isa, flavour, q, keys, values, n, scale, std::slice::from_mut(state), acc)
}

/// [`attend`] for `states.len()` query heads over the same keys and values (the heads of
/// one key/value group, of one or more rows of a prompt): `qs` and `accs` hold the heads'
/// queries and accumulators one after another. Each head's result is exactly that of
/// [`attend`]; sharing the rows saves their loads and conversions, and the heads' updates
/// overlap.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads<T: CacheElem>(isa: Isa, flavour: Flavour, qs: &[f32], keys: &[T], values: &[T], n: usize, scale: impl Into<Scale>, states: &mut [Online], accs: &mut [f32]) {
    let scale = scale.into();
    let heads = states.len();
    assert!(heads > 0 && qs.len().is_multiple_of(heads) && accs.len() == qs.len());
    let hd = qs.len() / heads;
    assert!(keys.len() >= n * hd && values.len() >= n * hd);
    #[cfg(target_arch = "x86_64")]
    if T::HALF && hd.is_multiple_of(16) && isa.is_x86() {
        // SAFETY: the CPU supports the path (checked when it was chosen); T is f16 (HALF),
        // so the slices are f16 bit patterns.
        unsafe {
            let k = std::slice::from_raw_parts(keys.as_ptr() as *const u16, n * hd);
            let v = std::slice::from_raw_parts(values.as_ptr() as *const u16, n * hd);
            return x86::attend_f16(isa == Isa::Avx512Vnni, flavour, qs, k, v, n, scale, states, accs);
        }
    }
    // The NEON kernel has the AVX-512 build's scores (its flavour); asked for the AVX2
    // build's, NEON runs the scalar definition.
    #[cfg(target_arch = "aarch64")]
    if T::HALF && hd.is_multiple_of(16) && isa.is_arm() && flavour == Flavour::Avx512 {
        // SAFETY: T is f16 (HALF), so the slices are f16 bit patterns; the kernel needs
        // only base NEON.
        unsafe {
            let k = std::slice::from_raw_parts(keys.as_ptr() as *const u16, n * hd);
            let v = std::slice::from_raw_parts(values.as_ptr() as *const u16, n * hd);
            for (h, state) in states.iter_mut().enumerate() {
                arm::attend_f16(&qs[h * hd..(h + 1) * hd], k, v, n, scale, state, &mut accs[h * hd..(h + 1) * hd]);
            }
            return;
        }
    }
    let _ = isa;
    for (h, state) in states.iter_mut().enumerate() {
        attend_scalar::<T>(flavour, &qs[h * hd..(h + 1) * hd], keys, values, n, scale, state, &mut accs[h * hd..(h + 1) * hd]);
    }
}

/// Ask the CPU to start loading `keys` and `values` into its L2 cache: for a block a
/// caller attends soon, whose rows are otherwise fetched from memory one miss at a time.
/// (Into L2, not L1: a block is dozens of lines (64 for SmolLM2's heads), and prefetches
/// into L1 held the core's L1 miss buffers, stalling the loads of the block being attended;
/// 16 sequences decoding 256 tokens ran ~4% faster.)
pub fn prefetch<T: CacheElem>(keys: &[T], values: &[T]) {
    #[cfg(target_arch = "x86_64")]
    for rows in [keys, values] {
        let bytes = std::mem::size_of_val(rows);
        for at in (0..bytes).step_by(64) {
            // SAFETY: a prefetch has no effect on memory; the addresses are in the slice.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>((rows.as_ptr() as *const i8).add(at));
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (keys, values);
}

/// The definition: one position at a time, score, softmax step, value update.
#[allow(clippy::too_many_arguments)]
fn attend_scalar<T: CacheElem>(flavour: Flavour, q: &[f32], keys: &[T], values: &[T], n: usize, scale: Scale, state: &mut Online, acc: &mut [f32]) {
    let hd = q.len();
    for t in 0..n {
        let key = &keys[t * hd..(t + 1) * hd];
        let value = &values[t * hd..(t + 1) * hd];
        let tail = if T::HALF { Tail::F64 } else { Tail::F32 };
        let s = scale.cap(dot_float(flavour, hd, |d| q[d], |d| key[d].to_f32(), tail) * scale.mul);
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
mod x86;

#[cfg(target_arch = "aarch64")]
mod arm;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_f16_conversions_round_as_one_value_does() {
        // Every 4093rd f32 bit pattern (both signs, all exponents: subnormal and
        // overflowing f16, infinities, NaNs), and odd lengths for the tails.
        let src: Vec<f32> = (0..=u32::MAX).step_by(4093).map(f32::from_bits).collect();
        for len in [src.len(), 13, 7, 0] {
            let src = &src[..len];
            let mut dst = vec![f16::ZERO; len];
            f16::from_f32_slice(src, &mut dst);
            let mut rounded = vec![0f32; len];
            prepare_query::<f16>(src, &mut rounded);
            for ((&x, h), r) in src.iter().zip(&dst).zip(&rounded) {
                let want = f16::from_f32(x);
                assert!(h.to_bits() == want.to_bits() || (h.is_nan() && want.is_nan()), "{x:e}: {h} vs {want}");
                assert!(r.to_bits() == want.to_f32().to_bits() || (r.is_nan() && want.is_nan()), "{x:e}: {r} vs {want}");
            }
        }
    }

    /// A xorshift stream of values in [-1, 1].
    fn rng(seed: u32) -> impl FnMut() -> f32 {
        let mut s = seed | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 20001) as f32 / 10000.0 - 1.0
        }
    }

    /// Queries of `heads` heads and `n` key/value rows. With `rising`, every head's query
    /// leans the same way and the keys lean further along it position by position, so
    /// most positions raise the maximum (and rescale the accumulator). `big` scales the
    /// values towards the top of the f16 range.
    fn data(n: usize, hd: usize, heads: usize, seed: u32, rising: bool, big: f32) -> (Vec<f32>, Vec<f16>, Vec<f16>) {
        let mut r = rng(seed);
        let lean: Vec<f32> = (0..hd).map(|_| r()).collect();
        let q: Vec<f32> = (0..heads * hd).map(|i| if rising { lean[i % hd] * 2.0 + r() * 0.3 } else { r() * 3.0 }).collect();
        let k: Vec<f16> = (0..n * hd).map(|i| f16::from_f32(if rising { lean[i % hd] * (i / hd) as f32 * 0.05 + r() * 0.2 } else { r() * 4.0 })).collect();
        let v: Vec<f16> = (0..n * hd).map(|_| f16::from_f32(r() * big)).collect();
        (q, k, v)
    }

    /// All heads over the positions, fed in blocks that end at `splits`.
    #[allow(clippy::too_many_arguments)]
    fn run(isa: Isa, f: Flavour, heads: usize, q: &[f32], k: &[f16], v: &[f16], n: usize, splits: &[usize]) -> Vec<f32> {
        let hd = q.len() / heads;
        let mut qr = vec![0f32; q.len()];
        prepare_query::<f16>(q, &mut qr);
        let mut acc = vec![0f32; q.len()];
        let mut st = vec![Online::default(); heads];
        let mut at = 0;
        for &end in splits.iter().chain([&n]) {
            let (kb, vb) = (&k[at * hd..end * hd], &v[at * hd..end * hd]);
            if heads == 1 {
                attend(isa, f, &qr, kb, vb, end - at, 0.125, &mut st[0], &mut acc);
            } else {
                attend_heads(isa, f, &qr, kb, vb, end - at, 0.125, &mut st, &mut acc);
            }
            at = end;
        }
        for (h, st) in st.iter().enumerate() {
            st.finish(&mut acc[h * hd..(h + 1) * hd]);
        }
        acc
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn simd_paths() -> impl Iterator<Item = Isa> {
        Isa::simd_supported().into_iter()
    }

    #[test]
    fn simd_equals_scalar_and_blocks_do_not_matter() {
        for f in Flavour::ALL {
            for (hd, n) in [(64, 37), (128, 5), (80, 20), (16, 3), (256, 19), (48, 9)] {
                let (q, k, v) = data(n, hd, 1, (hd * n) as u32, false, 1.0);
                let want = run(Isa::Scalar, f, 1, &q, &k, &v, n, &[n / 2]);
                assert_eq!(run(Isa::Scalar, f, 1, &q, &k, &v, n, &[1]), want);
                for isa in simd_paths() {
                    assert_eq!(run(isa, f, 1, &q, &k, &v, n, &[n / 3]), want, "{isa} {f} hd {hd}");
                }
            }
        }
    }

    /// The flavours' scores differ, so each kernel is held to its own: over these rows
    /// some results differ in their last bits.
    #[test]
    fn the_flavours_scores_differ() {
        for (hd, n) in [(64, 40), (256, 40)] {
            let differ = (0..8u32).any(|seed| {
                let (q, k, v) = data(n, hd, 1, seed, true, 1.0);
                let a = run(Isa::Scalar, Flavour::Avx512, 1, &q, &k, &v, n, &[]);
                let b = run(Isa::Scalar, Flavour::Avx2, 1, &q, &k, &v, n, &[]);
                assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-2 * (1.0 + x.abs())), "hd {hd}");
                bits(&a) != bits(&b)
            });
            assert!(differ, "hd {hd}: the flavours agree on every row");
        }
    }

    /// Every head count, head size, length and blocking, on data that rescales rarely or
    /// at almost every position, with small and near-overflowing values: each head of
    /// [`attend_heads`] equals the scalar [`attend`] of that head alone, bit for bit.
    #[test]
    fn heads_and_chunks_equal_the_scalar_definition() {
        let mut seed = 1;
        for (hd, f) in [64, 128, 16, 48, 80, 96].into_iter().flat_map(|hd| Flavour::ALL.map(|f| (hd, f))) {
            for heads in [1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 17] {
                for n in (1..=40).chain([63, 100]) {
                    if hd != 64 && n % 7 != 0 && n > 3 {
                        continue;
                    }
                    for (rising, big) in [(false, 1.0), (true, 1.0), (true, 3000.0), (false, 60000.0)] {
                        seed += 1;
                        let (q, k, v) = data(n, hd, heads, seed, rising, big);
                        let want: Vec<f32> = (0..heads).flat_map(|h| run(Isa::Scalar, f, 1, &q[h * hd..(h + 1) * hd], &k, &v, n, &[])).collect();
                        let blocks: Vec<usize> = (16..n).step_by(16).collect();
                        let uneven = [n / 3, n / 3 + 1, n - n / 4];
                        for isa in simd_paths() {
                            for splits in [&[][..], &blocks, &uneven] {
                                let got = run(isa, f, heads, &q, &k, &v, n, splits);
                                assert_eq!(bits(&got), bits(&want), "{isa} {f} hd {hd} heads {heads} n {n} splits {splits:?} rising {rising} big {big}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Soft-capped scores (Gemma 2's), several heads together: each head equals the scalar
    /// definition.
    #[test]
    fn capped_heads_equal_the_scalar_definition() {
        let (hd, n, heads) = (64, 40, 6);
        let (q, k, v) = data(n, hd, heads, 77, true, 1.0);
        let scale = Scale::new(0.125, Some(5.0));
        for f in Flavour::ALL {
            let attend_all = |isa: Isa, heads: usize, q: &[f32]| {
                let mut qr = vec![0f32; q.len()];
                prepare_query::<f16>(q, &mut qr);
                let (mut acc, mut st) = (vec![0f32; q.len()], vec![Online::default(); heads]);
                for at in (0..n).step_by(16) {
                    let end = (at + 16).min(n);
                    attend_heads(isa, f, &qr, &k[at * hd..end * hd], &v[at * hd..end * hd], end - at, scale, &mut st, &mut acc);
                }
                for (h, st) in st.iter().enumerate() {
                    st.finish(&mut acc[h * hd..(h + 1) * hd]);
                }
                bits(&acc)
            };
            let want: Vec<u32> = (0..heads).flat_map(|h| attend_all(Isa::Scalar, 1, &q[h * hd..(h + 1) * hd])).collect();
            for isa in simd_paths() {
                assert_eq!(attend_all(isa, heads, &q), want, "{isa} {f}");
            }
        }
    }

    #[test]
    fn rising_scores_rescale_at_most_positions() {
        let (q, k, _) = data(40, 64, 1, 5, true, 1.0);
        let mut qr = vec![0f32; 64];
        prepare_query::<f16>(&q, &mut qr);
        let mut st = Online::default();
        let rises = (0..40)
            .filter(|&t| {
                let s = dot_float(Flavour::Avx512, 64, |d| qr[d], |d| k[t * 64 + d].to_f32(), Tail::F64) * 0.125;
                st.step(s).0 != 1.0
            })
            .count();
        assert!(rises > 30, "{rises}");
    }

    #[test]
    fn attention_is_a_convex_combination_of_values() {
        let (q, k, v) = data(50, 64, 1, 9, false, 1.0);
        let out = run(Isa::Scalar, Flavour::Avx2, 1, &q, &k, &v, 50, &[10]);
        for d in 0..64 {
            let col: Vec<f32> = (0..50).map(|t| v[t * 64 + d].to_f32()).collect();
            let (lo, hi) = col.iter().fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            assert!(out[d] >= lo - 1e-2 && out[d] <= hi + 1e-2, "dim {d}: {} not in [{lo}, {hi}]", out[d]);
        }
    }
}
