//! Blink's text side: what turns text into token ids and token ids back into text.
//!
//! Owns the tokenizer (llama.cpp-compatible, read from GGUF metadata), the chat template,
//! stop strings, and the text stream that turns a generation's token ids into final text.
//! It touches no numerics, models or scheduling: it knows token ids and text, never logits,
//! weights or requests.

pub mod chat_template;
pub mod stop;
pub mod stream;
pub mod tokenizer;

pub use chat_template::{ChatMessage, ChatTemplate, TemplateError};
pub use stop::{StopMatcher, StopScan};
pub use stream::{Released, TextOffset, TextStream};
pub use tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
