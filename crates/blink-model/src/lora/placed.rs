//! An adapter placed on a model's parts, ready for the forward pass: per part, `A` whole
//! and `Bᵀ` restricted to the rows of the base matrix that part computes, in the part's
//! memory, as f16 (the kernels widen it exactly; half the bytes of f32 to stream per
//! token). A value outside f16's range is refused, never rounded to infinity.

use std::sync::atomic::{AtomicU64, Ordering};

use blink_runtime::storage::Storage;
use half::f16;

use super::{LoraError, LoraPair, LoraTarget, LoraTensors};
use crate::config::ModelConfig;
use crate::parallel::tensor::TensorPart;
use crate::Model;

/// One pair on one part: `ΔW = scale · B·A` for the part's rows of the base matrix.
pub struct PlacedPair {
    pub rank: usize,
    /// `alpha / r` (or `alpha / √r` with rsLoRA).
    pub scale: f32,
    /// `A`, `[rank][cols]`, whole on every part.
    pub a: Storage<f16>,
    /// `Bᵀ`, `[rank][part rows]`: column `o` is the part's output row `o`.
    pub bt: Storage<f16>,
}

impl PlacedPair {
    /// Rows of the base matrix this part computes (the stride of `bt`).
    pub fn part_rows(&self) -> usize {
        self.bt.len() / self.rank.max(1)
    }
}

/// Source of the ids that tell adapters apart in the prefix cache's keys.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A LoRA adapter placed on a model's parts. Shared (`Arc`) by every request using it, so a
/// request in flight keeps the weights it started with after the adapter is unloaded or
/// replaced.
pub struct LoraAdapter {
    id: u64,
    alpha: f32,
    rslora: bool,
    max_rank: usize,
    tensor_bytes: usize,
    /// The parts it was placed for (a step checks they are the model's).
    split: Vec<TensorPart>,
    /// Per part, per layer, per target ([`LoraTarget::index`]).
    parts: Vec<Vec<[Option<PlacedPair>; 7]>>,
}

impl LoraAdapter {
    /// Unique for each placement in this process: two loads of one file differ.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn alpha(&self) -> f32 {
        self.alpha
    }

    /// Whether a pair of rank r is scaled by `alpha / √r` (rsLoRA) rather than `alpha / r`.
    pub fn rslora(&self) -> bool {
        self.rslora
    }

    /// The largest rank of its pairs.
    pub fn max_rank(&self) -> usize {
        self.max_rank
    }

    /// Bytes of its tensors as f32 (`A` and `B` of every pair, once).
    pub fn tensor_bytes(&self) -> usize {
        self.tensor_bytes
    }

    /// Bytes it holds in memory: every part's `A` (whole on each part) and its rows of `B`,
    /// as f16.
    pub fn held_bytes(&self) -> usize {
        self.parts.iter().flatten().flatten().flatten().map(|p| (p.a.len() + p.bt.len()) * 2).sum()
    }

    /// Its pair of `target` in `layer` on `part`, if it changes that projection.
    #[inline]
    pub fn pair(&self, part: usize, layer: usize, target: LoraTarget) -> Option<&PlacedPair> {
        self.parts.get(part)?.get(layer)?[target.index()].as_ref()
    }

    /// The pairs of `layer` as they were read, by [`LoraTarget::index`]: `A` from the
    /// first part, `B` gathered from every part's rows. Their values are f16's, widened
    /// exactly, so placing them again gives the same weights (a ring's devices are sent
    /// their layers' pairs this way).
    pub fn pairs(&self, cfg: &ModelConfig, layer: usize) -> [Option<LoraPair>; 7] {
        LoraTarget::ALL.map(|target| {
            let first = self.pair(0, layer, target)?;
            let (rows, cols) = target.shape(cfg);
            let rank = first.rank;
            let mut b = vec![0.0f32; rows * rank];
            for (p, part) in self.split.iter().enumerate() {
                let placed = self.pair(p, layer, target)?;
                let range = part_rows(cfg, part, target);
                let n = range.len();
                for (o, row) in range.enumerate() {
                    for k in 0..rank {
                        b[row * rank + k] = placed.bt[k * n + o].to_f32();
                    }
                }
            }
            Some(LoraPair { rank, rows, cols, a: first.a.iter().map(|v| v.to_f32()).collect(), b })
        })
    }

    /// Whether it was placed for `model`'s parts.
    pub fn fits(&self, model: &Model) -> bool {
        self.split == model.split.parts && self.parts.iter().all(|layers| layers.len() == model.cfg.n_layers)
    }
}

impl Model {
    /// Read the adapter at `path` (a PEFT directory or a llama.cpp LoRA GGUF) and place it.
    pub fn load_lora(&self, path: &std::path::Path) -> Result<LoraAdapter, LoraError> {
        self.place_lora(&super::read(path, &self.cfg)?)
    }

