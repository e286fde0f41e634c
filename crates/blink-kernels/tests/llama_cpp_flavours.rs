//! Blink's two flavours of llama.cpp's float definitions against llama.cpp's own functions,
//! from each of its x86 builds (fixture `tests/fixtures/ggml_flavours.bkf`, recorded by
//! `make_flavour_fixtures.py` from the AVX-512 and the AVX2 build of 0c1e57098): the f16
//! and f32 dot products (flash attention's scores, an f32 router's), SwiGLU and softmax's
//! `exp` and sum, bit for bit, on every kernel path this CPU has. The two builds disagree
//! on some cases of each, so each flavour is held to its own build.

mod common;

use blink_kernels::cpu::Isa;
use blink_kernels::flavour::Flavour;
use blink_kernels::ops;
use blink_kernels::quant::float::{f16_bits_to_f32, quantize_f32};
use blink_kernels::quant::reduce::{dot_float, Tail};
use common::{to_f32s, Fixture};

fn u32s(bytes: &[u8]) -> Vec<usize> {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as usize).collect()
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks_exact(2).map(|c| u16::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Equal bits, or both NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The cases of a record set: each case's operands (`n` elements) from `x` and `y`.
fn cases<'a, T>(ns: &'a [usize], x: &'a [T], y: &'a [T]) -> impl Iterator<Item = (usize, &'a [T], &'a [T])> + 'a {
    let mut at = 0;
    ns.iter().map(move |&n| {
        at += n;
        (n, &x[at - n..at], &y[at - n..at])
    })
}

/// Per flavour, the cases where `got` (Blink's) is not llama.cpp's, and whether the two
/// builds differ anywhere.
fn check(fx: &Fixture, op: &str, got: impl Fn(Flavour) -> Vec<f32>) {
    let builds: Vec<Vec<f32>> = Flavour::ALL.iter().map(|f| fx.f32s(&format!("{op}/{}", f.name()))).collect();
    assert!(builds[0].iter().zip(&builds[1]).any(|(a, b)| !same(*a, *b)), "{op}: the builds agree everywhere, so this checks no flavour");
    for (f, want) in Flavour::ALL.into_iter().zip(&builds) {
        let got = got(f);
        assert_eq!(got.len(), want.len(), "{op} {f}");
        let bad: Vec<usize> = (0..got.len()).filter(|&i| !same(got[i], want[i])).collect();
        assert!(bad.is_empty(), "{op} {f}: {} of {} values differ from llama.cpp's {} build, first at {}: {:e} vs {:e}", bad.len(), got.len(), f.name(), bad[0], got[bad[0]], want[bad[0]]);
    }
}

#[test]
fn f16_dots_are_each_builds() {
    let fx = Fixture::load("ggml_flavours.bkf");
    let (ns, x, y) = (u32s(fx.bytes("dot_f16/n")), u16s(fx.bytes("dot_f16/x")), u16s(fx.bytes("dot_f16/y")));
    check(&fx, "dot_f16", |f| cases(&ns, &x, &y).map(|(n, x, y)| dot_float(f, n, |i| f16_bits_to_f32(x[i]), |i| f16_bits_to_f32(y[i]), Tail::F64)).collect());
}

#[test]
fn f32_dots_are_each_builds() {
    let fx = Fixture::load("ggml_flavours.bkf");
    let (ns, x, y) = (u32s(fx.bytes("dot_f32/n")), fx.f32s("dot_f32/x"), fx.f32s("dot_f32/y"));
    check(&fx, "dot_f32", |f| cases(&ns, &x, &y).map(|(n, x, y)| dot_float(f, n, |i| x[i], |i| y[i], Tail::F32)).collect());
    // The router's dot, on rows as bytes, is the same definition.
    check(&fx, "dot_f32", |f| {
        cases(&ns, &x, &y)
            .map(|(n, x, y)| {
                let (mut xb, mut yb) = (vec![0u8; 4 * n], vec![0u8; 4 * n]);
                quantize_f32(x, &mut xb);
                quantize_f32(y, &mut yb);
                blink_kernels::quant::float::dot_f32_in(f, n, &xb, &yb)
            })
            .collect()
    });
}

#[test]
fn swiglu_is_each_builds_on_every_path() {
    let fx = Fixture::load("ggml_flavours.bkf");
    let (ns, x, g) = (u32s(fx.bytes("swiglu/n")), fx.f32s("swiglu/x"), fx.f32s("swiglu/g"));
    for isa in std::iter::once(Isa::Scalar).chain(Isa::simd_supported()) {
        check(&fx, "swiglu", |f| {
            cases(&ns, &x, &g)
                .flat_map(|(_, x, g)| {
                    let mut gate = x.to_vec();
                    ops::swiglu(isa, f, &mut gate, g);
                    gate
                })
                .collect()
        });
    }
}

#[test]
fn softmax_is_each_builds() {
    let fx = Fixture::load("ggml_flavours.bkf");
    let (ns, x) = (u32s(fx.bytes("softmax/n")), fx.f32s("softmax/x"));
    let run = |f: Flavour| -> (Vec<f32>, Vec<f64>) {
        let (mut ys, mut sums) = (Vec::new(), Vec::new());
        for (_, x, _) in cases(&ns, &x, &x) {
            let mut y = x.to_vec();
            let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            sums.push(ops::soft_max_exp(f, &mut y, max));
            ys.extend(y);
        }
        (ys, sums)
    };
    check(&fx, "softmax", |f| run(f).0);
    for f in Flavour::ALL {
        let want: Vec<u64> = fx.bytes(&format!("softmax/{}_sum", f.name())).chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        let got: Vec<u64> = run(f).1.iter().map(|s| s.to_bits()).collect();
        assert_eq!(got, want, "softmax sums, {f}");
    }
    let _ = to_f32s;
}
