//! Connections to a worker through hyper's client: HTTP/2 (with prior knowledge, or by ALPN over
//! TLS) and HTTP/1.1 over TLS. Plain HTTP/1.1, the common case, stays on keyroute's own engine
//! (see the [parent module](super)).
//!
//! - **HTTP/2**: a worker's connections are shared by every thread. A request goes on the first
//!   open connection carrying fewer than `max_streams` streams; when every one is full, another
//!   connection opens. A stream is counted from its request until its response body ends or is
//!   dropped. Flow control is h2's, end to end: a stream's window opens as the client reads the
//!   body. A connection with streams open is pinged every 5 minutes (as often as gRPC servers
//!   allow) and closed when the worker does not answer within 20 s. A request that a closing
//!   connection (a GOAWAY, a connection the worker closed) could not take is sent on another one;
//!   one that was sent and then refused fails as any request that may have reached the worker
//!   does (retried only when idempotent and bodiless, by the attempt stage). While a connection
//!   is being dialled, the requests waiting for it get its failure at once rather than each dial
//!   again after it (a worker that drops connection attempts would hold them a timeout each).
//!   A connection made for a single exchange (the active check's) is not shared.
//! - **HTTP/1.1 over TLS**: one request per connection at a time, as on the plain path; a
//!   connection goes back to its thread's idle list when its response body ends.
//!
//! Trailers pass both ways (gRPC's status is in them); `TE: trailers` from the client is sent on
//! to an HTTP/2 worker (gRPC servers require it). An upgrade (WebSocket) is not offered to a pool
//! served through this module: its workers get a plain request.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{ConnectError, IDLE_TIMEOUT, MAX_IDLE, SLOTS, SendError, UpstreamBody, is_resource_exhaustion, slot};
use crate::body::{BoxError, ProxyBody};
use crate::config::{UpstreamConfig, UpstreamProtocol};
use crate::head::{Answer, ReqHead};

/// How often an HTTP/2 connection with streams open is pinged, and how long a PING may go
/// unanswered. Five minutes: gRPC servers (grpc-go, grpc-core) close a connection whose client
/// pings more often than that by default (GOAWAY `too_many_pings`); an idle connection is not
/// pinged at all (the same servers forbid it), and one found closed is simply dialled again.
const PING_INTERVAL: Duration = Duration::from_secs(300);
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// An HTTP/2 connection to the worker and the streams it carries now.
struct H2Conn {
    send: http2::SendRequest<ProxyBody>,
    open: Arc<AtomicU32>,
}

type Idle1 = Mutex<Vec<(Instant, http1::SendRequest<ProxyBody>)>>;

/// A worker's connections through hyper (see the [module documentation](self)).
pub(crate) struct Mux {
    /// The settings the connections below were made with: a reload's new settings (a new CA, a
    /// new client certificate) close them, and new ones are made.
    made_with: ArcSwap<UpstreamConfig>,
    h1: [Idle1; SLOTS],
    h2: Mutex<Vec<H2Conn>>,
    /// Held while an HTTP/2 connection is being made, so that the requests that find every
    /// connection full at once wait for one new connection rather than each make their own.
    dialing: tokio::sync::Mutex<()>,
    /// When a dial last failed (milliseconds since `epoch`, plus one; 0: never).
    dial_failed_ms: std::sync::atomic::AtomicU64,
    epoch: Instant,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux").field("h2_connections", &self.h2.lock().len()).finish_non_exhaustive()
    }
}

/// A connection just made, by the protocol it settled on.
enum Made {
    H1(http1::SendRequest<ProxyBody>),
    H2(http2::SendRequest<ProxyBody>, Arc<AtomicU32>),
}

/// A stream of an HTTP/2 connection, counted until it ends.
struct Stream(Arc<AtomicU32>);

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// A worker's response body through hyper: the connection goes back to its idle list when the
/// body ends (HTTP/1.1), or the stream stops counting (HTTP/2).
pub(crate) struct MuxBody {
    body: Incoming,
    /// The body gave its last frame (a chunked one says so only then).
    ended: bool,
    back: Option<http1::SendRequest<ProxyBody>>,
    _stream: Option<Stream>,
}

