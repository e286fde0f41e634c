//! GGUF model files.
//!
//! Owns the file format only: reading (validated, zero-copy over a memory map) and writing.
//! It knows nothing of models, kernels or tokenizers.
//!
//! [`GgufFile::open`] checks the whole file up front — header, every metadata value, the
//! tensor table and every tensor's byte range — so a `GgufFile` that exists is valid, and
//! [`GgufFile::tensor_data`] cannot fail. [`GgufWriter`] produces GGUF v3 files.

mod cursor;
mod error;
mod file;
mod parse;
mod tensor;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use file::GgufFile;
pub use tensor::TensorInfo;
pub use types::{GgmlType, QK_K};
pub use value::{Array, Value};
pub use writer::GgufWriter;

/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Longest string value accepted, in bytes.
pub const MAX_STRING_LEN: u64 = 64 << 20;
/// Longest metadata key accepted, in bytes.
pub const MAX_KEY_LEN: u64 = 64 << 10;
/// Longest tensor name accepted, in bytes.
pub const MAX_NAME_LEN: u64 = 64 << 10;
/// Deepest array nesting accepted (1 = an array of scalars).
pub const MAX_ARRAY_DEPTH: usize = 4;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;
/// Most elements a tensor may have (2^50).
pub const MAX_ELEMENTS: u64 = 1 << 50;
