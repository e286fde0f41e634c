//! Checks against gguf-py, an independent numpy implementation of the ggml formats
//! (fixture `tests/fixtures/gguf_py.bkf`, made by `make_fixtures.py`).
//!
//! gguf-py evaluates the same float expressions in the same order as ggml (`d·q`,
//! `(d·sc)·q - dmin·m`, ...), each a single IEEE `f32` operation, so dequantization must
//! match bit for bit, signed zeros included. Its weight quantizers mirror ggml's
//! `quantize_row_*_ref`, so those must match byte for byte too.

mod common;

use blink_gguf::GgmlType;
use blink_kernels::quant::{dequantize_row, quantize_row, quantize_weights};
use common::{ggml_type, row_bytes, Fixture};

const DEQUANT_TYPES: [&str; 22] = [
    "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4", "TQ1_0", "TQ2_0",
    "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
];

#[test]
fn dequantize_matches_gguf_py_bit_exactly() {
    let fx = Fixture::load("gguf_py.bkf");
    for name in DEQUANT_TYPES {
        let ty = ggml_type(name);
        let raw = fx.bytes(&format!("deq/{name}/raw"));
        let want = fx.f32s(&format!("deq/{name}/f32"));
        assert_eq!(
            raw.len() / ty.type_size() * ty.block_size(),
            want.len(),
            "{name}"
        );
        // A longer destination must be left alone past `n`.
        let mut got = vec![f32::NAN; want.len() + 3];
        dequantize_row(ty, raw, &mut got);
        assert!(
            got[want.len()..].iter().all(|v| v.is_nan()),
            "{name}: wrote past n"
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{name} element {i} (block {}): {g} vs {w}",
                i / ty.block_size()
            );
        }
    }
}

#[test]
fn weight_quantizers_match_gguf_py_byte_exactly() {
    let fx = Fixture::load("gguf_py.bkf");
    let x = fx.f32s("quant/in");
    for name in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "TQ1_0", "TQ2_0", "F16", "BF16"] {
        let ty = ggml_type(name);
        let want = fx.bytes(&format!("quant/{name}"));
        let mut got = vec![0u8; row_bytes(ty, x.len())];
        quantize_weights(ty, &x, &mut got).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
            let b = i / ty.type_size();
            panic!(
                "{name}: byte {i} (block {b}) differs: {:?} vs {:?}",
                got[i], want[i]
            );
        }
    }
}

/// gguf-py's `Q8_0` quantizer is ggml's reference one (multiplier `1/(amax/127)`, ties away
/// from zero). Activations use the x86 rule (`127/amax`, ties to even), so quants may differ
/// by one step, but only where `x·127/amax` sits at (or within float error of) a half.
#[test]
fn q8_0_activation_agrees_with_gguf_py_except_at_ties() {
    let fx = Fixture::load("gguf_py.bkf");
    let x = fx.f32s("quant/in");
    let want = fx.bytes("quant/Q8_0");
    let mut got = vec![0u8; want.len()];
    quantize_row(GgmlType::Q8_0, &x, &mut got);
    let mut near_ties = 0;
    for (b, (xs, (g, w))) in x
        .chunks_exact(32)
        .zip(got.chunks_exact(34).zip(want.chunks_exact(34)))
        .enumerate()
    {
        assert_eq!(g[..2], w[..2], "block {b}: scale differs");
        let amax = xs.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
        for (j, (&gq, &wq)) in g[2..].iter().zip(&w[2..]).enumerate() {
            let t = if amax > 0.0 {
                xs[j] as f64 * 127.0 / amax
            } else {
                0.0
            };
            let dist_to_half = ((t.abs() - t.abs().floor()) - 0.5).abs();
            if dist_to_half < 1e-5 {
                near_ties += 1;
                assert!(
                    (gq as i8 as i32 - wq as i8 as i32).abs() <= 1,
                    "block {b} element {j}"
                );
            } else {
                assert_eq!(gq, wq, "block {b} element {j}: x·127/amax = {t}");
            }
        }
    }
    // The fixture's "coarse grid" and "symmetric" blocks produce a few genuine ties.
    assert!(near_ties > 0, "fixture should exercise ties");
}
