//! Causal attention of one query head over one example, forward (keeping each row's
//! log-sum-exp of scores) and backward (recomputing the probabilities from it).
//!
//! Numerics, the same on every path: a score is `dot(q_i, k_j) · scale`, the dot one fused
//! multiply-add chain over the head dimension in order; a softmax weight is `e_j / Σ e`
//! with `e_j = exp(s_j − max)` by [`exp`] (a fixed polynomial, not libm) and the sum
//! taken in sixteen interleaved lanes, then a fixed tree; every weighted sum of rows (an
//! output, each gradient) is one fused multiply-add chain per element over positions in
//! order, starting from zero (`out`, `dq`) or the old value (`dk`, `dv`).
//!
//! Queries go [`R`] rows at a time. Keys (and for the backward values) are transposed once
//! per call, so a block's scores come sixteen keys to a vector with the block's rows
//! sharing every load, and the rows a weighted sum reads are shared by the block's rows.
//! The AVX-512 and AVX2 paths run the same operations on wider lanes as the portable one
//! ([`Lanes`]), so every path gives the same bits.

use std::cell::RefCell;

/// Rows of `d` floats, `stride` apart.
#[derive(Clone, Copy)]
pub struct Rows {
    pub ptr: *mut f32,
    pub stride: usize,
}

impl Rows {
    /// # Safety
    /// Row `i` must be inside the buffer, and nobody may write it meanwhile.
    #[inline]
    pub unsafe fn row(&self, i: usize, d: usize) -> &[f32] {
        std::slice::from_raw_parts(self.ptr.add(i * self.stride), d)
    }

    /// # Safety
    /// Row `i` must be inside the buffer, and only this caller may touch it meanwhile.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn row_mut(&self, i: usize, d: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.ptr.add(i * self.stride), d)
    }

    #[inline(always)]
    unsafe fn at(&self, i: usize) -> *mut f32 {
        self.ptr.add(i * self.stride)
    }
}

/// Lanes of one vector of scores (keys) or of a row (head dimension).
const W: usize = 16;
/// Query rows per block.
const R: usize = 8;

/// `e^x` for the softmax (`x ≤ 0` there; right for `x < 88`): ggml's range reduction and
/// degree-5 polynomial, zero below −87 (where `e^x` leaves the normal range).
#[inline(always)]
unsafe fn exp<S: Lanes>(x: S) -> S {
    use blink_kernels::math::exp_poly::{C1, C2, C3, C4, C5, LN2_HI, LN2_LO, LOG2_E, SHIFT};
    let c = S::splat;
    let z = S::fma(x, c(LOG2_E), c(SHIFT));
    let n = z.sub(c(SHIFT));
    let m = n.neg();
    let b = S::fma(m, c(LN2_LO), S::fma(m, c(LN2_HI), x));
    let u = b.mul(b);
    let j = S::fma(S::fma(S::fma(c(C5), b, c(C4)), u, S::fma(c(C3), b, c(C2))), u, S::fma(c(C1), b, c(1.0)));
    j.mul(n.pow2()).zero_below(x, -87.0)
}

