//! The head of a ring: it owns the embedding, the LM head and sampling, and sends each
//! step round the devices that hold the layers.
//!
//! The head connects to every device with a window, proves the token, and sends each its
//! assignment (the ring, its place, the model's hash); a device that refuses (another
//! model, no memory) stops the head with the device's reason. A step then goes: the
//! embedding here (tokens in, hidden states out), the windows in ring order (the head's
//! own run here, the others' on their devices, each passing the states on to the next),
//! then the final norm and LM head here. Cache commands (a truncated or finished
//! sequence) ride on the next step and are applied by each device as the step enters
//! its first window, so they reach every device in order with the steps.
//!
//! [`RingHead`] implements the engine's [`Steps`], so a session runs on a ring as on one
//! machine, with the same tokens.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use blink_engine::{EngineError, Steps};
use blink_model::lora::LoraMix;
use blink_model::{Model, SeqId, StepInput, StepOutput, StepRow};
use tokio::runtime::Runtime;

use crate::auth::Token;
use crate::link::{self, FrameWriter, LinkError};
use crate::placement::Ring;
use crate::wire::{Assign, CacheOp, Message, Role, StepFrame, WireRow, MAX_PAYLOAD};
use crate::windows::{WindowSizes, Windows};

/// How long a device may take to load its windows after its assignment.
const LOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// The head's windows of no layers: the embedding and the LM head.
const ENTRY: usize = 0;
const EXIT: usize = 1;

/// A ring to run: its layout, the head's place in it and where the other devices are.
#[derive(Clone, Debug)]
pub struct RingSpec {
    pub ring: Ring,
    /// The head's index in ring order, when it holds windows.
    pub head: Option<usize>,
    /// Each device's `host:port` (the head's entry: empty).
    pub addrs: Vec<String>,
    /// Each device's compute threads (0: its own choice).
    pub threads: Vec<usize>,
    pub model_sha256: [u8; 32],
}

/// What came in from a device.
enum Event {
    Frame(Message),
    Lost(usize, String),
}

/// The head of a running ring.
pub struct RingHead {
    rt: Runtime,
    spec: RingSpec,
    /// Per device, the connection the head writes to (`None`: the head, or a device
    /// with no window).
    writers: Vec<Option<FrameWriter>>,
    events: mpsc::Receiver<Event>,
    windows: Windows,
    n_layers: usize,
    next_id: u64,
    next_seq: u32,
    ops: Vec<CacheOp>,
    /// A lost device's reason: every later step fails with it.
    broken: Option<String>,
}

