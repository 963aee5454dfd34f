//! Listeners, routing, health probing, reloads and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::{Config, ListenerConfig, RouteConfig};
use crate::health::Transition;
use crate::pool::{Pool, State};
use crate::proxy::{self, ProxyBody, json_error};
use crate::{ConfigError, GatewayError};

/// The pools and each listener's routes, swapped whole on reload.
#[derive(Debug)]
pub(crate) struct Routing {
    pub(crate) pools: Vec<Arc<Pool>>,
    pub(crate) routes: Vec<Vec<RouteConfig>>,
}

impl Routing {
    fn route(&self, listener: usize, req: &Request<Incoming>) -> Option<&Arc<Pool>> {
        let host =
            req.uri().host().or_else(|| req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok())).map(|h| {
                h.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map_or(h, |(h, _)| h)
            });
        let path = req.uri().path();
        self.routes.get(listener)?.iter().find_map(|r| {
            let host_ok = r.host.as_deref().is_none_or(|want| host.is_some_and(|h| h.eq_ignore_ascii_case(want)));
            (host_ok && path.starts_with(&r.path_prefix)).then(|| &self.pools[r.pool])
        })
    }

    pub(crate) fn pool(&self, name: Option<&str>) -> Result<&Arc<Pool>, String> {
        match name {
            Some(n) => self.pools.iter().find(|p| p.name == n).ok_or_else(|| format!("no pool named '{n}'")),
            None if self.pools.len() == 1 => Ok(&self.pools[0]),
            None => Err(format!(
                "several pools ({}): name one with ?pool=",
                self.pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

/// State shared by every connection, the admin API and background tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) routing: ArcSwap<Routing>,
    pub(crate) admin_token: Option<String>,
    pub(crate) epoch: Instant,
    pub(crate) listeners: Vec<ListenerConfig>,
    pub(crate) admin_listen: SocketAddr,
    pub(crate) draining: AtomicBool,
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) probers: std::sync::Mutex<Vec<String>>,
    /// The shutdown grace period in milliseconds (a reload may change it).
    pub(crate) grace_ms: std::sync::atomic::AtomicU64,
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

impl Gateway {
    /// Binds every listener and the admin listener.
    ///
    /// # Errors
    ///
    /// A listener cannot be bound, or a pool cannot be built.
    pub async fn bind(config: Config) -> Result<Gateway, GatewayError> {
        let epoch = Instant::now();
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
        let pools = config
            .pools
            .iter()
            .map(|p| Pool::new(p.clone(), epoch).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
            .map_err(GatewayError::Membership)?;
        let routes = bound.iter().map(|l| l.routes.clone()).collect();
        let (shutdown, _) = watch::channel(false);
        Ok(Gateway {
            shared: Arc::new(Shared {
                routing: ArcSwap::from_pointee(Routing { pools, routes }),
                admin_token: config.admin.token.clone(),
                epoch,
                listeners: bound,
                admin_listen,
                draining: AtomicBool::new(false),
                shutdown,
                probers: std::sync::Mutex::new(Vec::new()),
                grace_ms: std::sync::atomic::AtomicU64::new(config.shutdown_grace.as_millis() as u64),
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

    /// Serves until `shutdown` completes (or [`GatewayHandle::shutdown`]): then stops accepting and
    /// lets requests in flight finish, for at most the configured grace period.
    ///
    /// # Errors
    ///
    /// None at present; reserved for fatal listener errors.
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
            let shared = Arc::clone(&shared);
            let graceful = Arc::clone(&graceful);
            let max = shared.listeners[i].max_header_bytes;
            tasks.push(tokio::spawn(accept_loop(
                sock,
                shared,
                graceful,
                move |shared, remote| {
                    let peer = Arc::new(proxy::Peer::new(remote));
                    service_fn(move |req| {
                        let shared = Arc::clone(&shared);
                        let peer = Arc::clone(&peer);
                        async move { Ok::<_, std::convert::Infallible>(handle_request(&shared, i, req, &peer).await) }
                    })
                },
                max,
            )));
        }
        {
            let shared = Arc::clone(&shared);
            let graceful = Arc::clone(&graceful);
            tasks.push(tokio::spawn(accept_loop(self.admin, shared, graceful, |shared, remote| {
                service_fn(move |req| {
                    let shared = Arc::clone(&shared);
                    async move { Ok::<_, std::convert::Infallible>(crate::admin::handle(&shared, req, remote).await) }
                })
            }, 64 * 1024)));
        }
        let mut rx = shared.shutdown.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
        shared.draining.store(true, Relaxed);
        let grace = Duration::from_millis(shared.grace_ms.load(Relaxed));
        tracing::info!(grace_ms = grace.as_millis() as u64, "shutting down: no new connections, draining requests");
        // The accept loops see the signal too and return, closing their listeners.
        for t in tasks {
            let _ = t.await;
        }
        match Arc::try_unwrap(graceful) {
            Ok(graceful) => {
                if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
                    tracing::warn!("grace period over with requests still in flight");
                }
            }
            Err(_) => tracing::warn!("connections still referenced; not waiting for them"),
        }
        Ok(())
    }
}

async fn accept_loop<S, F>(
    sock: TcpListener,
    shared: Arc<Shared>,
    graceful: Arc<GracefulShutdown>,
    make: F,
    max_buf: usize,
) where
    F: Fn(Arc<Shared>, SocketAddr) -> S,
    S: hyper::service::HttpService<Incoming, ResBody = ProxyBody> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut rx = shared.shutdown.subscribe();
    loop {
        // `wait_for` sees a shutdown that happened before this loop subscribed.
        let accepted = tokio::select! {
            a = sock.accept() => a,
            _ = rx.wait_for(|stop| *stop) => return,
        };
        let (stream, remote) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let mut builder = http1::Builder::new();
        builder
            .max_buf_size(max_buf.max(8192))
            .writev(false)
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30));
        let conn = builder.serve_connection(TokioIo::new(stream), make(Arc::clone(&shared), remote));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %remote, "connection ended with an error");
            }
        });
    }
}

