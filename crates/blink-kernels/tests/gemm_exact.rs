//! Every SIMD path of `gemm` returns exactly the scalar reference's bits, on random blocks,
//! for every supported type, dot order, tile shape and write mode. Paths this CPU lacks are reported
//! and skipped by name; the scalar path always runs.

use blink_gguf::GgmlType;
use blink_kernels::cpu::Isa;
use blink_kernels::gemm::{pack, product, tiling, ActRows, Layout, MatRef, Out, RowForm, ROW_ALIGN};
use blink_kernels::order::DotOrder;
use blink_kernels::quant::{quantize_row, WeightType};
use proptest::prelude::*;

const TYPES: [GgmlType; 7] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::MXFP4];

/// Types whose SIMD kernels read the row-major layout.
const ROW_MAJOR: [GgmlType; 16] = {
    use GgmlType::*;
    [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, F32, F16, BF16]
};

/// A xorshift stream (seeds differing only in bit 0 give the same stream).
fn stream(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// `n` finite values of assorted magnitudes (2^-6 .. 2^4 times up to ±10), full mantissas.
fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut next = stream(seed);
    (0..n)
        .map(|_| {
            let r = next();
            ((r % 20001) as f32 - 10000.0) * 1e-3 * 2f32.powi((r >> 40) as i32 % 11 - 6)
        })
        .collect()
}

