//! Blink's engine: what turns a model into answers.
//!
//! Owns loading a model file with its tokenizer and chat template (`loader`), sampling,
//! single-conversation sessions (`run`, `chat`), the continuous-batching serving engine and
//! evaluation (perplexity). It drives `blink-model`'s forward pass and `blink-text`'s text
//! handling, and never touches kernels or file formats directly.

pub mod loader;
pub mod perplexity;
pub mod rng;
pub mod runner;
pub mod sampling;
pub mod serve;
pub mod session;

use blink_model::kv_cache::KvError;
use blink_model::ForwardError;
use thiserror::Error;

pub use loader::{LoadError, Loaded};
pub use sampling::{Sampler, SamplingParams, MAX_REPEAT_LAST_N};
pub use runner::{Runner, RunnerConfig, Steps};
pub use session::{FinishReason, GenerateParams, Generation, Session, SessionConfig};

/// Why a request could not be served. Messages are one line, fit for users.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {tokens} tokens but the context size is {n_ctx}; use a larger --ctx-size or a shorter prompt")]
    PromptTooLong { tokens: usize, n_ctx: usize },
    #[error("the context of {n_ctx} tokens is full")]
    ContextFull { n_ctx: usize },
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    BadToken { token: u32, vocab: usize },
    #[error("invalid parameter: {0}")]
    BadParams(String),
    /// A cache or buffer sized from the user's options could not be had.
    #[error("no memory for {what} of {tokens} tokens ({reason})")]
    NoMemory { what: &'static str, tokens: usize, reason: String },
    /// The compute threads could not be started.
    #[error(transparent)]
    Threads(blink_model::ModelError),
    /// The engine's own thread could not be started.
    #[error("could not start the engine thread: {0}")]
    Spawn(std::io::Error),
    #[error(transparent)]
    Forward(ForwardError),
    #[error(transparent)]
    Kv(#[from] KvError),
    /// Another device running part of the model (a ring's node) failed the step.
    #[error("{0}")]
    Remote(String),
    /// The devices' caches were emptied before the step ran (a ring joined afresh), and
    /// its sequences, all new, reused cached values that are gone: they start again.
    #[error("the devices' caches were emptied before the step ran")]
    CachesEmptied,
}

impl EngineError {
    /// Maps a failure to allocate `what` for `tokens` tokens (the KV cache, step buffers)
    /// to [`EngineError::NoMemory`].
    pub(crate) fn no_memory(what: &'static str, tokens: usize) -> impl FnOnce(blink_model::ModelError) -> EngineError {
        move |e| EngineError::NoMemory { what, tokens, reason: e.to_string() }
    }
}
