//! `vec_dot(w, quantize_row(x))` must equal the plain dot product of the dequantized rows,
//! up to float rounding, for every weight type and dot order, both for quantized
//! real-looking data and for arbitrary bit patterns.
//!
//! Error model: the integer sums are exact, so the kernel only rounds a few products per
//! block and the running sum over `nb` blocks. The bound used is `(nb + 4)·2⁻²⁴·M` where
//! `M = Σ|a_i|·(|w_i| + |z_i|)` and `z` is the row dequantized with all quant bits cleared
//! (the block's offset/scale magnitude, which the kernel's partial terms can reach even
//! when `w_i` cancels to near zero). For float rows it is the recursive-summation bound
//! `(n + 2)·2⁻²⁴·Σ|w_i·a_i|`.
//!
//! Two intended differences: `Q4_1`/`Q5_1` use the `Q8_1` sum field `s = f16(d·Σq)` rather
//! than `f16(d)·Σq`, so per block they differ from the dequantized dot by
//! `m_w·(s - f16(d)·Σq)`; and `IQ4_XS` multiplies as llama.cpp's sign trick does, so an
//! activation of −128 against a negative table value gives the product's negation. Both
//! amounts are added to the bound (computed from the blocks).

mod common;

use blink_gguf::GgmlType;
use blink_kernels::quant::{
    dequantize_row, quantize_row, quantize_weights, vec_dot_in, Block, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockTQ1_0, BlockTQ2_0, BlockQ2K,
    BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K,
    BlockQ8_0, BlockQ8_1, WeightType,
};
use blink_kernels::order::DotOrder;
use common::{row_bytes, Rng};
use half::f16;
use proptest::prelude::*;

const EPS: f64 = 1.0 / (1u64 << 24) as f64;

/// Rewrite every block of `row` with `f`.
fn map_blocks<B: Block>(row: &mut [u8], mut f: impl FnMut(&mut B)) {
    for chunk in row.chunks_exact_mut(B::BYTES) {
        let mut b = B::read(chunk);
        f(&mut b);
        b.write(chunk);
    }
}

/// The row with all quant bits cleared (scales, mins and offsets kept).
fn clear_quants(ty: GgmlType, row: &[u8]) -> Vec<u8> {
    let mut r = row.to_vec();
    use GgmlType::*;
    match ty {
        Q4_0 => map_blocks(&mut r, |b: &mut BlockQ4_0| b.qs = [0; 16]),
        Q4_1 => map_blocks(&mut r, |b: &mut BlockQ4_1| b.qs = [0; 16]),
        Q5_0 => map_blocks(&mut r, |b: &mut BlockQ5_0| (b.qs, b.qh) = ([0; 16], [0; 4])),
        Q5_1 => map_blocks(&mut r, |b: &mut BlockQ5_1| (b.qs, b.qh) = ([0; 16], [0; 4])),
        Q8_0 => map_blocks(&mut r, |b: &mut BlockQ8_0| b.qs = [127; 32]),
        Q8_1 => map_blocks(&mut r, |b: &mut BlockQ8_1| b.qs = [127; 32]),
        Q2_K => map_blocks(&mut r, |b: &mut BlockQ2K| b.qs = [0; 64]),
        Q3_K => map_blocks(&mut r, |b: &mut BlockQ3K| {
            (b.qs, b.hmask) = ([0; 64], [0; 32])
        }),
        Q4_K => map_blocks(&mut r, |b: &mut BlockQ4K| b.qs = [0; 128]),
        Q5_K => map_blocks(&mut r, |b: &mut BlockQ5K| {
            (b.qs, b.qh) = ([0; 128], [0; 32])
        }),
        Q6_K => map_blocks(&mut r, |b: &mut BlockQ6K| {
            (b.ql, b.qh) = ([0; 128], [0; 64])
        }),
        Q8_K => map_blocks(&mut r, |b: &mut BlockQ8K| b.qs = [127; 256]),
        // No offset: the smallest table value (1) stands for a cleared quant.
        IQ4_NL => map_blocks(&mut r, |b: &mut BlockIQ4NL| b.qs = [0x88; 16]),
        IQ4_XS => map_blocks(&mut r, |b: &mut BlockIQ4XS| b.qs = [0x88; 128]),
        MXFP4 => map_blocks(&mut r, |b: &mut BlockMXFP4| b.qs = [0; 16]),
        // Every trit 1 (a zero weight).
        TQ1_0 => map_blocks(&mut r, |b: &mut BlockTQ1_0| (b.qs, b.qh) = ([128; 48], [127; 4])),
        TQ2_0 => map_blocks(&mut r, |b: &mut BlockTQ2_0| b.qs = [0x55; 64]),
        // Grid magnitudes are never zero: the bound takes the weights themselves.
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S => {}
        F32 | F16 | BF16 => {}
    }
    r
}

