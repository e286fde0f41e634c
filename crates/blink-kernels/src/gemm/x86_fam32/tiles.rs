//! The inner loops of the 32-element kernels: a tile (eight weight rows of a packed group
//! against a few activation rows) in each dot order, and the unpacking of its weights.

use std::arch::x86_64::*;

use super::{i16_lanes, pairs_first, unsigned_form, Ahead, DotU8I8, Fam32, Shape};
use crate::gemm::pack::GROUP;

/// Bit `k` of the 32-bit word at `qh` as value 16 in byte `k`.
#[inline(always)]
unsafe fn fifth_bits(qh: *const u8) -> __m256i {
    let bits = (qh as *const i32).read_unaligned();
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits),
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(16))
}

/// Lanes `l` and `l + 4` of eight rows as unsigned bytes (`q + offset`), or as signed
/// bytes for `SIGNED` formats when `signed`.
#[inline(always)]
pub(super) unsafe fn unpack_lanes<F: Fam32>(gb: *const u8, l: usize, signed: bool) -> (__m256i, __m256i) {
    let (_, qh_at, qs_at) = F::FIELDS.packed_offsets();
    if F::FIELDS.bits == 8 {
        // Signed, as stored (see `Fam32::SIGNED`), or made unsigned (`q + 128`) by
        // flipping the sign bit.
        let lo = _mm256_loadu_si256(gb.add(qs_at + 32 * l) as *const __m256i);
        let hi = _mm256_loadu_si256(gb.add(qs_at + 32 * (l + 4)) as *const __m256i);
        if signed || F::STORED_UNSIGNED {
            return (lo, hi);
        }
        let flip = _mm256_set1_epi8(i8::MIN);
        return (_mm256_xor_si256(lo, flip), _mm256_xor_si256(hi, flip));
    }
    let raw = _mm256_loadu_si256(gb.add(qs_at + 32 * l) as *const __m256i);
    let mask = _mm256_set1_epi8(0x0f);
    let mut lo = _mm256_and_si256(raw, mask);
    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), mask);
    if let Some(table) = F::LUT {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
        let (lo, hi) = (_mm256_shuffle_epi8(table, lo), _mm256_shuffle_epi8(table, hi));
        if signed {
            return (lo, hi);
        }
        let flip = _mm256_set1_epi8(i8::MIN);
        return (_mm256_xor_si256(lo, flip), _mm256_xor_si256(hi, flip));
    }
    if F::FIELDS.qh.is_some() {
        lo = _mm256_or_si256(lo, fifth_bits(gb.add(qh_at + 4 * l)));
        hi = _mm256_or_si256(hi, fifth_bits(gb.add(qh_at + 4 * (l + 4))));
    }
    (lo, hi)
}

/// Eight f16 values at `p` as f32.
#[inline(always)]
unsafe fn f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// The eight rows' scales at the start of a group-block as f32: f16 `d`s, or `MXFP4`'s
/// exponents as [`e8m0_half`](crate::quant::e8m0_half) reads them (`(e − 1) << 23`, the
/// two smallest as subnormals `0x200000 << e`).
#[inline(always)]
unsafe fn weight_scales<F: Fam32>(gb: *const u8) -> __m256 {
    if F::FIELDS.scale == 2 {
        return f16x8(gb);
    }
    let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(gb as *const __m128i));
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
    _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, is_normal))
}

/// One tile's operands: the eight rows of a packed group (`w`, `n_blocks` group-blocks) ×
/// activation rows from `a`, `a_stride` bytes apart, with their block scales (`d`, `s`
/// pairs) and `−offset · Σa` values, `row_blocks` blocks' worth per activation row; results
/// go to `out` (`ld` apart), written or added, the first `live` of each row's eight. With
/// the blocks in chunks, `chunk` says where the sums start and end.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub(super) n_blocks: usize,
    pub(super) row_blocks: usize,
    pub(super) chunk: Chunk,
    pub(super) w: *const u8,
    pub(super) a: *const u8,
    pub(super) a_stride: usize,
    pub(super) scales: *const f32,
    pub(super) offsets: *const i32,
    pub(super) out: *mut f32,
    pub(super) ld: usize,
    pub(super) accumulate: bool,
    pub(super) live: usize,
    pub(super) ahead: Ahead,
}

