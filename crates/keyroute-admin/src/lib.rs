//! # keyroute-admin: the admin API, its guard, the dashboard, `/metrics` and the event feed
//!
//! The admin API, on its own listener (loopback by default; a bearer token is required when it is
//! bound elsewhere, and enforced whenever one is configured), served by the HTTP gateway's engine
//! as a [`keyroute_gateway::connection::Service`] ([`AdminService`]). It inspects and changes the
//! pools ([`keyroute_fleet`]), reads the HTTP side's key templates and response caches, and reads
//! the rest of the running server through [`ServerView`]: nothing here owns a listener.
//!
//! | method and path | what |
//! |---|---|
//! | `GET /healthz` | the gateway process is up (no token needed) |
//! | `GET /readyz` | not shutting down, and every pool has an available worker (no token needed) |
//! | `GET /metrics` | Prometheus text |
//! | `GET /workers[?pool=P]` | each pool's workers: state, weight, in flight, counts |
//! | `POST /workers[?pool=P]` | add a worker: `{"name", "address", "weight"?, "zone"?}` |
//! | `DELETE /workers/NAME[?pool=P&drain=true]` | remove now, or drain (no new requests) then remove |
//! | `PATCH /workers/NAME[?pool=P]` | `{"weight": W}` |
//! | `GET /slowlog[?pool=P]` | cache pools: the last commands slower than `[pool.slow_log]`'s threshold, newest first |
//! | `GET /placement?key=K[&pool=P]` | the key's ranking and where it would go now (a replicated pool: its copies) |
//! | `GET /placement?key=K&add=NAME[:W]&remove=NAME&weight=NAME:W` | the same, and where the key would go after that change (each parameter may repeat): `what_if` |
//! | `GET /dashboard` | the operator's page (see [`dashboard`]) |
//! | `GET /events` | the page's feed: a snapshot a second as server-sent events (see [`dashboard`]) |
//! | `POST /placement[?pool=P]` | `{"keys": [...]}` (up to 1 MiB): each key's owner, `{"generation", "owners": [...]}` |
//!
//! On a pool whose members come from etcd, `POST`, `PATCH` and `DELETE /workers` write the change
//! to etcd (an add only if the name is free; a drain or weight as a compare-and-swap on the
//! record), so every gateway on the prefix applies it; the answer comes once this gateway has
//! applied it (`"applied": true`), or after 2 s with `"applied": false`. A drained record that
//! has no lease (an operator's) is deleted once this gateway has no request on it in flight; a
//! registered worker's record is left to the worker, which leaves by itself when it stops.
//!
//! `?pool=` may be omitted when there is one pool. Request bodies are JSON objects whose unknown
//! fields are refused, as a configuration file's are, and a worker is validated by the same
//! function as in a file (names of visible characters up to 256 bytes, an address that is not the
//! gateway's own). A known path with another method gets 405 with `Allow`. More than
//! ten failed token attempts from one address within a minute get 429 until the minute ends
//! (the right token still works; a request with no credentials still gets its 401 challenge).
//! Before any of this, [`guard`] refuses requests that came through a gateway, name another
//! Host, come from another origin, carry a body not declared JSON, or are a heavy GET another
//! site's page asked for. All of it is decided on the head ([`admit`]): a body is read only for
//! a request that passed, within [`BODY_TIMEOUT`]. Every answer says `nosniff`; query values are
//! form-decoded (`+` is a space).
//! Membership changes build their table on the blocking pool, never on a request thread.

// Handlers return `Result<Response, Response>`: the error is the response to send, and the admin
// API is not a hot path, so its size does not matter.
#![allow(clippy::result_large_err)]

pub mod dashboard;
mod exposition;
mod feed;
mod guard;
mod throttle;

use self::guard::Hosts;
use self::throttle::client_key;
use self::throttle::{AUTH_WINDOW, AuthThrottle};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use serde::Deserialize;
use tokio::time::Instant;

use keyroute_fleet::Fleet;
use keyroute_fleet::metrics::ListenerMetrics;
use keyroute_gateway::body::{self, ProxyBody};
use keyroute_gateway::proxy::Front;

/// An admin request's body, read whole by the connection before the request is handled (admin
/// bodies are small: [`MAX_BODY`]).
pub(crate) type AdminBody = http_body_util::Full<bytes::Bytes>;

/// The largest admin request body (the batch placement's).
pub(crate) const MAX_BODY: usize = 1 << 20;

/// What the admin API reads of the running server besides its pools: the client listeners and
/// their counters, the runtime threads' accept counts, the certificates in use, and whether the
/// server is shutting down. Each part is the server's own counter or value, shared.
#[derive(Debug)]
pub struct ServerView {
    /// The client listeners, in configuration order.
    pub listeners: Vec<ListenerView>,
    /// Each runtime thread's client connections (the index is the thread's).
    pub threads: Arc<parking_lot::Mutex<Vec<Arc<keyroute_fleet::metrics::ThreadMetrics>>>>,
    /// Each TLS listener's name and certificates.
    pub certificates: Vec<(String, Arc<keyroute_gateway::tls::Certificates>)>,
    /// Set once the server shuts down: `/readyz` says not ready.
    pub not_ready: Arc<std::sync::atomic::AtomicBool>,
}

/// A client listener as the admin API shows it.
#[derive(Debug)]
pub struct ListenerView {
    /// Its name.
    pub name: String,
    /// Where it listens.
    pub listen: SocketAddr,
    /// Whether it speaks TLS.
    pub tls: bool,
    /// Its counters.
    pub metrics: Arc<ListenerMetrics>,
    /// Its connection limit.
    pub limit: usize,
}

/// The admin API's settings: where it listens, its token and the host names it answers to.
#[derive(Clone, Debug)]
pub struct AdminConfig {
    /// Where it listens (loopback by default).
    pub listen: SocketAddr,
    /// The bearer token; required when `listen` is not a loopback address.
    pub token: Option<String>,
    /// Host names the API answers to besides its own address and `localhost` (DNS rebinding:
    /// any other `Host` gets 421).
    pub hosts: Vec<String>,
}

/// The admin API's state, shared by its connections and its feed's sampler.
#[derive(Debug)]
pub struct Admin {
    fleet: Arc<Fleet>,
    front: Arc<Front>,
    server: ServerView,
    token: Option<String>,
    hosts: Vec<String>,
    listen: SocketAddr,
    epoch: Instant,
    /// The admin listener's connection counts.
    metrics: Arc<ListenerMetrics>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    auth: AuthThrottle,
    /// The dashboard's subscribers and sampler.
    dashboard: feed::Hub,
    /// The `/placement` what-ifs being built now (at most [`MAX_WHAT_IFS`]).
    what_ifs: Arc<tokio::sync::Semaphore>,
}