impl MuxBody {
    /// The HTTP/1.1 connection, once the body has ended.
    pub(crate) fn take_reusable(&mut self) -> Option<http1::SendRequest<ProxyBody>> {
        if self.ended || self.body.is_end_stream() { self.back.take() } else { None }
    }
}

impl Body for MuxBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            self.ended = true;
        }
        frame.map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Mux {
    pub(crate) fn new() -> Mux {
        Mux {
            made_with: ArcSwap::from_pointee(UpstreamConfig::default()),
            h1: std::array::from_fn(|_| Mutex::new(Vec::new())),
            h2: Mutex::new(Vec::new()),
            dialing: tokio::sync::Mutex::new(()),
            dial_failed_ms: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Closes the connections made with other settings than `cfg`.
    fn follow(&self, cfg: &Arc<UpstreamConfig>) {
        if Arc::ptr_eq(&self.made_with.load(), cfg) {
            return;
        }
        self.made_with.store(Arc::clone(cfg));
        self.h2.lock().clear();
        for idle in &self.h1 {
            idle.lock().clear();
        }
    }

    /// An open connection with room for a request, if any.
    async fn take(&self, max_streams: u32) -> Option<Made> {
        {
            let mut h2 = self.h2.lock();
            h2.retain(|c| !c.send.is_closed());
            if let Some(c) = h2.iter().find(|c| c.open.load(Relaxed) < max_streams && c.send.is_ready()) {
                return Some(Made::H2(c.send.clone(), Arc::clone(&c.open)));
            }
        }
        loop {
            let (since, send) = self.h1[slot()].lock().pop()?;
            if Instant::now().saturating_duration_since(since) > IDLE_TIMEOUT {
                self.h1[slot()].lock().clear();
                return None;
            }
            // A connection still busy (its request's body still going out: the worker answered
            // early) is dropped rather than make this request wait behind the upload.
            if !send.is_closed() && send.is_ready() {
                return Some(Made::H1(send));
            }
        }
    }

    /// Returns an HTTP/1.1 connection whose exchange ended cleanly.
    pub(crate) fn checkin(&self, send: http1::SendRequest<ProxyBody>) {
        let mut idle = self.h1[slot()].lock();
        if idle.len() < MAX_IDLE {
            idle.push((Instant::now(), send));
        }
    }

    /// A new connection: TCP, then TLS if the pool says so, then HTTP/2 or HTTP/1.1 as the pool
    /// (or, for `auto`, ALPN) says; all within `timeout`.
    async fn connect(
        &self,
        cfg: &UpstreamConfig,
        addr: SocketAddr,
        name: &str,
        timeout: Duration,
        share: bool,
    ) -> Result<Made, SendError> {
        let connect = async {
            let tcp = TcpStream::connect(addr).await.map_err(|e| tcp_error(addr, e))?;
            let _ = tcp.set_nodelay(true);
            let Some(tls) = &cfg.tls else {
                return handshake(TokioIo::new(tcp), cfg.protocol == UpstreamProtocol::H2, addr).await;
            };
            let Some(server_name) = tls.name_for(name, addr) else {
                let why = format!("the worker's name '{name}' is not a DNS name (server_name = \"{{worker}}\")");
                return Err(SendError::Connect { addr, cause: ConnectError::Tls(why) });
            };
            let stream = tokio_rustls::TlsConnector::from(tls.config())
                .connect(server_name, tcp)
                .await
                .map_err(|e| SendError::Connect { addr, cause: ConnectError::Tls(super::tls::handshake_reason(&e)) })?;
            let h2 = match cfg.protocol {
                UpstreamProtocol::H2 => true,
                UpstreamProtocol::Http1 => false,
                UpstreamProtocol::Auto => stream.get_ref().1.alpn_protocol() == Some(b"h2"),
            };
            handshake(TokioIo::new(stream), h2, addr).await
        };
        let made = match tokio::time::timeout(timeout, connect).await {
            Ok(made) => made?,
            Err(_) => return Err(SendError::Connect { addr, cause: ConnectError::TimedOut(timeout) }),
        };
        if share && let Made::H2(send, open) = &made {
            self.h2.lock().push(H2Conn { send: send.clone(), open: Arc::clone(open) });
        }
        Ok(made)
    }

    /// Sends a request (see [`super::Upstream::send`]).
    pub(crate) async fn send(
        &self,
        to: &super::Upstream,
        cfg: &Arc<UpstreamConfig>,
        head: &ReqHead,
        body: &mut Option<ProxyBody>,
        reuse: bool,
        connect_timeout: Duration,
    ) -> Result<Answer<UpstreamBody>, SendError> {
        let (addr, name) = (to.addr, to.name.as_str());
        self.follow(cfg);
        let scheme = if cfg.tls.is_some() { "https" } else { "http" };
        // Made when a connection takes it: a connect failure leaves the body to the caller.
        let mut pending: Option<Request<ProxyBody>> = None;
        let max_streams = cfg.max_streams.max(1);
        let mut pooled = reuse;
        loop {
            let mut taken = if pooled { self.take(max_streams).await } else { None };
            let _dialing = match taken {
                // HTTP/2 connections are shared: one new connection at a time, and a look at
                // those that opened while this request waited for its turn. A dial that failed
                // while it waited is its failure too.
                None if pooled && cfg.protocol != UpstreamProtocol::Http1 => {
                    let asked = self.epoch.elapsed().as_millis() as u64;
                    let turn = self.dialing.lock().await;
                    if self.dial_failed_ms.load(Relaxed) > asked {
                        let why = std::io::Error::other("the connection being made to the worker failed");
                        restore(&mut pending, body);
                        return Err(SendError::Connect { addr, cause: ConnectError::Io(why) });
                    }
                    taken = self.take(max_streams).await;
                    Some(turn)
                }
                _ => None,
            };
            let reused = taken.is_some();
            pooled = reused;
            let made = match taken {
                Some(m) => m,
                None => match self.connect(cfg, addr, name, connect_timeout, reuse).await {
                    Ok(m) => m,
                    Err(e) => {
                        self.dial_failed_ms.store(self.epoch.elapsed().as_millis() as u64 + 1, Relaxed);
                        // Nothing was sent: the body goes back for another worker.
                        restore(&mut pending, body);
                        return Err(e);
                    }
                },
            };
            drop(_dialing);
            let mut req = match pending.take() {
                Some(r) => r,
                None => request(head, body.take().unwrap_or_else(crate::body::empty)),
            };
            let sent = match made {
                Made::H2(mut send, open) => {
                    shape(&mut req, true, scheme, addr, head.trailers);
                    open.fetch_add(1, Relaxed);
                    let stream = Stream(open);
                    send.try_send_request(req).await.map(|r| (r, None, Some(stream)))
                }
                Made::H1(mut send) => {
                    shape(&mut req, false, scheme, addr, head.trailers);
                    let r = send.try_send_request(req).await;
                    r.map(|r| (r, Some(send), None))
                }
            };
            match sent {
                Ok((resp, back, stream)) => {
                    let resp =
                        resp.map(|body| UpstreamBody::Mux(MuxBody { body, ended: false, back, _stream: stream }));
                    return Ok(Answer::from(resp));
                }
                Err(mut e) => match e.take_message() {
                    // Never sent (the connection was closing): on the next connection, or a new one.
                    Some(back) if reused => pending = Some(back),
                    // A new connection that took nothing: the body goes back for another worker.
                    Some(back) => {
                        *body = Some(back.into_body());
                        let why = format!("the new connection closed before taking the request: {}", e.error());
                        return Err(SendError::Connect { addr, cause: ConnectError::Handshake(why) });
                    }
                    None => {
                        let error = e.into_error();
                        // A worker that refuses the client certificate says so (TLS 1.3) only when
                        // the first exchange on a new connection reads its alert: the request
                        // never reached its application. Any other failure may have.
                        if !reused && let Some(why) = super::tls::refusal_in(&error) {
                            return Err(SendError::Connect { addr, cause: ConnectError::Tls(why) });
                        }
                        return Err(SendError::Request { error: Box::new(error), reused });
                    }
                },
            }
        }
    }
}

/// Puts a request's body back where the caller keeps it, when nothing of it was sent.
fn restore(pending: &mut Option<Request<ProxyBody>>, body: &mut Option<ProxyBody>) {
    if let Some(r) = pending.take() {
        *body = Some(r.into_body());
    }
}

/// A connect error: the gateway's own when it is out of descriptors or memory.
fn tcp_error(addr: SocketAddr, e: std::io::Error) -> SendError {
    if is_resource_exhaustion(&e) {
        SendError::Local { addr, error: e }
    } else {
        SendError::Connect { addr, cause: ConnectError::Io(e) }
    }
}

/// hyper's handshake over a connected socket; the connection's task runs on the runtime.
async fn handshake<I>(io: TokioIo<I>, h2: bool, addr: SocketAddr) -> Result<Made, SendError>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let failed = |e: hyper::Error| SendError::Connect { addr, cause: ConnectError::Handshake(e.to_string()) };
    if h2 {
        let (send, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(PING_INTERVAL)
            .keep_alive_timeout(PING_TIMEOUT)
            .keep_alive_while_idle(false)
            .handshake(io)
            .await
            .map_err(failed)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(worker = %addr, error = %e, "HTTP/2 connection to a worker ended");
            }
        });
        Ok(Made::H2(send, Arc::new(AtomicU32::new(0))))
    } else {
        let (send, conn) = http1::handshake(io).await.map_err(failed)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Made::H1(send))
    }
}

