//! `blink node`: one device of a ring.
//!
//! The node listens, proves the ring's token to whoever connects and has them prove it
//! too. A head's connection brings an assignment: the ring's windows and rounds, this
//! node's place in it and the model's hash. The node checks the hash against its own
//! copy of the file, loads its windows and answers `Ready`. Steps then arrive from the
//! head (the first window of a round) or from the device before it, run on a compute
//! thread of their own, and go on to the device holding the next layer, or back to the
//! head after the last. The head's LoRA adapters come on its connection and are placed
//! by the compute thread between steps. A new head's assignment replaces the old one; a head that goes
//! away takes its assignment with it.
//!
//! Network reading and writing run on a tokio runtime; the compute thread only computes.

mod adapters;
mod compute;
mod router;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blink_gguf::GgufFile;
use blink_model::config::ModelConfig;
use blink_model::{KvType, Matrices, Model, Share, TensorPlacement};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc as tmpsc;

use crate::auth::{self, Token};
use crate::link::{self, FrameReader, FrameWriter, Incoming, Shim};
use crate::placement::Ring;
use crate::stream::{Budget, Streamer};
use crate::wire::{Assign, FramePool, Message, Role, StepFrame};
use crate::windows::Windows;
use blink_engine::RunnerConfig;
use compute::Work;
use router::{Dest, Outgoing};

/// How a node is started.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// `host:port` to listen on (port 0: any free port, printed at start).
    pub listen: String,
    pub token: Token,
    pub model: PathBuf,
    /// Compute threads, unless the head's assignment names a number.
    pub threads: usize,
    /// The largest frame accepted from an authenticated peer.
    pub max_frame: usize,
    /// A slow link imitated on every connection into this node.
    pub shim: Shim,
    /// Read streamed windows ahead by reading them (`MADV_POPULATE_READ`), not by hint.
    pub force_prefetch: bool,
}

/// How long a head may take to send its assignment after connecting.
const ASSIGN_TIMEOUT: Duration = Duration::from_secs(30);

/// The current assignment: where steps go in, and which head it belongs to.
struct Assigned {
    head_conn: u64,
    work: tmpsc::UnboundedSender<Work>,
}

/// A connection's copy of the compute thread's queue, taken again only when the
/// assignment has changed, so passing a step on takes no lock.
#[derive(Default)]
struct WorkQueue {
    generation: u64,
    work: Option<tmpsc::UnboundedSender<Work>>,
}

struct Node {
    opts: NodeOptions,
    sha256: [u8; 32],
    file: Arc<GgufFile>,
    n_layers: usize,
    /// Key and value elements one token takes in one layer's cache.
    kv_per_layer_token: usize,
    assigned: Mutex<Option<Assigned>>,
    /// Counts changes of `assigned`; connections compare it with their copy's.
    generation: AtomicU64,
    out: tmpsc::UnboundedSender<Outgoing>,
    /// Spare step frames, shared by every connection.
    frames: FramePool,
}

/// Run a node until the process ends. Errors are what stops it from starting (the model
/// file, the address); everything after that is logged and survived.
pub fn serve(opts: NodeOptions) -> Result<(), String> {
    let file = Arc::new(GgufFile::open(&opts.model).map_err(|e| format!("{}: {e}", opts.model.display()))?);
    let cfg = ModelConfig::from_gguf(&file).map_err(|e| format!("{}: {e}", opts.model.display()))?;
    let sha256 = auth::file_sha256(&opts.model).map_err(|e| format!("{}: {e}", opts.model.display()))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("the network runtime: {e}"))?;
    rt.block_on(async move {
        let listener = TcpListener::bind(&opts.listen).await.map_err(|e| format!("cannot listen on {}: {e}", opts.listen))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!("blink node: listening on {local} (model {}, sha256 {})", opts.model.display(), auth::hex(&sha256));
        let (out, out_rx) = tmpsc::unbounded_channel();
        let frames = FramePool::new();
        tokio::spawn(router::run(out_rx, opts.token.clone(), frames.clone()));
        let node = Arc::new(Node { n_layers: cfg.n_layers, kv_per_layer_token: 2 * cfg.kv_dim(), opts, sha256, file, assigned: Mutex::new(None), generation: AtomicU64::new(1), out, frames });
        let mut conns = 0u64;
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("blink node: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            conns += 1;
            tokio::spawn(node.clone().connection(stream, peer.to_string(), conns));
        }
    })
}

