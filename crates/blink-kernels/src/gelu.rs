//! GELU as llama.cpp's CPU backend computes it for GeGLU: the tanh approximation,
//! evaluated once per f16 input into a table of f16 results, looked up for inputs inside
//! (-10, 10) after rounding them to f16; 0 below, the input itself above.

use std::sync::OnceLock;

use half::f16;

use crate::cpu::Isa;

const COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `0.5·x·(1 + tanh(√(2/π)·x·(1 + a·x²)))` in ggml's order of operations, `1 + a·x·x`
/// fused into one rounding as the compiler fuses it in ggml's build.
fn gelu_f32(x: f32) -> f32 {
    let inner = (COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

/// The f16 bits of GELU of every f16 input.
fn table() -> &'static [u16] {
    static TABLE: OnceLock<Box<[u16]>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|bits| f16::from_f32(gelu_f32(f16::from_bits(bits).to_f32())).to_bits()).collect())
}

/// GELU of one value, as ggml's table gives it.
#[inline]
pub fn gelu(x: f32, table: &[u16]) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16::from_bits(table[usize::from(f16::from_f32(x).to_bits())]).to_f32()
    }
}

/// GeGLU in place: `gate = gelu(gate) · up`.
pub fn geglu(isa: Isa, gate: &mut [f32], up: &[f32]) {
    let table = table();
    #[cfg(target_arch = "x86_64")]
    if isa.is_x86() {
        // SAFETY: these paths are only chosen once the CPU has AVX2, FMA and F16C.
        return unsafe { geglu_f16c(gate, up, table) };
    }
    let _ = isa;
    geglu_scalar(gate, up, table);
}

fn geglu_scalar(gate: &mut [f32], up: &[f32], table: &[u16]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu(*g, table) * u;
    }
}

/// Eight at a time: the f16 conversions in hardware (round to nearest even, as
/// `f16::from_f32`), the table looked up per lane, the two ends blended in.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn geglu_f16c(gate: &mut [f32], up: &[f32], table: &[u16]) {
    use std::arch::x86_64::*;
    let n = gate.len().min(up.len());
    let whole = n - n % 8;
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    for i in (0..whole).step_by(8) {
        let x = _mm256_loadu_ps(gate.as_ptr().add(i));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        let mut bits = [0u16; 8];
        _mm_storeu_si128(bits.as_mut_ptr() as *mut __m128i, h);
        let looked: [u16; 8] = std::array::from_fn(|k| table[usize::from(bits[k])]);
        let g = _mm256_cvtph_ps(_mm_loadu_si128(looked.as_ptr() as *const __m128i));
        // x >= 10: x itself; x <= -10: 0.
        let g = _mm256_blendv_ps(g, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
        let g = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), g);
        _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(g, _mm256_loadu_ps(up.as_ptr().add(i))));
    }
    geglu_scalar(&mut gate[whole..n], &up[whole..n], table);
}

/// The table, for tests that hold it to llama.cpp's.
pub fn gelu_f16_table() -> &'static [u16] {
    table()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_gives_the_scalar_bits() {
        let n = 1000;
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 4001) as f32 * 0.01 - 20.0 + (i as f32) * 1e-4).collect();
        let up: Vec<f32> = (0..n).map(|i| 1.0 + (i % 13) as f32 * 0.37 - 2.0).collect();
        let mut want = x.clone();
        geglu_scalar(&mut want, &up, table());
        for isa in Isa::simd_supported().into_iter().chain([Isa::Scalar]) {
            let mut got = x.clone();
            geglu(isa, &mut got, &up);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa}");
        }
    }

    #[test]
    fn gelu_is_the_tanh_approximation_rounded_to_f16() {
        let t = table();
        assert_eq!(gelu(-10.0, t), 0.0);
        assert_eq!(gelu(12.5, t), 12.5);
        assert_eq!(gelu(0.0, t), 0.0);
        for x in [-3.0f32, -1.0, -0.25, 0.5, 1.0, 2.0, 9.5] {
            let exact = 0.5 * x as f64 * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * x as f64 * (1.0 + 0.044715 * (x as f64).powi(2))).tanh());
            assert!((gelu(x, t) as f64 - exact).abs() <= exact.abs() * 1e-3 + 1e-4, "gelu({x}) = {} vs {exact}", gelu(x, t));
        }
    }
}
