//! Every kernel path computes exactly its scalar definition in both flavours of llama.cpp's
//! float definitions (`blink_kernels::flavour`): attention over an f16 cache (the scores'
//! order is the flavour's) and SwiGLU (the flavour's `exp`), on random shapes, values and
//! blockings. Paths this CPU lacks are reported, not exercised.

mod common;

use blink_kernels::attention::{self, Online};
use blink_kernels::cpu::Isa;
use blink_kernels::flavour::Flavour;
use blink_kernels::ops;
use common::Rng;
use half::f16;
use proptest::prelude::*;

fn paths() -> Vec<Isa> {
    for isa in Isa::SIMD.into_iter().filter(|i| !i.supported()) {
        eprintln!("note: this CPU has no {isa} path; not exercised here");
    }
    Isa::simd_supported()
}

fn flavour(i: usize) -> Flavour {
    Flavour::ALL[i % Flavour::ALL.len()]
}

/// `heads` query heads over `n` positions fed in blocks ending at `splits`: the heads
/// together (`attend_heads`), or each alone on the scalar path.
#[allow(clippy::too_many_arguments)]
fn attend(isa: Isa, f: Flavour, heads: usize, q: &[f32], k: &[f16], v: &[f16], n: usize, splits: &[usize]) -> Vec<u32> {
    let hd = q.len() / heads;
    let mut qr = vec![0f32; q.len()];
    attention::prepare_query::<f16>(q, &mut qr);
    let (mut acc, mut st) = (vec![0f32; q.len()], vec![Online::default(); heads]);
    let mut at = 0;
    for &end in splits.iter().filter(|&&s| s > 0 && s < n).chain([&n]) {
        if end <= at {
            continue;
        }
        let (kb, vb) = (&k[at * hd..end * hd], &v[at * hd..end * hd]);
        if isa == Isa::Scalar {
            for (h, st) in st.iter_mut().enumerate() {
                attention::attend(isa, f, &qr[h * hd..(h + 1) * hd], kb, vb, end - at, 0.125, st, &mut acc[h * hd..(h + 1) * hd]);
            }
        } else {
            attention::attend_heads(isa, f, &qr, kb, vb, end - at, 0.125, &mut st, &mut acc);
        }
        at = end;
    }
    for (h, st) in st.iter().enumerate() {
        st.finish(&mut acc[h * hd..(h + 1) * hd]);
    }
    acc.iter().map(|x| x.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn attention_paths_equal_scalar_in_each_flavour(
        hd_i in 0usize..8, heads in 1usize..10, n in 1usize..49, seed in any::<u64>(), f_i in 0usize..2,
        split_a in 0usize..49, split_b in 0usize..49, spread in 0usize..3,
    ) {
        let hd = [16, 32, 48, 64, 80, 96, 128, 256][hd_i];
        let f = flavour(f_i);
        let mut rng = Rng::new(seed);
        // Scores from near-equal to one-sided, values up to the top of f16's range.
        let (qs, vs) = [(0.3, 1.0), (3.0, 1.0), (1.0, 30000.0)][spread];
        let q: Vec<f32> = (0..heads * hd).map(|_| rng.normal() * qs).collect();
        let k: Vec<f16> = (0..n * hd).map(|_| f16::from_f32(rng.normal())).collect();
        let v: Vec<f16> = (0..n * hd).map(|_| f16::from_f32(rng.normal() * vs)).collect();
        let mut splits = [split_a, split_b];
        splits.sort();
        let want = attend(Isa::Scalar, f, heads, &q, &k, &v, n, &[]);
        for isa in paths() {
            prop_assert_eq!(&attend(isa, f, heads, &q, &k, &v, n, &splits), &want, "{} {} hd {} heads {} n {}", isa, f, hd, heads, n);
        }
    }

    #[test]
    fn swiglu_paths_equal_scalar_in_each_flavour(len in 1usize..400, seed in any::<u64>(), f_i in 0usize..2, scale in 0usize..3) {
        let f = flavour(f_i);
        let mut rng = Rng::new(seed);
        let s = [1.0, 10.0, 60.0][scale];
        let mut gate: Vec<f32> = (0..len).map(|_| rng.normal() * s).collect();
        // Arguments past the `exp` routines' common range, in random lanes.
        for &x in &[-200.0f32, -100.0, 89.0, 127.5, -131.0, f32::INFINITY, f32::NEG_INFINITY] {
            let at = (rng.next_u64() % len as u64) as usize;
            gate[at] = x;
        }
        let up: Vec<f32> = (0..len).map(|_| rng.normal()).collect();
        let mut want = gate.clone();
        ops::swiglu(Isa::Scalar, f, &mut want, &up);
        for isa in paths() {
            let mut got = gate.clone();
            ops::swiglu(isa, f, &mut got, &up);
            let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
            prop_assert!(same, "{} {} len {}", isa, f, len);
        }
    }
}
