//! The x86 kernels (AVX2 + FMA + F16C, and the same with AVX-512VL's registers): f16 keys
//! and values in ggml's order, the scores in either flavour's (`L16`: the AVX-512 build's
//! 16-lane steps; otherwise the AVX2 build's 8-lane steps).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::ptr::{addr_of, addr_of_mut};

use super::{Online, Scale, CHUNK};
use crate::flavour::Flavour;
use crate::x86::transpose8;

/// f16 keys and values, heads of `hd` elements (a multiple of 16): the chunked kernel
/// for 64 and 128, the per-position one otherwise; the scores in `flavour`'s order.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_f16(avx512: bool, flavour: Flavour, qs: &[f32], keys: &[u16], values: &[u16], n: usize, scale: Scale, states: &mut [Online], accs: &mut [f32]) {
    let hd = qs.len() / states.len();
    let (q, k, v, a) = (qs.as_ptr(), keys.as_ptr(), values.as_ptr(), accs.as_mut_ptr());
    let l16 = flavour == Flavour::Avx512;
    match (avx512, l16, hd) {
        (true, true, 64) => chunked_avx512::<4, true>(q, k, v, n, scale, states, a),
        (true, true, 128) => chunked_avx512::<8, true>(q, k, v, n, scale, states, a),
        (true, false, 64) => chunked_avx512::<4, false>(q, k, v, n, scale, states, a),
        (true, false, 128) => chunked_avx512::<8, false>(q, k, v, n, scale, states, a),
        (false, true, 64) => chunked_avx2::<4, true>(q, k, v, n, scale, states, a),
        (false, true, 128) => chunked_avx2::<8, true>(q, k, v, n, scale, states, a),
        (false, false, 64) => chunked_avx2::<4, false>(q, k, v, n, scale, states, a),
        (false, false, 128) => chunked_avx2::<8, false>(q, k, v, n, scale, states, a),
        _ => {
            for (h, state) in states.iter_mut().enumerate() {
                let acc = &mut accs[h * hd..(h + 1) * hd];
                let q = &qs[h * hd..(h + 1) * hd];
                if l16 {
                    per_position::<true>(q, keys, values, n, scale, state, acc);
                } else {
                    per_position::<false>(q, keys, values, n, scale, state, acc);
                }
            }
        }
    }
}

/// AVX2's sixteen registers: value updates of six heads 16 elements at a time, or of
/// fewer heads more elements ([`update_values`]); the queries are read from memory.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunked_avx2<const W: usize, const L16: bool>(q: *const f32, k: *const u16, v: *const u16, n: usize, scale: Scale, states: &mut [Online], acc: *mut f32) {
    chunked::<W, false, L16>(q, k, v, n, scale, states, acc)
}

/// The same instructions with AVX-512VL's 32 registers: value updates of up to six heads
/// 32 elements at a time, and three heads' queries held in registers while they score.
/// (On Zen 4, which splits 512-bit operations in two, 512-bit vectors measured slower.)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn chunked_avx512<const W: usize, const L16: bool>(q: *const f32, k: *const u16, v: *const u16, n: usize, scale: Scale, states: &mut [Online], acc: *mut f32) {
    chunked::<W, true, L16>(q, k, v, n, scale, states, acc)
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
        V16(value8(p), value8(p.add(8)))
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

/// Heads a chunk keeps scores and softmax factors for (two vectors of lanes); more heads
/// go in turns.
const MAX_HEADS: usize = 16;

/// A chunk's working rows (on the stack of one call; each element is written before it is
/// read, so none is initialised, and they are reached through raw pointers).
struct Chunk {
    /// Scaled scores, a row of positions per head.
    scores: [[f32; CHUNK]; MAX_HEADS],
    /// Rescale factors and value weights, a row of heads per position.
    ms: [[f32; MAX_HEADS]; CHUNK],
    vs: [[f32; MAX_HEADS]; CHUNK],
    /// Per position, a bit for each head whose maximum it raised.
    rose: [u32; CHUNK],
}

