//! Connections to one worker: HTTP/1.1 keep-alive connections of keyroute's own engine
//! ([`keyroute_http1`]), pooled per worker and per runtime thread.
//!
//! A proxy sends every request to an address it already chose, so the general client's machinery
//! (a pool keyed by scheme and authority, absolute URIs to parse, a connector to resolve, a
//! connection task fed by a channel) is work done for nothing on every request. Here each worker
//! owns a stack of idle connections per runtime thread, each a bare socket: a request takes one
//! (or connects), the requesting task writes the head and reads the response itself, and the
//! response body gives the connection back when it ends. A request that a closed pooled
//! connection could not take (its head could not be written) goes on the next connection, or a
//! fresh one, whatever its method; connections idle for more than 4 s are not reused (servers
//! close idle ones); and a replayable request that fails on a pooled connection after it was
//! written gets one more try on a fresh one to the same worker (see `proxy::attempt`).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use http_body::Body as _;
use keyroute_http1::buf::Spare;
use keyroute_http1::{ClientConn, Limits, Outgoing};
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::body::{BoxError, ProxyBody};
use crate::config::{UpstreamConfig, UpstreamProtocol};
use crate::head::{Answer, ReqHead};

pub(crate) mod mux;
pub mod tls;

/// A worker's response body: it owns its connection until it ends (see
/// [`UpstreamBody::take_reusable`]).
pub(crate) enum UpstreamBody {
    /// From keyroute's own HTTP/1.1 engine (plain HTTP/1.1).
    Plain(keyroute_http1::ResponseBody),
    /// Through hyper (HTTP/2, TLS).
    Mux(mux::MuxBody),
}

/// A connection whose exchange ended cleanly, on its way back to its idle list.
pub(crate) enum Reusable {
    Plain(ClientConn),
    Http1(hyper::client::conn::http1::SendRequest<ProxyBody>),
}

impl UpstreamBody {
    /// The connection, once the body has ended and its request has gone out whole.
    pub(crate) fn take_reusable(&mut self) -> Option<Reusable> {
        match self {
            UpstreamBody::Plain(b) => b.take_reusable().map(Reusable::Plain),
            UpstreamBody::Mux(b) => b.take_reusable().map(Reusable::Http1),
        }
    }

    /// The socket of a connection that switched protocols (plain HTTP/1.1 only: no upgrade is
    /// offered through hyper).
    pub(crate) fn into_upgraded(self) -> Option<(TcpStream, Bytes)> {
        match self {
            UpstreamBody::Plain(b) => b.into_upgraded(),
            UpstreamBody::Mux(_) => None,
        }
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpstreamBody::Plain(b) => std::pin::Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpstreamBody::Mux(b) => std::pin::Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Plain(b) => b.is_end_stream(),
            UpstreamBody::Mux(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            UpstreamBody::Plain(b) => b.size_hint(),
            UpstreamBody::Mux(b) => b.size_hint(),
        }
    }
}

/// The limits on a worker's response head: hyper's client's (100 fields), in 64 KiB.
const RESPONSE_LIMITS: Limits = Limits { max_head_bytes: 64 * 1024, max_headers: 100 };

/// Idle connections kept per worker.
const MAX_IDLE: usize = 256;

