//! Micro-benchmarks of the hot kernels: GEMV (one activation row) and GEMM (64 rows) per
//! weight type on every kernel path this CPU has, in both dot orders where they differ,
//! and attention over a long context.
//! Throughput is in multiply-accumulates (elements = rows × cols × activation rows).
//!
//! `cargo bench -p blink-kernels` (add `-- gemm/Q4_1` to filter).

use blink_gguf::GgmlType;
use blink_kernels::attention::{self, Online};
use blink_kernels::cpu::Isa;
use blink_kernels::flavour::Flavour;
use blink_kernels::gemm::{prepare, product, ActRows, Layout, MatRef, Out};
use blink_kernels::order::DotOrder;
use blink_kernels::quant::{quantize_row, quantize_weights, WeightType};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;

mod support;
use support::values;

const ROWS: usize = 1536;
const COLS: usize = 576;
/// Columns for the 256-element k-quants (576 is not a whole number of their blocks).
const COLS_K: usize = 768;

const TYPES: [GgmlType; 13] = {
    use GgmlType::*;
    [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F32, F16, BF16]
};

fn paths() -> Vec<Isa> {
    std::iter::once(Isa::Scalar).chain(Isa::simd_supported()).collect()
}

fn bench_gemm(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm");
    for ty in TYPES {
        let cols = if ty.block_size() == 256 { COLS_K } else { COLS };
        let mut w = vec![0u8; ty.row_bytes((ROWS * cols) as u64).unwrap() as usize];
        quantize_weights(ty, &values(ROWS * cols, 1), &mut w).unwrap();
        let act_ty = ty.activation_type();
        let stride = act_ty.row_bytes(cols as u64).unwrap() as usize;
        for n_act in [1usize, 16, 64] {
            let mut act = vec![0u8; n_act * stride];
            let x = values(n_act * cols, 2);
            for r in 0..n_act {
                quantize_row(act_ty, &x[r * cols..(r + 1) * cols], &mut act[r * stride..(r + 1) * stride]);
            }
            let mut out = vec![0f32; n_act * ROWS];
            group.throughput(Throughput::Elements((ROWS * cols * n_act) as u64));
            for isa in paths() {
                let packed = prepare(isa, ty, ROWS, cols, &w);
                let (layout, bytes) = match &packed {
                    Some(p) => (Layout::Packed, p.as_slice()),
                    None => (Layout::RowMajor, w.as_slice()),
                };
                if isa == Isa::Scalar && n_act > 1 {
                    continue; // minutes per sample; the scalar path is the oracle, not a contender
                }
                // The dot order only matters to the 32-element formats.
                let orders: &[DotOrder] = if ty.block_size() == 32 { &[DotOrder::Llama, DotOrder::Block] } else { &[DotOrder::Llama] };
                for &order in orders {
                    let path = if order == DotOrder::Block { format!("{ty}/{isa}/block") } else { format!("{ty}/{isa}") };
                    let m = MatRef { ty, layout, rows: ROWS, cols, bytes };
                    let a = ActRows { ty: act_ty, bytes: &act, stride, count: n_act, forms: &[] };
                    group.bench_function(BenchmarkId::new(path, n_act), |b| {
                        b.iter(|| unsafe { product(isa, order, &m, &a, std::iter::once(0..ROWS), Out { ptr: out.as_mut_ptr(), ld: ROWS, accumulate: false }) })
                    });
                }
            }
        }
    }
    group.finish();
}

fn bench_attention(c: &mut Criterion) {
    let (hd, n, heads) = (64usize, 512usize, 3usize);
    let q: Vec<f32> = values(heads * hd, 3).iter().map(|v| f16::from_f32(*v).to_f32()).collect();
    let k: Vec<f16> = values(n * hd, 4).iter().map(|&v| f16::from_f32(v)).collect();
    let v: Vec<f16> = values(n * hd, 5).iter().map(|&v| f16::from_f32(v)).collect();
    let mut group = c.benchmark_group("attention");
    group.throughput(Throughput::Elements(n as u64));
    for isa in paths() {
        group.bench_function(BenchmarkId::new(format!("f16-hd{hd}"), isa), |b| {
            let mut acc = vec![0f32; hd];
            b.iter(|| {
                let mut st = Online::default();
                acc.iter_mut().for_each(|a| *a = 0.0);
                attention::attend(isa, Flavour::of(isa), &q[..hd], &k, &v, n, 0.125, &mut st, &mut acc);
                st.finish(&mut acc);
            })
        });
    }
    // As the model calls it: blocks of 16 positions, three query heads per key/value head,
    // one head at a time or all three together (elements: positions × heads).
    group.throughput(Throughput::Elements((n * heads) as u64));
    for isa in paths() {
        for together in [false, true] {
            let name = format!("f16-hd{hd}-gqa{heads}-{}", if together { "heads" } else { "each" });
            group.bench_function(BenchmarkId::new(name, isa), |b| {
                let mut acc = vec![0f32; heads * hd];
                b.iter(|| {
                    let mut st = vec![Online::default(); heads];
                    acc.iter_mut().for_each(|a| *a = 0.0);
                    for at in (0..n).step_by(16) {
                        let (kb, vb) = (&k[at * hd..(at + 16) * hd], &v[at * hd..(at + 16) * hd]);
                        if together {
                            attention::attend_heads(isa, Flavour::of(isa), &q, kb, vb, 16, 0.125, &mut st, &mut acc);
                        } else {
                            for (h, st) in st.iter_mut().enumerate() {
                                attention::attend(isa, Flavour::of(isa), &q[h * hd..(h + 1) * hd], kb, vb, 16, 0.125, st, &mut acc[h * hd..(h + 1) * hd]);
                            }
                        }
                    }
                    for (h, st) in st.iter().enumerate() {
                        st.finish(&mut acc[h * hd..(h + 1) * hd]);
                    }
                })
            });
        }
    }
    // Two rows of one prompt (six heads over the same keys and values), as the model
    // attends a prompt's rows (elements: positions × heads).
    let rows = 2;
    let q2: Vec<f32> = values(rows * heads * hd, 6).iter().map(|v| f16::from_f32(*v).to_f32()).collect();
    group.throughput(Throughput::Elements((n * rows * heads) as u64));
    for isa in paths() {
        group.bench_function(BenchmarkId::new(format!("f16-hd{hd}-gqa{heads}-rows{rows}"), isa), |b| {
            let mut acc = vec![0f32; rows * heads * hd];
            b.iter(|| {
                let mut st = vec![Online::default(); rows * heads];
                acc.iter_mut().for_each(|a| *a = 0.0);
                for at in (0..n).step_by(16) {
                    let (kb, vb) = (&k[at * hd..(at + 16) * hd], &v[at * hd..(at + 16) * hd]);
                    attention::attend_heads(isa, Flavour::of(isa), &q2, kb, vb, 16, 0.125, &mut st, &mut acc);
                }
                for (h, st) in st.iter().enumerate() {
                    st.finish(&mut acc[h * hd..(h + 1) * hd]);
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_gemm, bench_attention);
criterion_main!(benches);
