//! The running gateway: listeners and routing, health probing, reloads and graceful shutdown.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use crate::body::ProxyBody;
use crate::config::{Config, ListenerConfig, RouteConfig};
use crate::error::{GatewayError, ReloadError};
use crate::health::Transition;
use crate::listener::{self, Backoff, ClockedBody, OpenConn, TimedIo};
use crate::metrics::ListenerMetrics;
use crate::pool::{Pool, State};
use crate::proxy::{self, ProxyService, headers::Via};

/// The pools and each listener's routes, swapped whole on reload.
#[derive(Debug)]
pub(crate) struct Routing {
    pub(crate) pools: Vec<Arc<Pool>>,
    pub(crate) routes: Vec<Vec<RouteConfig>>,
}

impl Routing {
    /// The pool for a request on `listener` with this host (without port) and normalised path.
    pub(crate) fn route(&self, listener: usize, host: Option<&str>, path: &str) -> Option<&Arc<Pool>> {
        self.routes.get(listener)?.iter().find_map(|r| {
            let host_ok = r.host.as_deref().is_none_or(|want| host.is_some_and(|h| h.eq_ignore_ascii_case(want)));
            (host_ok && path.starts_with(&r.path_prefix)).then(|| &self.pools[r.pool])
        })
    }

    pub(crate) fn pool(&self, name: Option<&str>) -> Result<&Arc<Pool>, String> {
        match name {
            Some(n) => self.pools.iter().find(|p| p.name == n).ok_or_else(|| "no such pool".to_owned()),
            None if self.pools.len() == 1 => Ok(&self.pools[0]),
            None => Err(format!(
                "several pools ({}): name one with ?pool=",
                self.pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

/// Failed admin token attempts, per client address: more than [`AUTH_FAILURES`] in
/// [`AUTH_WINDOW`] and the address gets 429 until the window ends.
#[derive(Debug, Default)]
pub(crate) struct AuthThrottle {
    by_ip: Mutex<std::collections::HashMap<IpAddr, (u32, Instant)>>,
    pub(crate) failures: AtomicU64,
}

/// Failed token attempts allowed per address and window.
pub(crate) const AUTH_FAILURES: u32 = 10;
/// The window.
pub(crate) const AUTH_WINDOW: Duration = Duration::from_secs(60);

impl AuthThrottle {
    /// Whether `ip` is over its failures now.
    pub(crate) fn blocked(&self, ip: IpAddr, now: Instant) -> bool {
        let map = self.by_ip.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&ip).is_some_and(|(n, since)| *n >= AUTH_FAILURES && now.duration_since(*since) < AUTH_WINDOW)
    }

    /// Counts a failure from `ip`.
    pub(crate) fn fail(&self, ip: IpAddr, now: Instant) {
        self.failures.fetch_add(1, Relaxed);
        let mut map = self.by_ip.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= 10_000 {
            map.retain(|_, (_, since)| now.duration_since(*since) < AUTH_WINDOW);
        }
        let e = map.entry(ip).or_insert((0, now));
        if now.duration_since(e.1) >= AUTH_WINDOW {
            *e = (0, now);
        }
        e.0 += 1;
    }
}

/// State shared by every connection, the admin API and background tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) routing: ArcSwap<Routing>,
    pub(crate) admin_token: Option<String>,
    pub(crate) epoch: Instant,
    pub(crate) listeners: Vec<ListenerConfig>,
    pub(crate) listener_metrics: Vec<Arc<ListenerMetrics>>,
    /// Each listener's connection limit in force.
    pub(crate) connection_limits: Vec<usize>,
    pub(crate) admin_listen: SocketAddr,
    /// SIGTERM received: `/readyz` says not ready.
    pub(crate) not_ready: AtomicBool,
    /// Listeners closed: responses say `Connection: close`.
    pub(crate) draining: AtomicBool,
    /// Set by a shutdown request.
    pub(crate) shutdown: watch::Sender<bool>,
    /// Set when the listeners stop accepting (after the shutdown delay).
    pub(crate) stop_accepting: watch::Sender<bool>,
    pub(crate) probers: Mutex<Vec<String>>,
    /// The shutdown delay and grace period in milliseconds (a reload may change them).
    pub(crate) delay_ms: AtomicU64,
    pub(crate) grace_ms: AtomicU64,
    pub(crate) via: Via,
    pub(crate) next_request: AtomicU64,
    pub(crate) auth: AuthThrottle,
}

impl Shared {
    /// Every address the gateway listens at: no worker may be one of them.
    pub(crate) fn own_addrs(&self) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = self.listeners.iter().map(|l| l.listen).collect();
        v.push(self.admin_listen);
        v
    }
}

/// A bound, not yet running gateway.
#[derive(Debug)]
pub struct Gateway {
    shared: Arc<Shared>,
    listeners: Vec<TcpListener>,
    admin: TcpListener,
}

/// A handle to a running gateway: reload it, change membership, inspect it, stop it.
#[derive(Clone, Debug)]
pub struct GatewayHandle {
    shared: Arc<Shared>,
}

/// The default connection limit per listener: half the open-file limit (a client connection
/// may hold an upstream one), less a reserve, shared among the listeners.
fn default_connection_limit(open_files: Option<u64>, listeners: usize) -> usize {
    let files = open_files.unwrap_or(1024);
    let per = files.saturating_sub(128) / 2 / listeners.max(1) as u64;
    per.clamp(16, 100_000) as usize
}

impl Gateway {
    /// Binds every listener and the admin listener. Raises the open-file limit first.
    ///
    /// # Errors
    ///
    /// A listener cannot be bound, a worker is at one of the gateway's own addresses, or a pool
    /// cannot be built.
    pub async fn bind(config: Config) -> Result<Gateway, GatewayError> {
        let epoch = Instant::now();
        let limit = listener::raise_open_file_limit();
        if let Some((before, after)) = limit {
            tracing::info!(soft_before = before, soft_now = after, "open-file limit");
        }
        let mut listeners = Vec::new();
        let mut bound = Vec::new();
        for l in &config.listeners {
            let sock =
                TcpListener::bind(l.listen).await.map_err(|source| GatewayError::Bind { addr: l.listen, source })?;
            let mut l = l.clone();
            l.listen = sock.local_addr().map_err(|source| GatewayError::Bind { addr: l.listen, source })?;
            bound.push(l);
            listeners.push(sock);
        }
        let admin = TcpListener::bind(config.admin.listen)
            .await
            .map_err(|source| GatewayError::Bind { addr: config.admin.listen, source })?;
        let admin_listen =
            admin.local_addr().map_err(|source| GatewayError::Bind { addr: config.admin.listen, source })?;
        let own: Vec<SocketAddr> = bound.iter().map(|l| l.listen).chain([admin_listen]).collect();
        check_no_self_workers(&config, &own)?;
        let pools = config
            .pools
            .iter()
            .map(|p| Pool::new(p.clone(), epoch).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
            .map_err(GatewayError::Membership)?;
        let routes = bound.iter().map(|l| l.routes.clone()).collect();
        let connection_limits: Vec<usize> = bound
            .iter()
            .map(|l| l.max_connections.unwrap_or_else(|| default_connection_limit(limit.map(|l| l.1), bound.len())))
            .collect();
        for (l, n) in bound.iter().zip(&connection_limits) {
            tracing::info!(listener = %l.name, max_connections = n, "connection limit");
        }
        Ok(Gateway {
            shared: Arc::new(Shared {
                routing: ArcSwap::from_pointee(Routing { pools, routes }),
                admin_token: config.admin.token.clone(),
                epoch,
                listener_metrics: bound.iter().map(|_| Arc::default()).collect(),
                listeners: bound,
                connection_limits,
                admin_listen,
                not_ready: AtomicBool::new(false),
                draining: AtomicBool::new(false),
                shutdown: watch::channel(false).0,
                stop_accepting: watch::channel(false).0,
                probers: Mutex::new(Vec::new()),
                delay_ms: AtomicU64::new(config.shutdown_delay.as_millis() as u64),
                grace_ms: AtomicU64::new(config.shutdown_grace.as_millis() as u64),
                via: Via::random(),
                next_request: AtomicU64::new(crate::proxy::headers::random_u64()),
                auth: AuthThrottle::default(),
            }),
            listeners,
            admin,
        })
    }

    /// The client-facing addresses, in configuration order (with the ports actually bound).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.shared.listeners.iter().map(|l| l.listen).collect()
    }

    /// The admin API's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.shared.admin_listen
    }

    /// A handle for reloads, membership changes and shutdown.
    pub fn handle(&self) -> GatewayHandle {
        GatewayHandle { shared: Arc::clone(&self.shared) }
    }

    /// Serves until `shutdown` completes (or [`GatewayHandle::shutdown`]). Then `/readyz` says not
    /// ready for the shutdown delay while the listeners still accept; then they stop accepting and
    /// requests in flight get the grace period to finish.
    ///
    /// # Errors
    ///
    /// [`GatewayError::GraceExpired`] when the grace period ended with connections still open
    /// (their requests were cut).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), GatewayError> {
        let shared = Arc::clone(&self.shared);
        let sender = shared.shutdown.clone();
        tokio::spawn(async move {
            shutdown.await;
            // `send_replace` stores the value even with no receiver yet, so a signal that arrives
            // before the loops subscribe is not lost.
            sender.send_replace(true);
        });
        spawn_probers(&shared);
        let graceful = Arc::new(GracefulShutdown::new());
        let mut tasks = Vec::new();
        for (i, sock) in self.listeners.into_iter().enumerate() {
            tasks.push(tokio::spawn(accept_loop(sock, Arc::clone(&shared), Arc::clone(&graceful), Some(i))));
        }
        tasks.push(tokio::spawn(accept_loop(self.admin, Arc::clone(&shared), Arc::clone(&graceful), None)));
        let mut rx = shared.shutdown.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
        shared.not_ready.store(true, Relaxed);
        let delay = Duration::from_millis(shared.delay_ms.load(Relaxed));
        if !delay.is_zero() {
            tracing::info!(delay_ms = delay.as_millis() as u64, "shutting down: not ready, still accepting");
            tokio::time::sleep(delay).await;
        }
        shared.draining.store(true, Relaxed);
        shared.stop_accepting.send_replace(true);
        let grace = Duration::from_millis(shared.grace_ms.load(Relaxed));
        tracing::info!(grace_ms = grace.as_millis() as u64, "shutting down: no new connections, draining requests");
        for t in tasks {
            let _ = t.await;
        }
        let graceful = match Arc::try_unwrap(graceful) {
            Ok(g) => g,
            Err(_) => return Ok(()),
        };
        if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
            let open: u64 = shared.listener_metrics.iter().map(|m| m.open.load(Relaxed)).sum();
            tracing::warn!(connections = open, "grace period over with requests still in flight");
            return Err(GatewayError::GraceExpired { connections: open });
        }
        Ok(())
    }
}

