//! A second, independent check of the LoRA training pass (`blink_model::train`): tiny
//! random models built as GGUF files in memory, against a float64 reference forward
//! written here from the architecture's math (not from the training code), on the weights
//! the engine really holds (quantized matrices are read back dequantized).
//!
//! Variants: f32, Q8_0 and Q4_1 matrices; tied and untied output heads; llama (llama.cpp's
//! normal rope order) and qwen2 (NeoX order, Q/K/V biases); full and partial rotation and
//! linear rope scaling; a norm epsilon that matters; GQA (4 query heads over 2 key/value
//! heads) everywhere. With a
//! random rank-4 adapter on all seven targets (A and B both non-zero), each checks:
//!
//! - the step's loss is the reference's (relative 1e-5);
//! - the gradients of the mean loss over a batch of three examples of different lengths
//!   with sparse target masks match central differences of the f64 reference loss: per
//!   tensor along its gradient and two random directions, and element by element for a
//!   few entries of every A and B of every layer and target;
//! - packing: a batch's loss and gradients are the sums of its examples' taken alone
//!   (examples never attend to each other, and each starts at position 0);
//! - neither the thread count nor spare room in the trainer's buffers changes a bit.
//!
//! train_grads.rs compares with PyTorch on one real model and one example; this covers
//! the architecture options, quantized types, batching and the mask, needs no download,
//! and its reference shares no code with what it checks.

use std::sync::Arc;

use blink_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use blink_kernels::quant::{dequantize_row, quantize_weights};
use blink_model::lora::{LoraFormat, LoraPair, LoraTarget, LoraTensors};
use blink_model::train::{self, BatchLoss, Dropout, Example, Trainer as PoolTrainer};
use blink_runtime::numa::NodePool;
use blink_model::{Model, TensorPlacement};

const VOCAB: usize = 300;
const EMBD: usize = 64;
const FF: usize = 96;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const LAYERS: usize = 2;
const FREQ_BASE: f32 = 10000.0;
const RANK: usize = 4;
const ALPHA: f32 = 8.0;
const MAX_TOKENS: usize = 64;
/// The examples' lengths; the first also marks token 0 a target, which predicts nothing.
const LENGTHS: [usize; 3] = [9, 5, 12];

// ---------------------------------------------------------------------------------------
// Random numbers.

struct Rng(u64);

