//! The vocabulary: token texts, types, scores and special-token ids.
//!
//! Reproduces what llama.cpp's vocabulary loader decides beyond the raw metadata: its default
//! BOS/EOS/UNK ids per tokenizer family, its `add_bos`/`add_eos`/`add_space_prefix` defaults, the
//! tokens it recognises by text (end-of-turn, fill-in-the-middle, end-of-generation) and marks as
//! control tokens, and the per-token strip attributes it sets for Phi-3.

use super::hash::{map_with_capacity, FastMap};
use super::TokenizerError;

/// Token attribute bits (llama.cpp's `llama_token_attr`, the subset Blink uses).
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

/// The type of a token, as stored in `tokenizer.ggml.token_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0, or any value outside 1..=6.
    Undefined,
    /// 1: ordinary text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: control token (BOS, EOS, chat markers, ...): not rendered unless asked.
    Control,
    /// 4: user-defined token: always split out of the input, rendered verbatim.
    UserDefined,
    /// 5: unused slot.
    Unused,
    /// 6: a single byte, written `<0xXX>`.
    Byte,
}

impl TokenType {
    /// Maps a `tokenizer.ggml.token_type` value.
    pub fn from_gguf(v: i32) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    fn attr(self) -> u16 {
        match self {
            TokenType::Undefined => 0,
            TokenType::Normal => attr::NORMAL,
            TokenType::Unknown => attr::UNKNOWN,
            TokenType::Control => attr::CONTROL,
            TokenType::UserDefined => attr::USER_DEFINED,
            TokenType::Unused => attr::UNUSED,
            TokenType::Byte => attr::BYTE,
        }
    }
}

