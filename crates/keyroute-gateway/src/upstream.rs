//! Connections to one worker: HTTP/1.1 keep-alive connections on hyper's low-level client, pooled
//! per worker.
//!
//! A proxy sends every request to an address it already chose, so the general client's machinery
//! (a pool keyed by scheme and authority, absolute URIs to parse, a connector to resolve) is work
//! done for nothing on every request. Here each worker owns a stack of idle connections: a request
//! takes one (or connects), sends on it, and the response body gives it back when it ends. A
//! request that a closed pooled connection could not send is handed back untouched and sent on a
//! fresh connection; connections idle for more than 4 s are not reused (servers close idle ones);
//! and a replayable request that fails on a pooled connection gets one more try on a fresh one to
//! the same worker (see `proxy::forward`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::body::ProxyBody;

/// Idle connections kept per worker.
const MAX_IDLE: usize = 256;

/// A connection idle longer than this is closed rather than reused: servers close idle
/// connections after their own keep-alive timeout (5 s for Apache httpd and Node.js), and a
/// request written just as the server closes is lost in flight.
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Why a request could not be sent.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be made (refused, unreachable, connect timeout): the worker never saw
    /// the request.
    Connect {
        /// The worker's address.
        addr: SocketAddr,
        /// Why.
        cause: ConnectError,
    },
    /// The gateway itself is out of file descriptors or memory: nobody's fault but its own, and
    /// never counted against the worker.
    Local {
        /// The worker's address.
        addr: SocketAddr,
        /// The error (`EMFILE`, `ENOMEM`...).
        error: std::io::Error,
    },
    /// The request may have reached the worker (the connection failed while sending or before the
    /// response headers). `reused` says it was a pooled connection, which the worker may have
    /// closed as idle just then: worth one more try on a fresh connection, for a replayable request.
    Request {
        /// The error.
        error: hyper::Error,
        /// Whether the connection came from the pool.
        reused: bool,
    },
}

/// Why a connection to a worker could not be made.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// The socket's error (refused, unreachable...).
    Io(std::io::Error),
    /// No connection within the pool's connect timeout.
    TimedOut(Duration),
    /// The HTTP/1.1 handshake over the new connection failed.
    Handshake(hyper::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Io(e) => write!(f, "{e}"),
            ConnectError::TimedOut(t) => write!(f, "timed out after {t:?}"),
            ConnectError::Handshake(e) => write!(f, "handshake: {e}"),
        }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect { addr, cause } => write!(f, "connect to {addr}: {cause}"),
            SendError::Local { addr, error } => write!(f, "local, connecting to {addr}: {error}"),
            SendError::Request { error: e, .. } => {
                write!(f, "{e}")?;
                let mut cur = std::error::Error::source(e);
                while let Some(c) = cur {
                    write!(f, ": {c}")?;
                    cur = c.source();
                }
                Ok(())
            }
        }
    }
}

/// Idle lists per worker: one per runtime thread (threads beyond this share by modulo).
const SLOTS: usize = 16;

thread_local! {
    /// This thread's idle list: a connection's task runs on the runtime that made it, so a request
    /// reuses only connections of its own thread (no cross-thread wake per request).
    static SLOT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Sets the calling thread's idle list (each runtime thread of the gateway has its own).
pub(crate) fn set_thread_slot(i: usize) {
    SLOT.with(|s| s.set(i % SLOTS));
}

fn slot() -> usize {
    SLOT.with(std::cell::Cell::get)
}

type Idle = Mutex<Vec<(Instant, SendRequest<ProxyBody>)>>;

/// A worker's connection pool.
#[derive(Debug)]
pub(crate) struct Upstream {
    addr: SocketAddr,
    /// Milliseconds; changed by a configuration reload.
    connect_timeout_ms: AtomicU64,
    idle: [Idle; SLOTS],
}

/// A connection on loan to one request; give it back with [`Upstream::checkin`].
pub(crate) type Conn = SendRequest<ProxyBody>;

impl Upstream {
    /// An empty pool for `addr`.
    pub(crate) fn new(addr: SocketAddr, connect_timeout: Duration) -> Self {
        Upstream {
            addr,
            connect_timeout_ms: AtomicU64::new(connect_timeout.as_millis() as u64),
            idle: std::array::from_fn(|_| Mutex::new(Vec::new())),
        }
    }

    /// Sets the connect timeout for new connections.
    pub(crate) fn set_connect_timeout(&self, timeout: Duration) {
        self.connect_timeout_ms.store(timeout.as_millis() as u64, Relaxed);
    }

    async fn connect(&self) -> Result<Conn, SendError> {
        let timeout = Duration::from_millis(self.connect_timeout_ms.load(Relaxed));
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(self.addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) if crate::listener::is_resource_exhaustion(&e) => {
                return Err(SendError::Local { addr: self.addr, error: e });
            }
            Ok(Err(e)) => return Err(SendError::Connect { addr: self.addr, cause: ConnectError::Io(e) }),
            Err(_) => return Err(SendError::Connect { addr: self.addr, cause: ConnectError::TimedOut(timeout) }),
        };
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| SendError::Connect { addr: self.addr, cause: ConnectError::Handshake(e) })?;
        tokio::spawn(async move {
            // With upgrades: a 101 hands the connection to the tunnel (see `proxy::forward`).
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle[slot()].lock();
        // The most recently used first; those idle too long (the oldest) are dropped.
        let now = Instant::now();
        while let Some((since, c)) = idle.pop() {
            if now.saturating_duration_since(since) > IDLE_TIMEOUT {
                idle.clear();
                return None;
            }
            // Closed, or still busy (its previous request's body is still going out): not for
            // this request.
            if c.is_ready() {
                return Some(c);
            }
        }
        None
    }

    /// Sends a request: on a pooled connection if one is alive and `reuse` allows it, else on a
    /// new one. Returns the response and the connection, to be checked in when the response body
    /// ends.
    ///
    /// # Errors
    ///
    /// [`SendError::Connect`] when no connection could be made, [`SendError::Local`] when the
    /// gateway itself is out of descriptors or memory, [`SendError::Request`] otherwise.
    pub(crate) async fn send(
        &self,
        mut req: Request<ProxyBody>,
        reuse: bool,
    ) -> Result<(Response<Incoming>, Conn), SendError> {
        while reuse && let Some(mut conn) = self.take_idle() {
            match conn.try_send_request(req).await {
                Ok(resp) => return Ok((resp, conn)),
                Err(mut e) => match e.take_message() {
                    // Not sent: the pooled connection had closed. Try the next one.
                    Some(back) => req = back,
                    None => return Err(SendError::Request { error: e.into_error(), reused: true }),
                },
            }
        }
        let mut conn = self.connect().await?;
        match conn.send_request(req).await {
            Ok(resp) => Ok((resp, conn)),
            Err(e) => Err(SendError::Request { error: e, reused: false }),
        }
    }

    /// Returns a connection whose response has been read to the end.
    pub(crate) fn checkin(&self, conn: Conn) {
        if conn.is_closed() {
            return;
        }
        let mut idle = self.idle[slot()].lock();
        if idle.len() < MAX_IDLE {
            idle.push((Instant::now(), conn));
        }
    }
}