/// Random row-major weights: k-quant blocks of random bytes with small finite f16 `d` (and
/// `dmin`); float rows of random finite values.
fn random_row_major(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut next = stream(seed);
    let n_bytes = ty.row_bytes((rows * cols) as u64).unwrap() as usize;
    let (d, dmin) = match ty {
        GgmlType::Q2_K => (80, Some(82)),
        GgmlType::Q3_K => (108, None),
        GgmlType::Q4_K | GgmlType::Q5_K => (0, Some(2)),
        GgmlType::Q6_K => (208, None),
        GgmlType::IQ4_XS => (0, None),
        GgmlType::TQ1_0 => (52, None),
        GgmlType::TQ2_0 => (64, None),
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ3_XXS | GgmlType::IQ3_S => (0, None),
        _ => {
            let mut out = vec![0u8; n_bytes];
            quantize_row(ty, &random_values(rows * cols, next()), &mut out);
            return out;
        }
    };
    let mut out: Vec<u8> = (0..n_bytes).map(|_| next() as u8).collect();
    for block in out.chunks_exact_mut(ty.type_size()) {
        for at in std::iter::once(d).chain(dmin) {
            let v = half::f16::from_f32(((next() % 2000) as f32 - 1000.0) * 1e-5);
            block[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    out
}

/// Random but valid blocks: random quant bytes, small finite f16 scale fields.
fn random_weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let n_blocks = rows * cols / 32;
    let mut out = Vec::with_capacity(n_blocks * ty.type_size());
    for _ in 0..n_blocks {
        let mut block: Vec<u8> = (0..ty.type_size()).map(|_| next() as u8).collect();
        let scale = |r: u64| half::f16::from_f32(((r % 2000) as f32 - 1000.0) * 1e-5).to_bits().to_le_bytes();
        if ty == GgmlType::MXFP4 {
            // An exponent of 2^-16..2^-4, now and then one of the two subnormal ones.
            let r = next();
            block[0] = if r % 16 == 0 { (r / 16 % 2) as u8 } else { 112 + (r / 16 % 13) as u8 };
            out.extend_from_slice(&block);
            continue;
        }
        block[..2].copy_from_slice(&scale(next()));
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            block[2..4].copy_from_slice(&scale(next()));
        }
        out.extend_from_slice(&block);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn run(isa: Isa, order: DotOrder, ty: GgmlType, layout: Layout, w: &[u8], rows: usize, cols: usize, act: &[u8], stride: usize, n_act: usize, accumulate: bool) -> Vec<f32> {
    run_grouped(isa, order, ty, layout, w, (rows, cols), (act, stride, n_act, &[]), accumulate)
}

/// [`run`] with activation rows computed as llama.cpp does in a group of four or a tiled
/// product (`forms`).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn run_grouped(isa: Isa, order: DotOrder, ty: GgmlType, layout: Layout, w: &[u8], (rows, cols): (usize, usize), (act, stride, n_act, forms): (&[u8], usize, usize, &[RowForm]), accumulate: bool) -> Vec<f32> {
    let mut out: Vec<f32> = (0..n_act * rows).map(|i| i as f32 * 0.25).collect();
    let o = Out { ptr: out.as_mut_ptr(), ld: rows, accumulate };
    // Ranges that start mid-matrix: one call for the first third, then one call for the
    // rest in chunks of a group, last first (as threads claiming chunks may take them).
    let mid = (rows / 3).next_multiple_of(ROW_ALIGN).min(rows);
    let chunks: Vec<_> = (mid..rows).step_by(ROW_ALIGN).map(|r| r..(r + ROW_ALIGN).min(rows)).rev().collect();
    let m = MatRef { ty, layout, rows, cols, bytes: w };
    let a = ActRows { ty: m.activation_type(), bytes: act, stride, count: n_act, forms };
    unsafe {
        product(isa, order, &m, &a, std::iter::once(0..mid), o);
        product(isa, order, &m, &a, chunks, o);
    }
    out
}

fn paths() -> Vec<Isa> {
    for isa in Isa::SIMD.iter().filter(|i| !i.supported()) {
        eprintln!("note: this CPU has no {isa} path; not exercised here");
    }
    Isa::simd_supported()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn simd_gemm_equals_scalar(ty_i in 0usize..7, block in any::<bool>(), rows in 1usize..27, blocks in 1usize..9, n_act in 1usize..16, seed in any::<u64>(), accumulate in any::<bool>()) {
        let ty = TYPES[ty_i];
        let order = if block { DotOrder::Block } else { DotOrder::Llama };
        let cols = blocks * 32;
        let w = random_weights(ty, rows, cols, seed);
        let act_ty = ty.activation_type();
        let stride = act_ty.row_bytes(cols as u64).unwrap() as usize + 7;
        let mut act = vec![0u8; n_act * stride];
        let mut s = seed.rotate_left(17) | 1;
        for r in 0..n_act {
            let x: Vec<f32> = (0..cols).map(|_| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; ((s % 20001) as f32 - 10000.0) * 1e-3 }).collect();
            quantize_row(act_ty, &x, &mut act[r * stride..r * stride + stride - 7]);
        }
        let want = run(Isa::Scalar, order, ty, Layout::RowMajor, &w, rows, cols, &act, stride, n_act, accumulate);
        let packed = pack::pack(ty, rows, cols, &w).unwrap();
        let same = |got: &[f32]| got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        let got = run(Isa::Scalar, order, ty, Layout::Packed, &packed, rows, cols, &act, stride, n_act, accumulate);
        prop_assert!(same(&got), "scalar packed {ty} {order}: {:?} vs scalar {:?}", got, want);
        for isa in paths() {
            let got = run(isa, order, ty, Layout::Packed, &packed, rows, cols, &act, stride, n_act, accumulate);
            prop_assert!(same(&got), "{isa} {ty} {order}: {:?} vs scalar {:?}", got, want);
            // Row-major: packed a group at a time on the fly (x86), or read as it is.
            let got = run(isa, order, ty, Layout::RowMajor, &w, rows, cols, &act, stride, n_act, accumulate);
            prop_assert!(same(&got), "{isa} {ty} {order} row-major: {:?} vs scalar {:?}", got, want);
        }
    }
}

/// `n` rows of `cols` random values in `ty`'s activation format, each row different, and
/// their stride.
fn random_activations(ty: GgmlType, cols: usize, n: usize, seed: u64) -> (Vec<u8>, usize) {
    let act_ty = ty.activation_type();
    let stride = act_ty.row_bytes(cols as u64).unwrap() as usize;
    let mut act = vec![0u8; n * stride];
    for r in 0..n {
        // Seeds two apart: the stream ignores bit 0.
        quantize_row(act_ty, &random_values(cols, seed + 2 * r as u64), &mut act[r * stride..(r + 1) * stride]);
    }
    (act, stride)
}

/// Every SIMD path this CPU has, on both layouts (`w` row-major, `packed`), adds exactly
/// the scalar definition's products to the outputs; `context` names the case.
fn assert_paths_equal_scalar(ty: GgmlType, order: DotOrder, (rows, cols): (usize, usize), (w, packed): (&[u8], &[u8]), (act, stride, n_act): (&[u8], usize, usize), context: &str) {
    let want = run(Isa::Scalar, order, ty, Layout::RowMajor, w, rows, cols, act, stride, n_act, true);
    for isa in paths() {
        for (layout, m) in [(Layout::Packed, packed), (Layout::RowMajor, w)] {
            let got = run(isa, order, ty, layout, m, rows, cols, act, stride, n_act, true);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa} {ty} {order} {layout:?}, {context}");
        }
    }
}

