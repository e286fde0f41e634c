//! The head's adapters on the devices: sent before the first step that uses them, each
//! device's layers only, and let go once nothing holds them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blink_model::lora::{LoraAdapter, LoraMix};

use super::{Event, RingHead};
use crate::wire::{AdapterLayer, Message};

/// How long the devices may take to place an adapter sent to them.
const PLACE_TIMEOUT: Duration = Duration::from_secs(60);

impl RingHead {
    /// Send the devices the adapters of `mixes` they do not hold, and wait until every
    /// one has placed them. Frames of steps in flight that come meanwhile are kept for
    /// [`RingHead::wait`].
    pub(super) fn ship_adapters(&mut self, mixes: &[Arc<LoraMix>]) -> Result<(), String> {
        let mut new: Vec<&Arc<LoraAdapter>> = Vec::new();
        for (a, _) in mixes.iter().flat_map(|m| m.adapters()) {
            if !self.shipped.contains_key(&a.id()) && !new.iter().any(|n| n.id() == a.id()) {
                new.push(a);
            }
        }
        if new.is_empty() {
            return Ok(());
        }
        let cfg = &self.windows.model().cfg;
        let mut owed = 0;
        for (d, tx) in self.senders.iter().enumerate() {
            let Some(tx) = tx else { continue };
            let lost = || format!("lost device {} at {}", d + 1, self.spec.addrs[d]);
            for a in &new {
                for layer in self.spec.ring.device_windows(d).into_iter().flatten() {
                    let pairs = a.pairs(cfg, layer);
                    if pairs.iter().any(Option::is_some) {
                        tx.send(Message::AdapterLayer(Box::new(AdapterLayer { adapter: a.id(), layer: layer as u32, pairs }))).map_err(|_| lost())?;
                    }
                }
                tx.send(Message::AdapterPlace { adapter: a.id(), alpha: a.alpha(), rslora: a.rslora() }).map_err(|_| lost())?;
                owed += 1;
            }
        }
        let deadline = Instant::now() + PLACE_TIMEOUT;
        while owed > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            let (rt, events) = (&self.rt, &mut self.events);
            // The timer is made inside the runtime, which it needs.
            match rt.block_on(async { tokio::time::timeout(left, events.recv()).await }) {
                Ok(Some(Event::Frame(Message::AdapterPlaced { adapter, error }))) if new.iter().any(|a| a.id() == adapter) => {
                    if !error.is_empty() {
                        return Err(format!("a device could not place an adapter: {error}"));
                    }
                    owed -= 1;
                }
                Ok(Some(Event::Lost(d, e))) => return Err(format!("lost device {} at {}: {e}", d + 1, self.spec.addrs[d])),
                Ok(Some(event)) => self.early.push_back(event),
                Err(_) => return Err(format!("the devices did not place an adapter within {PLACE_TIMEOUT:?}")),
                Ok(None) => return Err("the ring's connections are gone".into()),
            }
        }
        for a in new {
            self.shipped.insert(a.id(), Arc::downgrade(a));
        }
        Ok(())
    }

    /// Tell the devices to let go of the adapters nothing here holds any more (no request
    /// uses them, no step in flight carries them).
    pub(super) fn drop_unused_adapters(&mut self) {
        let senders = &self.senders;
        self.shipped.retain(|&adapter, held| {
            let live = held.strong_count() > 0;
            if !live {
                for tx in senders.iter().flatten() {
                    let _ = tx.send(Message::AdapterDrop { adapter });
                }
            }
            live
        });
    }
}
