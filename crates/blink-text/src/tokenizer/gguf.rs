//! Reading tokenizer metadata (`tokenizer.ggml.*`) from a GGUF file.

use blink_gguf::{Array, GgufFile};

use super::vocab::{ModelKind, SpecialTokenIds, TokenizerParts};
use super::{pretokenize, TokenizerError};

fn strings(file: &GgufFile, key: &'static str) -> Result<Option<Vec<String>>, TokenizerError> {
    match file.opt_array(key)? {
        None => Ok(None),
        Some(a) => match a.as_strings() {
            Some(s) => Ok(Some(s.to_vec())),
            None => Err(wrong_array(key, "strings", a)),
        },
    }
}

fn wrong_array(key: &'static str, want: &str, a: &Array) -> TokenizerError {
    TokenizerError::invalid(key, format!("expected an array of {want}, found an array of {}", a.type_name()))
}

/// Reads every tokenizer part of `file`.
pub(crate) fn read_parts(file: &GgufFile) -> Result<TokenizerParts, TokenizerError> {
    let model = file.opt_str("tokenizer.ggml.model")?.ok_or(TokenizerError::Missing("tokenizer.ggml.model"))?;
    let kind = ModelKind::parse(model)?;
    let pre = file.opt_str("tokenizer.ggml.pre")?.map(str::to_owned);
    if kind == ModelKind::Bpe {
        // Refuse an unsupported pre-tokenizer before reading the large arrays.
        pretokenize::config_for(pre.as_deref())?;
    }
    let tokens = strings(file, "tokenizer.ggml.tokens")?.ok_or(TokenizerError::Missing("tokenizer.ggml.tokens"))?;
    let token_types = match file.opt_array("tokenizer.ggml.token_type")? {
        None => None,
        Some(a) => Some(a.as_i32().ok_or_else(|| wrong_array("tokenizer.ggml.token_type", "i32", a))?.to_vec()),
    };
    let scores = match file.opt_array("tokenizer.ggml.scores")? {
        None => None,
        Some(Array::F32(v)) => Some(v.clone()),
        Some(Array::I32(v)) => Some(v.iter().map(|&x| x as f32).collect()),
        Some(a) => return Err(wrong_array("tokenizer.ggml.scores", "f32", a)),
    };
    let merges = match kind {
        ModelKind::Bpe => strings(file, "tokenizer.ggml.merges")?,
        ModelKind::Spm => None,
    };
    let id = |key: &str| file.opt_u32(key);
    let special = SpecialTokenIds {
        bos: id("tokenizer.ggml.bos_token_id")?,
        eos: id("tokenizer.ggml.eos_token_id")?,
        eot: id("tokenizer.ggml.eot_token_id")?,
        eom: id("tokenizer.ggml.eom_token_id")?,
        unk: id("tokenizer.ggml.unknown_token_id")?,
        sep: id("tokenizer.ggml.seperator_token_id")?,
        pad: id("tokenizer.ggml.padding_token_id")?,
        fim_pre: id("tokenizer.ggml.fim_pre_token_id")?.or(id("tokenizer.ggml.prefix_token_id")?),
        fim_suf: id("tokenizer.ggml.fim_suf_token_id")?.or(id("tokenizer.ggml.suffix_token_id")?),
        fim_mid: id("tokenizer.ggml.fim_mid_token_id")?.or(id("tokenizer.ggml.middle_token_id")?),
        fim_pad: id("tokenizer.ggml.fim_pad_token_id")?,
        fim_rep: id("tokenizer.ggml.fim_rep_token_id")?,
        fim_sep: id("tokenizer.ggml.fim_sep_token_id")?,
    };
    Ok(TokenizerParts {
        model: model.to_owned(),
        pre,
        tokens,
        token_types,
        scores,
        merges,
        special,
        add_bos: file.opt_bool("tokenizer.ggml.add_bos_token")?,
        add_eos: file.opt_bool("tokenizer.ggml.add_eos_token")?,
        add_space_prefix: file.opt_bool("tokenizer.ggml.add_space_prefix")?,
        // Only used to recognise models llama.cpp special-cases; a non-string name is ignored.
        model_name: file.opt_str("general.name").ok().flatten().map(str::to_owned),
    })
}

/// The BOS/EOS texts and flags a chat template needs, without building the whole tokenizer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TemplateTokens {
    pub bos: String,
    pub eos: String,
    pub add_bos: bool,
    pub add_eos: bool,
}

/// Resolves BOS/EOS like [`Tokenizer::from_gguf`](super::Tokenizer::from_gguf) (same defaults).
///
/// Lenient about the tokenizer itself: with an unknown model or pre-tokenizer only the metadata's
/// own values are used, since a template can be rendered whatever the tokenizer.
pub(crate) fn template_tokens(file: &GgufFile) -> Result<TemplateTokens, TokenizerError> {
    let model = file.opt_str("tokenizer.ggml.model")?.map(ModelKind::parse);
    let (default_bos, default_eos, default_add_bos) = match model {
        Some(Ok(ModelKind::Spm)) => (Some(1), Some(2), true),
        Some(Ok(ModelKind::Bpe)) => {
            let pre = pretokenize::config_for(file.opt_str("tokenizer.ggml.pre")?);
            (Some(11), Some(11), pre.map(|c| c.add_bos).unwrap_or(false))
        }
        _ => (None, None, false),
    };
    let tokens = match file.opt_array("tokenizer.ggml.tokens")? {
        Some(a) => a.as_strings().ok_or_else(|| wrong_array("tokenizer.ggml.tokens", "strings", a))?,
        None => &[],
    };
    let text = |key: &str, default: Option<u32>| -> Result<String, TokenizerError> {
        let id = file.opt_u32(key)?.or(default);
        Ok(id.and_then(|id| tokens.get(id as usize)).cloned().unwrap_or_default())
    };
    Ok(TemplateTokens {
        bos: text("tokenizer.ggml.bos_token_id", default_bos)?,
        eos: text("tokenizer.ggml.eos_token_id", default_eos)?,
        add_bos: file.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos),
        add_eos: file.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
    })
}
