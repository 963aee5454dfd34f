//! The two bodies a proxied request streams through, and what each one's end tells.
//!
//! - [`ClientBody`] wraps what the client uploads. When it fails (an invalid chunk, a connection
//!   cut mid-upload) the failure is the *client's*: the request is answered 400 (or 408 when the
//!   upload stalled past the try's timeout) and never counts against the worker, nor retried.
//! - [`Guarded`] wraps the worker's response. It holds the worker's in-flight count until the body
//!   ends, then returns the connection to the worker's pool. The response's status class and the
//!   passive-ejection observation are recorded at the end, not at the headers: a response whose
//!   body ends early (the worker closed mid-body) is an upstream failure (`error`), not a `2xx`;
//!   so is a body whose worker sends nothing for the pool's `read_timeout_ms` (nginx's
//!   `proxy_read_timeout`), which is then cut.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::body::BoxError;
use crate::upstream::UpstreamBody;
use keyroute_fleet::pool::{InFlight, Snapshot, WorkerState};

/// What the proxy learns of the client's upload.
#[derive(Debug, Default)]
pub(crate) struct Upload {
    failed: AtomicBool,
    done: AtomicBool,
    /// The last poll of the client's body found no data yet: the upload waits on the client
    /// (rather than on the worker, which stops polling it when it stops reading).
    waiting_on_client: AtomicBool,
}

impl Upload {
    /// Whether the upload, when last polled, was waiting for the client's bytes.
    pub(crate) fn waiting_on_client(&self) -> bool {
        self.waiting_on_client.load(Relaxed)
    }

    /// The client's body failed: its error, not the worker's.
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Relaxed)
    }

    /// The client's body was read to its end.
    pub(crate) fn done(&self) -> bool {
        self.done.load(Relaxed)
    }
}

/// The client's request body on its way upstream. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct ClientBody<B> {
    inner: B,
    upload: Arc<Upload>,
}

impl<B> ClientBody<B> {
    /// Wraps a body; `upload` records how it ends.
    pub(crate) fn new(inner: B, upload: Arc<Upload>) -> Self
    where
        B: Body,
    {
        // No body at all: nothing left to upload.
        if inner.is_end_stream() {
            upload.done.store(true, Relaxed);
        }
        ClientBody { inner, upload }
    }
}

impl<B> Body for ClientBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        self.upload.waiting_on_client.store(poll.is_pending(), Relaxed);
        match poll {
            Poll::Ready(Some(Err(e))) => {
                self.upload.failed.store(true, Relaxed);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                self.upload.done.store(true, Relaxed);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(f))) => {
                if self.inner.is_end_stream() {
                    self.upload.done.store(true, Relaxed);
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The worker's response body on its way to the client. See the [module documentation](self).
pub(crate) struct Guarded {
    inner: UpstreamBody,
    state: Option<Finish>,
    /// The pool's `read_timeout_ms`: the longest wait for the worker's next bytes.
    read_timeout: Duration,
    /// Armed the first time the body waits on the worker (a body that arrives with its head
    /// never needs one), moved on by each frame.
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A gRPC call whose status comes in the trailers: counted when they pass; a body that
    /// ends without them counts as `UNKNOWN` (2), one the worker cut as `UNAVAILABLE` (14), one
    /// the client left as `CANCELLED` (1), as each reaches a gRPC client.
    call: Option<Arc<keyroute_fleet::metrics::GrpcMethod>>,
}

impl std::fmt::Debug for Guarded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded").field("settled", &self.state.is_none()).finish_non_exhaustive()
    }
}

/// What the end of a response settles.
struct Finish {
    guard: InFlight,
    worker: Arc<WorkerState>,
    snapshot: Arc<Snapshot>,
    status: u16,
    upload: Arc<Upload>,
}