/// Sixteen f32 lanes and the operations the kernels use, each lane computed exactly as
/// the portable [`Portable`] computes it.
trait Lanes: Copy {
    unsafe fn splat(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// `a · b + c`, rounded once.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn add(self, b: Self) -> Self;
    unsafe fn sub(self, b: Self) -> Self;
    unsafe fn mul(self, b: Self) -> Self;
    unsafe fn div(self, b: Self) -> Self;
    /// `self > b ? self : b` (as `maxps`).
    unsafe fn max(self, b: Self) -> Self;
    /// The sign flipped.
    unsafe fn neg(self) -> Self;
    /// `2^n` for integer-valued lanes in −126..=127 (others: unspecified).
    unsafe fn pow2(self) -> Self;
    /// Zero where `x < t`.
    unsafe fn zero_below(self, x: Self, t: f32) -> Self;
    /// Lanes `n..` replaced by `fill`.
    unsafe fn first(self, n: usize, fill: f32) -> Self;
    /// The lanes summed as `t8[l] = v[l] + v[l+8]`, then `t4`, `t2`, `t1` likewise.
    unsafe fn sum(self) -> f32;
    /// The largest lane, by the same tree of [`Lanes::max`].
    unsafe fn hmax(self) -> f32;

    /// `dst[c·ld + l] = src[l][c]` for `l, c < W`: a 16×16 block transposed.
    #[inline(always)]
    unsafe fn transpose_block(src: &[*const f32; W], dst: *mut f32, ld: usize) {
        for c in 0..W {
            for (l, row) in src.iter().enumerate() {
                *dst.add(c * ld + l) = *row.add(c);
            }
        }
    }
}

/// The portable lanes (the definition; LLVM vectorizes its loops where it can).
#[derive(Clone, Copy)]
struct Portable([f32; W]);

impl Portable {
    #[inline(always)]
    fn map2(a: Self, b: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        Portable(std::array::from_fn(|l| f(a.0[l], b.0[l])))
    }

