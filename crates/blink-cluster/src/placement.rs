//! Where each layer lives on a ring: devices in ring order, each holding a window of
//! `windows[d]` consecutive layers in each of `rounds` rounds. Round r covers layers
//! `r·W .. (r+1)·W` (W = Σ windows), cut among the devices in ring order; a device with
//! an empty window is left out of the ring. A device's layers are numbered locally in the
//! order it runs them (round by round), which is how its KV cache and its weight windows
//! are indexed.

use std::fmt;

/// A ring's layout: the windows of each device (in ring order) and the rounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    windows: Vec<usize>,
    rounds: usize,
}

/// Where one layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The device's index in ring order.
    pub device: usize,
    /// The round (0-based) the layer's window belongs to.
    pub round: usize,
    /// The layer's index among the device's own layers (`round · window + offset`).
    pub local: usize,
}

/// Why a layout is not a ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RingError {
    NoRounds,
    NoLayers,
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::NoRounds => write!(f, "a ring needs at least one round"),
            RingError::NoLayers => write!(f, "a ring needs at least one device with a window of at least one layer"),
        }
    }
}

impl std::error::Error for RingError {}

impl Ring {
    pub fn new(windows: Vec<usize>, rounds: usize) -> Result<Ring, RingError> {
        if rounds == 0 {
            return Err(RingError::NoRounds);
        }
        if windows.iter().all(|&w| w == 0) {
            return Err(RingError::NoLayers);
        }
        Ok(Ring { windows, rounds })
    }

    pub fn windows(&self) -> &[usize] {
        &self.windows
    }

    pub fn rounds(&self) -> usize {
        self.rounds
    }

    /// Layers in one round.
    pub fn round_layers(&self) -> usize {
        self.windows.iter().sum()
    }

    /// Layers the ring runs.
    pub fn n_layers(&self) -> usize {
        self.round_layers() * self.rounds
    }

    /// Layers device `d` holds (its window in every round).
    pub fn device_layers(&self, d: usize) -> usize {
        self.windows.get(d).map_or(0, |w| w * self.rounds)
    }

    /// Where layer `layer` runs (`None` past the last layer).
    pub fn place(&self, layer: usize) -> Option<Place> {
        if layer >= self.n_layers() {
            return None;
        }
        let per_round = self.round_layers();
        let (round, mut offset) = (layer / per_round, layer % per_round);
        for (device, &w) in self.windows.iter().enumerate() {
            if offset < w {
                return Some(Place { device, round, local: round * w + offset });
            }
            offset -= w;
        }
        unreachable!("an offset within a round falls in one of its windows")
    }

    /// The global layer of device `d`'s local layer `local`.
    pub fn layer_of(&self, d: usize, local: usize) -> Option<usize> {
        let w = *self.windows.get(d)?;
        if w == 0 || local >= w * self.rounds {
            return None;
        }
        let start: usize = self.windows[..d].iter().sum();
        Some((local / w) * self.round_layers() + start + local % w)
    }

    /// Device `d`'s windows as global layer ranges, in the order it runs them.
    pub fn device_windows(&self, d: usize) -> Vec<std::ops::Range<usize>> {
        let Some(&w) = self.windows.get(d) else { return Vec::new() };
        if w == 0 {
            return Vec::new();
        }
        let start: usize = self.windows[..d].iter().sum();
        (0..self.rounds).map(|r| r * self.round_layers() + start..r * self.round_layers() + start + w).collect()
    }

