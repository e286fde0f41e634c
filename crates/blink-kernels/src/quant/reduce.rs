//! The reduction orders that define Blink's float results.
//!
//! Float sums depend on their order, and a transformer amplifies last-bit differences
//! until greedy tokens flip. Blink therefore fixes every reduction to the order llama.cpp's
//! x86 kernels use (AVX2 for the quantized dots, AVX-512 for float dots), so its outputs
//! match that reference exactly (quantized dots may opt out: [`crate::order`]). Scalar
//! code emulates the orders with `mul_add`; SIMD kernels must produce identical bits.

/// Horizontal sum of eight lanes, as ggml's `hsum_float_8`:
/// `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
#[inline]
pub fn hsum8(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// Horizontal sum of sixteen lanes, as `_mm512_reduce_add_ps`: halves, then quarters,
/// then `(t0+t2) + (t1+t3)`.
#[inline]
pub fn hsum16(a: &[f32; 16]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|i| a[i + 8] + a[i]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[i + 4] + t3[i]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// Elements per step of the float dot product: four 16-lane accumulators.
pub const FLOAT_DOT_STEP: usize = 64;

/// Dot product of `n` elements in the order of ggml's AVX-512 `ggml_vec_dot_f16/f32`:
/// whole 64-element steps go into four 16-lane FMA accumulators, which are folded
/// (`a0+a2`, `a1+a3`, then `a0+a1`) and reduced with [`hsum16`]; leftover elements are
/// then added one by one (in f64 when `f64_tail`, as the f16 kernel does).
#[inline]
pub fn dot_lanes16(n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32, f64_tail: bool) -> f32 {
    let np = n - n % FLOAT_DOT_STEP;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(FLOAT_DOT_STEP) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                let e = i + 16 * j + l;
                *lane = x(e).mul_add(y(e), *lane);
            }
        }
    }
    let [mut a0, mut a1, a2, a3] = acc;
    for l in 0..16 {
        a0[l] += a2[l];
        a1[l] += a3[l];
    }
    for l in 0..16 {
        a0[l] += a1[l];
    }
    let head = hsum16(&a0);
    if f64_tail {
        let mut sum = head as f64;
        for e in np..n {
            sum += (x(e) * y(e)) as f64;
        }
        sum as f32
    } else {
        let mut sum = head;
        for e in np..n {
            sum = x(e).mul_add(y(e), sum);
        }
        sum
    }
}

/// Elements per step of the `BF16` dot product: two 16-lane accumulators.
pub const BF16_DOT_STEP: usize = 32;

/// Dot product of `n` elements in the order of ggml's AVX-512F `ggml_vec_dot_bf16` (its
/// path without the BF16 extension): whole 32-element steps go into two 16-lane
/// accumulators, each lane adding the rounded product (`acc + x·y`, no FMA); each
/// accumulator is reduced with [`hsum16`] and added to an `f64` sum, leftover products
/// (rounded in `f32`) are added to it one by one, and the sum is rounded to `f32`.
#[inline]
pub fn dot_lanes16_unfused(n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32) -> f32 {
    let np = n - n % BF16_DOT_STEP;
    let mut acc = [[0f32; 16]; 2];
    for i in (0..np).step_by(BF16_DOT_STEP) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                let e = i + 16 * j + l;
                *lane += x(e) * y(e);
            }
        }
    }
    let mut sum = 0f64;
    for a in &acc {
        sum += hsum16(a) as f64;
    }
    for e in np..n {
        sum += (x(e) * y(e)) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_exact_on_integers() {
        let l: [f32; 8] = std::array::from_fn(|i| i as f32);
        assert_eq!(hsum8(&l), 28.0);
        let a: [f32; 16] = std::array::from_fn(|i| i as f32);
        assert_eq!(hsum16(&a), 120.0);
        let x: Vec<f32> = (0..100).map(|i| (i % 7) as f32).collect();
        let want: f32 = x.iter().map(|v| v * v).sum();
        assert_eq!(dot_lanes16(100, |i| x[i], |i| x[i], true), want);
        assert_eq!(dot_lanes16(100, |i| x[i], |i| x[i], false), want);
        assert_eq!(dot_lanes16_unfused(100, |i| x[i], |i| x[i]), want);
    }

    #[test]
    fn hsum8_groups_lanes_like_ggml() {
        // 1e8 + 1 - 1e8 depends on grouping: ggml adds lane 0 to lane 4 first.
        let mut l = [0f32; 8];
        l[0] = 1e8;
        l[4] = -1e8;
        l[2] = 1.0;
        assert_eq!(hsum8(&l), 1.0);
    }
}
