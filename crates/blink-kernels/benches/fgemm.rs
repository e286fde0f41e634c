//! The float products of training ([`blink_kernels::fgemm`]) at the shapes of a 576-wide
//! model with 512 tokens: frozen weights read as `Wᵀ` (forward) and `W` (backward), row-major
//! and interleaved, a vocabulary chunk of the output head, and plain f32 both ways, on every
//! SIMD path this CPU has (the scalar one is the oracle, not a contender).
//! Throughput is in floating-point operations (2 · m · n · k), so `Gelem/s` reads GFLOP/s.
//!
//! `cargo bench -p blink-kernels --bench fgemm` (add `-- Q4_1` to filter).

use blink_gguf::GgmlType;
use blink_kernels::cpu::Isa;
use blink_kernels::fgemm::{fgemm, BSource, FgemmScratch, OutF32};
use blink_kernels::gemm::{pack, Layout, MatRef};
use blink_kernels::quant::quantize_weights;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;

mod support;
use support::values;

fn paths() -> Vec<Isa> {
    Isa::simd_supported()
}

/// A quantized `rows × cols` weight, row-major and (where the type has it) interleaved.
struct Weight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
    packed: Option<Vec<u8>>,
}

impl Weight {
    fn new(ty: GgmlType, rows: usize, cols: usize) -> Weight {
        let mut bytes = vec![0u8; ty.row_bytes((rows * cols) as u64).unwrap() as usize];
        quantize_weights(ty, &values(rows * cols, 1), &mut bytes).unwrap();
        let packed = pack::pack(ty, rows, cols, &bytes);
        Weight { ty, rows, cols, bytes, packed }
    }

    fn layouts(&self) -> Vec<(&'static str, MatRef<'_>)> {
        let mut out = vec![("rowmajor", MatRef { ty: self.ty, layout: Layout::RowMajor, rows: self.rows, cols: self.cols, bytes: &self.bytes })];
        if let Some(p) = &self.packed {
            out.push(("packed", MatRef { ty: self.ty, layout: Layout::Packed, rows: self.rows, cols: self.cols, bytes: p }));
        }
        out
    }
}

/// One product `C[m][n] = A[m][k] · B` per iteration, on every path.
fn bench_one(c: &mut Criterion, name: &str, m: usize, depth: usize, b: BSource, n: usize) {
    let mut group = c.benchmark_group("fgemm");
    group.sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500));
    group.throughput(Throughput::Elements((2 * m * n * depth) as u64));
    let a = values(m * depth, 2);
    let mut out = vec![0f32; m * n];
    let mut s = FgemmScratch::default();
    for isa in paths() {
        group.bench_function(BenchmarkId::new(format!("{name}/{m}x{depth}x{n}"), isa), |bench| {
            bench.iter(|| unsafe { fgemm(isa, &a, depth, m, depth, b, 0..n, OutF32 { ptr: out.as_mut_ptr(), ld: n, accumulate: false }, &mut s) })
        });
    }
    group.finish();
}

fn bench_fgemm(c: &mut Criterion) {
    let (m, e, ff) = (512, 576, 1536);
    // Forward through W (1536 × 576) and backward through W (1536 rows, 576 columns) and its
    // transpose-shaped sibling (576 × 1536, as the down projection's W).
    let up = Weight::new(GgmlType::Q4_1, ff, e);
    let down = Weight::new(GgmlType::Q4_1, e, ff);
    for (layout, w) in up.layouts() {
        bench_one(c, &format!("Q4_1-WT-{layout}"), m, e, BSource::WeightT(w), ff);
        bench_one(c, &format!("Q4_1-W-{layout}"), m, ff, BSource::Weight(w), e);
    }
    for (layout, w) in down.layouts() {
        bench_one(c, &format!("Q4_1-W-{layout}"), m, e, BSource::Weight(w), ff);
    }
    // The output head: a 4096-row chunk of the vocabulary against 128 rows.
    let head = Weight::new(GgmlType::Q8_0, 4096, e);
    for (layout, w) in head.layouts() {
        bench_one(c, &format!("Q8_0-WT-{layout}"), 128, e, BSource::WeightT(w), 4096);
    }
    // A k-quant (dequantized by the scalar code, transposed with SIMD).
    let kq = Weight::new(GgmlType::Q4_K, ff, 768);
    for (layout, w) in kq.layouts() {
        bench_one(c, &format!("Q4_K-WT-{layout}"), m, 768, BSource::WeightT(w), ff);
    }
    let f = values(e * ff, 3);
    bench_one(c, "F32", m, e, BSource::F32 { data: &f, ld: ff }, ff);
    bench_one(c, "F32T", m, e, BSource::F32T { data: &f, ld: e }, ff);
}

criterion_group!(benches, bench_fgemm);
criterion_main!(benches);