impl Admin {
    /// The admin API of a server: its settings (`listen`: the address it is bound to), the pools,
    /// the HTTP side's view of them (`front`: key templates and response caches), the rest of the
    /// server, the admin listener's counters, and the server's stop.
    pub fn new(
        config: &AdminConfig,
        listen: SocketAddr,
        fleet: Arc<Fleet>,
        front: Arc<Front>,
        server: ServerView,
        metrics: Arc<ListenerMetrics>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Arc<Admin> {
        Arc::new(Admin {
            epoch: fleet.epoch(),
            fleet,
            front,
            server,
            token: config.token.clone(),
            hosts: config.hosts.clone(),
            listen,
            metrics,
            shutdown,
            auth: AuthThrottle::default(),
            dashboard: Default::default(),
            what_ifs: Arc::new(tokio::sync::Semaphore::new(MAX_WHAT_IFS)),
        })
    }

    /// The admin API's token.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Every address the server listens at.
    fn own_addrs(&self) -> Vec<SocketAddr> {
        self.fleet.own_addrs().to_vec()
    }

    /// Whether the server takes traffic: not shutting down, and every pool has an available
    /// worker (`/readyz`).
    pub fn ready(&self) -> bool {
        !self.server.not_ready.load(Relaxed) && self.fleet.ready(Instant::now())
    }
}
use crate::exposition::Scrape;
use keyroute_etcd::record::{RecordState, WorkerRecord};
use keyroute_etcd::registry::{ChangeError, Registry};
use keyroute_fleet::config::{EtcdConfig, validate_worker};
use keyroute_fleet::metrics::CLASSES;
use keyroute_fleet::pool::{MembershipError, Pool, WhatIf};
use keyroute_gateway::key::percent_decode;

fn json(status: StatusCode, value: serde_json::Value) -> Response<ProxyBody> {
    body::json(status, &value)
}

/// An error in keyroute's one shape (the gateway's and the workers' too): `error` for a person,
/// `reason` a fixed class for a program, and the status.
fn fail(status: StatusCode, message: impl Into<String>) -> Response<ProxyBody> {
    let reason = match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::CONFLICT => "conflict",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::MISDIRECTED_REQUEST => "misdirected",
        StatusCode::TOO_MANY_REQUESTS => "too_many_requests",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        StatusCode::GATEWAY_TIMEOUT => "timeout",
        s if s.is_server_error() => "internal",
        _ => "error",
    };
    json(status, serde_json::json!({ "error": message.into(), "reason": reason, "status": status.as_u16() }))
}

fn param(req: &Request<AdminBody>, name: &str) -> Option<String> {
    params(req, name).into_iter().next()
}

/// Every value of query parameter `name`, decoded.
fn params(req: &Request<AdminBody>, name: &str) -> Vec<String> {
    form_values(req.uri().query().unwrap_or(""), name)
}

/// Every value of `name` in a query as `application/x-www-form-urlencoded` writes it, which is how
/// a browser's `URLSearchParams` sends one: `+` is a space, then percent-decoding (a literal `+` is
/// `%2B`), in names as in values (the `form_urlencoded` crate, the WHATWG URL parser's). Only the
/// admin API's own parameters are read so; a proxied request's key keeps `+` (its placement is a
/// contract).
fn form_values(query: &str, name: &str) -> Vec<String> {
    form_urlencoded::parse(query.as_bytes()).filter(|(k, _)| k == name).map(|(_, v)| v.into_owned()).collect()
}

/// The endpoints: a path pattern and the methods it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Healthz,
    Readyz,
    Metrics,
    Workers,
    Worker,
    Placement,
    HotKeys,
    SlowLog,
    Dashboard,
    Events,
}

impl Endpoint {
    fn of(path: &str) -> Option<Endpoint> {
        Some(match path {
            "/healthz" => Endpoint::Healthz,
            "/readyz" => Endpoint::Readyz,
            "/metrics" => Endpoint::Metrics,
            "/workers" => Endpoint::Workers,
            "/placement" => Endpoint::Placement,
            "/hotkeys" => Endpoint::HotKeys,
            "/slowlog" => Endpoint::SlowLog,
            "/dashboard" => Endpoint::Dashboard,
            "/events" => Endpoint::Events,
            p if p.strip_prefix("/workers/").is_some_and(|n| !n.is_empty() && !n.contains('/')) => Endpoint::Worker,
            _ => return None,
        })
    }

    fn allow(self) -> &'static str {
        match self {
            Endpoint::Workers | Endpoint::Placement => "GET, POST",
            Endpoint::Worker => "DELETE, PATCH",
            _ => "GET",
        }
    }

    /// Whether a GET of it costs the gateway more than an answer: the feed (held open, a
    /// sampler) and the placement (a what-if builds a table). These are refused when a browser
    /// says another site's page asked for them ([`guard::check_heavy`]).
    fn is_heavy(self) -> bool {
        matches!(self, Endpoint::Events | Endpoint::Placement)
    }

    fn allows(self, m: &Method) -> bool {
        match self {
            Endpoint::Workers | Endpoint::Placement => m == Method::GET || m == Method::POST,
            Endpoint::Worker => m == Method::DELETE || m == Method::PATCH,
            _ => m == Method::GET,
        }
    }
}

/// `POST /workers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddWorker {
    name: String,
    address: String,
    #[serde(default = "one")]
    weight: u32,
    zone: Option<String>,
    /// The `haproxy` placement's server id.
    id: Option<u32>,
}

fn one() -> u32 {
    1
}

/// `PATCH /workers/NAME`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchWorker {
    weight: u32,
}

/// An admin request whose head passed [`gate`]: the endpoint it names. Only then is its body
/// read (see [`admit`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admitted(Endpoint);

