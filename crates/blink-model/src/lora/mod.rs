//! LoRA adapters: reading and writing them (PEFT directories and llama.cpp GGUF files),
//! checking them against the base model, and placing them on the model's parts for the
//! forward pass.
//!
//! An adapter changes a projection `y = W·x` into `y = W·x + scale · B·(A·x)`. The base
//! product is untouched; the pass adds each row's delta after it (see
//! `forward::pass::project`). Under tensor parallelism every part holds `A` whole and the
//! rows of `B` that match its rows of `W`, so no new exchange between parts is needed.

mod error;
mod format;
mod mix;
mod placed;
mod random;
mod target;
mod tensors;

pub use error::LoraError;
pub use format::{peft_tensors, read, write_gguf, write_peft, write_peft_tensors, PeftMeta, PeftTensor};
pub use mix::LoraMix;
pub use placed::{LoraAdapter, PlacedPair};
pub use target::LoraTarget;
pub use tensors::{LoraFormat, LoraPair, LoraTensors};
