//! One accepted connection: TLS (with ALPN), then HTTP/1.1 or HTTP/2, and its requests.
//!
//! - **TLS listeners** complete the handshake within the listener's head timeout, then serve
//!   HTTP/2 if the client chose `h2` by ALPN, else HTTP/1.1.
//! - **Plain listeners** serve HTTP/1.1, or, with `h2c` on, HTTP/2 when the connection opens with
//!   the HTTP/2 preface (prior knowledge).
//! - **HTTP/1.1** is keyroute's own engine ([`keyroute_http1::ServerConn`]), driven by
//!   [`serve_h1`]: a head within the head timeout, the request path, the response within the send
//!   timeout, and again; after a 101 the connection's transport becomes the tunnel to the worker
//!   ([`tunnel::Pending`]) and is never timed again.
//! - **HTTP/2** is hyper's server with its stream limits (`max_concurrent_streams`) and h2's
//!   rapid-reset protections; requests go to the worker as HTTP/1.1 (`:authority` becomes `Host`).
//!   The client's preface must arrive within the head timeout; a connection with no stream open
//!   for the head timeout is closed (GOAWAY), as an idle HTTP/1.1 keep-alive connection is; PINGs
//!   find dead peers.
//!
//! Every response of a listener with an access log is wrapped so that its line is written when it
//! ends ([`crate::access`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use keyroute_http1::{HeadError, Limits, ReadError, RequestHead, Respond, RespondError, ServerConn, Transport};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use crate::access::{self, Pending};
use crate::body::ProxyBody;
use crate::head::{Answer, ReqHead};
use crate::proxy::{self, Front, Peer, tunnel};
use keyroute_fleet::idle::{IdleTimer, Woke};
use keyroute_fleet::metrics::ListenerMetrics;

/// What a listener's HTTP connections serve, chosen once per listener: the proxy's request path,
/// or another service on the same engine (the admin API).
#[derive(Clone)]
pub enum App {
    /// The request path of client listener `listener`.
    Proxy {
        /// What the request path reads.
        front: Arc<Front>,
        /// The listener's index.
        listener: usize,
    },
    /// Another service (HTTP/1.1 only).
    Service(Arc<dyn Service>),
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            App::Proxy { listener, .. } => f.debug_struct("Proxy").field("listener", listener).finish_non_exhaustive(),
            App::Service(_) => f.write_str("Service"),
        }
    }
}

/// An HTTP service served by this engine that is not the proxy (the admin API): one request, its
/// response. Its body is boxed (a service reads it as it needs, within its own limits).
pub trait Service: Send + Sync + 'static {
    /// Answers one request from `remote`.
    fn call(
        &self,
        req: Request<keyroute_http1::RequestBody>,
        remote: SocketAddr,
    ) -> std::pin::Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send + '_>>;
}

/// Until `rx` says stop (the guard `wait_for` returns is dropped here, not held in a `select!`
/// across awaits, which would make the future not `Send`).
async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// How long an idle HTTP/2 connection's GOAWAY may take to be written before the connection is
/// closed anyway.
const GOAWAY_FLUSH: Duration = Duration::from_millis(100);

/// The HTTP/2 connection preface (RFC 9113 section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How a listener's connections are served.
#[derive(Clone)]
pub struct Settings {
    /// What they serve.
    pub app: App,
    /// The time a request head (and, first, the TLS handshake or the HTTP/2 preface) has.
    pub header_timeout: Duration,
    /// The time a client has to take each part of a response.
    pub send_timeout: Duration,
    /// The longest request head.
    pub max_buf: usize,
    /// The most header fields.
    pub max_headers: usize,
    /// TLS, if the listener has certificates.
    pub tls: Option<TlsAcceptor>,
    /// HTTP/2 with prior knowledge on a plain listener.
    pub h2c: bool,
    /// Concurrent streams per HTTP/2 connection.
    pub max_streams: u32,
    /// The listener's counters.
    pub metrics: Arc<ListenerMetrics>,
    /// One request per connection, then close (the admin API's reserve).
    pub one_request: bool,
    /// Set when the listeners stop accepting: idle connections close, busy ones after their
    /// request.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("app", &self.app)
            .field("header_timeout", &self.header_timeout)
            .field("send_timeout", &self.send_timeout)
            .field("tls", &self.tls.is_some())
            .field("h2c", &self.h2c)
            .field("one_request", &self.one_request)
            .finish_non_exhaustive()
    }
}

