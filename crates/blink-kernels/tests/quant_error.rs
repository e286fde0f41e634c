//! Quantize → dequantize error bounds for the reference weight quantizers.
//!
//! * Per-element bounds for the formats whose rounding is simple enough to bound exactly
//!   (legacy 32-element formats, `Q8_K`, `F16`, `BF16`), derived from the quantizer: half a
//!   step from rounding, plus the error of storing the scale (and min) as `f16`.
//! * Relative RMSE bounds `‖x - deq(q(x))‖ / ‖x‖` (per 256-value chunk, averaged) on
//!   Gaussian data with outliers, for every type. The limits sit 20-30% above what the
//!   quantizers reach on this fixed data, so they catch regressions in the scale searches
//!   (which the byte-exact llama.cpp fixture pins down anyway) and packing mistakes.

mod common;

use blink_gguf::GgmlType;
use blink_kernels::quant::{
    dequantize_row, quantize_weights, Block, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8K,
    BlockQ8_0,
};
use common::{row_bytes, Rng};

/// `f16` relative rounding error (half an ulp).
const F16_EPS: f32 = 1.0 / 2048.0;

/// Largest error of storing `v` as `f16`: half an ulp, or half the subnormal spacing.
fn f16_err(v: f32) -> f32 {
    F16_EPS * v.abs() + 2f32.powi(-25)
}

/// Gaussian rows whose scale changes every 256 values (0.001 .. 10), with a few outliers.
fn test_data(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut x = Vec::with_capacity(n);
    for chunk in 0..n / 256 {
        let scale = 10f32.powf(-3.0 + 4.0 * ((chunk * 7) % 11) as f32 / 10.0);
        x.extend((0..256).map(|_| rng.normal() * scale));
    }
    for i in (0..n).step_by(997) {
        x[i] *= 8.0;
    }
    x
}

fn round_trip(ty: GgmlType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut q = vec![0u8; row_bytes(ty, x.len())];
    quantize_weights(ty, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut y);
    (q, y)
}

/// Check `|x_i - y_i| <= bound(block)` for every element of every block.
fn check_per_element<B: Block>(x: &[f32], bound: impl Fn(&B) -> f32) {
    let (q, y) = round_trip(B::TYPE, x);
    for (b, (chunk, (xs, ys))) in q
        .chunks_exact(B::BYTES)
        .zip(x.chunks_exact(B::ELEMS).zip(y.chunks_exact(B::ELEMS)))
        .enumerate()
    {
        let limit = bound(&B::read(chunk));
        for (i, (&a, &c)) in xs.iter().zip(ys).enumerate() {
            assert!(
                (a - c).abs() <= limit,
                "{} block {b} element {i}: {a} -> {c} (limit {limit})",
                B::TYPE
            );
        }
    }
}

#[test]
fn legacy_formats_error_per_element() {
    let x = test_data(8192, 11);
    // Round to nearest (half a step) plus up to 127 steps of f16 scale error.
    check_per_element::<BlockQ8_0>(&x, |b| {
        (0.5 * b.d.to_f32().abs() + 127.0 * f16_err(b.d.to_f32())) * 1.001
    });
    // The extreme maps to -8; the opposite end clamps at +7, so up to a full step there.
    check_per_element::<BlockQ4_0>(&x, |b| {
        (b.d.to_f32().abs() + 8.0 * f16_err(b.d.to_f32())) * 1.001
    });
    check_per_element::<BlockQ5_0>(&x, |b| {
        (b.d.to_f32().abs() + 16.0 * f16_err(b.d.to_f32())) * 1.001
    });
    // Affine: half a step, plus f16 error of the scale (15/31 steps) and of the min.
    check_per_element::<BlockQ4_1>(&x, |b| {
        (0.5 * b.d.to_f32() + 15.0 * f16_err(b.d.to_f32()) + f16_err(b.m.to_f32())) * 1.001
    });
    check_per_element::<BlockQ5_1>(&x, |b| {
        (0.5 * b.d.to_f32() + 31.0 * f16_err(b.d.to_f32()) + f16_err(b.m.to_f32())) * 1.001
    });
    // Q8_K keeps an f32 scale: only the rounding half-step.
    check_per_element::<BlockQ8K>(&x, |b| 0.5 * 1.0001 * b.d.abs());
}

#[test]
fn float_formats_error_per_element() {
    let x = test_data(4096, 12);
    for (ty, eps) in [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, F16_EPS),
        (GgmlType::BF16, 1.0 / 256.0),
    ] {
        let (_, y) = round_trip(ty, &x);
        for (&a, &c) in x.iter().zip(&y) {
            // F16 has subnormals below 2^-14: allow their absolute spacing too.
            let limit = eps * a.abs()
                + if ty == GgmlType::F16 {
                    2f32.powi(-25)
                } else {
                    0.0
                };
            assert!((a - c).abs() <= limit, "{ty}: {a} -> {c}");
        }
    }
}

fn relative_rmse(ty: GgmlType, x: &[f32]) -> f64 {
    let (_, y) = round_trip(ty, x);
    // Normalise per 256-element chunk so the large-scale chunks do not dominate.
    let per_chunk: Vec<f64> = x
        .chunks_exact(256)
        .zip(y.chunks_exact(256))
        .map(|(xs, ys)| {
            let err: f64 = xs
                .iter()
                .zip(ys)
                .map(|(&a, &b)| ((a - b) as f64).powi(2))
                .sum();
            let sig: f64 = xs.iter().map(|&a| (a as f64).powi(2)).sum();
            err / sig
        })
        .collect();
    (per_chunk.iter().sum::<f64>() / per_chunk.len() as f64).sqrt()
}

#[test]
fn relative_rmse_bounds() {
    let x = test_data(16384, 13);
    let limits = [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 3e-4),
        (GgmlType::BF16, 2.5e-3),
        (GgmlType::Q8_0, 7.5e-3),
        (GgmlType::Q8_1, 7.5e-3),
        (GgmlType::Q8_K, 0.013),
        (GgmlType::Q4_0, 0.115),
        (GgmlType::Q4_1, 0.1),
        (GgmlType::Q5_0, 0.058),
        (GgmlType::Q5_1, 0.048),
        (GgmlType::Q2_K, 0.37),
        (GgmlType::Q3_K, 0.19),
        (GgmlType::Q4_K, 0.09),
        (GgmlType::Q5_K, 0.046),
        (GgmlType::Q6_K, 0.024),
    ];
    for (ty, limit) in limits {
        let rmse = relative_rmse(ty, &x);
        eprintln!("{ty}: relative rmse {rmse:.5} (limit {limit})");
        assert!(rmse <= limit, "{ty}: relative rmse {rmse} above {limit}");
    }
}
