//! Where a node's outgoing frames go: back to its head on the head's own connection, or
//! on to another device on a connection this node opens (as a peer, with the token's
//! proof) the first time it needs it. A sent step's frame goes back to the node's pool.

use std::collections::HashMap;

use tokio::sync::mpsc::UnboundedReceiver;

use crate::auth::Token;
use crate::link::{self, FrameWriter};
use crate::wire::{FramePool, Message, Role, MAX_PAYLOAD};

/// Where a frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    Head,
    Device(usize),
}

pub enum Outgoing {
    /// A new head: frames for the head go to `writer` from now on, and devices are at
    /// `addrs` (connections to the old ones are dropped).
    Head { writer: FrameWriter, conn: u64, addrs: Vec<String> },
    Send(Dest, Message),
}

pub async fn run(mut rx: UnboundedReceiver<Outgoing>, token: Token, frames: FramePool) {
    let mut head: Option<(FrameWriter, u64)> = None;
    let mut addrs: Vec<String> = Vec::new();
    let mut peers: HashMap<usize, FrameWriter> = HashMap::new();
    while let Some(item) = rx.recv().await {
        match item {
            Outgoing::Head { writer, conn, addrs: a } => {
                head = Some((writer, conn));
                addrs = a;
                peers.clear();
            }
            Outgoing::Send(Dest::Head, msg) => {
                if let Some((w, conn)) = head.as_mut() {
                    if let Err(e) = w.send(&msg).await {
                        eprintln!("blink node: cannot reach head connection {conn}: {e}");
                        head = None;
                    }
                }
                frames.recycle(msg);
            }
            Outgoing::Send(Dest::Device(d), msg) => {
                if let Err(reason) = send_to_device(&mut peers, &addrs, &token, d, &msg).await {
                    eprintln!("blink node: {reason}");
                    peers.remove(&d);
                    if let (Some((w, _)), Message::Step(frame)) = (head.as_mut(), &msg) {
                        let _ = w.send(&Message::Failed { id: frame.id, reason }).await;
                    }
                }
                frames.recycle(msg);
            }
        }
    }
}

async fn send_to_device(peers: &mut HashMap<usize, FrameWriter>, addrs: &[String], token: &Token, d: usize, msg: &Message) -> Result<(), String> {
    let addr = addrs.get(d).filter(|a| !a.is_empty()).ok_or_else(|| format!("the ring has no device {d} to pass a step to"))?;
    if let std::collections::hash_map::Entry::Vacant(slot) = peers.entry(d) {
        let (mut r, w) = link::connect(addr, token, Role::Peer, MAX_PAYLOAD).await.map_err(|e| format!("cannot reach device {d} at {addr}: {e}"))?;
        // Nothing comes back on a peer connection but a refusal or its end.
        let addr_owned = addr.clone();
        tokio::spawn(async move {
            match r.read().await {
                Err(link::LinkError::Closed) => {}
                Ok(m) => eprintln!("blink node: device at {addr_owned} sent {}; closing", m.name()),
                Err(e) => eprintln!("blink node: device at {addr_owned}: {e}"),
            }
        });
        slot.insert(w);
    }
    let w = peers.get_mut(&d).expect("connected above");
    w.send(msg).await.map_err(|e| format!("cannot pass a step to device {d} at {addr}: {e}"))
}