/// Many activation rows against a tiny L2 and L3 (and L1): the rows go in panels of 12
/// (and a short last one), the weights in blocks of one group (and the k-quants' in
/// chunks of one tile), and every result is still the scalar definition's, in every order
/// and layout.
/// (Other tests running meanwhile see the small panels too; their results cannot change.)
#[test]
fn activation_panels_do_not_change_results() {
    let before = (tiling::l2_bytes(), tiling::l3_bytes());
    // 12-row panels; weight blocks of one group (one 16 KiB chunk for the k-quants).
    tiling::set_l2_bytes(1 << 10);
    tiling::set_l3_bytes(1 << 10);
    // 43 rows: the first call's 16 rows span two blocks. Five blocks a row: with a 1 KiB
    // L1 the 32-element formats' tiles go over them in chunks of one or two (the k-cut),
    // a first, middle and last chunk.
    let (rows, cols, n_act) = (43, 160, 41);
    assert_eq!(tiling::panel_rows(180, tiling::l2_bytes()), tiling::MIN_PANEL_ROWS);
    let own_l1 = tiling::l1_bytes();
    for l1 in [own_l1, 1 << 10] {
        tiling::set_l1_bytes(l1);
        assert_eq!(tiling::k_chunk_blocks(5, 8 * 20, 36, 2, l1) < 5, l1 < own_l1);
        for (i, &ty) in TYPES.iter().enumerate() {
            let w = random_weights(ty, rows, cols, 7 + i as u64);
            let (act, stride) = random_activations(ty, cols, n_act, 100);
            let packed = pack::pack(ty, rows, cols, &w).unwrap();
            for order in [DotOrder::Llama, DotOrder::Block] {
                assert_paths_equal_scalar(ty, order, (rows, cols), (&w, &packed), (&act, stride, n_act), &format!("{l1} bytes of L1"));
            }
        }
    }
    tiling::set_l1_bytes(own_l1);
    // The k-quants' row-major kernels, 256-column rows: enough of them for two 64-row
    // chunks in the first call, each a block; then with a 1 KiB L1, chunks of a row (or
    // a tile's rows).
    let (rows, cols) = (400, 256);
    let own_l1 = tiling::l1_bytes();
    for l1 in [own_l1, 1 << 10] {
        tiling::set_l1_bytes(l1);
        for (i, ty) in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q2_K].into_iter().enumerate() {
            let w = random_row_major(ty, rows, cols, 70 + i as u64);
            let (act, stride) = random_activations(ty, cols, n_act, 200);
            let grouped: Vec<RowForm> = (0..n_act).map(|r| RowForm { grouped: r % 3 == 0, tiled: r % 5 < 3 }).collect();
            let want = run_grouped(Isa::Scalar, DotOrder::Llama, ty, Layout::RowMajor, &w, (rows, cols), (&act, stride, n_act, &grouped), true);
            for isa in paths() {
                let got = run_grouped(isa, DotOrder::Llama, ty, Layout::RowMajor, &w, (rows, cols), (&act, stride, n_act, &grouped), true);
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa} {ty} with {l1} bytes of L1");
            }
        }
    }
    tiling::set_l1_bytes(own_l1);
    tiling::set_l2_bytes(before.0);
    tiling::set_l3_bytes(before.1);
}

/// The int16 route (`Q8_0` on plain AVX2, from 12 activation rows) over each count of rows
/// its tiles leave over: 12 to 15 rows are none to three after the block order's four-row
/// tiles (which then take them in one tile), none or one after llama.cpp's order's pairs;
/// with whole weight groups, and with a 1 KiB L1 in chunks of a block (first, middle and
/// last). Both orders and layouts give the scalar definition's bits.
#[test]
fn int16_route_tiles_equal_scalar() {
    let ty = GgmlType::Q8_0;
    let (rows, cols) = (19, 160);
    let w = random_weights(ty, rows, cols, 31);
    let packed = pack::pack(ty, rows, cols, &w).unwrap();
    let own_l1 = tiling::l1_bytes();
    for l1 in [own_l1, 1 << 10] {
        tiling::set_l1_bytes(l1);
        for n_act in 12..16 {
            let (act, stride) = random_activations(ty, cols, n_act, 300 + 2 * n_act as u64);
            for order in [DotOrder::Llama, DotOrder::Block] {
                assert_paths_equal_scalar(ty, order, (rows, cols), (&w, &packed), (&act, stride, n_act), &format!("{n_act} rows, {l1} bytes of L1"));
            }
        }
    }
    tiling::set_l1_bytes(own_l1);
}