impl Guarded {
    /// Wraps a response body; a body that is already complete (HEAD, 204, 304, an empty 200) is
    /// settled at once, since nothing will poll it.
    pub(crate) fn new(
        inner: UpstreamBody,
        guard: InFlight,
        worker: Arc<WorkerState>,
        snapshot: Arc<Snapshot>,
        status: u16,
        upload: Arc<Upload>,
        read_timeout: Duration,
    ) -> Self {
        let state = Some(Finish { guard, worker, snapshot, status, upload });
        let mut g = Guarded { inner, state, read_timeout, idle: None, call: None };
        if g.inner.is_end_stream() {
            g.complete();
        }
        g
    }

    /// Counts the gRPC call's final status, when it comes in the trailers.
    pub(crate) fn counting(mut self, call: Option<Arc<keyroute_fleet::metrics::GrpcMethod>>) -> Self {
        // A body already complete has no trailers to wait for.
        if self.state.is_none() {
            if let Some(c) = call {
                c.record(b"2");
            }
        } else {
            self.call = call;
        }
        self
    }

    /// Read to the end: record the status, a success for passive ejection, pool the connection.
    fn complete(&mut self) {
        if let Some(c) = self.call.take() {
            c.record(b"2");
        }
        if let Some(f) = self.state.take() {
            f.worker.metrics.record_class(Some(f.status));
            if f.status < 500 {
                f.worker.observe_success();
            }
            drop(f.guard);
            // A connection whose request body is still going out (the worker answered early) is
            // not reusable yet: it is dropped rather than make the next request wait behind the
            // upload (the body says so).
            if let Some(conn) = self.inner.take_reusable()
                && let Some(upstream) = crate::upstream::of(&f.worker)
            {
                upstream.checkin(conn);
            }
        }
    }

    /// The worker's body failed mid-way: an upstream failure.
    fn fail(&mut self, error: &dyn std::fmt::Display) {
        if let Some(c) = self.call.take() {
            c.record(b"14");
        }
        if let Some(f) = self.state.take() {
            // The client's own upload broke the exchange, or a 5xx already counted as a failure:
            // nothing more against the worker.
            if f.upload.failed() || f.status >= 500 {
                f.worker.metrics.record_class(Some(f.status));
                return;
            }
            f.worker.metrics.record_class(None);
            f.worker.metrics.truncated.fetch_add(1, Relaxed);
            let may_eject = f.snapshot.may_eject();
            let first = f.worker.note_truncation();
            if let Some(ejection) = f.worker.observe_failure(may_eject, tokio::time::Instant::now()) {
                tracing::warn!(worker = %f.worker.name, ejection_ms = ejection.as_millis() as u64, "worker ejected after consecutive failures (responses cut short)");
            } else if first {
                tracing::warn!(worker = %f.worker.name, error = %error, "worker cut a response short");
            }
            drop(f.guard);
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // The client went away before the end: the worker did answer, so its status counts, but
        // neither as a success nor a failure for ejection; the connection is not reused.
        if let Some(c) = self.call.take() {
            c.record(b"1");
        }
        if let Some(f) = self.state.take() {
            f.worker.metrics.record_class(Some(f.status));
        }
    }
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            // The server stops polling once `is_end_stream` says so, so finish on the last frame.
            Poll::Ready(None) => {
                self.complete();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(t) = frame.trailers_ref()
                    && let Some(c) = self.call.take()
                {
                    c.record(t.get("grpc-status").map_or(&b"2"[..], |v| v.as_bytes()));
                }
                if self.inner.is_end_stream() {
                    self.complete();
                } else {
                    let next = tokio::time::Instant::now() + self.read_timeout;
                    if let Some(idle) = self.idle.as_mut() {
                        idle.as_mut().reset(next);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.fail(&e);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Pending => {
                let timeout = self.read_timeout;
                let idle = self.idle.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if idle.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                // nginx's `proxy_read_timeout`: the worker sent nothing for the whole timeout.
                let e = keyroute_http1::ExchangeError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no response bytes for {} ms (read_timeout_ms)", timeout.as_millis()),
                ));
                self.fail(&e);
                Poll::Ready(Some(Err(Box::new(e))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
