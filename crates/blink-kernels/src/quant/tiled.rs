//! llama.cpp's tiled products: how its x86 builds multiply a matrix of `Q5_K`, `Q6_K` or
//! `IQ4_XS` by eight activation rows or more (its `ggml-cpu/tiled` path; fewer rows take
//! the dot products of [`super::vec_dot_in`]).
//!
//! Per super-block the integer sums are exact: `s1 = Σ_g scale_g · Σ q·a` over the
//! block's groups (`Q6_K`: `q − 32`; `IQ4_XS`: the table's value `v`) and, for `Q5_K`,
//! `s2 = Σ_g min_g · Σ a`. The block then adds `(s1·d − dmin·s2) · d_a` to the output with
//! two roundings: `r = s1·d` (a multiply), `r = fma(−dmin, s2, r)`, `out = fma(r, d_a,
//! out)`. Both of its x86 builds compute that (its AVX-512 kernel writes the last step as
//! a multiply and an add, which GCC fuses). llama.cpp tiles `Q2_K`, `Q3_K` and the lattice
//! formats too; Blink does not follow it there yet (their rows keep the dot products).
//!
//! The builds differ in one product: `IQ4_XS`'s AVX2 kernel multiplies with the sign trick,
//! `|v| · sign(a, v)` in bytes, which wraps for an activation of −128 against a negative
//! `v` (every `Q8_K` block holds a −128), while the AVX-512 kernel's `v · a` is exact.

use blink_gguf::{GgmlType, QK_K};

use super::blocks::{Block, BlockIQ4XS, BlockQ5K, BlockQ6K, BlockQ8K};
use super::iquants::indices as iq4_indices;
use super::KVALUES_IQ4NL;
use crate::flavour::Flavour;

/// Whether llama.cpp multiplies `ty` by eight rows or more in the tiled way.
pub fn takes_tiled(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS)
}

/// One super-block's part of a tiled product: the exact sums and the block's scales.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TiledBlock {
    pub s1: i32,
    pub d: f32,
    /// `Q5_K`'s minimum: `s2` and `dmin`.
    pub min: Option<(i32, f32)>,
}

impl TiledBlock {
    /// `out` with this block added, for an activation block of scale `d_a`.
    #[inline]
    pub fn add_to(self, out: f32, d_a: f32) -> f32 {
        let mut r = self.s1 as f32 * self.d;
        if let Some((s2, dmin)) = self.min {
            r = (-dmin).mul_add(s2 as f32, r);
        }
        r.mul_add(d_a, out)
    }
}

/// One super-block of a tiled type decoded for its products: the values as multiplied,
/// the group scales and the block's scales.
#[derive(Clone, Copy, Debug)]
pub struct TiledWeights {
    values: [i8; QK_K],
    scales: [i32; 16],
    /// Elements per group: 16 (`Q6_K`) or 32.
    group: usize,
    d: f32,
    /// `Q5_K`'s eight mins and `dmin`.
    mins: Option<([i32; 8], f32)>,
    /// Whether the AVX2 build multiplies with the sign trick (`IQ4_XS`).
    sign_trick: bool,
}

impl TiledWeights {
    /// Block `w`, one super-block of `ty` (see [`takes_tiled`]).
    pub fn decode(ty: GgmlType, w: &[u8]) -> TiledWeights {
        let mut scales = [0i32; 16];
        match ty {
            GgmlType::Q5_K => {
                let b = BlockQ5K::read(w);
                let (sc, mins) = b.scales_mins();
                for (s, &x) in scales.iter_mut().zip(&sc) {
                    *s = x as i32;
                }
                TiledWeights { values: b.quants(), scales, group: 32, d: b.d.to_f32(), mins: Some((mins.map(i32::from), b.dmin.to_f32())), sign_trick: false }
            }
            GgmlType::Q6_K => {
                let b = BlockQ6K::read(w);
                TiledWeights { values: b.quants(), scales: b.scales.map(i32::from), group: 16, d: b.d.to_f32(), mins: None, sign_trick: false }
            }
            GgmlType::IQ4_XS => {
                let b = BlockIQ4XS::read(w);
                let mut values = [0i8; QK_K];
                for g in 0..8 {
                    let idx = iq4_indices(&b.qs[16 * g..16 * g + 16]);
                    for (v, &i) in values[32 * g..32 * g + 32].iter_mut().zip(&idx) {
                        *v = KVALUES_IQ4NL[i as usize];
                    }
                    scales[g] = b.group_scale(g);
                }
                TiledWeights { values, scales, group: 32, d: b.d.to_f32(), mins: None, sign_trick: true }
            }
            _ => panic!("{ty} has no tiled product"),
        }
    }

    /// This block against the `Q8_K` block `a`, as `flavour`'s build computes it.
    pub fn against(&self, flavour: Flavour, a: &BlockQ8K) -> TiledBlock {
        let trick = self.sign_trick && flavour == Flavour::Avx2;
        let s1 = self
            .values
            .chunks_exact(self.group)
            .zip(a.qs.chunks_exact(self.group))
            .zip(&self.scales)
            .map(|((v, x), &s)| {
                let exact: i32 = v.iter().zip(x).map(|(&v, &x)| v as i32 * x as i32).sum();
                // The sign trick's wrapped products: 128·v where the exact one is −128·v.
                let wrapped: i32 = if trick { v.iter().zip(x).filter(|&(&v, &x)| v < 0 && x == i8::MIN).map(|(&v, _)| 256 * v as i32).sum() } else { 0 };
                s * (exact + wrapped)
            })
            .sum();
        let min = self.mins.map(|(mins, dmin)| (mins.iter().enumerate().map(|(g, &m)| m * (a.bsums[2 * g] as i32 + a.bsums[2 * g + 1] as i32)).sum(), dmin));
        TiledBlock { s1, d: self.d, min }
    }
}

/// A row of `n` elements of `ty` (see [`takes_tiled`]) against a `Q8_K` row, as `flavour`'s
/// build of llama.cpp multiplies them in a tiled product.
pub fn vec_dot_tiled(flavour: Flavour, ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    assert!(takes_tiled(ty), "{ty} has no tiled product");
    assert!(n.is_multiple_of(QK_K), "{ty} rows are whole super-blocks");
    let (wb, ab) = (ty.type_size(), BlockQ8K::BYTES);
    assert!(w.len() >= n / QK_K * wb && act.len() >= n / QK_K * ab, "{ty} tiled dot of {n} elements: rows too short");
    (0..n / QK_K).fold(0f32, |out, b| {
        let a = BlockQ8K::read(&act[b * ab..]);
        TiledWeights::decode(ty, &w[b * wb..]).against(flavour, &a).add_to(out, a.d)
    })
}