/// Special-token ids as given by metadata (`None` = key absent, so llama.cpp's default applies).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokenIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Everything needed to build a [`Tokenizer`](super::Tokenizer) without a GGUF file.
///
/// Field meanings follow the `tokenizer.ggml.*` metadata keys; `None` means "key absent".
#[derive(Clone, Debug, Default)]
pub struct TokenizerParts {
    /// `tokenizer.ggml.model`: `"gpt2"` or `"llama"`.
    pub model: String,
    /// `tokenizer.ggml.pre` (BPE only).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (all normal when absent).
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.scores` (SentencePiece merge priorities; zeros when absent).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges`, each `"left right"` (required for BPE).
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.*_token_id`.
    pub special: SpecialTokenIds,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `general.name`: llama.cpp sets per-token strip attributes for Phi-3 models by name.
    pub model_name: Option<String>,
}

/// Tokenizer family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ModelKind {
    /// `gpt2`: byte-level BPE.
    Bpe,
    /// `llama`: SentencePiece.
    Spm,
}

impl ModelKind {
    pub(crate) fn parse(model: &str) -> Result<ModelKind, TokenizerError> {
        match model {
            "gpt2" => Ok(ModelKind::Bpe),
            "llama" => Ok(ModelKind::Spm),
            other => Err(TokenizerError::UnsupportedModel(other.to_owned())),
        }
    }
}

/// Family- and pre-tokenizer-dependent defaults, before metadata overrides.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Defaults {
    pub add_bos: bool,
    pub add_space_prefix: bool,
}

/// Texts llama.cpp takes as end-of-turn when no `eot_token_id` is given.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts llama.cpp always treats as end-of-generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
];
/// gpt-oss markers llama.cpp always renders (forced to user-defined).
const ALWAYS_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Resolved special-token ids.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
}

/// A validated vocabulary.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub texts: Vec<String>,
    pub attrs: Vec<u16>,
    pub scores: Vec<f32>,
    /// Text → id; when two tokens share a text the later id wins, as in llama.cpp.
    pub text_to_id: FastMap<String, u32>,
    pub ids: SpecialIds,
    /// End-of-generation ids, sorted.
    pub eog: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    /// Control, user-defined and unknown tokens, longest text first (ties by id).
    pub special_cache: Vec<u32>,
}

impl Vocab {
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    pub fn id_of(&self, text: &str) -> Option<u32> {
        self.text_to_id.get(text).copied()
    }

    /// Builds and validates a vocabulary from `parts` (merges are handled by the BPE model).
    pub fn build(parts: &mut TokenizerParts, kind: ModelKind, defaults: Defaults) -> Result<Vocab, TokenizerError> {
        let n = parts.tokens.len();
        if n == 0 {
            return Err(TokenizerError::invalid("tokenizer.ggml.tokens", "the token list is empty"));
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::invalid("tokenizer.ggml.tokens", format!("{n} tokens is too many")));
        }
        let mut texts = Vec::with_capacity(n);
        let mut text_to_id = map_with_capacity(n);
        for (i, t) in std::mem::take(&mut parts.tokens).into_iter().enumerate() {
            // llama.cpp renames empty tokens so that every id keeps a distinct, non-empty text.
            let text = if t.is_empty() { format!("[EMPTY_{i}]") } else { t };
            text_to_id.insert(text.clone(), i as u32);
            texts.push(text);
        }

        let mut attrs = vec![attr::NORMAL; n];
        if let Some(types) = &parts.token_types {
            check_len("tokenizer.ggml.token_type", types.len(), n)?;
            for (a, &t) in attrs.iter_mut().zip(types) {
                *a = TokenType::from_gguf(t).attr();
            }
        }
        let scores = match &mut parts.scores {
            Some(s) => {
                check_len("tokenizer.ggml.scores", s.len(), n)?;
                std::mem::take(s)
            }
            None => vec![0.0; n],
        };

        let ids = resolve_ids(&parts.special, kind, n)?;
        let mut vocab = Vocab {
            texts,
            attrs,
            scores,
            text_to_id,
            ids,
            eog: Vec::new(),
            add_bos: parts.add_bos.unwrap_or(defaults.add_bos),
            add_eos: parts.add_eos.unwrap_or(false),
            add_space_prefix: parts.add_space_prefix.unwrap_or(defaults.add_space_prefix),
            special_cache: Vec::new(),
        };
        vocab.detect_special(&parts.special);
        vocab.build_special_cache();
        if let Some(name) = &parts.model_name {
            vocab.apply_name_quirks(name);
        }
        Ok(vocab)
    }

    /// The token of the first text in `texts` that the vocabulary has.
    ///
    /// llama.cpp takes whichever candidate its hash map yields first, so when a vocabulary has
    /// several (`<|im_end|>` and `<|endoftext|>`) its pick is arbitrary; the lists are ordered so
    /// that the end-of-turn marker wins. All candidates end generation either way.
    fn find_text(&self, texts: &[&str]) -> Option<u32> {
        texts.iter().find_map(|t| self.id_of(t))
    }

    fn mark_control(&mut self, id: u32) {
        if let Some(a) = self.attrs.get_mut(id as usize) {
            *a |= attr::CONTROL;
        }
    }

    /// Text-based detection of end-of-turn, fill-in-the-middle and end-of-generation tokens.
    fn detect_special(&mut self, given: &SpecialTokenIds) {
        let detect = |given: Option<u32>, texts: &[&str], v: &mut Vocab| -> Option<u32> {
            if given.is_some() {
                return given;
            }
            let found = v.find_text(texts);
            if let Some(id) = found {
                v.mark_control(id);
            }
            found
        };
        let eot = detect(self.ids.eot, EOT_TEXTS, self);
        let eom = detect(self.ids.eom, EOM_TEXTS, self);
        let in_range = |id: Option<u32>, n: usize| id.filter(|&i| (i as usize) < n);
        let n = self.len();
        for (id, texts) in [
            (given.fim_pre, FIM_PRE_TEXTS),
            (given.fim_suf, FIM_SUF_TEXTS),
            (given.fim_mid, FIM_MID_TEXTS),
        ] {
            detect(in_range(id, n), texts, self);
        }
        let fim_pad = detect(in_range(given.fim_pad, n), FIM_PAD_TEXTS, self);
        let fim_rep = detect(in_range(given.fim_rep, n), FIM_REP_TEXTS, self);
        let fim_sep = detect(in_range(given.fim_sep, n), FIM_SEP_TEXTS, self);
        self.ids.eot = eot;
        self.ids.eom = eom;

        let mut eog: Vec<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for text in EOG_TEXTS {
            if let Some(id) = self.id_of(text) {
                eog.push(id);
                self.mark_control(id);
            }
        }
        for text in ALWAYS_RENDERED {
            if let Some(id) = self.id_of(text) {
                self.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend([self.ids.eos, self.ids.eot, self.ids.eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();

        // gpt-oss and solar-open end a message with "<|end|>" but keep generating after it.
        let has = |t: &str| eog.iter().any(|&id| self.texts[id as usize] == t);
        if has("<|end|>") && ((has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>"))) {
            if let Some(pos) = eog.iter().position(|&id| self.texts[id as usize] == "<|end|>") {
                let id = eog.remove(pos);
                self.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        // Gemma 4 and PLaMo use "</s>" as ordinary text.
        let has = |t: &str| eog.iter().any(|&id| self.texts[id as usize] == t);
        if (has("<|tool_response>") || has("<|plamo:eos|>")) && has("</s>") {
            if let Some(pos) = eog.iter().position(|&id| self.texts[id as usize] == "</s>") {
                let id = eog.remove(pos);
                self.attrs[id as usize] = attr::NORMAL;
            }
        }
        self.eog = eog;
    }

    fn build_special_cache(&mut self) {
        let mask = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
        let mut cache: Vec<u32> = (0..self.len() as u32).filter(|&i| self.attrs[i as usize] & mask != 0).collect();
        cache.sort_by(|&a, &b| self.texts[b as usize].len().cmp(&self.texts[a as usize].len()).then(a.cmp(&b)));
        self.special_cache = cache;
    }

    /// llama.cpp strips whitespace after Phi-3's special tokens, recognising the model by name.
    fn apply_name_quirks(&mut self, name: &str) {
        let name = name.to_ascii_lowercase();
        if !(name.contains("phi-3") || name.contains("phi3")) {
            return;
        }
        for &id in &self.special_cache {
            self.attrs[id as usize] |= attr::RSTRIP;
        }
        if let Some(id) = self.id_of("</s>") {
            self.attrs[id as usize] |= attr::RSTRIP;
        }
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            if let Some(id) = self.id_of(t) {
                self.attrs[id as usize] &= !attr::RSTRIP;
            }
        }
    }
}

fn check_len(key: &'static str, got: usize, want: usize) -> Result<(), TokenizerError> {
    if got == want {
        Ok(())
    } else {
        Err(TokenizerError::invalid(key, format!("has {got} entries but tokenizer.ggml.tokens has {want}")))
    }
}

/// llama.cpp's default ids per family, replaced by metadata values; out-of-range metadata is an error.
fn resolve_ids(given: &SpecialTokenIds, kind: ModelKind, n: usize) -> Result<SpecialIds, TokenizerError> {
    let (bos, eos, unk) = match kind {
        ModelKind::Spm => (Some(1), Some(2), Some(0)),
        ModelKind::Bpe => (Some(11), Some(11), None),
    };
    // A default that does not exist in this vocabulary is dropped.
    let default = |d: Option<u32>| d.filter(|&i| (i as usize) < n);
    let pick = |key: &'static str, v: Option<u32>, d: Option<u32>| -> Result<Option<u32>, TokenizerError> {
        match v {
            Some(id) if (id as usize) >= n => Err(TokenizerError::invalid(
                key,
                format!("token id {id} is out of range (vocabulary has {n} tokens)"),
            )),
            Some(id) => Ok(Some(id)),
            None => Ok(default(d)),
        }
    };
    Ok(SpecialIds {
        bos: pick("tokenizer.ggml.bos_token_id", given.bos, bos)?,
        eos: pick("tokenizer.ggml.eos_token_id", given.eos, eos)?,
        eot: pick("tokenizer.ggml.eot_token_id", given.eot, None)?,
        eom: pick("tokenizer.ggml.eom_token_id", given.eom, None)?,
        unk: pick("tokenizer.ggml.unknown_token_id", given.unk, unk)?,
        sep: pick("tokenizer.ggml.seperator_token_id", given.sep, None)?,
        pad: pick("tokenizer.ggml.padding_token_id", given.pad, None)?,
    })
}
