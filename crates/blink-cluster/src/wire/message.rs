//! The messages of the ring protocol, and their payloads.
//!
//! A connection starts with a handshake (`Hello`, `Challenge`, `Proof`, then `Ready` or
//! `Refused`; see [`crate::auth`]). The head then sends each node an `Assign`, which the
//! node answers with `Ready` once its windows are loaded, or `Refused`. After that, steps
//! go round the ring as `Step` frames, a node reports a step it could not run with
//! `Failed`, and `Ping`/`Pong` show a quiet peer is alive.
//!
//! Before a step that uses a LoRA adapter a device has not seen, the head sends it the
//! adapter's pairs on its layers (`AdapterLayer`, one frame per layer), then
//! `AdapterPlace`; the device answers `AdapterPlaced`. `AdapterDrop` lets it go once no
//! step uses it.

use blink_model::lora::{LoraPair, LoraTarget};
use blink_model::RowKind;

use super::codec::{Reader, Writer};
use super::{FramePool, WireError};

/// Who is connecting: the head (to give orders and collect results), a peer node (to
/// pass steps on round the ring), or a prober measuring the link (`blink profile
/// --peer`), whose pings and steps the node sends straight back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Head,
    Peer,
    Probe,
}

/// What the head tells a node it holds, and where the ring goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assign {
    /// SHA-256 of the model file; a node whose copy differs refuses.
    pub model_sha256: [u8; 32],
    /// Every device's window, in ring order, and the rounds.
    pub windows: Vec<u32>,
    pub rounds: u32,
    /// This node's index in ring order.
    pub me: u32,
    /// The head's index when it holds windows itself.
    pub head: Option<u32>,
    /// Every device's `host:port` in ring order (the head's entry is empty).
    pub addrs: Vec<String>,
    /// Tokens the node's caches hold over all sequences, most rows in a step, and the
    /// bound on positions.
    pub kv_tokens: u32,
    pub max_rows: u32,
    pub max_ctx: u32,
    /// The cache's element type: 0 f16, 1 f32.
    pub kv_f32: bool,
    /// Compute threads the node should use (0: its own choice).
    pub threads: u32,
    /// The node's memory budget in bytes (0: none); windows that do not fit in it are
    /// streamed from the file.
    pub memory: u64,
}

/// A change to a sequence's cache, applied by every device before the step carrying it
/// enters the device's first window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOp {
    /// Keep the sequence's first `len` tokens.
    Truncate { seq: u32, len: u32 },
    /// Forget the sequence.
    Release { seq: u32 },
    /// The head keeps the block tables (the serving engine's bookkeeping, prefix cache
    /// and all): keep the first `blocks` blocks of the sequence's table, starting the
    /// sequence if it is new. Its blocks are then the head's choice.
    Cut { seq: u32, blocks: u32 },
    /// Block `block` is the next of the sequence's table.
    Block { seq: u32, block: u32 },
    /// Copy the first `slots` positions of block `src` into block `dst` (a prefix that
    /// ends inside a block, reused).
    Copy { src: u32, dst: u32, slots: u32 },
}

/// One row of a step as it travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireRow {
    pub seq: u32,
    pub pos: u32,
    pub kind: RowKind,
    /// Its adapter mix: an index into the step's `mixes` (`None`: the base model).
    pub adapter: Option<u16>,
    /// Whether it wants logits, and whether llama.cpp computes it in a group of four (and
    /// tiled, below): the products of the last layers follow all three
    /// (`blink_model::StepRow`).
    pub logits: bool,
    pub grouped: bool,
    /// The row is tiled (`StepRow::tiled`).
    pub tiled: bool,
}

/// One adapter in a step's mix: the head's number for it and its user scale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MixPart {
    pub adapter: u64,
    pub scale: f32,
}

