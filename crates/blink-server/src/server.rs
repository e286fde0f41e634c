//! The listening socket and connection handling.
//!
//! Our own accept loop (rather than `axum::serve`) so each HTTP/1 connection gets a header
//! read timeout: a client that opens a connection and trickles its headers (slowloris) is
//! closed after `header_timeout` without holding anything else up. Bodies have their own
//! deadline (see `body`). Shutdown stops accepting, lets in-flight requests finish for a
//! grace period, then returns.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::routes::router;
use crate::state::{App, AppState, ModelOptions, Ready, ServerOptions};

/// A running server.
pub struct Server {
    addr: SocketAddr,
    app: App,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Server {
    /// Bind `addr` and start answering at once; model endpoints say 503 until
    /// [`Server::set_ready`]. Must be called inside a tokio runtime.
    pub async fn bind(addr: impl ToSocketAddrs, opts: ServerOptions) -> io::Result<Server> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app: App = Arc::new(AppState::new(opts).map_err(io::Error::other)?);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, app.clone(), stopped));
        Ok(Server { addr, app, stop, task })
    }

    /// Bind, then load the model (off the async threads) and start serving it.
    pub async fn start(addr: impl ToSocketAddrs, opts: ServerOptions, model: ModelOptions) -> Result<Server, String> {
        let server = Server::bind(addr, opts).await.map_err(|e| format!("cannot listen: {e}"))?;
        let app = server.app.clone();
        let ready = tokio::task::spawn_blocking(move || app.load(&model))
            .await
            .map_err(|e| format!("loading the model failed: {e}"))??;
        server.set_ready(ready);
        Ok(server)
    }

    /// The bound address (the real port when bound to port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shared state (options, metrics, the loaded model).
    pub fn app(&self) -> &App {
        &self.app
    }

    /// Start serving a loaded model (load it with [`AppState::load`](crate::state::AppState::load)
    /// to have the server's fine-tuning jobs start with it).
    pub fn set_ready(&self, ready: Ready) {
        self.app.set_ready(ready);
    }

    /// Stop accepting, give in-flight requests the grace period, and return.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn accept_loop(listener: TcpListener, app: App, mut stopped: watch::Receiver<bool>) {
    let service = TowerToHyperService::new(router(app.clone()));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(app.opts.header_timeout).keep_alive(true);
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            _ = stopped.changed() => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                if !is_connection_error(&e) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(stream), service.clone());
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(app.opts.shutdown_grace, graceful.shutdown()).await;
}

/// Errors about one connection (the listener itself is fine).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset)
}