/// `Σ 2·|w_i·a_i|` over the `IQ4_XS` elements whose table value is negative against an
/// activation quant of −128 (the sign trick's wrap); 0 for other types.
fn sign_trick_allowance(ty: GgmlType, w: &[u8], act: &[u8], wf: &[f32], af: &[f32]) -> f64 {
    use GgmlType::*;
    if matches!(ty, IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S) {
        // An element is negative where its weight's sign differs from the block scale's
        // (`d`, the f16 at each block's start).
        let bytes = ty.type_size();
        return (0..wf.len())
            .filter(|&e| {
                let d = f16::from_le_bytes([w[e / 256 * bytes], w[e / 256 * bytes + 1]]).to_f32();
                act[e / 256 * 292 + 4 + e % 256] as i8 == -128 && (wf[e] < 0.0) != (d < 0.0)
            })
            .map(|e| 2.0 * (wf[e] as f64 * af[e] as f64).abs())
            .sum();
    }
    if ty != GgmlType::IQ4_XS {
        return 0.0;
    }
    let mut total = 0.0;
    for (b, (wb, ab)) in w.chunks_exact(136).map(BlockIQ4XS::read).zip(act.chunks_exact(292).map(BlockQ8K::read)).enumerate() {
        for e in 0..256 {
            let (g, k) = (e / 32, e % 32);
            let index = if k < 16 { wb.qs[16 * g + k] & 0x0f } else { wb.qs[16 * g + k - 16] >> 4 };
            if index < 8 && ab.qs[e] == -128 {
                total += 2.0 * (wf[256 * b + e] as f64 * af[256 * b + e] as f64).abs();
            }
        }
    }
    total
}

/// `Σ |m_w|·|s_a - f16(d_a)·Σq_a|` for the `_1` formats, 0 otherwise.
fn q8_1_sum_allowance(ty: GgmlType, w: &[u8], act: &[u8]) -> f64 {
    let mins: Vec<f32> = match ty {
        GgmlType::Q4_1 => w
            .chunks_exact(20)
            .map(|c| BlockQ4_1::read(c).m.to_f32())
            .collect(),
        GgmlType::Q5_1 => w
            .chunks_exact(24)
            .map(|c| BlockQ5_1::read(c).m.to_f32())
            .collect(),
        _ => return 0.0,
    };
    mins.iter()
        .zip(act.chunks_exact(36).map(BlockQ8_1::read))
        .map(|(&m, a)| {
            let sum: i32 = a.qs.iter().map(|&q| q as i32).sum();
            (m as f64).abs() * (a.s.to_f32() as f64 - a.d.to_f32() as f64 * sum as f64).abs()
        })
        .sum()
}