    /// Place an adapter read for this model on its parts, in each part's memory.
    pub fn place_lora(&self, tensors: &LoraTensors) -> Result<LoraAdapter, LoraError> {
        let cfg = &self.cfg;
        if tensors.layers.len() != cfg.n_layers {
            return Err(LoraError::WrongBase(format!("the adapter has {} layers, the model {}", tensors.layers.len(), cfg.n_layers)));
        }
        for (l, layer) in tensors.layers.iter().enumerate() {
            for (target, pair) in LoraTarget::ALL.into_iter().zip(layer) {
                if let Some(p) = pair {
                    if cfg.moe.is_some() && matches!(target, LoraTarget::Gate | LoraTarget::Up | LoraTarget::Down) {
                        return Err(LoraError::Unsupported(format!("an adapter on the FFN ({}) of a model with experts", target.peft_name())));
                    }
                    check_pair(cfg, l, target, p)?;
                }
            }
        }
        let placement = self.placement();
        let parts = self
            .split
            .parts
            .iter()
            .enumerate()
            .map(|(node, part)| {
                let home = placement.numa.then_some((&placement.topology, node));
                tensors
                    .layers
                    .iter()
                    .enumerate()
                    .map(|(l, layer)| {
                        let mut placed: [Option<PlacedPair>; 7] = Default::default();
                        for (target, pair) in LoraTarget::ALL.into_iter().zip(layer) {
                            if let Some(p) = pair {
                                placed[target.index()] = Some(place_pair(cfg, part, (l, target), p, tensors.pair_scale(p.rank), home)?);
                            }
                        }
                        Ok(placed)
                    })
                    .collect::<Result<Vec<_>, LoraError>>()
            })
            .collect::<Result<Vec<_>, LoraError>>()?;
        let max_rank = tensors.layers.iter().flatten().flatten().map(|p| p.rank).max().unwrap_or(0);
        Ok(LoraAdapter {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            alpha: tensors.alpha,
            rslora: tensors.rslora,
            max_rank,
            tensor_bytes: tensors.tensor_bytes(),
            split: self.split.parts.clone(),
            parts,
        })
    }
}

/// The pair's shapes are the projection's, with a rank its matrices agree on.
fn check_pair(cfg: &ModelConfig, layer: usize, target: LoraTarget, p: &LoraPair) -> Result<(), LoraError> {
    let (rows, cols) = target.shape(cfg);
    let name = |m: &str| tensor_name(layer, target, m);
    if p.cols != cols || p.rank == 0 || Some(p.a.len()) != p.rank.checked_mul(cols) {
        return Err(LoraError::Shape { tensor: name("a"), expected: vec![p.rank.max(1), cols], found: vec![p.rank, p.cols] });
    }
    if p.rows != rows || Some(p.b.len()) != p.rank.checked_mul(rows) {
        return Err(LoraError::Shape { tensor: name("b"), expected: vec![rows, p.rank], found: vec![p.rows, p.rank] });
    }
    Ok(())
}

/// The GGUF name of matrix `m` (`a` or `b`) of the pair on (`layer`, `target`).
fn tensor_name(layer: usize, target: LoraTarget, m: &str) -> String {
    format!("blk.{layer}.{}.weight.lora_{m}", target.gguf_name())
}

/// `values` rounded to f16 (to nearest, ties to even) into `out` at the positions `at`
/// gives, or the first value whose magnitude f16 cannot hold.
fn to_f16(values: &[f32], out: &mut [f16], at: impl Fn(usize) -> usize) -> Result<(), f32> {
    for (i, &v) in values.iter().enumerate() {
        let h = f16::from_f32(v);
        if !h.is_finite() {
            return Err(v);
        }
        out[at(i)] = h;
    }
    Ok(())
}

/// The rows of `target`'s base matrix that `part` computes.
fn part_rows(cfg: &ModelConfig, part: &TensorPart, target: LoraTarget) -> std::ops::Range<usize> {
    let hd = cfg.head_dim;
    match target {
        LoraTarget::Q => part.q_heads.start * hd..part.q_heads.end * hd,
        LoraTarget::K | LoraTarget::V => part.kv_heads.start * hd..part.kv_heads.end * hd,
        LoraTarget::O | LoraTarget::Down => part.embd_rows.clone(),
        LoraTarget::Gate | LoraTarget::Up => part.ff_rows.clone(),
    }
}

fn place_pair(
    cfg: &ModelConfig,
    part: &TensorPart,
    (layer, target): (usize, LoraTarget),
    p: &LoraPair,
    scale: f32,
    home: Option<(&blink_runtime::numa::Topology, usize)>,
) -> Result<PlacedPair, LoraError> {
    let out_of_range = |m: &'static str| move |value| LoraError::Range { tensor: tensor_name(layer, target, m), value };
    let rows = part_rows(cfg, part, target);
    let n = rows.len();
    let mut a = Storage::<f16>::zeroed(p.a.len(), home).map_err(LoraError::Memory)?;
    to_f16(&p.a, &mut a, |i| i).map_err(out_of_range("a"))?;
    let mut bt = Storage::<f16>::zeroed(p.rank * n, home).map_err(LoraError::Memory)?;
    let start = rows.start;
    // B's rows `rows`, `[n][rank]`, go into column `o` of the `[rank][n]` transpose.
    to_f16(&p.b[start * p.rank..rows.end * p.rank], &mut bt, |i| (i % p.rank) * n + i / p.rank).map_err(out_of_range("b"))?;
    Ok(PlacedPair { rank: p.rank, scale, a, bt })
}