/// How long an admitted request's body may take to arrive whole (408 after it): at least
/// [`MAX_BODY`] in 10 s, 100 KiB/s, so that a client that declares a body and sends it byte by
/// byte does not hold a connection of the listener's few.
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks an admin request on its head alone, before a byte of its body is read: the path and
/// method, the [`guard`], the probes that need no token (answered here), the token and its
/// throttle. A connection without the token is refused at once, whatever body it declares, so
/// that it holds nothing while it sends it (issue 31, defect 13).
///
/// `probes_only` is a connection of the listener's reserve (see `server::ADMIN_PROBE_CONNECTIONS`):
/// it is answered only `/healthz`, `/readyz` and `/metrics`.
///
/// # Errors
///
/// The answer to send instead (the body is then never read).
pub(crate) fn admit(
    shared: &Admin,
    head: &http::request::Parts,
    remote: SocketAddr,
    probes_only: bool,
) -> Result<Admitted, Response<ProxyBody>> {
    let endpoint = gate(shared, head, remote)?;
    if probes_only && endpoint != Endpoint::Metrics {
        return Err(fail(
            StatusCode::SERVICE_UNAVAILABLE,
            "the admin listener is at its connection limit: only /healthz, /readyz and /metrics are answered",
        ));
    }
    Ok(Admitted(endpoint))
}

/// Marks every admin answer `X-Content-Type-Options: nosniff` (issue 31, defect 21): a JSON or
/// text answer is never to be read by a browser as a script or a page, whatever it holds.
pub(crate) fn seal(mut resp: Response<ProxyBody>) -> Response<ProxyBody> {
    resp.headers_mut().insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    resp
}

/// The admin API as an HTTP service on the gateway's engine: a request's head is admitted first
/// ([`admit`]: one without the token is answered before a byte of its body is read), then its
/// body read whole within [`BODY_TIMEOUT`] (the admin API's bodies are small: a larger one is
/// refused), then the endpoint's answer, marked `nosniff`. `probes_only`: a connection of the
/// listener's reserve, which answers only the probes.
#[derive(Debug)]
pub struct AdminService {
    /// The admin API.
    pub admin: Arc<Admin>,
    /// Whether only the probes are answered (a connection of the listener's reserve).
    pub probes_only: bool,
}

impl keyroute_gateway::connection::Service for AdminService {
    fn call(
        &self,
        req: Request<keyroute_http1::RequestBody>,
        remote: SocketAddr,
    ) -> std::pin::Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send + '_>> {
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let admitted = match admit(&self.admin, &parts, remote, self.probes_only) {
                Ok(a) => a,
                Err(answer) => return seal(answer),
            };
            let resp = match tokio::time::timeout(BODY_TIMEOUT, read_body(body)).await {
                Ok(Ok(b)) => {
                    let req = Request::from_parts(parts, http_body_util::Full::new(b));
                    handle(&self.admin, admitted, req, remote).await
                }
                Ok(Err(_)) => body::error(
                    StatusCode::BAD_REQUEST,
                    "the body could not be read (at most 1024 KiB)",
                    "bad_request_body",
                    "-",
                ),
                Err(_) => {
                    body::error(StatusCode::REQUEST_TIMEOUT, "the body did not arrive within 10 s", "body_timeout", "-")
                }
            };
            seal(resp)
        })
    }
}

/// A request body read whole, at most [`MAX_BODY`] bytes.
async fn read_body(mut body: keyroute_http1::RequestBody) -> Result<bytes::Bytes, ()> {
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(drop)?.into_data() else { continue };
        if out.len() + data.len() > MAX_BODY {
            return Err(());
        }
        out.extend_from_slice(&data);
    }
    Ok(out.freeze())
}

/// Handles one admitted admin request: the endpoint's function.
pub(crate) async fn handle(
    shared: &Arc<Admin>,
    Admitted(endpoint): Admitted,
    req: Request<AdminBody>,
    remote: SocketAddr,
) -> Response<ProxyBody> {
    let path = req.uri().path().to_owned();
    let pools = shared.fleet.pools();
    let pool_name = param(&req, "pool");
    match endpoint {
        Endpoint::Metrics => return metrics(shared, &pools),
        Endpoint::Dashboard => return dashboard::page(),
        Endpoint::Events => return dashboard::events(shared, remote.ip()),
        _ => {}
    }
    if matches!(endpoint, Endpoint::HotKeys | Endpoint::SlowLog)
        || (endpoint == Endpoint::Workers && req.method() == Method::GET)
    {
        let pools: Vec<Arc<Pool>> = match &pool_name {
            Some(_) => match pick_pool(&pools, pool_name.as_deref()) {
                Ok(p) => vec![Arc::clone(p)],
                Err(e) => return fail(StatusCode::NOT_FOUND, e.to_string()),
            },
            None => pools.to_vec(),
        };
        let routing = shared.front.routing.load();
        let http = |p: &Pool| routing.http_pool(&p.name);
        let one = |p: &Pool| match endpoint {
            Endpoint::HotKeys => hot_keys(p, http(p)),
            Endpoint::SlowLog => slow_log(p),
            _ => describe(p, http(p)),
        };
        return json(StatusCode::OK, serde_json::json!({ "pools": pools.iter().map(|p| one(p)).collect::<Vec<_>>() }));
    }
    let pool = match pick_pool(&pools, pool_name.as_deref()) {
        Ok(p) => Arc::clone(p),
        Err(e) => return fail(StatusCode::NOT_FOUND, e.to_string()),
    };
    let worker_name = path.strip_prefix("/workers/").map(|v| percent_decode(v).into_owned()).unwrap_or_default();
    match (endpoint, req.method().clone()) {
        (Endpoint::Workers | Endpoint::Worker, _) if etcd_of(&pool).is_some() => {
            etcd_change(shared, pool, endpoint, req, worker_name).await
        }
        (Endpoint::Workers, Method::POST) | (Endpoint::Worker, _)
            if pool.snapshot().config().membership.dns().is_some() =>
        {
            fail(
                StatusCode::CONFLICT,
                "the pool's members come from DNS ([pool.membership] source = \"dns\"): change its records",
            )
        }
        (Endpoint::Placement, Method::POST) => place_batch(&pool, req).await,
        (Endpoint::Placement, _) => match (param(&req, "key"), what_if_of(&req)) {
            (None, _) => fail(StatusCode::BAD_REQUEST, "?key= is required"),
            (_, Err(message)) => fail(StatusCode::BAD_REQUEST, message),
            (Some(key), Ok(change)) => placement(shared, pool, key, change).await,
        },
        (Endpoint::Workers, _) => add_worker(shared, pool, req).await,
        (Endpoint::Worker, Method::DELETE) if param(&req, "drain").as_deref() == Some("true") => {
            drain(pool, &worker_name)
        }
        (Endpoint::Worker, Method::DELETE) => remove_worker(pool, worker_name).await,
        (Endpoint::Worker, _) => patch_worker(pool, worker_name, req).await,
        (
            Endpoint::Healthz
            | Endpoint::Readyz
            | Endpoint::Metrics
            | Endpoint::HotKeys
            | Endpoint::SlowLog
            | Endpoint::Dashboard
            | Endpoint::Events,
            _,
        ) => fail(StatusCode::NOT_FOUND, "no such admin endpoint"),
    }
}

