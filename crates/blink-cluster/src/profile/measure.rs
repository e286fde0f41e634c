//! Measuring this device: one-row products of each weight type the model uses (over the
//! model's own matrices, more bytes than any cache), memory bandwidth, what memory this
//! process may have, and the disk the model is read from.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Instant;

use blink_kernels::gemm::{product, ActRows, Out, ROW_ALIGN};
use blink_kernels::quant::{quantize_row, WeightType};
use blink_model::Model;
use blink_runtime::numa::NodePool;
use blink_runtime::pool::SharedMut;

use super::memory::memory_now;
use super::{Memory, Profile, FORMAT, VERSION};

/// Repetitions of each measurement; the best is kept.
const REPEATS: usize = 5;
/// The most of the model's file the disk measurement reads.
const DISK_BYTES: u64 = 256 << 20;

/// Profile this device with `model` on `pool`; `disk` is [`disk_read_rate`] of the
/// model's file, measured before the model was loaded (a file this process maps keeps
/// its pages cached, and reading it would time the page cache).
pub fn measure(model: &Model, pool: &NodePool, disk: f64, cpu: &str) -> std::io::Result<Profile> {
    let bandwidth = blink_runtime::bandwidth::triad_gbs(pool.n_threads())? * 1e9;
    let mem = memory_now();
    Ok(Profile {
        format: FORMAT.into(),
        version: VERSION,
        cpu: cpu.into(),
        threads: pool.n_threads(),
        kernel: blink_kernels::cpu::active().name().into(),
        product_bytes_per_s: product_rates(model, pool),
        memory: Memory { bandwidth_bytes_per_s: bandwidth, ..mem },
        disk_read_bytes_per_s: disk,
        peers: Vec::new(),
    })
}

/// Weight bytes per second of one-row products, by weight type: every matrix of the type
/// in every layer and the output head, split by rows over the pool's threads, as a decode
/// step runs them.
fn product_rates(model: &Model, pool: &NodePool) -> BTreeMap<String, f64> {
    let (isa, order) = (blink_kernels::cpu::active(), blink_kernels::order::active());
    let mut by_type: BTreeMap<String, Vec<&blink_model::weights::Matrix>> = BTreeMap::new();
    for part in &model.parts {
        by_type.entry(part.output.ty.name().to_string()).or_default().push(&part.output);
        for l in part.layers.iter().flatten() {
            for m in l.matrices() {
                by_type.entry(m.ty.name().to_string()).or_default().push(m);
            }
        }
    }
    let mut rates = BTreeMap::new();
    for (ty, mats) in by_type {
        // One activation row per width, in each matrix's activation format.
        let acts: Vec<Vec<u8>> = mats
            .iter()
            .map(|m| {
                let act_ty = m.ty.activation_type();
                let x: Vec<f32> = (0..m.cols).map(|i| ((i * 7919) % 113) as f32 / 113.0 - 0.5).collect();
                let mut a = vec![0u8; act_ty.row_bytes(m.cols as u64).unwrap_or(0) as usize];
                quantize_row(act_ty, &x, &mut a);
                a
            })
            .collect();
        let rows_total: usize = mats.iter().map(|m| m.rows).sum();
        let mut out = vec![0f32; rows_total];
        let shared = SharedMut::new(&mut out);
        let bytes: usize = mats.iter().map(|m| m.bytes().len()).sum();
        let mut best = f64::MAX;
        for _ in 0..REPEATS {
            let t = Instant::now();
            pool.run(|w| {
                let mut base = 0;
                for (m, a) in mats.iter().zip(&acts) {
                    let rows = w.share(m.rows, ROW_ALIGN);
                    let act = ActRows { ty: m.ty.activation_type(), bytes: a, stride: a.len(), count: 1, forms: &[] };
                    // SAFETY: each thread writes its own rows of this matrix's slice of `out`.
                    unsafe {
                        product(isa, order, &m.mat_ref(), &act, std::iter::once(rows), Out { ptr: shared.as_mut_ptr().add(base), ld: m.rows, accumulate: false });
                    }
                    base += m.rows;
                }
            });
            best = best.min(t.elapsed().as_secs_f64());
        }
        std::hint::black_box(&out);
        rates.insert(ty, bytes as f64 / best);
    }
    rates
}

/// Bytes per second read from `path` with its cached pages dropped first (up to
/// [`DISK_BYTES`] of it, in 4 MiB reads). Pages some process maps stay cached, so call
/// it before mapping the file.
pub fn disk_read_rate(path: &Path) -> std::io::Result<f64> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len().min(DISK_BYTES);
    // SAFETY: a plain advice call on an open descriptor; failure only leaves pages cached.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    let mut buf = vec![0u8; 4 << 20];
    let (mut read, t) = (0u64, Instant::now());
    while read < len {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        read += n as u64;
    }
    Ok(read as f64 / t.elapsed().as_secs_f64().max(1e-9))
}