impl Tile {
    /// Blocks per activation row in the scales and offsets: `n_blocks` itself where a
    /// product is not in chunks (known when the kernel compiles).
    #[inline(always)]
    pub(super) fn row_blocks<const CHUNKED: bool>(self) -> usize {
        if CHUNKED {
            self.row_blocks
        } else {
            self.n_blocks
        }
    }
}

/// Where a tile's sums start and end when a product's blocks go in chunks (its k-cut,
/// [`crate::gemm::tiling::k_chunk_blocks`]): from zero in the first chunk, else from
/// `partial`; into the outputs in the last chunk, else back into `partial`.
/// [`PARTIAL_FLOATS`] per activation row: a `Llama`-order tile's eight lane accumulators
/// and its minimums' sum, a `Block`-order tile's accumulator. Each sum goes on in block
/// order exactly as without chunks, so the bits do not change.
#[derive(Clone, Copy)]
pub(super) struct Chunk {
    pub(super) partial: *mut f32,
    pub(super) first: bool,
    pub(super) last: bool,
}

/// Floats of a [`Chunk`]'s partial sums per activation row.
pub(super) const PARTIAL_FLOATS: usize = 9 * 8;

impl Chunk {
    /// All the blocks at once.
    pub(super) const WHOLE: Chunk = Chunk { partial: std::ptr::null_mut(), first: true, last: true };

    /// Whether this is the first chunk (always, for a product not in chunks: known when
    /// the kernel compiles, so its tiles test nothing).
    #[inline(always)]
    pub(super) fn first<const CHUNKED: bool>(self) -> bool {
        !CHUNKED || self.first
    }

    /// Whether this is the last chunk (always, for a product not in chunks).
    #[inline(always)]
    pub(super) fn last<const CHUNKED: bool>(self) -> bool {
        !CHUNKED || self.last
    }

    /// Activation row `j`'s `k`-th vector of partial sums.
    #[inline(always)]
    pub(super) unsafe fn at(self, j: usize, k: usize) -> *mut f32 {
        self.partial.add(j * PARTIAL_FLOATS + 8 * k)
    }

    /// Activation row `j`'s lane accumulators and minimums' sum, from the chunk before.
    #[inline(always)]
    pub(super) unsafe fn load_lanes(self, j: usize, acc: &mut [__m256; 8], tail: &mut __m256) {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(self.at(j, k));
        }
        *tail = _mm256_loadu_ps(self.at(j, 8));
    }

    /// Activation row `j`'s lane accumulators and minimums' sum, for the chunk after.
    #[inline(always)]
    pub(super) unsafe fn save_lanes(self, j: usize, acc: &[__m256; 8], tail: __m256) {
        for (k, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(self.at(j, k), *a);
        }
        _mm256_storeu_ps(self.at(j, 8), tail);
    }
}