/// Check one weight row against one activation row (quantized here from `x`).
fn check_dot(ty: GgmlType, w: &[u8], x: &[f32]) {
    let n = x.len();
    let act_ty = ty.activation_type();
    let mut act = vec![0u8; row_bytes(act_ty, n)];
    quantize_row(act_ty, x, &mut act);

    let (mut wf, mut zf, mut af) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    dequantize_row(ty, w, &mut wf);
    dequantize_row(ty, &clear_quants(ty, w), &mut zf);
    dequantize_row(act_ty, &act, &mut af);
    let want: f64 = wf.iter().zip(&af).map(|(&p, &q)| p as f64 * q as f64).sum();

    let bound = if ty.is_quantized() {
        let m: f64 = (0..n)
            .map(|i| (af[i] as f64).abs() * ((wf[i] as f64).abs() + (zf[i] as f64).abs()))
            .sum();
        (n / ty.block_size() + 4) as f64 * EPS * m + (q8_1_sum_allowance(ty, w, &act) + sign_trick_allowance(ty, w, &act, &wf, &af)) * (1.0 + 1e-6)
    } else {
        (n + 2) as f64
            * EPS
            * wf.iter()
                .zip(&af)
                .map(|(&p, &q)| (p as f64 * q as f64).abs())
                .sum::<f64>()
    };
    for order in [DotOrder::Llama, DotOrder::Block] {
        let got = vec_dot_in(order, ty, n, w, &act) as f64;
        assert!(
            (got - want).abs() <= bound + f64::MIN_POSITIVE,
            "{ty} n={n} {order}: vec_dot {got} vs dequantized dot {want} (diff {:e}, bound {bound:e})",
            (got - want).abs()
        );
    }
}

const WEIGHT_TYPES: [GgmlType; 25] = GgmlType::ALL;

fn gaussian(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.normal() * scale).collect()
}

/// A valid row of random bytes: quants arbitrary, f16 scale fields finite and moderate.
fn random_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let mut row: Vec<u8> = (0..row_bytes(ty, n))
        .map(|_| rng.next_u64() as u8)
        .collect();
    let mut h = || f16::from_f32((rng.uniform() - 0.5) * 0.02);
    use GgmlType::*;
    match ty {
        F32 => {
            let x = gaussian(&mut Rng::new(rng_seed(&row[..])), n, 1.0);
            row = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        }
        F16 => row
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&h().to_le_bytes())),
        BF16 => row.chunks_exact_mut(2).for_each(|c| c[1] &= 0xbf), // exponent < 0x80: finite, |v| < 2
        Q4_0 => map_blocks(&mut row, |b: &mut BlockQ4_0| b.d = h()),
        Q4_1 => map_blocks(&mut row, |b: &mut BlockQ4_1| (b.d, b.m) = (h(), h())),
        Q5_0 => map_blocks(&mut row, |b: &mut BlockQ5_0| b.d = h()),
        Q5_1 => map_blocks(&mut row, |b: &mut BlockQ5_1| (b.d, b.m) = (h(), h())),
        Q8_0 => map_blocks(&mut row, |b: &mut BlockQ8_0| b.d = h()),
        Q8_1 => map_blocks(&mut row, |b: &mut BlockQ8_1| (b.d, b.s) = (h(), h())),
        Q2_K => map_blocks(&mut row, |b: &mut BlockQ2K| (b.d, b.dmin) = (h(), h())),
        Q3_K => map_blocks(&mut row, |b: &mut BlockQ3K| b.d = h()),
        Q4_K => map_blocks(&mut row, |b: &mut BlockQ4K| (b.d, b.dmin) = (h(), h())),
        Q5_K => map_blocks(&mut row, |b: &mut BlockQ5K| (b.d, b.dmin) = (h(), h())),
        Q6_K => map_blocks(&mut row, |b: &mut BlockQ6K| b.d = h()),
        IQ4_NL => map_blocks(&mut row, |b: &mut BlockIQ4NL| b.d = h()),
        IQ4_XS => map_blocks(&mut row, |b: &mut BlockIQ4XS| b.d = h()),
        // Scales 2^-16..2^-4, now and then one of the subnormal two.
        TQ1_0 => map_blocks(&mut row, |b: &mut BlockTQ1_0| b.d = h()),
        IQ2_XXS => map_blocks(&mut row, |b: &mut BlockIQ2XXS| b.d = h()),
        IQ2_XS => map_blocks(&mut row, |b: &mut BlockIQ2XS| b.d = h()),
        IQ2_S => map_blocks(&mut row, |b: &mut BlockIQ2S| b.d = h()),
        IQ3_XXS => map_blocks(&mut row, |b: &mut BlockIQ3XXS| b.d = h()),
        IQ3_S => map_blocks(&mut row, |b: &mut BlockIQ3S| b.d = h()),
        TQ2_0 => map_blocks(&mut row, |b: &mut BlockTQ2_0| b.d = h()),
        MXFP4 => map_blocks(&mut row, |b: &mut BlockMXFP4| b.e = if b.e < 8 { b.e % 2 } else { 112 + b.e % 13 }),
        Q8_K => map_blocks(&mut row, |b: &mut BlockQ8K| {
            b.d = (rng_seed(&b.qs[..]) % 1000) as f32 * 1e-5;
            for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
                *s = g.iter().map(|&q| q as i16).sum();
            }
        }),
    }
    row
}

