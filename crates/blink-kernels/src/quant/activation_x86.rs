//! `Q8_K` activation rows on AVX2: the same bits as ggml's `quantize_row_q8_K_ref`
//! ([`BlockQ8K::quantize_ref`], which llama.cpp's x86 build calls on every ISA), eight
//! values at a time. A block with a NaN or an infinity, or all zeros, goes to the
//! reference.

use std::arch::x86_64::*;

use super::blocks::{Block, BlockQ8K};
use super::rows::QuantBlock;
use blink_gguf::QK_K;

/// Quantize `src` (whole blocks of 256) into `Q8_K` blocks at `dst`, or `false` if this
/// CPU lacks AVX2.
pub(super) fn quantize_row_q8_k(src: &[f32], dst: &mut [u8]) -> bool {
    if !is_x86_feature_detected!("avx2") {
        return false;
    }
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BlockQ8K::BYTES)) {
        // SAFETY: AVX2 is present (checked above); `x` holds 256 values.
        let block = unsafe { quantize_block(x) }.unwrap_or_else(|| BlockQ8K::quantize_ref(x));
        block.write(out);
    }
    true
}

/// One block, or `None` for the reference to take (a non-finite value, or all zeros).
#[target_feature(enable = "avx2")]
unsafe fn quantize_block(x: &[f32]) -> Option<BlockQ8K> {
    let x = &x[..QK_K];
    let p = x.as_ptr();
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let (mut amax, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for i in 0..QK_K / 8 {
        let v = _mm256_loadu_ps(p.add(8 * i));
        amax = _mm256_max_ps(amax, _mm256_and_ps(v, abs));
        // NaN, or an infinity (∞ − ∞ is NaN).
        odd = _mm256_or_ps(odd, _mm256_cmp_ps::<_CMP_UNORD_Q>(_mm256_sub_ps(v, v), _mm256_setzero_ps()));
    }
    if _mm256_movemask_ps(odd) != 0 {
        return None;
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), amax);
    let top = lanes.iter().fold(0f32, |m, &l| m.max(l));
    if top == 0.0 {
        return None;
    }
    // The reference keeps the first value of the largest magnitude, with its sign.
    let wanted = _mm256_set1_ps(top);
    let first = (0..QK_K / 8).find_map(|i| {
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_and_ps(_mm256_loadu_ps(p.add(8 * i)), abs), wanted));
        (hit != 0).then(|| 8 * i + hit.trailing_zeros() as usize)
    })?;
    let iscale = -127.0 / x[first];
    let mut block = BlockQ8K::zeroed();
    let (scale, most) = (_mm256_set1_ps(iscale), _mm256_set1_epi32(127));
    // Ties to even, as the reference's `nearest_int`; then at most 127.
    let q = |i: usize| _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(scale, _mm256_loadu_ps(p.add(8 * i)))), most);
    for c in 0..QK_K / 32 {
        let (a, b, d, e) = (q(4 * c), q(4 * c + 1), q(4 * c + 2), q(4 * c + 3));
        let bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(d, e));
        let ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(block.qs.as_mut_ptr().add(32 * c) as *mut __m256i, ordered);
    }
    for (sum, group) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
        *sum = group.iter().map(|&q| q as i16).sum();
    }
    block.d = 1.0 / iscale;
    Some(block)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn both(x: &[f32]) -> (Vec<u8>, Vec<u8>) {
        let mut simd = vec![0u8; x.len() / QK_K * BlockQ8K::BYTES];
        let mut reference = simd.clone();
        assert!(quantize_row_q8_k(x, &mut simd), "this CPU has AVX2");
        for (x, out) in x.chunks_exact(QK_K).zip(reference.chunks_exact_mut(BlockQ8K::BYTES)) {
            BlockQ8K::quantize_ref(x).write(out);
        }
        (simd, reference)
    }

    proptest! {
        #[test]
        fn equals_the_reference(seed in any::<u64>(), scale in -30i32..30, blocks in 1usize..4) {
            let mut s = seed | 1;
            let x: Vec<f32> = (0..blocks * QK_K).map(|_| {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                // Some values repeat (ties of magnitude, halves after scaling).
                let v = ((s % 2001) as f32 - 1000.0) / 8.0;
                v * 2f32.powi(scale)
            }).collect();
            let (simd, reference) = both(&x);
            prop_assert_eq!(simd, reference);
        }
    }

    #[test]
    fn ties_signs_zeros_and_non_finite_values_go_as_the_reference() {
        let mut x = vec![0.5f32; QK_K];
        // The largest magnitude twice, negative first: the first one's sign counts.
        x[3] = -2.0;
        x[200] = 2.0;
        // Halves that round to even after scaling by 127/2.
        x[7] = 2.0 / 127.0 * 2.5;
        let (simd, reference) = both(&x);
        assert_eq!(simd, reference);
        let zeros = vec![0f32; QK_K];
        assert_eq!(both(&zeros).0, both(&zeros).1);
        for odd in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut y = x.clone();
            y[100] = odd;
            let (simd, reference) = both(&y);
            assert_eq!(simd, reference, "{odd}");
        }
    }
}
