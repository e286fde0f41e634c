//! The ring's wire format: what travels between the head and the nodes, and how.
//!
//! A frame is a 12-byte header and a payload:
//!
//! ```text
//! magic "BLRG" | version u16 | kind u8 | flags u8 (0) | payload length u32 | payload
//! ```
//!
//! all little-endian. A frame of another version, an unknown kind, a payload longer than
//! [`MAX_PAYLOAD`] or than its reader's own bound, or a payload that does not decode to
//! exactly its kind's fields is refused with a [`WireError`] naming what was wrong; the
//! connection it came on is then closed. Nothing in a frame is trusted before it is
//! decoded: counts are checked against the bytes present before anything is allocated.

mod codec;
mod message;
mod pool;

pub use codec::{Reader, Writer};
pub use message::{AdapterLayer, Assign, CacheOp, Message, MixPart, Role, StepFrame, WireRow};
pub use pool::FramePool;

use thiserror::Error;

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"BLRG";
/// The version of the format this build speaks; a peer of another is refused.
pub const VERSION: u16 = 3;
/// Bytes in a frame's header.
pub const HEADER: usize = 12;
/// The largest payload any frame may have (a step of 4,096 rows of a model 4,096 wide
/// with room to spare); a connection may bound its frames lower.
pub const MAX_PAYLOAD: usize = 256 << 20;

/// Why bytes are not a frame.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("not a Blink ring frame (magic {0:02x?})")]
    Magic([u8; 4]),
    #[error("frame version {got}, but this build speaks version {VERSION}")]
    Version { got: u16 },
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("frame of {len} bytes exceeds the bound of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("frame ends inside its {0}")]
    Truncated(&'static str),
    #[error("bad frame: {0}")]
    Invalid(String),
}

/// A frame's header, checked: its kind and the length of the payload that follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    pub len: usize,
}

impl Header {
    /// Check a header, bounding its payload by `max` (at most [`MAX_PAYLOAD`]).
    pub fn parse(bytes: &[u8; HEADER], max: usize) -> Result<Header, WireError> {
        let magic: [u8; 4] = bytes[0..4].try_into().expect("four bytes");
        if magic != MAGIC {
            return Err(WireError::Magic(magic));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != VERSION {
            return Err(WireError::Version { got: version });
        }
        let kind = bytes[6];
        if !message::known_kind(kind) {
            return Err(WireError::Kind(kind));
        }
        if bytes[7] != 0 {
            return Err(WireError::Invalid(format!("flags {:#04x}, where this version has none", bytes[7])));
        }
        let len = u32::from_le_bytes(bytes[8..12].try_into().expect("four bytes")) as usize;
        let max = max.min(MAX_PAYLOAD);
        if len > max {
            return Err(WireError::TooLarge { len, max });
        }
        Ok(Header { kind, len })
    }
}

/// `msg` as one frame, header and payload, appended to `out` (cleared first).
pub fn encode(msg: &Message, out: &mut Vec<u8>) {
    out.clear();
    let mut w = Writer { buf: std::mem::take(out) };
    w.buf.extend_from_slice(&MAGIC);
    w.u16(VERSION);
    w.u8(msg.kind());
    w.u8(0);
    w.u32(0);
    msg.write(&mut w);
    let len = (w.buf.len() - HEADER) as u32;
    w.buf[8..12].copy_from_slice(&len.to_le_bytes());
    *out = w.buf;
}

/// The message of a frame whose header was `header` and payload `payload`; a step is
/// decoded into a frame from `pool`, reusing its buffers.
pub fn decode(header: Header, payload: &[u8], pool: &FramePool) -> Result<Message, WireError> {
    if payload.len() != header.len {
        return Err(WireError::Truncated("payload"));
    }
    Message::read(header.kind, payload, pool)
}

#[cfg(test)]
mod tests;