/// The heads over `n` positions, `CHUNK` at a time, up to [`MAX_HEADS`] heads together so
/// that they share each key and value row's load and widening. Heads are `16·W` elements,
/// W a multiple of 4 (whole 64-element dot-product steps); `WIDE`: 32 vector registers;
/// `L16`: the AVX-512 build's scores, else the AVX2 build's.
#[inline(always)]
unsafe fn chunked<const W: usize, const WIDE: bool, const L16: bool>(qs: *const f32, keys: *const u16, values: *const u16, n: usize, scale: Scale, states: &mut [Online], accs: *mut f32) {
    let hd = 16 * W;
    let mut chunk = MaybeUninit::<Chunk>::uninit();
    let chunk = chunk.as_mut_ptr();
    for (turn, states) in states.chunks_mut(MAX_HEADS).enumerate() {
        let (q, acc) = (qs.add(turn * MAX_HEADS * hd), accs.add(turn * MAX_HEADS * hd));
        for c in (0..n).step_by(CHUNK) {
            let m = (n - c).min(CHUNK);
            let (k, v) = (keys.add(c * hd), values.add(c * hd));
            if WIDE {
                scores::<W, 3, L16>(q, k, m, scale.mul, states.len(), chunk);
            } else {
                scores::<W, 0, L16>(q, k, m, scale.mul, states.len(), chunk);
            }
            if let Some(cap) = scale.cap {
                let scores = addr_of_mut!((*chunk).scores) as *mut f32;
                for p in 0..states.len() {
                    for t in 0..m {
                        let x = scores.add(p * CHUNK + t);
                        *x = cap * (*x).tanh();
                    }
                }
            }
            match states.len() {
                1 => softmax_steps_few::<1>(states, m, chunk),
                2 => softmax_steps_few::<2>(states, m, chunk),
                3 => softmax_steps_few::<3>(states, m, chunk),
                _ => softmax_steps(states, m, chunk),
            }
            update_values::<W, WIDE>(v, m, states.len(), chunk, acc);
        }
    }
}

/// Every head's value updates for `m` positions: heads in groups of at most six, each
/// group's accumulators `S` vectors at a time. A vector's update (an FMA, then the f16
/// round trip ggml's f16 accumulator defines) waits on the one before, 14 cycles on Zen
/// 4, and the round trip takes ~1.75 cycles of throughput: a dozen independent updates
/// keep it busy, fewer leave it waiting.
#[inline(always)]
unsafe fn update_values<const W: usize, const WIDE: bool>(values: *const u16, m: usize, heads: usize, chunk: *const Chunk, accs: *mut f32) {
    let mut p = 0;
    while p < heads {
        // Groups as even as they can be: 7 heads as 4 and 3, not 6 and 1.
        let g = (heads - p).div_ceil((heads - p).div_ceil(6));
        match (WIDE, g) {
            (false, 6) => update::<W, 6, 2>(values, m, p, chunk, accs),
            (false, 5) => update::<W, 5, 2>(values, m, p, chunk, accs),
            (false, 4) => update::<W, 4, 2>(values, m, p, chunk, accs),
            (false, 3) => update::<W, 3, 4>(values, m, p, chunk, accs),
            (false, 2) => update::<W, 2, 4>(values, m, p, chunk, accs),
            (true, 6) => update::<W, 6, 4>(values, m, p, chunk, accs),
            (true, 5) => update::<W, 5, 4>(values, m, p, chunk, accs),
            (true, 4) => update::<W, 4, 4>(values, m, p, chunk, accs),
            (true, 3) => update::<W, 3, 4>(values, m, p, chunk, accs),
            (true, 2) => update::<W, 2, 8>(values, m, p, chunk, accs),
            _ => update::<W, 1, 8>(values, m, p, chunk, accs),
        }
        p += g;
    }
}

