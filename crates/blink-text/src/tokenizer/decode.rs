//! Detokenization: the bytes each token stands for, whole-sequence decoding, and a streaming
//! decoder that only ever emits complete UTF-8.

use super::bpe::ByteDecoder;
use super::vocab::{attr, ModelKind, Vocab};
use super::Tokenizer;

/// UTF-8 of U+FFFD, what an id outside the vocabulary decodes to.
pub(crate) const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

/// Every token's output bytes (as rendered with special tokens shown), in one buffer.
#[derive(Debug)]
pub(crate) struct Pieces {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Pieces {
    /// llama.cpp's `token_to_piece` with `special = true`, for every token.
    pub fn build(vocab: &Vocab, kind: ModelKind) -> Pieces {
        let decoder = ByteDecoder::new();
        let mut bytes = Vec::new();
        let mut ends = Vec::with_capacity(vocab.len());
        for (text, &a) in vocab.texts.iter().zip(&vocab.attrs) {
            if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
                bytes.extend_from_slice(text.as_bytes());
            } else if let Some(b) = (a & attr::BYTE != 0).then(|| parse_byte_token(text)).flatten() {
                bytes.push(b);
            } else if a & (attr::NORMAL | attr::BYTE) != 0 {
                match kind {
                    ModelKind::Spm => bytes.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
                    ModelKind::Bpe => decoder.decode_into(text, &mut bytes),
                }
            }
            // Unused and undefined tokens render as nothing.
            ends.push(bytes.len());
        }
        Pieces { bytes, ends }
    }

    pub fn get(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.bytes.get(start..end)
    }
}

/// `<0xXX>` → the byte.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// llama.cpp's `clean_up_tokenization_spaces`: drops the space before `? ! . ,`, around a lone
/// `'`, and before the contractions `'s 'm 're 've`.
pub(crate) fn clean_spaces(text: &[u8]) -> Vec<u8> {
    // Pass 1: " ?" " !" " ." " ," lose their space.
    let mut a = Vec::with_capacity(text.len());
    for (i, &x) in text.iter().enumerate() {
        let drop = x == b' ' && matches!(text.get(i + 1), Some(b'?' | b'!' | b'.' | b','));
        if !drop {
            a.push(x);
        }
    }
    // Pass 2: " ' " becomes "'"; the consumed trailing space cannot open another such triple.
    let mut b = Vec::with_capacity(a.len());
    let mut i = 0;
    let mut prev_consumed = false;
    while i < a.len() {
        let x = a[i];
        let triple = i > 0 && x == b'\'' && !prev_consumed && a[i - 1] == b' ' && a.get(i + 1) == Some(&b' ');
        if triple {
            b.pop();
            b.push(x);
            i += 2;
            prev_consumed = true;
            continue;
        }
        b.push(x);
        prev_consumed = false;
        i += 1;
    }
    // Pass 3: " 's" " 'm" " 're" " 've" lose their space.
    let mut c = Vec::with_capacity(b.len());
    for (i, &x) in b.iter().enumerate() {
        if i > 0 && x == b'\'' && b[i - 1] == b' ' {
            let contraction =
                matches!((b.get(i + 1), b.get(i + 2)), (Some(b's' | b'm'), _) | (Some(b'r' | b'v'), Some(b'e')));
            if contraction {
                c.pop();
            }
        }
        c.push(x);
    }
    c
}

/// Streaming detokenizer: feed ids one at a time, get back only complete UTF-8 text.
///
/// Bytes of a character split across tokens (byte-fallback or byte-level tokens) are held back until
/// the character is complete; invalid byte sequences become U+FFFD. Unlike
/// [`Tokenizer::decode`], no leading space is stripped and no spaces are cleaned up, like llama.cpp's
/// own streaming output (which concatenates `token_to_piece`).
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    render_special: bool,
    pending: Vec<u8>,
    out: String,
}

impl StreamDecoder {
    /// `render_special`: whether control tokens contribute their text.
    pub fn new(render_special: bool) -> StreamDecoder {
        StreamDecoder { render_special, pending: Vec::new(), out: String::new() }
    }

    /// Adds token `id`; returns the text completed by it (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> &str {
        self.out.clear();
        self.pending.extend_from_slice(&tok.token_bytes(id, self.render_special));
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    self.out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    self.out.push_str(std::str::from_utf8(&self.pending[start..start + valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            self.out.push(char::REPLACEMENT_CHARACTER);
                            start += valid + bad;
                        }
                        // An incomplete character at the end: keep it for the next token.
                        None => {
                            start += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        &self.out
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Flushes held-back bytes (an incomplete character becomes U+FFFD) and resets the decoder.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.out.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        String::from_utf8(clean_spaces(s.as_bytes())).unwrap()
    }

    #[test]
    fn clean_spaces_matches_llama_cpp_rules() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a ' b"), "a'b");
        assert_eq!(clean("a ' ' b"), "a'' b");
        assert_eq!(clean("it 's I 'm we 're they 've I 'll he 'd"), "it's I'm we're they've I 'll he 'd");
        assert_eq!(clean(" ."), ".");
        assert_eq!(clean(""), "");
    }

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xff>"), Some(255));
        assert_eq!(parse_byte_token("<0x0>"), None);
        assert_eq!(parse_byte_token("a"), None);
    }
}
