//! Streaming a generation as server-sent events.
//!
//! A task on the runtime reads the generation and writes `data: {...}` events into the
//! response body's channel. When the client goes away the body (and its channel) is
//! dropped; the task notices at once, stops, and drops the generation, which cancels the
//! request in the engine.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;

use crate::body::ChannelBody;
use crate::generate::{End, Generation, Piece};
use crate::openai::response::{sse, SSE_DONE};

/// How one endpoint renders its stream.
pub trait StreamShape: Send + 'static {
    /// Events sent before any token (chat's role chunk).
    fn opening(&self) -> Vec<Value>;
    /// The event for a piece of text (`None`: nothing to send).
    fn piece(&self, gen: &Generation, piece: &Piece) -> Option<Value>;
    /// The closing events (finish reason, usage).
    fn closing(&self, end: &End) -> Vec<Value>;
}

/// Start streaming `gen` and return the SSE response.
pub fn respond(mut gen: Generation, shape: impl StreamShape) -> Response {
    let (tx, body) = ChannelBody::new(64);
    tokio::spawn(async move {
        for event in shape.opening() {
            if tx.send(sse(&event)).await.is_err() {
                return;
            }
        }
        loop {
            let step = tokio::select! {
                biased;
                _ = tx.closed() => return,
                step = gen.next() => step,
            };
            match step {
                Ok(Some(piece)) => {
                    if let Some(event) = shape.piece(&gen, &piece) {
                        if tx.send(sse(&event)).await.is_err() {
                            return;
                        }
                    }
                    if let Some(end) = piece.end {
                        for event in shape.closing(&end) {
                            if tx.send(sse(&event)).await.is_err() {
                                return;
                            }
                        }
                        let _ = tx.send(Bytes::from_static(SSE_DONE)).await;
                        return;
                    }
                }
                Ok(None) => {
                    let _ = tx.send(Bytes::from_static(SSE_DONE)).await;
                    return;
                }
                Err(e) => {
                    // The status line has gone out: report the error as an event, as OpenAI does.
                    let _ = tx.send(sse(&e.body())).await;
                    return;
                }
            }
        }
    });
    let mut resp = Response::new(Body::new(body));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