/// Refuses a configuration with a worker at one of the gateway's own (bound) addresses.
fn check_no_self_workers(config: &Config, own: &[SocketAddr]) -> Result<(), GatewayError> {
    for p in &config.pools {
        for w in &p.workers {
            if let Some(o) = own.iter().find(|o| crate::config::points_at(w.address, **o)) {
                return Err(GatewayError::SelfWorker {
                    pool: p.name.clone(),
                    worker: w.name.clone(),
                    address: w.address,
                    listener: *o,
                });
            }
        }
    }
    Ok(())
}

/// Accepts connections on a client listener (`Some(index)`) or the admin listener (`None`).
async fn accept_loop(sock: TcpListener, shared: Arc<Shared>, graceful: Arc<GracefulShutdown>, index: Option<usize>) {
    let mut rx = shared.stop_accepting.subscribe();
    let (metrics, limit, timeout, max_buf, max_headers, name) = match index {
        Some(i) => {
            let l = &shared.listeners[i];
            (
                Arc::clone(&shared.listener_metrics[i]),
                shared.connection_limits[i],
                l.header_timeout,
                l.max_header_bytes,
                l.max_headers,
                l.name.clone(),
            )
        }
        None => (Arc::new(ListenerMetrics::default()), 256, Duration::from_secs(10), 64 * 1024, 100, "admin".into()),
    };
    let permits = Arc::new(Semaphore::new(limit));
    let mut backoff = Backoff::default();
    loop {
        let permit = match Arc::clone(&permits).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                metrics.limited.fetch_add(1, Relaxed);
                tracing::warn!(listener = %name, limit, "connection limit reached; accepting again when one closes");
                tokio::select! {
                    p = Arc::clone(&permits).acquire_owned() => match p { Ok(p) => p, Err(_) => return },
                    _ = rx.wait_for(|stop| *stop) => return,
                }
            }
        };
        // `wait_for` sees a shutdown that happened before this loop subscribed.
        let accepted = tokio::select! {
            a = sock.accept() => a,
            _ = rx.wait_for(|stop| *stop) => return,
        };
        let (stream, remote) = match accepted {
            Ok(x) => {
                backoff.reset();
                x
            }
            Err(e) => {
                metrics.accept_errors.fetch_add(1, Relaxed);
                if listener::is_resource_exhaustion(&e) {
                    let (wait, first) = backoff.fail();
                    if first {
                        tracing::warn!(listener = %name, error = %e, "accept failed: out of resources; backing off");
                    }
                    tokio::time::sleep(wait).await;
                } else {
                    tracing::debug!(listener = %name, error = %e, "accept failed");
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let open = OpenConn::new(&metrics);
        let (io, clock) = TimedIo::new(stream, timeout, Arc::clone(&metrics));
        let mut builder = http1::Builder::new();
        builder
            .max_buf_size(max_buf.max(8192))
            .max_headers(max_headers)
            .writev(false)
            .timer(TokioTimer::new())
            // The head timeout is TimedIo's, which answers 408.
            .header_read_timeout(None);
        let shared = Arc::clone(&shared);
        let peer = Arc::new(proxy::Peer::new(remote));
        let svc = service_fn(move |req: Request<Incoming>| {
            clock.head_received();
            let shared = Arc::clone(&shared);
            let peer = Arc::clone(&peer);
            let clock = Arc::clone(&clock);
            async move {
                let resp: Response<ProxyBody> = match index {
                    Some(i) => proxy::handle(&shared, i, req, &peer).await,
                    None => crate::admin::handle(&shared, req, peer.addr).await,
                };
                Ok::<_, std::convert::Infallible>(resp.map(|b| ClockedBody::new(b, clock)))
            }
        });
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(io), svc));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %remote, "connection ended with an error");
            }
            drop((open, permit));
        });
    }
}