/// An adapter's pairs on one layer, sent to a device holding it. The values are f16's
/// (as placed on the head), sent in two bytes each.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterLayer {
    pub adapter: u64,
    pub layer: u32,
    /// By [`LoraTarget::index`].
    pub pairs: [Option<LoraPair>; 7],
}

/// A step on its way round the ring: its rows' hidden states entering layer
/// `first_layer`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepFrame {
    /// The head's number for the step (a micro-batch in flight).
    pub id: u64,
    pub first_layer: u32,
    pub ops: Vec<CacheOp>,
    /// The adapter mixes the rows' `adapter` indexes.
    pub mixes: Vec<Vec<MixPart>>,
    pub rows: Vec<WireRow>,
    /// `rows × n_embd` values.
    pub hidden: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Hello { role: Role, nonce: [u8; 32] },
    Challenge { nonce: [u8; 32], proof: [u8; 32] },
    Proof { proof: [u8; 32] },
    Refused { reason: String },
    Assign(Assign),
    Ready,
    Step(StepFrame),
    Failed { id: u64, reason: String },
    Ping { at: u64 },
    Pong { at: u64 },
    /// Boxed: a layer's pairs are large beside every other message.
    AdapterLayer(Box<AdapterLayer>),
    /// Place the adapter whose layers were sent, with its `alpha` (rsLoRA or not).
    AdapterPlace { adapter: u64, alpha: f32, rslora: bool },
    /// The adapter is placed (`error` empty), or why not.
    AdapterPlaced { adapter: u64, error: String },
    AdapterDrop { adapter: u64 },
}

const HELLO: u8 = 1;
const CHALLENGE: u8 = 2;
const PROOF: u8 = 3;
const REFUSED: u8 = 4;
const ASSIGN: u8 = 5;
const READY: u8 = 6;
const STEP: u8 = 7;
const FAILED: u8 = 8;
const PING: u8 = 9;
const PONG: u8 = 10;
const ADAPTER_LAYER: u8 = 11;
const ADAPTER_PLACE: u8 = 12;
const ADAPTER_PLACED: u8 = 13;
const ADAPTER_DROP: u8 = 14;

pub(super) fn known_kind(kind: u8) -> bool {
    (HELLO..=ADAPTER_DROP).contains(&kind)
}

fn kind_byte(k: RowKind) -> u8 {
    match k {
        RowKind::Prompt => 0,
        RowKind::Decode => 1,
        RowKind::Training => 2,
    }
}

fn row_kind(b: u8) -> Result<RowKind, WireError> {
    match b {
        0 => Ok(RowKind::Prompt),
        1 => Ok(RowKind::Decode),
        2 => Ok(RowKind::Training),
        _ => Err(WireError::Invalid(format!("row kind {b}"))),
    }
}