/// Eight f16 values at `p`, widened. (A function, not a closure: a closure does not take
/// on the target features, so its intrinsics could be calls.)
#[inline(always)]
unsafe fn value8(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// Heads `p0..p0 + G` over `m` positions, their accumulators `S` vectors (8·S elements) at
/// a time held in registers across the positions: rescaled where a position raised the
/// maximum, then `v·vs + acc`, each rounded to f16. The value vectors stay in registers
/// across the heads, or the heads' weights across the value vectors, whichever takes
/// fewer registers.
#[inline(always)]
unsafe fn update<const W: usize, const G: usize, const S: usize>(values: *const u16, m: usize, p0: usize, chunk: *const Chunk, accs: *mut f32) {
    let hd = 16 * W;
    let group = ((1u32 << G) - 1) << p0;
    let (ms, vs, rose) = (addr_of!((*chunk).ms) as *const f32, addr_of!((*chunk).vs) as *const f32, addr_of!((*chunk).rose) as *const u32);
    for s0 in (0..hd / 8).step_by(S) {
        let at = |g: usize, i: usize| accs.add((p0 + g) * hd + 8 * (s0 + i));
        let mut acc = [[_mm256_setzero_ps(); S]; G];
        for (g, a) in acc.iter_mut().enumerate() {
            for (i, a) in a.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(at(g, i));
            }
        }
        for t in 0..m {
            // This position's factors of the group's heads.
            let (ms, vs) = (ms.add(t * MAX_HEADS + p0), vs.add(t * MAX_HEADS + p0));
            if *rose.add(t) & group != 0 {
                for (g, a) in acc.iter_mut().enumerate() {
                    let rescale = *ms.add(g);
                    if rescale != 1.0 {
                        let f = _mm256_set1_ps(rescale);
                        // (Loops, not closures: a closure does not take on the target
                        // features, so its intrinsics would be calls.)
                        for a in a.iter_mut() {
                            *a = round8(_mm256_mul_ps(*a, f));
                        }
                    }
                }
            }
            if S <= G {
                let mut v = [_mm256_setzero_ps(); S];
                for (i, v) in v.iter_mut().enumerate() {
                    *v = value8(values.add(t * hd + 8 * (s0 + i)));
                }
                for (g, a) in acc.iter_mut().enumerate() {
                    let f = _mm256_set1_ps(*vs.add(g));
                    for (a, v) in a.iter_mut().zip(v) {
                        *a = round8(_mm256_fmadd_ps(v, f, *a));
                    }
                }
            } else {
                let mut f = [_mm256_setzero_ps(); G];
                for (g, f) in f.iter_mut().enumerate() {
                    *f = _mm256_set1_ps(*vs.add(g));
                }
                for i in 0..S {
                    let v = value8(values.add(t * hd + 8 * (s0 + i)));
                    for (a, f) in acc.iter_mut().zip(f) {
                        a[i] = round8(_mm256_fmadd_ps(v, f, a[i]));
                    }
                }
            }
        }
        for (g, a) in acc.iter().enumerate() {
            for (i, a) in a.iter().enumerate() {
                _mm256_storeu_ps(at(g, i), *a);
            }
        }
    }
}

/// [`Online::step`] for `states.len()` heads over a chunk's positions `0..m`, eight heads
/// a vector: each position's rescale factors and value weights. The running maxima go
/// position by position (a compare, a blend and a max per eight heads, no branch); each
/// head's row of `exp` arguments is taken eight positions at a time (glibc's `expf`, as
/// llama.cpp's attention has it).
#[inline(always)]
unsafe fn softmax_steps(states: &mut [Online], m: usize, chunk: *mut Chunk) {
    let heads = states.len();
    let (scores, ms, vs) = (addr_of!((*chunk).scores) as *const f32, addr_of_mut!((*chunk).ms) as *mut f32, addr_of_mut!((*chunk).vs) as *mut f32);
    let rose_bits = addr_of_mut!((*chunk).rose) as *mut u32;
    for t in 0..m {
        *rose_bits.add(t) = 0;
    }
    let one = _mm256_set1_ps(1.0);
    for g in (0..heads).step_by(8) {
        let lanes = (heads - g).min(8);
        let (mut max, mut sum) = ([0f32; 8], [0f32; 8]);
        for (i, state) in states[g..g + lanes].iter().enumerate() {
            (max[i], sum[i]) = (state.max, state.sum);
        }
        let (mut max, mut sum) = (_mm256_loadu_ps(max.as_ptr()), _mm256_loadu_ps(sum.as_ptr()));
        // The group's scores by position (lanes past the heads are zeros).
        let mut at = [_mm256_setzero_ps(); CHUNK];
        for c in (0..m).step_by(8) {
            let mut rows = [_mm256_setzero_ps(); 8];
            for (i, row) in rows[..lanes].iter_mut().enumerate() {
                *row = _mm256_loadu_ps(scores.add((g + i) * CHUNK + c));
            }
            at[c..c + 8].copy_from_slice(&transpose8(rows));
        }
        // Each position's `exp` argument (in place) and whether it raised the maximum.
        let mut rose = [_mm256_setzero_ps(); CHUNK];
        for (t, (x, rose)) in at[..m].iter_mut().zip(&mut rose).enumerate() {
            *rose = _mm256_cmp_ps::<_CMP_GT_OQ>(*x, max);
            *rose_bits.add(t) |= (_mm256_movemask_ps(*rose) as u32) << g;
            let arg = _mm256_blendv_ps(_mm256_sub_ps(*x, max), _mm256_sub_ps(max, *x), *rose);
            // `x > max ? x : max`, as the scalar step takes it (NaNs included).
            max = _mm256_max_ps(*x, max);
            *x = arg;
        }
        // e^arg, a head's row at a time, back by position.
        for c in (0..m).step_by(8) {
            let mut rows = transpose8(at[c..c + 8].try_into().unwrap());
            for row in rows[..lanes].iter_mut() {
                *row = crate::libm_expf::expf8(*row);
            }
            at[c..c + 8].copy_from_slice(&transpose8(rows));
        }
        for t in 0..m {
            let (e, rose) = (at[t], rose[t]);
            let (msv, vsv) = (_mm256_blendv_ps(one, e, rose), _mm256_blendv_ps(e, one, rose));
            sum = _mm256_fmadd_ps(sum, msv, vsv);
            _mm256_storeu_ps(ms.add(t * MAX_HEADS + g), msv);
            _mm256_storeu_ps(vs.add(t * MAX_HEADS + g), vsv);
        }
        let (mut maxes, mut sums) = ([0f32; 8], [0f32; 8]);
        _mm256_storeu_ps(maxes.as_mut_ptr(), max);
        _mm256_storeu_ps(sums.as_mut_ptr(), sum);
        for (i, state) in states[g..g + lanes].iter_mut().enumerate() {
            (state.max, state.sum) = (maxes[i], sums[i]);
        }
    }
}

