//! Forwarding one request, as a service that tests (and fuzzers) can call without a socket.
//!
//! The request path is a sequence of stages, each in its own file, read top-down in [`forward`]:
//!
//! | stage | file | what |
//! |---|---|---|
//! | route | [`route`] | the head read once (loop, framing, one Host, a normalised path), then listener, host and path prefix to a pool |
//! | key | [`key`] | the pool's key template over the request; a missing part is rejected (400) or placed by p2c |
//! | cache | [`cache`] | hot keys only: an answer from the gateway's cache, or a wait for a concurrent miss |
//! | head | [`headers`] | the upstream head: hop-by-hop removed, the allowed upgrade, `Forwarded`, `Via`, the request id; and the worker's response head as the client gets it |
//! | steer | [`steer`] | the worker for this try: the core's steering rule ([`keyroute::steer`]) over the snapshot, and how it was placed |
//! | attempt | [`attempt`] | one try on one worker, bounded and abandoned on a stall; whose failure it was |
//! | respond | [`respond`] | the worker's response (stored when it leads a cache miss), a tunnel ([`tunnel`]), or an error with a reason class and the request id |
//!
//! A request that may have reached a worker is retried only if it is idempotent and has no body;
//! one with a body goes to another worker only when its try failed before any connection took
//! the body (no connection, a refused TLS handshake): a gRPC call is never sent twice. A
//! client's broken upload is the client's error, never counted against the worker.

mod attempt;
mod cache;
mod grpc;
pub(crate) mod guarded;
pub(crate) mod headers;
mod key;
mod respond;
mod route;
mod steer;
pub(crate) mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::time::Instant;

use self::attempt::{Failure, Try, TryCtx, idempotent, try_once};
use self::guarded::{ClientBody, Upload};
pub(crate) use self::headers::Peer;
use crate::access::{AccessLog, Placed};
use crate::body::{BoxError, ProxyBody};
use crate::head::{Answer, ReqHead};
use crate::routing::{HttpPool, Routing};

/// What the request path shares with the rest of the server.
#[derive(Debug)]
pub struct Front {
    /// Pools and routes, swapped whole by a reload.
    pub routing: ArcSwap<Routing>,
    /// This gateway's `Via` entry.
    pub(crate) via: headers::Via,
    /// Request ids are made from this counter.
    pub(crate) next_request: AtomicU64,
    /// The listeners have closed: responses say `Connection: close`.
    pub draining: AtomicBool,
    /// Each listener's access log, if it has one.
    pub access_logs: Vec<Option<Arc<AccessLog>>>,
    /// Each listener's tunnel idle timeout and counters.
    pub(crate) tunnels: Vec<(Duration, Arc<keyroute_fleet::metrics::ListenerMetrics>)>,
}

impl Front {
    /// The request path of a server's client listeners: `routing` (pools and routes), each
    /// listener's access log and its tunnels' idle timeout and counters (none for a listener of
    /// another protocol).
    pub fn new(
        routing: Routing,
        access_logs: Vec<Option<Arc<AccessLog>>>,
        tunnels: Vec<(Duration, Arc<keyroute_fleet::metrics::ListenerMetrics>)>,
    ) -> Front {
        Front {
            routing: ArcSwap::from_pointee(routing),
            via: headers::Via::random(),
            next_request: AtomicU64::new(headers::random_u64()),
            draining: AtomicBool::new(false),
            access_logs,
            tunnels,
        }
    }
}

/// What a route gives the request path beyond its pool.
pub(super) struct Route<'a> {
    /// The upgrades it tunnels.
    pub(super) upgrades: &'a [String],
    /// The listener's tunnel idle timeout and counters.
    pub(super) tunnel: Option<&'a (Duration, Arc<keyroute_fleet::metrics::ListenerMetrics>)>,
}

/// The gateway's request path for one listener, callable without a socket.
#[derive(Clone, Debug)]
pub struct ProxyService {
    pub(crate) front: Arc<Front>,
    pub(crate) listener: usize,
}

impl ProxyService {
    /// The request path of client listener `listener` (its index among the HTTP listeners
    /// `front` was built with).
    pub fn new(front: Arc<Front>, listener: usize) -> ProxyService {
        ProxyService { front, listener }
    }

