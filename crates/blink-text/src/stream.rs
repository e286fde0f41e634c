//! One generation's text: token ids in, final text out.
//!
//! A [`TextStream`] detokenizes the ids a model generates ([`StreamDecoder`]: a character
//! split across tokens is held back until it is whole), holds back what may begin a stop
//! string and cuts the text before the first one ([`StopMatcher`]), and keeps the text
//! offsets log-probabilities report: where each token's text starts in the decoded text, and
//! how much of it has been released. `blink run`/`blink chat` sessions and the server read
//! their generations through it.

use crate::stop::{StopMatcher, StopScan};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// A position in a generation's decoded text (before stop strings cut it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TextOffset {
    pub bytes: usize,
    pub chars: usize,
}

/// What one step of a [`TextStream`] released.
#[derive(Debug, PartialEq, Eq)]
pub struct Released<'a> {
    /// Text that is final now (possibly empty): never a broken character, never part of a
    /// stop string.
    pub text: &'a str,
    /// A stop string matched: `text` is what came before it, and the generation is over.
    pub stopped: bool,
}

/// The text of one generation, released as it becomes final.
#[derive(Default)]
pub struct TextStream {
    decoder: StreamDecoder,
    stops: StopMatcher,
    /// How much text the tokens so far decoded to.
    decoded: TextOffset,
    /// Bytes released so far.
    released: usize,
    /// What [`TextStream::finish`] released.
    tail: String,
}

impl TextStream {
    /// A stream that ends before the first of `stops` (empty ones are ignored). Control
    /// tokens contribute no text.
    pub fn new(stops: &[String]) -> TextStream {
        TextStream { decoder: StreamDecoder::new(false), stops: StopMatcher::new(stops), ..TextStream::default() }
    }

    /// Where the next token's text will start: how much text the tokens so far decoded to.
    pub fn decoded(&self) -> TextOffset {
        self.decoded
    }

    /// Bytes of text released so far.
    pub fn released(&self) -> usize {
        self.released
    }

    /// Whether a token whose text starts at `start` (its [`TextStream::decoded`] before it
    /// was pushed) has had text released from its start on: a token's log-probability goes
    /// out with the text it starts in.
    pub fn is_released(&self, start: TextOffset) -> bool {
        start.bytes < self.released
    }

    /// Add the generated token `id`; returns the text it made final.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Released<'_> {
        let text = self.decoder.push(tok, id);
        self.decoded.bytes += text.len();
        self.decoded.chars += text.chars().count();
        let released = match self.stops.push(text) {
            StopScan::Continue(text) => Released { text, stopped: false },
            StopScan::Stopped(text) => Released { text, stopped: true },
        };
        self.released += released.text.len();
        released
    }

    /// The generation ended without a stop string: release what was held back (an
    /// unfinished character becomes U+FFFD). A stop string may still complete in it, which
    /// `stopped` then tells.
    pub fn finish(&mut self) -> Released<'_> {
        let rest = self.decoder.finish();
        self.decoded.bytes += rest.len();
        self.decoded.chars += rest.chars().count();
        self.tail.clear();
        let stopped = match self.stops.push(&rest) {
            StopScan::Continue(text) => {
                self.tail.push_str(text);
                false
            }
            StopScan::Stopped(text) => {
                self.tail.push_str(text);
                true
            }
        };
        if !stopped {
            self.tail.push_str(&self.stops.finish());
        }
        self.released += self.tail.len();
        Released { text: &self.tail, stopped }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::TokenizerParts;

    /// Ids 0.. are "a", "b", "E", "N", "D", and the two bytes of "é" (0xC3, 0xA9) as
    /// byte-level BPE writes them.
    const A: u32 = 0;
    const B: u32 = 1;
    const E: u32 = 2;
    const N: u32 = 3;
    const D: u32 = 4;
    const E_ACUTE: [u32; 2] = [5, 6];

    fn tokenizer() -> Tokenizer {
        let tokens: Vec<String> = ["a", "b", "E", "N", "D", "\u{C3}", "\u{A9}"].iter().map(|t| t.to_string()).collect();
        let parts = TokenizerParts {
            model: "gpt2".into(),
            pre: Some("gpt-2".into()),
            token_types: Some(vec![1; tokens.len()]),
            tokens,
            merges: Some(Vec::new()),
            ..Default::default()
        };
        Tokenizer::from_parts(parts).expect("a small byte-level vocabulary")
    }

    fn stream(stops: &[&str]) -> TextStream {
        TextStream::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn offsets_count_decoded_bytes_and_characters() {
        let tok = tokenizer();
        let mut s = stream(&[]);
        let mut starts = Vec::new();
        let mut text = String::new();
        for id in [A, E_ACUTE[0], E_ACUTE[1], B] {
            starts.push(s.decoded());
            let r = s.push(&tok, id);
            assert!(!r.stopped);
            text.push_str(r.text);
        }
        assert_eq!(text, "aéb");
        let at = |bytes, chars| TextOffset { bytes, chars };
        assert_eq!(starts, [at(0, 0), at(1, 1), at(1, 1), at(3, 2)]);
        assert_eq!(s.decoded(), at(4, 3));
        assert_eq!(s.released(), 4);
    }

    #[test]
    fn a_stop_string_across_tokens_ends_the_text_before_it() {
        let tok = tokenizer();
        let mut s = stream(&["ND"]);
        assert_eq!(s.push(&tok, A), Released { text: "a", stopped: false });
        let start_of_n = s.decoded();
        assert_eq!(s.push(&tok, N), Released { text: "", stopped: false });
        assert!(!s.is_released(start_of_n));
        assert_eq!(s.push(&tok, D), Released { text: "", stopped: true });
        assert_eq!(s.released(), 1);
        assert!(s.is_released(TextOffset::default()));
    }

    #[test]
    fn finish_releases_held_text_and_a_broken_character() {
        let tok = tokenizer();
        let mut s = stream(&["EN"]);
        assert_eq!(s.push(&tok, E), Released { text: "", stopped: false });
        assert_eq!(s.push(&tok, E_ACUTE[0]), Released { text: "", stopped: false });
        assert_eq!(s.finish(), Released { text: "E\u{FFFD}", stopped: false });
        assert_eq!(s.released(), "E\u{FFFD}".len());
    }
}