impl Node {
    async fn connection(self: Arc<Self>, stream: TcpStream, peer: String, conn: u64) {
        let (mut r, w, role) = match link::accept(stream, &self.opts.token, self.opts.max_frame).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("blink node: refused {peer}: {e}");
                return;
            }
        };
        r.set_pool(self.frames.clone());
        match role {
            Role::Head => self.head(r, w, &peer, conn).await,
            Role::Peer => self.peer(r, &peer).await,
            Role::Probe => self.probe(r, w).await,
        }
    }

    /// A head's connection: its assignment, then its steps until it goes away.
    async fn head(self: Arc<Self>, mut r: FrameReader, mut w: FrameWriter, peer: &str, conn: u64) {
        let assign = match r.read_within(ASSIGN_TIMEOUT).await {
            Ok(Message::Assign(a)) => a,
            Ok(m) => return w.refuse(&format!("expected an assignment, got {}", m.name())).await,
            Err(e) => return eprintln!("blink node: head {peer}: {e}"),
        };
        let me = self.clone();
        let loaded = tokio::task::spawn_blocking(move || me.load(&assign)).await.unwrap_or_else(|e| Err(format!("loading panicked: {e}")));
        let (windows, route, streamer) = match loaded {
            Ok(l) => l,
            Err(reason) => {
                eprintln!("blink node: refused the assignment of head {peer}: {reason}");
                return w.refuse(&reason).await;
            }
        };
        if let Err(e) = w.send(&Message::Ready).await {
            return eprintln!("blink node: head {peer}: {e}");
        }
        let layers: Vec<_> = windows.layers().collect();
        let how = match &streamer {
            Some(s) => format!("{} of {} windows resident, the others streamed from the file, {:.1} MiB a pass", s.n_kept(), s.n_windows(), s.streamed_bytes() as f64 / (1 << 20) as f64),
            None => "resident".to_string(),
        };
        eprintln!("blink node: head {peer} assigned layers {layers:?} ({how})");
        let (work, work_rx) = tmpsc::unbounded_channel();
        let _ = self.out.send(Outgoing::Head { writer: w, conn, addrs: route.addrs.clone() });
        let (out, frames) = (self.out.clone(), self.frames.clone());
        let spawned = std::thread::Builder::new().name("blink-node-compute".into()).spawn(move || compute::run(windows, route, streamer, work_rx, out, frames));
        if let Err(e) = spawned {
            return eprintln!("blink node: cannot start the compute thread: {e}");
        }
        self.assign(|a| *a = Some(Assigned { head_conn: conn, work }));
        let mut r = Incoming::new(r, self.opts.shim);
        let mut queue = WorkQueue::default();
        loop {
            match r.read().await {
                Ok(Message::Step(frame)) => self.submit(&mut queue, frame),
                Ok(m @ (Message::AdapterLayer(_) | Message::AdapterPlace { .. } | Message::AdapterDrop { .. })) => {
                    // With no assignment there is nothing to place it on (nor to ask for it).
                    self.give(&mut queue, Work::Adapter(m));
                }
                Ok(Message::Ping { at }) => {
                    let _ = self.out.send(Outgoing::Send(Dest::Head, Message::Pong { at }));
                }
                Ok(m) => eprintln!("blink node: head {peer} sent {}; ignored", m.name()),
                Err(e) => {
                    eprintln!("blink node: head {peer}: {e}; dropping its assignment");
                    break;
                }
            }
        }
        self.assign(|a| {
            if a.as_ref().is_some_and(|a| a.head_conn == conn) {
                *a = None;
            }
        });
    }

    /// Change the assignment with `change`. Any change of head (a new one, none, another)
    /// moves the generation on, so connections take the queue again at their next step;
    /// the compute thread of an assignment replaced or cleared is told to end once it has
    /// run what it was given.
    fn assign(&self, change: impl FnOnce(&mut Option<Assigned>)) {
        let mut assigned = self.assigned.lock().unwrap_or_else(|e| e.into_inner());
        let before = assigned.as_ref().map(|a| (a.head_conn, a.work.clone()));
        change(&mut assigned);
        let after = assigned.as_ref().map(|a| a.head_conn);
        if before.as_ref().map(|b| b.0) != after {
            self.generation.fetch_add(1, Ordering::AcqRel);
            if let Some((_, old)) = before {
                let _ = old.send(Work::End);
            }
        }
    }

    /// A peer's connection: steps passed on round the ring.
    async fn peer(self: Arc<Self>, r: FrameReader, peer: &str) {
        let mut r = Incoming::new(r, self.opts.shim);
        let mut queue = WorkQueue::default();
        loop {
            match r.read().await {
                Ok(Message::Step(frame)) => self.submit(&mut queue, frame),
                Ok(m) => eprintln!("blink node: peer {peer} sent {}; ignored", m.name()),
                Err(link::LinkError::Closed) => return,
                Err(e) => return eprintln!("blink node: peer {peer}: {e}; closing its connection"),
            }
        }
    }

    /// A prober's connection: its pings and steps straight back (through this node's
    /// shim, as a step's hop would come).
    async fn probe(self: Arc<Self>, r: FrameReader, mut w: FrameWriter) {
        let mut r = Incoming::new(r, self.opts.shim);
        while let Ok(m) = r.read().await {
            let back = match m {
                Message::Ping { at } => Message::Pong { at },
                m @ Message::Step(_) => m,
                _ => return,
            };
            if w.send(&back).await.is_err() {
                return;
            }
            self.frames.recycle(back);
        }
    }

    fn submit(&self, queue: &mut WorkQueue, frame: StepFrame) {
        let id = frame.id;
        if !self.give(queue, Work::Step(frame)) {
            let _ = self.out.send(Outgoing::Send(Dest::Head, Message::Failed { id, reason: "this node has no assignment".into() }));
        }
    }

    /// Hand `work` to the compute thread of the current assignment, through `queue`
    /// (taken again if the assignment changed); false if there is none.
    fn give(&self, queue: &mut WorkQueue, work: Work) -> bool {
        let generation = self.generation.load(Ordering::Acquire);
        if queue.generation != generation {
            let assigned = self.assigned.lock().unwrap_or_else(|e| e.into_inner());
            *queue = WorkQueue { generation, work: assigned.as_ref().map(|a| a.work.clone()) };
        }
        queue.work.as_ref().is_some_and(|w| w.send(work).is_ok())
    }

    /// Check an assignment and load its windows.
    fn load(&self, a: &Assign) -> Result<(Windows, compute::Route, Option<Streamer>), String> {
        if a.model_sha256 != self.sha256 {
            return Err(format!(
                "model hash mismatch: this node's {} has sha256 {}, the head's model {}",
                self.opts.model.display(),
                auth::hex(&self.sha256),
                auth::hex(&a.model_sha256)
            ));
        }
        let n = a.windows.len();
        if a.addrs.len() != n || a.me as usize >= n || a.head.is_some_and(|h| h as usize >= n || h == a.me) {
            return Err(format!("an assignment of {n} windows, {} addresses, this node at {} and the head at {:?} is not a ring", a.addrs.len(), a.me, a.head));
        }
        let ring = Ring::new(a.windows.iter().map(|&w| w as usize).collect(), a.rounds as usize).map_err(|e| e.to_string())?;
        if ring.n_layers() != self.n_layers {
            return Err(format!("the ring runs {} layers, the model has {}", ring.n_layers(), self.n_layers));
        }
        let me = a.me as usize;
        let windows = ring.device_windows(me);
        if windows.is_empty() {
            return Err("this node holds no window in the assignment".into());
        }
        if a.max_rows == 0 || a.max_ctx == 0 {
            return Err("an assignment with no room for rows or positions".into());
        }
        let threads = if a.threads > 0 { a.threads as usize } else { self.opts.threads };
        let kv_type = if a.kv_f32 { KvType::F32 } else { KvType::F16 };
        // Over the budget, the windows stay in the file's map and are streamed.
        let budget = Budget::of(&self.file, &windows, self.kv_per_layer_token * kv_type.bytes(), a.kv_tokens as usize, a.memory);
        let streamed = budget.streams();
        let matrices = if streamed { Matrices::Streamed } else { Matrices::Repacked };
        let model = Model::from_gguf_share(self.file.clone(), &TensorPlacement::flat(threads), Share::windows(windows.clone(), matrices)).map_err(|e| e.to_string())?;
        let model = Arc::new(model);
        let sizes = RunnerConfig { threads, kv_tokens: a.kv_tokens as usize, kv_type, max_rows: a.max_rows as usize, max_logit_rows: 1, max_ctx: a.max_ctx as usize, swa_full: false, detached: false };
        let streamer = streamed.then(|| Streamer::new(self.file.clone(), model.clone(), &windows, budget.for_weights(), self.opts.force_prefetch));
        let mut streamer = streamer;
        if let Some(s) = &mut streamer {
            // Whatever loading touched goes back (the first window is filled when the
            // compute thread starts).
            for w in 0..s.n_windows() {
                // SAFETY: no step runs before the compute thread starts, and it fills
                // the first window before any.
                unsafe { s.release(w) };
            }
        }
        let windows = Windows::new(model, &windows, &sizes)?;
        let route = compute::Route { ring, me, head: a.head.map(|h| h as usize), addrs: a.addrs.clone() };
        Ok((windows, route, streamer))
    }
}
