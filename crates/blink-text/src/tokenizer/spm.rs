//! SentencePiece (`llama`) tokenization as llama.cpp performs it.
//!
//! The text (spaces already escaped to U+2581) starts as one symbol per character. The adjacent pair
//! whose concatenation is a token with the highest score (leftmost among equal scores) is merged
//! until no pair forms a token. A final symbol that is not a token falls back to its bytes as
//! `<0xXX>` tokens (or, failing that, the unknown token).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

const NONE: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    end: usize,
    prev: usize,
    next: usize,
}

/// A candidate merge: highest score first, then leftmost.
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}

/// Byte-fallback tokens of a SentencePiece vocabulary.
#[derive(Debug)]
pub(crate) struct Spm {
    byte_token: [Option<u32>; 256],
}

impl Spm {
    pub fn new(vocab: &Vocab) -> Spm {
        let mut byte_token = [None; 256];
        for (b, slot) in byte_token.iter_mut().enumerate() {
            *slot = vocab.id_of(&format!("<0x{b:02X}>")).or_else(|| {
                // llama.cpp's second choice: the byte itself as a one-character token.
                u8::try_from(b).ok().filter(u8::is_ascii).and_then(|c| vocab.id_of(&char::from(c).to_string()))
            });
        }
        Spm { byte_token }
    }

    /// Appends the tokens of `text` (already space-escaped) to `out`.
    pub fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let i = symbols.len();
            // `i - 1` wraps to NONE for the first symbol.
            symbols.push(Symbol { start, end: start + c.len_utf8(), prev: i.wrapping_sub(1), next: i + 1 });
        }
        let Some(last) = symbols.last_mut() else { return };
        last.next = NONE;

        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<Candidate>, symbols: &[Symbol], left: usize, right: usize| {
            if left == NONE || right == NONE {
                return;
            }
            let piece = &text[symbols[left].start..symbols[right].end];
            if let Some(id) = vocab.id_of(piece) {
                let score = vocab.scores.get(id as usize).copied().unwrap_or(0.0);
                heap.push(Candidate { score, left, right, len: piece.len() });
            }
        };
        for i in 1..symbols.len() {
            push(&mut heap, &symbols, i - 1, i);
        }
        while let Some(c) = heap.pop() {
            let (l, r) = (symbols[c.left], symbols[c.right]);
            let (ll, rl) = (l.end - l.start, r.end - r.start);
            // Stale: a side was merged since (sizes only grow, so equal sizes mean unchanged).
            if ll == 0 || rl == 0 || ll + rl != c.len {
                continue;
            }
            symbols[c.left].end = r.end;
            symbols[c.left].next = r.next;
            symbols[c.right].end = symbols[c.right].start;
            if r.next != NONE {
                symbols[r.next].prev = c.left;
            }
            push(&mut heap, &symbols, l.prev, c.left);
            push(&mut heap, &symbols, c.left, r.next);
        }

        let mut i = 0;
        while i != NONE {
            let sym = symbols[i];
            let piece = &text[sym.start..sym.end];
            // Every merged symbol is a token by construction; only single characters can miss.
            match vocab.id_of(piece) {
                Some(id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        if let Some(id) = self.byte_token[b as usize].or(vocab.ids.unk) {
                            out.push(id);
                        }
                    }
                }
            }
            i = sym.next;
        }
    }
}
