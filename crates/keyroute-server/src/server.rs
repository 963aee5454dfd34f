//! The running gateway: listeners and routing, health probing, reloads and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;

use crate::balance::{Balance, Serving};
use crate::config::{Config, ListenerConfig, RouteConfig, Serves, WorkerConfig};
use crate::error::{GatewayError, ReloadError};
use crate::listener::{self, Backoff, OpenConn};
use crate::state::Shared;
use keyroute_fleet::metrics::{ListenerMetrics, ThreadMetrics};
use keyroute_fleet::pool::Pool;
use keyroute_gateway::connection::{self, App, Settings};
use keyroute_gateway::proxy::{Front, ProxyService};
use keyroute_gateway::routing::Routing;

/// Placements of a pool's requests by outcome (the `keyroute_pool_requests_total` metric).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placements {
    /// Served by the key's owner.
    pub owner: u64,
    /// Spilled: the owner was unhealthy, ejected, stalled or draining.
    pub unavailable: u64,
    /// Spilled: the owner was over its bounded-load capacity (or, with affinity, busier).
    pub overloaded: u64,
    /// Retries after a failed try.
    pub retry: u64,
    /// Not placed by key (the strategy does not, or the key was missing).
    pub unkeyed: u64,
    /// Hot keys served by a replica other than their owner.
    pub replica: u64,
    /// Keys whose owner is warming up, served by their previous owner (or next in ranking).
    pub warming: u64,
}

/// A pool's membership as [`GatewayHandle::membership`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    /// The workers' names, in table (canonical) order.
    pub workers: Vec<String>,
    /// The snapshot's generation.
    pub generation: u64,
    /// Whether the membership source (etcd) answers now.
    pub source_up: bool,
    /// The source revision applied last (0 for a static pool).
    pub revision: i64,
    /// Records ignored as invalid in the membership applied last.
    pub rejected: u64,
    /// Full re-reads after a compacted watch revision.
    pub compactions: u64,
}

/// Each listener's routes, by listener index (none for a cache listener).
fn routes_of(listeners: &[ListenerConfig]) -> Vec<Vec<RouteConfig>> {
    listeners.iter().map(|l| l.http().map(|h| h.routes.clone()).unwrap_or_default()).collect()
}

/// A bound, not yet running gateway.
#[derive(Debug)]
pub struct Gateway {
    shared: Arc<Shared>,
    listeners: Vec<TcpListener>,
    acceptors: Vec<Option<Arc<rustls::ServerConfig>>>,
    admin: TcpListener,
    trim: Option<Trim>,
}

/// Memory given back by each runtime thread, now and then: see [`Gateway::trim_memory`].
#[derive(Clone, Copy, Debug)]
struct Trim {
    every: Duration,
    give_back: fn(),
}