/// Serves one accepted connection to its end, on a task of its own. `held` (the open-connection
/// count and the connection limit's permit) is released when it ends.
///
/// A task holds its future for as long as the connection lives, at the size of its largest
/// state: a plain HTTP/1.1 connection is spawned as `serve_h1` itself (a wrapper around it
/// would hold the connection's values twice), and the TLS and h2c paths, boxed, are spawned
/// apart.
pub fn spawn<H: Send + 'static>(stream: TcpStream, remote: SocketAddr, settings: Arc<Settings>, held: H) {
    let _ = stream.set_nodelay(true);
    // One budget for everything before the first request head: the TLS handshake, the h2c
    // preface check, and the head itself (or an HTTP/2 client's preface).
    let first = tokio::time::Instant::now() + settings.header_timeout;
    if settings.tls.is_none() && !settings.h2c {
        tokio::spawn(serve_h1(stream, Peer::with(remote, false, false), settings, held, first));
    } else {
        tokio::spawn(Box::pin(serve_other(stream, remote, settings, held, first)));
    }
}

/// A connection on a TLS listener, or on a plain one that also takes HTTP/2 with prior knowledge.
async fn serve_other<H: Send + 'static>(
    stream: TcpStream,
    remote: SocketAddr,
    settings: Arc<Settings>,
    held: H,
    first: tokio::time::Instant,
) {
    match &settings.tls {
        Some(acceptor) => Box::pin(serve_tls(acceptor.clone(), stream, remote, settings, held, first)).await,
        None if opens_with_preface(&stream, first).await => {
            Box::pin(serve_h2(stream, Peer::with(remote, false, true), settings, held, first)).await;
        }
        None => serve_h1(stream, Peer::with(remote, false, false), settings, held, first).await,
    }
}

