//! The lattice formats `IQ2_XXS`, `IQ2_XS`, `IQ2_S`, `IQ3_XXS` and `IQ3_S`: each piece of
//! eight (IQ2) or four (IQ3) weights is an index into a grid of magnitude vectors
//! ([`super::grids`]), with a sign per weight and an odd scale `2·ls + 1` per 16 or 32
//! weights, against `Q8_K` activations.
//!
//! Every format reads as eight 32-element [`Run`]s, and one definition serves them all.
//! The dot is llama.cpp's x86 kernels' ([`EightLanes`]): a run's magnitudes multiply its
//! activations with the signs put on the activations (`sign_epi8`, whose negation of −128
//! wraps, as in `IQ4_XS`), integer lane `k` takes elements `4k..4k + 4` of every run times
//! the scale of their half, and the lanes' float sum is multiplied at the end by the
//! format's unit (1/8 for IQ2, 1/4 for `IQ3_XXS`, 1 for `IQ3_S`).
//!
//! ggml's quantizers for these formats search the lattice with neighbour tables and an
//! importance matrix; Blink's (for tests and conversions) is a plain nearest-entry search:
//! valid blocks, not llama-quantize's choices.

use half::f16;

use super::blocks::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockQ8K};
use super::grids::*;
use super::rows::{EightLanes, QuantBlock};
use blink_gguf::QK_K;

/// Expand `N` packed entries of `per` codes of `bits` bits into bytes of `magnitudes`
/// (element 0 the lowest byte).
const fn expand<const N: usize>(codes: &[u16; N], magnitudes: &[u8], per: usize, bits: u32) -> [u64; N] {
    let mut out = [0u64; N];
    let mut i = 0;
    while i < N {
        let mut e = 0;
        while e < per {
            let c = (codes[i] >> (bits * e as u32)) & ((1 << bits) - 1);
            out[i] |= (magnitudes[c as usize] as u64) << (8 * e);
            e += 1;
        }
        i += 1;
    }
    out
}

/// The grids: eight magnitudes per entry (IQ2), or four (IQ3, in the low 32 bits).
pub static IQ2XXS_GRID: [u64; 256] = expand(&IQ2XXS_CODES, &IQ2XXS_MAGNITUDES, 8, 2);
pub static IQ2XS_GRID: [u64; 512] = expand(&IQ2XS_CODES, &IQ2XS_MAGNITUDES, 8, 2);
pub static IQ2S_GRID: [u64; 1024] = expand(&IQ2S_CODES, &IQ2S_MAGNITUDES, 8, 2);
pub static IQ3XXS_GRID: [u64; 256] = expand(&IQ3XXS_CODES, &IQ3XXS_MAGNITUDES, 4, 3);
pub static IQ3S_GRID: [u64; 512] = expand(&IQ3S_CODES, &IQ3S_MAGNITUDES, 4, 3);

/// A 7-bit sign code as eight sign bits: the eighth makes their count even.
#[inline]
pub fn sign_bits(code: u32) -> u8 {
    let c = (code & 127) as u8;
    c | (((c.count_ones() & 1) as u8) << 7)
}

