//! GELU as llama.cpp's CPU backend computes it for GeGLU: the tanh approximation,
//! evaluated once per f16 input into a table of f16 results, looked up for inputs inside
//! (-10, 10) after rounding them to f16; 0 below, the input itself above.

use std::sync::OnceLock;

use half::f16;

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
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let table = table();
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu(*g, table) * u;
    }
}

/// The table, for tests that hold it to llama.cpp's.
pub fn gelu_f16_table() -> &'static [u16] {
    table()
}

#[cfg(test)]
mod tests {
    use super::*;

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