impl RingHead {
    /// Connect to the ring's devices and assign them their windows. `model` is the
    /// head's own share (its windows, the embedding and the LM head).
    pub fn start(model: Arc<Model>, spec: RingSpec, token: &Token, sizes: WindowSizes) -> Result<RingHead, String> {
        let ring = &spec.ring;
        let n_layers = model.cfg.n_layers;
        if ring.n_layers() != n_layers {
            return Err(format!("the ring runs {} layers, the model has {n_layers}", ring.n_layers()));
        }
        let mut own = vec![0..0, n_layers..n_layers];
        if let Some(h) = spec.head {
            own.extend(ring.device_windows(h));
        }
        let windows = Windows::new(model, &own, sizes)?;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("blink-ring-io").enable_all().build().map_err(|e| format!("the network runtime: {e}"))?;
        let (tx, events) = mpsc::channel();
        let mut writers = Vec::with_capacity(ring.windows().len());
        for (d, &w) in ring.windows().iter().enumerate() {
            if Some(d) == spec.head || w == 0 {
                writers.push(None);
                continue;
            }
            let addr = &spec.addrs[d];
            let assign = Assign {
                model_sha256: spec.model_sha256,
                windows: ring.windows().iter().map(|&w| w as u32).collect(),
                rounds: ring.rounds() as u32,
                me: d as u32,
                head: spec.head.map(|h| h as u32),
                addrs: spec.addrs.clone(),
                kv_tokens: sizes.kv_tokens as u32,
                max_rows: sizes.max_rows as u32,
                max_ctx: sizes.max_ctx as u32,
                kv_f32: sizes.kv_type == blink_model::KvType::F32,
                threads: spec.threads.get(d).copied().unwrap_or(0) as u32,
            };
            let (mut r, wr) = rt
                .block_on(async {
                    let (mut r, mut w) = link::connect(addr, token, Role::Head, MAX_PAYLOAD).await?;
                    w.send(&Message::Assign(assign)).await?;
                    match r.read_within(LOAD_TIMEOUT).await? {
                        Message::Ready => Ok((r, w)),
                        Message::Refused { reason } => Err(LinkError::Refused(reason)),
                        m => Err(LinkError::Unexpected { got: m.name(), want: "ready" }),
                    }
                })
                .map_err(|e| format!("device {} at {addr}: {e}", d + 1))?;
            let tx = tx.clone();
            rt.spawn(async move {
                loop {
                    match r.read().await {
                        Ok(m) => {
                            if tx.send(Event::Frame(m)).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Event::Lost(d, e.to_string()));
                            return;
                        }
                    }
                }
            });
            writers.push(Some(wr));
        }
        Ok(RingHead { rt, n_layers, spec, writers, events, windows, next_id: 0, next_seq: 0, ops: Vec::new(), broken: None })
    }

    /// Send `frame` to device `d` and wait for the step to come back to the head.
    fn round_trip(&mut self, d: usize, frame: StepFrame) -> Result<StepFrame, String> {
        let id = frame.id;
        let addr = self.spec.addrs[d].clone();
        let w = self.writers[d].as_mut().ok_or_else(|| format!("device {} holds no window", d + 1))?;
        self.rt.block_on(w.send(&Message::Step(frame))).map_err(|e| format!("device {} at {addr}: {e}", d + 1))?;
        loop {
            match self.events.recv() {
                Ok(Event::Frame(Message::Step(f))) if f.id == id => return Ok(f),
                Ok(Event::Frame(Message::Failed { id: fid, reason })) if fid == id => return Err(reason),
                Ok(Event::Frame(_)) => {}
                Ok(Event::Lost(d, e)) => return Err(format!("lost device {} at {}: {e}", d + 1, self.spec.addrs[d])),
                Err(_) => return Err("the ring's connections are gone".into()),
            }
        }
    }

    fn run_step(&mut self, rows: &[StepRow]) -> Result<(), String> {
        let ops = std::mem::take(&mut self.ops);
        self.windows.apply(&ops)?;
        self.windows.step(ENTRY, rows.iter().copied(), StepInput::Tokens, StepOutput::Hidden)?;
        let mut frame = StepFrame {
            id: self.next_id,
            first_layer: 0,
            ops,
            rows: rows.iter().map(|r| WireRow { seq: r.seq as u32, pos: r.pos as u32, kind: r.kind }).collect(),
            hidden: Vec::new(),
        };
        self.next_id += 1;
        self.windows.hidden_into(rows.len(), &mut frame.hidden);
        while (frame.first_layer as usize) < self.n_layers {
            let holder = self.spec.ring.place(frame.first_layer as usize).expect("a layer of the ring").device;
            if Some(holder) == self.spec.head {
                self.windows.run_frame(&mut frame)?;
            } else {
                frame = self.round_trip(holder, frame)?;
            }
        }
        let exit = rows.iter().map(|r| StepRow { token: None, ..*r });
        self.windows.step(EXIT, exit, StepInput::Hidden(&frame.hidden), StepOutput::Logits)?;
        Ok(())
    }
}

impl Steps for RingHead {
    fn new_seq(&mut self, _tokens: usize) -> Result<SeqId, EngineError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(seq as SeqId)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), EngineError> {
        self.ops.push(CacheOp::Truncate { seq: seq as u32, len: len as u32 });
        Ok(())
    }

    fn run_with(&mut self, rows: &[StepRow], adapters: &[Arc<LoraMix>]) -> Result<(), EngineError> {
        if !adapters.is_empty() {
            return Err(EngineError::BadParams("adapters are not served on a ring yet".into()));
        }
        if let Some(reason) = &self.broken {
            return Err(EngineError::Remote(reason.clone()));
        }
        self.run_step(rows).map_err(|e| {
            self.broken = Some(e.clone());
            EngineError::Remote(e)
        })
    }

    fn logits_mut(&mut self, i: usize) -> &mut [f32] {
        self.windows.logits_mut(i)
    }
}
