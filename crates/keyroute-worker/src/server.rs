//! The HTTP/1.1 server: binding, the accept loop with graceful shutdown, routing, and the
//! thumbnail handler that ties the cache to the render.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{ALLOW, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, VARY};
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::cache::{DiskCache, cache_file_name, touch_file};
use crate::error::{RequestError, WorkerError};
use crate::thumb::{Format, parse_image_name, parse_size, render, resolve_source};
use crate::{WorkerConfig, WorkerStats};

/// How long [`Worker::run`] lets in-flight requests finish after shutdown before dropping them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a client may take to send a request's headers; bounds idle and slow connections.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The pause after a failed `accept` (typically out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The largest accepted [`WorkerConfig::slowdown`]; it keeps `(slowdown - 1) * t` a sane sleep.
const MAX_SLOWDOWN: f64 = 1000.0;

const X_CACHE: HeaderName = HeaderName::from_static("x-cache");
const X_WORKER: HeaderName = HeaderName::from_static("x-worker");

/// Everything a request handler needs, shared by all connections.
#[derive(Debug)]
struct State {
    config: WorkerConfig,
    /// `config.images`, canonicalized: resolved sources must start with it.
    images: PathBuf,
    /// `config.name` as a header value, validated once.
    worker_header: HeaderValue,
    cache: DiskCache,
    stats: Arc<WorkerStats>,
    /// One permit per core: renders beyond that queue here instead of oversubscribing the CPU.
    compute: Semaphore,
    /// The fixed capacity ([`WorkerConfig::slots`]), if any.
    serve: Option<Semaphore>,
}

/// A worker that is bound to its address and has opened its cache, but does not serve yet.
///
/// [`Worker::bind`] does everything that can fail (so a caller learns the port and any
/// configuration error before it starts), then [`Worker::run`] serves until a shutdown future
/// completes.
#[derive(Debug)]
pub struct Worker {
    listener: TcpListener,
    local_addr: SocketAddr,
    state: Arc<State>,
}

impl Worker {
    /// Validates `config`, checks the image directory, creates and scans the cache directory
    /// (rebuilding the LRU index from the thumbnails already there and deleting stray temporary
    /// files), and binds a TCP listener to `addr` (port 0 picks a free port; see
    /// [`Worker::local_addr`]).
    ///
    /// # Errors
    ///
    /// [`WorkerError::Config`] for a field out of range (an empty or non-header-safe name, a zero
    /// `max_dimension`, a `jpeg_quality` outside 1..=100, a `slowdown` below 1, above 1000 or not
    /// finite); [`WorkerError::ImagesDir`] when the image directory is missing or not a
    /// directory; [`WorkerError::CacheDir`] when the cache directory cannot be created or read;
    /// [`WorkerError::Bind`] when the address cannot be bound.
    pub async fn bind(addr: SocketAddr, config: WorkerConfig) -> Result<Worker, WorkerError> {
        let worker_header = validate(&config)?;
        let images_error = |source| WorkerError::ImagesDir { path: config.images.clone(), source };
        let images = tokio::fs::canonicalize(&config.images).await.map_err(images_error)?;
        let meta = tokio::fs::metadata(&images).await.map_err(images_error)?;
        if !meta.is_dir() {
            return Err(images_error(std::io::Error::from(std::io::ErrorKind::NotADirectory)));
        }
        let cache_dir = config.cache_dir.clone();
        tokio::fs::create_dir_all(&cache_dir)
            .await
            .map_err(|source| WorkerError::CacheDir { path: cache_dir.clone(), source })?;
        let stats = Arc::new(WorkerStats::default());
        let (capacity, cache_stats) = (config.cache_bytes, Arc::clone(&stats));
        let cache = tokio::task::spawn_blocking({
            let cache_dir = cache_dir.clone();
            move || DiskCache::open(cache_dir, capacity, cache_stats)
        })
        .await?
        .map_err(|source| WorkerError::CacheDir { path: cache_dir, source })?;
        let listener = TcpListener::bind(addr).await.map_err(|source| WorkerError::Bind { addr, source })?;
        let local_addr = listener.local_addr().map_err(|source| WorkerError::Bind { addr, source })?;
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        tracing::debug!(
            worker = %config.name,
            %local_addr,
            cache_entries = stats.cache_entries.load(Ordering::Relaxed),
            cache_bytes = stats.cache_bytes.load(Ordering::Relaxed),
            "worker bound"
        );
        let serve = (config.slots > 0).then(|| Semaphore::new(config.slots));
        let state = State { config, images, worker_header, cache, stats, compute: Semaphore::new(cores), serve };
        Ok(Worker { listener, local_addr, state: Arc::new(state) })
    }

    /// The address the worker listens on, with the actual port when bound to port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The worker's counters; the `Arc` stays valid (and frozen) after the worker stops.
    pub fn stats(&self) -> Arc<WorkerStats> {
        Arc::clone(&self.state.stats)
    }

