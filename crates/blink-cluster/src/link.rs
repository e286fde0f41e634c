//! Connections of the ring: TCP with `TCP_NODELAY`, framed as [`crate::wire`] says, each
//! opened by the handshake of [`crate::auth`].
//!
//! A connection is split into a [`FrameReader`] and a [`FrameWriter`] so that one task
//! reads while another writes. Every read is bounded (a frame larger than the
//! connection's bound is refused before its payload is read), and every step of the
//! handshake has a deadline, so a silent or hostile peer cannot hold a connection open.

use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::auth::{nonce, Token};
use crate::wire::{self, FramePool, Header, Message, Role, WireError, HEADER};

/// How long each step of a handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum LinkError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("the peer closed the connection")]
    Closed,
    #[error("refused by the peer: {0}")]
    Refused(String),
    #[error("the peer does not hold the ring's token")]
    BadProof,
    #[error("the peer sent {got} where {want} was expected")]
    Unexpected { got: &'static str, want: &'static str },
    #[error("the peer did not answer within {0:?}")]
    Timeout(Duration),
}

/// Reads frames from one connection.
pub struct FrameReader {
    half: OwnedReadHalf,
    max: usize,
    payload: Vec<u8>,
    /// Where steps are decoded: frames given back after they were sent.
    pool: FramePool,
}

/// A slow link, imitated where frames arrive (the machine has no netem): each frame is
/// delivered `latency` after the link has carried its bytes at `bytes_per_s`, frames
/// queueing behind each other for the bandwidth but not for the latency, as on a wire.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Shim {
    pub latency: Duration,
    /// `None`: as fast as the socket.
    pub bytes_per_s: Option<f64>,
}

impl Shim {
    pub fn is_none(&self) -> bool {
        self.latency.is_zero() && self.bytes_per_s.is_none()
    }

    /// A shim of `latency_ms` per hop and `mbps` megabits per second (0: unlimited).
    pub fn new(latency_ms: f64, mbps: f64) -> Result<Shim, String> {
        if !(latency_ms >= 0.0 && latency_ms.is_finite() && mbps >= 0.0 && mbps.is_finite()) {
            return Err(format!("a link shim needs a latency and a rate of at least 0, not {latency_ms} ms and {mbps} Mbit/s"));
        }
        Ok(Shim { latency: Duration::from_secs_f64(latency_ms / 1e3), bytes_per_s: (mbps > 0.0).then_some(mbps * 1e6 / 8.0) })
    }
}

/// Frames from a connection behind a [`Shim`]: a task reads them as they come and
/// stamps them, a thread of the connection's own holds each until the shim says it lands
/// (a thread's sleep is precise to tens of microseconds, a tokio timer only to the
/// millisecond), and [`ShimmedReader::read`] hands them out.
pub struct ShimmedReader {
    rx: tokio::sync::mpsc::UnboundedReceiver<Result<Message, LinkError>>,
}

impl ShimmedReader {
    pub async fn read(&mut self) -> Result<Message, LinkError> {
        self.rx.recv().await.unwrap_or(Err(LinkError::Closed))
    }
}

/// Writes frames to one connection.
pub struct FrameWriter {
    half: OwnedWriteHalf,
    buf: Vec<u8>,
}

impl FrameReader {
    /// The next message. A clean end of the stream between frames is `Closed`.
    pub async fn read(&mut self) -> Result<Message, LinkError> {
        let mut header = [0u8; HEADER];
        match self.half.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(LinkError::Closed),
            Err(e) => return Err(e.into()),
        }
        let h = Header::parse(&header, self.max)?;
        self.payload.resize(h.len, 0);
        self.half.read_exact(&mut self.payload).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => LinkError::Wire(WireError::Truncated("payload")),
            _ => e.into(),
        })?;
        Ok(wire::decode(h, &self.payload, &self.pool)?)
    }

    /// The next message within `limit`.
    pub async fn read_within(&mut self, limit: Duration) -> Result<Message, LinkError> {
        tokio::time::timeout(limit, self.read()).await.map_err(|_| LinkError::Timeout(limit))?
    }

    /// Frames larger than `max` bytes are refused from now on.
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// Steps are decoded into frames from `pool` from now on (by default, a pool of the
    /// connection's own).
    pub fn set_pool(&mut self, pool: FramePool) {
        self.pool = pool;
    }

    /// This connection's frames delayed by `shim` (read on the current tokio runtime).
    pub fn shimmed(mut self, shim: Shim) -> ShimmedReader {
        let (stamped, mut held) = tokio::sync::mpsc::unbounded_channel::<(Instant, Result<Message, LinkError>)>();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            // When the link finishes carrying the frames read so far.
            let mut carried = Instant::now();
            loop {
                let msg = self.read().await;
                let arrived = Instant::now();
                let bytes = HEADER + self.payload.len();
                carried = carried.max(arrived) + shim.bytes_per_s.map_or(Duration::ZERO, |r| Duration::from_secs_f64(bytes as f64 / r));
                let end = msg.is_err();
                if stamped.send((carried + shim.latency, msg)).is_err() || end {
                    return;
                }
            }
        });
        let spawned = std::thread::Builder::new().name("blink-link-shim".into()).spawn(move || {
            while let Some((due, msg)) = held.blocking_recv() {
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                if tx.send(msg).is_err() {
                    return;
                }
            }
        });
        if let Err(e) = spawned {
            // Without its thread the link cannot be imitated: the connection ends.
            eprintln!("blink: cannot start a link shim's thread: {e}");
        }
        ShimmedReader { rx }
    }
}

