//! Why training data was refused: errors that name the offending line of the JSONL file.
//!
//! Every bad line is collected before a run refuses to start, so one attempt shows all of
//! them (the listing is capped at [`MAX_LISTED`] lines, with a count of the rest).

use std::fmt;
use std::path::PathBuf;

/// Most bad lines an error message lists; the rest are counted.
pub const MAX_LISTED: usize = 20;

/// One bad line: its 1-based number in the file and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    pub line: usize,
    pub reason: String,
}

impl LineError {
    pub fn new(line: usize, reason: impl Into<String>) -> LineError {
        LineError { line, reason: reason.into() }
    }
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

/// The bad lines of one file, in line order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineErrors(pub Vec<LineError>);

impl LineErrors {
    /// Whether some error names `line`.
    pub fn names_line(&self, line: usize) -> bool {
        self.0.iter().any(|e| e.line == line)
    }
}

impl fmt::Display for LineErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} bad line{}:", if n == 1 { "" } else { "s" })?;
        for e in self.0.iter().take(MAX_LISTED) {
            write!(f, "\n  {e}")?;
        }
        if n > MAX_LISTED {
            write!(f, "\n  ... and {} more", n - MAX_LISTED)?;
        }
        Ok(())
    }
}

/// Why training data could not be read, tokenized or packed.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("reading {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file holds no examples at all.
    #[error("the training data holds no examples")]
    Empty,
    /// Lines that do not parse, validate or tokenize (the run must not start).
    #[error("the training data was refused: {0}")]
    BadLines(LineErrors),
    /// Packing was asked for batches that can hold nothing.
    #[error("a batch must hold at least one token and one example")]
    ZeroBatch,
    /// An epoch order names an example that does not exist.
    #[error("the epoch order names example {index}, but there are {len} examples")]
    BadOrder { index: usize, len: usize },
    /// The tokenizer has no end-of-turn token to close an assistant's reply with.
    #[error("the tokenizer has no end-of-turn or end-of-sequence token to end a reply with")]
    NoEndOfTurn,
}

impl DataError {
    /// The bad lines, if this error is about lines.
    pub fn line_errors(&self) -> Option<&LineErrors> {
        match self {
            DataError::BadLines(lines) => Some(lines),
            _ => None,
        }
    }
}

/// `Ok(())` if `errors` is empty, else the error listing them (sorted by line).
pub(crate) fn refuse_lines(mut errors: Vec<LineError>) -> Result<(), DataError> {
    if errors.is_empty() {
        return Ok(());
    }
    errors.sort_by_key(|e| e.line);
    Err(DataError::BadLines(LineErrors(errors)))
}