    #[inline(always)]
    fn tree(mut v: [f32; W], f: impl Fn(f32, f32) -> f32) -> f32 {
        let mut n = W / 2;
        while n > 0 {
            for l in 0..n {
                v[l] = f(v[l], v[l + n]);
            }
            n /= 2;
        }
        v[0]
    }
}

#[inline(always)]
fn max1(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

impl Lanes for Portable {
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        Portable([x; W])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Portable(p.cast::<[f32; W]>().read_unaligned())
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        p.cast::<[f32; W]>().write_unaligned(self.0)
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        Portable(std::array::from_fn(|l| a.0[l].mul_add(b.0[l], c.0[l])))
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        Self::map2(self, b, |x, y| x + y)
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        Self::map2(self, b, |x, y| x - y)
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        Self::map2(self, b, |x, y| x * y)
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        Self::map2(self, b, |x, y| x / y)
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        Self::map2(self, b, max1)
    }
    #[inline(always)]
    unsafe fn neg(self) -> Self {
        Portable(self.0.map(|x| -x))
    }
    #[inline(always)]
    unsafe fn pow2(self) -> Self {
        Portable(self.0.map(|n| f32::from_bits(((n as i32).wrapping_add(127) as u32).wrapping_shl(23))))
    }
    #[inline(always)]
    unsafe fn zero_below(self, x: Self, t: f32) -> Self {
        Self::map2(self, x, |v, x| if x < t { 0.0 } else { v })
    }
    #[inline(always)]
    unsafe fn first(self, n: usize, fill: f32) -> Self {
        Portable(std::array::from_fn(|l| if l < n { self.0[l] } else { fill }))
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        Self::tree(self.0, |a, b| a + b)
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        Self::tree(self.0, max1)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;

/// Which lanes run the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Path {
    /// The kernels' path for the process's kernel ISA (all give the same bits).
    fn active() -> Path {
        #[cfg(target_arch = "x86_64")]
        match blink_kernels::cpu::active() {
            blink_kernels::cpu::Isa::Avx512Vnni => return Path::Avx512,
            blink_kernels::cpu::Isa::Avx2 | blink_kernels::cpu::Isa::AvxVnni => return Path::Avx2,
            _ => {}
        }
        Path::Portable
    }
}

thread_local! {
    /// Transposed keys (and values), and a block's scores: grown to the longest call.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `f` with `n` floats of this thread's scratch.
fn with_scratch<T>(n: usize, f: impl FnOnce(&mut [f32]) -> T) -> T {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < n {
            s.resize(n, 0.0);
        }
        f(&mut s[..n])
    })
}

/// `dst[c·ld + j] = src.row(j)[c]` for `c < d`, `j < len`; zero for `len ≤ j < ld`.
#[inline(always)]
unsafe fn transpose<S: Lanes>(src: Rows, len: usize, d: usize, ld: usize, dst: *mut f32) {
    for j0 in (0..ld).step_by(W) {
        let n = W.min(len.saturating_sub(j0));
        let rows: [*const f32; W] = std::array::from_fn(|l| if l < n { src.at(j0 + l) as *const f32 } else { std::ptr::null() });
        let mut c0 = 0;
        if n == W {
            while c0 + W <= d {
                S::transpose_block(&std::array::from_fn(|l| rows[l].add(c0)), dst.add(c0 * ld + j0), ld);
                c0 += W;
            }
        }
        for c in c0..d {
            let out = dst.add(c * ld + j0);
            for (l, row) in rows.iter().enumerate() {
                *out.add(l) = if l < n { *row.add(c) } else { 0.0 };
            }
        }
    }
}

/// `out[r·ld + j] = dot(x_r, key j) · scale` for the block's rows `x` and keys
/// `j < W·chunks` (`kt` the keys transposed, rows `ld` apart).
#[inline(always)]
unsafe fn scores<S: Lanes, const CH: usize>(x: &[*const f32; R], d: usize, kt: *const f32, ld: usize, chunks: usize, scale: f32, out: *mut f32) {
    let mut c = 0;
    while c + CH <= chunks {
        score_chunks::<S, CH>(x, d, kt.add(c * W), ld, scale, out.add(c * W));
        c += CH;
    }
    while c < chunks {
        score_chunks::<S, 1>(x, d, kt.add(c * W), ld, scale, out.add(c * W));
        c += 1;
    }
}

#[inline(always)]
unsafe fn score_chunks<S: Lanes, const CH: usize>(x: &[*const f32; R], d: usize, kt: *const f32, ld: usize, scale: f32, out: *mut f32) {
    let mut acc = [[S::splat(0.0); CH]; R];
    for c in 0..d {
        let k: [S; CH] = std::array::from_fn(|h| S::load(kt.add(c * ld + h * W)));
        for (acc, x) in acc.iter_mut().zip(x) {
            let x = S::splat(*x.add(c));
            for h in 0..CH {
                acc[h] = S::fma(x, k[h], acc[h]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (h, a) in acc.iter().enumerate() {
            a.mul(S::splat(scale)).store(out.add(r * ld + h * W));
        }
    }
}

/// Row `s[..valid]` of scores into softmax weights (in place); returns the log-sum-exp.
#[inline(always)]
unsafe fn softmax<S: Lanes>(s: *mut f32, valid: usize) -> f32 {
    let chunks = valid.div_ceil(W);
    let mut mx = S::splat(f32::NEG_INFINITY);
    for c in 0..chunks {
        mx = mx.max(S::load(s.add(c * W)).first(valid - c * W, f32::NEG_INFINITY));
    }
    let max = mx.hmax();
    let mut sum = S::splat(0.0);
    for c in 0..chunks {
        let e = exp(S::load(s.add(c * W)).sub(S::splat(max))).first(valid - c * W, 0.0);
        e.store(s.add(c * W));
        sum = sum.add(e);
    }
    let total = sum.sum();
    for c in 0..chunks {
        S::load(s.add(c * W)).div(S::splat(total)).store(s.add(c * W));
    }
    max + total.ln()
}

/// `dst.row(i0 + r) = Σ_{j ≤ i0 + r} w[r·ld + j] · src.row(j)` for `r < rows`, each element
/// one chain over `j` in order from zero: `ND` vectors of `W` per row, `RO` rows at once.
#[inline(always)]
unsafe fn weighted<S: Lanes, const ND: usize, const RO: usize>(w: *const f32, ld: usize, i0: usize, rows: usize, src: Rows, dst: Rows) {
    for g in (0..rows).step_by(RO) {
        let n = RO.min(rows - g);
        let w = w.add(g * ld);
        let last = i0 + g; // every row of the group reads keys ..= last
        let mut acc = [[S::splat(0.0); ND]; RO];
        for j in 0..=last {
            let v: [S; ND] = std::array::from_fn(|t| S::load(src.at(j).add(t * W)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = S::splat(*w.add(r * ld + j));
                for t in 0..ND {
                    acc[t] = S::fma(x, v[t], acc[t]);
                }
            }
        }
        for j in last + 1..last + n {
            let v: [S; ND] = std::array::from_fn(|t| S::load(src.at(j).add(t * W)));
            for (r, acc) in acc.iter_mut().enumerate().take(n).skip(j - last) {
                let x = S::splat(*w.add(r * ld + j));
                for t in 0..ND {
                    acc[t] = S::fma(x, v[t], acc[t]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(n) {
            for (t, a) in acc.iter().enumerate() {
                a.store(dst.at(i0 + g + r).add(t * W));
            }
        }
    }
}

/// [`weighted`] for any `d`, the rows in memory.
#[inline(always)]
unsafe fn weighted_any(d: usize, w: *const f32, ld: usize, i0: usize, rows: usize, src: Rows, dst: Rows) {
    for r in 0..rows {
        let o = dst.row_mut(i0 + r, d);
        o.fill(0.0);
        for j in 0..=i0 + r {
            let x = *w.add(r * ld + j);
            for (o, &v) in o.iter_mut().zip(src.row(j, d)) {
                *o = x.mul_add(v, *o);
            }
        }
    }
}

/// `dst.row(j) += c[r·ld + j] · x_r` over the block's rows `r` in order (those with
/// `j ≤ i0 + r`), for `j < i0 + rows`: `ND` vectors of `W` per row.
#[inline(always)]
unsafe fn rank_update<S: Lanes, const ND: usize>(c: *const f32, ld: usize, i0: usize, rows: usize, x: &[*const f32; R], dst: Rows) {
    let xs: [[S; ND]; R] = std::array::from_fn(|r| std::array::from_fn(|t| S::load(x[r].add(t * W))));
    for j in 0..i0 + rows {
        let out = dst.at(j);
        let mut acc: [S; ND] = std::array::from_fn(|t| S::load(out.add(t * W)));
        for (r, x) in xs.iter().enumerate().take(rows).skip(j.saturating_sub(i0)) {
            let s = S::splat(*c.add(r * ld + j));
            for (a, x) in acc.iter_mut().zip(x) {
                *a = S::fma(s, *x, *a);
            }
        }
        for (t, a) in acc.iter().enumerate() {
            a.store(out.add(t * W));
        }
    }
}

/// [`rank_update`] for any `d`.
#[inline(always)]
unsafe fn rank_update_any(d: usize, c: *const f32, ld: usize, i0: usize, rows: usize, x: &[*const f32; R], dst: Rows) {
    for j in 0..i0 + rows {
        let out = dst.row_mut(j, d);
        for (r, x) in x.iter().enumerate().take(rows).skip(j.saturating_sub(i0)) {
            let s = *c.add(r * ld + j);
            for (o, &v) in out.iter_mut().zip(std::slice::from_raw_parts(*x, d)) {
                *o = s.mul_add(v, *o);
            }
        }
    }
}

/// The block's row pointers (rows past the end repeat the last one; never stored).
#[inline(always)]
unsafe fn block_rows(m: Rows, i0: usize, rows: usize) -> [*const f32; R] {
    std::array::from_fn(|r| m.at(i0 + r.min(rows - 1)) as *const f32)
}

/// The forward on lanes `S`: `CH` key vectors at once for scores, rows of `d = 64` and
/// `d = 128` weighted `RO64` and `RO128` rows at once.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn forward_with<S: Lanes, const CH: usize, const RO64: usize, const RO128: usize>(len: usize, d: usize, scale: f32, q: Rows, k: Rows, v: Rows, out: Rows, lse: Rows, buf: &mut [f32]) {
    let ld = len.next_multiple_of(W);
    let (kt, s) = buf.split_at_mut(d * ld);
    let (kt, s) = (kt.as_mut_ptr(), s.as_mut_ptr());
    transpose::<S>(k, len, d, ld, kt);
    for i0 in (0..len).step_by(R) {
        let rows = R.min(len - i0);
        scores::<S, CH>(&block_rows(q, i0, rows), d, kt, ld, (i0 + rows).div_ceil(W), scale, s);
        for r in 0..rows {
            *lse.at(i0 + r) = softmax::<S>(s.add(r * ld), i0 + r + 1);
        }
        match d {
            64 => weighted::<S, 4, RO64>(s, ld, i0, rows, v, out),
            128 => weighted::<S, 8, RO128>(s, ld, i0, rows, v, out),
            _ => weighted_any(d, s, ld, i0, rows, v, out),
        }
    }
}

/// The backward on lanes `S` (as [`forward_with`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn backward_with<S: Lanes, const CH: usize, const RO64: usize, const RO128: usize>(len: usize, d: usize, scale: f32, (q, k, v): (Rows, Rows, Rows), (out, lse): (Rows, Rows), dout: Rows, (dq, dk, dv): (Rows, Rows, Rows), buf: &mut [f32]) {
    let ld = len.next_multiple_of(W);
    let (kt, rest) = buf.split_at_mut(d * ld);
    let (vt, rest) = rest.split_at_mut(d * ld);
    let (p, ds) = rest.split_at_mut(R * ld);
    let (kt, vt, p, ds) = (kt.as_mut_ptr(), vt.as_mut_ptr(), p.as_mut_ptr(), ds.as_mut_ptr());
    transpose::<S>(k, len, d, ld, kt);
    transpose::<S>(v, len, d, ld, vt);
    for i0 in (0..len).step_by(R) {
        let rows = R.min(len - i0);
        let chunks = (i0 + rows).div_ceil(W);
        let (qr, dor, or) = (block_rows(q, i0, rows), block_rows(dout, i0, rows), block_rows(out, i0, rows));
        let mut delta = [0f32; R];
        for c in 0..d {
            for r in 0..R {
                delta[r] = (*dor[r].add(c)).mul_add(*or[r].add(c), delta[r]);
            }
        }
        // p = exp(s − lse), ds = p · (dout·v − δ) · scale.
        scores::<S, CH>(&qr, d, kt, ld, chunks, scale, p);
        scores::<S, CH>(&dor, d, vt, ld, chunks, 1.0, ds);
        for (r, &delta) in delta.iter().enumerate().take(rows) {
            let (l, valid) = (S::splat(*lse.at(i0 + r)), i0 + r + 1);
            for c in 0..chunks {
                let (pp, dd) = (p.add(r * ld + c * W), ds.add(r * ld + c * W));
                let pr = exp(S::load(pp).sub(l)).first(valid.saturating_sub(c * W), 0.0);
                pr.store(pp);
                pr.mul(S::load(dd).sub(S::splat(delta))).mul(S::splat(scale)).store(dd);
            }
        }
        match d {
            64 => {
                rank_update::<S, 4>(p, ld, i0, rows, &dor, dv);
                rank_update::<S, 4>(ds, ld, i0, rows, &qr, dk);
                weighted::<S, 4, RO64>(ds, ld, i0, rows, k, dq);
            }
            128 => {
                rank_update::<S, 8>(p, ld, i0, rows, &dor, dv);
                rank_update::<S, 8>(ds, ld, i0, rows, &qr, dk);
                weighted::<S, 8, RO128>(ds, ld, i0, rows, k, dq);
            }
            _ => {
                rank_update_any(d, p, ld, i0, rows, &dor, dv);
                rank_update_any(d, ds, ld, i0, rows, &qr, dk);
                weighted_any(d, ds, ld, i0, rows, k, dq);
            }
        }
    }
}

/// Scratch floats for a call: transposed keys (and values) and a block's rows of scores.
fn scratch_len(len: usize, d: usize, backward: bool) -> usize {
    let ld = len.next_multiple_of(W);
    (if backward { 2 } else { 1 }) * d * ld + 2 * R * ld
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn forward_avx512(len: usize, d: usize, scale: f32, q: Rows, k: Rows, v: Rows, out: Rows, lse: Rows, buf: &mut [f32]) {
    forward_with::<x86::Z, 2, 4, 2>(len, d, scale, q, k, v, out, lse, buf)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn forward_avx2(len: usize, d: usize, scale: f32, q: Rows, k: Rows, v: Rows, out: Rows, lse: Rows, buf: &mut [f32]) {
    forward_with::<x86::Y, 1, 1, 1>(len, d, scale, q, k, v, out, lse, buf)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn backward_avx512(len: usize, d: usize, scale: f32, qkv: (Rows, Rows, Rows), ol: (Rows, Rows), dout: Rows, grads: (Rows, Rows, Rows), buf: &mut [f32]) {
    backward_with::<x86::Z, 2, 4, 2>(len, d, scale, qkv, ol, dout, grads, buf)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn backward_avx2(len: usize, d: usize, scale: f32, qkv: (Rows, Rows, Rows), ol: (Rows, Rows), dout: Rows, grads: (Rows, Rows, Rows), buf: &mut [f32]) {
    backward_with::<x86::Y, 1, 1, 1>(len, d, scale, qkv, ol, dout, grads, buf)
}

#[allow(clippy::too_many_arguments)]
unsafe fn forward_on(path: Path, len: usize, d: usize, scale: f32, q: Rows, k: Rows, v: Rows, out: Rows, lse: Rows) {
    if len == 0 {
        return;
    }
    with_scratch(scratch_len(len, d, false), |buf| match path {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => forward_avx512(len, d, scale, q, k, v, out, lse, buf),
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => forward_avx2(len, d, scale, q, k, v, out, lse, buf),
        Path::Portable => forward_with::<Portable, 1, 1, 1>(len, d, scale, q, k, v, out, lse, buf),
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn backward_on(path: Path, len: usize, d: usize, scale: f32, qkv: (Rows, Rows, Rows), ol: (Rows, Rows), dout: Rows, grads: (Rows, Rows, Rows)) {
    if len == 0 {
        return;
    }
    with_scratch(scratch_len(len, d, true), |buf| match path {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => backward_avx512(len, d, scale, qkv, ol, dout, grads, buf),
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => backward_avx2(len, d, scale, qkv, ol, dout, grads, buf),
        Path::Portable => backward_with::<Portable, 1, 1, 1>(len, d, scale, qkv, ol, dout, grads, buf),
    })
}

/// One head's attention over `len` positions: `out[i] = Σ_{j≤i} softmax(q_i·k_j·scale) v_j`,
/// and `lse[i]` (one float per row, `stride` apart) the log-sum-exp of row `i`'s scores.
/// (`_scores` is unused: the blocks' scores live in a per-thread buffer.)
///
/// # Safety
/// The rows must be inside their buffers; `out` and `lse` rows are this caller's alone.
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward(len: usize, d: usize, scale: f32, q: Rows, k: Rows, v: Rows, out: Rows, lse: Rows, _scores: &mut [f32]) {
    forward_on(Path::active(), len, d, scale, q, k, v, out, lse)
}

/// The gradients of [`forward`] for an output gradient `dout`: `dq` is written, `dk` and
/// `dv` are added to (heads that share a key/value head add in turn).
///
/// # Safety
/// As for [`forward`]; `dq`, `dk` and `dv` rows are this caller's alone.
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward(len: usize, d: usize, scale: f32, qkv: (Rows, Rows, Rows), ol: (Rows, Rows), dout: Rows, grads: (Rows, Rows, Rows), _scores: &mut [f32]) {
    backward_on(Path::active(), len, d, scale, qkv, ol, dout, grads)
}

#[cfg(test)]
mod tests;
