//! The seeded shuffle behind each epoch's example order: splitmix64 and a Fisher–Yates
//! shuffle, fixed here so that a seed means the same order on every platform and in every
//! release (a checkpoint can store the seed and epoch, or the order itself).

/// splitmix64 (Steele, Lea and Flood): a 64-bit state advanced by a Weyl constant, each
/// output a bijective mix of the state.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// Kept apart from seeds so that the seed and epoch mixes never cancel for small values.
const EPOCH_SALT: u64 = 0x6A09_E667_F3BC_C909;

use blink_model::train::mix64;

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// Uniform in `0..n` without modulo bias (Lemire's multiply-and-reject); 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }
}

/// Shuffles `items` in place (Durstenfeld's Fisher–Yates, from the last element down).
pub fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// The order in which epoch `epoch` (0-based) visits `n` examples: a permutation of `0..n`
/// that depends only on `n`, `seed` and `epoch`.
pub fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64::new(seed ^ mix64(epoch ^ EPOCH_SALT));
    shuffle(&mut order, &mut rng);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_stream() {
        // The reference implementation's first outputs for seed 1234567.
        let mut r = SplitMix64::new(1234567);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(got, [6457827717110365317, 3203168211198807973, 9817491932198370423]);
    }

    #[test]
    fn below_stays_in_range_and_reaches_every_value() {
        let mut r = SplitMix64::new(9);
        let mut seen = [0u32; 7];
        for _ in 0..7000 {
            let x = r.below(7);
            assert!(x < 7);
            seen[x as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn epoch_order_is_a_deterministic_permutation() {
        for n in [0, 1, 2, 17, 120] {
            let a = epoch_order(n, 42, 3);
            assert_eq!(a, epoch_order(n, 42, 3));
            let mut sorted = a.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        }
        assert_ne!(epoch_order(120, 42, 0), epoch_order(120, 42, 1));
        assert_ne!(epoch_order(120, 42, 0), epoch_order(120, 43, 0));
    }

    #[test]
    fn epoch_order_is_stable_across_releases() {
        // Pinned (computed by a Python transcription of the algorithm above): checkpoints
        // and reproducible runs rely on this exact order.
        assert_eq!(epoch_order(10, 0, 0), PINNED_0_0);
        assert_eq!(epoch_order(10, 7, 2), PINNED_7_2);
    }

    const PINNED_0_0: [usize; 10] = [6, 1, 8, 2, 0, 4, 9, 3, 7, 5];
    const PINNED_7_2: [usize; 10] = [7, 2, 5, 3, 0, 8, 1, 4, 9, 6];
}