async fn handle_request(
    shared: &Arc<Shared>,
    listener: usize,
    req: Request<Incoming>,
    peer: &proxy::Peer,
) -> Response<ProxyBody> {
    let routing = shared.routing.load_full();
    let Some(pool) = routing.route(listener, &req) else {
        return json_error(StatusCode::NOT_FOUND, "no route", serde_json::json!({ "path": req.uri().path() }));
    };
    let mut resp = proxy::forward(pool, req, peer).await;
    if shared.draining.load(Relaxed) {
        resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    resp
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

async fn probe(worker: &crate::pool::WorkerState, path: &str, timeout: Duration) -> bool {
    let Ok(uri) = http::Uri::try_from(path) else { return false };
    let mut req = Request::new(http_body_util::Empty::<Bytes>::new().map_err(|n| match n {}).boxed_unsync());
    *req.uri_mut() = uri;
    if let Ok(host) = http::HeaderValue::try_from(worker.address.to_string()) {
        req.headers_mut().insert(http::header::HOST, host);
    }
    let fut = async {
        let (resp, conn) = worker.upstream.send(req).await.ok()?;
        let ok = resp.status().is_success();
        // Read the body so the connection can be reused.
        resp.into_body().collect().await.ok()?;
        worker.upstream.checkin(conn);
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

    /// Applies a new configuration: pools (strategy, key, workers, health, retries) and routes.
    /// Workers that keep their name and address keep their state. Listener and admin addresses
    /// cannot change without a restart; a change there is refused.
    ///
    /// # Errors
    ///
    /// [`GatewayError::Reload`] when listeners or the admin listener differ; membership errors.
    pub fn reload(&self, config: Config) -> Result<(), GatewayError> {
        // What is bound to sockets cannot change without a restart; refuse rather than ignore.
        let same_addr = |a: SocketAddr, b: SocketAddr| a == b || (a.port() == 0 && a.ip() == b.ip());
        let current = &self.shared.listeners;
        let same = config.listeners.len() == current.len()
            && config
                .listeners
                .iter()
                .zip(current)
                .all(|(a, b)| same_addr(a.listen, b.listen) && a.max_header_bytes == b.max_header_bytes);
        if !same {
            return Err(GatewayError::Reload(
                "listener addresses or max_header_bytes changed; restart to apply them".into(),
            ));
        }
        if !same_addr(config.admin.listen, self.shared.admin_listen) || config.admin.token != self.shared.admin_token {
            return Err(GatewayError::Reload("admin.listen or admin.token changed; restart to apply them".into()));
        }
        // Validate every pool's new membership before changing any, so a reload applies whole or
        // not at all.
        for pc in &config.pools {
            crate::pool::check(pc).map_err(GatewayError::Membership)?;
        }
        self.shared.grace_ms.store(config.shutdown_grace.as_millis() as u64, Relaxed);
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
    /// The file's [`ConfigError`], or those of [`GatewayHandle::reload`].
    pub fn reload_file(&self, path: &Path) -> Result<(), GatewayError> {
        let config = Config::load(path).map_err(|e: ConfigError| GatewayError::Config(Box::new(e)))?;
        self.reload(config)
    }

    /// Whether every pool has at least one available worker.
    pub fn ready(&self) -> bool {
        self.shared
            .routing
            .load()
            .pools
            .iter()
            .all(|p| p.snapshot().workers.iter().any(|w| w.state() == State::Healthy))
    }
}