/// One 32-element run of a lattice block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Run {
    /// The magnitudes of elements `8p..8p + 8` in `grid[p]`, element `8p` the lowest byte.
    pub grid: [u64; 4],
    /// Bit `e`: element `e` is negative.
    pub negative: u32,
    /// The odd scales `2·ls + 1` of elements 0..16 and 16..32.
    pub scales: [i32; 2],
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Sign bytes of the four 8-element pieces as one mask.
#[inline]
fn negatives(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// A lattice format: how its runs read, and its float conventions.
pub trait Lattice: super::blocks::Block {
    /// The grid its indices point into.
    fn grid() -> &'static [u64];
    /// Elements per grid entry (8 or 4).
    const PIECE: usize;
    /// Whether a sign byte stores seven bits and an even-parity eighth.
    const PARITY: bool;
    /// Whether the two halves of a run have their own scales.
    const HALF_SCALES: bool;
    /// The dot's final factor: a weight is `d · UNIT · (2·ls + 1) · magnitude`.
    const UNIT: f32;

    fn d(&self) -> f16;
    /// Run `r` (0..8).
    fn run(&self, r: usize) -> Run;
    /// A weight's scale `d · UNIT · (2·ls + 1)`, as ggml's dequantization computes it.
    fn weight_scale(d: f32, ls: i32) -> f32;
    /// The block for scale `d`, per run its `ls` pair (equal without half scales), grid
    /// indices (per piece) and sign bytes (per eight elements).
    fn pack(d: f16, ls: &[[i32; 2]; 8], index: &[[u16; 8]; 8], signs: &[[u8; 4]; 8]) -> Self;
}

impl Lattice for BlockIQ2XXS {
    fn grid() -> &'static [u64] {
        &IQ2XXS_GRID
    }
    const PIECE: usize = 8;
    const PARITY: bool = true;
    const HALF_SCALES: bool = false;
    const UNIT: f32 = 0.125;

    fn d(&self) -> f16 {
        self.d
    }

    /// Per run two words: four grid indices (bytes), then four 7-bit sign codes and `ls`
    /// in the top four bits.
    #[inline]
    fn run(&self, r: usize) -> Run {
        let (idx, aux) = (u32_at(&self.qs, 8 * r), u32_at(&self.qs, 8 * r + 4));
        let ls = (aux >> 28) as i32;
        Run {
            grid: std::array::from_fn(|p| IQ2XXS_GRID[((idx >> (8 * p)) & 255) as usize]),
            negative: negatives(std::array::from_fn(|p| sign_bits(aux >> (7 * p)))),
            scales: [2 * ls + 1; 2],
        }
    }

    fn weight_scale(d: f32, ls: i32) -> f32 {
        d * (0.5 + ls as f32) * 0.25
    }

    fn pack(d: f16, ls: &[[i32; 2]; 8], index: &[[u16; 8]; 8], signs: &[[u8; 4]; 8]) -> Self {
        let mut b = BlockIQ2XXS { d, qs: [0; 64] };
        for r in 0..8 {
            let idx = (0..4).fold(0u32, |w, p| w | (index[r][p] as u32) << (8 * p));
            let aux = (0..4).fold((ls[r][0] as u32) << 28, |w, p| w | ((signs[r][p] & 127) as u32) << (7 * p));
            b.qs[8 * r..8 * r + 4].copy_from_slice(&idx.to_le_bytes());
            b.qs[8 * r + 4..8 * r + 8].copy_from_slice(&aux.to_le_bytes());
        }
        b
    }
}

impl Lattice for BlockIQ2XS {
    fn grid() -> &'static [u64] {
        &IQ2XS_GRID
    }
    const PIECE: usize = 8;
    const PARITY: bool = true;
    const HALF_SCALES: bool = true;
    const UNIT: f32 = 0.125;

    fn d(&self) -> f16 {
        self.d
    }

    /// Per piece a 16-bit word: a 9-bit grid index and a 7-bit sign code; per run a byte
    /// of two 4-bit scales.
    #[inline]
    fn run(&self, r: usize) -> Run {
        let q = |p: usize| u16::from_le_bytes([self.qs[2 * (4 * r + p)], self.qs[2 * (4 * r + p) + 1]]) as u32;
        let sc = self.scales[r] as i32;
        Run {
            grid: std::array::from_fn(|p| IQ2XS_GRID[(q(p) & 511) as usize]),
            negative: negatives(std::array::from_fn(|p| sign_bits(q(p) >> 9))),
            scales: [2 * (sc & 15) + 1, 2 * (sc >> 4) + 1],
        }
    }

    fn weight_scale(d: f32, ls: i32) -> f32 {
        d * (0.5 + ls as f32) * 0.25
    }

    fn pack(d: f16, ls: &[[i32; 2]; 8], index: &[[u16; 8]; 8], signs: &[[u8; 4]; 8]) -> Self {
        let mut b = BlockIQ2XS { d, qs: [0; 64], scales: [0; 8] };
        for r in 0..8 {
            for p in 0..4 {
                let q = index[r][p] | ((signs[r][p] & 127) as u16) << 9;
                b.qs[2 * (4 * r + p)..2 * (4 * r + p) + 2].copy_from_slice(&q.to_le_bytes());
            }
            b.scales[r] = (ls[r][0] | ls[r][1] << 4) as u8;
        }
        b
    }
}

