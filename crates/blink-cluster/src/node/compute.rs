//! A node's compute thread: steps in, each run over the window it enters, and out to
//! whoever holds the next layer; and the head's adapters, placed between steps.

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::adapters::NodeAdapters;
use super::router::{Dest, Outgoing};
use crate::placement::Ring;
use crate::stream::Streamer;
use crate::wire::{FramePool, Message, StepFrame};
use crate::windows::Windows;

/// What the compute thread is given.
pub enum Work {
    Step(StepFrame),
    /// An adapter's layer, its placement or its drop, from the head.
    Adapter(Message),
    /// The assignment is over: the work queued before this has run; the thread ends, and
    /// work queued after it is dropped.
    End,
}

impl Work {
    /// The first layer of the step, if it is one.
    fn step_layer(&self) -> Option<usize> {
        match self {
            Work::Step(f) => Some(f.first_layer as usize),
            Work::Adapter(_) | Work::End => None,
        }
    }
}

/// Where a node sits in its ring.
pub struct Route {
    pub ring: Ring,
    pub me: usize,
    pub head: Option<usize>,
    pub addrs: Vec<String>,
}

impl Route {
    /// Who runs layer `layer` next: the head after the last layer or on its own windows,
    /// this node (`None`), or another device.
    pub fn next(&self, layer: usize) -> Option<Dest> {
        match self.ring.place(layer) {
            None => Some(Dest::Head),
            Some(p) if Some(p.device) == self.head => Some(Dest::Head),
            Some(p) if p.device == self.me => None,
            Some(p) => Some(Dest::Device(p.device)),
        }
    }
}

/// Run steps until the node's assignment ends. With a `streamer`, each window's weights
/// are given back once it has run (after its output is sent, for the last window a step
/// runs here) and the next window is read ahead, unless a step already waiting (several
/// in flight) enters the same window. A step that fails goes back to `frames`.
pub fn run(mut windows: Windows, route: Route, mut streamer: Option<Streamer>, mut work: UnboundedReceiver<Work>, out: UnboundedSender<Outgoing>, frames: FramePool) {
    let first = windows.layers().next().map_or(0, |w| w.start);
    if let Some(s) = &mut streamer {
        // SAFETY: steps run on this thread only, and none is running.
        unsafe { s.start() };
    }
    let mut adapters = NodeAdapters::default();
    // Work taken from the queue early, to see which window a step enters.
    let mut waiting: Option<Work> = None;
    while let Some(item) = waiting.take().or_else(|| work.blocking_recv()) {
        let mut frame = match item {
            Work::Step(frame) => frame,
            Work::Adapter(m) => {
                adapter_work(&mut adapters, &windows, m, &out);
                continue;
            }
            Work::End => return end(work),
        };
        let id = frame.id;
        let mut ran = None;
        let result = loop {
            let mixes = match adapters.mixes(&frame.mixes) {
                Ok(m) => m,
                Err(e) => break Err(e),
            };
            if frame.first_layer as usize == first {
                if let Err(e) = windows.apply(&frame.ops) {
                    break Err(e);
                }
            }
            if let (Some(s), Some(w)) = (&mut streamer, windows.find(frame.first_layer as usize)) {
                // SAFETY: as above.
                unsafe { s.ensure(w) };
            }
            match windows.run_frame(&mut frame, mixes) {
                Ok(w) => ran = Some(w),
                Err(e) => break Err(e),
            }
            match route.next(frame.first_layer as usize) {
                Some(dest) => break Ok(dest),
                None => {
                    // The next window is this node's too.
                    if let (Some(s), Some(w)) = (&mut streamer, ran.take()) {
                        // SAFETY: as above: between steps, on the thread that runs them.
                        unsafe { s.done(w) };
                    }
                }
            }
        };
        match result {
            Ok(dest) => {
                let _ = out.send(Outgoing::Send(dest, Message::Step(frame)));
            }
            Err(reason) => {
                frames.give(frame);
                let _ = out.send(Outgoing::Send(Dest::Head, Message::Failed { id, reason }));
            }
        }
        if let (Some(s), Some(w)) = (&mut streamer, ran) {
            waiting = work.try_recv().ok();
            if waiting.as_ref().and_then(Work::step_layer).and_then(|l| windows.find(l)) != Some(w) {
                // SAFETY: as above.
                unsafe { s.done(w) };
            }
        }
    }
}

/// The assignment is over (its head gone or replaced): nothing more may be queued, and
/// what came after the end (a connection's step sent before it took the new queue) is
/// the old head's, dropped with the queue.
fn end(mut work: UnboundedReceiver<Work>) {
    work.close();
}

/// An adapter's layer kept, an adapter placed (answering the head either way) or dropped.
fn adapter_work(adapters: &mut NodeAdapters, windows: &Windows, m: Message, out: &UnboundedSender<Outgoing>) {
    let model = windows.model();
    match m {
        Message::AdapterLayer(layer) => {
            let id = layer.adapter;
            if let Err(error) = adapters.receive(model, *layer) {
                let _ = out.send(Outgoing::Send(Dest::Head, Message::AdapterPlaced { adapter: id, error }));
            }
        }
        Message::AdapterPlace { adapter, alpha, rslora } => {
            let error = adapters.place(model, adapter, alpha, rslora).err().unwrap_or_default();
            if error.is_empty() {
                eprintln!("blink node: placed adapter {adapter}");
            } else {
                eprintln!("blink node: {error}");
            }
            let _ = out.send(Outgoing::Send(Dest::Head, Message::AdapterPlaced { adapter, error }));
        }
        Message::AdapterDrop { adapter } => {
            adapters.drop(adapter);
            eprintln!("blink node: let go of adapter {adapter}");
        }
        m => eprintln!("blink node: {} is not adapter work; ignored", m.name()),
    }
}