fn spawn_probers(shared: &Arc<Shared>) {
    let routing = shared.routing.load();
    let mut running = shared.probers.lock().unwrap_or_else(|e| e.into_inner());
    for pool in &routing.pools {
        if running.contains(&pool.name) {
            continue;
        }
        running.push(pool.name.clone());
        let weak = Arc::downgrade(pool);
        let shared = Arc::downgrade(shared);
        tokio::spawn(probe_loop(weak, shared));
    }
}

/// Probes one pool's workers forever (until the pool or the gateway goes away).
async fn probe_loop(pool: Weak<Pool>, shared: Weak<Shared>) {
    loop {
        let Some(p) = pool.upgrade() else { return };
        let snap = p.snapshot();
        let health = snap.config.health.clone();
        let Some(path) = health.path.clone() else {
            drop((p, snap));
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let probes = snap.workers.iter().map(|w| {
            let w = Arc::clone(w);
            let path = path.clone();
            let pool_name = p.name.clone();
            async move {
                let ok = probe(&w, &path, health.timeout).await;
                match w.observe_probe(ok) {
                    Transition::Down => {
                        tracing::warn!(pool = %pool_name, worker = %w.name, "worker failed its health checks")
                    }
                    Transition::Up => {
                        tracing::info!(pool = %pool_name, worker = %w.name, "worker passed its health checks")
                    }
                    Transition::None => {}
                }
            }
        });
        // Probe every worker at once: one slow or dead worker must not delay the others' checks.
        let mut running = tokio::task::JoinSet::new();
        for f in probes {
            running.spawn(f);
        }
        drop(snap);
        drop(p);
        while running.join_next().await.is_some() {}
        if shared.upgrade().is_none_or(|s| *s.shutdown.borrow()) {
            return;
        }
        tokio::time::sleep(health.interval).await;
    }
}

/// One active check, on a fresh connection (as HAProxy checks): a worker that stops accepting
/// connections fails its checks even while pooled keep-alive connections still work.
async fn probe(worker: &crate::pool::WorkerState, path: &str, timeout: Duration) -> bool {
    let Ok(uri) = http::Uri::try_from(path) else { return false };
    let mut req = Request::new(crate::body::empty());
    *req.uri_mut() = uri;
    if let Ok(host) = http::HeaderValue::try_from(worker.address.to_string()) {
        req.headers_mut().insert(http::header::HOST, host);
    }
    req.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    let fut = async {
        let (resp, _conn) = worker.upstream.send_fresh(req).await.ok()?;
        let ok = resp.status().is_success();
        resp.into_body().collect().await.ok()?;
        Some(ok)
    };
    matches!(tokio::time::timeout(timeout, fut).await, Ok(Some(true)))
}

impl GatewayHandle {
    /// Stops the gateway (as if its shutdown future completed).
    pub fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<Arc<Pool>> {
        self.shared.routing.load().pools.iter().find(|p| p.name == name).cloned()
    }

    /// The request path of client listener `index` (in configuration order), as a service that
    /// takes requests without a socket.
    pub fn service(&self, index: usize) -> Option<ProxyService> {
        (index < self.shared.listeners.len())
            .then(|| ProxyService { shared: Arc::clone(&self.shared), listener: index })
    }

    /// Applies a new configuration: pools (strategy, key, workers, health, retries) and routes.
    /// Workers that keep their name, address and zone keep their state. Listener and admin
    /// settings cannot change without a restart; a change there is refused. Every pool's new
    /// table is built before any is swapped in, so a reload applies whole or not at all. Builds
    /// can take a while for big tables: call this off the request path (`spawn_blocking`).
    ///
    /// # Errors
    ///
    /// [`GatewayError::Reload`] when listeners or the admin listener differ, or a worker is at
    /// one of the gateway's own addresses; membership errors.
    pub fn reload(&self, config: Config) -> Result<(), GatewayError> {
        // What is bound to sockets cannot change without a restart; refuse rather than ignore.
        let same_addr = |a: SocketAddr, b: SocketAddr| a == b || (a.port() == 0 && a.ip() == b.ip());
        let current = &self.shared.listeners;
        let same = config.listeners.len() == current.len()
            && config.listeners.iter().zip(current).all(|(a, b)| {
                same_addr(a.listen, b.listen)
                    && a.max_header_bytes == b.max_header_bytes
                    && a.max_headers == b.max_headers
                    && a.header_timeout == b.header_timeout
                    && a.max_connections == b.max_connections
            });
        if !same {
            return Err(GatewayError::Reload(ReloadError::Listeners));
        }
        if !same_addr(config.admin.listen, self.shared.admin_listen) || config.admin.token != self.shared.admin_token {
            return Err(GatewayError::Reload(ReloadError::Admin));
        }
        check_no_self_workers(&config, &self.shared.own_addrs())?;
        // Validate every pool's new membership before changing any.
        for pc in &config.pools {
            crate::pool::check(pc).map_err(GatewayError::Membership)?;
        }
        self.shared.grace_ms.store(config.shutdown_grace.as_millis() as u64, Relaxed);
        self.shared.delay_ms.store(config.shutdown_delay.as_millis() as u64, Relaxed);
        let old = self.shared.routing.load_full();
        let mut pools = Vec::new();
        for pc in &config.pools {
            match old.pools.iter().find(|p| p.name == pc.name) {
                Some(p) => {
                    p.reconfigure(pc.clone()).map_err(GatewayError::Membership)?;
                    pools.push(Arc::clone(p));
                }
                None => {
                    pools.push(Arc::new(Pool::new(pc.clone(), self.shared.epoch).map_err(GatewayError::Membership)?))
                }
            }
        }
        let routes = config.listeners.iter().map(|l| l.routes.clone()).collect();
        self.shared.routing.store(Arc::new(Routing { pools, routes }));
        {
            let names: Vec<String> = config.pools.iter().map(|p| p.name.clone()).collect();
            self.shared.probers.lock().unwrap_or_else(|e| e.into_inner()).retain(|n| names.contains(n));
        }
        spawn_probers(&self.shared);
        tracing::info!(pools = config.pools.len(), "configuration reloaded");
        Ok(())
    }

    /// Reads, validates and applies a configuration file. A file that fails validation changes
    /// nothing: the old configuration serves on.
    ///
    /// # Errors
    ///
    /// The file's [`crate::ConfigError`], or those of [`GatewayHandle::reload`].
    pub fn reload_file(&self, path: &Path) -> Result<(), GatewayError> {
        let config = Config::load(path).map_err(|e| GatewayError::Config(Box::new(e)))?;
        self.reload(config)
    }

    /// [`GatewayHandle::reload_file`] on the blocking pool, so that a big table build never stalls
    /// the runtime's request threads.
    ///
    /// # Errors
    ///
    /// As [`GatewayHandle::reload_file`].
    pub async fn reload_file_off_thread(&self, path: &Path) -> Result<(), GatewayError> {
        let (handle, path) = (self.clone(), path.to_owned());
        tokio::task::spawn_blocking(move || handle.reload_file(&path)).await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "reload task failed");
            Err(GatewayError::Reload(ReloadError::Interrupted))
        })
    }

    /// Whether the gateway takes traffic: not shutting down, and every pool has an available
    /// worker.
    pub fn ready(&self) -> bool {
        ready(&self.shared)
    }
}

