//! The planner's mixed-integer program against exhaustive search, on 50 random clusters
//! of one to four devices: the same objective every time. The clusters are drawn so that
//! every regime shows up: devices left out, more than one round, devices that stream
//! their weights from disk, and clusters nothing fits.

use blink_cluster::plan::search;
use blink_cluster::{Cluster, Device, Link, ModelShape, PlanError};

/// SplitMix64: a seeded stream of numbers, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Log-uniform in [lo, hi).
    fn log_range(&mut self, lo: f64, hi: f64) -> f64 {
        self.range(lo.ln(), hi.ln()).exp()
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

const MIB: f64 = (1u64 << 20) as f64;

fn link(rng: &mut Rng) -> Link {
    Link { latency_s: rng.log_range(1e-4, 2e-2), bytes_per_s: rng.log_range(1e6, 1e9) }
}

fn cluster(rng: &mut Rng) -> Cluster {
    let n_layers = rng.pick(&[6, 8, 12, 16, 24, 30, 32]);
    let layer_bytes = rng.log_range(8.0 * MIB, 400.0 * MIB) as u64;
    let model = ModelShape {
        n_layers,
        layer_bytes,
        kv_layer_bytes: (layer_bytes as f64 * rng.range(0.0, 0.3)) as u64,
        head_bytes: (layer_bytes as f64 * rng.range(0.5, 4.0)) as u64,
        hidden_bytes: rng.pick(&[2304u64, 8192, 16384, 32768]),
    };
    let n = 1 + (rng.next() % 4) as usize;
    let model_bytes = (n_layers as u64 * (model.layer_bytes + model.kv_layer_bytes)) as f64;
    let devices = (0..n)
        .map(|i| Device {
            name: format!("dev{i}"),
            layer_s: rng.log_range(2e-4, 2e-2),
            // From a small share of the model (some devices then stream) to all of it.
            memory: (model_bytes * rng.log_range(0.05, 1.5) / n as f64 * 2.0) as u64,
            disk_bytes_per_s: rng.log_range(50e6, 3e9),
            link: link(rng),
        })
        .collect();
    let head = if rng.next().is_multiple_of(2) { Some(0) } else { None };
    let mut c = Cluster { model, devices, head, head_link: link(rng), head_s: rng.range(0.0, 5e-3), max_rounds: 4 };
    if let Some(h) = c.head {
        c.devices[h].memory += c.model.head_bytes;
    }
    c
}

#[test]
fn the_program_finds_what_exhaustive_search_finds() {
    let mut rng = Rng(0x5EED_2026);
    let (mut left_out, mut several_rounds, mut streaming, mut nothing_fits, mut planned) = (0, 0, 0, 0, 0);
    for case in 0..50 {
        let c = cluster(&mut rng);
        let want = search::best(&c).unwrap();
        let got = c.plan();
        match (want, got) {
            (None, Err(PlanError::DoesNotFit { .. })) => nothing_fits += 1,
            (Some(want), Ok(got)) => {
                let (a, b) = (got.predicted.total(), want.predicted.total());
                assert!((a - b).abs() <= 1e-9 * b.max(1e-3), "case {case}: the program's plan {got:?} takes {a} s, exhaustive search's {want:?} {b} s\n{c:#?}");
                planned += 1;
                left_out += usize::from(got.ring.windows().contains(&0));
                several_rounds += usize::from(got.ring.rounds() > 1);
                streaming += usize::from(got.predicted.disk_s > 0.0 || (0..c.devices.len()).any(|d| {
                    let held = got.ring.device_layers(d) as u64 * (c.model.layer_bytes + c.model.kv_layer_bytes);
                    held > c.devices[d].memory
                }));
            }
            (want, got) => panic!("case {case}: exhaustive search gives {want:?}, the program {got:?}\n{c:#?}"),
        }
    }
    eprintln!("{planned} planned ({left_out} leaving a device out, {several_rounds} over several rounds, {streaming} streaming weights), {nothing_fits} fitting nowhere");
    assert!(planned >= 30 && left_out > 0 && several_rounds > 0 && streaming > 0 && nothing_fits > 0, "the random clusters miss a regime");
}

#[test]
fn a_lost_device_is_planned_out_as_exhaustive_search_would() {
    let mut rng = Rng(0x1057_2026);
    let mut replanned = 0;
    for case in 0..50 {
        let c = cluster(&mut rng);
        let Ok(plan) = c.plan() else { continue };
        // Lose a device holding windows (not the head, which cannot be lost).
        let Some(lost) = (0..c.devices.len()).find(|&d| plan.ring.windows()[d] > 0 && Some(d) != c.head) else { continue };
        let rest = c.without(&[lost]);
        match (search::best(&rest).unwrap(), rest.plan()) {
            (None, Err(PlanError::DoesNotFit { .. })) => {}
            (Some(want), Ok(got)) => {
                assert_eq!(got.ring.windows()[lost], 0, "case {case}: the lost device {lost} still has a window: {got:?}");
                let (a, b) = (got.predicted.total(), want.predicted.total());
                assert!((a - b).abs() <= 1e-9 * b.max(1e-3), "case {case}: re-planned {got:?} takes {a} s, exhaustive search's {want:?} {b} s");
                replanned += 1;
            }
            (want, got) => panic!("case {case}: exhaustive search gives {want:?}, the program {got:?}"),
        }
    }
    assert!(replanned >= 10, "only {replanned} clusters re-planned");
}

#[test]
fn a_slow_link_leaves_a_device_out_and_a_fixed_plan_is_priced() {
    // Two equal devices, but the second sits behind a 50 ms link: one device alone is faster.
    let dev = |name: &str, latency_s: f64| Device { name: name.into(), layer_s: 1e-3, memory: 1 << 34, disk_bytes_per_s: 1e9, link: Link { latency_s, bytes_per_s: 1e8 } };
    let model = ModelShape { n_layers: 8, layer_bytes: 1 << 20, kv_layer_bytes: 1 << 16, head_bytes: 1 << 20, hidden_bytes: 4096 };
    let c = Cluster { model, devices: vec![dev("near", 1e-4), dev("far", 5e-2)], head: None, head_link: Link { latency_s: 1e-4, bytes_per_s: 1e8 }, head_s: 0.0, max_rounds: 2 };
    let plan = c.plan().unwrap();
    assert_eq!((plan.ring.windows(), plan.ring.rounds()), (&[8, 0][..], 1));
    let split = c.predict(&[4, 4], 1).unwrap();
    assert!(split.total() > plan.predicted.total() + 0.04, "{split:?} against {:?}", plan.predicted);
    assert!(matches!(c.predict(&[4, 3], 1), Err(PlanError::Infeasible(_))));
}