impl Trim {
    /// Calls `give_back` on this thread every `every`, for as long as the runtime runs.
    fn spawn(self) {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + self.every, self.every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                (self.give_back)();
            }
        });
    }
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
    /// Has every runtime thread call `give_back` every `every`, on itself: the hook by which
    /// the program's allocator returns the memory a thread freed to the system. An allocator
    /// that keeps freed pages for reuse and purges them only when it is next called (mimalloc)
    /// never purges on a thread whose clients all went idle; purging on every free instead costs
    /// the request path (measured in BENCHMARKS.md). The library does not choose the allocator:
    /// the binary that does passes its collect function.
    #[must_use]
    pub fn trim_memory(mut self, every: Duration, give_back: fn()) -> Gateway {
        self.trim = Some(Trim { every, give_back });
        self
    }

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
                bind_first(l.listen, l.reuse_port).map_err(|source| GatewayError::Bind { addr: l.listen, source })?;
            let mut l = l.clone();
            l.listen = sock.local_addr().map_err(|source| GatewayError::Bind { addr: l.listen, source })?;
            if l.reuse_port {
                tracing::info!(listener = %l.name, addr = %l.listen, "reuse_port: other processes may bind this address too and take part of its connections");
            }
            bound.push(l);
            listeners.push(sock);
        }
        let admin_socket = TcpListener::bind(config.admin.listen)
            .await
            .map_err(|source| GatewayError::Bind { addr: config.admin.listen, source })?;
        let admin_listen =
            admin_socket.local_addr().map_err(|source| GatewayError::Bind { addr: config.admin.listen, source })?;
        let own: Vec<SocketAddr> = bound.iter().map(|l| l.listen).chain([admin_listen]).collect();
        check_no_self_workers(&config, &own)?;
        let pools = config
            .pools
            .iter()
            .map(|p| Pool::new(p.clone(), epoch).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
            .map_err(GatewayError::Membership)?;
        for p in &pools {
            keyroute_fleet::membership::source::start_from_saved(p, &own);
        }
        crate::probe::set_checks(&config, &pools);
        let routes = routes_of(&bound);
        let routing = Routing::new(&pools, &config.http, routes, None);
        let shutdown = watch::channel(false).0;
        let stop_accepting = watch::channel(false).0;
        let fleet = keyroute_fleet::Fleet::new(
            pools,
            epoch,
            own.clone(),
            admin_listen,
            shutdown.subscribe(),
            stop_accepting.subscribe(),
        );
        let connection_limits: Vec<usize> = bound
            .iter()
            .map(|l| l.max_connections.unwrap_or_else(|| default_connection_limit(limit.map(|l| l.1), bound.len())))
            .collect();
        for (l, n) in bound.iter().zip(&connection_limits) {
            tracing::info!(listener = %l.name, max_connections = n, "connection limit");
        }
        // One limit per listener, whatever the number of runtime threads accepting on it.
        let connection_permits = connection_limits.iter().map(|n| Arc::new(Semaphore::new(*n))).collect();
        let balance = connection_limits.iter().map(|_| Balance::default()).collect();
        let listener_metrics: Vec<Arc<ListenerMetrics>> = bound.iter().map(|_| Arc::default()).collect();
        let mut acceptors = Vec::new();
        let mut certificates = Vec::new();
        for l in &bound {
            let Some(h) = l.http().filter(|h| !h.tls.is_empty()) else {
                acceptors.push(None);
                certificates.push(None);
                continue;
            };
            let (config, certs) = keyroute_gateway::tls::server_config(h.tls.clone(), h.http2)
                .map_err(|e| GatewayError::Tls { addr: l.listen, message: e.to_string() })?;
            acceptors.push(Some(config));
            certificates.push(Some(certs));
        }
        let mut access_logs = Vec::new();
        for (l, m) in bound.iter().zip(&listener_metrics) {
            access_logs.push(match l.http().and_then(|h| h.access_log.as_ref()) {
                None => None,
                Some(a) => Some(
                    keyroute_gateway::access::AccessLog::open(a, Arc::clone(m))
                        .map_err(|source| GatewayError::AccessLog { path: a.path.clone(), source })?,
                ),
            });
        }
        let tunnels = bound
            .iter()
            .zip(&listener_metrics)
            .map(|(l, m)| (l.http().map_or(Duration::ZERO, |h| h.tunnel_idle_timeout), Arc::clone(m)))
            .collect();
        let front = Arc::new(Front::new(routing, access_logs, tunnels));
        let threads: Arc<Mutex<Vec<Arc<ThreadMetrics>>>> = Arc::default();
        let not_ready = Arc::new(AtomicBool::new(false));
        let admin_metrics: Arc<ListenerMetrics> = Arc::default();
        let view = keyroute_admin::ServerView {
            listeners: bound
                .iter()
                .zip(&listener_metrics)
                .zip(&connection_limits)
                .map(|((l, m), limit)| keyroute_admin::ListenerView {
                    name: l.name.clone(),
                    listen: l.listen,
                    tls: l.http().is_some_and(|h| !h.tls.is_empty()),
                    metrics: Arc::clone(m),
                    limit: *limit,
                })
                .collect(),
            threads: Arc::clone(&threads),
            certificates: bound
                .iter()
                .zip(&certificates)
                .filter_map(|(l, c)| Some((l.name.clone(), Arc::clone(c.as_ref()?))))
                .collect(),
            not_ready: Arc::clone(&not_ready),
        };
        let admin = keyroute_admin::Admin::new(
            &config.admin,
            admin_listen,
            Arc::clone(&fleet),
            Arc::clone(&front),
            view,
            Arc::clone(&admin_metrics),
            shutdown.subscribe(),
        );
        Ok(Gateway {
            trim: None,
            shared: Arc::new(Shared {
                fleet,
                front,
                admin,
                epoch,
                listener_metrics,
                admin_metrics,
                threads,
                certificates,
                listeners: bound,
                connection_limits,
                connection_permits,
                balance,
                admin_listen,
                not_ready,
                shutdown,
                stop_accepting,
                finished: watch::channel(false).0,
                closed: Arc::new(tokio::sync::Notify::new()),
                delay_ms: AtomicU64::new(config.shutdown_delay.as_millis() as u64),
                grace_ms: AtomicU64::new(config.shutdown_grace.as_millis() as u64),
                reload: Mutex::new(()),
            }),
            listeners,
            acceptors,
            admin: admin_socket,
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

    /// Serves on `threads` threads, each a single-threaded runtime of its own with its own
    /// listening sockets (`SO_REUSEPORT`: the kernel spreads connections among them) and its own
    /// upstream connections, as NGINX's worker processes do. They share only the pools'
    /// snapshots, the load counts and the metrics, so placement and bounded loads see every
    /// request. The calling thread is the first of them and also runs the admin API, health
    /// checks and membership sources. `threads` of 1 is [`Gateway::run`] on a new
    /// single-threaded runtime.
    ///
    /// # Errors
    ///
    /// As [`Gateway::run`]; a runtime or socket that cannot be made for an extra thread is
    /// [`GatewayError::Bind`].
    pub fn run_threads(
        mut self,
        threads: usize,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), GatewayError> {
        let runtime = |i: usize| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_start(move || keyroute_gateway::upstream::set_thread_slot(i))
                .build()
        };
        let addrs: Vec<SocketAddr> = self.shared.listeners.iter().map(|l| l.listen).collect();
        let mut extra = Vec::new();
        for i in 1..threads.max(1) {
            let shared = Arc::clone(&self.shared);
            let acceptors = self.acceptors.clone();
            let addrs = addrs.clone();
            let trim = self.trim;
            let first = addrs[0];
            let rt = runtime(i).map_err(|source| GatewayError::Bind { addr: first, source })?;
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let handle = std::thread::Builder::new()
                .name(format!("keyroute-{i}"))
                .spawn(move || {
                    keyroute_gateway::upstream::set_thread_slot(i);
                    rt.block_on(async move {
                        if let Some(t) = trim {
                            t.spawn();
                        }
                        let mut tasks = Vec::new();
                        for (j, (addr, tls)) in addrs.iter().zip(acceptors).enumerate() {
                            match bind_shared(*addr) {
                                Ok(sock) => {
                                    tasks.push(tokio::spawn(accept_loop(sock, Arc::clone(&shared), Some(j), tls, i)))
                                }
                                Err(e) => {
                                    let _ = ready_tx.send(Err((*addr, e)));
                                    return;
                                }
                            }
                        }
                        let _ = ready_tx.send(Ok(()));
                        for t in tasks {
                            let _ = t.await;
                        }
                        // The accept loops ended (shutdown): the connections finish their
                        // requests, then the main thread's grace period ends this runtime.
                        let mut done = shared.finished.subscribe();
                        crate::state::stopped(&mut done).await;
                    });
                })
                .map_err(|source| GatewayError::Bind { addr: first, source })?;
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err((addr, source))) => return Err(GatewayError::Bind { addr, source }),
                // The thread ended before it said whether its sockets bound: it panicked.
                Err(_) => return Err(GatewayError::Thread { index: i }),
            }
            extra.push(handle);
        }
        let rt = runtime(0).map_err(|source| GatewayError::Bind { addr: addrs[0], source })?;
        keyroute_gateway::upstream::set_thread_slot(0);
        let shared = Arc::clone(&self.shared);
        // The listeners were bound on the caller's runtime; move them to this one.
        let listeners: Vec<std::net::TcpListener> = std::mem::take(&mut self.listeners)
            .into_iter()
            .map(|l| l.into_std())
            .collect::<Result<_, _>>()
            .map_err(|source| GatewayError::Bind { addr: addrs[0], source })?;
        let admin = self.admin.into_std().map_err(|source| GatewayError::Bind { addr: addrs[0], source })?;
        let result = rt.block_on(async move {
            let listeners = listeners
                .into_iter()
                .map(TcpListener::from_std)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|source| GatewayError::Bind { addr: addrs[0], source })?;
            let admin = TcpListener::from_std(admin).map_err(|source| GatewayError::Bind { addr: addrs[0], source })?;
            Gateway { shared: self.shared, listeners, acceptors: self.acceptors, admin, trim: self.trim }
                .run(shutdown)
                .await
        });
        shared.finished.send_replace(true);
        for h in extra {
            let _ = h.join();
        }
        result
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
        shared.fleet.start();
        keyroute_fleet::membership::source::announce(&shared.fleet);
        tokio::spawn(hot_key_ticks(Arc::downgrade(&shared)));
        if let Some(t) = self.trim {
            t.spawn();
        }
        let mut tasks = Vec::new();
        for (i, (sock, tls)) in self.listeners.into_iter().zip(self.acceptors).enumerate() {
            tasks.push(tokio::spawn(accept_loop(sock, Arc::clone(&shared), Some(i), tls, 0)));
        }
        tasks.push(tokio::spawn(accept_loop(self.admin, Arc::clone(&shared), None, None, 0)));
        let mut rx = shared.shutdown.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
        shared.not_ready.store(true, Relaxed);
        let delay = Duration::from_millis(shared.delay_ms.load(Relaxed));
        if !delay.is_zero() {
            tracing::info!(delay_ms = delay.as_millis() as u64, "shutting down: not ready, still accepting");
            tokio::time::sleep(delay).await;
        }
        shared.front.draining.store(true, Relaxed);
        shared.stop_accepting.send_replace(true);
        let grace = Duration::from_millis(shared.grace_ms.load(Relaxed));
        tracing::info!(grace_ms = grace.as_millis() as u64, "shutting down: no new connections, draining requests");
        for t in tasks {
            let _ = t.await;
        }
        // Every connection has been told to finish (its request in progress, then close).
        let until = Instant::now() + grace;
        loop {
            // Waiting before looking: a connection that closes between the two still wakes us.
            let closed = shared.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if shared.open_connections() == 0 {
                return Ok(());
            }
            if tokio::time::timeout_at(until, closed).await.is_err() {
                let open: u64 = shared.listener_metrics.iter().map(|m| m.open.load(Relaxed)).sum();
                tracing::warn!(connections = open, "grace period over with requests still in flight");
                return Err(GatewayError::GraceExpired { connections: open });
            }
        }
    }
}