/// Who may ask what, before any endpoint runs: the path and method (404, 405), the
/// [`guard`]'s origin and Host rules, the probes that need no token, then the token and its
/// throttle. `Err` is the answer to send instead.
fn gate(shared: &Admin, head: &http::request::Parts, remote: SocketAddr) -> Result<Endpoint, Response<ProxyBody>> {
    let path = head.uri.path();
    let Some(endpoint) = Endpoint::of(path) else { return Err(fail(StatusCode::NOT_FOUND, "no such admin endpoint")) };
    if !endpoint.allows(&head.method) {
        let mut resp = fail(StatusCode::METHOD_NOT_ALLOWED, format!("{path} takes {}", endpoint.allow()));
        resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static(endpoint.allow()));
        return Err(resp);
    }
    let hosts = Hosts::new(shared.listen, &shared.hosts);
    let checked = guard::check(&hosts, &head.method, &head.headers)
        .and_then(|()| if endpoint.is_heavy() { guard::check_heavy(&hosts, &head.headers) } else { Ok(()) });
    if let Err(refused) = checked {
        tracing::warn!(%remote, %path, reason = refused.message(), "admin request refused");
        return Err(fail(refused.status(), refused.message()));
    }
    match endpoint {
        Endpoint::Healthz => return Err(body::text(StatusCode::OK, "text/plain", "ok\n")),
        Endpoint::Readyz => return Err(readyz(shared)),
        _ => {}
    }
    authorize(shared, &head.headers, endpoint, remote, path)?;
    Ok(endpoint)
}

/// The token check. The right token always works. A wrong one counts against its address, and
/// from a throttled address gets 429. A request with no credentials at all guesses nothing: it
/// is not counted, and always gets the 401 and its challenge, so that a browser, which asks for
/// credentials only when challenged, can start a login from an address someone else has
/// throttled (issue 31, defect 15).
fn authorize(
    shared: &Admin,
    headers: &http::HeaderMap,
    endpoint: Endpoint,
    remote: SocketAddr,
    path: &str,
) -> Result<(), Response<ProxyBody>> {
    let Some(token) = &shared.token else { return Ok(()) };
    let presented = guard::credential(headers);
    if guard::token_matches(presented.as_deref(), token) {
        return Ok(());
    }
    let now = Instant::now();
    if presented.is_some() {
        if shared.auth.blocked(remote.ip(), now) {
            let mut resp = fail(StatusCode::TOO_MANY_REQUESTS, "too many failed token attempts; try again later");
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(AUTH_WINDOW.as_secs()));
            return Err(resp);
        }
        shared.auth.fail(remote.ip(), now);
        tracing::warn!(%remote, %path, "admin request with a wrong token");
    }
    let mut resp = fail(StatusCode::UNAUTHORIZED, "a valid bearer token is required");
    let h = resp.headers_mut();
    h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    // A browser asks for Basic credentials (the token as the password) when offered them, and
    // Chromium only sees Basic offered on a challenge line of its own (issue 31, defect 14).
    if matches!(endpoint, Endpoint::Dashboard | Endpoint::Events) {
        h.append(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"keyroute admin\", charset=\"UTF-8\""),
        );
    }
    Err(resp)
}

/// `GET /readyz`.
fn readyz(shared: &Admin) -> Response<ProxyBody> {
    let detail = sources_detail(shared);
    if shared.ready() {
        body::text(StatusCode::OK, "text/plain", format!("ready\n{detail}"))
    } else if shared.server.not_ready.load(Relaxed) {
        body::text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("not ready: shutting down\n{detail}"))
    } else {
        body::text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("not ready: a pool has no available worker\n{detail}"),
        )
    }
}

/// The pool named `name`, or the only one when no name is given.
///
/// # Errors
///
/// No pool has that name, or none is named and there are several.
fn pick_pool<'a>(pools: &'a [Arc<Pool>], name: Option<&str>) -> Result<&'a Arc<Pool>, NoPool> {
    match name {
        Some(n) => pools.iter().find(|p| p.name == n).ok_or(NoPool::Unknown),
        None if pools.len() == 1 => Ok(&pools[0]),
        None => Err(NoPool::Ambiguous(pools.iter().map(|p| p.name.clone()).collect())),
    }
}

/// Why [`pick_pool`] found no pool.
#[derive(Debug, thiserror::Error)]
enum NoPool {
    /// No pool has the name.
    #[error("no such pool")]
    Unknown,
    /// No name, and several pools (their names).
    #[error("several pools ({}): name one with ?pool=", .0.join(", "))]
    Ambiguous(Vec<String>),
}

