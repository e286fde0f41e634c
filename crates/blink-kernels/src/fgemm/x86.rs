//! AVX-512 and AVX2 micro-kernels: a tile of rows × [`NR`] columns of `C` in registers,
//! one broadcast of `A` and one fused multiply-add per column vector for each `k`, the
//! same chain as the scalar definition. Edge panels go through a row buffer.

use std::arch::x86_64::*;

use super::{Tile, NR};

/// `C`'s row `r` of the tile into `buf` when the panel is not whole (or zero).
#[inline(always)]
unsafe fn edge_in(t: &Tile, r: usize, buf: &mut [f32; NR]) -> *const f32 {
    let c = t.c.add(r * t.ldc);
    if t.live == NR {
        return c;
    }
    *buf = [0.0; NR];
    if t.load {
        std::ptr::copy_nonoverlapping(c, buf.as_mut_ptr(), t.live);
    }
    buf.as_ptr()
}

/// Where row `r` is stored: `C` itself, or `buf`, copied out by [`edge_out`].
#[inline(always)]
unsafe fn edge_dst(t: &Tile, r: usize, buf: &mut [f32; NR]) -> *mut f32 {
    if t.live == NR {
        t.c.add(r * t.ldc)
    } else {
        buf.as_mut_ptr()
    }
}

#[inline(always)]
unsafe fn edge_out(t: &Tile, r: usize, buf: &[f32; NR]) {
    if t.live != NR {
        std::ptr::copy_nonoverlapping(buf.as_ptr(), t.c.add(r * t.ldc), t.live);
    }
}

/// Every row of `t`, six at a time.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn rows_avx512(t: &Tile, m: usize) {
    let mut r = 0;
    while r + 6 <= m {
        tile512::<6>(t, r);
        r += 6;
    }
    match m - r {
        1 => tile512::<1>(t, r),
        2 => tile512::<2>(t, r),
        3 => tile512::<3>(t, r),
        4 => tile512::<4>(t, r),
        5 => tile512::<5>(t, r),
        _ => {}
    }
}

#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn tile512<const R: usize>(t: &Tile, r0: usize) {
    let mut bufs = [[0f32; NR]; R];
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for r in 0..R {
        if t.load {
            let c = edge_in(t, r0 + r, &mut bufs[r]);
            acc[r] = [_mm512_loadu_ps(c), _mm512_loadu_ps(c.add(16))];
        }
    }
    let a = t.a.add(r0 * t.lda);
    for k in 0..t.kc {
        let b = t.b.add(k * t.ldb);
        let (b0, b1) = (_mm512_loadu_ps(b), _mm512_loadu_ps(b.add(16)));
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(*a.add(r * t.lda + k));
            acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
            acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
        }
    }
    for r in 0..R {
        let c = edge_dst(t, r0 + r, &mut bufs[r]);
        _mm512_storeu_ps(c, acc[r][0]);
        _mm512_storeu_ps(c.add(16), acc[r][1]);
        edge_out(t, r0 + r, &bufs[r]);
    }
}

/// Every row of `t`, three at a time (twelve of the sixteen registers accumulate).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows_avx2(t: &Tile, m: usize) {
    let mut r = 0;
    while r + 3 <= m {
        tile256::<3>(t, r);
        r += 3;
    }
    match m - r {
        1 => tile256::<1>(t, r),
        2 => tile256::<2>(t, r),
        _ => {}
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile256<const R: usize>(t: &Tile, r0: usize) {
    let mut bufs = [[0f32; NR]; R];
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    for r in 0..R {
        if t.load {
            let c = edge_in(t, r0 + r, &mut bufs[r]);
            acc[r] = std::array::from_fn(|v| _mm256_loadu_ps(c.add(8 * v)));
        }
    }
    let a = t.a.add(r0 * t.lda);
    for k in 0..t.kc {
        let b = t.b.add(k * t.ldb);
        let x: [__m256; R] = std::array::from_fn(|r| _mm256_set1_ps(*a.add(r * t.lda + k)));
        for v in 0..4 {
            let bv = _mm256_loadu_ps(b.add(8 * v));
            for r in 0..R {
                acc[r][v] = _mm256_fmadd_ps(x[r], bv, acc[r][v]);
            }
        }
    }
    for r in 0..R {
        let c = edge_dst(t, r0 + r, &mut bufs[r]);
        for v in 0..4 {
            _mm256_storeu_ps(c.add(8 * v), acc[r][v]);
        }
        edge_out(t, r0 + r, &bufs[r]);
    }
}
