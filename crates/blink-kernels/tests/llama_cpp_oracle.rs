//! Checks against llama.cpp itself (fixture `tests/fixtures/ggml_x86.bkf`, recorded by
//! `make_ggml_fixtures.py` through ctypes from a `-march=native` x86-64 build of ggml).
//!
//! * Weight quantization must equal `ggml_quantize_chunk` (the `*_ref` quantizers) byte for
//!   byte: ggml-base is built for baseline x86-64, so its float operations are plain IEEE
//!   `f32` ops in source order, which Blink reproduces.
//! * Activation quantization must equal the CPU backend's `from_float` byte for byte.
//! * Dot products use a different float summation order than llama.cpp's SIMD kernels, so
//!   they are compared within a bound relative to `Σ|w_i·a_i|`; the integer parts are exact.

mod common;

use blink_kernels::order::DotOrder;
use blink_kernels::quant::{dequantize_row, quantize_row, quantize_weights, vec_dot, vec_dot_in, WeightType};
use common::{ggml_type, row_bytes, to_f32s, Fixture};

const N: usize = 512;
const CASES: usize = 6;
const WEIGHTS: [&str; 13] = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K",
];

fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter().zip(want).position(|(g, w)| g != w)
}

#[test]
fn weight_quantizers_match_llama_cpp_byte_exactly() {
    let fx = Fixture::load("ggml_x86.bkf");
    let inputs = fx.f32s("w/in");
    for name in WEIGHTS.iter().copied().chain(["Q8_1", "Q8_K"]) {
        let ty = ggml_type(name);
        let rb = row_bytes(ty, N);
        let want = fx.bytes(&format!("w/{name}"));
        for (case, x) in inputs.chunks_exact(N).enumerate() {
            let mut got = vec![0u8; rb];
            quantize_weights(ty, x, &mut got).unwrap();
            let want = &want[case * rb..(case + 1) * rb];
            if let Some(i) = first_difference(&got, want) {
                let b = i / ty.type_size();
                panic!(
                    "{name} case {case}: byte {i} (block {b}) is {} not {}",
                    got[i], want[i]
                );
            }
        }
    }
}

#[test]
fn activation_quantizers_match_llama_cpp_byte_exactly() {
    let fx = Fixture::load("ggml_x86.bkf");
    let inputs = fx.f32s("a/in");
    for name in ["F16", "BF16", "Q8_0", "Q8_1", "Q8_K"] {
        let ty = ggml_type(name);
        let rb = row_bytes(ty, N);
        let want = fx.bytes(&format!("a/{name}"));
        for (case, x) in inputs.chunks_exact(N).enumerate() {
            let mut got = vec![0u8; rb];
            quantize_row(ty, x, &mut got);
            if let Some(i) = first_difference(&got, &want[case * rb..(case + 1) * rb]) {
                panic!(
                    "{name} case {case}: byte {i} (block {}) differs",
                    i / ty.type_size()
                );
            }
        }
    }
}

/// Types whose dot product follows llama.cpp's x86 `vec_dot` reduction order exactly (see
/// `quant::reduce`), so results must be bit-identical. `Q4_0` follows the kernels of the
/// matrices llama.cpp repacks instead (every matrix of a model whose row count is a
/// multiple of eight): `cli_synthetic` holds that one to llama.cpp's text.
const EXACT_ORDER: &[&str] = &["F32", "F16", "Q4_1", "Q5_0", "Q5_1", "Q8_0"];

/// `vec_dot` on llama.cpp's own quantized bytes must reproduce llama.cpp's result up to
/// float summation order: within `1e-6·Σ|w_i·a_i|` (about 8 ulps of the magnitude sum; the
/// rows have 512 terms summed in at most 16 block partials). So must the `Block` order.
#[test]
fn vec_dot_matches_llama_cpp() {
    let fx = Fixture::load("ggml_x86.bkf");
    let a_in = fx.f32s("a/in");
    for name in WEIGHTS {
        let ty = ggml_type(name);
        let act_ty = ty.activation_type();
        assert_eq!(
            std::str::from_utf8(fx.bytes(&format!("dot/{name}/act"))).unwrap(),
            act_ty.name()
        );
        let want = fx.f32s(&format!("dot/{name}"));
        let (wb, ab) = (row_bytes(ty, N), row_bytes(act_ty, N));
        let w_all = fx.bytes(&format!("w/{name}"));
        let a_all: Vec<u8> = if act_ty.name() == "F32" {
            a_in.iter().flat_map(|v| v.to_le_bytes()).collect()
        } else {
            fx.bytes(&format!("a/{}", act_ty.name())).to_vec()
        };
        for case in 0..CASES {
            let w = &w_all[case * wb..(case + 1) * wb];
            let a = &a_all[case * ab..(case + 1) * ab];
            let got = vec_dot(ty, N, w, a);
            let (mut wf, mut af) = (vec![0f32; N], vec![0f32; N]);
            dequantize_row(ty, w, &mut wf);
            dequantize_row(act_ty, a, &mut af);
            let magnitude: f64 = wf
                .iter()
                .zip(&af)
                .map(|(x, y)| (*x as f64 * *y as f64).abs())
                .sum();
            if EXACT_ORDER.contains(&name) {
                assert_eq!(
                    got.to_bits(),
                    want[case].to_bits(),
                    "{name} case {case}: blink {got} vs llama.cpp {} must be bit-identical",
                    want[case]
                );
            }
            let block = vec_dot_in(DotOrder::Block, ty, N, w, a);
            for (order, got) in [(DotOrder::Llama, got), (DotOrder::Block, block)] {
                let diff = (got as f64 - want[case] as f64).abs();
                assert!(
                    diff <= 1e-6 * magnitude,
                    "{name} case {case} {order}: blink {got} vs llama.cpp {} (diff {diff:e}, Σ|wa| {magnitude:e})",
                    want[case]
                );
            }
        }
    }
}

/// The recorded inputs really are what the fixture script says (guards against a stale or
/// mismatched fixture silently weakening the tests above).
#[test]
fn fixture_is_complete() {
    let fx = Fixture::load("ggml_x86.bkf");
    assert_eq!(to_f32s(fx.bytes("w/in")).len(), CASES * N);
    assert_eq!(to_f32s(fx.bytes("a/in")).len(), CASES * N);
    assert_eq!(
        fx.keys()
            .filter(|k| k.starts_with("dot/") && !k.ends_with("/act"))
            .count(),
        WEIGHTS.len()
    );
}
