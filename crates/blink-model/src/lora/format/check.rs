//! What both formats share once their tensors are found: grouping them into (layer, target)
//! pairs, checking every pair against the base model's shapes, and turning the data into
//! f32 in the base GGUF tensor's row order.

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};

use super::super::{LoraError, LoraPair, LoraTarget};
use crate::config::{ModelConfig, RopeOrder};

/// Which matrix of a pair a tensor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Side {
    /// `A`, `[rank][in]`.
    A,
    /// `B`, `[out][rank]`.
    B,
}

/// The element types adapters are read in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Elem {
    F32,
    F16,
    BF16,
}

impl Elem {
    fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F16 | Elem::BF16 => 2,
        }
    }
}

/// The file a pair came from: how its tensors are named, how it lists shapes and which
/// row order its `B` of Q and K is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// Hugging Face names and rows; shapes outermost first.
    Peft,
    /// llama.cpp names, the base GGUF's rows; shapes innermost first (ggml's `ne`).
    Gguf,
}

impl Layout {
    /// A row-major shape as this format lists it.
    fn show(self, row_major: &[usize]) -> Vec<usize> {
        match self {
            Layout::Peft => row_major.to_vec(),
            Layout::Gguf => row_major.iter().rev().copied().collect(),
        }
    }

    /// The name the other matrix of `name`'s pair has in this format.
    fn partner_name(self, name: &str, side: Side) -> String {
        let (from, to) = match (self, side) {
            (Layout::Peft, Side::A) => ("lora_A", "lora_B"),
            (Layout::Peft, Side::B) => ("lora_B", "lora_A"),
            (Layout::Gguf, Side::A) => ("lora_a", "lora_b"),
            (Layout::Gguf, Side::B) => ("lora_b", "lora_a"),
        };
        match name.rfind(from) {
            Some(at) => format!("{}{to}{}", &name[..at], &name[at + from.len()..]),
            None => format!("the {to} of '{name}'"),
        }
    }
}

/// A tensor as a format reader found it: its bytes not yet converted or checked.
pub(super) struct Found<'a> {
    /// Its name in the file.
    pub name: String,
    /// Row-major shape, outermost first (`[rows, cols]` for a matrix).
    pub shape: Vec<usize>,
    pub elem: Elem,
    /// Little-endian elements.
    pub data: &'a [u8],
}

/// Where a pair's rank comes from.
#[derive(Clone, Copy, Debug)]
pub(super) enum Rank {
    /// One rank for every pair, from the adapter's configuration (PEFT's `r`).
    Config(usize),
    /// Each pair's own, the rows of its `A` (llama.cpp's GGUF).
    FromA,
}

/// The tensors of an adapter, grouped by (layer, target).
pub(super) struct Pairs<'a> {
    layout: Layout,
    slots: BTreeMap<(usize, LoraTarget), [Option<Found<'a>>; 2]>,
}

impl<'a> Pairs<'a> {
    pub(super) fn new(layout: Layout) -> Self {
        Pairs { layout, slots: BTreeMap::new() }
    }

    /// Add `found` as the `side` matrix of `target` in `layer`; two tensors for the same
    /// matrix are a malformed file.
    pub(super) fn insert(&mut self, path: &Path, layer: usize, target: LoraTarget, side: Side, found: Found<'a>) -> Result<(), LoraError> {
        let slot = &mut self.slots.entry((layer, target)).or_insert([None, None])[side as usize];
        if let Some(first) = slot {
            return Err(format_error(path, format!("tensors '{}' and '{}' are both the same matrix", first.name, found.name)));
        }
        *slot = Some(found);
        Ok(())
    }

    /// Check every pair against `cfg` and convert it: one entry per base layer.
    pub(super) fn build(self, path: &Path, cfg: &ModelConfig, rank: Rank) -> Result<Vec<[Option<LoraPair>; 7]>, LoraError> {
        if self.slots.is_empty() {
            return Err(format_error(path, "the adapter holds no LoRA pairs".into()));
        }
        let mut layers: Vec<[Option<LoraPair>; 7]> = (0..cfg.n_layers).map(|_| std::array::from_fn(|_| None)).collect();
        for ((layer, target), [a, b]) in self.slots {
            let (a, b) = match (a, b) {
                (Some(a), Some(b)) => (a, b),
                (Some(only), None) => return Err(missing(path, self.layout, &only, Side::A)),
                (None, Some(only)) => return Err(missing(path, self.layout, &only, Side::B)),
                (None, None) => continue,
            };
            let pair = check_pair(path, cfg, self.layout, target, rank, &a, &b)?;
            let entry = layers.get_mut(layer).ok_or_else(|| layer_error(layer, cfg))?;
            entry[target.index()] = Some(pair);
        }
        Ok(layers)
    }
}

