//! The planner's problem solved by trying every split of the layers among the devices,
//! for every number of rounds: the reference the mixed-integer program is held to (and a
//! planner of its own for a handful of devices).

use super::{Cluster, Plan, PlanError};
use crate::placement::Ring;

/// The best plan by exhaustive search (`None`: nothing fits). The first split found wins
/// a tie.
pub fn best(c: &Cluster) -> Result<Option<Plan>, PlanError> {
    c.validate()?;
    let mut best: Option<Plan> = None;
    for k in c.round_choices() {
        let mut windows = vec![0; c.devices.len()];
        splits(&mut windows, 0, c.model.n_layers / k, &mut |w| {
            if let Ok(predicted) = c.predict(w, k) {
                if best.as_ref().is_none_or(|b| predicted.total() < b.predicted.total()) {
                    best = Some(Plan { ring: Ring::new(w.to_vec(), k).expect("a split of at least one layer"), predicted });
                }
            }
        });
    }
    Ok(best)
}

/// Call `f` with every way of putting `left` layers into `w[at..]`.
fn splits(w: &mut [usize], at: usize, left: usize, f: &mut dyn FnMut(&[usize])) {
    if at + 1 == w.len() {
        w[at] = left;
        f(w);
        return;
    }
    for here in 0..=left {
        w[at] = here;
        splits(w, at + 1, left - here, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_split_is_tried_once() {
        let mut seen = Vec::new();
        splits(&mut [0; 3], 0, 4, &mut |w| seen.push(w.to_vec()));
        assert_eq!(seen.len(), 15); // C(4 + 2, 2)
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 15);
        assert!(seen.iter().all(|w| w.iter().sum::<usize>() == 4));
    }
}