    /// Serves HTTP/1.1 until `shutdown` completes, then stops accepting connections, closes idle
    /// ones, and lets requests in flight finish for up to 5 seconds before dropping them.
    ///
    /// Failures while serving (a failed `accept`, a broken connection, a request error) are
    /// logged and answered, never returned.
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for failures that should stop a worker.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), WorkerError> {
        let Worker { listener, local_addr, state } = self;
        let (stop_tx, stop_rx) = watch::channel(());
        let mut connections = JoinSet::new();
        let mut builder = http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::debug!(worker = %state.config.name, %local_addr, "worker serving");
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(err) => {
                            tracing::warn!(worker = %state.config.name, error = %err, "accept failed");
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                            continue;
                        }
                    };
                    let state = Arc::clone(&state);
                    let service = service_fn(move |req| handle(Arc::clone(&state), req));
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    let mut stop = stop_rx.clone();
                    connections.spawn(async move {
                        let mut conn = std::pin::pin!(conn);
                        let result = tokio::select! {
                            result = conn.as_mut() => result,
                            _ = stop.changed() => {
                                conn.as_mut().graceful_shutdown();
                                conn.await
                            }
                        };
                        if let Err(err) = result {
                            tracing::debug!(%peer, error = %err, "connection ended with an error");
                        }
                    });
                }
                Some(done) = connections.join_next(), if !connections.is_empty() => {
                    if let Err(err) = done {
                        tracing::warn!(error = %err, "connection task failed");
                    }
                }
            }
        }
        drop(listener);
        let _ = stop_tx.send(());
        let in_flight = connections.len();
        tracing::debug!(worker = %state.config.name, connections = in_flight, "worker draining");
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while let Some(done) = connections.join_next().await {
                if let Err(err) = done {
                    tracing::warn!(error = %err, "connection task failed");
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(worker = %state.config.name, connections = connections.len(), "drain timed out; dropping connections");
            connections.shutdown().await;
        }
        tracing::debug!(worker = %state.config.name, "worker stopped");
        Ok(())
    }
}

/// Checks the configuration's ranges; returns the name as a header value.
fn validate(config: &WorkerConfig) -> Result<HeaderValue, WorkerError> {
    let invalid = |field, reason: &str| WorkerError::Config { field, reason: reason.to_owned() };
    if config.name.is_empty() {
        return Err(invalid("name", "must not be empty"));
    }
    let header = HeaderValue::from_str(&config.name)
        .map_err(|_| invalid("name", "must be a valid HTTP header value (visible ASCII)"))?;
    if config.max_dimension == 0 {
        return Err(invalid("max_dimension", "must be at least 1"));
    }
    if !(1..=100).contains(&config.jpeg_quality) {
        return Err(invalid("jpeg_quality", "must be from 1 to 100"));
    }
    if config.slots > 10_000 || config.cost_ms > 10_000 {
        return Err(invalid("slots", "slots and cost_ms must each be at most 10000"));
    }
    if !(1.0..=MAX_SLOWDOWN).contains(&config.slowdown) {
        return Err(invalid("slowdown", "must be a number from 1 to 1000"));
    }
    Ok(header)
}

/// Counts a request as in flight for as long as it lives.
struct InFlight<'a>(&'a WorkerStats);

impl<'a> InFlight<'a> {
    fn new(stats: &'a WorkerStats) -> Self {
        stats.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(stats)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A successful answer, before it becomes a `Response`.
struct Reply {
    content_type: &'static str,
    body: Bytes,
    /// `Some("hit" | "miss")` for thumbnails, which also get the caching headers.
    cache: Option<&'static str>,
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let started = Instant::now();
    state.stats.requests.fetch_add(1, Ordering::Relaxed);
    let _in_flight = InFlight::new(&state.stats);
    // The body of a GET or HEAD is meaningless here; it is dropped unread.
    let (req, _body) = req.into_parts();
    let head = req.method == Method::HEAD;
    let result = route(&state, &req).await;
    let (status, reply) = match result {
        Ok(reply) => (StatusCode::OK, reply),
        Err(err) => {
            state.stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                worker = %state.config.name,
                method = %req.method,
                uri = %req.uri,
                status = err.status().as_u16(),
                reason = %err,
                "request failed"
            );
            // keyroute's one error shape (the gateway's and the admin API's too).
            let body = serde_json::json!({
                "error": err.to_string(),
                "reason": err.kind(),
                "status": err.status().as_u16(),
                "worker": state.config.name,
            });
            let reply = Reply { content_type: "application/json", body: Bytes::from(body.to_string()), cache: None };
            (err.status(), reply)
        }
    };
    tracing::debug!(
        worker = %state.config.name,
        method = %req.method,
        uri = %req.uri,
        status = status.as_u16(),
        cache = reply.cache.unwrap_or("-"),
        bytes = reply.body.len(),
        micros = started.elapsed().as_micros() as u64,
        "request"
    );
    let length = reply.body.len();
    let mut response = Response::new(Full::new(if head { Bytes::new() } else { reply.body }));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(reply.content_type));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
    headers.insert(X_WORKER, state.worker_header.clone());
    if let Some(cache) = reply.cache {
        headers.insert(X_CACHE, HeaderValue::from_static(cache));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("public, max-age=86400"));
        headers.insert(VARY, HeaderValue::from_static("Accept"));
    } else {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    if status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    Ok(response)
}