/// One tile in the `Llama` order: the eight rows of a packed group × `RA` activation rows,
/// eight float lanes each. Writes the rows below `live` (in a chunk before the last, saves
/// its sums instead).
///
/// With `D::LANE_PASSES == 2` and several activation rows, the lanes go in two passes over
/// the blocks (lanes 0..4, then 4..8), so only four accumulators per activation row are
/// live: twice the activation rows fit in sixteen registers, and each unpacked weight lane
/// serves all of them. Each lane's sum is its own chain either way, so the bits do not
/// change. (A lone row keeps one pass: measured faster for decoding.)
#[inline(always)]
pub(super) unsafe fn tile_lanes<F: Fam32, D: DotU8I8 + Shape, const RA: usize, const L2: bool, const CHUNKED: bool>(t: Tile) {
    let mut acc = [[_mm256_setzero_ps(); 8]; RA];
    let mut tail = [_mm256_setzero_ps(); RA];
    if !t.chunk.first::<CHUNKED>() {
        for j in 0..RA {
            t.chunk.load_lanes(j, &mut acc[j], &mut tail[j]);
        }
    }
    if D::LANE_PASSES == 1 || RA == 1 {
        lanes_pass::<F, D, RA, L2, CHUNKED, 0, 8>(t, &mut acc, Some(&mut tail));
    } else {
        lanes_pass::<F, D, RA, L2, CHUNKED, 0, 4>(t, &mut acc, None);
        lanes_pass::<F, D, RA, false, CHUNKED, 4, 4>(Tile { ahead: Ahead::NONE, ..t }, &mut acc, None);
        // The minimums' products, a pass of their own (their registers would crowd the
        // lanes'), in the same order.
        let Tile { n_blocks, w, scales, .. } = t;
        let row_blocks = t.row_blocks::<CHUNKED>();
        let (m_at, _, _) = F::FIELDS.packed_offsets();
        if F::FIELDS.m.is_some() {
            for b in 0..n_blocks {
                let mw = f16x8(w.add(b * F::FIELDS.group_block() + m_at));
                for (j, tail) in tail.iter_mut().enumerate() {
                    *tail = _mm256_add_ps(*tail, _mm256_mul_ps(mw, _mm256_broadcast_ss(&*scales.add(2 * (j * row_blocks + b) + 1))));
                }
            }
        }
    }
    let Tile { out, ld, accumulate, live, chunk, .. } = t;
    if !chunk.last::<CHUNKED>() {
        for j in 0..RA {
            chunk.save_lanes(j, &acc[j], tail[j]);
        }
        return;
    }
    for j in 0..RA {
        store(out.add(j * ld), lane_sum(&acc[j], tail[j]), live, accumulate);
    }
}

/// A `Llama`-order output: an activation row's eight lane accumulators summed (`hsum8`, for
/// eight weight rows at once), plus its minimums' products.
#[inline(always)]
pub(super) unsafe fn lane_sum(c: &[__m256; 8], tail: __m256) -> __m256 {
    let v = _mm256_add_ps(
        _mm256_add_ps(_mm256_add_ps(c[0], c[4]), _mm256_add_ps(c[2], c[6])),
        _mm256_add_ps(_mm256_add_ps(c[1], c[5]), _mm256_add_ps(c[3], c[7])),
    );
    _mm256_add_ps(v, tail)
}