/// The largest sums a kernel can meet: every quant at its largest magnitude against
/// activations all at ±127, over tiles of every width. A kernel that adds 16-bit partial
/// sums (plain AVX2's block order) overflows here first if its bound is wrong.
#[test]
fn extreme_blocks_equal_scalar() {
    use GgmlType::*;
    // Each type's header bytes (scales), then the quant byte that makes every quant as
    // large as it goes: nibbles 15 (and fifth bits set), Q8_0's −128, IQ4_NL's −127 (index
    // 0), MXFP4's 12 (index 7).
    let extremes = [(Q4_0, 2, 0xff), (Q4_1, 4, 0xff), (Q5_0, 2, 0xff), (Q5_1, 4, 0xff), (Q8_0, 2, 0x80), (IQ4_NL, 2, 0x00), (MXFP4, 1, 0x77)];
    let (rows, cols) = (19, 4 * 32);
    for (ty, header, fill) in extremes {
        let mut w = random_weights(ty, rows, cols, 7);
        for block in w.chunks_exact_mut(ty.type_size()) {
            block[header..].fill(fill);
        }
        let act_ty = ty.activation_type();
        let stride = act_ty.row_bytes(cols as u64).unwrap() as usize;
        for sign in [1.0f32, -1.0] {
            for n_act in [1, 2, 3, 4, 5, 7, 13] {
                let mut act = vec![0u8; n_act * stride];
                for r in 0..n_act {
                    quantize_row(act_ty, &vec![sign * 3.5; cols], &mut act[r * stride..(r + 1) * stride]);
                }
                for order in [DotOrder::Llama, DotOrder::Block] {
                    let want = run(Isa::Scalar, order, ty, Layout::RowMajor, &w, rows, cols, &act, stride, n_act, false);
                    let packed = pack::pack(ty, rows, cols, &w).unwrap();
                    for isa in paths() {
                        for (layout, m) in [(Layout::Packed, &packed), (Layout::RowMajor, &w)] {
                            let got = run(isa, order, ty, layout, m, rows, cols, &act, stride, n_act, false);
                            let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "{isa} {ty} {order} {layout:?}, {n_act} rows of {sign}: {got:?} vs scalar {want:?}");
                        }
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// k-quants (whole super-blocks) and float rows (any length, so the leftover elements
    /// past the last whole step are covered) over the row-major layout.
    #[test]
    fn simd_row_major_gemm_equals_scalar(ty_i in 0usize..16, rows in 1usize..27, len in 1usize..300, n_act in 1usize..14, seed in any::<u64>(), accumulate in any::<bool>()) {
        let ty = ROW_MAJOR[ty_i];
        let cols = if ty.block_size() == 256 { 256 * (1 + len % 4) } else { len };
        let w = random_row_major(ty, rows, cols, seed);
        let act_ty = ty.activation_type();
        let stride = act_ty.row_bytes(cols as u64).unwrap() as usize + 5;
        let mut act = vec![0u8; n_act * stride];
        for r in 0..n_act {
            let x = random_values(cols, seed.rotate_left(17) ^ (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            quantize_row(act_ty, &x, &mut act[r * stride..r * stride + stride - 5]);
        }
        // Some rows as llama.cpp computes them in a group of four (Q4_K tells them apart),
        // and runs of rows as it does in a tiled product (Q5_K, Q6_K, IQ4_XS).
        let grouped: Vec<RowForm> = (0..n_act).map(|r| RowForm { grouped: (seed >> (r % 64)) & 1 == 1, tiled: (seed >> (32 + r / 3 % 32)) & 1 == 1 }).collect();
        let want = run_grouped(Isa::Scalar, DotOrder::Llama, ty, Layout::RowMajor, &w, (rows, cols), (&act, stride, n_act, &grouped), accumulate);
        // The super-block formats with an interleaved layout: on the scalar path (its
        // reference over packed rows) and every SIMD path.
        let packed = pack::pack(ty, rows, cols, &w);
        let packed_paths = if packed.is_some() { [vec![Isa::Scalar], paths()].concat() } else { vec![] };
        for isa in paths() {
            let got = run_grouped(isa, DotOrder::Llama, ty, Layout::RowMajor, &w, (rows, cols), (&act, stride, n_act, &grouped), accumulate);
            let bad = got.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
            prop_assert!(bad.is_none(), "{isa} {ty} rows={rows} cols={cols} n_act={n_act}: first difference at {bad:?}: {:?} vs scalar {:?}",
                bad.map(|i| got[i]), bad.map(|i| want[i]));
        }
        for isa in packed_paths {
            let got = run_grouped(isa, DotOrder::Llama, ty, Layout::Packed, packed.as_deref().unwrap(), (rows, cols), (&act, stride, n_act, &grouped), accumulate);
            let bad = got.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
            prop_assert!(bad.is_none(), "{isa} {ty} packed rows={rows} cols={cols} n_act={n_act}: first difference at {bad:?}: {:?} vs scalar {:?}",
                bad.map(|i| got[i]), bad.map(|i| want[i]));
        }
    }
}

/// The super-block formats' largest sums, packed and row-major: every quant at its
/// largest magnitude (and every scale and min at its largest) against activations all at
/// one extreme, over tiles of every width. A tile that adds too many 16-bit partial sums
/// before its scales (`Q4_K`: eight, `Q5_K`: four) overflows here first.
#[test]
fn extreme_super_blocks_equal_scalar() {
    use GgmlType::*;
    // Each type's bytes past `d` (and `dmin`) as one fill: nibbles 15 and fifth bits set,
    // scales and mins 63 (0xff in the packed scale bytes); Q6_K's quants 63 (0xff) and −32
    // (0x00) with its scales at 127 (0x7f); IQ4_XS's index 0 (−127) under scales of 31.
    let extremes = [(Q4_K, 4, 0xff), (Q5_K, 4, 0xff), (Q6_K, 0, 0xff), (Q6_K, 0, 0x00), (IQ4_XS, 2, 0x00), (IQ4_XS, 2, 0xff)];
    let (rows, cols) = (13, 3 * 256);
    for (ty, header, fill) in extremes {
        let mut w = random_row_major(ty, rows, cols, 9);
        for block in w.chunks_exact_mut(ty.type_size()) {
            let d = if ty == Q6_K { block[208..].to_vec() } else { block[..header].to_vec() };
            block.fill(fill);
            if ty == Q6_K {
                block[192..208].fill(0x7f);
                block[208..].copy_from_slice(&d);
            } else {
                block[..header].copy_from_slice(&d);
            }
        }
        let packed = pack::pack(ty, rows, cols, &w).unwrap();
        let act_ty = ty.activation_type();
        let stride = act_ty.row_bytes(cols as u64).unwrap() as usize;
        for x in [3.5f32, -3.5] {
            for n_act in [1, 2, 3, 4, 5, 9] {
                let mut act = vec![0u8; n_act * stride];
                for r in 0..n_act {
                    // One value a little larger than the rest: it alone becomes −128.
                    let v: Vec<f32> = (0..cols).map(|e| if e % 97 == 0 { x * 1.01 } else { x }).collect();
                    quantize_row(act_ty, &v, &mut act[r * stride..(r + 1) * stride]);
                }
                let grouped: Vec<RowForm> = (0..n_act).map(|r| RowForm { grouped: r % 2 == 0, tiled: r >= 2 }).collect();
                let want = run_grouped(Isa::Scalar, DotOrder::Llama, ty, Layout::RowMajor, &w, (rows, cols), (&act, stride, n_act, &grouped), false);
                for isa in paths() {
                    for (layout, m) in [(Layout::Packed, &packed), (Layout::RowMajor, &w)] {
                        let got = run_grouped(isa, DotOrder::Llama, ty, layout, m, (rows, cols), (&act, stride, n_act, &grouped), false);
                        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{isa} {ty} fill {fill:#x} {layout:?}, {n_act} rows of {x}: {got:?} vs scalar {want:?}");
                    }
                }
            }
        }
    }
}

/// A `Q4_K` row computed as in a group of four adds its sums per 64 elements: the float
/// result differs from the row alone's (on most random rows), the other types' do not.
#[test]
fn only_q4_k_rows_tell_a_group_of_four_apart() {
    use blink_kernels::quant::{vec_dot_grouped, vec_dot_in};
    for ty in ROW_MAJOR.into_iter().filter(|t| t.block_size() == 256) {
        let cols = 1024;
        let mut differ = 0;
        for seed in 1..20u64 {
            let w = random_row_major(ty, 1, cols, seed);
            let mut act = vec![0u8; ty.activation_type().row_bytes(cols as u64).unwrap() as usize];
            quantize_row(ty.activation_type(), &random_values(cols, seed * 7 + 3), &mut act);
            let (alone, grouped) = (vec_dot_in(DotOrder::Llama, ty, cols, &w, &act), vec_dot_grouped(DotOrder::Llama, ty, cols, &w, &act));
            differ += usize::from(alone.to_bits() != grouped.to_bits());
            assert!((alone - grouped).abs() <= 1e-3 * alone.abs().max(1.0), "{ty}: {alone} alone, {grouped} grouped");
        }
        if ty == GgmlType::Q4_K {
            assert!(differ > 0, "Q4_K: a group of four never changed a bit in 19 rows");
        } else {
            assert_eq!(differ, 0, "{ty} has one order");
        }
    }
}

