//! The head's connections: one per device with a window, each with a writer task fed by
//! a queue, a reader task passing frames on as events (or the device's loss), and a
//! pinger that keeps a quiet device answering.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use crate::wire::FramePool;

use super::{Event, Health, RingSpec, PING_EVERY, SILENCE};
use crate::auth::Token;
use crate::link::{self, Incoming, LinkError};
use crate::wire::{Assign, Message, Role, MAX_PAYLOAD};
use blink_engine::RunnerConfig;

/// How long a device may take to load its windows after its assignment.
const LOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Connect to and assign every device with a window; the queues to write to them. The
/// connections' tasks mark `health` down (as of their generation) when a device is lost.
/// Steps are read into frames from `frames`, and given back to it once written.
pub(super) async fn all(spec: &RingSpec, token: &Token, sizes: &RunnerConfig, events: UnboundedSender<Event>, health: (Arc<Health>, u64), frames: &FramePool) -> Result<Vec<Option<UnboundedSender<Message>>>, String> {
    let ring = &spec.ring;
    let mut senders = Vec::with_capacity(ring.windows().len());
    let started = Instant::now();
    for (d, &w) in ring.windows().iter().enumerate() {
        if Some(d) == spec.head || w == 0 {
            senders.push(None);
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
            memory: spec.memory.get(d).copied().unwrap_or(0),
        };
        let connected = async {
            let (mut r, mut w) = link::connect(addr, token, Role::Head, MAX_PAYLOAD).await?;
            w.send(&Message::Assign(assign)).await?;
            match r.read_within(LOAD_TIMEOUT).await? {
                Message::Ready => Ok((r, w)),
                Message::Refused { reason } => Err(LinkError::Refused(reason)),
                m => Err(LinkError::Unexpected { got: m.name(), want: "ready" }),
            }
        };
        let (mut r, mut w) = connected.await.map_err(|e| format!("device {} at {addr}: {e}", d + 1))?;
        r.set_pool(frames.clone());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Message>();
        // A lost device: the event for the head's steps, and the mark for `/health`.
        let lose = {
            let (events, (health, generation), addr) = (events.clone(), health.clone(), addr.clone());
            move |e: String| {
                health.lose(generation, format!("lost device {} at {addr}: {e}", d + 1));
                let _ = events.send(Event::Lost(d, e));
            }
        };
        let (lost, sent) = (lose.clone(), frames.clone());
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if let Err(e) = w.send(&m).await {
                    return lost(e.to_string());
                }
                sent.recycle(m);
            }
        });
        let (events, shim) = (events.clone(), spec.shim);
        tokio::spawn(async move {
            let mut r = Incoming::new(r, shim);
            loop {
                let m = match tokio::time::timeout(SILENCE, r.read()).await {
                    Ok(Ok(Message::Pong { .. })) => continue,
                    Ok(Ok(m)) => m,
                    Ok(Err(e)) => return lose(e.to_string()),
                    Err(_) => return lose(format!("silent for {SILENCE:?}")),
                };
                if events.send(Event::Frame(m)).is_err() {
                    return;
                }
            }
        });
        // The pinger holds the queue weakly: once the head lets go of a connection (lost,
        // or replaced when the ring is joined again) its writer ends.
        let ping = tx.downgrade();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(PING_EVERY);
            loop {
                every.tick().await;
                let at = started.elapsed().as_micros() as u64;
                match ping.upgrade() {
                    Some(tx) if tx.send(Message::Ping { at }).is_ok() => {}
                    _ => return,
                }
            }
        });
        senders.push(Some(tx));
    }
    Ok(senders)
}

/// Whether the device at `addr` answers and proves the token (a peer's handshake, then
/// gone).
pub(super) async fn probe(addr: &str, token: &Token) -> bool {
    link::connect(addr, token, Role::Peer, MAX_PAYLOAD).await.is_ok()
}