/// [`softmax_steps`] for `P` heads, up to three (for so few, the transposes cost more than
/// the vector steps save): the maxima one head after another in scalars, each head's `exp`
/// arguments eight at a time.
#[inline(always)]
unsafe fn softmax_steps_few<const P: usize>(states: &mut [Online], m: usize, chunk: *mut Chunk) {
    let (scores, ms, vs) = (addr_of!((*chunk).scores) as *const f32, addr_of_mut!((*chunk).ms) as *mut f32, addr_of_mut!((*chunk).vs) as *mut f32);
    let rose_bits = addr_of_mut!((*chunk).rose) as *mut u32;
    // The running maxima first, so that the `exp` calls do not wait for each other.
    let mut arg = [[0f32; CHUNK]; P];
    let mut rose = [[false; CHUNK]; P];
    for (p, state) in states.iter_mut().enumerate() {
        for t in 0..m {
            let x = *scores.add(p * CHUNK + t);
            rose[p][t] = x > state.max;
            if rose[p][t] {
                arg[p][t] = state.max - x;
                state.max = x;
            } else {
                arg[p][t] = x - state.max;
            }
        }
    }
    for t in 0..m {
        *rose_bits.add(t) = 0;
    }
    for p in 0..P {
        for c in (0..m).step_by(8) {
            let at = arg[p].as_mut_ptr().add(c);
            _mm256_storeu_ps(at, crate::libm_expf::expf8(_mm256_loadu_ps(at)));
        }
        for t in 0..m {
            let (e, rose) = (arg[p][t], rose[p][t]);
            *ms.add(t * MAX_HEADS + p) = if rose { e } else { 1.0 };
            *vs.add(t * MAX_HEADS + p) = if rose { 1.0 } else { e };
            *rose_bits.add(t) |= (rose as u32) << p;
        }
    }
    for t in 0..m {
        for (p, state) in states.iter_mut().enumerate() {
            state.sum = state.sum.mul_add(*ms.add(t * MAX_HEADS + p), *vs.add(t * MAX_HEADS + p));
        }
    }
}