    /// The same ring without devices `down`: their windows go to the devices left that
    /// hold windows, in proportion to what they hold (largest remainders first, ties to
    /// the earlier device). `None` when no device with a window is left.
    pub fn without(&self, down: &[usize]) -> Option<Ring> {
        let up: Vec<usize> = (0..self.windows.len()).filter(|d| !down.contains(d) && self.windows[*d] > 0).collect();
        let kept: usize = up.iter().map(|&d| self.windows[d]).sum();
        if kept == 0 {
            return None;
        }
        let total = self.round_layers();
        let mut windows = vec![0; self.windows.len()];
        let mut given = 0;
        let mut rest: Vec<(usize, usize)> = Vec::with_capacity(up.len());
        for &d in &up {
            let share = self.windows[d] * total;
            windows[d] = share / kept;
            given += windows[d];
            rest.push((share % kept, d));
        }
        rest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, d) in rest.iter().take(total - given) {
            windows[d] += 1;
        }
        Ring::new(windows, self.rounds).ok()
    }

    /// The devices a token visits, in order, over all rounds (one entry per window).
    pub fn visits(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.rounds).flat_map(move |_| self.windows.iter().enumerate().filter(|(_, &w)| w > 0).map(|(d, _)| d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_ring_without_a_device_gives_its_layers_to_the_others() {
        let ring = Ring::new(vec![6, 8, 8, 8], 1).unwrap();
        let less = ring.without(&[2]).unwrap();
        assert_eq!(less.windows(), [8, 11, 0, 11]);
        assert_eq!(less.n_layers(), 30);
        assert_eq!(Ring::new(vec![0, 5, 5], 3).unwrap().without(&[1]).unwrap().windows(), [0, 0, 10]);
        assert_eq!(ring.without(&[0, 1, 2, 3]), None);
    }

    proptest! {
        #[test]
        fn a_ring_without_devices_keeps_its_layers(windows in proptest::collection::vec(0usize..12, 1..6), rounds in 1usize..4, down in proptest::collection::vec(0usize..6, 0..4)) {
            prop_assume!(windows.iter().any(|&w| w > 0));
            let ring = Ring::new(windows.clone(), rounds).unwrap();
            match ring.without(&down) {
                Some(less) => {
                    prop_assert_eq!(less.n_layers(), ring.n_layers());
                    for (d, (&w, &now)) in windows.iter().zip(less.windows()).enumerate() {
                        if down.contains(&d) || w == 0 {
                            prop_assert_eq!(now, 0);
                        } else {
                            prop_assert!(now >= w);
                        }
                    }
                }
                None => prop_assert!((0..windows.len()).all(|d| down.contains(&d) || windows[d] == 0)),
            }
        }
    }

    #[test]
    fn a_small_ring_by_hand() {
        // Two rounds over windows of 2, 0 and 1: layers 0 1 | 2 || 3 4 | 5.
        let ring = Ring::new(vec![2, 0, 1], 2).unwrap();
        let places: Vec<_> = (0..6).map(|l| ring.place(l).unwrap()).map(|p| (p.device, p.round, p.local)).collect();
        assert_eq!(places, [(0, 0, 0), (0, 0, 1), (2, 0, 0), (0, 1, 2), (0, 1, 3), (2, 1, 1)]);
        assert_eq!(ring.place(6), None);
        assert_eq!(ring.device_windows(0), [0..2, 3..5]);
        assert!(ring.device_windows(1).is_empty());
        assert_eq!(ring.visits().collect::<Vec<_>>(), [0, 2, 0, 2]);
        assert_eq!(Ring::new(vec![0, 0], 1), Err(RingError::NoLayers));
        assert_eq!(Ring::new(vec![1], 0), Err(RingError::NoRounds));
    }

    fn rings() -> impl Strategy<Value = Ring> {
        (prop::collection::vec(0usize..6, 1..6), 1usize..5)
            .prop_filter("some window", |(w, _)| w.iter().any(|&x| x > 0))
            .prop_map(|(w, k)| Ring::new(w, k).unwrap())
    }

    proptest! {
        #[test]
        fn every_layer_has_one_place_and_back(ring in rings()) {
            let mut seen = vec![vec![false; 0]; ring.windows().len()];
            for (d, s) in seen.iter_mut().enumerate() {
                *s = vec![false; ring.device_layers(d)];
            }
            for layer in 0..ring.n_layers() {
                let p = ring.place(layer).unwrap();
                prop_assert!(p.local < ring.device_layers(p.device));
                prop_assert!(!seen[p.device][p.local], "two layers at one place");
                seen[p.device][p.local] = true;
                prop_assert_eq!(ring.layer_of(p.device, p.local), Some(layer));
                prop_assert!(ring.device_windows(p.device)[p.round].contains(&layer));
            }
            prop_assert!(seen.iter().flatten().all(|&s| s));
        }

        #[test]
        fn a_token_walks_the_layers_in_order(ring in rings()) {
            // Consecutive layers stay on a device (its next local layer) or move to the
            // next device with a window, in ring order, wrapping between rounds.
            let active: Vec<usize> = (0..ring.windows().len()).filter(|&d| ring.windows()[d] > 0).collect();
            for layer in 1..ring.n_layers() {
                let (a, b) = (ring.place(layer - 1).unwrap(), ring.place(layer).unwrap());
                if a.device == b.device {
                    prop_assert_eq!(b.local, a.local + 1);
                } else {
                    let i = active.iter().position(|&d| d == a.device).unwrap();
                    prop_assert_eq!(b.device, active[(i + 1) % active.len()]);
                }
                prop_assert!(b.round == a.round || b.round == a.round + 1);
            }
            let visits: Vec<usize> = ring.visits().collect();
            prop_assert_eq!(visits.len(), active.len() * ring.rounds());
        }
    }
}
