//! The int16 route of plain AVX2 for signed 8-bit quants (`Q8_0`), in both dot orders.
//!
//! With bytes, each 32 products cost a sign (`vpsignb`: the activations take the weights'
//! signs, so that `maddubs` can take the weights' magnitudes), a `maddubs` and a `madd`,
//! and on Zen 4 the sign runs on the same two pipes as the other two (`dot_floor` with a
//! sign in place of its xor: 58 GMAC/s against 70). Widened to 16 bits, the same
//! four-product lane sum is two `madd`s of pairs and an add, which any pipe takes (70
//! GMAC/s, with the second activation broadcast). So a batch
//! widens each weight group once into pairs ([`to_words`], a chunk of blocks at a time
//! that stays in L1, once per panel of activation rows) and its activation rows once
//! ([`widen_activations`]; a panel at a time when there are several), and the tiles
//! ([`tile_words`] in llama.cpp's order, [`tile_words_block`] in the block order) load
//! both as they are. The lane and block sums are the same exact integers, so the bits are
//! those of the byte kernels.

use std::arch::x86_64::*;

use super::tiles::{lane_sum, store, Chunk, Tile, PARTIAL_FLOATS};
use super::{tiling, Ahead, Fam32, Out};

/// Bytes of one widened group-block: the eight rows' f16 scales, then per lane two
/// vectors of the eight rows' 16-bit pairs, quants `4l, 4l + 1` and `4l + 2, 4l + 3`.
pub(super) const WORDS_BLOCK: usize = 16 + 8 * 64;

/// Bytes of one widened activation block: its 32 quants as 16-bit values.
pub(super) const ACT_WORDS_BLOCK: usize = 64;

/// A widened group's rows are in the order 0 1 4 5 2 3 6 7 (what one in-lane shuffle of
/// two widened halves gives): its f16 scales are put in that order ([`to_words`]), and a
/// tile's outputs back in row order ([`in_row_order`]).
const WIDENED_ORDER: __m128i = unsafe { std::mem::transmute::<[u8; 16], __m128i>([0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]) };

/// Eight outputs in the widened order, in row order.
#[inline(always)]
unsafe fn in_row_order(v: __m256) -> __m256 {
    _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)))
}

/// Activation rows from which a product takes the route, in either order: the widening
/// is paid once per group (`gemm_stream`, in cache, llama.cpp's order: 8 rows no gain, 12
/// rows 46 -> 48 GMAC/s, 16 rows 46 -> 49.6, 128 rows 46 -> 53; the 28 MB output matrix
/// streamed, 16 rows 44 -> 46; the block order: 4 and 8 rows slower, 46-48 and 54-57
/// against 52-60, 12 rows the same, ~60, 14 rows 57 -> 59, 16 rows 59-60 -> 61-63, 128
/// rows 57-60 -> 65-69).
pub(in crate::gemm) const WORDS_MIN_ROWS: usize = 12;

/// Whether `F` takes the route on a kernel that multiplies bytes with the sign trick:
/// signed 8-bit quants stored as such (not a table's), in either order.
pub(super) const fn takes<F: Fam32>(sign_trick: bool) -> bool {
    sign_trick && F::SIGNED && F::LUT.is_none() && F::FIELDS.bits == 8 && F::FIELDS.scale == 2 && !F::STORED_UNSIGNED
}

/// The packed group at `src` (`n_blocks` group-blocks of `F`) widened into `dst`.
#[inline(always)]
pub(super) unsafe fn to_words<F: Fam32>(n_blocks: usize, src: *const u8, dst: &mut Vec<u8>) {
    let (_, _, qs_at) = F::FIELDS.packed_offsets();
    dst.resize(n_blocks * WORDS_BLOCK, 0);
    for b in 0..n_blocks {
        let (gb, out) = (src.add(b * F::FIELDS.group_block()), dst.as_mut_ptr().add(b * WORDS_BLOCK));
        // The scales in the rows' widened order.
        let d = _mm_loadu_si128(gb as *const __m128i);
        _mm_storeu_si128(out as *mut __m128i, _mm_shuffle_epi8(d, WIDENED_ORDER));
        for l in 0..8 {
            // Row r's four quants are 32-bit word r of the lane; widened, rows 0-3 fill
            // one vector and rows 4-7 the other, each row as two 32-bit pairs.
            let v = _mm256_loadu_si256(gb.add(qs_at + 32 * l) as *const __m256i);
            let low = _mm256_castsi256_ps(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
            let high = _mm256_castsi256_ps(_mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(v)));
            // Each row's first pairs, then its second, rows in the widened order.
            let at = out.add(16 + 64 * l) as *mut f32;
            _mm256_storeu_ps(at, _mm256_shuffle_ps::<0b10_00_10_00>(low, high));
            _mm256_storeu_ps(at.add(8), _mm256_shuffle_ps::<0b11_01_11_01>(low, high));
        }
    }
}

