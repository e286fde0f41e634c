//! Element-wise operations of the forward pass (RMS norm, SwiGLU, rotary embedding and
//! activation quantization), each with fixed numerics and a fast path per ISA.
//!
//! The bodies are written once as scalar code that uses `mul_add` exactly where ggml's
//! compiled code fuses; x86 wrappers compile the same bodies with FMA enabled (so `mul_add`
//! is one instruction instead of a libm call) or use explicit AVX2, and give identical bits.
//! On AArch64 `mul_add` is always one instruction, so NEON runs the bodies as they are,
//! with an explicit NEON activation quantizer.

use blink_gguf::GgmlType;

use crate::cpu::Isa;
use crate::flavour::Flavour;
use crate::math;
use crate::quant;

/// `out[r] = x[r] / rms(x[r]) · weight` for `N` rows of one length, each sum of squares
/// accumulated in f64 in element order as ggml does. That sum is one chain of dependent
/// adds per row; the rows' chains interleave, so `N` rows take about as long as one.
#[inline(always)]
fn rms_norm_body<const N: usize>(x: [&[f32]; N], weight: &[f32], eps: f32, out: [&mut [f32]; N]) {
    let len = x.first().map_or(0, |r| r.len());
    assert!(x.iter().all(|r| r.len() == len) && out.iter().all(|r| r.len() == len) && weight.len() >= len);
    let mut sums = [0f64; N];
    for i in 0..len {
        for (sum, row) in sums.iter_mut().zip(&x) {
            *sum += (row[i] * row[i]) as f64;
        }
    }
    for ((sum, row), out) in sums.iter().zip(x).zip(out) {
        let mean = (sum / len as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &w) in out.iter_mut().zip(row).zip(weight) {
            *o = (v * scale) * w;
        }
    }
}