/// The error for a pair of which only `only`, its `side` matrix, is in the file.
fn missing(path: &Path, layout: Layout, only: &Found<'_>, side: Side) -> LoraError {
    let name = layout.partner_name(&only.name, side);
    format_error(path, format!("tensor '{name}' is missing (its pair '{}' is there)", only.name))
}

fn check_pair(path: &Path, cfg: &ModelConfig, layout: Layout, target: LoraTarget, rank: Rank, a: &Found<'_>, b: &Found<'_>) -> Result<LoraPair, LoraError> {
    let (rows, cols) = target.shape(cfg);
    let r = match rank {
        Rank::Config(r) => r,
        Rank::FromA if a.shape.len() == 2 => a.shape[0],
        // A is not a matrix: take B's rank, so that A's shape is what is reported.
        Rank::FromA => b.shape.last().copied().unwrap_or(0),
    };
    let max = rows.min(cols);
    if r == 0 || r > max {
        return Err(format_error(path, format!("tensor '{}' has rank {r}, outside 1..={max} for {} ({rows}×{cols})", a.name, target.peft_name())));
    }
    check_shape(layout, a, &[r, cols])?;
    check_shape(layout, b, &[rows, r])?;
    let a_values = to_f32(path, a)?;
    let mut b_values = to_f32(path, b)?;
    if let Some(n) = qk_heads(cfg, target).filter(|_| layout == Layout::Peft) {
        b_values = permute_rows(&b_values, rows, r, n, RowOrder::Gguf).ok_or_else(|| format_error(path, format!("tensor '{}': {rows} rows do not split into {n} heads of rotary pairs", b.name)))?;
    }
    Ok(LoraPair { rank: r, rows, cols, a: a_values, b: b_values })
}

fn check_shape(layout: Layout, t: &Found<'_>, expected: &[usize]) -> Result<(), LoraError> {
    if t.shape == expected {
        return Ok(());
    }
    Err(LoraError::Shape { tensor: t.name.clone(), expected: layout.show(expected), found: layout.show(&t.shape) })
}

/// The elements of `t` as f32, all of them finite.
fn to_f32(path: &Path, t: &Found<'_>) -> Result<Vec<f32>, LoraError> {
    let size = t.elem.size();
    let needed = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).and_then(|n| n.checked_mul(size));
    if needed != Some(t.data.len()) {
        let needed = needed.map_or_else(|| "more than fit in memory".to_string(), |n| n.to_string());
        return Err(format_error(path, format!("tensor '{}' has {} bytes of data, its shape {:?} needs {needed}", t.name, t.data.len(), t.shape)));
    }
    let chunks = t.data.chunks_exact(size);
    let values: Vec<f32> = match t.elem {
        Elem::F32 => chunks.map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Elem::F16 => chunks.map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Elem::BF16 => chunks.map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
    };
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(format_error(path, format!("tensor '{}' holds a non-finite value ({}) at element {i}", t.name, values[i])));
    }
    Ok(values)
}

/// The row order of a Q or K matrix (or of `B`, its rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RowOrder {
    /// Hugging Face's (and PEFT's): each head's rotary pairs are its rows `j` and `j + d/2`.
    HuggingFace,
    /// The base GGUF's for llama.cpp's normal rope order: a head's pairs are adjacent rows.
    Gguf,
}

/// The heads whose rows Q's or K's `B` is permuted by between the two row orders in `cfg`'s
/// model: `None` for other targets, and for a model whose rope order is not llama.cpp's
/// normal one (its GGUF rows are Hugging Face's).
pub(super) fn qk_heads(cfg: &ModelConfig, target: LoraTarget) -> Option<usize> {
    if cfg.rope.order != RopeOrder::Normal {
        return None;
    }
    match target {
        LoraTarget::Q => Some(cfg.n_head),
        LoraTarget::K => Some(cfg.n_head_kv),
        _ => None,
    }
}