fn rng_seed(bytes: &[impl Copy + Into<i64>]) -> u64 {
    bytes.iter().fold(17u64, |h, &b| {
        h.wrapping_mul(31).wrapping_add(b.into() as u64)
    })
}

#[test]
fn quantized_weights_dot_matches_dequantized() {
    let mut rng = Rng::new(1);
    for ty in WEIGHT_TYPES {
        for (i, &n) in [256usize, 512, 1024, 4096].iter().enumerate() {
            let x = gaussian(&mut rng, n, 0.05 * (i + 1) as f32);
            let mut w = vec![0u8; row_bytes(ty, n)];
            quantize_weights(ty, &x, &mut w).unwrap();
            check_dot(ty, &w, &gaussian(&mut rng, n, 1.0));
            // Outliers and a zero block in the activations.
            let mut a = gaussian(&mut rng, n, 3.0);
            a[..256].fill(0.0);
            a[n - 1] = 400.0;
            check_dot(ty, &w, &a);
        }
    }
}

#[test]
fn random_bit_patterns_dot_matches_dequantized() {
    let mut rng = Rng::new(2);
    for ty in WEIGHT_TYPES {
        for _ in 0..20 {
            let w = random_row(&mut rng, ty, 1024);
            let x = gaussian(&mut rng, 1024, 2.0);
            check_dot(ty, &w, &x);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn prop_dot_matches_dequantized(
        type_index in 0usize..17,
        superblocks in 1usize..5,
        seed in any::<u64>(),
        w_scale in 1e-3f32..10.0,
        a_scale in 1e-3f32..100.0,
    ) {
        let ty = WEIGHT_TYPES[type_index];
        let n = 256 * superblocks;
        let mut rng = Rng::new(seed);
        let x = gaussian(&mut rng, n, w_scale);
        let mut w = vec![0u8; row_bytes(ty, n)];
        quantize_weights(ty, &x, &mut w).unwrap();
        check_dot(ty, &w, &gaussian(&mut rng, n, a_scale));
        check_dot(ty, &random_row(&mut rng, ty, n), &gaussian(&mut rng, n, a_scale));
    }
}

/// `quantize_row` writes exactly `row_bytes(n)` bytes, whatever the buffer size.
#[test]
fn quantize_row_writes_exactly_row_bytes() {
    let x = gaussian(&mut Rng::new(3), 512, 1.0);
    for ty in GgmlType::ALL {
        let rb = row_bytes(ty, 512);
        let mut buf = vec![0xa5u8; rb + 7];
        quantize_row(ty, &x, &mut buf);
        assert!(
            buf[rb..].iter().all(|&b| b == 0xa5),
            "{ty} wrote past its row"
        );
        let mut exact = vec![0u8; rb];
        quantize_row(ty, &x, &mut exact);
        assert_eq!(exact, buf[..rb], "{ty}");
    }
}
