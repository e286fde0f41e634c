//! Dropout on an adapter pair's input, as PEFT's `lora_dropout` does in training:
//! `y += s·B·A·(m ⊙ x) / (1 - p)`, with the base product seeing `x` unchanged.
//!
//! The mask is not stored. Each element's keep bit is a hash of the step's seed, the
//! layer, the target, the row and the column, so the backward recomputes the forward's
//! mask, the result does not depend on the thread count, and a resumed run draws the
//! same masks as one never stopped. Each target has its own mask, as PEFT gives each
//! wrapped module its own dropout.

use crate::lora::LoraTarget;

/// A step's dropout: each input element of every adapter pair is dropped with
/// probability `p` (rounded to a multiple of 2⁻³²), and the kept ones scaled by
/// `1 / (1 - p)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    pub p: f32,
    /// Draws differ between steps: the run gives each batch its own seed.
    pub seed: u64,
}

/// splitmix64's output function, a bijection on u64 (Steele, Lea and Flood).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const ROW_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl Dropout {
    /// Whether the element at `(row, col)` of the `target` pair's input in `layer` is kept.
    pub fn keep(&self, layer: usize, target: LoraTarget, row: usize, col: usize) -> bool {
        self.mask(layer, target).keep(row, col)
    }

    /// The multiplier of a kept element.
    pub fn scale(&self) -> f32 {
        1.0 / (1.0 - self.p)
    }

    pub(super) fn mask(&self, layer: usize, target: LoraTarget) -> PairMask {
        let key = mix64(self.seed ^ mix64(((layer as u64) << 3 | target.index() as u64).wrapping_add(ROW_GAMMA)));
        let threshold = (f64::from(self.p) * 4_294_967_296.0).round().min(u32::MAX as f64) as u32;
        PairMask { key, threshold, scale: self.scale() }
    }
}

/// One pair's mask for a step.
#[derive(Clone, Copy, Debug)]
pub(super) struct PairMask {
    key: u64,
    /// An element is dropped when its 32 random bits fall below this.
    threshold: u32,
    scale: f32,
}

impl PairMask {
    /// The 32 random bits of `(row, col)`: one 64-bit hash serves two columns.
    #[inline]
    fn bits(&self, row: usize, col: usize) -> u32 {
        let h = mix64(self.key ^ mix64((row as u64) << 32 | (col / 2) as u64));
        (h >> (32 * (col & 1))) as u32
    }

    fn keep(&self, row: usize, col: usize) -> bool {
        self.bits(row, col) >= self.threshold
    }

    /// `out[c] = x[c] · scale` where row `row` keeps column `c`, else 0.
    pub fn apply(&self, row: usize, x: &[f32], out: &mut [f32]) {
        self.each_factor(row, out.len(), |c, f| out[c] = x[c] * f);
    }

    /// `acc[c] += v[c] · scale` where row `row` keeps column `c`.
    pub fn add_masked(&self, row: usize, v: &[f32], acc: &mut [f32]) {
        self.each_factor(row, acc.len(), |c, f| acc[c] += v[c] * f);
    }

    /// `f(c, factor)` for every column, the factor being `scale` or 0.
    #[inline]
    fn each_factor(&self, row: usize, cols: usize, mut f: impl FnMut(usize, f32)) {
        for c in 0..cols {
            f(c, if self.keep(row, c) { self.scale } else { 0.0 });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_about_p_and_scales_the_rest() {
        for p in [0.05f32, 0.1, 0.5] {
            let d = Dropout { p, seed: 7 };
            let m = d.mask(3, LoraTarget::Up);
            let (rows, cols) = (64, 577);
            let x = vec![1.0f32; cols];
            let mut out = vec![0.0; cols];
            let mut dropped = 0usize;
            for r in 0..rows {
                m.apply(r, &x, &mut out);
                for (c, &v) in out.iter().enumerate() {
                    assert_eq!(v == 0.0, !d.keep(3, LoraTarget::Up, r, c));
                    assert!(v == 0.0 || v == d.scale());
                    dropped += (v == 0.0) as usize;
                }
            }
            let rate = dropped as f64 / (rows * cols) as f64;
            assert!((rate - p as f64).abs() < 0.02, "p {p}: dropped {rate}");
        }
    }

    #[test]
    fn masks_differ_by_seed_layer_and_target() {
        let bits = |d: Dropout, l: usize, t: LoraTarget| (0..2048).map(|i| d.keep(l, t, i / 64, i % 64)).collect::<Vec<_>>();
        let d = Dropout { p: 0.5, seed: 1 };
        let base = bits(d, 0, LoraTarget::Q);
        assert_eq!(base, bits(d, 0, LoraTarget::Q));
        for other in [bits(Dropout { seed: 2, ..d }, 0, LoraTarget::Q), bits(d, 1, LoraTarget::Q), bits(d, 0, LoraTarget::K)] {
            let same = base.iter().zip(&other).filter(|(a, b)| a == b).count();
            assert!((824..1224).contains(&same), "{same} of 2048 agree");
        }
    }

    #[test]
    fn p_zero_keeps_everything() {
        let d = Dropout { p: 0.0, seed: 5 };
        assert!((0..1000).all(|i| d.keep(2, LoraTarget::Down, i, i * 7)));
        assert_eq!(d.scale(), 1.0);
    }
}
