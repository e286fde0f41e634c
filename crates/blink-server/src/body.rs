//! Request and response bodies: reading a JSON request body under a size cap and a deadline,
//! and a streaming response body fed by a channel (server-sent events).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::error::ApiError;

/// Read the whole body (at most `limit` bytes, within `timeout`) and parse it as a JSON object.
pub async fn read_json(body: Body, limit: usize, timeout: Duration) -> Result<Map<String, Value>, ApiError> {
    let bytes = read_bytes(body, limit, timeout).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid("the request body is empty; expected a JSON object"));
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid("the request body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!("the request body is not valid JSON: {e}"))),
    }
}

/// Read the whole body, at most `limit` bytes, within `timeout`.
pub async fn read_bytes(body: Body, limit: usize, timeout: Duration) -> Result<Bytes, ApiError> {
    let collect = Limited::new(body, limit).collect();
    match tokio::time::timeout(timeout, collect).await {
        Err(_) => Err(ApiError::body_timeout()),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(limit)),
        Ok(Err(e)) => Err(ApiError { close: true, ..ApiError::invalid(format!("could not read the request body: {e}")) }),
    }
}

/// A response body whose chunks arrive on a channel; it ends when every sender is gone.
///
/// When the client goes away hyper drops the body, which closes the channel: the producer sees
/// `Sender::closed` and stops (dropping its engine submission cancels the request).
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    /// A body and the sender that feeds it (`depth` chunks may wait unsent).
    pub fn new(depth: usize) -> (mpsc::Sender<Bytes>, ChannelBody) {
        let (tx, rx) = mpsc::channel(depth.max(1));
        (tx, ChannelBody { rx })
    }
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}