impl Message {
    pub(super) fn kind(&self) -> u8 {
        match self {
            Message::Hello { .. } => HELLO,
            Message::Challenge { .. } => CHALLENGE,
            Message::Proof { .. } => PROOF,
            Message::Refused { .. } => REFUSED,
            Message::Assign(_) => ASSIGN,
            Message::Ready => READY,
            Message::Step(_) => STEP,
            Message::Failed { .. } => FAILED,
            Message::Ping { .. } => PING,
            Message::Pong { .. } => PONG,
            Message::AdapterLayer(_) => ADAPTER_LAYER,
            Message::AdapterPlace { .. } => ADAPTER_PLACE,
            Message::AdapterPlaced { .. } => ADAPTER_PLACED,
            Message::AdapterDrop { .. } => ADAPTER_DROP,
        }
    }

    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Challenge { .. } => "challenge",
            Message::Proof { .. } => "proof",
            Message::Refused { .. } => "refused",
            Message::Assign(_) => "assign",
            Message::Ready => "ready",
            Message::Step(_) => "step",
            Message::Failed { .. } => "failed",
            Message::Ping { .. } => "ping",
            Message::Pong { .. } => "pong",
            Message::AdapterLayer(_) => "adapter layer",
            Message::AdapterPlace { .. } => "adapter placement",
            Message::AdapterPlaced { .. } => "adapter placed",
            Message::AdapterDrop { .. } => "adapter drop",
        }
    }

    pub(super) fn write(&self, w: &mut Writer) {
        match self {
            Message::Hello { role, nonce } => {
                w.u8(match role {
                    Role::Head => 1,
                    Role::Peer => 2,
                    Role::Probe => 3,
                });
                w.bytes32(nonce);
            }
            Message::Challenge { nonce, proof } => {
                w.bytes32(nonce);
                w.bytes32(proof);
            }
            Message::Proof { proof } => w.bytes32(proof),
            Message::Refused { reason } => w.str(reason),
            Message::Assign(a) => {
                w.bytes32(&a.model_sha256);
                w.u32(a.windows.len() as u32);
                for &x in &a.windows {
                    w.u32(x);
                }
                w.u32(a.rounds);
                w.u32(a.me);
                w.u32(a.head.unwrap_or(u32::MAX));
                w.u32(a.addrs.len() as u32);
                for s in &a.addrs {
                    w.str(s);
                }
                w.u32(a.kv_tokens);
                w.u32(a.max_rows);
                w.u32(a.max_ctx);
                w.u8(u8::from(a.kv_f32));
                w.u32(a.threads);
                w.u64(a.memory);
            }
            Message::Ready => {}
            Message::Step(s) => {
                w.u64(s.id);
                w.u32(s.first_layer);
                w.u32(s.ops.len() as u32);
                for op in &s.ops {
                    match *op {
                        CacheOp::Truncate { seq, len } => {
                            w.u8(0);
                            w.u32(seq);
                            w.u32(len);
                        }
                        CacheOp::Release { seq } => {
                            w.u8(1);
                            w.u32(seq);
                            w.u32(0);
                        }
                        CacheOp::Cut { seq, blocks } => {
                            w.u8(2);
                            w.u32(seq);
                            w.u32(blocks);
                        }
                        CacheOp::Block { seq, block } => {
                            w.u8(3);
                            w.u32(seq);
                            w.u32(block);
                        }
                        CacheOp::Copy { src, dst, slots } => {
                            w.u8(4);
                            w.u32(src);
                            w.u32(dst);
                            w.u32(slots);
                        }
                    }
                }
                w.u32(s.mixes.len() as u32);
                for mix in &s.mixes {
                    w.u32(mix.len() as u32);
                    for part in mix {
                        w.u64(part.adapter);
                        w.f32(part.scale);
                    }
                }
                w.u32(s.rows.len() as u32);
                for r in &s.rows {
                    w.u32(r.seq);
                    w.u32(r.pos);
                    w.u8(kind_byte(r.kind));
                    w.u16(r.adapter.unwrap_or(u16::MAX));
                    w.u8(u8::from(r.logits) | u8::from(r.grouped) << 1 | u8::from(r.tiled) << 2);
                }
                w.f32s(&s.hidden);
            }
            Message::Failed { id, reason } => {
                w.u64(*id);
                w.str(reason);
            }
            Message::Ping { at } | Message::Pong { at } => w.u64(*at),
            Message::AdapterLayer(a) => {
                w.u64(a.adapter);
                w.u32(a.layer);
                w.u32(a.pairs.iter().flatten().count() as u32);
                for (target, pair) in LoraTarget::ALL.iter().zip(&a.pairs) {
                    if let Some(p) = pair {
                        w.u8(target.index() as u8);
                        w.u32(p.rank as u32);
                        w.u32(p.rows as u32);
                        w.u32(p.cols as u32);
                        w.f16s(&p.a);
                        w.f16s(&p.b);
                    }
                }
            }
            Message::AdapterPlace { adapter, alpha, rslora } => {
                w.u64(*adapter);
                w.f32(*alpha);
                w.u8(u8::from(*rslora));
            }
            Message::AdapterPlaced { adapter, error } => {
                w.u64(*adapter);
                w.str(error);
            }
            Message::AdapterDrop { adapter } => w.u64(*adapter),
        }
    }

    pub(super) fn read(kind: u8, payload: &[u8], pool: &FramePool) -> Result<Message, WireError> {
        let mut r = Reader::new(payload);
        let msg = match kind {
            HELLO => {
                let role = match r.u8("hello")? {
                    1 => Role::Head,
                    2 => Role::Peer,
                    3 => Role::Probe,
                    b => return Err(WireError::Invalid(format!("role {b}"))),
                };
                Message::Hello { role, nonce: r.bytes32("hello")? }
            }
            CHALLENGE => Message::Challenge { nonce: r.bytes32("challenge")?, proof: r.bytes32("challenge")? },
            PROOF => Message::Proof { proof: r.bytes32("proof")? },
            REFUSED => Message::Refused { reason: r.str("refusal")? },
            ASSIGN => {
                let model_sha256 = r.bytes32("assignment")?;
                let n = r.count(4, "windows")?;
                let windows = (0..n).map(|_| r.u32("windows")).collect::<Result<Vec<_>, _>>()?;
                let rounds = r.u32("assignment")?;
                let me = r.u32("assignment")?;
                let head = Some(r.u32("assignment")?).filter(|&h| h != u32::MAX);
                let n = r.count(4, "addresses")?;
                let addrs = (0..n).map(|_| r.str("addresses")).collect::<Result<Vec<_>, _>>()?;
                let kv_tokens = r.u32("assignment")?;
                let max_rows = r.u32("assignment")?;
                let max_ctx = r.u32("assignment")?;
                let kv_f32 = match r.u8("assignment")? {
                    0 => false,
                    1 => true,
                    b => return Err(WireError::Invalid(format!("cache type {b}"))),
                };
                let threads = r.u32("assignment")?;
                let memory = r.u64("assignment")?;
                Message::Assign(Assign { model_sha256, windows, rounds, me, head, addrs, kv_tokens, max_rows, max_ctx, kv_f32, threads, memory })
            }
            READY => Message::Ready,
            STEP => {
                let mut frame = pool.take();
                return match frame.read_from(&mut r).and_then(|()| r.finish("step")) {
                    Ok(()) => Ok(Message::Step(frame)),
                    Err(e) => {
                        pool.give(frame);
                        Err(e)
                    }
                };
            }
            FAILED => Message::Failed { id: r.u64("failure")?, reason: r.str("failure")? },
            PING => Message::Ping { at: r.u64("ping")? },
            PONG => Message::Pong { at: r.u64("pong")? },
            ADAPTER_LAYER => Message::AdapterLayer(Box::new(read_adapter_layer(&mut r)?)),
            ADAPTER_PLACE => {
                let (adapter, alpha) = (r.u64("adapter placement")?, r.f32("adapter placement")?);
                let rslora = match r.u8("adapter placement")? {
                    0 => false,
                    1 => true,
                    b => return Err(WireError::Invalid(format!("rsLoRA flag {b}"))),
                };
                Message::AdapterPlace { adapter, alpha, rslora }
            }
            ADAPTER_PLACED => Message::AdapterPlaced { adapter: r.u64("adapter placed")?, error: r.str("adapter placed")? },
            ADAPTER_DROP => Message::AdapterDrop { adapter: r.u64("adapter drop")? },
            k => return Err(WireError::Kind(k)),
        };
        r.finish(msg.name())?;
        Ok(msg)
    }
}

