//! Attention of query heads over cached keys and values: one pass with an online softmax,
//! in position order.
//!
//! The numerics are those of llama.cpp's CPU flash-attention kernel, which the reference
//! outputs come from: against an f16 cache the query is rounded to f16, each score is an
//! f16 dot product in ggml's AVX-512 order ([`crate::quant::reduce::dot_lanes16`]), the
//! running maximum and sum use libm's `exp` and an FMA, and the weighted sum of values is
//! kept in f16, rounded after every update. An f32 cache keeps everything in f32.
//!
//! Callers feed positions block by block ([`attend`], or [`attend_heads`] for the query
//! heads that share one key/value head); [`Online`] carries the softmax state between
//! blocks and [`Online::finish`] normalises the accumulator. The scalar `attend_scalar`
//! defines the results; the SIMD kernels equal it bit for bit.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::cpu::Isa;
use crate::quant::reduce::dot_lanes16;

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
/// `acc` (which starts zeroed, and is normalised by [`Online::finish`] at the end).
#[allow(clippy::too_many_arguments)]
pub fn attend<T: CacheElem>(isa: Isa, q: &[f32], keys: &[T], values: &[T], n: usize, scale: impl Into<Scale>, state: &mut Online, acc: &mut [f32]) {
    attend_heads(isa, q, keys, values, n, scale, std::slice::from_mut(state), acc)
}

