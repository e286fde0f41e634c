//! Errors raised while building a [`Tokenizer`](super::Tokenizer) from GGUF metadata or plain parts.
//!
//! Encoding and decoding never fail; only construction does, and every error names the metadata key
//! (or part) at fault.

/// Why a tokenizer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names a tokenizer family Blink does not implement.
    #[error(
        "unsupported tokenizer model {0:?} (tokenizer.ggml.model): Blink supports \"gpt2\" \
         (byte-level BPE) and \"llama\" (SentencePiece)"
    )]
    UnsupportedModel(String),

    /// `tokenizer.ggml.pre` names a pre-tokenizer Blink does not implement.
    #[error(
        "unsupported pre-tokenizer {0:?} (tokenizer.ggml.pre): Blink supports {supported}",
        supported = super::pretokenize::SUPPORTED_PRE.join(", ")
    )]
    UnsupportedPre(String),

    /// A required metadata key or part is absent.
    #[error("missing {0}")]
    Missing(&'static str),

    /// A metadata value or part is present but malformed.
    #[error("invalid {key}: {problem}")]
    Invalid { key: &'static str, problem: String },

    /// The GGUF reader refused a value (wrong type, ...).
    #[error(transparent)]
    Gguf(#[from] blink_gguf::GgufError),
}

impl TokenizerError {
    pub(crate) fn invalid(key: &'static str, problem: impl Into<String>) -> Self {
        TokenizerError::Invalid { key, problem: problem.into() }
    }
}