impl Rng {
    fn u64(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        (self.u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u1, u2) = (1.0 - self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    fn below(&mut self, n: usize) -> usize {
        (self.u64() % n as u64) as usize
    }

    /// A random direction of `n` dimensions, of norm 1.
    fn unit(&mut self, n: usize) -> Vec<f64> {
        let v: Vec<f64> = (0..n).map(|_| self.normal()).collect();
        let norm = norm(&v);
        v.into_iter().map(|x| x / norm).collect()
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}

// ---------------------------------------------------------------------------------------
// The synthetic models, and the f64 reference holding the same weights.

struct Variant {
    arch: &'static str,
    /// The type of every matrix (token embeddings included).
    ty: GgmlType,
    tied: bool,
    /// `rope.dimension_count`: the leading dimensions of each head that rotate.
    rope_dims: usize,
    /// `rope.scaling.factor` of linear scaling (positions divided by it).
    linear_scale: Option<f32>,
    /// RMS norm epsilon: 1e-5 is a real model's, and moves gradients by ~1e-5 only; 1e-2
    /// makes its part of every norm's gradient visible.
    eps: f32,
}

struct RefLayer {
    attn_norm: Vec<f64>,
    /// Per target, the `[rows][cols]` matrix (GGUF row order).
    w: [Vec<f64>; 7],
    /// Q, K and V biases (qwen2).
    bias: Option<[Vec<f64>; 3]>,
    ffn_norm: Vec<f64>,
}

struct Reference {
    embd: Vec<f64>,
    /// The LM head, `None` when tied to the embeddings.
    head: Option<Vec<f64>>,
    out_norm: Vec<f64>,
    layers: Vec<RefLayer>,
    neox: bool,
    rope_dims: usize,
    /// Rope angles are `pos · pos_scale · base^(-2i/n_dims)`.
    pos_scale: f64,
    eps: f64,
    /// The dropout on the adapters' inputs, its mask taken from the engine's definition
    /// ([`Dropout::keep`], a function of the step seed and the element's place).
    dropout: Option<Dropout>,
}

/// Writes the GGUF and returns the values it holds, in f64.
struct Builder {
    w: GgufWriter,
    rng: Rng,
}

impl Builder {
    /// A `[rows][cols]` matrix of uniform values in ±0.3, stored as `ty`, read back.
    fn matrix(&mut self, name: &str, ty: GgmlType, rows: usize, cols: usize) -> Vec<f64> {
        let values: Vec<f32> = (0..rows * cols).map(|_| ((self.rng.uniform() * 2.0 - 1.0) * 0.3) as f32).collect();
        let mut bytes = vec![0u8; ty.row_bytes((rows * cols) as u64).unwrap() as usize];
        quantize_weights(ty, &values, &mut bytes).unwrap();
        self.w.add_tensor(name, ty, &[cols as u64, rows as u64], &bytes).unwrap();
        let mut held = vec![0f32; rows * cols];
        dequantize_row(ty, &bytes, &mut held);
        held.into_iter().map(f64::from).collect()
    }

    /// An f32 vector of uniform values in `lo..hi`.
    fn vector(&mut self, name: &str, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        let values: Vec<f32> = (0..n).map(|_| (lo + (hi - lo) * self.rng.uniform()) as f32).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.w.add_tensor(name, GgmlType::F32, &[n as u64], &bytes).unwrap();
        values.into_iter().map(f64::from).collect()
    }
}

fn build(v: &Variant, seed: u64) -> (Model, Reference) {
    let mut b = Builder { w: GgufWriter::new(), rng: Rng(seed) };
    let arch = v.arch;
    b.w.add("general.architecture", Value::from(arch)).unwrap();
    let mut meta = vec![
        ("block_count", Value::U32(LAYERS as u32)),
        ("context_length", Value::U32(256)),
        ("embedding_length", Value::U32(EMBD as u32)),
        ("feed_forward_length", Value::U32(FF as u32)),
        ("attention.head_count", Value::U32(HEADS as u32)),
        ("attention.head_count_kv", Value::U32(KV_HEADS as u32)),
        ("attention.key_length", Value::U32(HEAD_DIM as u32)),
        ("rope.dimension_count", Value::U32(v.rope_dims as u32)),
        ("rope.freq_base", Value::F32(FREQ_BASE)),
        ("attention.layer_norm_rms_epsilon", Value::F32(v.eps)),
        ("vocab_size", Value::U32(VOCAB as u32)),
    ];
    if let Some(f) = v.linear_scale {
        meta.push(("rope.scaling.type", Value::from("linear")));
        meta.push(("rope.scaling.factor", Value::F32(f)));
    }
    for (key, value) in meta {
        b.w.add(format!("{arch}.{key}"), value).unwrap();
    }
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let embd = b.matrix("token_embd.weight", v.ty, VOCAB, EMBD);
    let out_norm = b.vector("output_norm.weight", EMBD, 0.5, 1.5);
    let head = (!v.tied).then(|| b.matrix("output.weight", v.ty, VOCAB, EMBD));
    let layers = (0..LAYERS)
        .map(|l| {
            let n = |s: &str| format!("blk.{l}.{s}");
            let attn_norm = b.vector(&n("attn_norm.weight"), EMBD, 0.5, 1.5);
            let w = LoraTarget::ALL.map(|t| {
                let (rows, cols) = target_shape(t);
                b.matrix(&n(&format!("{}.weight", t.gguf_name())), v.ty, rows, cols)
            });
            let bias = (arch == "qwen2").then(|| [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)].map(|(name, len)| b.vector(&n(name), len, -0.5, 0.5)));
            let ffn_norm = b.vector(&n("ffn_norm.weight"), EMBD, 0.5, 1.5);
            RefLayer { attn_norm, w, bias, ffn_norm }
        })
        .collect();
    let file = Arc::new(GgufFile::from_bytes(b.w.to_bytes()).unwrap());
    let model = Model::from_gguf_placed(file, &TensorPlacement::flat(2)).unwrap();
    let pos_scale = 1.0 / v.linear_scale.unwrap_or(1.0) as f64;
    let reference = Reference { embd, head, out_norm, layers, neox: arch == "qwen2", rope_dims: v.rope_dims, pos_scale, eps: v.eps as f64, dropout: None };
    (model, reference)
}

/// `(rows, cols)` of a target's matrix, from the constants (not the engine's config).
fn target_shape(t: LoraTarget) -> (usize, usize) {
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    match t {
        LoraTarget::Q => (q, EMBD),
        LoraTarget::K | LoraTarget::V => (kv, EMBD),
        LoraTarget::O => (EMBD, q),
        LoraTarget::Gate | LoraTarget::Up => (FF, EMBD),
        LoraTarget::Down => (EMBD, FF),
    }
}

// ---------------------------------------------------------------------------------------
// The reference forward, in f64.

/// The adapter as one f64 tensor per (layer, target, A or B): index `(l·7 + t)·2 + {0: A, 1: B}`.
type Params = Vec<Vec<f64>>;

fn flatten(t: &LoraTensors) -> Params {
    let mut out = Vec::new();
    for layer in &t.layers {
        for p in layer {
            let p = p.as_ref().unwrap();
            out.push(p.a.iter().map(|&v| v as f64).collect());
            out.push(p.b.iter().map(|&v| v as f64).collect());
        }
    }
    out
}

fn tensor_name(k: usize) -> String {
    format!("layer {} {} {}", k / 14, LoraTarget::ALL[k / 2 % 7].short_name(), ["A", "B"][k % 2])
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let r = 1.0 / (dot(x, x) / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(x, w)| x * r * w).collect()
}

/// `W·x` for a `[rows][x.len()]` matrix.
fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len()).map(|row| dot(row, x)).collect()
}