async fn serve_tls<H: Send + 'static>(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    remote: SocketAddr,
    settings: Arc<Settings>,
    held: H,
    first: tokio::time::Instant,
) {
    let tls = match tokio::time::timeout_at(first, acceptor.accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            settings.metrics.tls_errors.fetch_add(1, Relaxed);
            tracing::debug!(%remote, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            settings.metrics.tls_errors.fetch_add(1, Relaxed);
            tracing::debug!(%remote, "TLS handshake timed out");
            return;
        }
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    if h2 {
        serve_h2(tls, Peer::with(remote, true, true), settings, held, first).await;
    } else {
        serve_h1(Tls(tls), Peer::with(remote, true, false), settings, held, first).await;
    }
}

/// Whether the first bytes, by `until`, are the HTTP/2 preface (read without consuming them).
async fn opens_with_preface(stream: &TcpStream, until: tokio::time::Instant) -> bool {
    let mut buf = [0u8; 24];
    loop {
        let n = match tokio::time::timeout_at(until, stream.peek(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return false,
        };
        if buf[..n] != PREFACE[..n] {
            return false;
        }
        if n == PREFACE.len() {
            return true;
        }
        // A prefix of the preface so far: wait a moment for the rest.
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// An IO whose first read must bring data within a deadline; later reads are not timed.
struct FirstBytes<S> {
    io: S,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> FirstBytes<S> {
    fn new(io: S, until: tokio::time::Instant) -> Self {
        FirstBytes { io, deadline: Some(Box::pin(tokio::time::sleep_until(until))) }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FirstBytes<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if self.deadline.is_some() {
            if buf.filled().len() > before {
                self.deadline = None;
            } else if r.is_pending()
                && let Some(d) = self.deadline.as_mut()
                && d.as_mut().poll(cx).is_ready()
            {
                return std::task::Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no HTTP/2 preface within the head timeout",
                )));
            }
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FirstBytes<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// An HTTP/2 connection's open streams, and when the last one ended.
struct Streams {
    open: std::sync::atomic::AtomicUsize,
    /// Bumped whenever a stream ends.
    ended: tokio::sync::Notify,
    /// The responses being sent, for the send timeout.
    sending: parking_lot::Mutex<Vec<std::sync::Weak<Sending>>>,
    epoch: tokio::time::Instant,
}

impl Default for Streams {
    fn default() -> Self {
        Streams {
            open: Default::default(),
            ended: Default::default(),
            sending: Default::default(),
            epoch: tokio::time::Instant::now(),
        }
    }
}

/// How long the list of an HTTP/2 connection's sending responses grows before its dead entries
/// are pruned.
const PRUNE_AT: usize = 256;

/// A response body being sent on an HTTP/2 stream, and since when it waits for the client.
struct Sending {
    /// Taken (and so dropped, releasing what it holds upstream) by the send timeout.
    body: parking_lot::Mutex<Option<ProxyBody>>,
    /// Milliseconds since the connection's epoch at which the body last handed a frame to the
    /// stream, which has not asked for the next yet: the client's flow-control window holds it.
    /// `u64::MAX` while the body waits on its worker, or has ended.
    handed_ms: AtomicU64,
}

/// While an HTTP/2 connection lives, cuts the responses whose client has read nothing of them
/// for `limit` (a stream held at window 0): their bodies are dropped, which releases their
/// workers' in-flight counts, and the stream is reset.
async fn send_timeouts(streams: &Streams, limit: Duration, metrics: &ListenerMetrics) {
    let every = (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        let now = streams.epoch.elapsed().as_millis() as u64;
        let mut sending = streams.sending.lock();
        sending.retain(|w| {
            let Some(s) = w.upgrade() else { return false };
            let handed = s.handed_ms.load(Relaxed);
            if handed != u64::MAX && now.saturating_sub(handed) > limit.as_millis() as u64 {
                let cut = s.body.lock().take();
                if cut.is_some() {
                    metrics.send_timeouts.fetch_add(1, Relaxed);
                }
                return false;
            }
            true
        });
    }
}

/// One open stream; closes on drop.
struct OpenStream(Arc<Streams>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
        self.0.ended.notify_waiters();
    }
}

impl Streams {
    fn open(this: &Arc<Streams>) -> OpenStream {
        this.open.fetch_add(1, Relaxed);
        OpenStream(Arc::clone(this))
    }

    /// Resolves once no stream has been open for `limit`.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.open.load(Relaxed) == 0 {
                // Quiet from now: done after `limit` unless a stream opens and ends meanwhile.
                tokio::select! {
                    _ = tokio::time::sleep(limit) => {
                        if self.open.load(Relaxed) == 0 {
                            return;
                        }
                    }
                    _ = ended.as_mut() => {}
                }
            } else {
                ended.await;
            }
        }
    }
}

/// A response body that holds its stream open until it ends or is dropped, and that the send
/// timeout can cut.
struct OnEnd {
    sending: Arc<Sending>,
    open: OpenStream,
    /// Copied from the body, which the send timeout may take away.
    end: bool,
    hint: hyper::body::SizeHint,
}

impl OnEnd {
    fn new(inner: ProxyBody, open: OpenStream) -> OnEnd {
        use hyper::body::Body as _;
        let (end, hint) = (inner.is_end_stream(), inner.size_hint());
        let sending =
            Arc::new(Sending { body: parking_lot::Mutex::new(Some(inner)), handed_ms: AtomicU64::new(u64::MAX) });
        if !end {
            let mut list = open.0.sending.lock();
            // Ended streams leave dead entries until the next scan: prune them as the list grows
            // (live ones are at most the connection's stream limit), so a busy connection's list
            // stays small between scans.
            if list.len() >= PRUNE_AT {
                list.retain(|w| w.strong_count() > 0);
            }
            list.push(Arc::downgrade(&sending));
        }
        OnEnd { sending, open, end, hint }
    }
}

impl hyper::body::Body for OnEnd {
    type Data = bytes::Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        let mut slot = this.sending.body.lock();
        let Some(inner) = slot.as_mut() else {
            return Poll::Ready(Some(Err("the client read nothing for the send timeout".into())));
        };
        let poll = std::pin::Pin::new(&mut *inner).poll_frame(cx);
        this.end = inner.is_end_stream();
        this.hint = inner.size_hint();
        let handed = match &poll {
            Poll::Ready(Some(Ok(_))) if !this.end => this.open.0.epoch.elapsed().as_millis() as u64,
            _ => u64::MAX,
        };
        this.sending.handed_ms.store(handed, Relaxed);
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.end
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.hint
    }
}

