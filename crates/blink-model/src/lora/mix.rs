//! What a row runs with: a set of placed adapters, each with the user's scale (as
//! llama.cpp, several adapters may be stacked; most requests name one).

use std::sync::Arc;

use super::LoraAdapter;

/// Adapters applied together, each delta scaled by its own factor on top of its
/// `alpha / r`. A step names the mixes its rows use; a row's slot indexes them.
#[derive(Clone, Default)]
pub struct LoraMix {
    adapters: Vec<(Arc<LoraAdapter>, f32)>,
}

impl LoraMix {
    /// One adapter at its own scale.
    pub fn single(adapter: Arc<LoraAdapter>) -> LoraMix {
        LoraMix { adapters: vec![(adapter, 1.0)] }
    }

    /// Adapters with user scales; those scaled by zero are left out (they change nothing).
    /// Scales must be finite.
    pub fn new(adapters: impl IntoIterator<Item = (Arc<LoraAdapter>, f32)>) -> LoraMix {
        LoraMix { adapters: adapters.into_iter().filter(|(_, s)| *s != 0.0).collect() }
    }

    pub fn adapters(&self) -> &[(Arc<LoraAdapter>, f32)] {
        &self.adapters
    }

    /// Whether it changes nothing (a row with it runs the base model).
    pub fn is_empty(&self) -> bool {
        self.adapters.is_empty()
    }

    /// The sum of its adapters' largest ranks: room for a row's activations of all its
    /// pairs on one projection.
    pub fn stacked_rank(&self) -> usize {
        self.adapters.iter().map(|(a, _)| a.max_rank()).sum()
    }

    /// Whether the two apply the same adapters (the same placements) at the same scales.
    pub fn same(&self, other: &LoraMix) -> bool {
        self.adapters.len() == other.adapters.len()
            && self.adapters.iter().zip(&other.adapters).all(|((a, s), (b, t))| Arc::ptr_eq(a, b) && s.to_bits() == t.to_bits())
    }

    /// Names what the mix computes, for the prefix cache: equal keys mean equal weights
    /// and scales (each placement of an adapter has its own id). The empty mix is 0, the
    /// base model's key.
    pub fn key(&self) -> u64 {
        // FNV-1a over (id, scale bits): stable, and cheap beside a prompt's hashing.
        if self.adapters.is_empty() {
            return 0;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (a, s) in &self.adapters {
            for word in [a.id(), u64::from(s.to_bits())] {
                for byte in word.to_le_bytes() {
                    h = (h ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
        }
        h.max(1)
    }
}

impl std::fmt::Debug for LoraMix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.adapters.iter().map(|(a, s)| (a.id(), *s))).finish()
    }
}
