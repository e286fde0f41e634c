//! Byte-level BPE (GPT-2 style): the byte↔character alphabet and the merge loop.
//!
//! Each word from the pre-tokenizer starts as one symbol per byte (each byte spelled as a printable
//! character of GPT-2's byte alphabet). The adjacent pair with the lowest merge rank (leftmost among
//! equal ranks) is merged repeatedly until no pair has a rank — llama.cpp's order exactly. Pieces are
//! interned as integers: vocabulary strings keep their token id, any other string named by a merge
//! gets an id past the vocabulary, so the hot loop hashes integer pairs only.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::hash::{map_with_capacity, FastMap};

use super::vocab::Vocab;
use super::TokenizerError;

/// A symbol whose string appears nowhere in the vocabulary or the merges.
const NO_PIECE: u32 = u32::MAX;
const NONE: usize = usize::MAX;

/// GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the
/// other 68 bytes map to U+0100.. in byte order.
pub(crate) fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(0x100 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// Inverse of [`byte_char`]: the byte a character of the alphabet stands for.
pub(crate) struct ByteDecoder {
    table: Vec<Option<u8>>,
}

impl ByteDecoder {
    pub fn new() -> ByteDecoder {
        let mut table = vec![None; 0x144];
        for b in 0..=255u8 {
            table[byte_char(b) as usize] = Some(b);
        }
        ByteDecoder { table }
    }

    /// Appends the bytes `text` stands for; a character outside the alphabet is kept as UTF-8.
    pub fn decode_into(&self, text: &str, out: &mut Vec<u8>) {
        for c in text.chars() {
            match self.table.get(c as usize).copied().flatten() {
                Some(b) => out.push(b),
                None => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
    }
}

/// Spells raw bytes in the byte alphabet.
fn encode_bytes(bytes: &[u8], out: &mut String) {
    out.clear();
    out.extend(bytes.iter().map(|&b| byte_char(b)));
}

/// The merge table of a byte-level BPE vocabulary.
#[derive(Debug)]
pub(crate) struct Bpe {
    /// (left piece, right piece) → (rank, merged piece).
    merges: FastMap<(u32, u32), (u32, u32)>,
    /// Piece of each byte's character.
    byte_piece: [u32; 256],
    /// Token of each byte's character, used when a finished symbol is not a token.
    byte_token: [Option<u32>; 256],
    ignore_merges: bool,
    n_vocab: u32,
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    end: usize,
    piece: u32,
    prev: usize,
    next: usize,
}

/// A candidate merge; the heap pops the lowest rank, then the leftmost position.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left: usize,
    right: usize,
    left_piece: u32,
    right_piece: u32,
    merged: u32,
}

/// Reusable buffers for [`Bpe::encode_word`].
#[derive(Default)]
pub(crate) struct Scratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Reverse<Candidate>>,
    spelled: String,
}

impl Bpe {
    /// Parses `merges` (`"left right"`, rank = position; the first of duplicates wins).
    pub fn new(vocab: &Vocab, merges: &[String], ignore_merges: bool) -> Result<Bpe, TokenizerError> {
        let n_vocab = vocab.len() as u32;
        let mut extra: FastMap<String, u32> = map_with_capacity(0);
        let mut intern = |s: &str| -> u32 {
            if let Some(id) = vocab.id_of(s) {
                return id;
            }
            let next = n_vocab.saturating_add(extra.len() as u32);
            *extra.entry(s.to_owned()).or_insert(next)
        };
        let mut table = map_with_capacity(merges.len());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // Split at the first space after the first byte, as llama.cpp does.
            let pos = m.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|p| p + 1);
            let Some(pos) = pos.filter(|&p| p + 1 < m.len()) else {
                return Err(TokenizerError::invalid(
                    "tokenizer.ggml.merges",
                    format!("merge #{rank} {m:?} is not of the form \"left right\""),
                ));
            };
            let (left, right) = (&m[..pos], &m[pos + 1..]);
            let l = intern(left);
            let r = intern(right);
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let merged = intern(&joined);
            let rank = u32::try_from(rank).unwrap_or(u32::MAX);
            table.entry((l, r)).or_insert((rank, merged));
        }
        let mut byte_piece = [NO_PIECE; 256];
        let mut byte_token = [None; 256];
        let mut spelled = String::new();
        for b in 0..=255u8 {
            encode_bytes(&[b], &mut spelled);
            byte_token[b as usize] = vocab.id_of(&spelled);
            byte_piece[b as usize] = vocab.id_of(&spelled).or_else(|| extra.get(&spelled).copied()).unwrap_or(NO_PIECE);
        }
        Ok(Bpe { merges: table, byte_piece, byte_token, ignore_merges, n_vocab })
    }

    fn candidate(&self, symbols: &[Symbol], left: usize, right: usize) -> Option<Candidate> {
        if left == NONE || right == NONE {
            return None;
        }
        let (lp, rp) = (symbols[left].piece, symbols[right].piece);
        if lp == NO_PIECE || rp == NO_PIECE {
            return None;
        }
        let &(rank, merged) = self.merges.get(&(lp, rp))?;
        Some(Candidate { rank, left, right, left_piece: lp, right_piece: rp, merged })
    }

    /// Appends the tokens of one pre-tokenized word (raw bytes) to `out`.
    pub fn encode_word(&self, vocab: &Vocab, word: &[u8], s: &mut Scratch, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges {
            encode_bytes(word, &mut s.spelled);
            if let Some(id) = vocab.id_of(&s.spelled) {
                out.push(id);
                return;
            }
        }
        let n = word.len();
        s.symbols.clear();
        s.symbols.extend(word.iter().enumerate().map(|(i, &b)| Symbol {
            start: i,
            end: i + 1,
            piece: self.byte_piece[b as usize],
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == n { NONE } else { i + 1 },
        }));
        s.heap.clear();
        for i in 1..n {
            if let Some(c) = self.candidate(&s.symbols, i - 1, i) {
                s.heap.push(Reverse(c));
            }
        }
        while let Some(Reverse(c)) = s.heap.pop() {
            let (l, r) = (s.symbols[c.left], s.symbols[c.right]);
            // Stale: one side has been merged since this candidate was queued.
            let dead = l.end == l.start || r.end == r.start;
            if dead || l.piece != c.left_piece || r.piece != c.right_piece || l.next != c.right {
                continue;
            }
            let left = c.left;
            s.symbols[left].end = r.end;
            s.symbols[left].piece = c.merged;
            s.symbols[left].next = r.next;
            s.symbols[c.right].end = s.symbols[c.right].start;
            if r.next != NONE {
                s.symbols[r.next].prev = left;
            }
            let prev = s.symbols[left].prev;
            let next = s.symbols[left].next;
            if let Some(c) = self.candidate(&s.symbols, prev, left) {
                s.heap.push(Reverse(c));
            }
            if let Some(c) = self.candidate(&s.symbols, left, next) {
                s.heap.push(Reverse(c));
            }
        }
        let mut i = 0;
        while i != NONE {
            let sym = s.symbols[i];
            if sym.piece < self.n_vocab {
                out.push(sym.piece);
            } else {
                // Not a token (merged into a non-token string, or an unknown byte): spell it byte by
                // byte, dropping bytes that have no token either.
                out.extend(word[sym.start..sym.end].iter().filter_map(|&b| self.byte_token[b as usize]));
            }
            i = sym.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_a_bijection() {
        let d = ByteDecoder::new();
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_char(b);
            assert!(seen.insert(c));
            let mut out = Vec::new();
            d.decode_into(&c.to_string(), &mut out);
            assert_eq!(out, [b]);
        }
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'A'), 'A');
    }
}
