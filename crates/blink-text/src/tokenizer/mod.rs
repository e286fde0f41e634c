//! Tokenization compatible with llama.cpp: byte-level BPE (`gpt2`) and SentencePiece (`llama`)
//! vocabularies read from GGUF metadata, producing the same token ids as llama.cpp.
//!
//! Encoding first splits the text on special-token texts (`special`), then tokenizes each text
//! fragment: BPE pre-tokenizes with the regexes chosen by `tokenizer.ggml.pre` (`pretokenize`) and
//! merges by rank (`bpe`); SentencePiece escapes spaces and merges by score (`spm`). Encoding and
//! decoding never fail and never panic: unknown ids decode to U+FFFD.
//!
//! Decoding follows llama.cpp's `llama_detokenize` (see [`Tokenizer::decode`]); [`StreamDecoder`]
//! follows its streaming output (concatenated token pieces).

mod bpe;
mod decode;
mod error;
mod gguf;
mod hash;
mod pretokenize;
mod special;
mod spm;
mod vocab;

use std::borrow::Cow;

pub use decode::StreamDecoder;
pub use error::TokenizerError;
pub use pretokenize::SUPPORTED_PRE;
pub use vocab::{SpecialTokenIds, TokenizerParts};

pub(crate) use gguf::template_tokens;

use bpe::Bpe;
use decode::Pieces;
use pretokenize::PreTokenizer;
use special::Fragment;
use spm::Spm;
use vocab::{attr, Defaults, ModelKind, Vocab};

enum Model {
    Bpe { bpe: Box<Bpe>, pre: PreTokenizer },
    Spm(Box<Spm>),
}

/// A tokenizer: text ↔ token ids, as llama.cpp does it for the same GGUF metadata.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    model_kind: String,
    pre: Option<String>,
    clean_spaces: bool,
    pieces: Pieces,
}

impl Tokenizer {
    /// Builds the tokenizer described by `file`'s `tokenizer.ggml.*` metadata.
    pub fn from_gguf(file: &blink_gguf::GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_parts(gguf::read_parts(file)?)
    }

    /// Builds a tokenizer from plain parts (what the GGUF metadata would hold).
    pub fn from_parts(mut parts: TokenizerParts) -> Result<Tokenizer, TokenizerError> {
        let kind = ModelKind::parse(&parts.model)?;
        let (vocab, model, clean_spaces, pre) = match kind {
            ModelKind::Bpe => {
                let config = pretokenize::config_for(parts.pre.as_deref())?;
                let defaults = Defaults { add_bos: config.add_bos, add_space_prefix: false };
                let vocab = Vocab::build(&mut parts, kind, defaults)?;
                let merges = parts.merges.as_deref().ok_or(TokenizerError::Missing("tokenizer.ggml.merges"))?;
                let bpe = Bpe::new(&vocab, merges, config.ignore_merges)?;
                let pre = PreTokenizer::new(&config)?;
                (vocab, Model::Bpe { bpe: Box::new(bpe), pre }, config.clean_spaces, parts.pre.clone())
            }
            ModelKind::Spm => {
                // llama.cpp ignores `tokenizer.ggml.pre` for SentencePiece.
                let defaults = Defaults { add_bos: true, add_space_prefix: true };
                let vocab = Vocab::build(&mut parts, kind, defaults)?;
                let spm = Spm::new(&vocab);
                (vocab, Model::Spm(Box::new(spm)), false, parts.pre.clone())
            }
        };
        let pieces = Pieces::build(&vocab, kind);
        Ok(Tokenizer { vocab, model, model_kind: parts.model, pre, clean_spaces, pieces })
    }