/// `GET /metrics`.
fn metrics(shared: &Admin, pools: &[Arc<Pool>]) -> Response<ProxyBody> {
    let routing = shared.front.routing.load();
    let scrape = Scrape {
        pools: pools.to_vec(),
        caches: routing
            .pools
            .iter()
            .filter_map(|p| Some((p.pool.name.clone(), Arc::clone(p.cache.as_ref()?))))
            .collect(),
        listeners: shared
            .server
            .listeners
            .iter()
            .map(|l| (l.name.clone(), l.limit as u64, Arc::clone(&l.metrics)))
            .collect(),
        threads: shared
            .server
            .threads
            .lock()
            .iter()
            .map(|t| (t.accepted.load(Relaxed), t.open.load(Relaxed), t.handed_over.load(Relaxed)))
            .collect(),
        admin_auth_failures: shared.auth.failures.load(Relaxed),
        dashboard_viewers: shared.dashboard.viewers() as u64,
        certificates: shared
            .server
            .certificates
            .iter()
            .flat_map(|(name, c)| {
                c.expiry(std::time::SystemTime::now())
                    .into_iter()
                    .map(|(file, secs)| (name.clone(), file.display().to_string(), secs))
            })
            .collect(),
    };
    body::text(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", crate::exposition::render(scrape))
}

/// `POST /placement`: each key's owner.
async fn place_batch(pool: &Pool, req: Request<AdminBody>) -> Response<ProxyBody> {
    let batch: PlaceBatch = match read_json_limited(req, MAX_BODY).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let snap = pool.snapshot();
    let owners: Vec<Option<&str>> =
        batch.keys.iter().map(|k| snap.owner_of(k.as_bytes()).map(|w| w.name.as_str())).collect();
    json(StatusCode::OK, serde_json::json!({ "pool": pool.name, "generation": snap.generation(), "owners": owners }))
}

/// `POST /workers` on a static pool.
async fn add_worker(shared: &Admin, pool: Arc<Pool>, req: Request<AdminBody>) -> Response<ProxyBody> {
    let add: AddWorker = match read_json(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let own = shared.own_addrs();
    off_thread(move || {
        let mut config = validate_worker(&add.name, &add.address, add.weight, add.zone.as_deref(), &own)
            .map_err(|e| fail(StatusCode::BAD_REQUEST, format!("\"{}\": {}", e.field, e.message)))?;
        if add.id == Some(0) {
            return Err(fail(StatusCode::BAD_REQUEST, "\"id\": must be at least 1"));
        }
        config.id = add.id;
        let name = config.name.clone();
        let generation = pool.add_worker(config).map_err(membership_error)?;
        Ok(json(StatusCode::CREATED, serde_json::json!({ "added": name, "pool": pool.name, "generation": generation })))
    })
    .await
}

/// `DELETE /workers/NAME` on a static pool, now.
async fn remove_worker(pool: Arc<Pool>, name: String) -> Response<ProxyBody> {
    off_thread(move || {
        let generation = pool.remove_worker(&name).map_err(membership_error)?;
        Ok(json(StatusCode::OK, serde_json::json!({ "removed": name, "pool": pool.name, "generation": generation })))
    })
    .await
}

/// `PATCH /workers/NAME` on a static pool.
async fn patch_worker(pool: Arc<Pool>, name: String, req: Request<AdminBody>) -> Response<ProxyBody> {
    let patch: PatchWorker = match read_json(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    off_thread(move || {
        let generation = pool.set_weight(&name, patch.weight).map_err(membership_error)?;
        Ok(json(
            StatusCode::OK,
            serde_json::json!({ "worker": name, "weight": patch.weight, "generation": generation }),
        ))
    })
    .await
}

fn membership_error(e: MembershipError) -> Response<ProxyBody> {
    let status = match &e {
        MembershipError::UnknownWorker { .. } => StatusCode::NOT_FOUND,
        MembershipError::Duplicate { .. } => StatusCode::CONFLICT,
        MembershipError::TooLarge { .. } | MembershipError::Placement { .. } => StatusCode::UNPROCESSABLE_ENTITY,
    };
    fail(status, e.to_string())
}

/// Runs a membership change (name resolution, a table build) on the blocking pool.
async fn off_thread(
    f: impl FnOnce() -> Result<Response<ProxyBody>, Response<ProxyBody>> + Send + 'static,
) -> Response<ProxyBody> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(r) | Err(r)) => r,
        Err(e) => {
            tracing::error!(error = %e, "admin change task failed");
            fail(StatusCode::INTERNAL_SERVER_ERROR, "the change did not complete")
        }
    }
}

fn drain(pool: Arc<Pool>, name: &str) -> Response<ProxyBody> {
    let Some(w) = pool.snapshot().worker(name).map(|(_, w)| Arc::clone(w)) else {
        return fail(StatusCode::NOT_FOUND, format!("no worker named '{}'", name.escape_debug()));
    };
    w.drain();
    let pool_name = pool.name.clone();
    tokio::spawn(async move {
        let until = Instant::now() + Duration::from_secs(300);
        while w.in_flight() > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (p, w2) = (Arc::clone(&pool), Arc::clone(&w));
        match tokio::task::spawn_blocking(move || p.remove_exact(&w2)).await {
            Ok(Ok(g)) => tracing::info!(pool = %pool.name, worker = %w.name, generation = g, "drained and removed"),
            Ok(Err(e)) => {
                tracing::warn!(pool = %pool.name, worker = %w.name, error = %e, "drain finished but removal failed")
            }
            Err(e) => tracing::error!(error = %e, "drain removal task failed"),
        }
    });
    json(StatusCode::ACCEPTED, serde_json::json!({ "draining": name, "pool": pool_name }))
}

/// `GET /slowlog`: a cache pool's recent commands over its threshold (`[pool.slow_log]`), newest
/// first; keys as their placement hash unless the pool shows key text.
fn slow_log(pool: &Pool) -> serde_json::Value {
    let config = pool.snapshot().config().slow_log;
    serde_json::json!({
        "pool": pool.name,
        "threshold_ms": config.threshold.as_millis() as u64,
        "entries": config.entries,
        "show_keys": config.show_keys,
        "commands": pool.metrics.slow.entries(),
    })
}

/// A pool's hot keys (also the dashboard's): each with its key text when a sampled request showed it, hash, measured rate,
/// replica count and replicas (the first of its ranking), plus the cache's figures.
fn hot_keys(pool: &Pool, http: Option<&keyroute_gateway::routing::HttpPool>) -> serde_json::Value {
    let snap = pool.snapshot();
    let Some(hot) = snap.hot() else {
        return serde_json::json!({ "pool": pool.name, "enabled": false, "keys": [] });
    };
    let keys: Vec<serde_json::Value> = hot
        .report(&snap)
        .into_iter()
        .map(|k| {
            serde_json::json!({
                "key": k.key,
                "hash": format!("{:016x}", k.hash),
                "rate": (k.rate * 10.0).round() / 10.0,
                "replicas": k.replicas,
                "owners": k.owners,
            })
        })
        .collect();
    let cache = http.and_then(|h| h.cache.as_ref()).map(|c| {
        let m = &c.metrics;
        serde_json::json!({
            "bytes": c.store.bytes(),
            "entries": c.store.entries(),
            "hits": m.hits.load(Relaxed),
            "coalesced": m.coalesced.load(Relaxed),
            "misses": m.misses.load(Relaxed),
            "stores": m.stores.load(Relaxed),
        })
    });
    let threshold = match hot.config.rule.threshold {
        keyroute::hot::Threshold::Rate(r) => serde_json::json!({ "rate": r }),
        keyroute::hot::Threshold::Share(s) => serde_json::json!({ "share": s }),
    };
    serde_json::json!({
        "pool": pool.name,
        "enabled": true,
        "threshold": threshold,
        "per_worker": hot.config.rule.per_replica,
        "max_replicas": hot.config.rule.max_replicas,
        "keys": keys,
        "cache": cache,
    })
}