impl Lattice for BlockIQ2S {
    fn grid() -> &'static [u64] {
        &IQ2S_GRID
    }
    const PIECE: usize = 8;
    const PARITY: bool = false;
    const HALF_SCALES: bool = true;
    const UNIT: f32 = 0.125;

    fn d(&self) -> f16 {
        self.d
    }

    /// Per piece the grid index's low byte in `qs[0..32]`, its top two bits in the run's
    /// `qh` byte, a whole sign byte in `qs[32..64]`; per run two 4-bit scales.
    #[inline]
    fn run(&self, r: usize) -> Run {
        let qh = self.qh[r] as usize;
        let sc = self.scales[r] as i32;
        Run {
            grid: std::array::from_fn(|p| IQ2S_GRID[self.qs[4 * r + p] as usize | ((qh << (8 - 2 * p)) & 0x300)]),
            negative: negatives(std::array::from_fn(|p| self.qs[32 + 4 * r + p])),
            scales: [2 * (sc & 15) + 1, 2 * (sc >> 4) + 1],
        }
    }

    fn weight_scale(d: f32, ls: i32) -> f32 {
        d * (0.5 + ls as f32) * 0.25
    }

    fn pack(d: f16, ls: &[[i32; 2]; 8], index: &[[u16; 8]; 8], signs: &[[u8; 4]; 8]) -> Self {
        let mut b = BlockIQ2S { d, qs: [0; 64], qh: [0; 8], scales: [0; 8] };
        for r in 0..8 {
            for p in 0..4 {
                b.qs[4 * r + p] = index[r][p] as u8;
                b.qh[r] |= (((index[r][p] >> 8) & 3) as u8) << (2 * p);
                b.qs[32 + 4 * r + p] = signs[r][p];
            }
            b.scales[r] = (ls[r][0] | ls[r][1] << 4) as u8;
        }
        b
    }
}

impl Lattice for BlockIQ3XXS {
    fn grid() -> &'static [u64] {
        &IQ3XXS_GRID
    }
    const PIECE: usize = 4;
    const PARITY: bool = true;
    const HALF_SCALES: bool = false;
    const UNIT: f32 = 0.25;

    fn d(&self) -> f16 {
        self.d
    }

    /// Grid indices (bytes) per four elements in `qs[0..64]`; per run a word in
    /// `qs[64..96]`: four 7-bit sign codes and `ls` in the top four bits.
    #[inline]
    fn run(&self, r: usize) -> Run {
        let aux = u32_at(&self.qs, 64 + 4 * r);
        let ls = (aux >> 28) as i32;
        let g = |j: usize| IQ3XXS_GRID[self.qs[8 * r + j] as usize];
        Run {
            grid: std::array::from_fn(|p| g(2 * p) | g(2 * p + 1) << 32),
            negative: negatives(std::array::from_fn(|p| sign_bits(aux >> (7 * p)))),
            scales: [2 * ls + 1; 2],
        }
    }

    fn weight_scale(d: f32, ls: i32) -> f32 {
        d * (0.5 + ls as f32) * 0.5
    }

    fn pack(d: f16, ls: &[[i32; 2]; 8], index: &[[u16; 8]; 8], signs: &[[u8; 4]; 8]) -> Self {
        let mut b = BlockIQ3XXS { d, qs: [0; 96] };
        for r in 0..8 {
            for (j, &idx) in index[r].iter().enumerate() {
                b.qs[8 * r + j] = idx as u8;
            }
            let aux = (0..4).fold((ls[r][0] as u32) << 28, |w, p| w | ((signs[r][p] & 127) as u32) << (7 * p));
            b.qs[64 + 4 * r..68 + 4 * r].copy_from_slice(&aux.to_le_bytes());
        }
        b
    }
}

impl Lattice for BlockIQ3S {
    fn grid() -> &'static [u64] {
        &IQ3S_GRID
    }
    const PIECE: usize = 4;
    const PARITY: bool = false;
    const HALF_SCALES: bool = false;
    const UNIT: f32 = 1.0;

    fn d(&self) -> f16 {
        self.d
    }

    /// Per four elements the grid index's low byte in `qs`, its ninth bit in the run's
    /// `qh` byte; whole sign bytes per eight elements; per run a 4-bit scale.
    #[inline]
    fn run(&self, r: usize) -> Run {
        let qh = self.qh[r] as usize;
        let g = |j: usize| IQ3S_GRID[self.qs[8 * r + j] as usize | (((qh >> j) & 1) << 8)];
        let ls = ((self.scales[r / 2] >> (4 * (r % 2))) & 15) as i32;
        Run {
            grid: std::array::from_fn(|p| g(2 * p) | g(2 * p + 1) << 32),
            negative: negatives(std::array::from_fn(|p| self.signs[4 * r + p])),
            scales: [2 * ls + 1; 2],
        }
    }

    fn weight_scale(d: f32, ls: i32) -> f32 {
        d * (1 + 2 * ls) as f32
    }

    fn pack(d: f16, ls: &[[i32; 2]; 8], index: &[[u16; 8]; 8], signs: &[[u8; 4]; 8]) -> Self {
        let mut b = BlockIQ3S { d, qs: [0; 64], qh: [0; 8], signs: [0; 32], scales: [0; 4] };
        for r in 0..8 {
            for (j, &idx) in index[r].iter().enumerate() {
                b.qs[8 * r + j] = idx as u8;
                b.qh[r] |= (((idx >> 8) & 1) as u8) << j;
            }
            b.signs[4 * r..4 * r + 4].copy_from_slice(&signs[r]);
            b.scales[r / 2] |= (ls[r][0] as u8) << (4 * (r % 2));
        }
        b
    }
}

