//! One step's computation, run by every pool thread together.
//!
//! Phases are separated by barriers. Each phase splits its work so that no two threads
//! write the same element, and every value a phase reads was written before the barrier
//! that opened it.

use blink_gguf::GgmlType;
use blink_kernels::cpu::{self, Isa};
use blink_kernels::gemm::{self, Out};
use blink_kernels::ops;
use blink_kernels::pool::{SharedMut, ThreadPool, Worker};
use blink_kernels::quant;
use blink_kernels::attention::{self, Online};

use super::{Scratch, StepRow};
use crate::kv_cache::{BlockTables, KvElem, KvLayout, KvStore, BLOCK_TOKENS};
use crate::weights::{LayerWeights, Matrix};
use crate::Model;

/// Whether a projection overwrites its output or adds to it (residual connections).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Write {
    Set,
    Add,
}

/// A `[rows][stride]` f32 matrix shared by the pool threads.
struct Buf<'a> {
    data: SharedMut<'a, f32>,
    stride: usize,
}

impl<'a> Buf<'a> {
    fn new(data: &'a mut [f32], stride: usize) -> Self {
        Buf { data: SharedMut::new(data), stride }
    }

    /// Row `r`, first `len` values.
    ///
    /// # Safety
    /// The caller owns row `r` for writing in the current phase.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    unsafe fn row_mut(&self, r: usize, len: usize) -> &mut [f32] {
        self.data.slice_mut(r * self.stride..r * self.stride + len)
    }

    /// # Safety
    /// Nobody writes row `r` in the current phase.
    #[inline]
    unsafe fn row(&self, r: usize, len: usize) -> &[f32] {
        self.data.slice(r * self.stride..r * self.stride + len)
    }
}

pub(super) struct Pass<'a, T: KvElem> {
    model: &'a Model,
    rows: &'a [StepRow],
    logit_rows: &'a [usize],
    x: Buf<'a>,
    xn: Buf<'a>,
    q: Buf<'a>,
    k: Buf<'a>,
    v: Buf<'a>,
    attn: Buf<'a>,
    gate: Buf<'a>,
    up: Buf<'a>,
    logits: Buf<'a>,
    act: SharedMut<'a, u8>,
    act_stride: usize,
    rope: Buf<'a>,
    qh: Buf<'a>,
    kc: SharedMut<'a, T>,
    vc: SharedMut<'a, T>,
    tables: BlockTables<'a>,
    layout: KvLayout,
    isa: Isa,
}

impl<'a, T: KvElem> Pass<'a, T> {
    pub(super) fn new(
        model: &'a Model,
        rows: &'a [StepRow],
        s: &'a mut Scratch,
        tables: BlockTables<'a>,
        store: &'a mut KvStore<T>,
        n_threads: usize,
        layout: KvLayout,
    ) -> Self {
        assert!(n_threads <= s.n_threads(), "scratch sized for fewer threads than the pool has");
        let cfg = &model.cfg;
        let wide = s.xn.len() / s.max_rows();
        let vocab = cfg.vocab_size;
        Pass {
            model,
            rows,
            logit_rows: &s.logit_rows,
            x: Buf::new(&mut s.x, cfg.n_embd),
            xn: Buf::new(&mut s.xn, wide),
            q: Buf::new(&mut s.q, cfg.q_dim()),
            k: Buf::new(&mut s.k, cfg.kv_dim()),
            v: Buf::new(&mut s.v, cfg.kv_dim()),
            attn: Buf::new(&mut s.attn, cfg.q_dim()),
            gate: Buf::new(&mut s.gate, cfg.n_ff),
            up: Buf::new(&mut s.up, cfg.n_ff),
            logits: Buf::new(&mut s.logits, vocab),
            act: SharedMut::new(&mut s.act),
            act_stride: s.act_stride,
            rope: Buf::new(&mut s.rope, cfg.rope.n_dims),
            qh: Buf::new(&mut s.qh, cfg.head_dim),
            kc: SharedMut::new(&mut store.k),
            vc: SharedMut::new(&mut store.v),
            tables,
            layout,
            isa: cpu::active(),
        }
    }

    pub(super) fn run(&self, pool: &ThreadPool) {
        pool.run(|w| self.run_on(w));
    }

