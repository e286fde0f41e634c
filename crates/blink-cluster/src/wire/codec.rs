//! Little-endian encoding of a frame's payload: a writer that appends and a reader that
//! refuses to read past its end, so a truncated or lying frame is an error, never a panic
//! or a huge allocation.

use super::WireError;

/// Appends values to a payload.
#[derive(Default)]
pub struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn f32(&mut self, v: f32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A count (u32) and then the values as f16 (rounded to nearest; exact for values
    /// that are f16's).
    pub fn f16s(&mut self, v: &[f32]) {
        self.u32(v.len() as u32);
        self.buf.reserve(v.len() * 2);
        for &x in v {
            self.buf.extend_from_slice(&half::f16::from_f32(x).to_bits().to_le_bytes());
        }
    }

    pub fn bytes32(&mut self, v: &[u8; 32]) {
        self.buf.extend_from_slice(v);
    }

    /// A length (u32) and then the UTF-8 bytes.
    pub fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.buf.extend_from_slice(s.as_bytes());
    }

    /// A count (u32) and then the values.
    pub fn f32s(&mut self, v: &[f32]) {
        self.u32(v.len() as u32);
        self.buf.reserve(v.len() * 4);
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
    }
}

/// Reads values from a payload, refusing to run past its end.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or(WireError::Truncated(what))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().expect("two bytes")))
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("four bytes")))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("eight bytes")))
    }

    pub fn f32(&mut self, what: &'static str) -> Result<f32, WireError> {
        Ok(f32::from_bits(self.u32(what)?))
    }

    /// Values written by [`Writer::f16s`], widened to f32.
    pub fn f16s(&mut self, what: &'static str) -> Result<Vec<f32>, WireError> {
        let n = self.count(2, what)?;
        let s = self.take(n * 2, what)?;
        Ok(s.chunks_exact(2).map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect())
    }

    pub fn bytes32(&mut self, what: &'static str) -> Result<[u8; 32], WireError> {
        Ok(self.take(32, what)?.try_into().expect("32 bytes"))
    }

    /// A count, checked against the bytes left for `elem` bytes per element before any
    /// allocation is made for it.
    pub fn count(&mut self, elem: usize, what: &'static str) -> Result<usize, WireError> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(elem) > self.bytes.len() - self.at {
            return Err(WireError::Truncated(what));
        }
        Ok(n)
    }

    pub fn str(&mut self, what: &'static str) -> Result<String, WireError> {
        let n = self.count(1, what)?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| WireError::Invalid(format!("{what} is not UTF-8")))
    }

    /// Values appended to `out` (cleared first), reusing its memory.
    pub fn f32s_into(&mut self, out: &mut Vec<f32>, what: &'static str) -> Result<(), WireError> {
        let n = self.count(4, what)?;
        let s = self.take(n * 4, what)?;
        out.clear();
        out.extend(s.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("four bytes"))));
        Ok(())
    }

    /// The payload is used up; bytes left over mean the frame is not what it claims.
    pub fn finish(&self, what: &'static str) -> Result<(), WireError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(WireError::Invalid(format!("{} bytes left over after {what}", self.bytes.len() - self.at)))
        }
    }
}
