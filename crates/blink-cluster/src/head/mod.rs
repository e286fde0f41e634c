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
//! Rows may run with LoRA adapters: before the first step that uses one, the head sends
//! every device the adapter's pairs on its layers and waits until each has placed it;
//! once no step holds it any more (unloaded by the server, its requests done), the
//! devices are told to let it go.
//!
//! Several steps of different sequences may be in flight at once ([`RingHead::submit`],
//! [`RingHead::wait`]), so that every device has work while a token travels. The head
//! pings every device; one silent for [`SILENCE`] (stopped, cut off, dead) fails the
//! steps in flight and every later one, with its name.
//!
//! [`RingHead`] implements the engine's [`Steps`] (one step in flight), so a session runs
//! on a ring as on one machine, with the same tokens.

mod connect;
mod rejoin;

mod adapters;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use blink_engine::serve::{RemoteHealth, RemoteSteps, TableSync};
use blink_engine::{EngineError, Steps};
use blink_model::lora::{LoraAdapter, LoraMix};
use blink_model::{Matrices, Model, Scratch, SeqId, StepInput, StepOutput, StepRow};
use tokio::runtime::Runtime;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::auth::Token;
use crate::link::Shim;
use crate::placement::Ring;
use crate::stream::{Budget, Streamer};
use crate::wire::{CacheOp, FramePool, Message, MixPart, StepFrame, WireRow};
use crate::windows::Windows;
use blink_engine::RunnerConfig;

/// How long a device may stay silent (no frame, no answer to a ping) before it is
/// taken for lost.
pub const SILENCE: Duration = Duration::from_millis(1500);
/// How often the head pings each device.
const PING_EVERY: Duration = Duration::from_millis(250);

/// The head's windows of no layers: the embedding and the LM head; its own windows
/// follow them.
const ENTRY: usize = 0;
const EXIT: usize = 1;
const OWN: usize = 2;

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
    /// Each device's memory budget in bytes (0: none).
    pub memory: Vec<u64>,
    pub model_sha256: [u8; 32],
    /// A slow link imitated on every connection into the head.
    pub shim: Shim,
    /// The planner's view of the devices, when the planner chose the ring: a lost
    /// device's windows are then re-planned by its program (else shared out in proportion).
    pub cluster: Option<crate::plan::Cluster>,
}

/// What came in from a device.
enum Event {
    Frame(Message),
    Lost(usize, String),
}

/// Whether the ring can run steps, for a server's `/health`: a connection's tasks mark it
/// down as soon as their device is lost, a failed step marks it down, and the head marks
/// it whole when it joins a ring again. Each set of connections is a generation; the
/// tasks of an older one (let go when the head joined another ring) mark nothing.
#[derive(Default)]
pub(crate) struct Health {
    generation: AtomicU64,
    down: Mutex<Option<String>>,
}

