//! Spare step frames. A frame that has been sent (or has left the ring at the head) is
//! given back with its buffers, and the next frame read or built takes it, so once a
//! ring is warm a hop allocates nothing: the rows, cache commands, mixes and hidden
//! states are decoded into vectors that already have room.

use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use super::{Message, StepFrame};

/// How many spare frames a pool keeps; more are dropped. A device holds at most one
/// frame per step in flight on each of its connections.
const SPARES: usize = 64;

/// A process's spare frames, shared by its connections' readers and writers (cloning
/// shares the pool). The default pool keeps nothing (a connection's own until it is
/// given its process's): it hands out new frames and drops the ones given back.
#[derive(Clone, Default)]
pub struct FramePool(Option<Arc<ArrayQueue<StepFrame>>>);

impl FramePool {
    /// A pool that keeps up to 64 spare frames.
    pub fn new() -> FramePool {
        FramePool(Some(Arc::new(ArrayQueue::new(SPARES))))
    }

    /// A spare frame (its fields hold whatever it last carried), or a new empty one.
    pub fn take(&self) -> StepFrame {
        self.0.as_ref().and_then(|q| q.pop()).unwrap_or_default()
    }

    /// `frame`'s buffers, for a later frame.
    pub fn give(&self, frame: StepFrame) {
        // A full pool has spares enough: this one is dropped.
        if let Some(q) = &self.0 {
            let _ = q.push(frame);
        }
    }

    /// A sent message's buffers, if it was a step.
    pub fn recycle(&self, msg: Message) {
        if let Message::Step(frame) = msg {
            self.give(frame);
        }
    }

    /// Spare frames held now.
    pub fn spares(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }
}
