//! The adapter a run starts from: PEFT's default initialisation (`A` uniform in
//! `±1/√in`, what `kaiming_uniform_(a=√5)` gives; `B` zero, so the run starts at the base
//! model), drawn from the run's seed, or an adapter read from a file.

use blink_model::config::ModelConfig;
use blink_model::lora::{LoraFormat, LoraPair, LoraTarget, LoraTensors};

use crate::data::SplitMix64;

/// A fresh adapter of rank `rank` on `targets` in every layer.
pub fn fresh(cfg: &ModelConfig, rank: usize, alpha: f32, targets: &[LoraTarget], seed: u64) -> LoraTensors {
    let mut rng = SplitMix64::new(seed ^ 0x4c6f_5241_696e_6974);
    let layers = (0..cfg.n_layers)
        .map(|_| {
            let mut layer: [Option<LoraPair>; 7] = Default::default();
            for &t in LoraTarget::ALL.iter().filter(|t| targets.contains(t)) {
                let (rows, cols) = t.shape(cfg);
                let bound = 1.0 / (cols as f64).sqrt();
                let a = (0..rank * cols).map(|_| ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * bound).map(|v| v as f32).collect();
                layer[t.index()] = Some(LoraPair { rank, rows, cols, a, b: vec![0.0; rows * rank] });
            }
            layer
        })
        .collect();
    LoraTensors { format: LoraFormat::Peft, alpha, rslora: false, layers }
}

/// The largest rank per target over the layers (what the trainer's buffers are sized for).
pub fn ranks(params: &LoraTensors) -> [usize; 7] {
    let mut r = [0; 7];
    for layer in &params.layers {
        for (i, p) in layer.iter().enumerate() {
            if let Some(p) = p {
                r[i] = r[i].max(p.rank);
            }
        }
    }
    r
}

/// Every parameter tensor in the run's fixed order (per layer, per target: `A`, then `B`).
pub fn tensors_mut(t: &mut LoraTensors) -> Vec<&mut [f32]> {
    t.layers.iter_mut().flatten().flatten().flat_map(|p| [&mut p.a[..], &mut p.b[..]]).collect()
}

/// As [`tensors_mut`], read-only.
pub fn tensors(t: &LoraTensors) -> Vec<&[f32]> {
    t.layers.iter().flatten().flatten().flat_map(|p| [&p.a[..], &p.b[..]]).collect()
}
