//! The crate's error type.
//!
//! Every message is a single line that names the problem and where it is (metadata key,
//! tensor, byte offset). Names taken from a file are quoted with control characters
//! escaped and long names shortened, so a hostile file cannot break the one-line rule.

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong reading, querying or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// An I/O operation on `path` failed.
    #[error("cannot {action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The file ends before a field that must be there.
    #[error("truncated file: {what} needs {needed} bytes at offset {offset}, only {left} left")]
    Truncated {
        what: String,
        needed: u64,
        offset: u64,
        left: u64,
    },

    /// The first four bytes are not `GGUF`.
    #[error("bad magic: expected \"GGUF\", found \"{found}\" (not a GGUF file)")]
    BadMagic { found: String },

    /// The version field is not 2 or 3.
    #[error("unsupported GGUF version {version}{}", version_hint(*.version))]
    UnsupportedVersion { version: u32 },

    /// A count (of tensors, metadata entries or array elements) cannot fit in the bytes left.
    #[error(
        "{what} at offset {offset} claims {count} entries of at least {min_each} bytes each, \
         but only {left} bytes remain"
    )]
    CountTooLarge {
        what: String,
        count: u64,
        min_each: u64,
        offset: u64,
        left: u64,
    },

    /// A string's declared length exceeds the reader's limit.
    #[error("{what} at offset {offset}: string length {len} exceeds the limit of {limit} bytes")]
    StringTooLong {
        what: String,
        offset: u64,
        len: u64,
        limit: u64,
    },

    /// A key, tensor name or string value is not valid UTF-8.
    #[error(
        "{what} at offset {offset} is not valid UTF-8 (bad byte at position {position} of {len})"
    )]
    InvalidUtf8 {
        what: String,
        offset: u64,
        position: usize,
        len: u64,
    },

    /// A key or tensor name is the empty string.
    #[error("{what} at offset {offset} is empty")]
    EmptyName { what: String, offset: u64 },

    /// A metadata value type id is not one GGUF defines.
    #[error("{what} at offset {offset}: unknown value type id {id}")]
    UnknownValueType { what: String, offset: u64, id: u32 },

    /// A bool is stored as a byte other than 0 or 1.
    #[error("{what} at offset {offset}: bool must be 0 or 1, found {byte}")]
    BadBool { what: String, offset: u64, byte: u8 },

    /// Arrays are nested deeper than the reader allows.
    #[error("{what} at offset {offset}: arrays nested more than {limit} levels deep")]
    ArrayTooDeep {
        what: String,
        offset: u64,
        limit: usize,
    },

    /// The same metadata key appears twice.
    #[error("duplicate metadata key {} (entries #{first} and #{second})", Quoted(.key))]
    DuplicateKey {
        key: String,
        first: usize,
        second: usize,
    },

    /// `general.alignment` is of the wrong type or not a nonzero power of two.
    #[error("bad general.alignment: {problem}")]
    BadAlignment { problem: String },

    /// A tensor declares a ggml type id that is unknown or unsupported.
    #[error("unsupported tensor type {} for tensor {}", crate::types::describe_unsupported(*.id), Quoted(.name))]
    UnsupportedTensorType { name: String, id: u32 },

    /// A tensor's shape, offset or extent is invalid.
    #[error("tensor {}: {problem}", Quoted(.name))]
    BadTensor { name: String, problem: String },

    /// Two tensors share a name.
    #[error("duplicate tensor name {} (tensors #{first} and #{second})", Quoted(.name))]
    DuplicateTensor {
        name: String,
        first: usize,
        second: usize,
    },

    /// Two tensors' byte ranges in the data section intersect.
    #[error(
        "tensors {} (data bytes {first_start}..{first_end}) and {} \
         (data bytes {second_start}..{second_end}) overlap",
        Quoted(.first), Quoted(.second)
    )]
    TensorOverlap {
        first: String,
        first_start: u64,
        first_end: u64,
        second: String,
        second_start: u64,
        second_end: u64,
    },

    /// A typed getter asked for a key the file does not have.
    #[error("missing metadata key {}", Quoted(.0))]
    MissingKey(String),

    /// A typed getter found the key, but with a value it cannot convert.
    #[error("metadata key {}: expected {expected}, found {found}", Quoted(.key))]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },

    /// The writer was given something it cannot encode.
    #[error("cannot write {what}: {problem}")]
    Unwritable { what: String, problem: String },
}

fn version_hint(version: u32) -> &'static str {
    match version {
        1 => " (GGUF v1 is obsolete; re-convert the model with a current converter)",
        v if v != 0 && v & 0xFFFF == 0 => {
            " (the value looks byte-swapped: a big-endian file? only little-endian GGUF is supported)"
        }
        _ => " (supported versions: 2, 3)",
    }
}

/// Longest name shown in full in a message; longer ones are cut.
const MAX_SHOWN: usize = 96;

/// Displays a name from a file in single quotes, escaped and shortened to stay on one line.
pub(crate) struct Quoted<'a>(pub &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("'")?;
        for (shown, c) in self.0.chars().enumerate() {
            if shown == MAX_SHOWN {
                let rest = self.0.chars().count() - shown;
                return write!(f, "…' (+{rest} chars)");
            }
            if c == '\'' {
                f.write_str("\\'")?;
            } else {
                write!(f, "{}", c.escape_debug())?;
            }
        }
        f.write_str("'")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_escapes_and_shortens() {
        assert_eq!(Quoted("a\nb'c").to_string(), "'a\\nb\\'c'");
        let long = "x".repeat(200);
        let shown = Quoted(&long).to_string();
        assert!(shown.ends_with("…' (+104 chars)"), "{shown}");
        assert!(!shown.contains('\n'));
    }

    #[test]
    fn version_messages() {
        let msg = |v| GgufError::UnsupportedVersion { version: v }.to_string();
        assert!(msg(1).contains("obsolete"));
        assert!(msg(0x0300_0000).contains("big-endian"));
        assert!(msg(4).contains("supported versions: 2, 3"));
    }
}
