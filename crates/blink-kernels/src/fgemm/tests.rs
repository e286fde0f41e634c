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
    std::iter::once(Isa::Scalar).chain(Isa::simd_supported()).collect()
}

/// `C` over `m` rows for `b`, computed by `isa` in `splits` column ranges.
#[allow(clippy::too_many_arguments)]
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
    use GgmlType::*;
    for (ty, rows, cols) in [(Q4_1, 136, 576), (Q8_0, 40, 96), (Q4_K, 33, 512), (F32, 45, 64), (Q4_0, 96, 320), (Q5_0, 45, 288), (Q5_1, 130, 320), (F16, 104, 96), (Q6_K, 17, 256)] {
        let w = Weight::new(ty, rows, cols, 7);
        let layouts: &[Layout] = if w.packed.is_some() { &[Layout::RowMajor, Layout::Packed] } else { &[Layout::RowMajor] };
        for &layout in layouts {
            for m in [1, 5, 13, 27] {
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
    for (depth, n) in [(8, 600), (300, 8), (1536, 40), (1, 33), (37, 20), (263, 96)] {
        let data = values(depth * n, 3);
        for m in [1, 7, 12, 13, 26, 40] {
            let a = values(m * depth, 11);
            check(&format!("F32 {depth}x{n} m={m}"), &a, m, depth, BSource::F32 { data: &data, ld: n }, n, |k, j| data[k * n + j]);
            check(&format!("F32T {depth}x{n} m={m}"), &a, m, depth, BSource::F32T { data: &data, ld: depth }, n, |k, j| data[j * depth + k]);
        }
    }
}

/// Rows of `A` in more than one block of [`MC`], packed (wide `C`) or read in place
/// (narrow `C`, up to `DIRECT_COLS` columns).
#[test]
fn more_rows_than_one_block_of_a() {
    let m = MC + 31;
    for (depth, n) in [(300, 40), (260, 200)] {
        let data = values(depth * n, 5);
        let a = values(m * depth, 6);
        check(&format!("F32 {depth}x{n} rows past MC"), &a, m, depth, BSource::F32 { data: &data, ld: n }, n, |k, j| data[k * n + j]);
    }
    let w = Weight::new(GgmlType::Q4_0, 136, 64, 8);
    let a = values(m * 64, 9);
    check("Q4_0 packed Wᵀ rows past MC", &a, m, 64, BSource::WeightT(w.mat(Layout::Packed)), 136, |k, j| w.floats[j * 64 + k]);
}

/// Every path's panels hold `quant::dequantize_row`'s values bit for bit, and zeros (of
/// either sign) past the live columns, for windows of rows and columns that do and do not start on a group.
#[test]
fn panels_hold_the_dequantized_values() {
    use GgmlType::*;
    for (ty, rows, cols) in [(Q4_0, 45, 576), (Q4_1, 72, 576), (Q5_0, 45, 576), (Q5_1, 70, 320), (Q8_0, 40, 320), (Q4_K, 20, 512), (F16, 20, 64)] {
        let w = Weight::new(ty, rows, cols, 21);
        let layouts: &[Layout] = if w.packed.is_some() { &[Layout::RowMajor, Layout::Packed] } else { &[Layout::RowMajor] };
        let bs = ty.block_size().max(32);
        for &layout in layouts {
            let mat = w.mat(layout);
            for isa in paths() {
                let (mut panel, mut tmp) = (vec![f32::NAN; KC * NC], vec![0f32; KC * NC]);
                // Wᵀ: panel[k][j] = W[j][k].
                for js in [0..rows.min(32), 32.min(rows)..rows.min(64), 40.min(rows)..rows, (rows - 5)..rows] {
                    for ks in [0..bs, 0..cols.min(KC), (cols - bs)..cols] {
                        panel.fill(f32::NAN);
                        tile::weight_cols(isa, &mat, js.clone(), ks.clone(), &mut panel, &mut tmp);
                        for (i, k) in ks.clone().enumerate() {
                            for jj in 0..NR {
                                let got = panel[i * NR + jj];
                                if jj < js.len() {
                                    let want = w.floats[(js.start + jj) * cols + k];
                                    assert_eq!(got.to_bits(), want.to_bits(), "{ty} {layout:?} {isa} Wᵀ rows {js:?} k {k} column {jj}: {got} vs {want}");
                                } else {
                                    assert!(got == 0.0, "{ty} {layout:?} {isa} Wᵀ rows {js:?} k {k} column {jj} past the rows: {got}");
                                }
                            }
                        }
                    }
                }
                // W: panel p of the tile holds columns js.start + p·NR.., rows ks.
                for ks in [0..rows, 3..rows.min(20), 8..16, (rows - 1)..rows] {
                    for js in [0..bs, 0..cols.min(NC), (cols - bs)..cols] {
                        panel.fill(f32::NAN);
                        tile::weight_rows(isa, &mat, ks.clone(), js.clone(), &mut panel, &mut tmp);
                        let kc = ks.len();
                        for (i, k) in ks.clone().enumerate() {
                            for jj in 0..js.len().next_multiple_of(NR) {
                                let want = if jj < js.len() { w.floats[k * cols + js.start + jj] } else { 0.0 };
                                let got = panel[((jj / NR) * kc + i) * NR + jj % NR];
                                assert_eq!(got.to_bits(), want.to_bits(), "{ty} {layout:?} {isa} W rows {ks:?} columns {js:?}: row {k} column {jj}: {got} vs {want}");
                            }
                        }
                    }
                }
            }
        }
    }
}