/// The scaled scores of `heads` queries against `m` keys into the chunk, in ggml's order:
/// with `L16` (the AVX-512 build), four 16-lane FMA accumulators over 64-element steps,
/// folded (`a0+a2`, `a1+a3`, then their sum) and reduced as `_mm512_reduce_add_ps` does;
/// otherwise (the AVX2 build) four 8-lane accumulators over 32-element steps, which are
/// the halves of two 16-lane ones (unit `w` of 16 elements into `a[w % 2]`), folded the
/// same way and reduced with two `hadd`s. Eight positions at a time (up to a multiple of
/// 8: the positions past `m` are zeros). Each key row is widened once for every `Q`
/// heads, whose queries wait in registers (three heads of 64 elements fill AVX-512's 32
/// with the key row), or, with `Q == 0`, once for all the heads, whose queries are read
/// from memory (AVX2's 16 hold one key row and the sums).
#[inline(always)]
unsafe fn scores<const W: usize, const Q: usize, const L16: bool>(qs: *const f32, keys: *const u16, m: usize, scale: f32, heads: usize, chunk: *mut Chunk) {
    let hd = 16 * W;
    // Rows past `m` (up to a multiple of 8) are zeros; the rest is never read.
    let mut folded = [[MaybeUninit::<__m256>::uninit(); CHUNK]; MAX_HEADS];
    for row in folded[..heads].iter_mut() {
        row[m..m.next_multiple_of(8)].fill(MaybeUninit::new(_mm256_setzero_ps()));
    }
    // Heads in groups of `Q` whose queries stay in registers (AVX-512's), or all together
    // with the queries read from memory (`Q == 0`).
    let group = if Q == 0 { heads } else { Q };
    for p0 in (0..heads).step_by(group) {
        let n = group.min(heads - p0);
        let mut q = [[V16::zero(); W]; Q];
        for (p, q) in q.iter_mut().enumerate().take(n) {
            for (w, q) in q.iter_mut().enumerate() {
                *q = V16::load(qs.add((p0 + p) * hd + 16 * w));
            }
        }
        for t in 0..m {
            let mut k = [V16::zero(); W];
            for (w, k) in k.iter_mut().enumerate() {
                *k = V16::load_f16(keys.add(t * hd + 16 * w));
            }
            for (p, row) in folded[p0..p0 + n].iter_mut().enumerate() {
                let mut a = [V16::zero(); 4];
                for (w, k) in k.iter().enumerate() {
                    let qw = if Q == 0 { V16::load(qs.add((p0 + p) * hd + 16 * w)) } else { q[p][w] };
                    let i = if L16 { w % 4 } else { w % 2 };
                    a[i] = qw.fma(*k, a[i]);
                }
                row[t] = MaybeUninit::new(fold::<L16>(&a));
            }
        }
    }
    let sv = _mm256_set1_ps(scale);
    let scores = addr_of_mut!((*chunk).scores) as *mut f32;
    for (p, folded) in folded[..heads].iter().enumerate() {
        for c in (0..m).step_by(8) {
            // SAFETY: rows c..c + 8 were written above.
            let f = &*(folded[c..c + 8].as_ptr() as *const [__m256; 8]);
            let sums = if L16 { hsum8x8(f) } else { hsum8x8_hadd(f) };
            _mm256_storeu_ps(scores.add(p * CHUNK + c), _mm256_mul_ps(sums, sv));
        }
    }
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

/// [`hsum8x8`] in the order of ggml's AVX reduce (two `hadd`s):
/// `((l0+l4) + (l1+l5)) + ((l2+l6) + (l3+l7))`.
#[inline(always)]
unsafe fn hsum8x8_hadd(f: &[__m256; 8]) -> __m256 {
    let quarters = |a, b| _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b));
    let x = _mm256_hadd_ps(quarters(f[0], f[4]), quarters(f[1], f[5]));
    let y = _mm256_hadd_ps(quarters(f[2], f[6]), quarters(f[3], f[7]));
    _mm256_hadd_ps(x, y)
}

/// The four accumulators of a score folded to eight lanes: `(a0+a2) + (a1+a3)` then the
/// 16 lanes' halves (`L16`), or `a0 + a1` then the halves (the AVX2 build's four 8-lane
/// accumulators are the halves of `a0` and `a1`).
#[inline(always)]
unsafe fn fold<const L16: bool>(a: &[V16; 4]) -> __m256 {
    if L16 {
        a[0].add(a[2]).add(a[1].add(a[3])).fold8()
    } else {
        a[0].add(a[1]).fold8()
    }
}

/// Eight lanes summed as ggml's AVX reduce ends: 128-bit halves, then two `hadd`s.
#[inline(always)]
unsafe fn hsum8_hadd(v: __m256) -> f32 {
    let t = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let t = _mm_hadd_ps(t, t);
    _mm_cvtss_f32(_mm_hadd_ps(t, t))
}

/// The rest of `_mm512_reduce_add_ps` after its first step (the halves' sum `t3`):
/// 128-bit halves, then (t0+t2) + (t1+t3).
#[inline(always)]
unsafe fn hsum8_rest(t3: __m256) -> f32 {
    let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
    let t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
    _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)))
}

/// One head, one position at a time: any `hd` that is a multiple of 16 (the elements
/// past the last whole step, 64 elements with `L16` and 32 without, are added in f64, as
/// ggml does).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn per_position<const L16: bool>(q: &[f32], keys: &[u16], values: &[u16], n: usize, scale: Scale, state: &mut Online, acc: &mut [f32]) {
    let hd = q.len();
    let np = hd - hd % if L16 { 64 } else { 32 };
    for t in 0..n {
        let k = keys.as_ptr().add(t * hd);
        // Score: four 16-lane FMA accumulators over 64-element steps, or four 8-lane ones
        // (two 16-lane) over 32-element steps.
        let mut a = [V16::zero(); 4];
        for e in (0..np).step_by(16) {
            let i = if L16 { e / 16 % 4 } else { e / 16 % 2 };
            a[i] = V16::load(q.as_ptr().add(e)).fma(V16::load_f16(k.add(e)), a[i]);
        }
        let folded = fold::<L16>(&a);
        let mut sum = if L16 { hsum8_rest(folded) } else { hsum8_hadd(folded) } as f64;
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