/// [`attend`] for `states.len()` query heads over the same keys and values (the heads of
/// one key/value group): `qs` and `accs` hold the heads' queries and accumulators one
/// after another. Each head's result is exactly that of [`attend`]; sharing the rows
/// saves their loads and conversions, and the heads' updates overlap.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads<T: CacheElem>(isa: Isa, qs: &[f32], keys: &[T], values: &[T], n: usize, scale: impl Into<Scale>, states: &mut [Online], accs: &mut [f32]) {
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
            return x86::attend_f16(isa == Isa::Avx512Vnni, qs, k, v, n, scale, states, accs);
        }
    }
    #[cfg(target_arch = "aarch64")]
    if T::HALF && hd % 16 == 0 && isa == Isa::Neon {
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
        attend_scalar::<T>(&qs[h * hd..(h + 1) * hd], keys, values, n, scale, state, &mut accs[h * hd..(h + 1) * hd]);
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
fn attend_scalar<T: CacheElem>(q: &[f32], keys: &[T], values: &[T], n: usize, scale: Scale, state: &mut Online, acc: &mut [f32]) {
    let hd = q.len();
    for t in 0..n {
        let key = &keys[t * hd..(t + 1) * hd];
        let value = &values[t * hd..(t + 1) * hd];
        let s = scale.cap(dot_lanes16(hd, |d| q[d], |d| key[d].to_f32(), T::HALF) * scale.mul);
        let (ms, vs) = state.step(s);
        if ms != 1.0 {
            acc.iter_mut().for_each(|a| *a = round::<T>(*a * ms));
        }
        acc.iter_mut().zip(value).for_each(|(a, &v)| *a = round::<T>(v.to_f32().mul_add(vs, *a)));
    }
}

/// `e^x` of each element of a row, as a SIMD path computes it. A trait, not a closure
/// argument: a closure does not take on its caller's target features, so the intrinsics
/// in it would not inline (measured: 14% of a prompt's time in calls to single
/// instructions).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
trait RowExp {
    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn exp(row: &mut [f32; CHUNK]);
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

    /// [`Online::step`] for positions `0..m` of `s`, per head: the factors of each head
    /// and position. The running maxima are found first, so the `exp` calls do not wait
    /// for each other (`exp` takes a whole row of arguments, the unused tail zero), and
    /// the heads' sums are independent chains.
    ///
    /// # Safety
    /// The CPU must have what `E::exp` needs.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    unsafe fn steps<const P: usize, E: RowExp>(states: &mut [Online; P], s: &[[f32; CHUNK]; P], m: usize) -> ([[f32; CHUNK]; P], [[f32; CHUNK]; P]) {
        let mut arg = [[0f32; CHUNK]; P];
        let mut rose = [[false; CHUNK]; P];
        for p in 0..P {
            for t in 0..m {
                rose[p][t] = s[p][t] > states[p].max;
                if rose[p][t] {
                    arg[p][t] = states[p].max - s[p][t];
                    states[p].max = s[p][t];
                } else {
                    arg[p][t] = s[p][t] - states[p].max;
                }
            }
        }
        let (mut ms, mut vs) = ([[1f32; CHUNK]; P], [[1f32; CHUNK]; P]);
        for p in 0..P {
            E::exp(&mut arg[p]);
            // Both rows written at every position, a select each: as stores chosen by
            // `rose`, the compiler made scatters of them, slow on Zen 4.
            for t in 0..m {
                let (e, rose) = (arg[p][t], rose[p][t]);
                ms[p][t] = if rose { e } else { 1.0 };
                vs[p][t] = if rose { 1.0 } else { e };
            }
        }
        for t in 0..m {
            for p in 0..P {
                states[p].sum = states[p].sum.mul_add(ms[p][t], vs[p][t]);
            }
        }
        (ms, vs)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    use super::{Online, RowExp, Scale, CHUNK};

    /// f16 keys and values, heads of `hd` elements (a multiple of 16): the chunked kernel
    /// for 64 and 128, the per-position one otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attend_f16(avx512: bool, qs: &[f32], keys: &[u16], values: &[u16], n: usize, scale: Scale, states: &mut [Online], accs: &mut [f32]) {
        let hd = qs.len() / states.len();
        let (q, k, v, a) = (qs.as_ptr(), keys.as_ptr(), values.as_ptr(), accs.as_mut_ptr());
        match (avx512, hd) {
            (true, 64) => chunked_avx512::<4>(q, k, v, n, scale, states, a),
            (true, 128) => chunked_avx512::<8>(q, k, v, n, scale, states, a),
            (false, 64) => chunked_avx2::<4>(q, k, v, n, scale, states, a),
            (false, 128) => chunked_avx2::<8>(q, k, v, n, scale, states, a),
            _ => {
                for (h, state) in states.iter_mut().enumerate() {
                    let acc = &mut accs[h * hd..(h + 1) * hd];
                    per_position(&qs[h * hd..(h + 1) * hd], keys, values, n, scale, state, acc);
                }
            }
        }
    }

    /// Two heads at a time (chosen by measurement: AVX2's sixteen registers hold one
    /// head's 64-element accumulator, but sharing the key and value rows pays for spills;
    /// three heads, or value updates 32 elements at a time, measured 12-16% slower).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunked_avx2<const W: usize>(q: *const f32, k: *const u16, v: *const u16, n: usize, scale: Scale, states: &mut [Online], acc: *mut f32) {
        chunked::<W, 2>(q, k, v, n, scale, states, acc)
    }

    /// The same instructions with AVX-512VL's 32 registers: three heads at a time. (On
    /// Zen 4, which splits 512-bit operations in two, 512-bit vectors measured slower.)
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    unsafe fn chunked_avx512<const W: usize>(q: *const f32, k: *const u16, v: *const u16, n: usize, scale: Scale, states: &mut [Online], acc: *mut f32) {
        chunked::<W, 3>(q, k, v, n, scale, states, acc)
    }

    /// `dst[i] = f16(src[i])` (nearest, ties to even) as bits, eight at a time: inlined,
    /// where the `half` crate calls out per eight values (the cache stores of a step).
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn to_f16(src: &[f32], dst: *mut u16) {
        let body = src.len() - src.len() % 8;
        for i in (0..body).step_by(8) {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.add(i) as *mut __m128i, h);
        }
        for (i, &v) in src.iter().enumerate().skip(body) {
            *dst.add(i) = half::f16::from_f32(v).to_bits();
        }
    }

    /// `out[i] = f32(f16(q[i]))`, eight at a time.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn round_f16_slice(q: &[f32], out: &mut [f32]) {
        let body = q.len() - q.len() % 8;
        for i in (0..body).step_by(8) {
            _mm256_storeu_ps(out.as_mut_ptr().add(i), round8(_mm256_loadu_ps(q.as_ptr().add(i))));
        }
        for (o, &v) in out.iter_mut().zip(q).skip(body) {
            *o = half::f16::from_f32(v).to_f32();
        }
    }

    /// Sixteen f32 lanes, the unit ggml's f16 dot product is defined on, as two halves.
    #[derive(Clone, Copy)]
    struct V16(__m256, __m256);

    #[inline(always)]
    unsafe fn round8(v: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }

    impl V16 {
        #[inline(always)]
        unsafe fn zero() -> Self {
            V16(_mm256_setzero_ps(), _mm256_setzero_ps())
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            V16(_mm256_set1_ps(x), _mm256_set1_ps(x))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            V16(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
        }
        /// Sixteen f16 values at `p`, widened (exactly).
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> Self {
            V16(_mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)), _mm256_cvtph_ps(_mm_loadu_si128(p.add(8) as *const __m128i)))
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm256_storeu_ps(p, self.0);
            _mm256_storeu_ps(p.add(8), self.1);
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            V16(_mm256_add_ps(self.0, b.0), _mm256_add_ps(self.1, b.1))
        }
        #[inline(always)]
        unsafe fn mul(self, b: Self) -> Self {
            V16(_mm256_mul_ps(self.0, b.0), _mm256_mul_ps(self.1, b.1))
        }
        /// `self·b + c`, rounded once.
        #[inline(always)]
        unsafe fn fma(self, b: Self, c: Self) -> Self {
            V16(_mm256_fmadd_ps(self.0, b.0, c.0), _mm256_fmadd_ps(self.1, b.1, c.1))
        }
        /// Rounded to f16 precision (nearest, ties to even).
        #[inline(always)]
        unsafe fn round_f16(self) -> Self {
            V16(round8(self.0), round8(self.1))
        }
        /// Upper eight lanes plus lower eight: the first step of `_mm512_reduce_add_ps`.
        #[inline(always)]
        unsafe fn fold8(self) -> __m256 {
            _mm256_add_ps(self.1, self.0)
        }
    }

    /// The heads over `n` positions, `CHUNK` at a time; `P` heads at a time (the rest one
    /// by one), so they share each key and value row's load and widening. Heads are `16·W`
    /// elements, W a multiple of 4 (whole 64-element dot-product steps).
    #[inline(always)]
    unsafe fn chunked<const W: usize, const P: usize>(qs: *const f32, keys: *const u16, values: *const u16, n: usize, scale: Scale, states: &mut [Online], accs: *mut f32) {
        let hd = 16 * W;
        for c in (0..n).step_by(CHUNK) {
            let m = (n - c).min(CHUNK);
            let (k, v) = (keys.add(c * hd), values.add(c * hd));
            let mut h = 0;
            for group in states.chunks_mut(P) {
                let (q, acc) = (qs.add(h * hd), accs.add(h * hd));
                if group.len() == P {
                    heads::<W, P>(q, k, v, m, scale, group, acc);
                } else {
                    for (i, state) in group.iter_mut().enumerate() {
                        heads::<W, 1>(q.add(i * hd), k, v, m, scale, std::slice::from_mut(state), acc.add(i * hd));
                    }
                }
                h += group.len();
            }
        }
    }

    /// `P` heads over `m` (at most `CHUNK`) positions: every score, then every softmax
    /// step, then the value updates with the accumulators held in registers.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn heads<const W: usize, const P: usize>(qs: *const f32, keys: *const u16, values: *const u16, m: usize, scale: Scale, states: &mut [Online], accs: *mut f32) {
        let hd = 16 * W;
        let mut s = scores::<W, P>(qs, keys, m, scale.mul);
        if scale.cap.is_some() {
            s.iter_mut().for_each(|row| row[..m].iter_mut().for_each(|x| *x = scale.cap(*x)));
        }
        let (ms, vs) = Online::steps::<P, LibmExp>(states.try_into().unwrap(), &s, m);
        // 64 elements of each head at a time.
        for w0 in (0..W).step_by(4) {
            let mut acc: [[V16; 4]; P] = std::array::from_fn(|p| std::array::from_fn(|i| V16::load(accs.add(p * hd + 16 * (w0 + i)))));
            for t in 0..m {
                let v: [V16; 4] = std::array::from_fn(|i| V16::load_f16(values.add(t * hd + 16 * (w0 + i))));
                for p in 0..P {
                    if ms[p][t] != 1.0 {
                        let f = V16::splat(ms[p][t]);
                        acc[p].iter_mut().for_each(|a| *a = a.mul(f).round_f16());
                    }
                    let f = V16::splat(vs[p][t]);
                    for (a, v) in acc[p].iter_mut().zip(v) {
                        *a = v.fma(f, *a).round_f16();
                    }
                }
            }
            for (p, a) in acc.iter().enumerate() {
                for (i, a) in a.iter().enumerate() {
                    a.store(accs.add(p * hd + 16 * (w0 + i)));
                }
            }
        }
    }

    /// libm's `expf` bits (as llama.cpp's attention has them), eight at a time (AVX2+FMA).
    struct LibmExp;

    impl RowExp for LibmExp {
        #[inline(always)]
        unsafe fn exp(row: &mut [f32; CHUNK]) {
            for at in (0..CHUNK).step_by(8) {
                let p = row.as_mut_ptr().add(at);
                _mm256_storeu_ps(p, crate::libm_expf::expf8(_mm256_loadu_ps(p)));
            }
        }
    }

    /// The scaled scores of `P` queries against `m` keys, in ggml's order: four 16-lane
    /// FMA accumulators over 64-element steps, folded (`a0+a2`, `a1+a3`, then their sum)
    /// and reduced as `_mm512_reduce_add_ps` does, eight positions at a time.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // t indexes the keys and every head's row alike
    unsafe fn scores<const W: usize, const P: usize>(qs: *const f32, keys: *const u16, m: usize, scale: f32) -> [[f32; CHUNK]; P] {
        let hd = 16 * W;
        let q: [[V16; W]; P] = std::array::from_fn(|p| std::array::from_fn(|w| V16::load(qs.add(p * hd + 16 * w))));
        // Rows past `m` (up to a multiple of 8) are zeros; the rest is never read.
        let mut folded = [[MaybeUninit::<__m256>::uninit(); CHUNK]; P];
        for row in folded.iter_mut() {
            row[m..m.next_multiple_of(8)].fill(MaybeUninit::new(_mm256_setzero_ps()));
        }
        for t in 0..m {
            let k: [V16; W] = std::array::from_fn(|w| V16::load_f16(keys.add(t * hd + 16 * w)));
            for p in 0..P {
                let mut a = [V16::zero(); 4];
                for w in 0..W {
                    a[w % 4] = q[p][w].fma(k[w], a[w % 4]);
                }
                folded[p][t] = MaybeUninit::new(a[0].add(a[2]).add(a[1].add(a[3])).fold8());
            }
        }
        let mut s = [[0f32; CHUNK]; P];
        let sv = _mm256_set1_ps(scale);
        for p in 0..P {
            for c in (0..m).step_by(8) {
                // SAFETY: rows c..c + 8 were written above.
                let f = &*(folded[p][c..c + 8].as_ptr() as *const [__m256; 8]);
                _mm256_storeu_ps(s[p].as_mut_ptr().add(c), _mm256_mul_ps(hsum8x8(f), sv));
            }
        }
        s
    }

    /// The horizontal sums of eight 8-lane vectors (their lanes in position order), each
    /// in the order of [`crate::quant::reduce::hsum16`] after its first step:
    /// `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
    #[inline(always)]
    unsafe fn hsum8x8(f: &[__m256; 8]) -> __m256 {
        // Per vector, l0+l4 .. l3+l7: two vectors' sums in one register.
        let quarters = |a, b| _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b));
        // Per 128-bit lane of two such registers: [x0+x2, x1+x3, y0+y2, y1+y3].
        let pairs = |x, y| _mm256_add_ps(_mm256_shuffle_ps::<0b01_00_01_00>(x, y), _mm256_shuffle_ps::<0b11_10_11_10>(x, y));
        let x = pairs(quarters(f[0], f[4]), quarters(f[1], f[5]));
        let y = pairs(quarters(f[2], f[6]), quarters(f[3], f[7]));
        _mm256_add_ps(_mm256_shuffle_ps::<0b10_00_10_00>(x, y), _mm256_shuffle_ps::<0b11_01_11_01>(x, y))
    }

    /// `_mm512_reduce_add_ps` order over two halves: (lo+hi), then 128-bit halves, then
    /// (t0+t2) + (t1+t3).
    #[inline(always)]
    unsafe fn hsum16(v: V16) -> f32 {
        let t3 = v.fold8();
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
        _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)))
    }

    /// One head, one position at a time: any `hd` that is a multiple of 16 (the elements
    /// past the last 64-element step are added in f64, as ggml does).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn per_position(q: &[f32], keys: &[u16], values: &[u16], n: usize, scale: Scale, state: &mut Online, acc: &mut [f32]) {
        let hd = q.len();
        let np = hd - hd % 64;
        for t in 0..n {
            let k = keys.as_ptr().add(t * hd);
            // Score: four 16-lane FMA accumulators over 64-element steps.
            let mut a = [V16::zero(); 4];
            for e in (0..np).step_by(16) {
                a[e / 16 % 4] = V16::load(q.as_ptr().add(e)).fma(V16::load_f16(k.add(e)), a[e / 16 % 4]);
            }
            let mut sum = hsum16(a[0].add(a[2]).add(a[1].add(a[3]))) as f64;
            for (e, &qe) in q.iter().enumerate().skip(np) {
                sum += (qe * half::f16::from_bits(*k.add(e)).to_f32()) as f64;
            }
            let (ms, vs) = state.step(scale.cap(sum as f32 * scale.mul));
            let v = values.as_ptr().add(t * hd);
            let (msv, vsv) = (V16::splat(ms), V16::splat(vs));
            for d in (0..hd).step_by(16) {
                let mut x = V16::load(acc.as_ptr().add(d));
                if ms != 1.0 {
                    x = x.mul(msv).round_f16();
                }
                V16::load_f16(v.add(d)).fma(vsv, x).round_f16().store(acc.as_mut_ptr().add(d));
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    use super::{Online, Scale};
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
    pub(super) unsafe fn attend_f16(q: &[f32], keys: &[u16], values: &[u16], n: usize, scale: Scale, state: &mut Online, acc: &mut [f32]) {
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
            let s = scale.cap(sum as f32 * scale.mul);

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
    fn run(isa: Isa, heads: usize, q: &[f32], k: &[f16], v: &[f16], n: usize, splits: &[usize]) -> Vec<f32> {
        let hd = q.len() / heads;
        let mut qr = vec![0f32; q.len()];
        prepare_query::<f16>(q, &mut qr);
        let mut acc = vec![0f32; q.len()];
        let mut st = vec![Online::default(); heads];
        let mut at = 0;
        for &end in splits.iter().chain([&n]) {
            let (kb, vb) = (&k[at * hd..end * hd], &v[at * hd..end * hd]);
            if heads == 1 {
                attend(isa, &qr, kb, vb, end - at, 0.125, &mut st[0], &mut acc);
            } else {
                attend_heads(isa, &qr, kb, vb, end - at, 0.125, &mut st, &mut acc);
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
        for (hd, n) in [(64, 37), (128, 5), (80, 20), (16, 3)] {
            let (q, k, v) = data(n, hd, 1, (hd * n) as u32, false, 1.0);
            let want = run(Isa::Scalar, 1, &q, &k, &v, n, &[n / 2]);
            assert_eq!(run(Isa::Scalar, 1, &q, &k, &v, n, &[1]), want);
            for isa in simd_paths() {
                assert_eq!(run(isa, 1, &q, &k, &v, n, &[n / 3]), want, "{isa} hd {hd}");
            }
        }
    }

    /// Every head count, head size, length and blocking, on data that rescales rarely or
    /// at almost every position, with small and near-overflowing values: each head of
    /// [`attend_heads`] equals the scalar [`attend`] of that head alone, bit for bit.
    #[test]
    fn heads_and_chunks_equal_the_scalar_definition() {
        let mut seed = 1;
        for hd in [64, 128, 16, 48, 80, 96] {
            for heads in [1, 2, 3, 4, 7] {
                for n in (1..=40).chain([63, 100]) {
                    if hd != 64 && n % 7 != 0 && n > 3 {
                        continue;
                    }
                    for (rising, big) in [(false, 1.0), (true, 1.0), (true, 3000.0), (false, 60000.0)] {
                        seed += 1;
                        let (q, k, v) = data(n, hd, heads, seed, rising, big);
                        let want: Vec<f32> = (0..heads).flat_map(|h| run(Isa::Scalar, 1, &q[h * hd..(h + 1) * hd], &k, &v, n, &[])).collect();
                        let blocks: Vec<usize> = (16..n).step_by(16).collect();
                        let uneven = [n / 3, n / 3 + 1, n - n / 4];
                        for isa in simd_paths() {
                            for splits in [&[][..], &blocks, &uneven] {
                                let got = run(isa, heads, &q, &k, &v, n, splits);
                                assert_eq!(bits(&got), bits(&want), "{isa} hd {hd} heads {heads} n {n} splits {splits:?} rising {rising} big {big}");
                            }
                        }
                    }
                }
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
                let s = dot_lanes16(64, |d| qr[d], |d| k[t * 64 + d].to_f32(), true) * 0.125;
                st.step(s).0 != 1.0
            })
            .count();
        assert!(rises > 30, "{rises}");
    }

    #[test]
    fn attention_is_a_convex_combination_of_values() {
        let (q, k, v) = data(50, 64, 1, 9, false, 1.0);
        let out = run(Isa::Scalar, 1, &q, &k, &v, 50, &[10]);
        for d in 0..64 {
            let col: Vec<f32> = (0..50).map(|t| v[t * 64 + d].to_f32()).collect();
            let (lo, hi) = col.iter().fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            assert!(out[d] >= lo - 1e-2 && out[d] <= hi + 1e-2, "dim {d}: {} not in [{lo}, {hi}]", out[d]);
        }
    }
}
