//! The x86 kernels (AVX2 + FMA + F16C, and the same with AVX-512VL's registers): f16 keys
//! and values in ggml's order.

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
