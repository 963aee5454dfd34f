//! Client connections: accepting them within limits, and the request-head timeout.
//!
//! - **Open files.** At start the gateway raises its soft `RLIMIT_NOFILE` to the hard limit (and
//!   logs both): every client connection can hold an upstream one, so 1,024 descriptors is about
//!   500 clients.
//! - **A connection limit per listener** (`max_connections`; by default half the open-file limit,
//!   shared among the listeners). At the limit the accept loop waits for a connection to close,
//!   and the kernel's backlog holds the rest, as NGINX's `worker_connections` and HAProxy's
//!   `maxconn` do; the limit and the times it was reached are metrics.
//! - **Back-off on accept errors**: out of descriptors (`EMFILE`, `ENFILE`) or memory, the loop
//!   sleeps from 10 ms doubling to 1 s instead of spinning, and logs once per episode.
//! - **The send timeout** (`send_timeout_ms`, 60 s by default, NGINX's `send_timeout`): a
//!   response the client reads nothing of for that long is cut and its connection closed, so that
//!   a client that never reads cannot hold its worker's in-flight count (and the response's
//!   buffers) for as long as it likes. Counted in `keyroute_listener_send_timeouts_total`.
//! - **The head timeout** (`header_timeout_ms`, 10 s by default): a request head that has not
//!   fully arrived that long after the connection opened (a TLS handshake or an h2c preface check
//!   included), or after the previous response ended, is
//!   answered `408 Request Timeout` and the connection closed; an idle keep-alive connection (no
//!   byte of a next request) is closed silently. The clock is [`HeadClock`]: the service stops it when a
//!   head has been parsed; it restarts once the response has been sent and the request body has
//!   been read or dropped. A 408 is written only between responses (nothing unflushed).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::SeqCst};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::body::{BoxError, ProxyBody};
use crate::metrics::ListenerMetrics;

/// The bytes sent when a request head times out.
const TIMEOUT_RESPONSE: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// Raises the soft open-file limit to the hard limit; returns (soft before, soft now).
pub(crate) fn raise_open_file_limit() -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        let (soft, hard) = rlimit::Resource::NOFILE.get().ok()?;
        if soft < hard && rlimit::Resource::NOFILE.set(hard, hard).is_ok() {
            return Some((soft, hard));
        }
        Some((soft, soft))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Whether an accept error means the process is out of a resource (and should back off).
pub(crate) fn is_resource_exhaustion(e: &io::Error) -> bool {
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

/// The back-off after accept errors: 10 ms, doubling to 1 s; reset by a successful accept.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    next: Option<Duration>,
}

impl Backoff {
    /// The next wait, and whether it is the first of an episode (worth a log line).
    pub(crate) fn fail(&mut self) -> (Duration, bool) {
        let first = self.next.is_none();
        let d = self.next.unwrap_or(Duration::from_millis(10));
        self.next = Some((d * 2).min(Duration::from_secs(1)));
        (d, first)
    }

    /// A connection was accepted.
    pub(crate) fn reset(&mut self) {
        self.next = None;
    }
}

/// Whether a connection is waiting for a request head; shared by its IO, its service, its request
/// bodies and its response bodies. The clock runs from when a response has been sent *and* its
/// request's body has been read (or dropped) until the next head has been parsed, so bytes of a
/// body still arriving after an early response are never taken for a slow head.
#[derive(Debug)]
pub(crate) struct HeadClock {
    /// The connection was upgraded (a 101): it is a tunnel now, never timed again.
    upgraded: AtomicBool,
    waiting: AtomicBool,
    restart: AtomicBool,
    body_open: AtomicBool,
    response_done: AtomicBool,
}

impl HeadClock {
    fn new() -> Arc<Self> {
        Arc::new(HeadClock {
            upgraded: AtomicBool::new(false),
            waiting: AtomicBool::new(true),
            restart: AtomicBool::new(false),
            body_open: AtomicBool::new(false),
            response_done: AtomicBool::new(false),
        })
    }

    /// A head has been parsed (with a body to come, or not): the clock stops.
    pub(crate) fn head_received(&self, body_open: bool) {
        self.waiting.store(false, SeqCst);
        self.response_done.store(false, SeqCst);
        self.body_open.store(body_open, SeqCst);
    }

    /// The response has been sent: the clock restarts, once the request body is done too.
    pub(crate) fn response_sent(&self) {
        self.response_done.store(true, SeqCst);
        if !self.body_open.load(SeqCst) {
            self.start();
        }
    }

    /// The request body has been read to its end, or dropped.
    pub(crate) fn body_finished(&self) {
        self.body_open.store(false, SeqCst);
        if self.response_done.load(SeqCst) {
            self.start();
        }
    }

    /// The response switched protocols: from now on the connection is a tunnel.
    pub(crate) fn upgraded(&self) {
        self.upgraded.store(true, SeqCst);
        self.waiting.store(false, SeqCst);
    }

    fn start(&self) {
        if self.upgraded.load(SeqCst) {
            return;
        }
        self.restart.store(true, SeqCst);
        self.waiting.store(true, SeqCst);
    }
}

/// A request body that tells its connection's [`HeadClock`] when it is done.
pub(crate) struct ClockedRequest<B> {
    inner: B,
    clock: Arc<HeadClock>,
    finished: bool,
}

impl<B> ClockedRequest<B> {
    /// Wraps a request body.
    pub(crate) fn new(inner: B, clock: Arc<HeadClock>) -> Self {
        ClockedRequest { inner, clock, finished: false }
    }

    fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            self.clock.body_finished();
        }
    }
}

