//! AVX-512 and AVX2 micro-kernels: a tile of rows × [`NR`](super::NR) columns of `C` in
//! registers, one broadcast of `A` and one fused multiply-add per column vector for each
//! `k`, the same chain as the scalar definition. `A` comes from its packed micro-panel
//! (`[k][rows]`), or (`D`) from its rows in place.
//! Edge panels load and store `C` under a mask, and skip column vectors wholly past the
//! live columns.

use std::arch::x86_64::*;

use super::Tile;

/// Rows of the AVX-512 tile: 24 of the 32 registers accumulate, two hold `B`'s row.
pub(super) const MR_512: usize = 12;
/// Rows of the AVX2 tile: 12 of the 16 registers accumulate.
pub(super) const MR_256: usize = 3;

/// Every row of `t`, [`MR_512`] at a time (on one column vector if that holds the live
/// columns).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn rows_avx512(t: &Tile, m: usize) {
    match (t.live <= 16, !t.packed) {
        (true, false) => rows512::<1, false>(t, m),
        (false, false) => rows512::<2, false>(t, m),
        (true, true) => rows512::<1, true>(t, m),
        (false, true) => rows512::<2, true>(t, m),
    }
}

#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn rows512<const V: usize, const D: bool>(t: &Tile, m: usize) {
    let mut r = 0;
    while r + MR_512 <= m {
        tile512::<MR_512, V, D>(t, r);
        r += MR_512;
    }
    macro_rules! rest {
        ($($n:literal)*) => {
            match m - r {
                $($n => tile512::<$n, V, D>(t, r),)*
                _ => {}
            }
        };
    }
    rest!(1 2 3 4 5 6 7 8 9 10 11);
}

/// Lanes of the two column vectors that are live (`live ≤ 32`).
#[inline(always)]
fn masks16(live: usize) -> [u16; 2] {
    let lanes = |n: usize| if n >= 16 { u16::MAX } else { (1u16 << n) - 1 };
    [lanes(live), lanes(live.saturating_sub(16))]
}

#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn tile512<const R: usize, const V: usize, const D: bool>(t: &Tile, r0: usize) {
    let mask = masks16(t.live);
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    if t.load {
        for (r, acc) in acc.iter_mut().enumerate() {
            let c = t.c.add((r0 + r) * t.ldc);
            *acc = std::array::from_fn(|v| _mm512_maskz_loadu_ps(mask[v], c.add(16 * v)));
        }
    }
    let mut a = t.a.add(r0 * t.kc);
    let rows: [*const f32; R] = std::array::from_fn(|r| t.a.add((r0 + r) * t.lda));
    let mut b = t.b;
    for k in 0..t.kc {
        let bv: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(b.add(16 * v)));
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(if D { *rows[r].add(k) } else { *a.add(r) });
            for v in 0..V {
                acc[v] = _mm512_fmadd_ps(x, bv[v], acc[v]);
            }
        }
        a = a.add(R);
        b = b.add(t.ldb);
    }
    for (r, acc) in acc.iter().enumerate() {
        let c = t.c.add((r0 + r) * t.ldc);
        for v in 0..V {
            _mm512_mask_storeu_ps(c.add(16 * v), mask[v], acc[v]);
        }
    }
}

/// Every row of `t`, [`MR_256`] at a time.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows_avx2(t: &Tile, m: usize) {
    match (t.live.div_ceil(8), !t.packed) {
        (1, false) => rows256::<1, false>(t, m),
        (2, false) => rows256::<2, false>(t, m),
        (3, false) => rows256::<3, false>(t, m),
        (_, false) => rows256::<4, false>(t, m),
        (1, true) => rows256::<1, true>(t, m),
        (2, true) => rows256::<2, true>(t, m),
        (3, true) => rows256::<3, true>(t, m),
        (_, true) => rows256::<4, true>(t, m),
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rows256<const V: usize, const D: bool>(t: &Tile, m: usize) {
    let mut r = 0;
    while r + MR_256 <= m {
        tile256::<MR_256, V, D>(t, r);
        r += MR_256;
    }
    match m - r {
        1 => tile256::<1, V, D>(t, r),
        2 => tile256::<2, V, D>(t, r),
        _ => {}
    }
}

/// Lane masks of the four column vectors (all ones where live).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn masks8(live: usize) -> [__m256i; 4] {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    std::array::from_fn(|v| _mm256_cmpgt_epi32(_mm256_set1_epi32(live as i32 - 8 * v as i32), idx))
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile256<const R: usize, const V: usize, const D: bool>(t: &Tile, r0: usize) {
    let full = t.live == 8 * V;
    let mask = masks8(t.live);
    let mut acc = [[_mm256_setzero_ps(); V]; R];
    if t.load {
        for (r, acc) in acc.iter_mut().enumerate() {
            let c = t.c.add((r0 + r) * t.ldc);
            *acc = std::array::from_fn(|v| if full { _mm256_loadu_ps(c.add(8 * v)) } else { _mm256_maskload_ps(c.add(8 * v), mask[v]) });
        }
    }
    let mut a = t.a.add(r0 * t.kc);
    let rows: [*const f32; R] = std::array::from_fn(|r| t.a.add((r0 + r) * t.lda));
    let mut b = t.b;
    for k in 0..t.kc {
        let x: [__m256; R] = std::array::from_fn(|r| _mm256_set1_ps(if D { *rows[r].add(k) } else { *a.add(r) }));
        for v in 0..V {
            let bv = _mm256_loadu_ps(b.add(8 * v));
            for (acc, &x) in acc.iter_mut().zip(&x) {
                acc[v] = _mm256_fmadd_ps(x, bv, acc[v]);
            }
        }
        a = a.add(R);
        b = b.add(t.ldb);
    }
    for (r, acc) in acc.iter().enumerate() {
        let c = t.c.add((r0 + r) * t.ldc);
        for (v, (&acc, &mask)) in acc.iter().zip(&mask).enumerate() {
            if full {
                _mm256_storeu_ps(c.add(8 * v), acc);
            } else {
                _mm256_maskstore_ps(c.add(8 * v), mask, acc);
            }
        }
    }
}