fn log_sum_exp(v: &[f64]) -> f64 {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

impl Reference {
    /// Rotate one head at `pos`: pair `i` is `(2i, 2i+1)` (normal) or `(i, i + n/2)`
    /// (NeoX) of the first `n = rope_dims` dimensions, by `pos · base^(-2i/n)`.
    fn rope(&self, h: &mut [f64], pos: usize) {
        let half = self.rope_dims / 2;
        for i in 0..half {
            let theta = pos as f64 * self.pos_scale * (FREQ_BASE as f64).powf(-2.0 * i as f64 / self.rope_dims as f64);
            let (a, b) = if self.neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
            let (c, s) = (theta.cos(), theta.sin());
            let (x0, x1) = (h[a], h[b]);
            h[a] = x0 * c - x1 * s;
            h[b] = x0 * s + x1 * c;
        }
    }

    /// The sum of the NLLs of one sequence's targets, and their count; its tokens are
    /// the batch's rows from `row0` on.
    fn sequence(&self, p: &Params, tokens: &[u32], targets: &[bool], row0: usize) -> (f64, usize) {
        let n = tokens.len();
        let scale = (ALPHA / RANK as f32) as f64;
        let mut x: Vec<Vec<f64>> = tokens.iter().map(|&t| self.embd[t as usize * EMBD..][..EMBD].to_vec()).collect();
        for (l, lw) in self.layers.iter().enumerate() {
            // y = W·x + (alpha/r)·B·(A·dropout(x)), for the input at `pos`.
            let proj = |t: LoraTarget, input: &[f64], pos: usize| -> Vec<f64> {
                let (a, b) = (&p[(l * 7 + t.index()) * 2], &p[(l * 7 + t.index()) * 2 + 1]);
                let dropped: Vec<f64> = match self.dropout {
                    None => input.to_vec(),
                    Some(d) => input.iter().enumerate().map(|(c, &x)| if d.keep(l, t, row0 + pos, c) { x * d.scale() as f64 } else { 0.0 }).collect(),
                };
                let ax = matvec(a, &dropped);
                let bax = matvec(b, &ax);
                matvec(&lw.w[t.index()], input).iter().zip(bax).map(|(y, d)| y + scale * d).collect()
            };
            let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
            for (pos, xt) in x.iter().enumerate() {
                let xn = rms_norm(xt, &lw.attn_norm, self.eps);
                let mut qkv = [LoraTarget::Q, LoraTarget::K, LoraTarget::V].map(|t| proj(t, &xn, pos));
                if let Some(bias) = &lw.bias {
                    for (y, b) in qkv.iter_mut().zip(bias) {
                        y.iter_mut().zip(b).for_each(|(y, b)| *y += b);
                    }
                }
                let [mut qt, mut kt, vt] = qkv;
                for h in qt.chunks_exact_mut(HEAD_DIM).chain(kt.chunks_exact_mut(HEAD_DIM)) {
                    self.rope(h, pos);
                }
                q.push(qt);
                k.push(kt);
                v.push(vt);
            }
            for t in 0..n {
                // Causal attention within this sequence; query head h reads kv head h / group.
                let mut attn = vec![0.0; HEADS * HEAD_DIM];
                for h in 0..HEADS {
                    let kvh = h / (HEADS / KV_HEADS);
                    let qh = &q[t][h * HEAD_DIM..][..HEAD_DIM];
                    let scores: Vec<f64> = (0..=t).map(|j| dot(qh, &k[j][kvh * HEAD_DIM..][..HEAD_DIM]) / (HEAD_DIM as f64).sqrt()).collect();
                    let lse = log_sum_exp(&scores);
                    for (j, s) in scores.iter().enumerate() {
                        let pj = (s - lse).exp();
                        for d in 0..HEAD_DIM {
                            attn[h * HEAD_DIM + d] += pj * v[j][kvh * HEAD_DIM + d];
                        }
                    }
                }
                let o = proj(LoraTarget::O, &attn, t);
                x[t].iter_mut().zip(o).for_each(|(x, o)| *x += o);
                let xn = rms_norm(&x[t], &lw.ffn_norm, self.eps);
                let (g, u) = (proj(LoraTarget::Gate, &xn, t), proj(LoraTarget::Up, &xn, t));
                let hidden: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
                let d = proj(LoraTarget::Down, &hidden, t);
                x[t].iter_mut().zip(d).for_each(|(x, d)| *x += d);
            }
        }
        let head = self.head.as_deref().unwrap_or(&self.embd);
        let (mut nll, mut count) = (0.0, 0);
        for i in 1..n {
            if targets[i] {
                let logits = matvec(head, &rms_norm(&x[i - 1], &self.out_norm, self.eps));
                nll += log_sum_exp(&logits) - logits[tokens[i] as usize];
                count += 1;
            }
        }
        (nll, count)
    }

    /// The batch's NLL sum and target count: each example its own sequence.
    fn batch(&self, p: &Params, batch: &[Owned]) -> (f64, usize) {
        let mut row0 = 0;
        let mut total = (0.0, 0);
        for e in batch {
            let (nll, count) = self.sequence(p, &e.tokens, &e.targets, row0);
            total.0 += nll;
            total.1 += count;
            row0 += e.tokens.len();
        }
        total
    }
}

// ---------------------------------------------------------------------------------------
// Adapters, batches and steps.

struct Owned {
    tokens: Vec<u32>,
    targets: Vec<bool>,
}

/// A random example: about 40% of its tokens after the first are targets (at least one).
fn example(rng: &mut Rng, len: usize, first: bool) -> Owned {
    let tokens = (0..len).map(|_| rng.below(VOCAB) as u32).collect();
    let mut targets: Vec<bool> = (0..len).map(|i| if i == 0 { first } else { rng.uniform() < 0.4 }).collect();
    targets[1 + rng.below(len - 1)] = true;
    Owned { tokens, targets }
}

fn examples(batch: &[Owned]) -> Vec<Example<'_>> {
    batch.iter().map(|e| Example { tokens: &e.tokens, targets: &e.targets }).collect()
}