/// A connection idle longer than this is closed rather than reused: servers close idle
/// connections after their own keep-alive timeout (5 s for Apache httpd and Node.js), and a
/// request written just as the server closes is lost in flight.
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Whether a socket error means the process is out of a resource (descriptors, buffers, memory):
/// nobody's fault but its own (an accept backs off; a connect is not the worker's failure).
pub fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

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
        error: BoxError,
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
    /// The TLS handshake failed: why, in an operator's words (expired, wrong name, unknown CA).
    Tls(String),
    /// The HTTP/2 or HTTP/1.1 handshake over the new connection failed.
    Handshake(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Io(e) => write!(f, "{e}"),
            ConnectError::TimedOut(t) => write!(f, "timed out after {t:?}"),
            ConnectError::Tls(why) => write!(f, "TLS: {why}"),
            ConnectError::Handshake(why) => write!(f, "handshake: {why}"),
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
                let mut cur = std::error::Error::source(&**e);
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
pub fn set_thread_slot(i: usize) {
    SLOT.with(|s| s.set(i % SLOTS));
}

pub(crate) fn slot() -> usize {
    SLOT.with(std::cell::Cell::get)
}

type Idle = Mutex<Vec<(Instant, ClientConn)>>;

/// A worker's connection pool: keyroute's own engine's connections (plain HTTP/1.1), and hyper's
/// ([`mux`]: HTTP/2, TLS).
#[derive(Debug)]
pub(crate) struct Upstream {
    addr: SocketAddr,
    /// The worker's name (the TLS name checked under `server_name = "{worker}"`).
    name: String,
    idle: [Idle; SLOTS],
    mux: mux::Mux,
}

/// The connection pool of a worker served over HTTP: the worker's protocol slot, made on first
/// use. `None` only if another protocol's state took the slot (a pool is served by one).
pub(crate) fn of(worker: &keyroute_fleet::pool::WorkerState) -> Option<&Upstream> {
    worker.protocol_or(|w| Upstream::new(w.address, &w.name))
}

/// Whether a pool's requests go through [`mux`] (HTTP/2 or TLS) rather than the plain engine.
pub(crate) fn through_mux(cfg: &UpstreamConfig) -> bool {
    cfg.tls.is_some() || cfg.protocol != UpstreamProtocol::Http1
}

impl Upstream {
    /// An empty pool for the worker `name` at `addr`.
    pub(crate) fn new(addr: SocketAddr, name: &str) -> Self {
        Upstream {
            addr,
            name: name.to_owned(),
            idle: std::array::from_fn(|_| Mutex::new(Vec::new())),
            mux: mux::Mux::new(),
        }
    }

    async fn connect(&self, timeout: Duration) -> Result<ClientConn, SendError> {
        match tokio::time::timeout(timeout, TcpStream::connect(self.addr)).await {
            Ok(Ok(s)) => Ok(ClientConn::new(s)),
            Ok(Err(e)) if is_resource_exhaustion(&e) => Err(SendError::Local { addr: self.addr, error: e }),
            Ok(Err(e)) => Err(SendError::Connect { addr: self.addr, cause: ConnectError::Io(e) }),
            Err(_) => Err(SendError::Connect { addr: self.addr, cause: ConnectError::TimedOut(timeout) }),
        }
    }

    fn take_idle(&self) -> Option<ClientConn> {
        let mut idle = self.idle[slot()].lock();
        // The most recently used first; those idle too long (the oldest) are dropped.
        let now = Instant::now();
        while let Some((since, c)) = idle.pop() {
            if now.saturating_duration_since(since) > IDLE_TIMEOUT {
                idle.clear();
                return None;
            }
            // Closed by the worker, or it sent something unasked: not for this request.
            if c.is_usable() {
                return Some(c);
            }
        }
        None
    }

    /// Sends a request: on a pooled connection if one is alive and `reuse` allows it, else on a
    /// new one (made within `connect_timeout`). Returns the response, whose body holds the
    /// connection and gives it back to this pool (through [`Upstream::checkin`]) when it ends.
    /// The body (`None`: empty) is taken only once a connection takes the request: after a
    /// connect failure it is still there, for another worker.
    ///
    /// # Errors
    ///
    /// [`SendError::Connect`] when no connection could be made, [`SendError::Local`] when the
    /// gateway itself is out of descriptors or memory, [`SendError::Request`] otherwise.
    pub(crate) async fn send(
        &self,
        cfg: &std::sync::Arc<UpstreamConfig>,
        req: &ReqHead,
        body: &mut Option<ProxyBody>,
        reuse: bool,
        connect_timeout: Duration,
    ) -> Result<Answer<UpstreamBody>, SendError> {
        if through_mux(cfg) {
            // Boxed: the plain path's future stays the size it was.
            let send = self.mux.send(self, cfg, req, body, reuse, connect_timeout);
            return Box::pin(send).await;
        }
        let empty = body.as_ref().is_none_or(|b| b.is_end_stream());
        let (head, outgoing) = request_head(req, empty, self.addr);
        let head_request = req.method == Method::HEAD;
        while reuse && let Some(conn) = self.take_idle() {
            let taken = body.take().unwrap_or_else(crate::body::empty);
            match keyroute_http1::send(conn, &head, taken, outgoing, head_request, &RESPONSE_LIMITS).await {
                Ok(r) => return Ok(Answer::from_worker(r.head, UpstreamBody::Plain(r.body))),
                // Not sent: the pooled connection had closed. Try the next one.
                Err(keyroute_http1::SendError::NotSent(_, back)) => *body = Some(back),
                Err(keyroute_http1::SendError::Failed(error)) => {
                    return Err(SendError::Request { error: Box::new(error), reused: true });
                }
            }
        }
        let conn = self.connect(connect_timeout).await?;
        let body = body.take().unwrap_or_else(crate::body::empty);
        match keyroute_http1::send(conn, &head, body, outgoing, head_request, &RESPONSE_LIMITS).await {
            Ok(r) => Ok(Answer::from_worker(r.head, UpstreamBody::Plain(r.body))),
            Err(keyroute_http1::SendError::NotSent(e, _)) => {
                Err(SendError::Request { error: Box::new(e), reused: false })
            }
            Err(keyroute_http1::SendError::Failed(error)) => {
                Err(SendError::Request { error: Box::new(error), reused: false })
            }
        }
    }

    /// Returns a connection whose exchange ended cleanly.
    pub(crate) fn checkin(&self, conn: Reusable) {
        let conn = match conn {
            Reusable::Plain(c) => c,
            Reusable::Http1(send) => return self.mux.checkin(send),
        };
        let mut idle = self.idle[slot()].lock();
        if idle.len() < MAX_IDLE {
            idle.push((Instant::now(), conn));
        }
    }
}

/// The methods whose empty body is sent with `Content-Length: 0` (those with a defined meaning
/// for a body, as hyper's client does).
fn says_empty_length(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// The HTTP/1.1 head of an upstream request, and how its body goes: chunked when the head says
/// so, else its `Content-Length`, else none. A request without Host (HTTP/1.0) gets the worker's
/// address. The fields go as the request path left them ([`crate::head::Fields::write`]: as received, with its
/// edits, or from a map).
fn request_head(req: &ReqHead, body_empty: bool, addr: SocketAddr) -> (Spare<Vec<u8>>, Outgoing) {
    let fields = &req.fields;
    let mut out = keyroute_http1::buf::head_buffer();
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    fields.write(&mut out);
    let mut outgoing = None;
    if fields.contains(&http::header::TRANSFER_ENCODING) {
        outgoing = Some(Outgoing::Chunked);
    } else if let Some(v) = fields.get(&http::header::CONTENT_LENGTH) {
        let n = crate::head::text(v).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
        outgoing = Some(if n == 0 { Outgoing::Empty } else { Outgoing::Length(n) });
    }
    if !fields.contains(&http::header::HOST) {
        use std::io::Write as _;
        let _ = write!(*out, "host: {addr}\r\n");
    }
    let outgoing = match outgoing {
        Some(o) => o,
        None if body_empty => {
            if says_empty_length(&req.method) {
                out.extend_from_slice(b"content-length: 0\r\n");
            }
            Outgoing::Empty
        }
        None => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Outgoing::Chunked
        }
    };
    out.extend_from_slice(b"\r\n");
    (out, outgoing)
}

/// The bytes of an upgraded connection: the socket, and what the worker sent past its 101.
pub(crate) type Upgraded = (TcpStream, Bytes);
