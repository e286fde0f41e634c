//! Packing examples into batches of at most `batch_tokens` tokens.
//!
//! Examples are never split: a batch is a list of whole examples, each still its own
//! sequence (positions `0..len`, no attention across examples), whose token counts sum to at
//! most `batch_tokens`. An epoch visits the examples in a seeded order
//! ([`epoch_order`](super::shuffle::epoch_order)) and packs them greedily first-fit in that
//! order: each example joins the earliest batch it still fits in, else opens a new one.

use super::error::{refuse_lines, DataError, LineError};
use super::shuffle::epoch_order;
use super::tokenize::Example;

/// Whole examples run together in one optimizer step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Indices into the examples packed, in the order they joined the batch.
    pub examples: Vec<usize>,
    /// Their token counts' sum (at most the batch size).
    pub tokens: usize,
}

/// Packs `examples`, visited in `order` (indices into `examples`), first-fit into batches of
/// at most `batch_tokens` tokens and `batch_examples` examples. Every example longer than a
/// batch is listed in the error.
pub fn pack(examples: &[Example], order: &[usize], batch_tokens: usize, batch_examples: usize) -> Result<Vec<Batch>, DataError> {
    if batch_tokens == 0 || batch_examples == 0 {
        return Err(DataError::ZeroBatch);
    }
    if examples.is_empty() {
        return Err(DataError::Empty);
    }
    let too_long = examples
        .iter()
        .filter(|e| e.len() > batch_tokens)
        .map(|e| LineError::new(e.line, format!("the example is {} tokens, longer than a batch ({batch_tokens})", e.len())))
        .collect();
    refuse_lines(too_long)?;
    if let Some(&index) = order.iter().find(|&&i| i >= examples.len()) {
        return Err(DataError::BadOrder { index, len: examples.len() });
    }
    // Batches with room for at least the shortest example, in creation order: the others
    // can take nothing more and are no longer searched.
    let shortest = examples.iter().map(Example::len).min().unwrap_or(0);
    let mut batches: Vec<Batch> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    for &i in order {
        let len = examples[i].len();
        let slot = open.iter().position(|&b| batches[b].tokens + len <= batch_tokens);
        let b = match slot {
            Some(s) => open[s],
            None => {
                batches.push(Batch { examples: Vec::new(), tokens: 0 });
                open.push(batches.len() - 1);
                batches.len() - 1
            }
        };
        batches[b].examples.push(i);
        batches[b].tokens += len;
        if batches[b].tokens + shortest > batch_tokens || batches[b].examples.len() == batch_examples {
            open.retain(|&o| o != b);
        }
    }
    Ok(batches)
}

/// The batches of epoch `epoch` (0-based): [`epoch_order`] for `seed`, then [`pack`].
pub fn pack_epoch(examples: &[Example], batch_tokens: usize, batch_examples: usize, seed: u64, epoch: u64) -> Result<Vec<Batch>, DataError> {
    pack(examples, &epoch_order(examples.len(), seed, epoch), batch_tokens, batch_examples)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples(lens: &[usize]) -> Vec<Example> {
        lens.iter()
            .enumerate()
            .map(|(i, &n)| Example { line: i + 1, tokens: vec![7; n], targets: (0..n).map(|j| j > 0).collect() })
            .collect()
    }

    #[test]
    fn first_fit_in_the_given_order() {
        let ex = examples(&[6, 5, 4, 3, 2]);
        // 6 → batch 0 (6); 5 does not fit there → batch 1 (5); 4 → batch 0 (10);
        // 3 → batch 1 (8); 2 → batch 1 (10).
        let b = pack(&ex, &[0, 1, 2, 3, 4], 10, usize::MAX).unwrap();
        assert_eq!(b.iter().map(|b| b.examples.clone()).collect::<Vec<_>>(), [vec![0, 2], vec![1, 3, 4]]);
        assert_eq!(b.iter().map(|b| b.tokens).collect::<Vec<_>>(), [10, 10]);
        // Another order, another packing.
        let b = pack(&ex, &[4, 3, 2, 1, 0], 10, usize::MAX).unwrap();
        assert_eq!(b.iter().map(|b| b.examples.clone()).collect::<Vec<_>>(), [vec![4, 3, 2], vec![1], vec![0]]);
    }

    #[test]
    fn batches_hold_at_most_the_examples_asked() {
        let ex = examples(&[2, 2, 2, 2, 2]);
        let b = pack(&ex, &[0, 1, 2, 3, 4], 100, 2).unwrap();
        assert_eq!(b.iter().map(|b| b.examples.clone()).collect::<Vec<_>>(), [vec![0, 1], vec![2, 3], vec![4]]);
        // The token limit still binds first when it is the tighter one.
        let b = pack(&ex, &[0, 1, 2, 3, 4], 4, 3).unwrap();
        assert_eq!(b.iter().map(|b| b.examples.len()).collect::<Vec<_>>(), [2, 2, 1]);
    }

    #[test]
    fn every_example_is_packed_once_within_the_limit() {
        let lens: Vec<usize> = (0..57).map(|i| 3 + (i * 37) % 29).collect();
        let ex = examples(&lens);
        let b = pack_epoch(&ex, 64, usize::MAX, 5, 1).unwrap();
        assert_eq!(b, pack_epoch(&ex, 64, usize::MAX, 5, 1).unwrap());
        let mut seen: Vec<usize> = b.iter().flat_map(|b| b.examples.iter().copied()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..57).collect::<Vec<_>>());
        for batch in &b {
            assert!(batch.tokens <= 64);
            assert_eq!(batch.tokens, batch.examples.iter().map(|&i| lens[i]).sum::<usize>());
        }
    }

    #[test]
    fn an_example_longer_than_a_batch_is_refused_by_line() {
        let ex = examples(&[4, 12, 5, 11]);
        let err = pack(&ex, &[0, 1, 2, 3], 10, usize::MAX).unwrap_err();
        let lines = err.line_errors().expect("line errors");
        assert_eq!(lines.0.iter().map(|e| e.line).collect::<Vec<_>>(), [2, 4]);
        let msg = err.to_string();
        assert!(msg.contains("line 2: the example is 12 tokens, longer than a batch (10)"), "{msg}");
        // Exactly the batch size fits.
        assert_eq!(pack(&ex, &[1], 12, usize::MAX).unwrap().len(), 1);
    }

    #[test]
    fn bad_arguments_are_errors() {
        let ex = examples(&[4]);
        assert!(matches!(pack(&ex, &[0], 0, usize::MAX), Err(DataError::ZeroBatch)));
        assert!(matches!(pack(&ex, &[0], 8, 0), Err(DataError::ZeroBatch)));
        assert!(matches!(pack(&[], &[], 8, usize::MAX), Err(DataError::Empty)));
        assert!(matches!(pack(&ex, &[1], 8, usize::MAX), Err(DataError::BadOrder { index: 1, len: 1 })));
    }
}
