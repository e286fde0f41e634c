//! Loading a model file for a front end: the model, its tokenizer and chat template, and
//! what the user should be told about them.
//!
//! The CLI's commands and the server load through here. Warnings are values: the CLI prints
//! them on stderr, the server in its log.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blink_gguf::{GgufError, GgufFile};
use blink_model::{Model, ModelError, Share, TensorPlacement};
use blink_text::{ChatTemplate, TemplateError, Tokenizer, TokenizerError};
use thiserror::Error;

/// A model file, loaded.
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
    /// The model's chat template (ChatML when it does not compile); `None` when the model
    /// has none.
    pub template: Option<ChatTemplate>,
    /// What the user should be told, one line each, without a "warning" prefix.
    pub warnings: Vec<String>,
}

/// Why a model file could not be loaded. The message names the file.
#[derive(Debug, Error)]
#[error("{}: {reason}", path.display())]
pub struct LoadError {
    pub path: PathBuf,
    pub reason: LoadFailure,
}

/// What went wrong in a model file.
#[derive(Debug, Error)]
pub enum LoadFailure {
    #[error(transparent)]
    File(#[from] GgufError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] TemplateError),
}

impl Loaded {
    /// Open and validate the GGUF file at `path`, then load the model for `placement`, its
    /// tokenizer and its chat template (the kernel path must already be fixed).
    pub fn load(path: &Path, placement: &TensorPlacement) -> Result<Loaded, LoadError> {
        Self::load_share(path, placement, Share::all())
    }

    /// As [`Loaded::load`], holding only the layers `share` names (a ring's head).
    pub fn load_share(path: &Path, placement: &TensorPlacement, share: Share) -> Result<Loaded, LoadError> {
        Self::load_parts(path, placement, share).map_err(|reason| LoadError { path: path.to_owned(), reason })
    }

    fn load_parts(path: &Path, placement: &TensorPlacement, share: Share) -> Result<Loaded, LoadFailure> {
        let file = Arc::new(GgufFile::open(path)?);
        // The architecture first: it is the most basic thing a file can get wrong.
        let model = Model::from_gguf_share(file.clone(), placement, share)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let (template, warning) = ChatTemplate::from_gguf_or_chatml(&file)?;
        let warnings = warning.into_iter().map(|w| format!("{}: {w}", path.display())).collect();
        Ok(Loaded { model, tokenizer, template, warnings })
    }

    /// Give a model without a chat template ChatML to chat in, as llama.cpp's server and
    /// llama-cli do; returns the warning to give then (the caller says about which file).
    pub fn chatml_if_missing(&mut self) -> Option<&'static str> {
        if self.template.is_some() {
            return None;
        }
        self.template = Some(ChatTemplate::chatml());
        Some(ChatTemplate::MISSING)
    }
}