impl StepFrame {
    /// `n` empty mixes, in the vectors the frame had (so filling them allocates nothing
    /// once the frame has carried as many parts).
    pub fn empty_mixes(&mut self, n: usize) -> &mut [Vec<MixPart>] {
        self.mixes.truncate(n);
        self.mixes.resize_with(n, Vec::new);
        self.mixes.iter_mut().for_each(Vec::clear);
        &mut self.mixes
    }

    /// Decode a step's fields into this frame, reusing its vectors' memory.
    fn read_from(&mut self, r: &mut Reader) -> Result<(), WireError> {
        self.id = r.u64("step")?;
        self.first_layer = r.u32("step")?;
        // Every command takes at least 9 bytes (a copy 13).
        let n = r.count(9, "cache commands")?;
        self.ops.clear();
        for _ in 0..n {
            let (op, a, b) = (r.u8("cache commands")?, r.u32("cache commands")?, r.u32("cache commands")?);
            self.ops.push(match op {
                0 => CacheOp::Truncate { seq: a, len: b },
                1 => CacheOp::Release { seq: a },
                2 => CacheOp::Cut { seq: a, blocks: b },
                3 => CacheOp::Block { seq: a, block: b },
                4 => CacheOp::Copy { src: a, dst: b, slots: r.u32("cache commands")? },
                b => return Err(WireError::Invalid(format!("cache command {b}"))),
            });
        }
        let n = r.count(4, "adapter mixes")?;
        for mix in self.empty_mixes(n) {
            for _ in 0..r.count(12, "adapter mixes")? {
                mix.push(MixPart { adapter: r.u64("adapter mixes")?, scale: r.f32("adapter mixes")? });
            }
        }
        let n = r.count(12, "rows")?;
        self.rows.clear();
        for _ in 0..n {
            let (seq, pos, kind) = (r.u32("rows")?, r.u32("rows")?, row_kind(r.u8("rows")?)?);
            let adapter = Some(r.u16("rows")?).filter(|&a| a != u16::MAX);
            if adapter.is_some_and(|a| a as usize >= self.mixes.len()) {
                return Err(WireError::Invalid(format!("a row of adapter mix {} in a step of {}", adapter.unwrap_or(0), self.mixes.len())));
            }
            let flags = r.u8("rows")?;
            if flags > 7 {
                return Err(WireError::Invalid(format!("row flags {flags:#04x}")));
            }
            self.rows.push(WireRow { seq, pos, kind, adapter, logits: flags & 1 != 0, grouped: flags & 2 != 0, tiled: flags & 4 != 0 });
        }
        r.f32s_into(&mut self.hidden, "hidden states")?;
        if !self.rows.is_empty() && !self.hidden.len().is_multiple_of(self.rows.len()) {
            return Err(WireError::Invalid(format!("{} hidden values for {} rows", self.hidden.len(), self.rows.len())));
        }
        Ok(())
    }
}