/// The largest hypothetical change `/placement` builds (each name one table entry or more).
const MAX_WHAT_IF: usize = 64;

/// `add=NAME[:W]`, `remove=NAME`, `weight=NAME:W`: a hypothetical change for `/placement`. A name
/// may itself hold `:`; only a number after the last one is a weight.
fn what_if_of(req: &Request<AdminBody>) -> Result<WhatIf, String> {
    fn weighted(v: &str) -> Option<(String, u32)> {
        let (name, w) = v.rsplit_once(':')?;
        Some((name.to_owned(), w.parse().ok()?))
    }
    let add = params(req, "add").into_iter().map(|v| weighted(&v).unwrap_or((v, 1))).collect::<Vec<_>>();
    let reweight = params(req, "weight")
        .into_iter()
        .map(|v| weighted(&v).ok_or_else(|| format!("weight={}: NAME:WEIGHT is expected", v.escape_debug())))
        .collect::<Result<Vec<_>, _>>()?;
    let change = WhatIf { add, remove: params(req, "remove"), reweight };
    if change.add.len() + change.remove.len() + change.reweight.len() > MAX_WHAT_IF {
        return Err(format!("at most {MAX_WHAT_IF} changes"));
    }
    for (name, _) in &change.add {
        // The same rule as a real worker's name (any address will do: only the name is checked).
        let any = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        keyroute_fleet::config::validate_worker_with(name, "127.0.0.1:1", 1, None, &[], |_| Some(any))
            .map_err(|e| format!("add={}: {}", name.escape_debug(), e.message))?;
    }
    Ok(change)
}

/// What-ifs built at once: each is a table of up to a few times its pool's (see
/// `Snapshot::what_if`) on the blocking pool; the next gets 503 until one ends
/// (issue 31, defect 16: sixteen at once took 1.7 GiB).
pub(crate) const MAX_WHAT_IFS: usize = 2;

/// A place among the what-ifs built at once, held until the build ends.
///
/// # Errors
///
/// 503 with `Retry-After` when [`MAX_WHAT_IFS`] are being built.
fn start_what_if(
    building: &Arc<tokio::sync::Semaphore>,
) -> Result<tokio::sync::OwnedSemaphorePermit, Response<ProxyBody>> {
    Arc::clone(building).try_acquire_owned().map_err(|_| {
        let mut resp = fail(StatusCode::SERVICE_UNAVAILABLE, "other what-ifs are being built; ask again in a moment");
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        resp
    })
}

/// `GET /placement`: the key's ranking, and with a hypothetical change where it would go then
/// (built on the blocking pool: a table can take a while).
async fn placement(shared: &Admin, pool: Arc<Pool>, key: String, change: WhatIf) -> Response<ProxyBody> {
    if change.is_empty() {
        return json(StatusCode::OK, placement_now(&pool, &key));
    }
    let building = match start_what_if(&shared.what_ifs) {
        Ok(p) => p,
        Err(busy) => return busy,
    };
    off_thread(move || {
        let _building = building;
        let mut answer = placement_now(&pool, &key);
        let snap = pool.snapshot();
        let (policy, names) = snap.what_if(&change).map_err(|e| fail(StatusCode::BAD_REQUEST, e))?;
        let hash = snap.policy().key_hash(key.as_bytes());
        let keyed = snap.policy().strategy().hashes_key(key.as_bytes());
        let owner_now = |h: u64| snap.policy().owner(h).map(|i| snap.workers()[i].name.as_str());
        let owner_then = |h: u64| policy.owner(h).map(|i| names[i].as_str());
        let sample = pool.recent_keys();
        let moved = sample.iter().filter(|&&h| owner_now(h) != owner_then(h)).count();
        let owner = keyed.then(|| owner_then(hash)).flatten();
        answer["what_if"] = serde_json::json!({
            "add": change.add.iter().map(|(n, w)| serde_json::json!({ "name": n, "weight": w })).collect::<Vec<_>>(),
            "remove": change.remove,
            "weight": change.reweight.iter().map(|(n, w)| serde_json::json!({ "name": n, "weight": w })).collect::<Vec<_>>(),
            "owner": owner,
            "ranking": if keyed { policy.ranked(hash).take(8).map(|i| names[i].as_str()).collect::<Vec<_>>() } else { Vec::new() },
            "moves": keyed && owner != owner_now(hash),
            "remapped": if sample.is_empty() { 0.0 } else { moved as f64 / sample.len() as f64 },
            "sampled_keys": sample.len(),
        });
        Ok(json(StatusCode::OK, answer))
    })
    .await
}

fn placement_now(pool: &Pool, key: &str) -> serde_json::Value {
    let snap = pool.snapshot();
    let now = Instant::now();
    let hash = snap.policy().key_hash(key.as_bytes());
    // As the proxy decides: nginx and HAProxy do not hash an empty key, nor do their modes.
    let keyed = snap.policy().strategy().hashes_key(key.as_bytes());
    let ranking: Vec<serde_json::Value> = snap
        .policy()
        .ranked(hash)
        .filter(|_| keyed)
        .map(|i| {
            serde_json::json!({
                "name": snap.workers()[i].name,
                "state": snap.state(i, now),
                "in_flight": snap.workers()[i].in_flight(),
                "weight": snap.weight(i),
            })
        })
        .collect();
    let decision = snap.decide(keyed.then_some(hash), &[], now);
    serde_json::json!({
            "pool": pool.name,
            "strategy": snap.policy().strategy().name(),
            "generation": snap.generation(),
            "key": key,
            "hash": format!("{hash:016x}"),
            "owner": snap.owner_of(key.as_bytes()).map(|w| w.name.clone()),
            "ranking": ranking,
            "would_go_to": decision.map(|d| snap.workers()[d.node].name.clone()),
            "unavailable": decision.is_none().then(|| snap.why_unavailable(now).to_string()),
            // A replicated pool's copies of the key now, in the order reads ask them.
            "copies": snap.config().replication.filter(|_| keyed).map(|r| {
                snap.copies(hash, r.copies, now).into_iter().map(|i| snap.workers()[i].name.clone()).collect::<Vec<_>>()
            }),
    })
}

