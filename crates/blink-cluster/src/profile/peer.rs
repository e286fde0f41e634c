//! A link to a peer, measured over the ring's own protocol: half the median round trip
//! of a ping (its latency), and the extra time a large step takes there and back (its
//! bandwidth), so the planner sees what a hop costs, software included.

use std::time::{Duration, Instant};

use crate::auth::Token;
use crate::link::{self, Incoming, Shim};
use crate::wire::{Message, Role, StepFrame, MAX_PAYLOAD};

use super::PeerLink;

/// Round trips of each kind.
const TRIPS: usize = 9;
/// Values of the large step (1 MiB).
const BIG: usize = 1 << 18;

/// Measure the link to the `blink node` at `addr` (`shim`: the one this process's own
/// incoming frames pass, as a head's would).
pub fn measure(addr: &str, token: &Token, shim: Shim) -> Result<PeerLink, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let (r, mut w) = link::connect(addr, token, Role::Probe, MAX_PAYLOAD).await.map_err(|e| format!("{addr}: {e}"))?;
        let mut r = Incoming::new(r, shim);
        let mut small = Vec::with_capacity(TRIPS);
        let mut big = Vec::with_capacity(TRIPS);
        let big_step = Message::Step(StepFrame { hidden: vec![0.5; BIG], ..StepFrame::default() });
        for i in 0..2 * TRIPS {
            let (msg, into) = if i < TRIPS { (Message::Ping { at: i as u64 }, &mut small) } else { (big_step.clone(), &mut big) };
            let sent = Instant::now();
            w.send(&msg).await.map_err(|e| format!("{addr}: {e}"))?;
            let back = tokio::time::timeout(Duration::from_secs(30), r.read()).await.map_err(|_| format!("{addr}: no answer in 30 s"))?;
            back.map_err(|e| format!("{addr}: {e}"))?;
            into.push(sent.elapsed().as_secs_f64());
        }
        let (small, big) = (median(&mut small), median(&mut big));
        // There and back: the step's bytes cross the link twice.
        let bytes = 2.0 * (BIG * 4) as f64;
        Ok(PeerLink { addr: addr.to_string(), latency_s: small / 2.0, bytes_per_s: bytes / (big - small).max(1e-6) })
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