async fn route(state: &Arc<State>, req: &Parts) -> Result<Reply, RequestError> {
    let path = req.uri.path();
    let get_or_head = || {
        if req.method == Method::GET || req.method == Method::HEAD {
            Ok(())
        } else {
            Err(RequestError::MethodNotAllowed(req.method.clone()))
        }
    };
    if path == "/healthz" {
        get_or_head()?;
        return Ok(Reply { content_type: "text/plain; charset=utf-8", body: Bytes::from_static(b"ok"), cache: None });
    }
    if path == "/stats" {
        get_or_head()?;
        return Ok(Reply { content_type: "application/json", body: Bytes::from(stats_json(state)), cache: None });
    }
    if let Some(image) = path.strip_prefix("/thumb/") {
        get_or_head()?;
        return thumbnail(state, image, req).await;
    }
    Err(RequestError::NotFound(format!("no such path {path:?}; try /thumb/{{image}}?w=W&h=H, /healthz or /stats")))
}

fn stats_json(state: &State) -> String {
    let stats = &state.stats;
    let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    serde_json::json!({
        "worker": state.config.name,
        "requests": load(&stats.requests),
        "hits": load(&stats.hits),
        "misses": load(&stats.misses),
        "errors": load(&stats.errors),
        "in_flight": load(&stats.in_flight),
        "cache_bytes": load(&stats.cache_bytes),
        "cache_entries": load(&stats.cache_entries),
    })
    .to_string()
}

/// `GET /thumb/{image}?w=W&h=H`: the cache, else a render (which fills the cache).
/// The cached thumbnail `file`, if the disk cache has it (a hit is counted).
async fn cached(state: &Arc<State>, file: &str, format: Format) -> Option<Reply> {
    let path = state.cache.lookup(file)?;
    match tokio::fs::read(&path).await {
        Ok(bytes) if !bytes.is_empty() => {
            state.stats.hits.fetch_add(1, Ordering::Relaxed);
            // Refresh the file's time so a restart ranks it as recently used; best effort.
            drop(tokio::task::spawn_blocking(move || touch_file(&path)));
            Some(Reply { content_type: format.content_type(), body: Bytes::from(bytes), cache: Some("hit") })
        }
        Ok(_) => {
            state.cache.forget(file);
            None
        }
        Err(err) => {
            // Evicted between the lookup and the read, or unreadable: compute it again.
            tracing::debug!(file = %file, error = %err, "cached thumbnail unreadable; recomputing");
            state.cache.forget(file);
            None
        }
    }
}

async fn thumbnail(state: &Arc<State>, raw_image: &str, req: &Parts) -> Result<Reply, RequestError> {
    let image = parse_image_name(raw_image)?;
    let (w, h) = parse_size(req.uri.query(), state.config.max_dimension)?;
    let format = Format::from_accept(&req.headers);
    let quality = state.config.jpeg_quality;
    let file = cache_file_name(&image, w, h, format, quality);
    // A fixed capacity: the slot is held, and the cost paid, for the whole request.
    let _slot = match &state.serve {
        Some(s) => {
            let permit = s.acquire().await.ok();
            tokio::time::sleep(Duration::from_millis(state.config.cost_ms)).await;
            permit
        }
        None => None,
    };

    if let Some(reply) = cached(state, &file, format).await {
        return Ok(reply);
    }
    let source = resolve_source(&state.images, &image).await?;
    let _permit = state.compute.acquire().await.map_err(|err| RequestError::Internal(err.to_string()))?;
    // Look again once a compute slot is free: a concurrent request for the same thumbnail may have
    // rendered it meanwhile (a cold hot image otherwise gets rendered once per waiting request).
    if let Some(reply) = cached(state, &file, format).await {
        return Ok(reply);
    }
    let job_state = Arc::clone(state);
    let (rendered, took) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let rendered = render(&source, w, h, format, quality);
        let took = started.elapsed();
        if let Ok(bytes) = &rendered
            && let Err(err) = job_state.cache.store(&file, bytes)
        {
            tracing::warn!(worker = %job_state.config.name, file = %file, error = %err, "cannot cache thumbnail");
        }
        (rendered, took)
    })
    .await
    .map_err(|err| RequestError::Internal(format!("render task failed: {err}")))?;
    let bytes = rendered.map_err(|err| err.into_request_error(&image))?;
    if state.config.slowdown > 1.0
        && let Ok(extra) = Duration::try_from_secs_f64(took.as_secs_f64() * (state.config.slowdown - 1.0))
    {
        tokio::time::sleep(extra).await;
    }
    state.stats.misses.fetch_add(1, Ordering::Relaxed);
    Ok(Reply { content_type: format.content_type(), body: Bytes::from(bytes), cache: Some("miss") })
}