/// A connection's frames, read directly or through a shim.
pub enum Incoming {
    Direct(FrameReader),
    Shimmed(ShimmedReader),
}

impl Incoming {
    /// `reader`, behind `shim` unless it is none.
    pub fn new(reader: FrameReader, shim: Shim) -> Incoming {
        if shim.is_none() {
            Incoming::Direct(reader)
        } else {
            Incoming::Shimmed(reader.shimmed(shim))
        }
    }

    pub async fn read(&mut self) -> Result<Message, LinkError> {
        match self {
            Incoming::Direct(r) => r.read().await,
            Incoming::Shimmed(r) => r.read().await,
        }
    }
}

impl FrameWriter {
    pub async fn send(&mut self, msg: &Message) -> Result<(), LinkError> {
        wire::encode(msg, &mut self.buf);
        self.half.write_all(&self.buf).await?;
        Ok(())
    }

    /// Tell the peer why it is being refused, then close (best effort).
    pub async fn refuse(mut self, reason: &str) {
        let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.send(&Message::Refused { reason: reason.to_string() })).await;
        let _ = self.half.shutdown().await;
    }
}

fn split(stream: TcpStream, max: usize) -> Result<(FrameReader, FrameWriter), LinkError> {
    stream.set_nodelay(true)?;
    let (r, w) = stream.into_split();
    Ok((FrameReader { half: r, max, payload: Vec::new(), pool: FramePool::default() }, FrameWriter { half: w, buf: Vec::new() }))
}

/// Handshake frames are small; a stranger may not make a listener read more.
const HANDSHAKE_MAX: usize = 4096;

fn expect<T>(got: Message, want: &'static str, pick: impl FnOnce(Message) -> Option<T>) -> Result<T, LinkError> {
    let name = got.name();
    match got {
        Message::Refused { reason } => Err(LinkError::Refused(reason)),
        m => pick(m).ok_or(LinkError::Unexpected { got: name, want }),
    }
}

/// Connect to `addr` as `role` and prove the token; the listener must prove it too.
pub async fn connect(addr: &str, token: &Token, role: Role, max: usize) -> Result<(FrameReader, FrameWriter), LinkError> {
    let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr)).await.map_err(|_| LinkError::Timeout(HANDSHAKE_TIMEOUT))??;
    let (mut r, mut w) = split(stream, HANDSHAKE_MAX)?;
    let mine = nonce();
    w.send(&Message::Hello { role, nonce: mine }).await?;
    let got = r.read_within(HANDSHAKE_TIMEOUT).await?;
    let (theirs, proof) = expect(got, "challenge", |m| match m {
        Message::Challenge { nonce, proof } => Some((nonce, proof)),
        _ => None,
    })?;
    if !token.check_server(&mine, &theirs, &proof) {
        w.refuse("your proof of the ring token is wrong").await;
        return Err(LinkError::BadProof);
    }
    w.send(&Message::Proof { proof: token.client_proof(&mine, &theirs) }).await?;
    let got = r.read_within(HANDSHAKE_TIMEOUT).await?;
    expect(got, "ready", |m| matches!(m, Message::Ready).then_some(()))?;
    r.set_max(max);
    Ok((r, w))
}

/// Take a connection made to a listener: check the peer's proof of the token (refusing
/// it with a message if wrong) and return the halves and the role it claims.
pub async fn accept(stream: TcpStream, token: &Token, max: usize) -> Result<(FrameReader, FrameWriter, Role), LinkError> {
    let (mut r, mut w) = split(stream, HANDSHAKE_MAX)?;
    let got = r.read_within(HANDSHAKE_TIMEOUT).await?;
    let (role, theirs) = expect(got, "hello", |m| match m {
        Message::Hello { role, nonce } => Some((role, nonce)),
        _ => None,
    })?;
    let mine = nonce();
    w.send(&Message::Challenge { nonce: mine, proof: token.server_proof(&theirs, &mine) }).await?;
    let got = r.read_within(HANDSHAKE_TIMEOUT).await?;
    let proof = expect(got, "proof", |m| match m {
        Message::Proof { proof } => Some(proof),
        _ => None,
    })?;
    if !token.check_client(&theirs, &mine, &proof) {
        w.refuse("wrong ring token").await;
        return Err(LinkError::BadProof);
    }
    w.send(&Message::Ready).await?;
    r.set_max(max);
    Ok((r, w, role))
}

#[cfg(test)]
mod tests;