/// `gate = silu(gate) · up`: `flavour`'s vectorised `exp` for whole groups of its lanes
/// (16 for the AVX-512 build, 8 for AVX2), libm's for the remainder, as llama.cpp's x86
/// builds compute it.
#[inline(always)]
fn swiglu_body(flavour: Flavour, gate: &mut [f32], up: &[f32]) {
    let whole = gate.len() - gate.len() % math::exp_lanes(flavour);
    for (g, &u) in gate[..whole].iter_mut().zip(up) {
        *g = math::silu(flavour, *g) * u;
    }
    for (g, &u) in gate[whole..].iter_mut().zip(&up[whole..]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Rotate pairs `(a_i, b_i)` of `x` by the angles in `table` (cos, sin interleaved), with
/// the fused forms ggml's compiled rope uses. `neox` pairs `i` with `i + n/2`, otherwise
/// `2i` with `2i + 1`; `n = table.len()` leading dimensions rotate.
#[inline(always)]
fn rope_body(table: &[f32], x: &mut [f32], neox: bool) {
    let half = table.len() / 2;
    for i in 0..half {
        let (c, s) = (table[2 * i], table[2 * i + 1]);
        let (a, b) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0.mul_add(c, -(x1 * s));
        x[b] = x0.mul_add(s, x1 * c);
    }
}

#[cfg(target_arch = "x86_64")]
mod fma {
    use crate::flavour::Flavour;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rms_norm<const N: usize>(x: [&[f32]; N], weight: &[f32], eps: f32, out: [&mut [f32]; N]) {
        super::rms_norm_body(x, weight, eps, out)
    }
    /// [`super::swiglu_body`], eight lanes at a time over the whole groups.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn swiglu(flavour: Flavour, gate: &mut [f32], up: &[f32]) {
        use std::arch::x86_64::*;
        let whole = gate.len() - gate.len() % crate::math::exp_lanes(flavour);
        assert!(up.len() >= gate.len());
        for i in (0..whole).step_by(8) {
            let (g, u) = (gate.as_mut_ptr().add(i), up.as_ptr().add(i));
            let s = match flavour {
                Flavour::Avx512 => crate::math::x86::silu8::<false>(_mm256_loadu_ps(g)),
                Flavour::Avx2 => crate::math::x86::silu8::<true>(_mm256_loadu_ps(g)),
            };
            _mm256_storeu_ps(g, _mm256_mul_ps(s, _mm256_loadu_ps(u)));
        }
        super::swiglu_body(flavour, &mut gate[whole..], &up[whole..])
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rope(table: &[f32], x: &mut [f32], neox: bool) {
        super::rope_body(table, x, neox)
    }
}

/// Whether `isa` runs the x86 FMA-compiled bodies.
#[cfg(target_arch = "x86_64")]
#[inline]
fn x86_fma(isa: Isa) -> bool {
    isa.is_x86()
}

/// RMS norm of `x` into `out`, scaled by `weight`.
pub fn rms_norm(isa: Isa, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm_rows(isa, [x], weight, eps, [out])
}

/// [`rms_norm`] of `N` rows at once (each row's result is exactly `rms_norm`'s): their
/// sums of squares run side by side.
pub fn rms_norm_rows<const N: usize>(isa: Isa, x: [&[f32]; N], weight: &[f32], eps: f32, out: [&mut [f32]; N]) {
    #[cfg(target_arch = "x86_64")]
    if x86_fma(isa) {
        // SAFETY: the CPU supports the path's features (checked when it was chosen).
        return unsafe { fma::rms_norm(x, weight, eps, out) };
    }
    let _ = isa;
    rms_norm_body(x, weight, eps, out)
}

/// RMS norm in place (per-head Q/K norms).
pub fn rms_norm_in_place(isa: Isa, x: &mut [f32], weight: &[f32], eps: f32) {
    let n = x.len();
    rms_norm_cols_in_place(isa, x, weight, eps, 0..n)
}

/// The RMS norm of all of `x`, applied in place to its columns `cols` only (weights
/// `weight[cols]`): a part's own columns of a row normed whole (OLMo 2's Q/K norms).
pub fn rms_norm_cols_in_place(isa: Isa, x: &mut [f32], weight: &[f32], eps: f32, cols: std::ops::Range<usize>) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    let _ = isa;
    for (v, &w) in x[cols.clone()].iter_mut().zip(&weight[cols]) {
        *v = (*v * scale) * w;
    }
}

/// SwiGLU in place: `gate = silu(gate) · up`, as `flavour`'s build of llama.cpp.
pub fn swiglu(isa: Isa, flavour: Flavour, gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if x86_fma(isa) {
        // SAFETY: as above.
        return unsafe { fma::swiglu(flavour, gate, up) };
    }
    let _ = isa;
    swiglu_body(flavour, gate, up)
}

/// `x[i] = e^(x[i] - max)`, returning their sum in f64, as `flavour`'s
/// `ggml_vec_soft_max_f32`: whole groups of the vectorised `exp`'s lanes (16 or 8), each
/// group summed as that build's horizontal add (`_mm512_reduce_add_ps`, or
/// `hsum_float_8`'s order) before it joins the sum, the rest through libm one by one.
pub fn soft_max_exp(flavour: Flavour, x: &mut [f32], max: f32) -> f64 {
    use crate::quant::reduce::{hsum16, hsum8};
    let lanes = math::exp_lanes(flavour);
    let whole = x.len() - x.len() % lanes;
    let mut sum = 0f64;
    for group in x[..whole].chunks_exact_mut(lanes) {
        group.iter_mut().for_each(|v| *v = math::expf(flavour, *v - max));
        sum += match flavour {
            Flavour::Avx512 => hsum16((&*group).try_into().expect("16 lanes")),
            Flavour::Avx2 => hsum8((&*group).try_into().expect("8 lanes")),
        } as f64;
    }
    for v in &mut x[whole..] {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    sum
}

/// Rotary embedding of one head in place (see `rope_body`).
pub fn rope(isa: Isa, table: &[f32], x: &mut [f32], neox: bool) {
    #[cfg(target_arch = "x86_64")]
    if x86_fma(isa) {
        // SAFETY: as above.
        return unsafe { fma::rope(table, x, neox) };
    }
    let _ = isa;
    rope_body(table, x, neox)
}

/// Quantize an activation row into `ty` (as `quant::quantize_row`), vectorised for the
/// 8-bit formats where the path has it.
pub fn quantize_row(isa: Isa, ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if x86_fma(isa) && matches!(ty, GgmlType::Q8_0 | GgmlType::Q8_1) && src.len().is_multiple_of(32) {
        assert!(dst.len() >= ty.row_bytes(src.len() as u64).unwrap_or(u64::MAX) as usize, "quantize_row: output too short");
        // SAFETY: as above; `dst` holds the whole row (checked).
        return unsafe { x86_q8::quantize(src, dst, ty == GgmlType::Q8_1) };
    }
    #[cfg(target_arch = "aarch64")]
    if isa.is_arm() && matches!(ty, GgmlType::Q8_0 | GgmlType::Q8_1) && src.len().is_multiple_of(32) {
        assert!(dst.len() >= ty.row_bytes(src.len() as u64).unwrap_or(u64::MAX) as usize, "quantize_row: output too short");
        // SAFETY: NEON is part of every AArch64 CPU; `dst` holds the whole row (checked).
        return unsafe { arm_q8::quantize(src, dst, ty == GgmlType::Q8_1) };
    }
    let _ = isa;
    quant::quantize_row(ty, src, dst)
}

#[cfg(target_arch = "aarch64")]
mod arm_q8 {
    use std::arch::aarch64::*;

    /// `Q8_0` (34-byte) or `Q8_1` (36-byte) blocks exactly as `quant::quantize_row`:
    /// multiplier `127/amax`, round half to even, saturating to i8, `s = d·Σq`.
    #[target_feature(enable = "neon")]
    pub unsafe fn quantize(src: &[f32], dst: &mut [u8], with_sum: bool) {
        let block_bytes = if with_sum { 36 } else { 34 };
        let qs_at = if with_sum { 4 } else { 2 };
        for (b, x) in src.chunks_exact(32).enumerate() {
            let v: [float32x4_t; 8] = std::array::from_fn(|i| vld1q_f32(x.as_ptr().add(4 * i)));
            // maxNum skips NaNs, as `f32::max` does.
            let amax = vmaxnmvq_f32(v.iter().fold(vdupq_n_f32(0.0), |m, &x| vmaxnmq_f32(m, vabsq_f32(x))));
            let d = amax / 127.0;
            let id = vdupq_n_f32(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            // Round half to even, then saturating narrows (i32 → i16 → i8).
            let q32: [int32x4_t; 8] = std::array::from_fn(|i| vcvtnq_s32_f32(vmulq_f32(v[i], id)));
            let q16: [int16x8_t; 4] = std::array::from_fn(|i| vcombine_s16(vqmovn_s32(q32[2 * i]), vqmovn_s32(q32[2 * i + 1])));
            let q8 = [vcombine_s8(vqmovn_s16(q16[0]), vqmovn_s16(q16[1])), vcombine_s8(vqmovn_s16(q16[2]), vqmovn_s16(q16[3]))];
            let out = dst.as_mut_ptr().add(b * block_bytes);
            let half = |f: f32| half::f16::from_f32(f).to_bits().to_le_bytes();
            std::ptr::copy_nonoverlapping(half(d).as_ptr(), out, 2);
            if with_sum {
                let sum = vaddlvq_s8(q8[0]) as i32 + vaddlvq_s8(q8[1]) as i32;
                std::ptr::copy_nonoverlapping(half(d * sum as f32).as_ptr(), out.add(2), 2);
            }
            vst1q_s8(out.add(qs_at) as *mut i8, q8[0]);
            vst1q_s8(out.add(qs_at + 16) as *mut i8, q8[1]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_q8 {
    use std::arch::x86_64::*;

    /// `Q8_0` (34-byte) or `Q8_1` (36-byte) blocks exactly as `quant::quantize_row`:
    /// multiplier `127/amax`, round half to even, saturating to i8, `s = d·Σq`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize(src: &[f32], dst: &mut [u8], with_sum: bool) {
        let block_bytes = if with_sum { 36 } else { 34 };
        let qs_at = if with_sum { 4 } else { 2 };
        let sign = _mm256_set1_ps(-0.0);
        for (b, x) in src.chunks_exact(32).enumerate() {
            let p = x.as_ptr();
            let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
            let m = v.iter().fold(_mm256_setzero_ps(), |m, &x| _mm256_max_ps(m, _mm256_andnot_ps(sign, x)));
            let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let q: [__m256i; 4] = std::array::from_fn(|i| {
                _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v[i], id)))
            });
            let out = dst.as_mut_ptr().add(b * block_bytes);
            let half = |f: f32| _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(f))) as u16;
            (out as *mut u16).write_unaligned(half(d));
            if with_sum {
                let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
                let s4 = _mm_add_epi32(_mm256_extracti128_si256::<1>(s), _mm256_castsi256_si128(s));
                let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
                let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)));
                (out.add(2) as *mut u16).write_unaligned(half(d * sum as f32));
            }
            // Saturating packs (i32 → i16 → i8) then undo their lane interleaving.
            let w01 = _mm256_packs_epi32(q[0], q[1]);
            let w23 = _mm256_packs_epi32(q[2], q[3]);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(out.add(qs_at) as *mut __m256i, bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                // Include exact ties and zero blocks.
                if i % 97 == 0 { 0.5 } else if (i / 32) % 7 == 3 { 0.0 } else { (s % 20001) as f32 / 997.0 - 10.0 }
            })
            .collect()
    }

    #[test]
    fn swiglu_fast_paths_equal_the_scalar_body_at_the_extremes() {
        let specials = [0.0, -0.0, 1e-30, -1e-30, 87.0, -87.0, 88.8, -88.8, 100.0, -100.0, 126.5, -131.0, 150.0, -170.0, 200.0, -200.0, 1e6, -1e6, f32::MAX, f32::MIN, f32::INFINITY, f32::NEG_INFINITY];
        // Every special in every lane position, beside ordinary values.
        let mut x: Vec<f32> = (0..32 * specials.len()).map(|i| (i % 13) as f32 * 0.7 - 4.0).collect();
        let len = x.len();
        for (k, &v) in specials.iter().enumerate() {
            x[k * 33 % len] = v;
            x[(k * 7 + 5) % len] = -v;
        }
        let up: Vec<f32> = (0..x.len()).map(|i| 1.0 + (i % 5) as f32 * 0.25).collect();
        for isa in Isa::simd_supported() {
            for f in Flavour::ALL {
                let (mut a, mut b) = (x.clone(), x.clone());
                swiglu(Isa::Scalar, f, &mut a, &up);
                swiglu(isa, f, &mut b, &up);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "swiglu {isa} {f}");
            }
        }
    }

    #[test]
    fn fast_paths_equal_the_scalar_bodies() {
        for isa in Isa::simd_supported() {
            for n in [64usize, 576, 1536, 100, 72] {
                let x = row(n, n as u32);
                let w = row(n, 7);
                let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                rms_norm(Isa::Scalar, &x, &w, 1e-5, &mut a);
                rms_norm(isa, &x, &w, 1e-5, &mut b);
                assert_eq!(a, b, "rms_norm {isa} {n}");

                for f in Flavour::ALL {
                    let (mut g1, mut g2) = (x.clone(), x.clone());
                    swiglu(Isa::Scalar, f, &mut g1, &w);
                    swiglu(isa, f, &mut g2, &w);
                    assert_eq!(g1, g2, "swiglu {isa} {f} {n}");
                }

                let table: Vec<f32> = (0..64).map(|i| ((i as f32) * 0.37).sin()).collect();
                for neox in [false, true] {
                    let (mut r1, mut r2) = (x[..64].to_vec(), x[..64].to_vec());
                    rope(Isa::Scalar, &table, &mut r1, neox);
                    rope(isa, &table, &mut r2, neox);
                    assert_eq!(r1, r2, "rope {isa}");
                }

                if n % 32 == 0 {
                    for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
                        let bytes = ty.row_bytes(n as u64).unwrap() as usize;
                        let (mut q1, mut q2) = (vec![0u8; bytes], vec![0u8; bytes]);
                        quantize_row(Isa::Scalar, ty, &x, &mut q1);
                        quantize_row(isa, ty, &x, &mut q2);
                        assert_eq!(q1, q2, "quantize {ty} {isa} {n}");
                    }
                }
            }
        }
    }

    /// Rows normed together equal rows normed alone, which equal ggml's definition: the
    /// f64 sum of the f32 squares in element order.
    #[test]
    fn rows_normed_together_equal_rows_alone() {
        let n = 576;
        let rows: Vec<Vec<f32>> = (0..4).map(|r| row(n, 11 + r)).collect();
        let w = row(n, 7);
        for isa in std::iter::once(Isa::Scalar).chain(Isa::simd_supported()) {
            let mut together = vec![vec![0f32; n]; 4];
            let [o0, o1, o2, o3] = &mut together[..] else { unreachable!() };
            rms_norm_rows(isa, [&rows[0][..], &rows[1], &rows[2], &rows[3]], &w, 1e-5, [&mut o0[..], o1, o2, o3]);
            for (x, got) in rows.iter().zip(&together) {
                let mut alone = vec![0f32; n];
                rms_norm(isa, x, &w, 1e-5, &mut alone);
                let mut sum = 0f64;
                x.iter().for_each(|&v| sum += (v * v) as f64);
                let scale = 1.0 / ((sum / n as f64) as f32 + 1e-5).sqrt();
                let want: Vec<f32> = x.iter().zip(&w).map(|(&v, &w)| (v * scale) * w).collect();
                assert_eq!(got, &alone, "{isa}");
                assert_eq!(got, &want, "{isa}");
            }
        }
    }

    #[test]
    fn fast_quantizers_round_exact_ties_to_even() {
        // Each block's extreme is 127, so the multiplier is exactly 1 and the half-integer
        // values are real ties (`row` above rarely produces any).
        let x: Vec<f32> = (0..256).map(|i| if i % 32 == 5 { 127.0 } else { (i % 32) as f32 - 15.5 }).collect();
        for isa in Isa::simd_supported() {
            for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
                let bytes = ty.row_bytes(x.len() as u64).unwrap() as usize;
                let (mut q1, mut q2) = (vec![0u8; bytes], vec![0u8; bytes]);
                quantize_row(Isa::Scalar, ty, &x, &mut q1);
                quantize_row(isa, ty, &x, &mut q2);
                assert_eq!(q1, q2, "quantize {ty} {isa}");
            }
        }
    }
}