impl<B> Drop for ClockedRequest<B> {
    fn drop(&mut self) {
        self.finish();
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for ClockedRequest<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(poll, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) || self.inner.is_end_stream() {
            self.finish();
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A client connection's IO (TCP, or TLS over it) with the head timeout and the send timeout. See
/// the [module documentation](self).
pub(crate) struct TimedIo<S = TcpStream> {
    io: S,
    clock: Arc<HeadClock>,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
    /// How long a write may wait for the client to read (`send_timeout_ms`).
    send_timeout: Duration,
    /// Armed while a write waits (the client reads nothing); allocated only then.
    send_sleep: Option<Pin<Box<Sleep>>>,
    /// Bytes of a head arrived since the clock (re)started.
    partial: bool,
    /// No request has been received on this connection yet.
    first: bool,
    timed_out: bool,
    /// Written bytes not yet flushed: no 408 may be written into the middle of a response.
    dirty: bool,
    metrics: Arc<ListenerMetrics>,
}

impl<S> TimedIo<S> {
    /// Wraps an accepted connection whose first head is due by `first_head` (the moment it was
    /// accepted plus the head timeout: a TLS handshake or an h2c preface check spends from the
    /// same budget); returns it and its clock.
    pub(crate) fn new(
        io: S,
        timeout: Duration,
        first_head: Instant,
        send_timeout: Duration,
        metrics: Arc<ListenerMetrics>,
    ) -> (Self, Arc<HeadClock>) {
        let clock = HeadClock::new();
        let io = TimedIo {
            io,
            clock: Arc::clone(&clock),
            timeout,
            sleep: Box::pin(tokio::time::sleep_until(first_head)),
            send_timeout,
            send_sleep: None,
            partial: false,
            first: true,
            timed_out: false,
            dirty: false,
            metrics,
        };
        (io, clock)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TimedIo<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.timed_out {
            return Poll::Ready(Ok(()));
        }
        let waiting = this.clock.waiting.load(SeqCst);
        if waiting {
            if this.clock.restart.swap(false, SeqCst) {
                this.sleep.as_mut().reset(Instant::now() + this.timeout);
                this.partial = false;
                this.first = false;
            }
            if this.sleep.as_mut().poll(cx).is_ready() {
                this.timed_out = true;
                if (this.partial || this.first) && !this.dirty {
                    this.metrics.header_timeouts.fetch_add(1, Relaxed);
                    // Best effort: the socket's send buffer is empty between requests.
                    let _ = Pin::new(&mut this.io).poll_write(cx, TIMEOUT_RESPONSE);
                    let _ = Pin::new(&mut this.io).poll_flush(cx);
                }
                // End of stream: hyper closes the connection (a partial head is an incomplete
                // message, for which it writes nothing of its own).
                return Poll::Ready(Ok(()));
            }
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if waiting && buf.filled().len() > before {
            this.partial = true;
        }
        r
    }
}

impl<S> TimedIo<S> {
    /// A write's result, with the send timeout: a write that waits (the client reads nothing)
    /// arms a timer, progress disarms it, and a timer that fires fails the write, which ends the
    /// connection and releases what the response held (its worker's in-flight count).
    fn sent(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match &r {
            Poll::Pending => {
                let limit = self.send_timeout;
                let sleep = self.send_sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if sleep.as_mut().poll(cx).is_ready() {
                    self.metrics.send_timeouts.fetch_add(1, Relaxed);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client read nothing for the send timeout",
                    )));
                }
            }
            Poll::Ready(_) => self.send_sleep = None,
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedIo<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.dirty = true;
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.sent(cx, r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.dirty = false;
        }
        // A TLS stream's flush waits on the socket as a write does.
        match self.sent(cx, r.map_ok(|()| 0)) {
            Poll::Ready(Ok(_)) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.dirty = true;
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.sent(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A response body that restarts its connection's head clock when it is done (sent, or
/// dropped).
pub(crate) struct ClockedBody {
    inner: ProxyBody,
    clock: Arc<HeadClock>,
}

impl ClockedBody {
    /// Wraps a response body.
    pub(crate) fn new(inner: ProxyBody, clock: Arc<HeadClock>) -> Self {
        ClockedBody { inner, clock }
    }
}

impl Drop for ClockedBody {
    fn drop(&mut self) {
        self.clock.response_sent();
    }
}

impl Body for ClockedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Counts an open connection on its listener until dropped, and then wakes whoever waits for
/// connections to close.
#[derive(Debug)]
pub(crate) struct OpenConn(Arc<ListenerMetrics>, Arc<tokio::sync::Notify>);

impl OpenConn {
    /// Counts one more.
    pub(crate) fn new(metrics: &Arc<ListenerMetrics>, closed: &Arc<tokio::sync::Notify>) -> Self {
        metrics.open.fetch_add(1, Relaxed);
        metrics.accepted.fetch_add(1, Relaxed);
        OpenConn(Arc::clone(metrics), Arc::clone(closed))
    }
}

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
        self.1.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_second_and_resets() {
        let mut b = Backoff::default();
        let waits: Vec<(u64, bool)> = (0..9).map(|_| b.fail()).map(|(d, f)| (d.as_millis() as u64, f)).collect();
        assert_eq!(
            waits,
            [
                (10, true),
                (20, false),
                (40, false),
                (80, false),
                (160, false),
                (320, false),
                (640, false),
                (1000, false),
                (1000, false)
            ]
        );
        b.reset();
        assert_eq!(b.fail(), (Duration::from_millis(10), true));
    }

    #[test]
    fn out_of_descriptors_is_resource_exhaustion() {
        assert!(is_resource_exhaustion(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(!is_resource_exhaustion(&io::Error::from_raw_os_error(libc::ECONNABORTED)));
    }
}