    /// Handles one request from `remote` as the listener would. Never fails: every error is a
    /// response.
    pub async fn call<B>(&self, req: Request<B>, remote: SocketAddr) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        handle(&self.front, self.listener, req, &Peer::new(remote)).await
    }
}

/// One request on its way through the stages: who asked, its id, and what the access log learns
/// of it. Built once by [`handle`]; each stage reads it rather than a list of arguments.
pub(super) struct Exchange<'a> {
    /// What the request path reads.
    pub(super) front: &'a Front,
    /// The listener it came in on.
    pub(super) listener: usize,
    /// The client.
    pub(super) peer: &'a Peer,
    /// Its request id.
    pub(super) id: &'a str,
    /// The same, as the header value it is sent in.
    pub(super) id_value: &'a HeaderValue,
    /// What the access log learns of it, when the listener has one.
    pub(super) placed: Option<&'a mut Placed>,
    /// It is a gRPC call (HTTP/2, `application/grpc`).
    pub(super) grpc: bool,
}

/// A request, answered: its id, then [`route::route_and_forward`]; with an access log, what
/// happened goes in the response's extensions ([`Placed`]).
pub(crate) async fn handle<B>(front: &Front, listener: usize, req: Request<B>, peer: &Peer) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    handle_head(front, listener, ReqHead::from_parts(parts), body, peer).await.into_response()
}

/// A request whose head is already the request path's ([`ReqHead`]), answered (see [`handle`]).
pub(crate) async fn handle_head<B>(front: &Front, listener: usize, mut head: ReqHead, body: B, peer: &Peer) -> Answer
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let id_value = headers::request_id(&head.fields, || front.next_request.fetch_add(1, Relaxed));
    // Visible ASCII either way (`request_id`).
    let id = id_value.to_str().unwrap_or_default();
    let log = front.access_logs.get(listener).and_then(Option::as_ref);
    let mut placed =
        log.map(|l| Placed { request_id: id.to_owned(), key: l.wants_key().then(String::new), ..Placed::default() });
    let grpc = head.version == http::Version::HTTP_2 && grpc::is_call(&head);
    let mut cx = Exchange { front, listener, peer, id, id_value: &id_value, placed: placed.as_mut(), grpc };
    let mut resp = route::route_and_forward(&mut cx, &mut head, body).await;
    if grpc {
        grpc::as_call_error(&mut resp);
    }
    if front.draining.load(Relaxed) {
        resp.head.fields.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(p) = placed {
        resp.head.extensions.insert(p);
    }
    resp
}

/// A routed request: a gRPC call is counted by its method and final status (the head's status
/// here; a status in the trailers by the response body, [`guarded::Guarded`]).
async fn forward<B>(cx: &mut Exchange<'_>, hp: &HttpPool, route: Route<'_>, head: &mut ReqHead, body: B) -> Answer
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let call = if cx.grpc { Some(hp.pool.metrics.grpc.method(head.uri.path())) } else { None };
    let resp = forward_stages(cx, hp, route, head, body, call.as_ref()).await;
    if let Some(call) = &call {
        grpc::count_head(call, &resp);
    }
    resp
}

