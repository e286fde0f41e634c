//! Adapters of random weights, for benchmarks and memory tests where only an adapter's
//! shape matters (and later, a fine-tuning run's starting point).

use super::target::LoraTarget;
use super::tensors::{LoraFormat, LoraPair, LoraTensors};
use crate::config::ModelConfig;

impl LoraTensors {
    /// A rank-`rank` adapter on `targets` of every layer of `cfg`'s model: `A` uniform in
    /// ±1/√cols (PEFT's Kaiming-uniform bound) and `B` uniform in ±`b_bound`, both drawn from
    /// `seed`, so the same arguments give the same adapter.
    pub fn random(cfg: &ModelConfig, rank: usize, alpha: f32, targets: &[LoraTarget], b_bound: f32, seed: u64) -> LoraTensors {
        let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
        let mut uniform = move |bound: f32| {
            // splitmix64, then the top 24 bits as a float in [-1, 1).
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * bound
        };
        let layers = (0..cfg.n_layers)
            .map(|_| {
                LoraTarget::ALL.map(|t| {
                    targets.contains(&t).then(|| {
                        let (rows, cols) = t.shape(cfg);
                        let a_bound = 1.0 / (cols as f32).sqrt();
                        let a = (0..rank * cols).map(|_| uniform(a_bound)).collect();
                        let b = (0..rows * rank).map(|_| uniform(b_bound)).collect();
                        LoraPair { rank, rows, cols, a, b }
                    })
                })
            })
            .collect();
        LoraTensors { format: LoraFormat::Peft, alpha, rslora: false, layers }
    }
}
