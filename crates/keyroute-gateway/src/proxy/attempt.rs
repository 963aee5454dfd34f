//! The attempt stage: one try of a request on one worker, and whose failure it was.
//!
//! A try is bounded by the per-try timeout and the deadline, and abandoned early when its worker
//! has stalled (see [`keyroute_fleet::pool::WorkerState::stalled`]) and another can take the request. A
//! pooled connection that fails under a replayable, idempotent request is tried once more on a
//! fresh one. Then the result is classified: a client's broken or slow upload is the client's
//! (400/408, never counted against the worker, never retried); the gateway running out of
//! descriptors is its own (503); connect errors, timeouts, stalls and 5xx are the worker's and feed
//! passive ejection. The worker's response head loses its hop-by-hop headers and gains the
//! worker header ([`super::respond::worker_head`]); its body is guarded ([`super::guarded`]).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::guarded::{Guarded, Upload};
use super::headers::worker_head;
use crate::body::{self, ProxyBody};
use crate::config::HttpPoolConfig;
use crate::head::{Answer, ReqHead};
use crate::upstream::{SendError, Upgraded, UpstreamBody};
use keyroute_fleet::pool::{InFlight, Snapshot, WorkerState};

/// A worker's own cache result (`HIT` or `MISS`), which slow start reads.
static X_CACHE: http::HeaderName = http::HeaderName::from_static("x-cache");

pub(super) fn idempotent(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE)
}

/// Why a try failed, with the detail for the log.
#[derive(Debug)]
pub(super) enum Failure {
    /// No connection: the worker never saw the request.
    Connect(SendError),
    /// No response headers within the try's time.
    Timeout,
    /// The worker answered nothing at all for the stall window; the try was abandoned.
    Stalled,
    /// The connection failed after the request may have been sent.
    Upstream(SendError),
    /// The worker switched protocols (101) where the request offered none, or to one it did not
    /// offer (RFC 9110 §7.8).
    Unoffered,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(why) => write!(f, "connect: {why}"),
            Failure::Timeout => f.write_str("no response headers in time"),
            Failure::Stalled => f.write_str("the worker stalled; try abandoned"),
            Failure::Upstream(why) => write!(f, "upstream: {why}"),
            Failure::Unoffered => f.write_str("the worker switched to a protocol that was not offered"),
        }
    }
}

impl Failure {
    pub(super) fn may_have_reached_worker(&self) -> bool {
        !matches!(self, Failure::Connect(_))
    }
}

/// One try's result.
pub(super) enum Try {
    Answered(Answer),
    /// The worker switched protocols (101): the response to send, and the worker's side of the
    /// tunnel with the in-flight count that lasts as long as it does.
    Upgraded(Answer, Upgraded, InFlight),
    Failed(Failure),
    /// Not the worker's fault (the client's upload failed or stalled, or the gateway ran out of
    /// resources): answered without blaming the worker, and not retried.
    ClientFault(Response<ProxyBody>),
}

/// One try's inputs.
pub(super) struct TryCtx<'a> {
    pub(super) snap: &'a Arc<Snapshot>,
    pub(super) http: &'a HttpPoolConfig,
    pub(super) worker: &'a Arc<WorkerState>,
    pub(super) head: &'a ReqHead,
    pub(super) per_try: Duration,
    pub(super) replayable: bool,
    pub(super) upload: &'a Arc<Upload>,
    pub(super) id: &'a str,
    pub(super) may_abandon: bool,
    pub(super) elsewhere: &'a (dyn Fn() -> bool + Sync),
    /// A gRPC call's counters, for a status that comes in the response's trailers.
    pub(super) call: Option<&'a Arc<keyroute_fleet::metrics::GrpcMethod>>,
}

/// One try on one worker: [`send`] it (bounded by the try's time, abandoned when the worker
/// stalls), then [`classify`] what came back: whose failure it was, or the response to pass on.
pub(super) async fn try_once(ctx: TryCtx<'_>, body: &mut Option<ProxyBody>) -> Try {
    let guard = InFlight::new(Arc::clone(ctx.worker));
    let sent = Instant::now();
    let result = send(&ctx, body, sent).await;
    classify(&ctx, result, sent, guard)
}