/// A routed request, stage by stage (see the [module documentation](self)).
async fn forward_stages<B>(
    cx: &mut Exchange<'_>,
    hp: &HttpPool,
    route: Route<'_>,
    head: &mut ReqHead,
    body: B,
    call: Option<&Arc<keyroute_fleet::metrics::GrpcMethod>>,
) -> Answer
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let (pool, http, id) = (&hp.pool, &*hp.http, cx.id);
    let snap = pool.snapshot();
    let started = Instant::now();
    // Key.
    let mut key = crate::arena::key_text();
    let hash = match key::key_hash(pool, http, &snap, head, cx.peer, &mut key) {
        Ok(h) => h,
        Err(missing) => return respond::missing_key(pool, &missing, id).into(),
    };
    if let Some(p) = cx.placed.as_deref_mut() {
        p.pool = Some(Arc::from(pool.name.as_str()));
        p.key_hash = hash;
        if let Some(k) = &mut p.key {
            k.clone_from(&key);
        }
    }
    // Cache (hot keys).
    let looked = cache::look_up(cx, hp, &snap, hash, &key, head, body.is_end_stream());
    let (caching, waited) = match looked.await {
        cache::Looked::Hit(resp) => {
            if let Some(p) = cx.placed.as_deref_mut() {
                p.decision = "cache";
            }
            return resp.into();
        }
        cache::Looked::Lead(c) => (Some(*c), false),
        cache::Looked::Waited => (None, true),
        cache::Looked::Skip => (None, false),
    };
    // Head.
    // No upgrade is offered to workers reached through hyper (HTTP/2, TLS): see `upstream::mux`.
    // Through hyper (HTTP/2, TLS): no upgrade is offered (see `upstream::mux`), and an HTTP/2
    // worker gets the client's `TE: trailers`. The plain path reads neither.
    let mux = crate::upstream::through_mux(&http.upstream);
    let upgrades = if mux { &[] } else { route.upgrades };
    head.trailers = mux && headers::accepts_trailers(&head.fields);
    headers::upstream_head(head, upgrades, body.is_end_stream(), cx.peer, &cx.front.via, cx.id_value);
    // Steer and attempt, worker after worker.
    let replayable = body.is_end_stream();
    let upload = Arc::new(Upload::default());
    let retry = &snap.config().retry;
    // A request that waited for another's miss in vain has spent its patience: one try, never
    // abandoned (forty followers of a slow worker must not become forty times the retries). A
    // request with a body goes on to another worker only while no connection has taken its
    // body (a connect failure, a refused TLS handshake): see the stop below.
    let attempts = if !waited { retry.attempts } else { 1 };
    // A gRPC call's own deadline bounds it too.
    let call_timeout = if head.version == http::Version::HTTP_2 { grpc::timeout(head) } else { None };
    let deadline = started + call_timeout.map_or(retry.deadline, |t| t.min(retry.deadline));
    let mut body = Some(ClientBody::new(body, Arc::clone(&upload)).boxed_unsync());
    let mut tried: Vec<usize> = Vec::new();
    let mut last: Option<Failure> = None;
    for attempt in 0..attempts {
        let now = if attempt == 0 && !waited { started } else { Instant::now() };
        if now >= deadline {
            last = last.or(Some(Failure::Timeout));
            break;
        }
        let Some(decision) = steer::place(pool, &snap, hash, &tried, now, attempt, cx.placed.as_deref_mut()) else {
            break;
        };
        let worker = Arc::clone(&snap.workers()[decision.node]);
        let ctx = TryCtx {
            snap: &snap,
            http,
            worker: &worker,
            head,
            per_try: retry.per_try_timeout.min(deadline - now),
            replayable,
            upload: &upload,
            id,
            may_abandon: replayable && idempotent(&head.method) && attempt + 1 < attempts,
            // Abandon a stalled worker only when there is somewhere else to go (asked only then).
            elsewhere: &|| snap.has_other(&tried, decision.node, Instant::now()),
            call,
        };
        // Respond.
        match try_once(ctx, &mut body).await {
            Try::Answered(resp) => {
                tracing::trace!(request_id = %id, worker = %worker.name, attempt, key = %*key, "proxied");
                return respond::answered(hp.cache.as_deref(), head, resp, caching, waited).await;
            }
            Try::Upgraded(resp, worker_side, in_flight) => {
                return respond::upgraded(resp, worker_side, in_flight, &worker, &route, id, cx.placed.is_some());
            }
            Try::ClientFault(resp) => return resp.into(),
            Try::Failed(f) => {
                tracing::warn!(request_id = %id, pool = %pool.name, worker = %worker.name, attempt, failure = %f, "try failed");
                let stop =
                    (f.may_have_reached_worker() && !idempotent(&head.method)) || (!replayable && body.is_none());
                last = Some(f);
                tried.push(decision.node);
                if attempt + 1 == attempts || stop {
                    break;
                }
                worker.metrics.retries.fetch_add(1, Relaxed);
            }
        }
    }
    respond::failed(pool, &snap, last, id).into()
}