/// A listener's first socket. Every runtime thread of [`Gateway::run_threads`] binds a socket of
/// its own with `SO_REUSEPORT` (the kernel spreads connections among them), and so could another
/// process. Unless the listener asks for that (`reuse_port`), the address is first bound without
/// `SO_REUSEPORT`, which fails with "address in use" while any other socket listens there, as
/// NGINX without `reuseport` does; then that probe is closed and the shared sockets bound to the
/// port it got. (A second gateway started later fails the same way: its probe meets our
/// sockets.)
fn bind_first(addr: SocketAddr, reuse_port: bool) -> std::io::Result<TcpListener> {
    if reuse_port {
        return bind_shared(addr);
    }
    let probe = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    probe.set_reuseaddr(true)?;
    probe.bind(addr)?;
    let probe = probe.listen(1)?;
    let got = probe.local_addr()?;
    drop(probe);
    bind_shared(got)
}

/// A listening socket that more sockets may bind to as well (`SO_REUSEPORT`): each runtime
/// thread of [`Gateway::run_threads`] accepts on its own, and the kernel spreads connections.
fn bind_shared(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let sock = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    sock.set_reuseaddr(true)?;
    #[cfg(unix)]
    sock.set_reuseport(true)?;
    sock.bind(addr)?;
    sock.listen(4096)
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

/// How often the ticker looks at the pools: hot-key windows end within this of their due time.
const HOT_KEY_TICK: Duration = Duration::from_millis(50);

/// How often the ticker also ends what expired in the response caches and the copies registries.
const EXPIRY_TICK: Duration = Duration::from_secs(1);

/// Ends every pool's hot-key window when it is due ([`keyroute_fleet::pool::hot::HotKeysState::tick`]),
/// and, every [`EXPIRY_TICK`], what expired in each pool's response cache and copies registry,
/// until the gateway goes away.
async fn hot_key_ticks(shared: std::sync::Weak<Shared>) {
    let mut expired_at = Instant::now();
    loop {
        {
            let Some(s) = shared.upgrade() else { return };
            let now = Instant::now();
            s.fleet.tick(now);
            if now.saturating_duration_since(expired_at) >= EXPIRY_TICK {
                expired_at = now;
                s.front.routing.load().tick();
                keyroute_cacheproxy::tick(&s.fleet, now);
            }
        }
        tokio::time::sleep(HOT_KEY_TICK).await;
    }
}

/// Connections the admin listener holds at once.
const ADMIN_CONNECTIONS: usize = 256;

/// The admin listener's reserve, past [`ADMIN_CONNECTIONS`]: connections served one request
/// each, with a short head timeout ([`ADMIN_PROBE_HEAD_TIMEOUT`]), that answer only `/healthz`,
/// `/readyz` and `/metrics`. Whatever holds the listener's other places (slow heads, slow
/// bodies, feeds), a prober still gets an answer (issue 31, defect 13).
const ADMIN_PROBE_CONNECTIONS: usize = 16;

/// A reserve connection's head must arrive within this: a probe sends its head at once.
const ADMIN_PROBE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Accepts connections on a client listener (`Some(index)`) or the admin listener (`None`), on
/// runtime thread `thread` (0 for [`Gateway::run`]).
async fn accept_loop(
    sock: TcpListener,
    shared: Arc<Shared>,
    index: Option<usize>,
    tls: Option<Arc<rustls::ServerConfig>>,
    thread: usize,
) {
    let mut rx = shared.stop_accepting.subscribe();
    let http = |app: App, metrics: &Arc<ListenerMetrics>| Settings {
        app,
        header_timeout: Duration::from_secs(10),
        send_timeout: Duration::from_secs(60),
        max_buf: 64 * 1024,
        max_headers: 100,
        tls: None,
        h2c: false,
        max_streams: 1,
        metrics: Arc::clone(metrics),
        one_request: false,
        stop: shared.stop_accepting.subscribe(),
    };
    // What the listener serves, chosen once: each accepted connection is served as it says.
    let (listener, permits, name, metrics) = match index {
        Some(i) => {
            let l = &shared.listeners[i];
            let metrics = Arc::clone(&shared.listener_metrics[i]);
            let listener = match &l.serves {
                Serves::Cache(cache) => Listener::Cache(Arc::new(keyroute_cacheproxy::Context {
                    fleet: Arc::clone(&shared.fleet),
                    listener: Arc::new(cache.clone()),
                    stop: shared.stop_accepting.subscribe(),
                })),
                Serves::Http(h) => Listener::Http(Arc::new(Settings {
                    header_timeout: h.header_timeout,
                    send_timeout: h.send_timeout,
                    max_buf: h.max_header_bytes,
                    max_headers: h.max_headers,
                    tls: tls.map(tokio_rustls::TlsAcceptor::from),
                    h2c: h.h2c,
                    max_streams: h.max_concurrent_streams,
                    ..http(App::Proxy { front: Arc::clone(&shared.front), listener: i }, &metrics)
                })),
            };
            (listener, Arc::clone(&shared.connection_permits[i]), l.name.clone(), metrics)
        }
        None => {
            let metrics = Arc::clone(&shared.admin_metrics);
            let admin = keyroute_admin::AdminService { admin: Arc::clone(&shared.admin), probes_only: false };
            let listener = Listener::Http(Arc::new(http(App::Service(Arc::new(admin)), &metrics)));
            (listener, Arc::new(Semaphore::new(ADMIN_CONNECTIONS)), "admin".to_owned(), metrics)
        }
    };
    // The admin listener's reserve (none for a client listener): one request each, probes only.
    let reserve = index.is_none().then(|| {
        let admin = keyroute_admin::AdminService { admin: Arc::clone(&shared.admin), probes_only: true };
        let probes = Settings {
            header_timeout: ADMIN_PROBE_HEAD_TIMEOUT,
            one_request: true,
            ..http(App::Service(Arc::new(admin)), &metrics)
        };
        (Listener::Http(Arc::new(probes)), Arc::new(Semaphore::new(ADMIN_PROBE_CONNECTIONS)))
    });
    let thread_metrics = index.map(|_| shared.thread_metrics(thread));
    // The connections this thread serves on a client listener, and the sockets other threads
    // hand it (`balance`); the admin listener is not balanced.
    let balance = index.map(|i| &shared.balance[i]);
    let (serving, mut inbox) = match balance {
        Some(b) => {
            let (open, inbox) = b.join(thread);
            (Some(open), Some(inbox))
        }
        None => (None, None),
    };
    let limit = index.map_or(ADMIN_CONNECTIONS, |i| shared.connection_limits[i]);
    let mut backoff = Backoff::default();
    let mut at_limit = false;
    loop {
        // Accept first, then wait for a place: the listener's permits are shared by every thread
        // accepting on it, and a permit taken before `accept` would sit idle on a thread whose
        // socket gets no connection while another thread's clients wait. At the limit, each
        // thread holds at most the one connection it accepted; the kernel's backlog holds the
        // rest.
        // `wait_for` sees a shutdown that happened before this loop subscribed.
        let handed_in = async {
            match inbox.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        let (accepted, handed) = tokio::select! {
            a = sock.accept() => (a, false),
            Some((std, remote)) = handed_in => match TcpStream::from_std(std) {
                Ok(stream) => (Ok((stream, remote)), true),
                Err(e) => {
                    tracing::debug!(listener = %name, error = %e, "a connection handed over could not be registered");
                    if let Some(s) = &serving {
                        s.fetch_sub(1, Relaxed);
                    }
                    continue;
                }
            },
            _ = rx.wait_for(|stop| *stop) => return,
        };
        let (stream, remote) = match accepted {
            Ok((stream, remote)) if handed => (stream, remote),
            Ok((stream, remote)) => {
                backoff.reset();
                if let Some(t) = &thread_metrics {
                    t.accepted.fetch_add(1, Relaxed);
                }
                // Served here, or by a thread that serves at least two fewer (`balance`).
                match hand_over(balance, serving.as_ref(), thread, stream, remote) {
                    Some(stream) => (stream, remote),
                    None => {
                        if let Some(t) = &thread_metrics {
                            t.handed_over.fetch_add(1, Relaxed);
                        }
                        continue;
                    }
                }
            }
            Err(e) => {
                metrics.accept_errors.fetch_add(1, Relaxed);
                if listener::is_resource_exhaustion(&e) {
                    let (wait, first) = backoff.fail();
                    if first {
                        tracing::warn!(listener = %name, error = %e, "accept failed: out of resources; backing off");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = rx.wait_for(|stop| *stop) => return,
                    }
                } else {
                    tracing::debug!(listener = %name, error = %e, "accept failed");
                }
                continue;
            }
        };
        let mut served = &listener;
        let taken: Result<_, tokio::sync::TryAcquireError> = Arc::clone(&permits).try_acquire_owned().or_else(|full| {
            let (probes, spare) = reserve.as_ref().ok_or(full)?;
            let p = Arc::clone(spare).try_acquire_owned()?;
            metrics.limited.fetch_add(1, Relaxed);
            served = probes;
            Ok(p)
        });
        let permit = match taken {
            Ok(p) => {
                if at_limit && permits.available_permits() > limit / 10 {
                    at_limit = false;
                }
                p
            }
            Err(_) => {
                metrics.limited.fetch_add(1, Relaxed);
                if !at_limit {
                    at_limit = true;
                    tracing::warn!(listener = %name, limit, "connection limit reached; serving the next connection when one closes");
                }
                // The admin listener serves the next connection in whichever place frees first: a
                // reserve place frees within its short head timeout, whatever holds the others.
                let spare = reserve.as_ref().map(|(probes, spare)| (probes, Arc::clone(spare)));
                let next_spare = async {
                    match &spare {
                        Some((probes, s)) => (Arc::clone(s).acquire_owned().await, *probes),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    p = Arc::clone(&permits).acquire_owned() => match p { Ok(p) => p, Err(_) => return },
                    (p, probes) = next_spare => match p {
                        Ok(p) => {
                            served = probes;
                            p
                        }
                        Err(_) => return,
                    },
                    _ = rx.wait_for(|stop| *stop) => return,
                }
            }
        };
        let held = (
            OpenConn::new(&metrics, &shared.closed),
            permit,
            serving
                .as_ref()
                .zip(thread_metrics.as_ref())
                .map(|(s, t)| if handed { Serving::adopt(s, t) } else { Serving::new(s, t) }),
        );
        match served {
            Listener::Http(settings) => {
                connection::spawn(stream, remote, Arc::clone(settings), held);
            }
            Listener::Cache(ctx) => keyroute_cacheproxy::spawn(stream, Arc::clone(ctx), held),
        }
    }
}

/// Hands a socket just accepted over to a less busy thread (see [`crate::balance`]): `None` when
/// it went, else the socket back, to be served here.
fn hand_over(
    balance: Option<&Balance>,
    serving: Option<&Arc<std::sync::atomic::AtomicUsize>>,
    thread: usize,
    stream: TcpStream,
    remote: SocketAddr,
) -> Option<TcpStream> {
    let (Some(balance), Some(serving)) = (balance, serving) else { return Some(stream) };
    let Some(to) = balance.elsewhere(thread, serving.load(Relaxed)) else { return Some(stream) };
    let std = match stream.into_std() {
        Ok(s) => s,
        // Deregistered and not movable: it cannot be served anywhere.
        Err(_) => {
            to.unsent();
            return None;
        }
    };
    match to.inbox.send((std, remote)) {
        Ok(()) => None,
        // That thread has stopped accepting: served here after all.
        Err(mpsc::error::SendError((std, _))) => {
            to.unsent();
            TcpStream::from_std(std).ok()
        }
    }
}

/// What a listener's accepted connections are served as, chosen once when its loop starts.
enum Listener {
    /// HTTP on the gateway's engine: a client listener's request path (HTTP/1.1, HTTP/2, TLS), or
    /// the admin API.
    Http(Arc<Settings>),
    /// memcached or Redis, on the cache proxy's driver.
    Cache(Arc<keyroute_cacheproxy::Context>),
}

impl GatewayHandle {
    /// Stops the gateway (as if its shutdown future completed).
    pub fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// Reopens every access log at its path (`keyroute serve` does it on `SIGUSR1` and `SIGHUP`),
    /// for logrotate: after the file was moved or deleted, the next lines go to a new file there.
    pub fn reopen_logs(&self) {
        for log in self.shared.front.access_logs.iter().flatten() {
            log.reopen();
        }
    }

    fn pool(&self, name: &str) -> Result<Arc<Pool>, GatewayError> {
        self.shared.fleet.pool(name).ok_or_else(|| GatewayError::UnknownPool(name.to_owned()))
    }

    /// Adds a worker to a pool (the admin API's `POST /workers`), building the new table on the
    /// blocking pool. Returns the pool's new generation.
    ///
    /// # Errors
    ///
    /// No such pool, or the pool refuses the worker (a duplicate name, a table too large).
    pub async fn add_worker(&self, pool: &str, worker: WorkerConfig) -> Result<u64, GatewayError> {
        let pool = self.pool(pool)?;
        tokio::task::spawn_blocking(move || pool.add_worker(worker).map_err(GatewayError::Membership))
            .await
            .unwrap_or(Err(GatewayError::Reload(ReloadError::Interrupted)))
    }

    /// The name of the worker that owns `key` in `pool` now (by the table alone: whether it is
    /// available is not considered), or `None` when the strategy does not place by key or the
    /// pool has no live worker.
    ///
    /// # Errors
    ///
    /// No such pool.
    pub fn owner(&self, pool: &str, key: &str) -> Result<Option<String>, GatewayError> {
        Ok(self.pool(pool)?.snapshot().owner_of(key.as_bytes()).map(|w| w.name.clone()))
    }

    /// A pool's membership: its workers by name (in table order) and, for an etcd-backed pool,
    /// the source's state.
    ///
    /// # Errors
    ///
    /// No such pool.
    pub fn membership(&self, pool: &str) -> Result<Membership, GatewayError> {
        let p = self.pool(pool)?;
        let snap = p.snapshot();
        Ok(Membership {
            workers: snap.workers().iter().map(|w| w.name.clone()).collect(),
            generation: snap.generation(),
            source_up: p.source.up.load(Relaxed) == 1,
            revision: p.source.revision.load(Relaxed) as i64,
            rejected: p.source.rejected.load(Relaxed),
            compactions: p.source.compactions.load(Relaxed),
        })
    }

    /// A pool's hot keys now, hottest first (empty when `hot_keys` is off).
    ///
    /// # Errors
    ///
    /// No such pool.
    pub fn hot_keys(&self, pool: &str) -> Result<Vec<keyroute_fleet::pool::hot::HotKeyInfo>, GatewayError> {
        let p = self.pool(pool)?;
        let snap = p.snapshot();
        Ok(snap.hot().as_ref().map_or_else(Vec::new, |hot| hot.report(&snap)))
    }

    /// How a pool's requests were placed so far.
    ///
    /// # Errors
    ///
    /// No such pool.
    pub fn placements(&self, pool: &str) -> Result<Placements, GatewayError> {
        let p = self.pool(pool)?;
        let o: Vec<u64> = p.metrics.outcomes.iter().map(|c| c.load(Relaxed)).collect();
        Ok(Placements {
            owner: o[0],
            unavailable: o[1],
            overloaded: o[2],
            retry: o[3],
            unkeyed: o[4],
            replica: o[5],
            warming: o[6],
        })
    }

    /// The request path of client listener `index` (in configuration order), as a service that
    /// takes requests without a socket.
    pub fn service(&self, index: usize) -> Option<ProxyService> {
        (index < self.shared.listeners.len()).then(|| ProxyService::new(Arc::clone(&self.shared.front), index))
    }

    /// Applies a new configuration: pools (strategy, key, workers, health, retries) and routes.
    /// Workers that keep their name, address and zone keep their state. TLS certificates are read
    /// again and serve new handshakes. Other listener and admin settings cannot change without a
    /// restart; a change there is refused. Every pool's new
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
                    && a.max_connections == b.max_connections
                    && a.reuse_port == b.reuse_port
                    && match (&a.serves, &b.serves) {
                        (Serves::Http(a), Serves::Http(b)) => a.reloadable_to(b),
                        // A cache listener's connections hold its settings from their start.
                        (Serves::Cache(a), Serves::Cache(b)) => a == b,
                        _ => false,
                    }
            });
        if !same {
            return Err(GatewayError::Reload(ReloadError::Listeners));
        }
        if !same_addr(config.admin.listen, self.shared.admin_listen)
            || config.admin.token.as_deref() != self.shared.admin.token()
        {
            return Err(GatewayError::Reload(ReloadError::Admin));
        }
        check_no_self_workers(&config, &self.shared.own_addrs())?;
        // One reload at a time (SIGHUP and --watch may coincide), and every pool's new table built
        // before any is published: a reload applies whole or not at all.
        let _one = self.shared.reload.lock();
        let old = self.shared.fleet.pools();
        enum Next<'a> {
            Kept(&'a Arc<Pool>, Box<keyroute_fleet::pool::Prepared<'a>>),
            New(Arc<Pool>),
        }
        let mut next = Vec::new();
        let mut reconfigured: Vec<Arc<Pool>> =
            old.iter().filter(|p| config.pools.iter().all(|pc| pc.name != p.name)).cloned().collect();
        for pc in &config.pools {
            next.push(match old.iter().find(|p| p.name == pc.name) {
                Some(p) => {
                    if p.snapshot().config().membership != pc.membership {
                        // Its source task starts over with the new settings (or stops).
                        reconfigured.push(Arc::clone(p));
                    }
                    Next::Kept(p, Box::new(p.prepare(pc.clone()).map_err(GatewayError::Membership)?))
                }
                None => {
                    Next::New(Arc::new(Pool::new(pc.clone(), self.shared.epoch).map_err(GatewayError::Membership)?))
                }
            });
        }
        let pools: Vec<Arc<Pool>> = next
            .into_iter()
            .map(|n| match n {
                Next::Kept(p, prepared) => {
                    p.commit(*prepared);
                    Arc::clone(p)
                }
                Next::New(p) => p,
            })
            .collect();
        // Certificates: read again (a renewed file takes effect), for new handshakes only.
        for (certs, l) in self.shared.certificates.iter().zip(&config.listeners) {
            if let (Some(c), Some(h)) = (certs, l.http()) {
                c.replace(h.tls.clone());
            }
        }
        self.shared.grace_ms.store(config.shutdown_grace.as_millis() as u64, Relaxed);
        self.shared.delay_ms.store(config.shutdown_delay.as_millis() as u64, Relaxed);
        let routes = routes_of(&config.listeners);
        crate::probe::set_checks(&config, &pools);
        let routing = Routing::new(&pools, &config.http, routes, Some(&self.shared.front.routing.load()));
        self.shared.front.routing.store(Arc::new(routing));
        self.shared.fleet.replace(pools);
        for p in reconfigured {
            p.reconfigured.notify_one();
        }
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
        crate::state::ready(&self.shared)
    }
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
}