/// llama.cpp's row permutation of Q and K for its normal rope order, or its inverse: a
/// `[rows][cols]` matrix with `n` heads of `d` rows each, put into row order `to`. Row
/// `h·d + 2j + s` of the GGUF order is row `h·d + s·d/2 + j` of Hugging Face's (within each
/// head, the first and second halves of the rows interleaved). `None` if the rows do not
/// split into `n` heads of an even size.
pub(super) fn permute_rows(w: &[f32], rows: usize, cols: usize, n: usize, to: RowOrder) -> Option<Vec<f32>> {
    if n == 0 || !rows.is_multiple_of(n) || !(rows / n).is_multiple_of(2) || Some(w.len()) != rows.checked_mul(cols) {
        return None;
    }
    let per_head = rows / n;
    let half = per_head / 2;
    let mut out = vec![0.0; w.len()];
    for h in 0..n {
        for j in 0..half {
            for s in 0..2 {
                let gguf = h * per_head + 2 * j + s;
                let hf = h * per_head + s * half + j;
                let (src, dst) = match to {
                    RowOrder::Gguf => (hf, gguf),
                    RowOrder::HuggingFace => (gguf, hf),
                };
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    Some(out)
}

/// The layer a tensor name's decimal index names, if it is written canonically (no sign,
/// no leading zeros): an index the model does not have is a wrong base. `Ok(None)` for
/// text that is not an index.
pub(super) fn layer_index(digits: &str, cfg: &ModelConfig) -> Result<Option<usize>, LoraError> {
    let canonical = !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit()) && (digits == "0" || !digits.starts_with('0'));
    if !canonical {
        return Ok(None);
    }
    match digits.parse::<usize>() {
        Ok(layer) if layer < cfg.n_layers => Ok(Some(layer)),
        _ => Err(LoraError::WrongBase(format!("adapter has layer {digits}, the model has {} layers", cfg.n_layers))),
    }
}

fn layer_error(layer: usize, cfg: &ModelConfig) -> LoraError {
    LoraError::WrongBase(format!("adapter has layer {layer}, the model has {} layers", cfg.n_layers))
}

pub(super) fn format_error(path: &Path, reason: String) -> LoraError {
    LoraError::Format { path: path.to_path_buf(), reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: `w.reshape(n, 2, rows/n/2, cols).swapaxes(1, 2).reshape(rows, cols)`.
    fn numpy_permute(w: &[f32], rows: usize, cols: usize, n: usize) -> Vec<f32> {
        let half = rows / n / 2;
        let mut out = vec![0.0; rows * cols];
        for h in 0..n {
            for s in 0..2 {
                for j in 0..half {
                    let (src, dst) = ((h * 2 + s) * half + j, (h * half + j) * 2 + s);
                    out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
                }
            }
        }
        out
    }

    #[test]
    fn permutation_matches_its_definition() {
        let (rows, cols) = (24, 3);
        let w: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        for n in [1, 2, 3, 4, 6, 12] {
            let gguf = permute_rows(&w, rows, cols, n, RowOrder::Gguf).unwrap();
            assert_eq!(gguf, numpy_permute(&w, rows, cols, n), "n = {n}");
            assert_eq!(permute_rows(&gguf, rows, cols, n, RowOrder::HuggingFace).unwrap(), w, "n = {n}: the inverse undoes it");
            if n < 12 {
                assert_ne!(gguf, w, "n = {n} moves rows");
            }
        }
        for to in [RowOrder::Gguf, RowOrder::HuggingFace] {
            assert!(permute_rows(&w, rows, cols, 5, to).is_none());
            assert!(permute_rows(&w, rows, cols, 24, to).is_none(), "one row per head has no pairs");
            assert!(permute_rows(&w, rows, cols, 0, to).is_none());
            assert!(permute_rows(&w[1..], rows, cols, 2, to).is_none());
        }
    }

    #[test]
    fn partner_names() {
        let peft = "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight";
        assert_eq!(Layout::Peft.partner_name(peft, Side::A), "base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight");
        assert_eq!(Layout::Gguf.partner_name("blk.3.attn_q.weight.lora_b", Side::B), "blk.3.attn_q.weight.lora_a");
    }
}
