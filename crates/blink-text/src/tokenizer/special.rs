//! Splitting input text on the texts of special tokens, before ordinary tokenization.
//!
//! llama.cpp's order: special tokens are tried longest text first; each one splits every remaining
//! text fragment at all its occurrences, left to right. Control and unknown tokens take part only
//! when special-token parsing is on; user-defined tokens always do. A token marked LSTRIP/RSTRIP
//! (Phi-3) also swallows the ASCII whitespace before/after it.

use std::ops::Range;

use super::vocab::{attr, Vocab};

/// A piece of the input: raw text (a byte range of it) or an already-decided token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Which bytes and adjacent byte pairs occur in a text: a cheap filter that skips special tokens
/// which cannot occur (vocabularies may have thousands of them).
struct Presence {
    bytes: [u64; 4],
    pairs: Vec<u64>,
}

impl Presence {
    fn new(text: &[u8]) -> Presence {
        let mut p = Presence { bytes: [0; 4], pairs: vec![0; 1024] };
        for (i, &b) in text.iter().enumerate() {
            p.bytes[(b >> 6) as usize] |= 1 << (b & 63);
            if let Some(&c) = text.get(i + 1) {
                let k = (b as usize) << 8 | c as usize;
                p.pairs[k >> 6] |= 1 << (k & 63);
            }
        }
        p
    }

    fn may_contain(&self, needle: &[u8]) -> bool {
        match needle {
            [] => false,
            [b] => self.bytes[(b >> 6) as usize] & (1 << (b & 63)) != 0,
            [b, c, ..] => {
                let k = (*b as usize) << 8 | *c as usize;
                self.pairs[k >> 6] & (1 << (k & 63)) != 0
            }
        }
    }
}

/// Partitions `text` into raw-text fragments and special tokens.
pub(crate) fn partition(vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut frags = vec![Fragment::Text(0..text.len())];
    let presence = Presence::new(text.as_bytes());
    let mut next = Vec::new();
    for &id in &vocab.special_cache {
        let a = vocab.attr(id);
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let needle = vocab.texts[id as usize].as_str();
        if !presence.may_contain(needle.as_bytes()) || !text.contains(needle) {
            continue;
        }
        next.clear();
        for f in frags.drain(..) {
            match f {
                Fragment::Text(r) => split_fragment(text, r, needle, id, a, &mut next),
                token => next.push(token),
            }
        }
        std::mem::swap(&mut frags, &mut next);
    }
    frags
}

fn split_fragment(text: &str, r: Range<usize>, needle: &str, id: u32, a: u16, out: &mut Vec<Fragment>) {
    let bytes = text.as_bytes();
    let (mut start, end) = (r.start, r.end);
    while start < end {
        let Some(pos) = text[start..end].find(needle) else {
            out.push(Fragment::Text(start..end));
            return;
        };
        let at = start + pos;
        let mut left_end = at;
        if a & attr::LSTRIP != 0 {
            while left_end > start && is_c_space(bytes[left_end - 1]) {
                left_end -= 1;
            }
        }
        if left_end > start {
            out.push(Fragment::Text(start..left_end));
        }
        out.push(Fragment::Token(id));
        start = at + needle.len();
        if a & attr::RSTRIP != 0 {
            while start < end && is_c_space(bytes[start]) {
                start += 1;
            }
        }
    }
}
