//! A small HTTP/1.1 client with server-sent-event reading, on hyper and tokio.
//!
//! One connection per request (no pooling): enough for `blink bench-serve` and the tests,
//! and it keeps every request's timing independent. A server that goes silent for
//! [`IDLE`] fails the request rather than hanging the client.

use axum::http::{header, HeaderMap, Method, Request};
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// Longest wait for a connection, an answer, a whole plain body, or the next piece of a
/// stream.
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// `fut`, or an error naming `what` if it takes longer than [`IDLE`].
async fn within<T>(what: &str, fut: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    within_limit(IDLE, what, fut).await
}

async fn within_limit<T>(limit: std::time::Duration, what: &str, fut: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| Err(format!("{what}: no answer in {:.0?}", limit)))
}

/// Where a server is: `http://HOST:PORT[/PREFIX]`.
#[derive(Clone, Debug)]
pub struct Client {
    host: String,
    prefix: String,
    api_key: Option<String>,
}

/// A whole response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl HttpResponse {
    /// The body parsed as JSON.
    pub fn json(&self) -> Result<Value, String> {
        serde_json::from_slice(&self.body).map_err(|e| format!("response is not JSON ({e}): {}", self.text()))
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A streamed response read event by event.
pub struct EventStream {
    pub status: u16,
    body: Incoming,
    buf: BytesMut,
    ended: bool,
}

impl EventStream {
    /// The `data` of the next event; `Ok(None)` when the body ends.
    pub async fn next_event(&mut self) -> Result<Option<String>, String> {
        loop {
            if let Some((at, sep)) = find_event_end(&self.buf) {
                let raw = self.buf.split_to(at);
                self.buf.advance(sep);
                let text = std::str::from_utf8(&raw).map_err(|_| "an event is not UTF-8".to_string())?;
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue; // a comment or an event with no data
                }
                return Ok(Some(data.join("\n")));
            }
            if self.ended {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                return Err(format!("the stream ended inside an event: {:?}", String::from_utf8_lossy(&self.buf)));
            }
            let frame = within("reading the stream", async { Ok(self.body.frame().await) }).await?;
            match frame {
                None => self.ended = true,
                Some(Err(e)) => return Err(format!("reading the stream failed: {e}")),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// Where the first event ends, and the separator's length.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

impl Client {
    /// A client for the server at `base` (`http://HOST:PORT`, optionally with a path prefix).
    pub fn new(base: &str) -> Result<Client, String> {
        let rest = base.strip_prefix("http://").ok_or_else(|| format!("'{base}': only http:// URLs are supported"))?;
        let (host, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if host.is_empty() {
            return Err(format!("'{base}': no host"));
        }
        let host = if host.contains(':') && !host.ends_with(']') { host.to_owned() } else { format!("{host}:80") };
        Ok(Client { host, prefix: prefix.to_owned(), api_key: None })
    }

    /// Send `Authorization: Bearer KEY` with every request.
    pub fn with_api_key(mut self, key: Option<String>) -> Client {
        self.api_key = key;
        self
    }

    async fn send(&self, method: Method, path: &str, body: Option<Bytes>) -> Result<hyper::Response<Incoming>, String> {
        self.send_typed(method, path, body.map(|b| ("application/json", b))).await
    }

    async fn send_typed(&self, method: Method, path: &str, body: Option<(&str, Bytes)>) -> Result<hyper::Response<Incoming>, String> {
        let connect = async { TcpStream::connect(&self.host).await.map_err(|e| format!("cannot connect to {}: {e}", self.host)) };
        let stream = within(&format!("connecting to {}", self.host), connect).await?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with {} failed: {e}", self.host))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder().method(method).uri(format!("{}{path}", self.prefix)).header(header::HOST, &self.host);
        if let Some(key) = &self.api_key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        if let Some((content_type, _)) = &body {
            req = req.header(header::CONTENT_TYPE, *content_type);
        }
        let req = req.body(Full::new(body.map(|(_, b)| b).unwrap_or_default())).map_err(|e| format!("bad request: {e}"))?;
        let answer = async { sender.send_request(req).await.map_err(|e| format!("request to {} failed: {e}", self.host)) };
        within(&format!("waiting for {}", self.host), answer).await
    }

    async fn whole(resp: hyper::Response<Incoming>) -> Result<HttpResponse, String> {
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = within("reading the response", async { resp.into_body().collect().await.map_err(|e| format!("reading the response failed: {e}")) })
            .await?
            .to_bytes();
        Ok(HttpResponse { status, headers, body })
    }

    pub async fn get(&self, path: &str) -> Result<HttpResponse, String> {
        Self::whole(self.send(Method::GET, path, None).await?).await
    }

    /// POST a raw body (sent as `application/json`, whatever it holds).
    pub async fn post_raw(&self, path: &str, body: impl Into<Bytes>) -> Result<HttpResponse, String> {
        Self::whole(self.send(Method::POST, path, Some(body.into())).await?).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Result<HttpResponse, String> {
        self.post_raw(path, body.to_string()).await
    }

    /// POST a body of the given content type (a multipart upload, say).
    pub async fn post_typed(&self, path: &str, content_type: &str, body: impl Into<Bytes>) -> Result<HttpResponse, String> {
        Self::whole(self.send_typed(Method::POST, path, Some((content_type, body.into()))).await?).await
    }

    /// Upload `content` as a fine-tuning file named `name` (`POST /v1/files`, multipart).
    pub async fn upload_file(&self, name: &str, content: &[u8]) -> Result<HttpResponse, String> {
        const BOUNDARY: &str = "blink-upload-7d1f0c";
        let mut body = format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/jsonl\r\n\r\n").into_bytes();
        body.extend_from_slice(content);
        body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
        self.post_typed("/v1/files", &format!("multipart/form-data; boundary={BOUNDARY}"), body).await
    }

    /// POST and read the answer as server-sent events. A non-200 answer is an error carrying
    /// the status and body.
    pub async fn stream(&self, path: &str, body: &Value) -> Result<EventStream, String> {
        let resp = self.send(Method::POST, path, Some(Bytes::from(body.to_string()))).await?;
        if resp.status() != 200 {
            let r = Self::whole(resp).await?;
            return Err(format!("HTTP {}: {}", r.status, r.text()));
        }
        Ok(EventStream { status: 200, body: resp.into_body(), buf: BytesMut::new(), ended: false })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_end_at_the_first_blank_line() {
        assert_eq!(find_event_end(b"data: a\n\ndata: b\n\n"), Some((7, 2)));
        assert_eq!(find_event_end(b"data: a\r\n\r\nx"), Some((7, 4)));
        assert_eq!(find_event_end(b"data: a\n"), None);
    }

    #[tokio::test]
    async fn a_silent_server_is_an_error_not_a_hang() {
        let limit = std::time::Duration::from_millis(20);
        let silent = within_limit(limit, "waiting", std::future::pending::<Result<(), String>>());
        assert_eq!(silent.await, Err("waiting: no answer in 20ms".to_string()));
        assert_eq!(within_limit(limit, "waiting", async { Ok(1) }).await, Ok(1));
    }

    #[test]
    fn urls() {
        let c = Client::new("http://127.0.0.1:8080/v1/").unwrap();
        assert_eq!((c.host.as_str(), c.prefix.as_str()), ("127.0.0.1:8080", "/v1"));
        assert_eq!(Client::new("http://localhost").unwrap().host, "localhost:80");
        assert!(Client::new("https://x").is_err() && Client::new("http://").is_err());
    }
}