fn access_conn(peer: &Peer) -> access::Conn {
    access::Conn { client: peer.addr, h2: peer.h2, tls: peer.tls }
}

/// A TLS stream as the HTTP/1 engine's transport: rustls decrypts into the thread's buffer.
struct Tls(tokio_rustls::server::TlsStream<TcpStream>);

impl AsyncRead for Tls {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tls {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Transport for Tls {}

/// The bytes sent when a request head times out.
const TIMEOUT_RESPONSE: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// How long the gateway's own last words on a connection (a 408, a refused head) may wait for
/// the client to take them.
const LAST_WORDS: Duration = Duration::from_secs(1);

/// After a last response that left bytes of the client's unread (an upload nobody read, the rest
/// of a refused request), how long and how much is read and dropped before the close, so that
/// the close does not reset the connection under the response (see `ServerConn::linger`).
const LINGER: (Duration, u64) = (Duration::from_secs(2), 1 << 20);

/// The answer to a head the parser refused: the status, and the reason class as JSON (no
/// request id: there was no request).
fn refusal(e: HeadError) -> Vec<u8> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    // keyroute's one public error shape (`body::error`'s): what, its class, the status.
    let body =
        serde_json::json!({ "error": e.to_string(), "reason": e.reason(), "status": e.status() }).to_string() + "\n";
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes()
}

/// What an HTTP/1.1 connection does after a request.
enum Next {
    /// Another request may come.
    KeepAlive,
    /// Close; `linger` when the request's body was left unread (see `ServerConn::linger`).
    Close { linger: bool },
    /// The connection is the tunnel's now.
    Upgrade(tunnel::Pending),
    /// The connection failed, or its request was refused: drop it.
    Drop,
}

/// One request on an HTTP/1.1 connection, from its parsed head to the end of its response.
async fn exchange<S: Transport>(conn: &ServerConn<S>, head: RequestHead, peer: &Peer, settings: &Settings) -> Next {
    let respond =
        Respond { head_request: head.method() == "HEAD", version: head.version(), keep_alive: head.keep_alive() };
    let body = conn.body(&head);
    // The head stays as received: the request path reads it and keeps its edits beside it.
    let Some(head) = ReqHead::from_http1(head) else {
        let _ = conn.write_raw(&refusal(HeadError::Syntax), LAST_WORDS).await;
        return Next::Drop;
    };
    let body = body.map_err(crate::body::BoxError::from).boxed_unsync();
    let resp: Answer = match &settings.app {
        App::Proxy { front, listener } => {
            let log = front.access_logs.get(*listener).and_then(Option::as_ref);
            let pending = log.map(|_| Pending::new(&head.method, &head.uri, access_conn(peer)));
            let fut: std::pin::Pin<Box<dyn Future<Output = Answer> + Send + '_>> =
                Box::pin(proxy::handle_head(front, *listener, head, body, peer));
            let resp = fut.await;
            match (log, pending) {
                (Some(log), Some(p)) => access::logged(log, p, resp),
                _ => resp,
            }
        }
        App::Service(service) => service.call(Request::from_parts(head.to_parts(), body), peer.addr).await.into(),
    };
    // A worker's head goes back as it came, with the request path's edits (`crate::head`).
    let Answer { mut head, body } = resp;
    let tunnel =
        (head.status == StatusCode::SWITCHING_PROTOCOLS).then(|| head.extensions.remove::<tunnel::Pending>()).flatten();
    match conn.respond(&head, body, respond, settings.send_timeout).await {
        Ok(_) if tunnel.is_some() => {
            settings.metrics.upgrades.fetch_add(1, Relaxed);
            tunnel.map_or(Next::Drop, Next::Upgrade)
        }
        // A body left unread (the response came first) is not drained: the connection closes,
        // lingering so that the close does not reset it under the response.
        Ok(_) if !conn.body_done() => Next::Close { linger: true },
        Ok(true) if !settings.one_request => Next::KeepAlive,
        Ok(_) => Next::Close { linger: false },
        Err(RespondError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
            settings.metrics.send_timeouts.fetch_add(1, Relaxed);
            Next::Drop
        }
        Err(e) => {
            tracing::debug!(remote = %peer.addr, error = %e, "response ended with an error");
            Next::Drop
        }
    }
}

/// Serves HTTP/1.1 on keyroute's own engine ([`keyroute_http1`]): a head (within the head
/// timeout: 408 when bytes of one came, or on a connection's first; a silent close for an idle
/// keep-alive connection), the request path, the response (each wait for the client within the
/// send timeout), and again; after a 101, the connection becomes the tunnel.
async fn serve_h1<S, H>(io: S, peer: Peer, settings: Arc<Settings>, held: H, first: tokio::time::Instant)
where
    S: Transport,
    H: Send + 'static,
{
    let conn = ServerConn::new(io);
    let limits = Limits { max_head_bytes: settings.max_buf.max(8192), max_headers: settings.max_headers };
    // The head timer and the stop, held by the thread for all its connections
    // ([`keyroute_fleet::idle`]): one timer for the connection's life, moved on after each
    // response.
    let mut timer = IdleTimer::new(Some(first), &settings.stop);
    let mut first_request = true;
    // What the wait for a head brought, as the next step; `read` is moved in whole, so that a
    // head is never held across an await (it would be room in every idle connection's task):
    // it goes straight into its boxed exchange.
    let step = |read: Option<Result<RequestHead, ReadError>>, first_request: bool| match read {
        Some(Ok(head)) => Some(Step::Exchange(Box::pin(exchange(&conn, head, &peer, &settings)))),
        None if conn.has_partial_head() || first_request => {
            settings.metrics.header_timeouts.fetch_add(1, Relaxed);
            Some(Step::Last(TIMEOUT_RESPONSE.to_vec(), false))
        }
        Some(Err(ReadError::Head(e))) => {
            tracing::debug!(remote = %peer.addr, error = %e, "request head refused");
            Some(Step::Last(refusal(e), true))
        }
        None | Some(Err(_)) => None,
    };
    loop {
        let read = tokio::select! {
            r = conn.read_head(&limits) => Some(r),
            // The gateway stops: an idle connection closes now (one with bytes of a head waits
            // for its deadline; one with a request in progress finishes it first, below).
            woke = timer.wait(!conn.has_partial_head()) => match woke {
                Woke::Deadline => None,
                Woke::Stop => break,
            },
        };
        let next = match step(read, first_request) {
            Some(Step::Exchange(exchanged)) => exchanged.await,
            Some(Step::Last(words, linger)) => {
                Box::pin(last_words(&conn, words, linger)).await;
                break;
            }
            None => break,
        };
        first_request = false;
        match next {
            Next::KeepAlive if !*settings.stop.borrow() => {}
            Next::KeepAlive | Next::Close { linger: false } => {
                Box::pin(conn.shutdown()).await;
                break;
            }
            Next::Close { linger: true } => {
                Box::pin(conn.linger(LINGER.0, LINGER.1)).await;
                break;
            }
            Next::Upgrade(t) => {
                if let Some((io, rest)) = conn.into_upgraded() {
                    t.start(io, rest);
                }
                drop(held);
                return;
            }
            Next::Drop => break,
        }
        timer.reset(Some(tokio::time::Instant::now() + settings.header_timeout));
    }
    drop(held);
}

/// What a connection does with what its wait for a head brought.
enum Step<F> {
    /// A request: its exchange.
    Exchange(std::pin::Pin<Box<F>>),
    /// The gateway's last words (a 408, a refusal), lingering after them or not.
    Last(Vec<u8>, bool),
}

/// The gateway's own last response on a connection (a 408, a refused head), then, with
/// `linger`, the rest of what the client sent read and dropped before the close. Boxed by its
/// callers: it runs once, at the end, and an idle connection's task should not carry its room.
async fn last_words<S: Transport>(conn: &ServerConn<S>, bytes: Vec<u8>, linger: bool) {
    if conn.write_raw(&bytes, LAST_WORDS).await.is_ok() && linger {
        conn.linger(LINGER.0, LINGER.1).await;
    }
}

async fn serve_h2<S, H>(io: S, peer: Peer, settings: Arc<Settings>, held: H, first: tokio::time::Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Send + 'static,
{
    // HTTP/2 is the proxy's only.
    let App::Proxy { front, listener: index } = settings.app.clone() else { return };
    let stop_rx = settings.stop.clone();
    settings.metrics.h2_connections.fetch_add(1, Relaxed);
    // The client's first bytes (its preface) must arrive within the head timeout, as an HTTP/1.1
    // head must: a TLS client that chose h2 and then sends nothing does not hold the connection.
    let io = FirstBytes::new(io, first);
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(settings.max_streams)
        .max_header_list_size(settings.max_buf.max(8192) as u32)
        // Dead peers are found by PINGs; a live idle connection stays, as with HTTP/1 keep-alive.
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    let remote = peer.addr;
    let peer = Arc::new(peer);
    let idle = Arc::new(Streams::default());
    let streams = Arc::clone(&idle);
    let svc = service_fn(move |req: Request<Incoming>| {
        let front = Arc::clone(&front);
        let peer = Arc::clone(&peer);
        let open = Streams::open(&streams);
        async move {
            let log = front.access_logs.get(index).and_then(Option::as_ref);
            let pending = log.map(|_| Pending::new(req.method(), req.uri(), access_conn(&peer)));
            let (parts, body) = req.into_parts();
            let resp = proxy::handle_head(&front, index, ReqHead::from_parts(parts), body, &peer).await;
            let resp = match (log, pending) {
                (Some(log), Some(p)) => access::logged(log, p, resp),
                _ => resp,
            }
            .into_response();
            // The stream counts as open until its response body ends.
            Ok::<_, std::convert::Infallible>(resp.map(|b| http_body_util::BodyExt::boxed_unsync(OnEnd::new(b, open))))
        }
    });
    let mut stop = stop_rx.clone();
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stopped(&mut stop) => {
            // GOAWAY: streams in progress finish, no new ones.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = send_timeouts(&idle, settings.send_timeout, &settings.metrics) => Ok(()),
        _ = idle.idle_for(settings.header_timeout) => {
            // No stream for the head timeout, as an idle HTTP/1.1 keep-alive connection: GOAWAY,
            // and closed once it is sent (a client that ignores it, or PINGs, holds nothing).
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(GOAWAY_FLUSH, conn.as_mut()).await {
                Ok(r) => r,
                Err(_) => Ok(()),
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, %remote, "HTTP/2 connection ended with an error");
    }
    drop(held);
}