/// What a send gave: the worker's response (its body holds the connection), the transport's
/// error, or the try's own end (timeout, stall).
type Sent = Result<Result<Answer<UpstreamBody>, SendError>, Failure>;

/// Sends the request to the worker and waits for its response head, until the try's deadline or
/// (for a try that may be abandoned) the worker stalls while another could take the request. A
/// pooled connection that fails under a replayable, idempotent request is tried once more on a
/// fresh one: the worker may just have closed it as idle.
async fn send(ctx: &TryCtx<'_>, body: &mut Option<ProxyBody>, sent: Instant) -> Sent {
    let TryCtx { snap, worker, head, per_try, replayable, may_abandon, elsewhere, .. } = *ctx;
    // Only a request without a body waits on the worker alone from the start; one with a body may
    // be waiting on its client's upload, which must never make the worker look stalled.
    let _waiting = replayable.then(|| worker.awaiting(sent));
    let Some(upstream) = crate::upstream::of(worker) else {
        // Another protocol's state holds the worker's slot: a configuration mistake, the gateway's.
        let error = std::io::Error::other("the worker is served by another protocol");
        return Ok(Err(SendError::Local { addr: worker.address, error }));
    };
    let connect_timeout = snap.config().connect_timeout;
    let stall = if may_abandon { snap.config().passive.stall } else { Duration::ZERO };
    let mut fresh_retry = replayable && idempotent(&head.method);
    let mut fresh = false;
    let until = sent + per_try;
    loop {
        // The head is written straight from the client's (rewritten) one: nothing is cloned.
        let send = upstream.send(&ctx.http.upstream, head, body, !fresh, connect_timeout);
        tokio::pin!(send);
        let r = loop {
            // Wake at the try's deadline, or when the worker would have stalled (re-read after
            // each wake: any response from it moves that moment on).
            let wake = if stall.is_zero() { until } else { worker.stall_deadline(stall).min(until) };
            tokio::select! {
                r = &mut send => break Ok(r),
                _ = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    if now >= until {
                        break Err(Failure::Timeout);
                    }
                    if worker.stalled(now, stall) && elsewhere() {
                        break Err(Failure::Stalled);
                    }
                }
            }
        };
        match r {
            Ok(Err(SendError::Request { reused: true, .. })) if fresh_retry => {
                fresh_retry = false;
                fresh = true;
            }
            r => break r,
        }
    }
}