    fn run_on(&self, w: &Worker) {
        let cfg = &self.model.cfg;
        let n = self.rows.len();
        self.embed(w);
        w.barrier();
        for (l, lw) in self.model.weights.layers.iter().enumerate() {
            self.norm_rows(w, &lw.attn_norm, n, |r| r);
            self.project(w, &self.xn, cfg.n_embd, n, &[(&lw.wq, &self.q, Write::Set), (&lw.wk, &self.k, Write::Set), (&lw.wv, &self.v, Write::Set)]);
            self.qkv_post(w, l, lw);
            w.barrier();
            self.attention(w, l);
            w.barrier();
            self.project(w, &self.attn, cfg.q_dim(), n, &[(&lw.wo, &self.x, Write::Add)]);

            self.norm_rows(w, &lw.ffn_norm, n, |r| r);
            self.project(w, &self.xn, cfg.n_embd, n, &[(&lw.w_gate, &self.gate, Write::Set), (&lw.w_up, &self.up, Write::Set)]);
            for r in w.share(n, 1) {
                // SAFETY: rows are split between threads; gate/up were completed before the barrier.
                unsafe { ops::swiglu(self.isa, self.gate.row_mut(r, cfg.n_ff), self.up.row(r, cfg.n_ff)) };
            }
            self.project(w, &self.gate, cfg.n_ff, n, &[(&lw.w_down, &self.x, Write::Add)]);
        }
        let n_logits = self.logit_rows.len();
        if n_logits > 0 {
            let weights = &self.model.weights;
            self.norm_rows(w, &weights.output_norm, n_logits, |i| self.logit_rows[i]);
            self.project(w, &self.xn, cfg.n_embd, n_logits, &[(&weights.output, &self.logits, Write::Set)]);
        }
    }

    /// Token embeddings into the residual stream.
    fn embed(&self, w: &Worker) {
        let d = self.model.cfg.n_embd;
        for r in w.share(self.rows.len(), 1) {
            // SAFETY: each thread writes only its own rows.
            let out = unsafe { self.x.row_mut(r, d) };
            self.model.weights.token_embd.dequantize_row(self.rows[r].token as usize, out);
        }
    }

    /// `xn[i] = rms_norm(x[src(i)]) * weight` for `i in 0..count`. No barrier: the next
    /// projection quantizes the same rows on the same thread first.
    fn norm_rows(&self, w: &Worker, weight: &[f32], count: usize, src: impl Fn(usize) -> usize) {
        let d = self.model.cfg.n_embd;
        let eps = self.model.cfg.norm_eps;
        for i in w.share(count, 1) {
            // SAFETY: x is read-only in this phase; xn rows are split between threads.
            unsafe { ops::rms_norm(self.isa, self.x.row(src(i), d), weight, eps, self.xn.row_mut(i, d)) };
        }
    }

    /// Multiply `count` rows of `input` (width `cols`) by each matrix, writing or adding the
    /// results into its output. Activations are quantized once per distinct format, and
    /// barriers separate quantization from the products and the products from what follows.
    fn project(&self, w: &Worker, input: &Buf, cols: usize, count: usize, outputs: &[(&Matrix, &Buf, Write)]) {
        let mut quantized: Option<GgmlType> = None;
        for &(m, out, mode) in outputs {
            let act_ty = quant::vec_dot_type(m.ty);
            if quantized != Some(act_ty) {
                if quantized.is_some() {
                    w.barrier();
                }
                self.quantize_rows(w, input, cols, count, act_ty);
                w.barrier();
                quantized = Some(act_ty);
            }
            self.matmul(w, m, count, out, mode);
        }
        w.barrier();
    }

    fn quantize_rows(&self, w: &Worker, input: &Buf, cols: usize, count: usize, ty: GgmlType) {
        let bytes = ty.row_bytes(cols as u64).expect("checked at load") as usize;
        for r in w.share(count, 1) {
            // SAFETY: input rows are read-only here (written by this same thread or before a
            // barrier); act rows are split between threads.
            unsafe {
                let dst = self.act.slice_mut(r * self.act_stride..r * self.act_stride + bytes);
                ops::quantize_row(self.isa, ty, input.row(r, cols), dst);
            }
        }
    }

    /// `out[r][i] (+)= m[i] · act[r]` for this thread's share of output features `i`.
    fn matmul(&self, w: &Worker, m: &Matrix, count: usize, out: &Buf, mode: Write) {
        let rows = w.share(m.rows, gemm::ROW_ALIGN);
        // SAFETY: act is read-only in this phase (written before the last barrier); this
        // thread alone writes columns `rows` of `out`, which holds `count` rows of `stride`.
        unsafe {
            let act = self.act.slice(0..count * self.act_stride);
            let target = Out { ptr: out.data.as_mut_ptr(), ld: out.stride, accumulate: mode == Write::Add };
            gemm::gemm(self.isa, m.ty, m.layout, m.cols, m.bytes(), rows, act, self.act_stride, count, target);
        }
    }