/// The request as `http` parts: the request path's head, its fields in a map.
fn request(head: &ReqHead, body: ProxyBody) -> Request<ProxyBody> {
    let mut req = Request::new(body);
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = head.uri.clone();
    *req.headers_mut() = head.fields.to_map();
    req
}

/// Shapes a request for the protocol of the connection it goes on (a request that one
/// connection could not take may go on another of the other protocol, under `auto`).
///
/// - HTTP/2: the target in absolute form (its authority the `Host`, or the worker's address),
///   no `Host`, no `Transfer-Encoding` (HTTP/2 frames the body), `TE: trailers` if the client
///   sent it.
/// - HTTP/1.1: the target in origin form, with `Host` (the authority, or the worker's address),
///   no `TE`.
fn shape(req: &mut Request<ProxyBody>, h2: bool, scheme: &str, addr: SocketAddr, trailers: bool) {
    if h2 {
        *req.version_mut() = Version::HTTP_2;
        let headers = req.headers_mut();
        let authority = match headers.remove(header::HOST) {
            Some(h) => h.to_str().ok().map(str::to_owned),
            None => None,
        };
        headers.remove(header::TRANSFER_ENCODING);
        if trailers {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
        let uri = req.uri();
        let authority =
            authority.or_else(|| uri.authority().map(|a| a.as_str().to_owned())).unwrap_or_else(|| addr.to_string());
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        if let Ok(u) = Uri::builder().scheme(scheme).authority(authority.as_str()).path_and_query(path).build() {
            *req.uri_mut() = u;
        }
    } else {
        req.headers_mut().remove(header::TE);
        *req.version_mut() = Version::HTTP_11;
        if !req.headers().contains_key(header::HOST) {
            let host = req.uri().authority().map_or_else(|| addr.to_string(), |a| a.as_str().to_owned());
            if let Ok(v) = HeaderValue::try_from(host) {
                req.headers_mut().insert(header::HOST, v);
            }
        }
        if req.uri().authority().is_some() {
            let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
            if let Ok(u) = Uri::try_from(path) {
                *req.uri_mut() = u;
            }
        }
    }
}