/// Element `e` (0..32) of a run: its magnitude and whether it is negative.
#[inline]
fn element(run: &Run, e: usize) -> (u8, bool) {
    ((run.grid[e / 8] >> (8 * (e % 8))) as u8, run.negative >> e & 1 == 1)
}

fn dequantize<B: Lattice>(b: &B, out: &mut [f32]) {
    let d = b.d().to_f32();
    for (r, out) in out[..QK_K].chunks_exact_mut(32).enumerate() {
        let run = b.run(r);
        let db = run.scales.map(|s| B::weight_scale(d, (s - 1) / 2));
        for (e, o) in out.iter_mut().enumerate() {
            let (g, neg) = element(&run, e);
            let v = db[e / 16] * g as f32;
            *o = if neg { -v } else { v };
        }
    }
}

/// Lane `k`: over elements `4k..4k + 4` of every run, the half's scale times magnitude
/// times the activation, negated (wrapping at −128) where the element is negative.
fn lanes<B: Lattice>(b: &B, act: &BlockQ8K) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for r in 0..8 {
        let run = b.run(r);
        for e in 0..32 {
            let (g, neg) = element(&run, e);
            let a = act.qs[32 * r + e];
            let a = if neg { a.wrapping_neg() } else { a };
            lanes[e / 4] += run.scales[e / 16] * g as i32 * a as i32;
        }
    }
    lanes
}

/// The nearest-entry search of [`Lattice`] formats (see the module notes).
fn quantize<B: Lattice>(x: &[f32]) -> B {
    let x = &x[..QK_K];
    let grid = B::grid();
    // The grid's largest magnitude.
    let top = grid.iter().flat_map(|&w| (0..B::PIECE).map(move |e| (w >> (8 * e)) as u8)).max().unwrap_or(1) as f32;
    // Per run (or half): the scale putting its largest magnitude on the grid's top.
    let half_amax: [[f32; 2]; 8] = std::array::from_fn(|r| std::array::from_fn(|h| x[32 * r + 16 * h..32 * r + 16 * h + 16].iter().fold(0f32, |m, v| m.max(v.abs()))));
    let want: [[f32; 2]; 8] = half_amax.map(|[a, b]| if B::HALF_SCALES { [a / top, b / top] } else { [a.max(b) / top; 2] });
    let max_want = want.iter().flatten().fold(0f32, |m, &v| m.max(v));
    let d = f16::from_f32(max_want / 31.0 / B::UNIT);
    let unit = d.to_f32() * B::UNIT;
    let ls: [[i32; 2]; 8] = want.map(|w| w.map(|t| if unit > 0.0 { ((t / unit - 1.0) / 2.0).round().clamp(0.0, 15.0) as i32 } else { 0 }));
    let mut index = [[0u16; 8]; 8];
    let mut signs = [[0u8; 4]; 8];
    for r in 0..8 {
        let xr = &x[32 * r..32 * r + 32];
        for (p, s) in signs[r].iter_mut().enumerate() {
            let piece = &xr[8 * p..8 * p + 8];
            let mut byte = piece.iter().enumerate().fold(0u8, |b, (i, &v)| b | ((v < 0.0) as u8) << i);
            if B::PARITY && byte.count_ones() % 2 == 1 {
                // Seven bits are stored: flip the sign that costs least.
                let i = (0..8).min_by(|&i, &j| piece[i].abs().total_cmp(&piece[j].abs())).unwrap_or(0);
                byte ^= 1 << i;
            }
            *s = byte;
        }
        for (j, idx) in index[r].iter_mut().enumerate().take(32 / B::PIECE) {
            let e0 = j * B::PIECE;
            let scale = unit * (2 * ls[r][e0 / 16] + 1) as f32;
            let target: Vec<f32> = (e0..e0 + B::PIECE).map(|e| if scale > 0.0 { xr[e].abs() / scale } else { 0.0 }).collect();
            let err = |w: u64| target.iter().enumerate().map(|(i, t)| (((w >> (8 * i)) & 255) as f32 - t).powi(2)).sum::<f32>();
            *idx = (0..grid.len()).min_by(|&a, &b| err(grid[a]).total_cmp(&err(grid[b]))).unwrap_or(0) as u16;
        }
    }
    B::pack(d, &ls, &index, &signs)
}