/// See [`GatewayHandle::ready`].
pub(crate) fn ready(shared: &Shared) -> bool {
    let now = Instant::now();
    !shared.not_ready.load(Relaxed)
        && shared.routing.load().pools.iter().all(|p| {
            let s = p.snapshot();
            (0..s.workers.len()).any(|i| s.weight(i) > 0 && s.state(i, now) == State::Healthy)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_connection_limits_leave_room_for_upstream_connections() {
        assert_eq!(default_connection_limit(Some(1024), 1), 448);
        assert_eq!(default_connection_limit(Some(1024), 2), 224);
        assert_eq!(default_connection_limit(Some(1 << 20), 1), 100_000);
        assert_eq!(default_connection_limit(Some(100), 1), 16);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_tokens_are_throttled_per_address_and_window() {
        let t = AuthThrottle::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().expect("ip"), "10.0.0.2".parse().expect("ip"));
        for _ in 0..AUTH_FAILURES {
            assert!(!t.blocked(a, Instant::now()));
            t.fail(a, Instant::now());
        }
        assert!(t.blocked(a, Instant::now()));
        assert!(!t.blocked(b, Instant::now()));
        tokio::time::advance(AUTH_WINDOW).await;
        assert!(!t.blocked(a, Instant::now()));
        assert_eq!(t.failures.load(Relaxed), u64::from(AUTH_FAILURES));
    }
}