/// Whose failure a send's result was, or the response to pass on: a client's broken or slow
/// upload is the client's, the gateway out of descriptors its own, anything else the worker's
/// (and feeds passive ejection); a 5xx is a failure now, a success is settled when its body ends.
fn classify(ctx: &TryCtx<'_>, result: Sent, sent: Instant, guard: InFlight) -> Try {
    let TryCtx { snap, http, worker, replayable, upload, id, .. } = *ctx;
    let arrived = Instant::now();
    let latency = arrived.saturating_duration_since(sent);
    let failure = match result {
        // A 101, asked for or not: the connection is the new protocol's now, never the pool's.
        Ok(Ok(resp)) if resp.head.status == StatusCode::SWITCHING_PROTOCOLS => {
            match switched(ctx, resp, arrived, latency, guard) {
                Ok(upgraded) => return upgraded,
                Err(f) => {
                    worker.metrics.record_class(None);
                    f
                }
            }
        }
        Ok(Ok(resp)) => {
            worker.answered(arrived);
            let status = resp.head.status;
            // The worker's own cache result, when it reports one: slow start reads it.
            if let Some(v) = resp.head.fields.get(&X_CACHE) {
                let word = |w: &[u8]| v.len() >= w.len() && v[..w.len()].eq_ignore_ascii_case(w);
                if word(b"hit") {
                    worker.note_cache(true);
                } else if word(b"miss") {
                    worker.note_cache(false);
                }
            }
            worker.metrics.record_latency(latency);
            if status.is_server_error() {
                // A 5xx is complete as a failure now; a success is settled when its body ends.
                if worker.observe_failure(snap.may_eject(), arrived).is_some() {
                    tracing::warn!(worker = %worker.name, status = status.as_u16(), "worker ejected after consecutive failures (5xx)");
                }
            }
            let mut resp = resp;
            worker_head(&mut resp.head.fields, http, worker);
            // A gRPC status in the head (Trailers-Only) is counted with the head; one in the
            // trailers, by the body.
            let in_trailers = ctx.call.filter(|_| !resp.head.fields.contains(&super::grpc::GRPC_STATUS)).cloned();
            return Try::Answered(resp.map(|incoming| {
                let guarded = Guarded::new(
                    incoming,
                    guard,
                    Arc::clone(worker),
                    Arc::clone(snap),
                    status.as_u16(),
                    Arc::clone(upload),
                    http.read_timeout,
                )
                .counting(in_trailers);
                guarded.boxed_unsync()
            }));
        }
        // The client's upload broke: its fault, whatever the connection then reported.
        _ if upload.failed() => {
            tracing::debug!(request_id = %id, worker = %worker.name, "the client's request body failed");
            return Try::ClientFault(body::error(
                StatusCode::BAD_REQUEST,
                "the request body is invalid or incomplete",
                "bad_request_body",
                id,
            ));
        }
        // Still uploading at the timeout, because the client was slow to send (not because the
        // worker stopped reading): the client's fault.
        Err(Failure::Timeout) if !replayable && !upload.done() && upload.waiting_on_client() => {
            tracing::debug!(request_id = %id, worker = %worker.name, "the client's upload was still incomplete at the timeout");
            return Try::ClientFault(body::error(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
                "request_body_timeout",
                id,
            ));
        }
        // The gateway is out of descriptors or memory: nobody's fault but its own.
        Ok(Err(why @ SendError::Local { .. })) => {
            tracing::error!(request_id = %id, worker = %worker.name, error = %why, "cannot open an upstream connection");
            return Try::ClientFault(body::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the gateway is out of resources",
                "gateway_overloaded",
                id,
            ));
        }
        Ok(Err(e)) => {
            worker.metrics.record_class(None);
            match e {
                e @ SendError::Connect { .. } => {
                    worker.metrics.connect_errors.fetch_add(1, Relaxed);
                    Failure::Connect(e)
                }
                e => Failure::Upstream(e),
            }
        }
        Err(f) => {
            worker.metrics.record_class(None);
            f
        }
    };
    worker.metrics.record_latency(latency);
    if let Some(ejection) = worker.observe_failure(snap.may_eject(), arrived) {
        tracing::warn!(worker = %worker.name, ejection_ms = ejection.as_millis() as u64, failure = %failure, "worker ejected after consecutive failures");
    }
    Try::Failed(failure)
}

/// The worker switched protocols: for an upgrade the request offered, the 101 to pass back and
/// the worker's side of the tunnel (its connection is the tunnel's now, never back to the pool).
/// A 101 to a request that offered no upgrade, or to a protocol it did not offer (RFC 9110
/// §7.8), is the worker's failure: its connection is dropped (the worker reads it as the new
/// protocol, so nothing may follow on it) and nothing of it reaches the client.
fn switched(
    ctx: &TryCtx<'_>,
    resp: Answer<UpstreamBody>,
    arrived: Instant,
    latency: Duration,
    guard: InFlight,
) -> Result<Try, Failure> {
    let TryCtx { http, worker, head, .. } = *ctx;
    let asked = head.fields.get(&header::UPGRADE).unwrap_or_default();
    let chosen = resp.head.fields.get(&header::UPGRADE).unwrap_or_default();
    let offered = |p: &[u8]| asked.split(|&b| b == b',').any(|a| a.trim_ascii().eq_ignore_ascii_case(p));
    if asked.is_empty() || !offered(chosen.trim_ascii()) {
        return Err(Failure::Unoffered);
    }
    worker.answered(arrived);
    worker.metrics.record_latency(latency);
    worker.metrics.record_class(Some(101));
    worker.observe_success();
    let Answer { mut head, body } = resp;
    let Some(worker_side) = body.into_upgraded() else { return Err(Failure::Unoffered) };
    let protocol = head.fields.value(&header::UPGRADE);
    worker_head(&mut head.fields, http, worker);
    head.fields.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Some(p) = protocol {
        head.fields.insert(header::UPGRADE, p);
    }
    Ok(Try::Upgraded(Answer { head, body: body::empty() }, worker_side, guard))
}
