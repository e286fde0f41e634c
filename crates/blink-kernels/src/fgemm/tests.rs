//! Every path against the scalar definition (bit for bit) and the scalar definition
//! against a float64 product, over every kind of `B`, edge shapes, and column splits.

use blink_gguf::GgmlType;

use super::*;
use crate::gemm::{self, Layout};
use crate::quant;

/// A deterministic value stream in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

struct Weight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
    packed: Option<Vec<u8>>,
    floats: Vec<f32>,
}

impl Weight {
    fn new(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Weight {
        let src = values(rows * cols, seed);
        let mut bytes = vec![0u8; rows * cols / ty.block_size() * ty.type_size()];
        quant::quantize_weights(ty, &src, &mut bytes).unwrap();
        let mut floats = vec![0f32; rows * cols];
        quant::dequantize_row(ty, &bytes, &mut floats);
        let packed = gemm::pack::pack(ty, rows, cols, &bytes);
        Weight { ty, rows, cols, bytes, packed, floats }
    }

    fn mat(&self, layout: Layout) -> MatRef<'_> {
        let bytes = match layout {
            Layout::RowMajor => &self.bytes[..],
            Layout::Packed => self.packed.as_deref().unwrap(),
        };
        MatRef { ty: self.ty, layout, rows: self.rows, cols: self.cols, bytes }
    }
}

fn paths() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni, Isa::Neon].into_iter().filter(|i| i.supported()).collect()
}

/// `C` over `m` rows for `b`, computed by `isa` in `splits` column ranges.
fn product(isa: Isa, a: &[f32], m: usize, depth: usize, b: BSource, n: usize, start: &[f32], accumulate: bool, splits: usize) -> Vec<f32> {
    let mut c = start.to_vec();
    let align = col_align(&b);
    let mut s = FgemmScratch::default();
    for part in 0..splits {
        let units = n.div_ceil(align);
        let cols = (units * part / splits * align).min(n)..(units * (part + 1) / splits * align).min(n);
        let ptr = unsafe { c.as_mut_ptr().add(cols.start) };
        unsafe { fgemm(isa, a, depth, m, depth, b, cols, OutF32 { ptr, ld: n, accumulate }, &mut s) };
    }
    c
}

/// The float64 product `start + A·B` where `B[k][j] = bk(k, j)`.
fn reference(a: &[f32], m: usize, depth: usize, n: usize, bk: impl Fn(usize, usize) -> f32, start: &[f32]) -> Vec<f64> {
    (0..m * n)
        .map(|i| {
            let (r, j) = (i / n, i % n);
            start[i] as f64 + (0..depth).map(|k| a[r * depth + k] as f64 * bk(k, j) as f64).sum::<f64>()
        })
        .collect()
}

fn check(name: &str, a: &[f32], m: usize, depth: usize, b: BSource, n: usize, bk: impl Fn(usize, usize) -> f32) {
    for accumulate in [false, true] {
        let start = if accumulate { values(m * n, 99) } else { vec![0.0; m * n] };
        let want = reference(a, m, depth, n, &bk, &start);
        let scalar = product(Isa::Scalar, a, m, depth, b, n, &start, accumulate, 1);
        for (i, (&got, &w)) in scalar.iter().zip(&want).enumerate() {
            let tol = 1e-5 * (depth as f64).sqrt() * (1.0 + w.abs());
            assert!((got as f64 - w).abs() <= tol, "{name}: scalar element {i}: {got} vs {w}");
        }
        for isa in paths() {
            for splits in [1, 3] {
                let got = product(isa, a, m, depth, b, n, &start, accumulate, splits);
                assert!(got.iter().zip(&scalar).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}: {isa} in {splits} splits differs from scalar");
            }
        }
    }
}

#[test]
fn weights_read_as_w_transposed_and_as_w() {
    for (ty, rows, cols) in [(GgmlType::Q4_1, 72, 576), (GgmlType::Q8_0, 40, 96), (GgmlType::Q4_K, 33, 512), (GgmlType::F32, 45, 64), (GgmlType::Q4_0, 96, 320)] {
        let w = Weight::new(ty, rows, cols, 7);
        let layouts: &[Layout] = if w.packed.is_some() { &[Layout::RowMajor, Layout::Packed] } else { &[Layout::RowMajor] };
        for &layout in layouts {
            for m in [1, 5, 13] {
                // Forward: A is m × cols, C is m × rows.
                let a = values(m * cols, m as u64);
                check(&format!("{ty} {layout:?} Wᵀ m={m}"), &a, m, cols, BSource::WeightT(w.mat(layout)), rows, |k, j| w.floats[j * cols + k]);
                // Backward: A is m × rows, C is m × cols.
                let a = values(m * rows, 50 + m as u64);
                check(&format!("{ty} {layout:?} W m={m}"), &a, m, rows, BSource::Weight(w.mat(layout)), cols, |k, j| w.floats[k * cols + j]);
            }
        }
    }
}

#[test]
fn f32_sources_both_ways_with_deep_and_ragged_shapes() {
    for (depth, n) in [(8, 600), (300, 8), (1536, 40), (1, 33)] {
        let data = values(depth * n, 3);
        for m in [1, 7, 12] {
            let a = values(m * depth, 11);
            check(&format!("F32 {depth}x{n} m={m}"), &a, m, depth, BSource::F32 { data: &data, ld: n }, n, |k, j| data[k * n + j]);
            check(&format!("F32T {depth}x{n} m={m}"), &a, m, depth, BSource::F32T { data: &data, ld: depth }, n, |k, j| data[j * depth + k]);
        }
    }
}