/// A rank-4 pair on every target of every layer, A and B ~ N(0, 0.1).
fn random_adapter(rng: &mut Rng) -> LoraTensors {
    let layers = (0..LAYERS)
        .map(|_| {
            LoraTarget::ALL.map(|t| {
                let (rows, cols) = target_shape(t);
                let mut values = |n: usize| -> Vec<f32> { (0..n).map(|_| (0.1 * rng.normal()) as f32).collect() };
                Some(LoraPair { rank: RANK, rows, cols, a: values(RANK * cols), b: values(rows * RANK) })
            })
        })
        .collect();
    LoraTensors { format: LoraFormat::Peft, alpha: ALPHA, rslora: false, layers }
}

/// A trainer with a pool of its own.
struct Trainer<'m> {
    inner: PoolTrainer<&'m Model>,
    pool: NodePool,
}

impl<'m> Trainer<'m> {
    fn new(model: &'m Model, threads: usize, max_tokens: usize, ranks: [usize; 7]) -> Result<Trainer<'m>, train::TrainError> {
        Ok(Trainer { inner: PoolTrainer::new(model, max_tokens, ranks)?, pool: model.pool(threads).unwrap() })
    }

    fn set_dropout(&mut self, dropout: Option<Dropout>) -> Result<(), train::TrainError> {
        self.inner.set_dropout(dropout)
    }

    fn step(&mut self, batch: &[Example], params: &LoraTensors, grads: Option<(&mut LoraTensors, f32)>) -> Result<BatchLoss, train::TrainError> {
        self.inner.step(&self.pool, batch, params, grads)
    }
}

/// The step's loss and gradients (from zero) with each target weighted by `weight`.
fn step(trainer: &mut Trainer, batch: &[Owned], params: &LoraTensors, weight: f32) -> (BatchLoss, LoraTensors) {
    let mut grads = train::zeros_like(params);
    let loss = trainer.step(&examples(batch), params, Some((&mut grads, weight))).unwrap();
    (loss, grads)
}

fn bits(t: &LoraTensors) -> Vec<u32> {
    t.layers.iter().flatten().flatten().flat_map(|p| p.a.iter().chain(&p.b).map(|v| v.to_bits())).collect()
}

// ---------------------------------------------------------------------------------------
// The checks.

/// (a) The trainer's loss, with and without gradients, against the reference's.
fn check_loss(name: &str, trainer: &mut Trainer, reference: &Reference, params: &LoraTensors, batch: &[Owned]) {
    let (ref_sum, ref_targets) = reference.batch(&flatten(params), batch);
    let plain = trainer.step(&examples(batch), params, None).unwrap();
    let (with_grads, _) = step(trainer, batch, params, 1.0);
    assert_eq!(plain, with_grads, "{name}: the loss depends on whether gradients are asked for");
    assert_eq!(plain.targets, ref_targets, "{name}: target count (token 0 predicts nothing)");
    let (got, want) = (plain.mean(), ref_sum / ref_targets as f64);
    let rel = (got - want).abs() / want;
    eprintln!("{name}: loss {got:.7} vs f64 {want:.7} (relative {rel:.1e}), {ref_targets} targets");
    // Measured ≤ 1e-7 (f32 logits, f64 sums): 1e-5 leaves room for other ISAs.
    assert!(rel <= 1e-5, "{name}: loss {got} vs reference {want}");
}

/// (b) Gradients of the mean loss against central differences of the f64 reference.
///
/// The differences are of the f64 loss with h = 1e-4 (parameters are ~0.1): the
/// truncation error is ~h²·L''' ≈ 1e-9 and the rounding ~1e-16·L/h ≈ 1e-11, so the
/// reference is exact to far below what is checked; the slack is for the trainer's f32.
/// Measured over all variants: directional errors ≤ 1.2e-6 of |g|, element errors ≤
/// 1.4e-6 of the tensor's max |g| (which is 0.05 to 0.7). The bounds are about 20× that,
/// to hold across ISAs' summation orders while still catching a term missing from the
/// gradient that is 1e-4 of it.
fn check_gradients(name: &str, trainer: &mut Trainer, reference: &Reference, params: &LoraTensors, batch: &[Owned], rng: &mut Rng) {
    const H: f64 = 1e-4;
    /// Directional derivatives, relative to |g|.
    const DIR: f64 = 3e-5;
    /// Elements: abs ≤ ELEM_ABS·max|g| + ELEM_REL·|g_i|.
    const ELEM_ABS: f64 = 3e-5;
    const ELEM_REL: f64 = 1e-3;
    let total: usize = batch.iter().map(|e| e.targets.iter().skip(1).filter(|&&t| t).count()).sum();
    let (_, grads) = step(trainer, batch, params, 1.0 / total as f32);
    let (p, g) = (flatten(params), flatten(&grads));
    let loss = |q: &Params| reference.batch(q, batch).0 / total as f64;
    let derivative = |k: usize, dir: &[f64]| {
        let (mut plus, mut minus) = (p.clone(), p.clone());
        for ((a, b), d) in plus[k].iter_mut().zip(minus[k].iter_mut()).zip(dir) {
            *a += H * d;
            *b -= H * d;
        }
        (loss(&plus) - loss(&minus)) / (2.0 * H)
    };
    let (mut worst_dir, mut worst_rand, mut worst_elem) = ((0f64, 0), (0f64, 0), (0f64, 0));
    assert_eq!(p.len(), g.len());
    for (k, gk) in g.iter().enumerate() {
        let gn = norm(gk);
        assert!(gn > 1e-6, "{name}: {}: gradient is zero", tensor_name(k));
        // Along the gradient, the derivative is |g|.
        let along: Vec<f64> = gk.iter().map(|x| x / gn).collect();
        let e = (derivative(k, &along) - gn).abs() / gn;
        keep(&mut worst_dir, e, k);
        assert!(e <= DIR, "{name}: {}: along the gradient {:.6e} vs differences, relative {e:.2e}", tensor_name(k), gn);
        // Along random directions g·u is ~|g|/√n, and may be near 0: its error is
        // measured against |g| (which bounds it).
        for _ in 0..2 {
            let u = rng.unit(gk.len());
            let (want, got) = (derivative(k, &u), dot(gk, &u));
            let e = (got - want).abs() / gn;
            keep(&mut worst_rand, e, k);
            assert!(e <= DIR, "{name}: {}: along a random direction {got:.6e} vs differences {want:.6e} (|g| {gn:.3e})", tensor_name(k));
        }
        // Element by element, max|g| standing in for the scale of the tensor's f32 noise.
        let gmax = gk.iter().fold(0f64, |m, x| m.max(x.abs()));
        for _ in 0..4 {
            let i = rng.below(gk.len());
            let mut e_i = vec![0.0; gk.len()];
            e_i[i] = 1.0;
            let want = derivative(k, &e_i);
            let err = (gk[i] - want).abs();
            let tol = ELEM_ABS * gmax + ELEM_REL * want.abs();
            keep(&mut worst_elem, err / tol, k);
            assert!(err <= tol, "{name}: {}[{i}]: {:.6e} vs differences {want:.6e} (max |g| {gmax:.3e})", tensor_name(k), gk[i]);
        }
    }
    let show = |(e, k): (f64, usize)| format!("{e:.1e} ({})", tensor_name(k));
    eprintln!(
        "{name}: worst relative error along the gradient {}, along random directions (of |g|) {}; worst element at {} of its tolerance",
        show(worst_dir),
        show(worst_rand),
        show(worst_elem)
    );
}

/// The largest error so far, and the tensor it was in.
fn keep(worst: &mut (f64, usize), e: f64, k: usize) {
    if e > worst.0 {
        *worst = (e, k);
    }
}

/// (c) A packed batch's loss and gradients are the sums of its examples' taken alone.
fn check_packing(name: &str, trainer: &mut Trainer, params: &LoraTensors, batch: &[Owned]) {
    const WEIGHT: f32 = 0.0625;
    let (packed_loss, packed) = step(trainer, batch, params, WEIGHT);
    let mut alone = train::zeros_like(params);
    let mut alone_loss = BatchLoss::default();
    for e in batch {
        let one = Example { tokens: &e.tokens, targets: &e.targets };
        alone_loss.add(trainer.step(&[one], params, Some((&mut alone, WEIGHT))).unwrap());
    }
    assert_eq!(packed_loss.targets, alone_loss.targets);
    let rel = (packed_loss.nll_sum - alone_loss.nll_sum).abs() / alone_loss.nll_sum;
    assert!(rel <= 1e-6, "{name}: packed loss {} vs the examples' sum {}", packed_loss.nll_sum, alone_loss.nll_sum);
    // The sums run over the tokens in another grouping: f32 noise, relative ~1e-7 of the
    // tensor's largest entry; attention across examples would be far larger.
    let mut worst = 0f64;
    for (k, (a, b)) in flatten(&packed).iter().zip(flatten(&alone)).enumerate() {
        let scale = b.iter().fold(0f64, |m, x| m.max(x.abs()));
        let diff = a.iter().zip(&b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        worst = worst.max(diff / scale);
        assert!(diff <= 1e-5 * scale, "{name}: {}: packed gradients differ from the sum alone by {diff:.2e} (max {scale:.2e})", tensor_name(k));
    }
    eprintln!("{name}: packed vs alone: loss relative {rel:.1e}, gradients {worst:.1e} of each tensor's largest");
}

/// (d) One, two and three threads, and a trainer with room to spare, give the same bits.
fn check_threads(name: &str, model: &Model, params: &LoraTensors, batch: &[Owned], dropout: Option<Dropout>) {
    let run = |threads: usize, max_tokens: usize, rank: usize| {
        let mut trainer = Trainer::new(model, threads, max_tokens, [rank; 7]).unwrap();
        trainer.set_dropout(dropout).unwrap();
        let (loss, grads) = step(&mut trainer, batch, params, 0.1);
        (loss.nll_sum.to_bits(), bits(&grads))
    };
    let one = run(1, MAX_TOKENS, RANK);
    for (threads, max_tokens, rank) in [(2, MAX_TOKENS, RANK), (3, MAX_TOKENS, RANK), (2, MAX_TOKENS + 37, RANK + 3)] {
        let other = run(threads, max_tokens, rank);
        assert!(other.0 == one.0, "{name}: the loss differs with {threads} threads, {max_tokens} tokens, rank {rank}");
        let differ = one.1.iter().zip(&other.1).filter(|(a, b)| a != b).count();
        assert!(differ == 0, "{name}: {differ} gradient values differ with {threads} threads, {max_tokens} tokens, rank {rank}");
    }
}

/// (e) A batch cut into units of 1, 2 or 3 layers gives the bits of the whole step, with
/// and without gradients.
fn check_units(name: &str, trainer: &mut Trainer, params: &LoraTensors, batch: &[Owned]) {
    let (whole_loss, whole) = step(trainer, batch, params, 0.1);
    let plain = trainer.step(&examples(batch), params, None).unwrap();
    for layers in [1, 2, 3] {
        let mut grads = train::zeros_like(params);
        let t = &mut trainer.inner;
        t.begin(&examples(batch), Some(0.1)).unwrap();
        let mut units = 0;
        let loss = loop {
            let shape = t.next_unit().unwrap();
            assert!(shape.rows == batch.iter().map(|e| e.tokens.len()).sum::<usize>(), "{name}: unit rows");
            units += 1;
            if let Some(loss) = t.run_unit(&trainer.pool, params, Some(&mut grads), layers).unwrap() {
                break loss;
            }
        };
        assert!(t.next_unit().is_none(), "{name}: a unit is left after the batch");
        assert_eq!(units, 2 * LAYERS.div_ceil(layers) + 1, "{name}: units of {layers} layers");
        assert_eq!(loss.nll_sum.to_bits(), whole_loss.nll_sum.to_bits(), "{name}: units of {layers} layers change the loss");
        assert!(bits(&grads) == bits(&whole), "{name}: units of {layers} layers change the gradients");
        t.begin(&examples(batch), None).unwrap();
        let loss = loop {
            if let Some(loss) = t.run_unit(&trainer.pool, params, None, layers).unwrap() {
                break loss;
            }
        };
        assert_eq!(loss, plain, "{name}: units of {layers} layers change the loss without gradients");
    }
    // A unit needs a batch, a batch waits for the last one, and one asking for gradients
    // gets them at its head.
    let t = &mut trainer.inner;
    assert!(matches!(t.run_unit(&trainer.pool, params, None, 1), Err(train::TrainError::NoBatch)));
    t.begin(&examples(batch), Some(0.1)).unwrap();
    assert!(matches!(t.begin(&examples(batch), None), Err(train::TrainError::Busy)));
    t.run_unit(&trainer.pool, params, None, usize::MAX).unwrap();
    assert!(matches!(t.run_unit(&trainer.pool, params, None, 1), Err(train::TrainError::AdapterMismatch(_))));
    t.abandon();
    assert!(t.next_unit().is_none());
}

fn check(name: &str, v: Variant, seed: u64) {
    let (model, reference) = build(&v, seed);
    assert_eq!((model.cfg.n_head_kv, model.cfg.rope.n_dims), (KV_HEADS, v.rope_dims));
    let mut rng = Rng(seed ^ 0x5eed);
    let params = random_adapter(&mut rng);
    let batch: Vec<Owned> = LENGTHS.iter().enumerate().map(|(i, &len)| example(&mut rng, len, i == 0)).collect();
    let mut trainer = Trainer::new(&model, 2, MAX_TOKENS, [RANK; 7]).unwrap();
    check_loss(name, &mut trainer, &reference, &params, &batch);
    check_gradients(name, &mut trainer, &reference, &params, &batch, &mut rng);
    check_packing(name, &mut trainer, &params, &batch);
    check_units(name, &mut trainer, &params, &batch);
    check_threads(name, &model, &params, &batch, None);
}

/// Dropout on the adapters' inputs: the loss and gradients for one draw of the masks
/// against the reference with the same masks, and the same bits on any thread count.
fn check_dropout(name: &str, v: Variant, seed: u64, dropout: Dropout) {
    let (model, mut reference) = build(&v, seed);
    let mut rng = Rng(seed ^ 0xd209);
    let params = random_adapter(&mut rng);
    let batch: Vec<Owned> = LENGTHS.iter().enumerate().map(|(i, &len)| example(&mut rng, len, i == 0)).collect();
    let mut trainer = Trainer::new(&model, 2, MAX_TOKENS, [RANK; 7]).unwrap();
    let without = trainer.step(&examples(&batch), &params, None).unwrap();
    trainer.set_dropout(Some(dropout)).unwrap();
    reference.dropout = Some(dropout);
    let with = trainer.step(&examples(&batch), &params, None).unwrap();
    let moved = (with.mean() - without.mean()).abs() / without.mean();
    assert!(moved > 1e-3, "{name}: dropout {} moves the loss by only {moved:.1e}", dropout.p);
    check_loss(name, &mut trainer, &reference, &params, &batch);
    check_gradients(name, &mut trainer, &reference, &params, &batch, &mut rng);
    check_threads(name, &model, &params, &batch, Some(dropout));
    // Another seed draws other masks.
    trainer.set_dropout(Some(Dropout { seed: dropout.seed + 1, ..dropout })).unwrap();
    assert_ne!(trainer.step(&examples(&batch), &params, None).unwrap(), with, "{name}: the seed does not change the masks");
}

#[test]
fn llama_q4_1_dropout() {
    check_dropout("llama q4_1 dropout 0.3", Variant { arch: "llama", ty: GgmlType::Q4_1, tied: false, rope_dims: HEAD_DIM, linear_scale: None, eps: 1e-5 }, 6, Dropout { p: 0.3, seed: 11 });
}

#[test]
fn qwen2_f32_dropout() {
    check_dropout("qwen2 f32 dropout 0.1", Variant { arch: "qwen2", ty: GgmlType::F32, tied: true, rope_dims: HEAD_DIM, linear_scale: None, eps: 1e-5 }, 7, Dropout { p: 0.1, seed: 12 });
}

#[test]
fn llama_f32_untied() {
    check("llama f32 untied", Variant { arch: "llama", ty: GgmlType::F32, tied: false, rope_dims: HEAD_DIM, linear_scale: None, eps: 1e-5 }, 1);
}

#[test]
fn llama_q8_0_tied() {
    check("llama q8_0 tied", Variant { arch: "llama", ty: GgmlType::Q8_0, tied: true, rope_dims: HEAD_DIM, linear_scale: None, eps: 1e-5 }, 2);
}

#[test]
fn llama_q4_1_partial_rope_linear_scaling() {
    check("llama q4_1 partial rope", Variant { arch: "llama", ty: GgmlType::Q4_1, tied: false, rope_dims: 8, linear_scale: Some(2.0), eps: 1e-5 }, 3);
}

#[test]
fn qwen2_q8_0_biases_untied() {
    check("qwen2 q8_0 untied", Variant { arch: "qwen2", ty: GgmlType::Q8_0, tied: false, rope_dims: HEAD_DIM, linear_scale: None, eps: 1e-5 }, 4);
}

#[test]
fn qwen2_f32_tied_partial_rope_large_eps() {
    check("qwen2 f32 tied partial rope eps 1e-2", Variant { arch: "qwen2", ty: GgmlType::F32, tied: true, rope_dims: 8, linear_scale: None, eps: 1e-2 }, 5);
}