/// The quants of `n_act` activation rows (`n_blocks` blocks of `F`'s activation format,
/// `stride` bytes apart) widened into `dst`, row after row.
#[inline(always)]
pub(super) unsafe fn widen_activations<F: Fam32>(act: *const u8, stride: usize, n_act: usize, n_blocks: usize, dst: &mut Vec<u8>) {
    dst.resize(n_act * n_blocks * ACT_WORDS_BLOCK, 0);
    for j in 0..n_act {
        for b in 0..n_blocks {
            let q = act.add(j * stride + b * F::ACT_BYTES + F::ACT_QS) as *const __m128i;
            let out = dst.as_mut_ptr().add((j * n_blocks + b) * ACT_WORDS_BLOCK) as *mut __m256i;
            _mm256_storeu_si256(out, _mm256_cvtepi8_epi16(_mm_loadu_si128(q)));
            _mm256_storeu_si256(out.add(1), _mm256_cvtepi8_epi16(_mm_loadu_si128(q.add(1))));
        }
    }
}

/// One tile of a widened group ([`to_words`]) × `RA` widened activation rows, in the
/// `Llama` order: the lanes in two passes of four, as [`super::tiles::tile_lanes`] makes
/// them, for the same registers.
#[inline(always)]
pub(super) unsafe fn tile_words<const RA: usize, const CHUNKED: bool>(t: Tile) {
    let mut acc = [[_mm256_setzero_ps(); 8]; RA];
    let mut tail = [_mm256_setzero_ps(); RA];
    if !t.chunk.first::<CHUNKED>() {
        for j in 0..RA {
            t.chunk.load_lanes(j, &mut acc[j], &mut tail[j]);
        }
    }
    if RA == 1 {
        words_pass::<RA, CHUNKED, 0, 8>(t, &mut acc);
    } else {
        words_pass::<RA, CHUNKED, 0, 4>(t, &mut acc);
        words_pass::<RA, CHUNKED, 4, 4>(t, &mut acc);
    }
    let Tile { out, ld, accumulate, live, chunk, .. } = t;
    for (j, acc) in acc.iter().enumerate() {
        if chunk.last::<CHUNKED>() {
            // (Plus zero, as the byte kernels add a format's missing minimums.)
            store(out.add(j * ld), in_row_order(lane_sum(acc, tail[j])), live, accumulate);
        } else {
            chunk.save_lanes(j, acc, tail[j]);
        }
    }
}

/// Lanes `FIRST..FIRST + COUNT` of a [`tile_words`] tile over every block, into `acc`.
// (A lane indexes the weight pairs, the activations and every row's accumulators.)
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn words_pass<const RA: usize, const CHUNKED: bool, const FIRST: usize, const COUNT: usize>(t: Tile, acc: &mut [[__m256; 8]; RA]) {
    let Tile { n_blocks, w, a, a_stride, scales: scales_f32, ahead, .. } = t;
    let row_blocks = t.row_blocks::<CHUNKED>();
    for b in 0..n_blocks {
        if FIRST == 0 {
            ahead.fetch::<false>(b);
        }
        let gb = w.add(b * WORDS_BLOCK);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i));
        let mut scales = [_mm256_setzero_ps(); RA];
        let mut aw = [std::ptr::null::<u8>(); RA];
        for j in 0..RA {
            aw[j] = a.add(j * a_stride + b * ACT_WORDS_BLOCK);
            scales[j] = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*scales_f32.add(2 * (j * row_blocks + b))));
        }
        for lane in FIRST..FIRST + COUNT {
            let pairs = gb.add(16 + 64 * lane) as *const __m256i;
            let (first, second) = (_mm256_loadu_si256(pairs), _mm256_loadu_si256(pairs.add(1)));
            for j in 0..RA {
                let at = aw[j].add(8 * lane) as *const i32;
                let (a01, a23) = (_mm256_set1_epi32(at.read_unaligned()), _mm256_set1_epi32(at.add(1).read_unaligned()));
                let sums = _mm256_add_epi32(_mm256_madd_epi16(first, a01), _mm256_madd_epi16(second, a23));
                acc[j][lane] = _mm256_fmadd_ps(scales[j], _mm256_cvtepi32_ps(sums), acc[j][lane]);
            }
        }
    }
}

