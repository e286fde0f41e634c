//! An adapter pair's part of a training step. Forward: `y += s·B·(A·x)`, keeping
//! `s·A·x`. Backward, for an output gradient `dy`: `dB += (s·A·x)ᵀ·dy` (as `dBᵀ`),
//! `dA += (s·dy·B)ᵀ·x` and `dx += (s·dy·B)·A`. With dropout, `x` is the masked input
//! (recomputed in the backward) and `dx` takes the mask too.

use blink_kernels::fgemm::BSource;

use super::buffers::{LoraTemps, M};
use super::ctx::Ctx;
use super::dropout::PairMask;
use crate::lora::LoraPair;

/// One pair's weights and gradients, as the step reads and writes them.
#[derive(Clone, Copy)]
pub(super) struct PairView<'a> {
    pub pair: &'a LoraPair,
    pub scale: f32,
    /// `dA`, `[rank][cols]`, and `dB`, `[rows][rank]`, added to.
    pub ga: M,
    pub gb: M,
    /// The step's dropout mask on this pair's input, if any.
    pub drop: Option<PairMask>,
}

impl Ctx<'_> {
    /// `y += s·B·(A·x)` over `n` tokens; `saved` receives `s·A·x`.
    ///
    /// # Safety
    /// The matrices hold `n` rows of the pair's shapes; nothing else touches `y` or `saved`.
    pub(super) unsafe fn lora_forward(&self, p: &PairView, n: usize, x: M, y: M, saved: M, tmp: &LoraTemps) {
        let (r, cols, rows) = (p.pair.rank, p.pair.cols, p.pair.rows);
        let x = self.dropped(p, n, x, tmp);
        self.product(x, n, cols, BSource::F32T { data: &p.pair.a, ld: cols }, r, saved, false);
        let s = p.scale;
        self.each(n, |t| unsafe { saved.row_mut(t).iter_mut().for_each(|v| *v *= s) });
        self.product(saved, n, r, BSource::F32T { data: &p.pair.b, ld: r }, rows, y, true);
    }

    /// The pair's gradients from `dy` (its output's), and `dx += …` for its input `x`.
    ///
    /// # Safety
    /// As for [`Ctx::lora_forward`]; `saved` is what it kept for these tokens.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn lora_backward(&self, p: &PairView, n: usize, x: M, saved: M, dy: M, dx: M, tmp: &LoraTemps) {
        let (r, cols, rows) = (p.pair.rank, p.pair.cols, p.pair.rows);
        let (t, tt, dbt) = (M { cols: r, ..tmp.t }, M { cols: n, ..tmp.tt }, M { cols: rows, ..tmp.dbt });
        // dBᵀ = (s·A·x)ᵀ · dy, added into dB transposed.
        transpose(self, saved, n, r, tt);
        self.product(tt, r, n, BSource::F32 { data: dy.rows(n), ld: dy.cols }, rows, dbt, false);
        let gb = p.gb;
        self.each(rows, |o| unsafe {
            for (j, g) in gb.row_mut(o).iter_mut().enumerate() {
                *g += *dbt.at(j, o);
            }
        });
        // t = s·dy·B; then dA += tᵀ·x and dx += t·A.
        self.product(dy, n, rows, BSource::F32 { data: &p.pair.b, ld: r }, r, t, false);
        let s = p.scale;
        self.each(n, |i| unsafe { t.row_mut(i).iter_mut().for_each(|v| *v *= s) });
        transpose(self, t, n, r, tt);
        let xd = self.dropped(p, n, x, tmp);
        self.product(tt, r, n, BSource::F32 { data: xd.rows(n), ld: xd.cols }, cols, p.ga, true);
        match p.drop {
            None => self.product(t, n, r, BSource::F32 { data: &p.pair.a, ld: cols }, cols, dx, true),
            Some(mask) => {
                // t·A into the masked input's buffer (done with), then masked into dx.
                let ta = M { cols, ..tmp.x };
                self.product(t, n, r, BSource::F32 { data: &p.pair.a, ld: cols }, cols, ta, false);
                self.each(n, |i| unsafe { mask.add_masked(i, ta.row(i), &mut dx.row_mut(i)[..cols]) });
            }
        }
    }

    /// The pair's input as its products see it: `x` itself, or `x` through the step's
    /// dropout mask (into the temporaries' input buffer).
    unsafe fn dropped(&self, p: &PairView, n: usize, x: M, tmp: &LoraTemps) -> M {
        let Some(mask) = p.drop else { return x };
        let xd = M { cols: p.pair.cols, ..tmp.x };
        self.each(n, |i| unsafe { mask.apply(i, &x.row(i)[..xd.cols], xd.row_mut(i)) });
        xd
    }
}

/// `dst[j][i] = src[i][j]` for `n` rows of `r`.
unsafe fn transpose(ctx: &Ctx, src: M, n: usize, r: usize, dst: M) {
    ctx.each(r, |j| unsafe {
        let d = dst.row_mut(j);
        for (i, v) in d.iter_mut().enumerate().take(n) {
            *v = *src.at(i, j);
        }
    });
}