/// Lanes `FIRST..FIRST + COUNT` of a [`tile_lanes`] tile over every block, into `acc`, and
/// the minimums' products into `tail` if given.
#[inline(always)]
unsafe fn lanes_pass<F: Fam32, D: DotU8I8, const RA: usize, const L2: bool, const CHUNKED: bool, const FIRST: usize, const COUNT: usize>(t: Tile, acc: &mut [[__m256; 8]; RA], mut tail: Option<&mut [__m256; RA]>) {
    let Tile { n_blocks, w, a, a_stride, scales: scales_f32, offsets, ahead, .. } = t;
    let row_blocks = t.row_blocks::<CHUNKED>();
    let fields = F::FIELDS;
    let (m_at, _, _) = fields.packed_offsets();
    let group_block = fields.group_block();
    let has_min = fields.m.is_some() && tail.is_some();
    let taken = |lane: usize| (FIRST..FIRST + COUNT).contains(&lane);
    let (signed, offset, small) = unsigned_form::<F, D>();
    for b in 0..n_blocks {
        let gb = w.add(b * group_block);
        ahead.fetch::<L2>(b);
        let dw = weight_scales::<F>(gb);
        let mut scales = [_mm256_setzero_ps(); RA];
        let mut aq = [std::ptr::null::<u8>(); RA];
        let mw = if has_min { f16x8(gb.add(m_at)) } else { _mm256_setzero_ps() };
        // −offset · Σa of each lane, as two vectors per activation row repeating its low
        // and high four lanes: one load, then each lane's broadcast is an in-lane shuffle
        // (the loads, not the arithmetic, bound the offset formats).
        let mut offs = [(_mm256_setzero_si256(), _mm256_setzero_si256()); RA];
        if offset != 0 && !signed {
            for (j, o) in offs.iter_mut().enumerate() {
                let v = _mm256_loadu_si256(offsets.add(8 * (j * row_blocks + b)) as *const __m256i);
                *o = (_mm256_permute2x128_si256::<0x00>(v, v), _mm256_permute2x128_si256::<0x11>(v, v));
            }
        }
        for j in 0..RA {
            let ab = a.add(j * a_stride + b * F::ACT_BYTES);
            aq[j] = ab.add(F::ACT_QS);
            let sc = scales_f32.add(2 * (j * row_blocks + b));
            scales[j] = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*sc));
            if let Some(tail) = tail.as_deref_mut().filter(|_| has_min) {
                tail[j] = _mm256_add_ps(tail[j], _mm256_mul_ps(mw, _mm256_broadcast_ss(&*sc.add(1))));
            }
        }
        for l in 0..4 {
            // Both lanes of a load, the one this pass does not take left to the compiler
            // to drop.
            let (w_lo, w_hi) = unpack_lanes::<F>(gb, l, signed);
            let (m_lo, m_hi) = if signed { (_mm256_abs_epi8(w_lo), _mm256_abs_epi8(w_hi)) } else { (w_lo, w_hi) };
            for j in 0..RA {
                for (lane, wv, mag) in [(l, w_lo, m_lo), (l + 4, w_hi, m_hi)] {
                    if !taken(lane) {
                        continue;
                    }
                    let a4 = _mm256_set1_epi32((aq[j].add(4 * lane) as *const i32).read_unaligned());
                    if signed {
                        let sums = D::dot_small(mag, _mm256_sign_epi8(a4, wv));
                        acc[j][lane] = _mm256_fmadd_ps(scales[j], _mm256_cvtepi32_ps(sums), acc[j][lane]);
                        continue;
                    }
                    // −offset · Σa of this lane, the starting sum.
                    let start = lane_offset(if lane < 4 { offs[j].0 } else { offs[j].1 }, lane);
                    let sums = match (offset != 0, small) {
                        (true, true) => D::dot_small_from(start, wv, a4),
                        (true, false) => D::dot_from(start, wv, a4),
                        (false, true) => D::dot_small(wv, a4),
                        (false, false) => D::dot(wv, a4),
                    };
                    acc[j][lane] = _mm256_fmadd_ps(scales[j], _mm256_cvtepi32_ps(sums), acc[j][lane]);
                }
            }
        }
    }
}

/// Lane `lane % 4` of each 128-bit half of `half` (a row's four lane offsets, twice), in
/// every lane. (A function, not a closure: a closure would not take on the kernel's target
/// features, and measured as a call per lane.)
#[inline(always)]
unsafe fn lane_offset(half: __m256i, lane: usize) -> __m256i {
    match lane % 4 {
        0 => _mm256_shuffle_epi32::<0x00>(half),
        1 => _mm256_shuffle_epi32::<0x55>(half),
        2 => _mm256_shuffle_epi32::<0xaa>(half),
        _ => _mm256_shuffle_epi32::<0xff>(half),
    }
}

