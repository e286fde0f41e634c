//! Dev tool: packed GEMM speed on the active kernel path and dot order (`BLINK_KERNEL`,
//! `BLINK_DOT_ORDER`), with the weights in cache (one matrix reused) against streamed from
//! memory (100 copies in turn, or the 28 MB output matrix).
//! `cargo run --release -p blink-kernels --example gemm_stream`; `COLS=1536` changes the
//! matrices' width (default 576), `ACTS=1,4,16` the activation row counts (default 1,16),
//! `ROW_MAJOR=1` leaves the matrices as the file has them (packed a group at a time on the
//! fly), `TYPES=Q5_0,Q4_0` times one in-cache matrix of each of those types instead,
//! `COPIES=100` streams that many copies of each `TYPES` matrix in turn (from memory),
//! `L2_KIB=512` sizes the activation panels for that L2 instead of this CPU's (a huge one:
//! no panels), `L3_KIB` the weight blocks likewise, `TILED=1` marks every activation row
//! tiled (llama.cpp's products of eight rows or more).

use blink_gguf::GgmlType;
use blink_kernels::gemm::{prepare, product, ActRows, Layout, MatRef, Out, RowForm};
use blink_kernels::quant::{quantize_row, quantize_weights, WeightType};

#[path = "../benches/support/mod.rs"]
mod support;
use support::values;

fn main() {
    let isa = blink_kernels::cpu::active();
    let order = blink_kernels::order::active();
    println!("{isa}, {order} order");
    let env = |name: &str| std::env::var(name).ok();
    let cols: usize = env("COLS").map_or(576, |v| v.parse().expect("COLS: a number of columns"));
    assert!(cols.is_multiple_of(32), "COLS: a multiple of 32");
    if let Some(kib) = env("L2_KIB") {
        blink_kernels::gemm::tiling::set_l2_bytes(kib.parse::<usize>().expect("L2_KIB: a number of KiB") << 10);
    }
    if let Some(kib) = env("L3_KIB") {
        blink_kernels::gemm::tiling::set_l3_bytes(kib.parse::<usize>().expect("L3_KIB: a number of KiB") << 10);
    }
    println!("activation panels sized for {} KiB of L2, weight blocks for {} KiB of L3", blink_kernels::gemm::tiling::l2_bytes() >> 10, blink_kernels::gemm::tiling::l3_bytes() >> 10);
    let acts: Vec<usize> = env("ACTS").map_or(vec![1, 16], |v| v.split(',').map(|n| n.parse().expect("ACTS: counts like 1,4,16")).collect());
    let cases = match env("TYPES") {
        // One in-cache matrix of each named type.
        Some(names) => {
            let copies: usize = env("COPIES").map_or(1, |v| v.parse().expect("COPIES: a number of copies"));
            names.split(',').map(|n| (GgmlType::ALL.into_iter().find(|t| t.name() == n).unwrap_or_else(|| panic!("TYPES: unknown type {n}")), 1536, copies)).collect()
        }
        None => vec![(GgmlType::Q4_1, 1536, 1), (GgmlType::Q4_1, 1536, 100), (GgmlType::Q8_0, 1536, 1), (GgmlType::Q8_0, 49152, 1)],
    };
    for (ty, rows, copies) in cases {
        let mut w = vec![0u8; ty.row_bytes((rows * cols) as u64).unwrap() as usize];
        quantize_weights(ty, &values(rows * cols, 1), &mut w).unwrap();
        let row_major = env("ROW_MAJOR").is_some();
        let layout = if row_major { Layout::RowMajor } else { Layout::Packed };
        let packed: Vec<Vec<u8>> = (0..copies)
            .map(|_| if row_major { w.clone() } else { prepare(isa, ty, rows, cols, &w).expect("a SIMD path that packs") })
            .collect();
        let act_ty = ty.activation_type();
        let stride = act_ty.row_bytes(cols as u64).unwrap() as usize;
        for &n_act in &acts {
            let mut act = vec![0u8; n_act * stride];
            let x = values(n_act * cols, 2);
            for r in 0..n_act {
                quantize_row(
                    act_ty,
                    &x[r * cols..(r + 1) * cols],
                    &mut act[r * stride..(r + 1) * stride],
                );
            }
            let mut out = vec![0f32; n_act * rows];
            let forms = vec![RowForm { grouped: false, tiled: env("TILED").is_some() }; n_act];
            let reps = (2_000_000_000 / (rows * cols * n_act)).max(copies * 3);
            let mut times = vec![];
            for _ in 0..5 {
                let t = std::time::Instant::now();
                let a = ActRows { ty: act_ty, bytes: &act, stride, count: n_act, forms: &forms };
                for i in 0..reps {
                    let m = MatRef { ty, layout, rows, cols, bytes: &packed[i % copies] };
                    unsafe {
                        product(isa, order, &m, &a, std::iter::once(0..rows), Out { ptr: out.as_mut_ptr(), ld: rows, accumulate: false })
                    }
                }
                times.push((rows * cols * n_act * reps) as f64 / t.elapsed().as_secs_f64() / 1e9);
            }
            times.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!(
                "{ty} rows {rows} copies {copies} n_act {n_act}: {:.1} GMAC/s (median of 5)",
                times[2]
            );
        }
    }
}