macro_rules! lattice_block {
    ($($t:ident),*) => {$(
        impl QuantBlock for $t {
            type Act = BlockQ8K;

            fn dequantize(&self, out: &mut [f32]) {
                dequantize(self, out);
            }

            fn quantize_ref(x: &[f32]) -> Self {
                quantize(x)
            }

            fn dot(&self, act: &BlockQ8K) -> f32 {
                self.lanes_value(act)
            }
        }

        impl EightLanes for $t {
            fn lanes(&self, act: &BlockQ8K) -> [i32; 8] {
                lanes(self, act)
            }

            fn scale(&self) -> f32 {
                self.d.to_f32()
            }

            const FINAL: f32 = <$t as Lattice>::UNIT;
        }
    )*};
}

lattice_block!(BlockIQ2XXS, BlockIQ2XS, BlockIQ2S, BlockIQ3XXS, BlockIQ3S);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::Block;

    fn wave(n: usize, phase: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 * 0.37 + phase).sin() * 1.7 + (i % 7) as f32 * 0.05) * 0.02).collect()
    }

    #[test]
    fn grids_hold_the_formats_magnitudes() {
        assert_eq!(IQ2XXS_GRID[0], 0x0808_0808_0808_0808);
        assert!(IQ2S_GRID.iter().all(|w| w.to_le_bytes().iter().all(|b| [8, 25, 43].contains(b))));
        assert!(IQ3S_GRID.iter().all(|&w| w >> 32 == 0 && w.to_le_bytes()[..4].iter().all(|b| b % 2 == 1 && *b <= 15)));
        // Entries are distinct.
        let mut g = IQ2S_GRID.to_vec();
        g.sort_unstable();
        g.dedup();
        assert_eq!(g.len(), 1024);
    }

    #[test]
    fn sign_codes_have_even_parity() {
        for c in 0..128 {
            assert_eq!(sign_bits(c).count_ones() % 2, 0);
            assert_eq!(sign_bits(c) & 127, c as u8);
        }
    }

    fn round_trip<B: Lattice + QuantBlock>(bound: f32) {
        let x = wave(QK_K, 0.3);
        let b = B::quantize_ref(&x);
        let mut y = vec![0f32; QK_K];
        b.dequantize(&mut y);
        let err = x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / x.iter().map(|a| a * a).sum::<f32>();
        assert!(err < bound, "{:?}: relative error {err}", std::any::type_name::<B>());
        // Packing reads back as it was packed.
        let again = B::quantize_ref(&y);
        let mut z = vec![0f32; QK_K];
        again.dequantize(&mut z);
        let err2 = y.iter().zip(&z).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / y.iter().map(|a| a * a).sum::<f32>();
        assert!(err2 <= err + 1e-6, "{:?}: requantized {err2} vs {err}", std::any::type_name::<B>());
    }

    #[test]
    fn round_trips_stay_close() {
        round_trip::<BlockIQ2XXS>(0.2);
        round_trip::<BlockIQ2XS>(0.15);
        round_trip::<BlockIQ2S>(0.12);
        round_trip::<BlockIQ3XXS>(0.06);
        round_trip::<BlockIQ3S>(0.05);
    }

    fn dot_matches<B: Lattice + EightLanes + Block>() {
        let w = wave(QK_K, 0.1);
        let a = wave(QK_K, 1.9);
        let wb = B::quantize_ref(&w);
        let ab = BlockQ8K::quantize_ref(&a);
        let (mut wd, mut ad) = (vec![0f32; QK_K], vec![0f32; QK_K]);
        wb.dequantize(&mut wd);
        ab.dequantize(&mut ad);
        // The sign trick's wrap: the activation of −128 against a negative weight.
        let wrap: f32 = (0..QK_K).filter(|&e| ab.qs[e] == -128 && wd[e] < 0.0).map(|e| 2.0 * (wd[e] * ad[e]).abs()).sum();
        let exact: f32 = wd.iter().zip(&ad).map(|(x, y)| x * y).sum();
        let got = crate::quant::rows::vec_dot_eight_lanes::<B>(1, wb.as_bytes(), ab.as_bytes());
        assert!((got - exact).abs() <= 1e-4 * exact.abs().max(1e-3) + wrap * 1.0001, "{got} vs {exact} (wrap {wrap})");
        assert_eq!(wb.dot(&ab), got);
    }

    #[test]
    fn dots_equal_the_dequantized_sums() {
        dot_matches::<BlockIQ2XXS>();
        dot_matches::<BlockIQ2XS>();
        dot_matches::<BlockIQ2S>();
        dot_matches::<BlockIQ3XXS>();
        dot_matches::<BlockIQ3S>();
    }
}