    /// Tokenizes `text`.
    ///
    /// `add_special`: add BOS/EOS as the model's metadata asks. `parse_special`: text equal to a
    /// control token's text (e.g. `<|im_start|>`) becomes that token; otherwise it is tokenized as
    /// plain text. User-defined tokens are always recognised, as in llama.cpp.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let v = &self.vocab;
        let fragments = special::partition(v, text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && v.add_bos {
            out.extend(v.ids.bos);
        }
        match &self.model {
            Model::Bpe { bpe, pre } => {
                let mut scratch = bpe::Scratch::default();
                for f in fragments {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(r) => {
                            let fragment = &text[r];
                            for word in pre.split(fragment) {
                                bpe.encode_word(v, &fragment.as_bytes()[word], &mut scratch, &mut out);
                            }
                        }
                    }
                }
            }
            Model::Spm(spm) => {
                // A space is prefixed to the first fragment and to every fragment after a special token.
                let mut after_special = true;
                let mut escaped = String::new();
                for f in fragments {
                    match f {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(r) => {
                            escaped.clear();
                            if v.add_space_prefix && after_special {
                                escaped.push('\u{2581}');
                            }
                            for c in text[r].chars() {
                                escaped.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            spm.encode(v, &escaped, &mut out);
                            after_special = false;
                        }
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.ids.eos);
        }
        out
    }

    /// The bytes token `id` contributes to output text: byte-level decoded (BPE), `▁` → space and
    /// `<0xXX>` → that byte (SentencePiece), user-defined tokens verbatim. Control and unknown tokens
    /// give their text only if `render_special`; unused tokens give nothing; an id outside the
    /// vocabulary gives U+FFFD.
    pub fn token_bytes(&self, id: u32, render_special: bool) -> Cow<'_, [u8]> {
        let Some(piece) = self.pieces.get(id) else {
            return Cow::Borrowed(decode::REPLACEMENT);
        };
        if !render_special && self.vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return Cow::Borrowed(&[]);
        }
        Cow::Borrowed(piece)
    }

    /// Decodes `ids` to text like llama.cpp's `llama_detokenize(.., remove_special = false,
    /// unparse_special = render_special)`: when the model adds a space prefix (SentencePiece), the
    /// first token's leading space is dropped; models with `clean_spaces` (most BPE pre-tokenizers,
    /// see llama.cpp) get spaces before punctuation and contractions tidied. Invalid UTF-8 (a
    /// character cut at the end) is replaced with U+FFFD.
    pub fn decode(&self, ids: &[u32], render_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.token_bytes(id, render_special);
            let piece = match piece.as_ref() {
                [b' ', rest @ ..] if i == 0 && self.vocab.add_space_prefix => rest,
                p => p,
            };
            bytes.extend_from_slice(piece);
        }
        if self.clean_spaces {
            bytes = decode::clean_spaces(&bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.ids.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.ids.eos
    }

    /// End-of-turn token (from metadata, or recognised by its text such as `<|im_end|>`).
    pub fn eot(&self) -> Option<u32> {
        self.vocab.ids.eot
    }

    /// End-of-message token (`<|eom_id|>`).
    pub fn eom(&self) -> Option<u32> {
        self.vocab.ids.eom
    }

    /// Unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.vocab.ids.unk
    }

    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.vocab.ids.pad
    }

    /// Separator token.
    pub fn sep(&self) -> Option<u32> {
        self.vocab.ids.sep
    }

    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos && self.vocab.ids.bos.is_some()
    }

    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos && self.vocab.ids.eos.is_some()
    }

    /// Whether `id` ends generation: EOS, EOT, EOM and the tokens llama.cpp recognises by text
    /// (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, `<end_of_turn>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }

    /// Whether `id` is a control token (not rendered unless asked).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::CONTROL != 0
    }

    /// The raw vocabulary string of `id` (e.g. `Ġhello`, `▁hello`, `<0x0A>`, `<|im_end|>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// The id whose raw vocabulary string is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id_of(text)
    }

    /// `tokenizer.ggml.model`: `"gpt2"` or `"llama"`.
    pub fn model_kind(&self) -> &str {
        &self.model_kind
    }

    /// `tokenizer.ggml.pre`, if present.
    pub fn pre(&self) -> Option<&str> {
        self.pre.as_deref()
    }
}

impl std::fmt::Debug for Tokenizer {
    /// A summary: the vocabulary itself is far too long to print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model_kind)
            .field("pre", &self.pre)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos())
            .field("eos", &self.eos())
            .field("add_bos", &self.add_bos())
            .field("eog", &self.vocab.eog)
            .finish()
    }
}

#[cfg(test)]
mod tests;
