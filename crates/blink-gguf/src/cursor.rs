//! A bounds-checked little-endian reader over a byte slice.
//!
//! Every read names what it is reading through a lazily-built description, so a short read
//! becomes a precise [`GgufError::Truncated`] without formatting anything on the happy path.

use crate::error::GgufError;

/// Describes the field being read; called only when building an error.
pub(crate) type What<'w> = &'w dyn Fn() -> String;

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Current offset from the start of the buffer.
    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left after the current offset.
    pub(crate) fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Takes the next `n` bytes, or fails naming `what` if fewer are left.
    pub(crate) fn take(&mut self, n: u64, what: What) -> Result<&'a [u8], GgufError> {
        let left = self.remaining();
        if n > left {
            return Err(GgufError::Truncated {
                what: what(),
                needed: n,
                offset: self.pos(),
                left,
            });
        }
        // `n <= left <= usize::MAX`, so the cast and the slice are in range.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: What) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: What) -> Result<u16, GgufError> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self, what: What) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: What) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }
}

/// Decodes a slice of whole little-endian `N`-byte values (trailing partial chunks ignored;
/// callers pass exact multiples).
pub(crate) fn decode_le<T, const N: usize>(bytes: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|chunk| {
            let mut a = [0u8; N];
            a.copy_from_slice(chunk);
            f(a)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_reports_short_reads() {
        let mut c = Cursor::new(&[1, 0, 2, 0, 0, 0, 9]);
        assert_eq!(c.u16(&|| "a".into()).unwrap(), 1);
        assert_eq!(c.u32(&|| "b".into()).unwrap(), 2);
        let err = c.u64(&|| "field c".into()).unwrap_err().to_string();
        assert_eq!(
            err,
            "truncated file: field c needs 8 bytes at offset 6, only 1 left"
        );
        assert_eq!(c.u8(&|| "d".into()).unwrap(), 9);
        assert_eq!(c.remaining(), 0);
    }

    #[test]
    fn decodes_arrays() {
        assert_eq!(
            decode_le(&[1, 0, 0, 0, 255, 255, 255, 255], i32::from_le_bytes),
            vec![1, -1]
        );
    }
}
