//! Training attention against finite differences and a float64 softmax, and every path
//! against the portable one, bit for bit.

use super::*;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 1000) as f32 / 500.0 - 1.0).collect()
}

/// The loss `Σ out ⊙ w` for given q, k, v, in f64 through f32 forward.
fn loss(len: usize, d: usize, q: &[f32], k: &[f32], v: &[f32], w: &[f32]) -> f64 {
    let (mut out, mut lse, mut s) = (vec![0f32; len * d], vec![0f32; len], vec![0f32; len]);
    let r = |b: &[f32]| Rows { ptr: b.as_ptr() as *mut f32, stride: d };
    unsafe { forward(len, d, 0.3, r(q), r(k), r(v), Rows { ptr: out.as_mut_ptr(), stride: d }, Rows { ptr: lse.as_mut_ptr(), stride: 1 }, &mut s) };
    out.iter().zip(w).map(|(&o, &w)| o as f64 * w as f64).sum()
}

#[test]
fn gradients_match_differences() {
    let (len, d) = (5, 4);
    let (q, k, v, w) = (values(len * d, 1), values(len * d, 2), values(len * d, 3), values(len * d, 4));
    let (mut out, mut lse, mut s) = (vec![0f32; len * d], vec![0f32; len], vec![0f32; len]);
    let r = |b: &[f32]| Rows { ptr: b.as_ptr() as *mut f32, stride: d };
    let (mut dq, mut dk, mut dv) = (vec![0f32; len * d], vec![0f32; len * d], vec![0f32; len * d]);
    unsafe {
        forward(len, d, 0.3, r(&q), r(&k), r(&v), Rows { ptr: out.as_mut_ptr(), stride: d }, Rows { ptr: lse.as_mut_ptr(), stride: 1 }, &mut s);
        backward(len, d, 0.3, (r(&q), r(&k), r(&v)), (r(&out), Rows { ptr: lse.as_mut_ptr(), stride: 1 }), r(&w), (r(&dq), r(&dk), r(&dv)), &mut s);
    }
    let _ = (&mut dq, &mut dk, &mut dv);
    for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
        for i in 0..len * d {
            let h = 1e-3f32;
            let bump = |delta: f32| {
                let (mut q2, mut k2, mut v2) = (q.clone(), k.clone(), v.clone());
                [&mut q2, &mut k2, &mut v2][which][i] += delta;
                loss(len, d, &q2, &k2, &v2, &w)
            };
            let want = (bump(h) - bump(-h)) / (2.0 * h as f64);
            assert!((grad[i] as f64 - want).abs() < 2e-3, "input {which} element {i}: {} vs {want}", grad[i]);
        }
    }
}


fn paths() -> Vec<Path> {
    #[allow(unused_mut)]
    let mut p = vec![Path::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        use blink_kernels::cpu::Isa;
        if Isa::Avx2.supported() {
            p.push(Path::Avx2);
        }
        if Isa::Avx512Vnni.supported() {
            p.push(Path::Avx512);
        }
    }
    p
}

/// Forward (out, lse) and backward (dq, dk, dv from nonzero starts) on `path`, with
/// rows `stride` apart.
fn run(path: Path, len: usize, d: usize, stride: usize, seed: u32) -> [Vec<f32>; 5] {
    let n = len * stride;
    let (q, k, v, w) = (values(n, seed), values(n, seed + 1), values(n, seed + 2), values(n, seed + 3));
    let (mut out, mut lse) = (vec![0f32; n], vec![0f32; len * 3]);
    let (mut dq, mut dk, mut dv) = (vec![0f32; n], values(n, seed + 4), values(n, seed + 5));
    let r = |b: &[f32]| Rows { ptr: b.as_ptr() as *mut f32, stride };
    let l = |b: &[f32]| Rows { ptr: b.as_ptr() as *mut f32, stride: 3 };
    let scale = 1.0 / (d as f32).sqrt();
    unsafe {
        forward_on(path, len, d, scale, r(&q), r(&k), r(&v), Rows { ptr: out.as_mut_ptr(), stride }, Rows { ptr: lse.as_mut_ptr(), stride: 3 });
        backward_on(path, len, d, scale, (r(&q), r(&k), r(&v)), (r(&out), l(&lse)), r(&w), (Rows { ptr: dq.as_mut_ptr(), stride }, Rows { ptr: dk.as_mut_ptr(), stride }, Rows { ptr: dv.as_mut_ptr(), stride }));
    }
    [out, lse, dq, dk, dv]
}

const SHAPES: [(usize, usize); 11] = [(1, 64), (3, 64), (5, 64), (17, 64), (50, 64), (131, 64), (7, 128), (33, 128), (20, 4), (45, 80), (16, 32)];

#[test]
fn every_path_gives_the_same_bits() {
    for (len, d) in SHAPES {
        let stride = d + 3;
        let want = run(Path::Portable, len, d, stride, 7);
        for path in paths() {
            let got = run(path, len, d, stride, 7);
            for (which, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()), "{path:?} len {len} d {d}: output {which} differs");
            }
        }
    }
}

