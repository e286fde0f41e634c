//! The head after a device is lost: join the planned ring again when every device is
//! back (a restarted node rejoins), else re-plan over the devices left (by the planner's
//! program when it chose the ring, else the lost ones' windows spread over the others in
//! proportion; the head reloads its own share if it changed).
//! Running on fewer devices, the head goes back to the planned ring at the first step
//! where no sequence is live on the devices, once the missing ones answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blink_engine::EngineError;
use blink_model::{Model, Share, TensorPlacement};

use super::{connect, RingHead, RingSpec};
use crate::windows::Windows;

/// How soon after a failed attempt the head tries to join its ring again.
const REJOIN_EVERY: Duration = Duration::from_secs(1);

impl RingHead {
    /// If the ring is down: at most once per [`REJOIN_EVERY`], join the planned ring, or
    /// re-plan over the devices that answer. Ok once steps can run.
    pub(super) fn rejoin(&mut self) -> Result<(), EngineError> {
        let Some(reason) = self.broken.clone() else { return Ok(()) };
        if self.last_rejoin.is_some_and(|t| t.elapsed() < REJOIN_EVERY) {
            return Err(EngineError::Remote(reason));
        }
        self.last_rejoin = Some(Instant::now());
        let planned = self.planned.clone();
        if self.adopt(&planned).is_ok() {
            eprintln!("blink: the ring is whole again");
            return Ok(());
        }
        let down = self.down(&planned);
        // The planner's program over the devices left, if it chose the ring; else the
        // lost windows shared out in proportion.
        let (ring, how) = match &planned.cluster {
            Some(c) => (c.without(&down).plan().ok().map(|p| p.ring), "by the planner"),
            None => (planned.ring.without(&down), "in proportion"),
        };
        let spec = ring.filter(|r| r.windows().iter().enumerate().any(|(d, &w)| w > 0 && Some(d) != planned.head));
        let Some(ring) = spec else {
            return Err(EngineError::Remote(format!("{reason} (no device with a window answers, or the others cannot hold the model: the ring cannot be re-planned)")));
        };
        let spec = RingSpec { ring, ..planned };
        match self.adopt(&spec) {
            Ok(()) => {
                let names: Vec<String> = down.iter().map(|&d| format!("device {} at {}", d + 1, spec.addrs[d])).collect();
                eprintln!("blink: re-planned the ring ({how}) without {}: windows {:?}, {} round(s)", names.join(", "), spec.ring.windows(), spec.ring.rounds());
                Ok(())
            }
            Err(e) => Err(EngineError::Remote(format!("{reason} (re-planning the ring: {e})"))),
        }
    }

    /// Running on fewer devices than planned with no sequence live on them: go back to the
    /// planned ring if every device answers (checked at most once per [`REJOIN_EVERY`]).
    pub(super) fn restore(&mut self) {
        if self.spec.ring == self.planned.ring || self.broken.is_some() || self.last_rejoin.is_some_and(|t| t.elapsed() < REJOIN_EVERY) {
            return;
        }
        self.last_rejoin = Some(Instant::now());
        let planned = self.planned.clone();
        if self.down(&planned).is_empty() && self.adopt(&planned).is_ok() {
            eprintln!("blink: every device is back: the planned ring runs again");
        }
    }

    /// The planned devices with windows that do not answer.
    fn down(&self, spec: &RingSpec) -> Vec<usize> {
        let token = &self.token;
        (0..spec.addrs.len())
            .filter(|&d| Some(d) != spec.head && spec.ring.windows()[d] > 0)
            .filter(|&d| !self.rt.block_on(connect::probe(&spec.addrs[d], token)))
            .collect()
    }

    /// Connect to `spec`'s devices and assign them; on success the head runs it, with its
    /// own windows reloaded if they changed (and every cache empty).
    fn adopt(&mut self, spec: &RingSpec) -> Result<(), String> {
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        let generation = self.health.next_generation();
        let senders = self.rt.block_on(connect::all(spec, &self.token, &self.sizes, tx, (self.health.clone(), generation), &self.frames))?;
        let own = |s: &RingSpec| s.head.map(|h| s.ring.device_windows(h)).unwrap_or_default();
        let windows = own(spec);
        let reload = windows != own(&self.spec);
        let model: Arc<Model> = if !reload {
            self.windows.model_arc()
        } else {
            let file = self.windows.model().file().clone();
            let memory = spec.head.and_then(|h| spec.memory.get(h).copied()).unwrap_or(0);
            let kv_bytes = 2 * self.windows.model().cfg.kv_dim() * self.sizes.kv_type.bytes();
            let matrices = super::own_matrices(&file, kv_bytes, self.sizes.kv_tokens, &windows, memory);
            let share = Share::windows(windows.clone(), matrices);
            Arc::new(Model::from_gguf_share(file, &TensorPlacement::flat(self.sizes.threads), share).map_err(|e| e.to_string())?)
        };
        if reload {
            self.streamer = super::own_streamer(&model, &windows, spec, &self.sizes);
        }
        let n = self.n_layers;
        let mut all = vec![0..0, n..n];
        all.extend(windows);
        self.windows = Windows::new(model, &all, &self.sizes)?;
        // The old connections' tasks end as their queues are let go.
        (self.senders, self.events) = (senders, events);
        self.spec = spec.clone();
        self.in_flight.clear();
        self.early.clear();
        self.shipped.clear();
        self.ops.clear();
        self.broken = None;
        self.health.set_whole();
        self.joined += 1;
        Ok(())
    }
}
