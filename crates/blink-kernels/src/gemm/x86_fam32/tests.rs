use super::*;
use crate::cpu::Isa;
use crate::quant::{quantize_row, quantize_weights, WeightType};
use blink_gguf::GgmlType;

/// The AVX-VNNI kernels (their shapes, on the EVEX encoding) give the bits of the
/// AVX-512 VNNI ones, themselves checked against the scalar definition
/// (`tests/gemm_exact.rs`), over every type, order, layout and tile width.
#[test]
fn avx_vnni_shapes_equal_avx512_vnni() {
    if !Isa::Avx512Vnni.supported() {
        eprintln!("note: no AVX-512 VNNI on this CPU; the AVX-VNNI shapes are not exercised here");
        return;
    }
    let types = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::MXFP4];
    let (rows, cols) = (27, 3 * 32);
    let value = |i: usize, seed: usize| (((i * 2654435761 + seed * 40503) % 2001) as f32 - 1000.0) * 1e-3;
    for (k, ty) in types.into_iter().enumerate() {
        let x: Vec<f32> = (0..rows * cols).map(|i| value(i, k)).collect();
        let mut w = vec![0u8; ty.row_bytes((rows * cols) as u64).unwrap() as usize];
        quantize_weights(ty, &x, &mut w).unwrap();
        let packed = super::super::pack::pack(ty, rows, cols, &w).unwrap();
        let act_ty = ty.activation_type();
        let stride = act_ty.row_bytes(cols as u64).unwrap() as usize;
        for n_act in 1..8 {
            let mut act = vec![0u8; n_act * stride];
            for j in 0..n_act {
                let row: Vec<f32> = (0..cols).map(|i| value(i, 100 + j)).collect();
                quantize_row(act_ty, &row, &mut act[j * stride..(j + 1) * stride]);
            }
            for order in [DotOrder::Llama, DotOrder::Block] {
                for (layout, m) in [(Layout::Packed, &packed), (Layout::RowMajor, &w)] {
                    let run = |avx_vnni: bool| {
                        let mut out = vec![0f32; n_act * rows];
                        let o = Out { ptr: out.as_mut_ptr(), ld: rows, accumulate: false };
                        let mut ranges = std::iter::once(0..rows);
                        // SAFETY: the CPU has AVX-512 VNNI (checked above); `out` holds
                        // n_act rows of `rows`.
                        let done = unsafe {
                            if avx_vnni {
                                gemm_avx_vnni_on_evex(order, ty, layout, cols, m, &mut ranges, &act, stride, n_act, o)
                            } else {
                                gemm_vnni(order, ty, layout, cols, m, &mut ranges, &act, stride, n_act, o)
                            }
                        };
                        assert!(done, "{ty} has a kernel");
                        out
                    };
                    let (got, want) = (run(true), run(false));
                    let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{ty} {order} {layout:?} {n_act} rows: {got:?} vs {want:?}");
                }
            }
        }
    }
}

/// `blink info` names the int8 route where the kernels take it: the formats with fifth
/// bits, in either order except AVX-512's block order, and no other format; and the int16
/// route likewise (`Q8_0` on plain AVX2).
#[test]
fn the_int8_route_is_named_where_it_is_taken() {
    let types = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::MXFP4, GgmlType::Q4_K];
    for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni] {
        for order in [DotOrder::Llama, DotOrder::Block] {
            for ty in types {
                let expected = matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) && !(isa == Isa::Avx512Vnni && order == DotOrder::Block);
                assert_eq!(takes_int8_route(isa, order, ty), expected, "{isa} {order} {ty:?}");
                assert_eq!(crate::gemm::route(isa, order, ty).contains("converted to int8"), expected, "{isa} {order} {ty:?}");
                // The int16 route: Q8_0 on plain AVX2, in either order.
                let expected = ty == GgmlType::Q8_0 && isa == Isa::Avx2;
                assert_eq!(takes_int16_route(isa, ty), expected, "{isa} {order} {ty:?}");
                assert_eq!(crate::gemm::route(isa, order, ty).contains("widened to 16 bits"), expected, "{isa} {order} {ty:?}");
            }
        }
    }
}