#[test]
fn forward_matches_a_float64_softmax() {
    for (len, d) in SHAPES {
        let (stride, seed) = (d, 11);
        let n = len * stride;
        let (q, k, v) = (values(n, seed), values(n, seed + 1), values(n, seed + 2));
        let [out, lse, ..] = run(Path::active(), len, d, stride, seed);
        let scale = 1.0 / (d as f64).sqrt();
        for i in 0..len {
            let s: Vec<f64> = (0..=i).map(|j| (0..d).map(|c| q[i * d + c] as f64 * k[j * d + c] as f64).sum::<f64>() * scale).collect();
            let max = s.iter().cloned().fold(f64::MIN, f64::max);
            let sum: f64 = s.iter().map(|x| (x - max).exp()).sum();
            assert!((lse[i * 3] as f64 - (max + sum.ln())).abs() < 1e-5, "len {len} d {d} row {i}: lse {} vs {}", lse[i * 3], max + sum.ln());
            for c in 0..d {
                let want: f64 = (0..=i).map(|j| (s[j] - max).exp() / sum * v[j * d + c] as f64).sum();
                assert!((out[i * d + c] as f64 - want).abs() < 1e-5, "len {len} d {d} out[{i}][{c}]: {} vs {want}", out[i * d + c]);
            }
        }
    }
}

#[test]
fn gradients_of_full_heads_match_differences() {
    let (len, d) = (6, 64);
    let (q, k, v, w) = (values(len * d, 5), values(len * d, 6), values(len * d, 7), values(len * d, 8));
    let (mut out, mut lse) = (vec![0f32; len * d], vec![0f32; len]);
    let r = |b: &[f32]| Rows { ptr: b.as_ptr() as *mut f32, stride: d };
    let (dq, dk, dv) = (vec![0f32; len * d], vec![0f32; len * d], vec![0f32; len * d]);
    let scale = 0.125;
    let loss = |q: &[f32], k: &[f32], v: &[f32]| {
        let (mut out, mut lse) = (vec![0f32; len * d], vec![0f32; len]);
        unsafe { forward(len, d, scale, r(q), r(k), r(v), Rows { ptr: out.as_mut_ptr(), stride: d }, Rows { ptr: lse.as_mut_ptr(), stride: 1 }, &mut []) };
        out.iter().zip(&w).map(|(&o, &w)| o as f64 * w as f64).sum::<f64>()
    };
    unsafe {
        forward(len, d, scale, r(&q), r(&k), r(&v), Rows { ptr: out.as_mut_ptr(), stride: d }, Rows { ptr: lse.as_mut_ptr(), stride: 1 }, &mut []);
        backward(len, d, scale, (r(&q), r(&k), r(&v)), (r(&out), Rows { ptr: lse.as_mut_ptr(), stride: 1 }), r(&w), (r(&dq), r(&dk), r(&dv)), &mut []);
    }
    for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
        for i in 0..len * d {
            let h = 1e-2f32;
            let bump = |delta: f32| {
                let (mut q2, mut k2, mut v2) = (q.clone(), k.clone(), v.clone());
                [&mut q2, &mut k2, &mut v2][which][i] += delta;
                loss(&q2, &k2, &v2)
            };
            let want = (bump(h) - bump(-h)) / (2.0 * h as f64);
            assert!((grad[i] as f64 - want).abs() < 2e-3, "input {which} element {i}: {} vs {want}", grad[i]);
        }
    }
}

/// `cargo test --release -p blink-model --lib attention_speed -- --ignored --nocapture`
#[test]
#[ignore = "a timing benchmark, not a check: run by hand with --ignored on a quiet machine"]
fn attention_speed() {
    let all = paths();
    // The portable path is the definition; on x86 without FMA it is far from a contender.
    let timed: Vec<Path> = if all.len() > 1 { all[1..].to_vec() } else { all };
    for len in [64, 128, 512] {
        let d = 64;
        for &path in &timed {
            let mut best = (f64::MAX, f64::MAX);
            for _ in 0..7 {
                let t = std::time::Instant::now();
                let reps = (1 << 20) / (len * len) + 1;
                for _ in 0..reps {
                    run_timed(path, len, d, &mut best);
                }
                let _ = t;
            }
            // Multiply-adds: forward 2·len²/2·d, backward 5·len²/2·d (scores, dout·v, dq, dk, dv).
            let (fwd, bwd) = (len * len * d, 5 * len * len * d / 2);
            println!("len {len:4} d {d} {path:?}: forward {:8.1} µs ({:5.1} GFLOP/s), backward {:8.1} µs ({:5.1} GFLOP/s)", best.0 * 1e6, 2.0 * fwd as f64 / best.0 / 1e9, best.1 * 1e6, 2.0 * bwd as f64 / best.1 / 1e9);
        }
    }
}

fn run_timed(path: Path, len: usize, d: usize, best: &mut (f64, f64)) {
    let n = len * d;
    let (q, k, v, w) = (values(n, 1), values(n, 2), values(n, 3), values(n, 4));
    let (mut out, mut lse) = (vec![0f32; n], vec![0f32; len]);
    let (mut dq, mut dk, mut dv) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    let r = |b: &[f32]| Rows { ptr: b.as_ptr() as *mut f32, stride: d };
    let m = |b: &mut [f32], s: usize| Rows { ptr: b.as_mut_ptr(), stride: s };
    unsafe {
        let t = std::time::Instant::now();
        forward_on(path, len, d, 0.125, r(&q), r(&k), r(&v), m(&mut out, d), m(&mut lse, 1));
        best.0 = best.0.min(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        backward_on(path, len, d, 0.125, (r(&q), r(&k), r(&v)), (r(&out), m(&mut lse, 1)), r(&w), (m(&mut dq, d), m(&mut dk, d), m(&mut dv, d)));
        best.1 = best.1.min(t.elapsed().as_secs_f64());
    }
}