impl Health {
    fn down(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.down.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new set of connections: the older ones' losses no longer count.
    fn next_generation(&self) -> u64 {
        let _down = self.down();
        self.generation.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// A device of connections `generation` is lost.
    fn lose(&self, generation: u64, reason: String) {
        let mut down = self.down();
        if self.generation.load(Ordering::SeqCst) == generation && down.is_none() {
            *down = Some(reason);
        }
    }

    fn set_down(&self, reason: String) {
        *self.down() = Some(reason);
    }

    fn set_whole(&self) {
        *self.down() = None;
    }

    fn check(&self) -> Result<(), String> {
        self.down().clone().map_or(Ok(()), Err)
    }
}

/// A step sent round the ring and not yet back: its rows, and the adapter mixes they run
/// with (held until it lands, so the devices keep them).
struct InFlight {
    rows: Vec<StepRow>,
    adapters: Vec<Arc<LoraMix>>,
}

/// The head of a running ring.
pub struct RingHead {
    /// Runs the connections' tasks.
    rt: Runtime,
    /// The ring the head runs now, and the one it was given.
    spec: RingSpec,
    planned: RingSpec,
    token: Token,
    sizes: RunnerConfig,
    /// Per device, the queue of frames its writer task sends (`None`: the head, or a
    /// device with no window).
    senders: Vec<Option<UnboundedSender<Message>>>,
    events: UnboundedReceiver<Event>,
    /// Spare step frames: built into here, read into by the connections, given back by
    /// the writers once sent and here once a step has left the ring.
    frames: FramePool,
    /// Spare records of steps in flight, for the next steps' rows and mixes.
    spare: Vec<InFlight>,
    windows: Windows,
    n_layers: usize,
    next_id: u64,
    next_seq: u32,
    ops: Vec<CacheOp>,
    /// Each step in flight, for its exit.
    in_flight: HashMap<u64, InFlight>,
    /// Frames that came in while the head waited for the devices to place adapters.
    early: VecDeque<Event>,
    /// The adapters the devices hold, by number.
    shipped: HashMap<u64, Weak<LoraAdapter>>,
    /// A lost device's reason: steps fail with it until the ring is joined again.
    broken: Option<String>,
    /// When the head last tried to join the ring again.
    last_rejoin: Option<std::time::Instant>,
    health: Arc<Health>,
    /// The head's own windows streamed from the file, when they exceed its budget.
    streamer: Option<Streamer>,
    /// How many times the head joined a ring afresh (the devices' caches emptied).
    joined: u64,
}

impl RingHead {
    /// Connect to the ring's devices and assign them their windows. `model` is the
    /// head's own share (its windows, the embedding and the LM head).
    pub fn start(model: Arc<Model>, spec: RingSpec, token: &Token, sizes: RunnerConfig) -> Result<RingHead, String> {
        let ring = &spec.ring;
        let n_layers = model.cfg.n_layers;
        if ring.n_layers() != n_layers {
            return Err(format!("the ring runs {} layers, the model has {n_layers}", ring.n_layers()));
        }
        if ring.windows().iter().enumerate().all(|(d, &w)| w == 0 || Some(d) == spec.head) {
            return Err("the ring has no device but the head with a window: run without --cluster".into());
        }
        if spec.addrs.len() != ring.windows().len() {
            return Err(format!("{} windows for {} devices", ring.windows().len(), spec.addrs.len()));
        }
        let mut own = vec![0..0, n_layers..n_layers];
        if let Some(h) = spec.head {
            own.extend(ring.device_windows(h));
        }
        let streamer = own_streamer(&model, &own[OWN..], &spec, &sizes);
        let windows = Windows::new(model, &own, &sizes)?;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("blink-ring-io").enable_all().build().map_err(|e| format!("the network runtime: {e}"))?;
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        let health = Arc::new(Health::default());
        let generation = health.next_generation();
        let frames = FramePool::new();
        let senders = rt.block_on(connect::all(&spec, token, &sizes, tx, (health.clone(), generation), &frames))?;
        Ok(RingHead {
            rt,
            n_layers,
            planned: spec.clone(),
            spec,
            token: token.clone(),
            sizes,
            senders,
            events,
            frames,
            spare: Vec::new(),
            windows,
            next_id: 0,
            next_seq: 0,
            ops: Vec::new(),
            in_flight: HashMap::new(),
            early: VecDeque::new(),
            shipped: HashMap::new(),
            broken: None,
            last_rejoin: None,
            health,
            streamer,
            joined: 0,
        })
    }

    /// Steps sent and not yet back.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Start a step of `rows` (their `seq` numbered by [`Steps::new_seq`], their adapter
    /// slots indexing `adapters`): the embedding here, then on round the ring. Its result
    /// comes from [`RingHead::wait`].
    pub fn submit(&mut self, rows: &[StepRow], adapters: &[Arc<LoraMix>]) -> Result<u64, EngineError> {
        self.check()?;
        self.submit_inner(rows, adapters).map_err(|e| self.break_with(e))
    }

    /// Wait for a step in flight to come back and run its exit; returns its number, its
    /// logits ready in [`Steps::logits_mut`] until the next step runs here.
    pub fn wait(&mut self) -> Result<u64, EngineError> {
        self.check()?;
        if self.in_flight.is_empty() {
            return Err(EngineError::BadParams("no step is in flight".into()));
        }
        self.wait_inner().map_err(|e| self.break_with(e))
    }

    fn check(&mut self) -> Result<(), EngineError> {
        self.rejoin()
    }

    fn break_with(&mut self, reason: String) -> EngineError {
        self.in_flight.clear();
        self.broken = Some(reason.clone());
        self.health.set_down(reason.clone());
        EngineError::Remote(reason)
    }

    fn submit_inner(&mut self, rows: &[StepRow], adapters: &[Arc<LoraMix>]) -> Result<u64, String> {
        self.drop_unused_adapters();
        self.ship_adapters(adapters)?;
        self.windows.apply(&self.ops)?;
        self.windows.step(ENTRY, rows.iter().copied(), (StepInput::Tokens, StepOutput::Hidden), adapters)?;
        let id = self.next_id;
        self.next_id += 1;
        // The frame and the record are spares' when there are any, filled in place.
        let mut frame = self.frames.take();
        (frame.id, frame.first_layer) = (id, 0);
        frame.ops.clear();
        std::mem::swap(&mut frame.ops, &mut self.ops);
        for (parts, mix) in frame.empty_mixes(adapters.len()).iter_mut().zip(adapters) {
            parts.extend(mix.adapters().iter().map(|(a, scale)| MixPart { adapter: a.id(), scale: *scale }));
        }
        frame.rows.clear();
        frame.rows.extend(rows.iter().map(|r| WireRow { seq: r.seq as u32, pos: r.pos as u32, kind: r.kind, adapter: r.adapter.map(|s| s.0), logits: r.logits, grouped: r.grouped, tiled: r.tiled }));
        self.windows.hidden_into(rows.len(), &mut frame.hidden);
        let mut step = self.spare.pop().unwrap_or(InFlight { rows: Vec::new(), adapters: Vec::new() });
        step.rows.clear();
        step.rows.extend_from_slice(rows);
        step.adapters.clear();
        step.adapters.extend_from_slice(adapters);
        self.in_flight.insert(id, step);
        let done = self.advance(frame)?;
        debug_assert!(done.is_none(), "a ring has a device besides the head");
        Ok(id)
    }

    fn wait_inner(&mut self) -> Result<u64, String> {
        loop {
            match self.early.pop_front().map_or_else(|| self.events.blocking_recv().ok_or(()), Ok) {
                Ok(Event::Frame(Message::Step(f))) if self.in_flight.contains_key(&f.id) => {
                    if let Some(id) = self.advance(f)? {
                        return Ok(id);
                    }
                }
                Ok(Event::Frame(Message::Failed { id, reason })) if self.in_flight.contains_key(&id) => return Err(reason),
                // A step of a ring left behind, or a late answer: its buffers are spares.
                Ok(Event::Frame(m)) => self.frames.recycle(m),
                Ok(Event::Lost(d, e)) => return Err(format!("lost device {} at {}: {e}", d + 1, self.spec.addrs[d])),
                Err(_) => return Err("the ring's connections are gone".into()),
            }
        }
    }

    /// Run the head's windows the step enters and send it on; at the last layer, run the
    /// exit and return the step's number.
    fn advance(&mut self, mut frame: StepFrame) -> Result<Option<u64>, String> {
        // The head's own window run last, given back (if streamed) once the step has left.
        let mut ran = None;
        // The step at its exit, or `None` once it has left for a device.
        let at_exit = loop {
            if frame.first_layer as usize >= self.n_layers {
                break Some(frame);
            }
            let holder = self.spec.ring.place(frame.first_layer as usize).expect("a layer of the ring").device;
            if Some(holder) != self.spec.head {
                let tx = self.senders[holder].as_ref().ok_or_else(|| format!("device {} holds no window", holder + 1))?;
                tx.send(Message::Step(frame)).map_err(|_| format!("lost device {} at {}", holder + 1, self.spec.addrs[holder]))?;
                break None;
            }
            self.stream_done(ran.take());
            if let (Some(s), Some(w)) = (&mut self.streamer, self.windows.find(frame.first_layer as usize)) {
                // SAFETY: the head's steps run on this thread only, and none is running.
                unsafe { s.ensure(w - OWN) };
            }
            let step = self.in_flight.get(&frame.id).expect("a step in flight");
            ran = Some(self.windows.run_frame(&mut frame, &step.adapters)?);
        };
        self.stream_done(ran);
        let Some(frame) = at_exit else { return Ok(None) };
        let mut step = self.in_flight.remove(&frame.id).expect("a step in flight");
        let exit = step.rows.iter().map(|r| StepRow { token: None, ..*r });
        let ran = self.windows.step(EXIT, exit, (StepInput::Hidden(&frame.hidden), StepOutput::Logits), &step.adapters);
        let id = frame.id;
        self.frames.give(frame);
        // The record lets go of its mixes now, as it did when it was dropped.
        step.adapters.clear();
        self.spare.push(step);
        ran?;
        Ok(Some(id))
    }

    /// The head's own window `ran` (an index of its windows) has run: give it back and
    /// read the next one ahead, when they are streamed.
    fn stream_done(&mut self, ran: Option<usize>) {
        if let (Some(s), Some(w)) = (&mut self.streamer, ran) {
            // SAFETY: the head's steps run on this thread only, and none is running.
            unsafe { s.done(w - OWN) };
        }
    }
}

/// A streamer for the head's own windows `own` when its share was loaded streamed (its
/// windows and their caches over its budget), with every window given back but the ones
/// it keeps and the first it streams.
fn own_streamer(model: &Arc<Model>, own: &[std::ops::Range<usize>], spec: &RingSpec, sizes: &RunnerConfig) -> Option<Streamer> {
    if !model.share().matrices.streamed() || own.is_empty() {
        return None;
    }
    let memory = spec.head.and_then(|h| spec.memory.get(h).copied()).unwrap_or(0);
    let budget = head_budget(model.file(), 2 * model.cfg.kv_dim() * sizes.kv_type.bytes(), sizes.kv_tokens, own, memory);
    let mut s = Streamer::new(model.file().clone(), model.clone(), own, budget.for_weights(), false);
    // SAFETY: no step runs before the head is built.
    unsafe {
        for w in 0..s.n_windows() {
            s.release(w);
        }
        s.start();
    }
    Some(s)
}

/// The head's budget: its windows `own`, their caches, and its embedding and LM head.
fn head_budget(file: &blink_gguf::GgufFile, kv_bytes_per_layer_token: usize, kv_tokens: usize, own: &[std::ops::Range<usize>], memory: u64) -> Budget {
    Budget::of(file, own, kv_bytes_per_layer_token, kv_tokens, memory).with_fixed(crate::stream::outside_layers_bytes(file))
}

/// How the head holds its own windows `own`: streamed when they and their caches exceed
/// its budget in `spec`, else repacked.
pub fn own_matrices(file: &blink_gguf::GgufFile, kv_bytes_per_layer_token: usize, kv_tokens: usize, own: &[std::ops::Range<usize>], memory: u64) -> Matrices {
    if head_budget(file, kv_bytes_per_layer_token, kv_tokens, own, memory).streams() {
        Matrices::Streamed
    } else {
        Matrices::Repacked
    }
}

impl Steps for RingHead {
    fn new_seq(&mut self, _tokens: usize) -> Result<SeqId, EngineError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(seq as SeqId)
    }

    fn truncate(&mut self, seq: SeqId, len: usize) -> Result<usize, EngineError> {
        // The devices' window caches keep every position (they do not slide).
        self.ops.push(CacheOp::Truncate { seq: seq as u32, len: len as u32 });
        Ok(len)
    }

    fn run_with(&mut self, rows: &[StepRow], adapters: &[Arc<LoraMix>]) -> Result<(), EngineError> {
        let id = self.submit(rows, adapters)?;
        while self.wait()? != id {}
        Ok(())
    }

    fn logits_mut(&mut self, i: usize) -> &mut [f32] {
        self.windows.logits_mut(i)
    }
}

impl RingHead {
    /// Forget sequence `seq` on every device (with the next step).
    pub fn release(&mut self, seq: SeqId) {
        self.ops.push(CacheOp::Release { seq: seq as u32 });
    }
}

/// The serving engine's steps on the ring: one or several micro-batches in flight, the
/// engine's scheduling beside them.
impl RemoteSteps for RingHead {
    fn prepare(&mut self, may_change: bool) -> Result<bool, EngineError> {
        let joined = self.joined;
        if may_change {
            // Nothing the devices hold is live: the ring may change under the step.
            self.restore();
        }
        self.check()?;
        Ok(self.joined != joined)
    }

    fn start(&mut self, rows: &[StepRow], adapters: &[Arc<LoraMix>], released: &[SeqId], sync: &[TableSync]) -> Result<u64, EngineError> {
        for &seq in released {
            self.release(seq);
        }
        self.ops.extend(sync.iter().map(|s| match *s {
            TableSync::Cut { seq, blocks } => CacheOp::Cut { seq: seq as u32, blocks: blocks as u32 },
            TableSync::Block { seq, block } => CacheOp::Block { seq: seq as u32, block },
            TableSync::Copy { src, dst, slots } => CacheOp::Copy { src, dst, slots: slots as u32 },
        }));
        self.submit(rows, adapters)
    }

    fn finish_one(&mut self) -> Result<u64, EngineError> {
        self.wait()
    }

    fn scratch(&mut self) -> &mut Scratch {
        self.windows.scratch_mut()
    }

    fn health(&self) -> Option<RemoteHealth> {
        let health = self.health.clone();
        Some(Arc::new(move || health.check()))
    }
}
