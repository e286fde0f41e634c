//! Blink's fine-tuning side: what `blink finetune` needs besides the model's forward pass.
//!
//! Owns the training data (OpenAI chat JSONL → tokenized examples with loss masks → packed
//! batches, in a seeded order per epoch) and the optimizer (AdamW, gradient clipping, the
//! learning-rate schedule), and the checkpoints a run resumes from (`checkpoint`: adapter,
//! optimizer moments and position, in one file replaced atomically), and the state directory
//! of a server's fine-tuning jobs (`store`: uploaded files, next jobs). It reads text through
//! blink-text and model files through blink-gguf; it computes no forward or backward pass
//! itself.

pub mod checkpoint;
pub mod data;
pub mod jobs;
mod durable;
pub mod optim;
pub mod run;
pub mod store;