/// An adapter's layer: each pair's target (once each), shapes and values, which must agree.
fn read_adapter_layer(r: &mut Reader) -> Result<AdapterLayer, WireError> {
    let what = "adapter layer";
    let (adapter, layer) = (r.u64(what)?, r.u32(what)?);
    let mut pairs: [Option<LoraPair>; 7] = Default::default();
    // A pair takes at least 21 bytes: its target, shapes and two counts.
    for _ in 0..r.count(21, what)? {
        let target = r.u8(what)? as usize;
        if target >= pairs.len() || pairs[target].is_some() {
            return Err(WireError::Invalid(format!("adapter target {target} out of range or twice")));
        }
        let (rank, rows, cols) = (r.u32(what)? as usize, r.u32(what)? as usize, r.u32(what)? as usize);
        let (a, b) = (r.f16s(what)?, r.f16s(what)?);
        if Some(a.len()) != rank.checked_mul(cols) || Some(b.len()) != rank.checked_mul(rows) {
            return Err(WireError::Invalid(format!("an adapter pair of rank {rank}, {rows} x {cols}, with {} and {} values", a.len(), b.len())));
        }
        pairs[target] = Some(LoraPair { rank, rows, cols, a, b });
    }
    Ok(AdapterLayer { adapter, layer, pairs })
}
