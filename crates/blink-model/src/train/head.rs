//! The loss head: the final norm, the LM head and a cross-entropy over the vocabulary in
//! chunks of [`VOCAB_CHUNK`] rows, so no `[tokens × vocab]` matrix is ever held. Only
//! the rows that predict a target are computed. The first sweep finds each row's
//! log-sum-exp, target logit and best token; the backward sweeps again, turning each
//! chunk's logits into their gradient and multiplying it back through the head.

use blink_kernels::fgemm::{row_window, BSource};

use super::buffers::VOCAB_CHUNK;
use super::elementwise::{rms_norm, rms_norm_backward};
use super::{BatchLoss, Run};

/// One predicting row's running softmax statistics.
#[derive(Clone, Copy)]
struct RowStats {
    max: f32,
    /// `Σ exp(logit - max)` so far.
    sum: f64,
    target_logit: f32,
    best: (f32, usize),
}

impl Run<'_> {
    /// The rows that predict a target and the token each predicts, in row order.
    fn predicting_rows(&self) -> (Vec<usize>, Vec<usize>) {
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (start, len) in self.spans() {
            for t in start + 1..start + len {
                if self.targets[t] {
                    rows.push(t - 1);
                    targets.push(self.tokens[t] as usize);
                }
            }
        }
        (rows, targets)
    }

    /// The loss of the batch; with `weight`, also the gradient of the residual stream at
    /// the last layer's output (in `dx`, zero where a row predicts nothing).
    pub(super) unsafe fn loss_head(&self, weight: Option<f32>) -> BatchLoss {
        let w = &self.model.parts[0];
        let cfg = &self.model.cfg;
        let (rows, targets) = self.predicting_rows();
        let r = rows.len();
        let wv = self.w;
        let eps = cfg.norm_eps;
        self.ctx.each(r, |i| unsafe { rms_norm(wv.x.row(rows[i]), &w.output_norm, eps, wv.hf.row_mut(i)) });
        let head = w.output.mat_ref();
        let vocab = head.rows;
        let chunks: Vec<std::ops::Range<usize>> = (0..vocab).step_by(VOCAB_CHUNK).map(|c| c..(c + VOCAB_CHUNK).min(vocab)).collect();
        let mut stats = vec![RowStats { max: f32::NEG_INFINITY, sum: 0.0, target_logit: 0.0, best: (f32::NEG_INFINITY, 0) }; r];
        let logits = wv.logits;
        for chunk in &chunks {
            self.ctx.product(wv.hf, r, cfg.n_embd, BSource::WeightT(row_window(&head, chunk.clone())), chunk.len(), logits, false);
            let st = blink_runtime::pool::SharedMut::new(&mut stats);
            self.ctx.each(r, |i| unsafe {
                let s = &mut st.slice_mut(i..i + 1)[0];
                let row = &logits.row(i)[..chunk.len()];
                let m = row.iter().fold(s.max, |m, &v| m.max(v));
                let mut sum = s.sum * ((s.max - m) as f64).exp();
                for (j, &v) in row.iter().enumerate() {
                    sum += ((v - m) as f64).exp();
                    if v > s.best.0 {
                        s.best = (v, chunk.start + j);
                    }
                }
                if chunk.contains(&targets[i]) {
                    s.target_logit = row[targets[i] - chunk.start];
                }
                (s.max, s.sum) = (m, sum);
            });
        }
        let lse: Vec<f32> = stats.iter().map(|s| s.max + s.sum.ln() as f32).collect();
        let mut loss = BatchLoss { targets: r, ..BatchLoss::default() };
        for (i, s) in stats.iter().enumerate() {
            loss.nll_sum += (lse[i] - s.target_logit) as f64;
            loss.correct += usize::from(s.best.1 == targets[i]);
        }
        let Some(weight) = weight else { return loss };

        let dhf = wv.dhf;
        for (c, chunk) in chunks.iter().enumerate() {
            let window = row_window(&head, chunk.clone());
            self.ctx.product(wv.hf, r, cfg.n_embd, BSource::WeightT(window), chunk.len(), logits, false);
            self.ctx.each(r, |i| unsafe {
                let row = &mut logits.row_mut(i)[..chunk.len()];
                for v in row.iter_mut() {
                    *v = (*v - lse[i]).exp() * weight;
                }
                if chunk.contains(&targets[i]) {
                    row[targets[i] - chunk.start] -= weight;
                }
            });
            self.ctx.product(logits, r, chunk.len(), BSource::Weight(window), cfg.n_embd, dhf, c > 0);
        }
        let dx = wv.dx;
        self.ctx.each(self.n, |t| unsafe { dx.row_mut(t).fill(0.0) });
        self.ctx.each(r, |i| unsafe { rms_norm_backward(wv.x.row(rows[i]), &w.output_norm, eps, dhf.row(i), dx.row_mut(rows[i])) });
        loss
    }
}