/// One tile in the `Block` order: the eight rows of a packed group × `RA` activation rows,
/// one float accumulator each. Writes the rows below `live` (in a chunk before the last,
/// saves its sums instead).
#[inline(always)]
pub(super) unsafe fn tile_block<F: Fam32, D: DotU8I8, const RA: usize, const L2: bool, const CHUNKED: bool>(t: Tile) {
    let Tile { n_blocks, chunk, w, a, a_stride, scales: scales_f32, offsets, out, ld, accumulate, live, ahead, .. } = t;
    let row_blocks = t.row_blocks::<CHUNKED>();
    let fields = F::FIELDS;
    let (m_at, _, _) = fields.packed_offsets();
    let group_block = fields.group_block();
    let has_min = fields.m.is_some();
    let mut acc = [_mm256_setzero_ps(); RA];
    if !chunk.first::<CHUNKED>() {
        for (j, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_loadu_ps(chunk.at(j, 0));
        }
    }
    let (signed, offset, small) = unsigned_form::<F, D>();
    for b in 0..n_blocks {
        let gb = w.add(b * group_block);
        ahead.fetch::<L2>(b);
        let mut aq = [std::ptr::null::<u8>(); RA];
        for (j, q) in aq.iter_mut().enumerate() {
            *q = a.add(j * a_stride + b * F::ACT_BYTES + F::ACT_QS);
        }
        // Each row's exact block sum, in two independent chains (lanes 0..4, 4..8); with
        // an offset, the first starts at −offset · Σa.
        let mut sums = [[_mm256_setzero_si256(); 2]; RA];
        if offset != 0 && !signed {
            for (j, s) in sums.iter_mut().enumerate() {
                s[0] = _mm256_set1_epi32(*offsets.add(j * row_blocks + b));
            }
        }
        // With 16-bit pair sums and small enough quants, each chain's four lanes add up
        // as pairs and are widened once (eight lanes: the two chains together), which
        // saves most of the widening multiplies.
        let pairs_first = pairs_first::<F, D>();
        let mut pairs = [[_mm256_setzero_si256(); 2]; RA];
        for l in 0..4 {
            let (w_lo, w_hi) = unpack_lanes::<F>(gb, l, signed);
            let (m_lo, m_hi) = if signed { (_mm256_abs_epi8(w_lo), _mm256_abs_epi8(w_hi)) } else { (w_lo, w_hi) };
            for j in 0..RA {
                for (h, lane, wv, mag) in [(0, l, w_lo, m_lo), (1, l + 4, w_hi, m_hi)] {
                    let a4 = _mm256_set1_epi32((aq[j].add(4 * lane) as *const i32).read_unaligned());
                    if pairs_first {
                        let p = if signed { D::pairs(mag, _mm256_sign_epi8(a4, wv)) } else { D::pairs(wv, a4) };
                        pairs[j][h] = _mm256_add_epi16(pairs[j][h], p);
                        continue;
                    }
                    let s = sums[j][h];
                    sums[j][h] = match (signed, small) {
                        (true, _) => D::dot_small_from(s, mag, _mm256_sign_epi8(a4, wv)),
                        (false, true) => D::dot_small_from(s, wv, a4),
                        (false, false) => D::dot_from(s, wv, a4),
                    };
                }
            }
        }
        if pairs_first {
            for (s, p) in sums.iter_mut().zip(pairs) {
                if i16_lanes::<F>() >= 8 {
                    s[0] = _mm256_add_epi32(s[0], D::widen(_mm256_add_epi16(p[0], p[1])));
                } else {
                    s[0] = _mm256_add_epi32(s[0], D::widen(p[0]));
                    s[1] = _mm256_add_epi32(s[1], D::widen(p[1]));
                }
            }
        }
        let dw = weight_scales::<F>(gb);
        let mw = if has_min { f16x8(gb.add(m_at)) } else { _mm256_setzero_ps() };
        for j in 0..RA {
            let sc = scales_f32.add(2 * (j * row_blocks + b));
            let total = _mm256_cvtepi32_ps(_mm256_add_epi32(sums[j][0], sums[j][1]));
            acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(&*sc)), total, acc[j]);
            if has_min {
                acc[j] = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(&*sc.add(1)), acc[j]);
            }
        }
    }
    for (j, &v) in acc.iter().enumerate() {
        if chunk.last::<CHUNKED>() {
            store(out.add(j * ld), v, live, accumulate);
        } else {
            _mm256_storeu_ps(chunk.at(j, 0), v);
        }
    }
}

/// Write (or add) a tile row's eight results at `o`, the first `live` of them at an edge.
#[inline(always)]
pub(super) unsafe fn store(o: *mut f32, v: __m256, live: usize, accumulate: bool) {
    if live == GROUP {
        let v = if accumulate { _mm256_add_ps(_mm256_loadu_ps(o), v) } else { v };
        _mm256_storeu_ps(o, v);
    } else {
        let mut vals = [0f32; GROUP];
        _mm256_storeu_ps(vals.as_mut_ptr(), v);
        crate::gemm::store_live(o, &vals, live, accumulate);
    }
}