async fn read_json<T: serde::de::DeserializeOwned>(req: Request<AdminBody>) -> Result<T, Response<ProxyBody>> {
    read_json_limited(req, 64 * 1024).await
}

async fn read_json_limited<T: serde::de::DeserializeOwned>(
    req: Request<AdminBody>,
    limit: usize,
) -> Result<T, Response<ProxyBody>> {
    let body = Limited::new(req.into_body(), limit).collect().await.map_err(|_| {
        fail(StatusCode::BAD_REQUEST, format!("the body could not be read (at most {} KiB)", limit / 1024))
    })?;
    parse_object(&body.to_bytes()).map_err(|e| fail(StatusCode::BAD_REQUEST, format!("the body: {e}")))
}

/// `POST /placement`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlaceBatch {
    keys: Vec<String>,
}

/// The pool's etcd source, if its members come from etcd.
fn etcd_of(pool: &Pool) -> Option<EtcdConfig> {
    pool.snapshot().config().membership.etcd().cloned()
}

/// One line per etcd-backed pool for `/readyz`: is the source up, what revision, how old.
fn sources_detail(shared: &Admin) -> String {
    let mut out = String::new();
    for p in shared.fleet.pools().iter() {
        if etcd_of(p).is_none() {
            continue;
        }
        let at = Duration::from_millis(p.source.current_at_ms.load(Relaxed));
        let age = p.epoch().elapsed().saturating_sub(at).as_secs_f64();
        let revision = p.source.revision.load(Relaxed);
        let workers = p.snapshot().workers().len();
        if p.source.up.load(Relaxed) == 1 {
            out.push_str(&format!(
                "pool {}: membership from etcd, up, revision {revision}, {workers} workers\n",
                p.name
            ));
        } else {
            out.push_str(&format!(
                "pool {}: membership source etcd unreachable for {age:.1} s; serving the last known members (revision {revision}, {workers} workers)\n",
                p.name
            ));
        }
    }
    out
}

/// Waits (up to 2 s) until this gateway has applied the source's `revision`: woken by each apply,
/// not by polling.
async fn applied(pool: &Pool, revision: i64) -> bool {
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        // Registered before the check, so that an apply between the two is not missed.
        let next = pool.applied.notified();
        tokio::pin!(next);
        next.as_mut().enable();
        if pool.source.revision.load(Relaxed) as i64 >= revision {
            return true;
        }
        tokio::select! {
            () = next => {}
            () = tokio::time::sleep_until(until) => return pool.source.revision.load(Relaxed) as i64 >= revision,
        }
    }
}

fn change_error(e: ChangeError) -> Response<ProxyBody> {
    match e {
        ChangeError::Unknown(_) => fail(StatusCode::NOT_FOUND, e.to_string()),
        ChangeError::Exists(_) | ChangeError::Contended(_) => fail(StatusCode::CONFLICT, e.to_string()),
        ChangeError::Invalid { .. } => fail(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        ChangeError::Etcd(e) => {
            tracing::warn!(error = %e, "admin change: etcd");
            fail(StatusCode::SERVICE_UNAVAILABLE, "the membership store (etcd) could not be reached; nothing changed")
        }
    }
}

/// A membership change of an etcd-backed pool: written to etcd, applied by the watch.
async fn etcd_change(
    shared: &Arc<Admin>,
    pool: Arc<Pool>,
    endpoint: Endpoint,
    req: Request<AdminBody>,
    name: String,
) -> Response<ProxyBody> {
    let Some(cfg) = etcd_of(&pool) else { return fail(StatusCode::CONFLICT, "the pool's source changed") };
    let registry = match Registry::new(&cfg.endpoints, &cfg.prefix) {
        Ok(r) => r,
        Err(e) => return change_error(ChangeError::Etcd(e)),
    };
    let method = req.method().clone();
    let drain_request = param(&req, "drain").as_deref() == Some("true");
    let (status, what, result) = match (endpoint, method) {
        (Endpoint::Workers, _) => {
            let add: AddWorker = match read_json(req).await {
                Ok(v) => v,
                Err(r) => return r,
            };
            let own = shared.own_addrs();
            // Off the request threads: a host name is resolved.
            let (n, a, z) = (add.name.clone(), add.address.clone(), add.zone.clone());
            let checked = tokio::task::spawn_blocking(move || validate_worker(&n, &a, 1, z.as_deref(), &own)).await;
            match checked {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return fail(StatusCode::BAD_REQUEST, format!("\"{}\": {}", e.field, e.message)),
                Err(_) => return fail(StatusCode::INTERNAL_SERVER_ERROR, "the change did not complete"),
            }
            if add.weight == 0 {
                return fail(
                    StatusCode::BAD_REQUEST,
                    "\"weight\": must be at least 1 in an etcd-backed pool (drain instead)",
                );
            }
            let record = WorkerRecord {
                address: add.address.clone(),
                weight: i64::from(add.weight),
                zone: add.zone.clone(),
                id: add.id,
                state: RecordState::Active,
            };
            (StatusCode::CREATED, serde_json::json!({ "added": add.name }), registry.add(&add.name, &record, 0).await)
        }
        (_, Method::DELETE) if drain_request => {
            let result = registry.drain(&name).await;
            if result.is_ok() {
                remove_when_drained(Arc::clone(&pool), registry, name.clone());
            }
            (StatusCode::ACCEPTED, serde_json::json!({ "draining": name }), result)
        }
        (_, Method::DELETE) => (StatusCode::OK, serde_json::json!({ "removed": name }), registry.remove(&name).await),
        _ => {
            let patch: PatchWorker = match read_json(req).await {
                Ok(v) => v,
                Err(r) => return r,
            };
            if patch.weight == 0 {
                return fail(
                    StatusCode::BAD_REQUEST,
                    "\"weight\": must be at least 1 in an etcd-backed pool (drain instead)",
                );
            }
            let result = registry.set_weight(&name, patch.weight).await;
            (StatusCode::OK, serde_json::json!({ "worker": name, "weight": patch.weight }), result)
        }
    };
    let revision = match result {
        Ok(r) => r,
        Err(e) => return change_error(e),
    };
    let done = applied(&pool, revision).await;
    let mut body = what;
    body["pool"] = pool.name.clone().into();
    body["revision"] = revision.into();
    body["applied"] = done.into();
    body["generation"] = pool.snapshot().generation().into();
    json(status, body)
}

/// After an admin drain of an operator's record (one without a lease): delete it once this
/// gateway has no request on the worker in flight (and other gateways had a moment to see the
/// drain too). A registered worker's record is left to the worker.
fn remove_when_drained(pool: Arc<Pool>, registry: Registry, name: String) {
    tokio::spawn(async move {
        let Ok(Some(kv)) = registry.client().get(&registry.key(&name)).await else { return };
        if kv.lease != 0 {
            return;
        }
        let until = Instant::now() + Duration::from_secs(300);
        tokio::time::sleep(Duration::from_secs(1)).await;
        loop {
            let busy = pool.snapshot().worker(&name).is_some_and(|(_, w)| w.in_flight() > 0);
            if !busy || Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        match registry.remove(&name).await {
            Ok(revision) => {
                tracing::info!(pool = %pool.name, worker = %name, revision, "drained and removed from etcd")
            }
            Err(e) => {
                tracing::warn!(pool = %pool.name, worker = %name, error = %e, "drain finished but removal failed")
            }
        }
    });
}

/// A JSON object into `T` (serde would also take an array of the fields in order; the API takes
/// objects only).
fn parse_object<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(BodyError::NotJson)?;
    if !v.is_object() {
        return Err(BodyError::NotObject);
    }
    serde_json::from_value(v).map_err(BodyError::Fields)
}

/// Why a request body is not the object an endpoint takes.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("{0}")]
    NotJson(serde_json::Error),
    #[error("must be a JSON object")]
    NotObject,
    #[error("{0}")]
    Fields(serde_json::Error),
}