/// One tile of a widened group ([`to_words`]) × `RA` widened activation rows, in the
/// `Block` order: each row's exact block sum (two `madd`s of pairs and an add a lane),
/// then one float step a block, as [`super::tiles::tile_block`] makes them. With no sign
/// to apply and no lanes to keep apart, each pair of weight vectors serves `RA` rows.
// (A lane indexes the weight pairs and the activations.)
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn tile_words_block<const RA: usize, const CHUNKED: bool>(t: Tile) {
    let Tile { n_blocks, chunk, w, a, a_stride, scales: scales_f32, out, ld, accumulate, live, ahead, .. } = t;
    let row_blocks = t.row_blocks::<CHUNKED>();
    let mut acc = [_mm256_setzero_ps(); RA];
    if !chunk.first::<CHUNKED>() {
        for (j, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_loadu_ps(chunk.at(j, 0));
        }
    }
    for b in 0..n_blocks {
        ahead.fetch::<false>(b);
        let gb = w.add(b * WORDS_BLOCK);
        let mut sums = [_mm256_setzero_si256(); RA];
        for lane in 0..8 {
            let pairs = gb.add(16 + 64 * lane) as *const __m256i;
            let (first, second) = (_mm256_loadu_si256(pairs), _mm256_loadu_si256(pairs.add(1)));
            for j in 0..RA {
                let at = a.add(j * a_stride + b * ACT_WORDS_BLOCK + 8 * lane) as *const i32;
                let (a01, a23) = (_mm256_set1_epi32(at.read_unaligned()), _mm256_set1_epi32(at.add(1).read_unaligned()));
                sums[j] = _mm256_add_epi32(sums[j], _mm256_add_epi32(_mm256_madd_epi16(first, a01), _mm256_madd_epi16(second, a23)));
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i));
        for j in 0..RA {
            let da = _mm256_broadcast_ss(&*scales_f32.add(2 * (j * row_blocks + b)));
            acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(sums[j]), acc[j]);
        }
    }
    for (j, &v) in acc.iter().enumerate() {
        if chunk.last::<CHUNKED>() {
            store(out.add(j * ld), in_row_order(v), live, accumulate);
        } else {
            _mm256_storeu_ps(chunk.at(j, 0), v);
        }
    }
}

/// The tiles of one packed group at `src` (its first `live` rows), widened a chunk of
/// blocks at a time into `words` ([`tiling::k_chunk_blocks`]: a chunk and a tile's
/// activation rows fill at most half of L1), against `n_act` widened activation rows with
/// their block scales (`d`, unused `s` pairs); `partial` keeps the tiles' sums between
/// chunks. The tiles ask for what comes next (the group's next chunk, or the
/// `next_bytes` at `next` after the last), spread over their blocks.
#[inline(always)]
pub(super) unsafe fn group_tiles<F: Fam32, const BLOCK: bool>(n_blocks: usize, src: *const u8, words: &mut Vec<u8>, act: &[u8], n_act: usize, scales: &[f32], live: usize, out: Out, (next, next_bytes): (*const u8, usize), partial: &mut Vec<f32>) {
    let a_stride = n_blocks * ACT_WORDS_BLOCK;
    assert!(act.len() >= n_act * a_stride && scales.len() >= 2 * n_act * n_blocks);
    let group_block = F::FIELDS.group_block();
    // Activation rows a tile: two in the `Llama` order (its lanes' accumulators fill the
    // registers), four in the `Block` order (the rows left, below).
    let wide = if BLOCK { 4 } else { 2 };
    let tiles = n_act.div_ceil(wide);
    let chunk_blocks = tiling::k_chunk_blocks(n_blocks, WORDS_BLOCK, ACT_WORDS_BLOCK, wide, tiling::l1_bytes());
    if chunk_blocks < n_blocks {
        partial.resize(n_act * PARTIAL_FLOATS, 0.0);
    }
    for k0 in (0..n_blocks).step_by(chunk_blocks) {
        let k1 = (k0 + chunk_blocks).min(n_blocks);
        to_words::<F>(k1 - k0, src.add(k0 * group_block), words);
        let chunk = if chunk_blocks < n_blocks { Chunk { partial: partial.as_mut_ptr(), first: k0 == 0, last: k1 == n_blocks } } else { Chunk::WHOLE };
        let (next, next_bytes) = if k1 < n_blocks { (src.add(k1 * group_block), (n_blocks - k1).min(chunk_blocks) * group_block) } else { (next, next_bytes) };
        let tile = |j: usize, k: usize| Tile {
            n_blocks: k1 - k0,
            row_blocks: n_blocks,
            chunk: Chunk { partial: if chunk.partial.is_null() { chunk.partial } else { chunk.partial.add(j * PARTIAL_FLOATS) }, ..chunk },
            w: words.as_ptr(),
            a: act.as_ptr().add(j * a_stride + k0 * ACT_WORDS_BLOCK),
            a_stride,
            scales: scales.as_ptr().add(2 * (j * n_blocks + k0)),
            offsets: std::ptr::null(),
            out: out.ptr.add(j * out.ld),
            ld: out.ld,
            accumulate: out.accumulate,
            live,
            ahead: Ahead::new(next, next_bytes, k, tiles, k1 - k0),
        };
        macro_rules! tile {
            ($kernel:ident, $ra:literal, $j:expr, $k:expr) => {
                match chunk_blocks < n_blocks {
                    true => $kernel::<$ra, true>(tile($j, $k)),
                    false => $kernel::<$ra, false>(tile($j, $k)),
                }
            };
        }
        let (mut j, mut k) = (0, 0);
        while n_act - j >= wide {
            if BLOCK {
                tile!(tile_words_block, 4, j, k);
            } else {
                tile!(tile_words, 2, j, k);
            }
            j += wide;
            k += 1;
        }
        // The rows left: one tile of all of them in the `Block` order, one a row in the
        // `Llama` order.
        match (BLOCK, n_act - j) {
            (_, 0) => {}
            (true, 1) => tile!(tile_words_block, 1, j, k),
            (true, 2) => tile!(tile_words_block, 2, j, k),
            (true, _) => tile!(tile_words_block, 3, j, k),
            (false, _) => tile!(tile_words, 1, j, k),
        }
    }
}
