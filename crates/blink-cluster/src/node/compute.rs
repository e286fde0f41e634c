//! A node's compute thread: steps in, each run over the window it enters, and out to
//! whoever holds the next layer.

use std::sync::mpsc::Receiver;

use tokio::sync::mpsc::UnboundedSender;

use super::router::{Dest, Outgoing};
use crate::placement::Ring;
use crate::wire::{Message, StepFrame};
use crate::windows::Windows;

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

pub fn run(mut windows: Windows, route: Route, work: Receiver<StepFrame>, out: UnboundedSender<Outgoing>) {
    let first = windows.layers().next().map_or(0, |w| w.start);
    while let Ok(mut frame) = work.recv() {
        let id = frame.id;
        match run_here(&mut windows, &route, first, &mut frame) {
            Ok(dest) => {
                let _ = out.send(Outgoing::Send(dest, Message::Step(frame)));
            }
            Err(reason) => {
                let _ = out.send(Outgoing::Send(Dest::Head, Message::Failed { id, reason }));
            }
        }
    }
}

/// Run the frame over this node's windows until it leaves the node; where it goes next.
fn run_here(windows: &mut Windows, route: &Route, first: usize, frame: &mut StepFrame) -> Result<Dest, String> {
    loop {
        if frame.first_layer as usize == first {
            windows.apply(&frame.ops)?;
        }
        windows.run_frame(frame)?;
        if let Some(dest) = route.next(frame.first_layer as usize) {
            return Ok(dest);
        }
    }
}
