//! Training data: OpenAI chat fine-tuning JSONL read and validated (`jsonl`), tokenized with
//! the model's chat template into examples with loss masks (`tokenize`), ordered per epoch by
//! a seeded shuffle (`shuffle`) and packed into batches of whole examples (`pack`).

mod error;
mod jsonl;
mod pack;
mod shuffle;
mod tokenize;

use std::path::Path;

use blink_text::{ChatTemplate, Tokenizer};

pub use error::{DataError, LineError, LineErrors, MAX_LISTED};
pub use jsonl::{parse_jsonl, read_jsonl, Conversation, Role, TrainMessage};
pub use pack::{pack, pack_epoch, Batch};
pub use shuffle::{epoch_order, shuffle, SplitMix64};
pub use tokenize::{ChatEncoder, Example};

/// Reads, validates and tokenizes the JSONL file at `path`: every bad line, whether it fails
/// to parse or to tokenize, is listed in the error.
pub fn load_examples(path: impl AsRef<Path>, tokenizer: &Tokenizer, template: &ChatTemplate) -> Result<Vec<Example>, DataError> {
    let conversations = read_jsonl(path)?;
    ChatEncoder::new(tokenizer, template)?.encode_all(&conversations)
}