/// A pool's `/workers` entry: its strategy, key template (for a pool HTTP routes to), generation
/// and members.
fn describe(p: &Pool, http: Option<&keyroute_gateway::routing::HttpPool>) -> serde_json::Value {
    let snap = p.snapshot();
    let now = Instant::now();
    let workers: Vec<serde_json::Value> = snap
        .workers()
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let responses: serde_json::Map<String, serde_json::Value> = CLASSES
                .iter()
                .zip(&w.metrics.responses)
                .map(|(c, n)| ((*c).to_owned(), n.load(Relaxed).into()))
                .collect();
            serde_json::json!({
                "name": w.name,
                "address": w.address.to_string(),
                "weight": snap.weight(i),
                "zone": w.zone,
                "state": snap.state(i, now),
                "in_flight": w.in_flight(),
                "requests": w.metrics.total(),
                "responses": responses,
                "truncated": w.metrics.truncated.load(Relaxed),
                "retries": w.metrics.retries.load(Relaxed),
                "ejections": w.metrics.ejections.load(Relaxed),
                "warm_up": snap.warm_progress(i, now),
            })
        })
        .collect();
    serde_json::json!({
        "pool": p.name,
        "strategy": snap.policy().strategy().name(),
        "key": http.map(|h| h.http.key.as_str()),
        "generation": snap.generation(),
        "workers": workers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_their_methods() {
        assert_eq!(Endpoint::of("/workers/w1"), Some(Endpoint::Worker));
        assert_eq!(Endpoint::of("/workers/"), None);
        assert_eq!(Endpoint::of("/workers/a/b"), None);
        assert_eq!(Endpoint::of("/nope"), None);
        assert!(Endpoint::Workers.allows(&Method::POST));
        assert!(!Endpoint::Worker.allows(&Method::GET));
        assert!(!Endpoint::Metrics.allows(&Method::POST));
    }

    /// Issue 31, defect 16: sixteen what-ifs at once were all built.
    #[test]
    fn what_ifs_past_the_limit_wait_for_none() {
        let building = Arc::new(tokio::sync::Semaphore::new(MAX_WHAT_IFS));
        let held: Vec<_> = (0..MAX_WHAT_IFS).map(|_| start_what_if(&building).expect("a place")).collect();
        let busy = start_what_if(&building).expect_err("no place");
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(busy.headers().contains_key(header::RETRY_AFTER));
        drop(held);
        assert!(start_what_if(&building).is_ok(), "a build that ended frees its place");
    }

    /// Issue 31, defect 18: the dashboard's `URLSearchParams` sends a space as `+`.
    #[test]
    fn query_values_are_form_decoded() {
        assert_eq!(form_values("pool=pool+two&key=k", "pool"), ["pool two"]);
        assert_eq!(form_values("key=a%2Bb+c%20d", "key"), ["a+b c d"]);
        assert_eq!(form_values("key=%zz", "key"), ["%zz"]);
        // Names are decoded too, and a parameter may repeat.
        assert_eq!(form_values("po%6Fl=a&x=1&pool=b", "pool"), ["a", "b"]);
        assert_eq!(form_values("add=w%3A1&add=v", "add"), ["w:1", "v"]);
        assert!(form_values("", "pool").is_empty());
    }

    #[test]
    fn admin_bodies_refuse_unknown_fields() {
        assert!(serde_json::from_str::<PatchWorker>(r#"{"weight": 2, "colour": "red"}"#).is_err());
        assert!(serde_json::from_str::<AddWorker>(r#"{"name": "a", "address": "127.0.0.1:1", "wieght": 2}"#).is_err());
        let add: AddWorker = parse_object(br#"{"name": "a", "address": "127.0.0.1:1"}"#).expect("valid");
        assert_eq!(add.weight, 1);
        // Found by fuzzing: serde also took arrays of the fields.
        assert!(parse_object::<AddWorker>(br#"["w7", "127.0.0.1:9007", 2, "a"]"#).is_err());
        assert!(parse_object::<PatchWorker>(b"[7]").is_err());
    }
}

/// Entry points for the fuzz targets (`fuzz/`): the admin API's body parsing and worker
/// validation, without a socket. Not part of the public API.
#[doc(hidden)]
pub mod fuzzing {
    use super::{AddWorker, PatchWorker};
    use keyroute_fleet::config::validate_worker_with;

    /// Parses a `POST /workers` body and validates the worker against `own` addresses (host
    /// names are not resolved); returns whether it was accepted. Never panics.
    pub fn add_worker(body: &[u8], own: &[std::net::SocketAddr]) -> bool {
        let Ok(add) = super::parse_object::<AddWorker>(body) else { return false };
        validate_worker_with(&add.name, &add.address, add.weight, add.zone.as_deref(), own, |_| None).is_ok()
    }

    /// Parses a `PATCH /workers/NAME` body; returns the weight if valid.
    pub fn patch_worker(body: &[u8]) -> Option<u32> {
        super::parse_object::<PatchWorker>(body).ok().map(|p| p.weight)
    }
}