    /// Biases, Q/K norms and rotary embedding; then K and V go into the cache.
    fn qkv_post(&self, w: &Worker, layer: usize, lw: &LayerWeights) {
        let cfg = &self.model.cfg;
        let hd = cfg.head_dim;
        let rope = &self.model.rope;
        // SAFETY: per-thread scratch row.
        let angles = unsafe { self.rope.row_mut(w.tid, rope.n_dims()) };
        for r in w.share(self.rows.len(), 1) {
            let row = self.rows[r];
            // SAFETY: each thread owns its rows of q, k, v, and the cache slots of those rows'
            // positions (distinct rows have distinct (sequence, position) pairs).
            let (q, k, v) = unsafe { (self.q.row_mut(r, cfg.q_dim()), self.k.row_mut(r, cfg.kv_dim()), self.v.row_mut(r, cfg.kv_dim())) };
            for (x, b) in [(&mut *q, &lw.bq), (&mut *k, &lw.bk), (&mut *v, &lw.bv)] {
                if let Some(b) = b {
                    x.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                }
            }
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                q.chunks_exact_mut(hd).for_each(|h| ops::rms_norm_in_place(self.isa, h, qn, cfg.norm_eps));
                k.chunks_exact_mut(hd).for_each(|h| ops::rms_norm_in_place(self.isa, h, kn, cfg.norm_eps));
            }
            rope.angles(row.pos, angles);
            q.chunks_exact_mut(hd).for_each(|h| rope.apply(self.isa, angles, h));
            k.chunks_exact_mut(hd).for_each(|h| rope.apply(self.isa, angles, h));

            let block = self.tables.get(row.seq)[row.pos / BLOCK_TOKENS];
            let slot = row.pos % BLOCK_TOKENS;
            for h in 0..cfg.n_head_kv {
                let at = self.layout.offset(layer, block, h, slot);
                unsafe {
                    let kd = self.kc.slice_mut(at..at + hd);
                    let vd = self.vc.slice_mut(at..at + hd);
                    for d in 0..hd {
                        kd[d] = T::from_f32(k[h * hd + d]);
                        vd[d] = T::from_f32(v[h * hd + d]);
                    }
                }
            }
        }
    }

    /// Causal attention of every (row, head) over its sequence's cached positions, block
    /// by block (see `blink_kernels::attention` for the numerics).
    fn attention(&self, w: &Worker, layer: usize) {
        let cfg = &self.model.cfg;
        let hd = cfg.head_dim;
        let group = cfg.n_head / cfg.n_head_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        // SAFETY: per-thread scratch row.
        let qh = unsafe { self.qh.row_mut(w.tid, hd) };
        // Items are dealt round-robin: a row's cost grows with its position, so contiguous
        // shares would leave the thread with the latest rows doing most of the work.
        for item in (w.tid..self.rows.len() * cfg.n_head).step_by(w.n_threads) {
            let (r, h) = (item / cfg.n_head, item % cfg.n_head);
            let row = self.rows[r];
            let kvh = h / group;
            let table = self.tables.get(row.seq);
            // SAFETY: q is read-only now; this thread owns head h of row r in attn; the cache
            // is read-only in this phase.
            let (q, acc) = unsafe {
                (&self.q.row(r, cfg.q_dim())[h * hd..(h + 1) * hd], &mut self.attn.row_mut(r, cfg.q_dim())[h * hd..(h + 1) * hd])
            };
            attention::prepare_query::<T>(q, qh);
            acc.iter_mut().for_each(|a| *a = 0.0);
            let mut state = Online::default();
            let n_pos = row.pos + 1;
            for (b, &block) in table.iter().enumerate().take(n_pos.div_ceil(BLOCK_TOKENS)) {
                let n = (n_pos - b * BLOCK_TOKENS).min(BLOCK_TOKENS);
                let at = self.layout.offset(layer, block, kvh, 0);
                let (keys, values) = unsafe { (self.kc.slice(at..at + n * hd), self.vc.slice(at..at + n * hd)) };
                attention::attend::<T>(self.isa, qh, keys, values, n, scale, &mut state, acc);
            }
            state.finish(acc);
        }
    }
}
