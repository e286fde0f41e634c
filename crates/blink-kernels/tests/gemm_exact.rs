//! Every SIMD path of `gemm` returns exactly the scalar reference's bits, on random blocks,
//! for every supported type, tile shape and write mode. Paths this CPU lacks are reported
//! and skipped by name; the scalar path always runs.

use blink_gguf::GgmlType;
use blink_kernels::cpu::Isa;
use blink_kernels::gemm::{gemm, pack, Layout, Out, ROW_ALIGN};
use blink_kernels::quant::{quantize_row, vec_dot_type};
use proptest::prelude::*;

const TYPES: [GgmlType; 5] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0];

/// Random but valid blocks: random quant bytes, small finite f16 scale fields.
fn random_weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let n_blocks = rows * cols / 32;
    let mut out = Vec::with_capacity(n_blocks * ty.type_size());
    for _ in 0..n_blocks {
        let mut block: Vec<u8> = (0..ty.type_size()).map(|_| next() as u8).collect();
        let scale = |r: u64| half::f16::from_f32(((r % 2000) as f32 - 1000.0) * 1e-5).to_bits().to_le_bytes();
        block[..2].copy_from_slice(&scale(next()));
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            block[2..4].copy_from_slice(&scale(next()));
        }
        out.extend_from_slice(&block);
    }
    out
}

fn run(isa: Isa, ty: GgmlType, layout: Layout, w: &[u8], rows: usize, cols: usize, act: &[u8], stride: usize, n_act: usize, accumulate: bool) -> Vec<f32> {
    let mut out: Vec<f32> = (0..n_act * rows).map(|i| i as f32 * 0.25).collect();
    // Split the rows in two calls to exercise ranges that start mid-matrix.
    let mid = (rows / 3).next_multiple_of(ROW_ALIGN).min(rows);
    for range in [0..mid, mid..rows] {
        unsafe { gemm(isa, ty, layout, cols, w, range, act, stride, n_act, Out { ptr: out.as_mut_ptr(), ld: rows, accumulate }) };
    }
    out
}

fn paths() -> Vec<Isa> {
    let all = [Isa::Avx512Vnni, Isa::Avx2, Isa::Neon];
    for isa in all.iter().filter(|i| !i.supported()) {
        eprintln!("note: this CPU has no {isa} path; not exercised here");
    }
    all.into_iter().filter(|i| i.supported()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn simd_gemm_equals_scalar(ty_i in 0usize..5, rows in 1usize..27, blocks in 1usize..9, n_act in 1usize..10, seed in any::<u64>(), accumulate in any::<bool>()) {
        let ty = TYPES[ty_i];
        let cols = blocks * 32;
        let w = random_weights(ty, rows, cols, seed);
        let act_ty = vec_dot_type(ty);
        let stride = act_ty.row_bytes(cols as u64).unwrap() as usize + 7;
        let mut act = vec![0u8; n_act * stride];
        let mut s = seed.rotate_left(17) | 1;
        for r in 0..n_act {
            let x: Vec<f32> = (0..cols).map(|_| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; ((s % 20001) as f32 - 10000.0) * 1e-3 }).collect();
            quantize_row(act_ty, &x, &mut act[r * stride..r * stride + stride - 7]);
        }
        let want = run(Isa::Scalar, ty, Layout::RowMajor, &w, rows, cols, &act, stride, n_act, accumulate);
        let packed = pack::pack(ty, rows, cols, &w).unwrap();
        let same = |got: &[f32]| got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        let got = run(Isa::Scalar, ty, Layout::Packed, &packed, rows, cols, &act, stride, n_act, accumulate);
        prop_assert!(same(&got), "scalar packed {ty}: {:?} vs scalar {:?}", got, want);
        for isa in paths() {
            let got = run(isa, ty, Layout::Packed, &packed, rows, cols, &act, stride, n_act, accumulate);
            prop_assert!(same(&got), "{isa} {ty}: {:?} vs scalar {:?}", got, want);
        }
    }
}
