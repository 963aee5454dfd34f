//! What every gateway test shares: backends (hyper ones, and raw TCP ones that misbehave on
//! purpose), a gateway on 127.0.0.1:0, clients, and polling with a deadline instead of sleeps.

#![allow(dead_code)]

pub mod memcache;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use keyroute_server::{Config, Gateway, GatewayHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A trivial backend: answers with its name, optionally after a delay; counts requests and its
/// peak concurrency; can be killed (every connection dropped) and restarted on the same port.
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    pub served: Arc<AtomicU64>,
    /// Requests that arrived (before any delay).
    pub arrived: Arc<AtomicU64>,
    pub current: Arc<AtomicU64>,
    pub peak: Arc<AtomicU64>,
    pub delay_ms: Arc<AtomicU64>,
    /// While set, requests that arrive wait (after any delay) until it is cleared: a test holds
    /// them at the backend for as long as it needs, whatever the machine's speed.
    pub held: Arc<AtomicBool>,
    pub healthy: Arc<AtomicBool>,
    /// The worker cache result it reports in `X-Cache`: 0 none, 1 `HIT`, 2 `MISS`.
    pub x_cache: Arc<std::sync::atomic::AtomicU8>,
    tasks: Option<JoinSet<()>>,
    accept: Option<tokio::task::AbortHandle>,
}

impl Backend {
    pub async fn start(name: &str) -> Backend {
        let mut b = Backend {
            name: name.to_owned(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            served: Arc::default(),
            arrived: Arc::default(),
            current: Arc::default(),
            peak: Arc::default(),
            delay_ms: Arc::default(),
            held: Arc::default(),
            healthy: Arc::new(AtomicBool::new(true)),
            x_cache: Arc::default(),
            tasks: None,
            accept: None,
        };
        b.restart().await;
        b
    }

    pub async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr).await.expect("bind backend");
        self.addr = listener.local_addr().expect("addr");
        let mut tasks = JoinSet::new();
        let h = Handles {
            name: self.name.clone(),
            served: Arc::clone(&self.served),
            arrived: Arc::clone(&self.arrived),
            current: Arc::clone(&self.current),
            peak: Arc::clone(&self.peak),
            delay: Arc::clone(&self.delay_ms),
            held: Arc::clone(&self.held),
            healthy: Arc::clone(&self.healthy),
            x_cache: Arc::clone(&self.x_cache),
        };
        let conns = Arc::new(tokio::sync::Mutex::new(JoinSet::new()));
        let conns2 = Arc::clone(&conns);
        let accept = tasks.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let h = h.clone();
                conns2.lock().await.spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let Handles { name, served, arrived, current, peak, delay, held, healthy, x_cache } = h.clone();
                        async move {
                            if req.uri().path() == "/healthz" {
                                let status =
                                    if healthy.load(SeqCst) { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                                let mut r = Response::new(Full::new(Bytes::from_static(b"ok")));
                                *r.status_mut() = status;
                                return Ok::<_, Infallible>(r);
                            }
                            arrived.fetch_add(1, SeqCst);
                            let now = current.fetch_add(1, SeqCst) + 1;
                            peak.fetch_max(now, SeqCst);
                            let d = delay.load(SeqCst);
                            if d > 0 {
                                tokio::time::sleep(Duration::from_millis(d)).await;
                            }
                            while held.load(SeqCst) {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            let xff = req
                                .headers()
                                .get("x-forwarded-for")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_owned();
                            let host =
                                req.headers().get("host").and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
                            let hosts = req.headers().get_all("host").iter().count();
                            let proto = req
                                .headers()
                                .get("x-forwarded-proto")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("-")
                                .to_owned();
                            let version = format!("{:?}", req.version());
                            let fail = req.uri().query().is_some_and(|q| q.contains("fail=1"));
                            current.fetch_sub(1, SeqCst);
                            served.fetch_add(1, SeqCst);
                            let q = req.uri().query().unwrap_or("").to_owned();
                            let accept =
                                req.headers().get("accept").and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
                            // `vary=1` answers per Accept: the body says which.
                            let text = if q.contains("vary=1") { format!("{name} {accept}") } else { name.clone() };
                            let mut r = Response::new(Full::new(Bytes::from(text)));
                            // Cacheable on request (`cc=1`), with a cookie (`cookie=1`), varying
                            // on Accept (`vary=1`), reporting a worker cache result (`xcache=`).
                            if q.contains("cc=1") {
                                r.headers_mut().insert("cache-control", "public, max-age=60".parse().expect("header"));
                            }
                            if q.contains("cookie=1") {
                                r.headers_mut().insert("set-cookie", "session=abc".parse().expect("header"));
                            }
                            if q.contains("vary=1") {
                                r.headers_mut().insert("vary", "Accept".parse().expect("header"));
                            }
                            match x_cache.load(SeqCst) {
                                1 => drop(r.headers_mut().insert("x-cache", "HIT".parse().expect("header"))),
                                2 => drop(r.headers_mut().insert("x-cache", "MISS".parse().expect("header"))),
                                _ => {}
                            }
                            if let Some(x) = q.split('&').find_map(|p| p.strip_prefix("xcache=")) {
                                r.headers_mut()
                                    .insert("x-cache", x.parse().unwrap_or_else(|_| "?".parse().expect("header")));
                            }
                            if fail {
                                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                            }
                            r.headers_mut()
                                .insert("x-seen-host", host.parse().unwrap_or_else(|_| "?".parse().expect("header")));
                            r.headers_mut().insert("x-backend", name.parse().expect("header"));
                            r.headers_mut().insert("x-seen-hosts", hosts.into());
                            r.headers_mut()
                                .insert("x-seen-proto", proto.parse().unwrap_or_else(|_| "?".parse().expect("header")));
                            r.headers_mut().insert("x-seen-version", version.parse().expect("header"));
                            r.headers_mut()
                                .insert("x-seen-xff", xff.parse().unwrap_or_else(|_| "?".parse().expect("header")));
                            Ok::<_, Infallible>(r)
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        // The connections' JoinSet lives in a task of `tasks`: killing aborts it, which drops the
        // JoinSet and so aborts every connection, as a crashed process would.
        tasks.spawn(async move {
            std::future::pending::<()>().await;
            drop(conns);
        });
        self.tasks = Some(tasks);
        self.accept = Some(accept);
    }

    /// Closes the listening socket (new connections are refused) but keeps serving the
    /// connections already open, as a worker whose accept loop died would.
    pub fn stop_accepting(&mut self) {
        if let Some(a) = self.accept.take() {
            a.abort();
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut t) = self.tasks.take() {
            t.abort_all();
        }
    }
}

/// A backend's counters and settings, cloned into each connection and request.
#[derive(Clone)]
struct Handles {
    name: String,
    served: Arc<AtomicU64>,
    arrived: Arc<AtomicU64>,
    current: Arc<AtomicU64>,
    peak: Arc<AtomicU64>,
    delay: Arc<AtomicU64>,
    held: Arc<AtomicBool>,
    healthy: Arc<AtomicBool>,
    x_cache: Arc<std::sync::atomic::AtomicU8>,
}

/// A running gateway under test.
pub struct Gw {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub handle: GatewayHandle,
    pub task: tokio::task::JoinHandle<()>,
}

pub fn config_text(backends: &[&Backend], pool_extra: &str, top_extra: &str) -> String {
    let mut s = format!(
        "{top_extra}\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\nkey = \"{{path}}?k={{query.k}}\"\nworker_header = \"x-keyroute-worker\"\n{pool_extra}\n"
    );
    for b in backends {
        s.push_str(&format!("\n[[pool.worker]]\nname = \"{}\"\naddress = \"{}\"\n", b.name, b.addr));
    }
    s
}

pub async fn start_gateway(text: &str) -> Gw {
    // A bind to port 0 can fail with "address in use" when the kernel finds no free ephemeral
    // port for it at that moment (the tests leave many connections in TIME_WAIT): asked again.
    let mut attempt = 0;
    let gw = loop {
        let config = Config::parse(text, "test.toml").expect("valid config");
        match Gateway::bind(config).await {
            Ok(gw) => break gw,
            Err(keyroute_server::GatewayError::Bind { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse && attempt < 5 =>
            {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
            }
            Err(e) => panic!("bind: {e:?}"),
        }
    };
    let addr = gw.local_addrs()[0];
    let admin = gw.admin_addr();
    let handle = gw.handle();
    let task = tokio::spawn(async move {
        gw.run(std::future::pending()).await.expect("run");
    });
    Gw { addr, admin, handle, task }
}

pub type TestClient = Client<HttpConnector, Empty<Bytes>>;

pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn get(c: &TestClient, url: &str) -> (StatusCode, HashMap<String, String>, String) {
    let resp = tokio::time::timeout(Duration::from_secs(10), c.get(url.parse().expect("uri")))
        .await
        .expect("response within 10 s")
        .expect("response");
    let status = resp.status();
    let headers = resp.headers().iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

pub async fn admin(
    gw: &Gw,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (StatusCode, serde_json::Value) {
    let c: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = Request::builder().method(method).uri(format!("http://{}{path}", gw.admin));
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    if !body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    let resp =
        c.request(req.body(Full::new(Bytes::from(body.to_owned()))).expect("request")).await.expect("admin response");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::String(String::from_utf8_lossy(&bytes).into())),
    )
}

pub async fn owners(c: &TestClient, gw: &Gw, keys: &[String]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for k in keys {
        let (status, h, _) = get(c, &format!("http://{}/thumb?k={k}", gw.addr)).await;
        assert_eq!(status, StatusCode::OK, "key {k}");
        out.insert(k.clone(), h["x-keyroute-worker"].clone());
    }
    out
}

pub fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("img-{i}")).collect()
}

pub async fn backends(n: usize) -> Vec<Backend> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(Backend::start(&format!("w{}", i + 1)).await);
    }
    v
}

/// Polls `check` every 10 ms until it holds, for at most `limit` (then panics with `what`).
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(tokio::time::Instant::now() < until, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A worker's entry in the admin API's `/workers`.
pub async fn worker_info(gw: &Gw, name: &str) -> serde_json::Value {
    let (_, v) = admin(gw, "GET", "/workers", "", None).await;
    v["pools"][0]["workers"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["name"] == name).cloned())
        .unwrap_or(serde_json::Value::Null)
}

/// Concurrent GET loops: `tasks` clients, `per_task` requests each, over 50 keys per task.
pub async fn load(gw: &Gw, tasks: usize, per_task: usize) -> JoinSet<Vec<StatusCode>> {
    let mut set = JoinSet::new();
    for t in 0..tasks {
        let url = format!("http://{}/thumb", gw.addr);
        set.spawn(async move {
            let c = client();
            let mut statuses = Vec::new();
            for i in 0..per_task {
                let (s, _, _) = get(&c, &format!("{url}?k=key-{t}-{}", i % 50)).await;
                statuses.push(s);
            }
            statuses
        });
    }
    set
}

/// Sends raw bytes on a new connection and reads until the server closes it (at most 10 s).
pub async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// What a [`RawBackend`] does with a request (its head as text, and its body).
pub type RawHandler = Arc<dyn Fn(&str, &[u8]) -> Option<Vec<u8>> + Send + Sync>;

/// A backend written on raw TCP, for behaviour hyper would not produce: it reads one request
/// (head, then a Content-Length body), counts it, writes what the handler returns (`None`:
/// nothing) and closes the connection.
pub struct RawBackend {
    pub addr: SocketAddr,
    /// Requests read, `/healthz` excluded.
    pub requests: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RawBackend {
    pub async fn start(handler: RawHandler) -> RawBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else { return };
                let (handler, counter) = (Arc::clone(&handler), Arc::clone(&counter));
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    // Read the whole body before answering: closing a socket with unread bytes
                    // sends a reset, which can reach the gateway before the response does.
                    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
                    loop {
                        let done = if chunked {
                            buf[head_end..].windows(5).any(|w| w == b"0\r\n\r\n")
                        } else {
                            buf.len() >= head_end + len
                        };
                        if done {
                            break;
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = buf[head_end..].to_vec();
                    if head.starts_with("GET /healthz ") {
                        let _ =
                            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
                        return;
                    }
                    counter.fetch_add(1, SeqCst);
                    if let Some(reply) = handler(&head, &body) {
                        let _ = s.write_all(&reply).await;
                    }
                    let _ = s.shutdown().await;
                });
            }
        });
        RawBackend { addr, requests, task }
    }
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A config for pool `p` over these worker addresses (named w1, w2, ...).
pub fn config_for(addrs: &[SocketAddr], pool_extra: &str, top_extra: &str) -> String {
    let mut s = format!(
        "{top_extra}\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\nkey = \"{{path}}?k={{query.k}}\"\nworker_header = \"x-keyroute-worker\"\n{pool_extra}\n"
    );
    for (i, a) in addrs.iter().enumerate() {
        s.push_str(&format!("\n[[pool.worker]]\nname = \"w{}\"\naddress = \"{a}\"\n", i + 1));
    }
    s
}

/// A process a test started (memcached, redis-server, nutcracker), stopped by its pid when dropped.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether process `pid` holds a socket listening on 127.0.0.1:`port` (Linux's `/proc`). A
/// connection that succeeds is not enough to know a daemon started: another test's server may
/// hold the port, as CI once saw.
pub fn listens(pid: u32, port: u16) -> bool {
    let Ok(tcp) = std::fs::read_to_string("/proc/net/tcp") else { return false };
    let local = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = tcp
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A"))
        .filter_map(|f| f.get(9).map(|i| format!("socket:[{i}]")))
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
}

/// Starts a daemon made by `command` for a port on a free loopback port, and waits until it
/// listens there itself; on another port when it exits first (the port chosen was taken before
/// it bound it: a test running beside this one may get it). Up to five attempts.
pub fn start_on_free_port(
    what: &str,
    mut command: impl FnMut(u16) -> std::process::Command,
) -> (std::process::Child, u16) {
    for attempt in 1..=5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let mut child = command(port)
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e} (scripts/test.sh installs it)"));
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                eprintln!("attempt {attempt}: {what} exited before listening on port {port}: {status}; another port");
                break;
            }
            if listens(child.id(), port) {
                return (child, port);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} did not listen on port {port} within 15 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    panic!("{what} did not start on a free port in five attempts");
}

/// Real nutcracker (Debian's; scripts/test.sh installs it) running `yml`, its files in `dir`,
/// its stats on a free loopback port; stopped by pid when dropped.
pub fn start_nutcracker(dir: &std::path::Path, yml: &str) -> Proc {
    std::fs::create_dir_all(dir).expect("dir");
    let conf = dir.join("nutcracker.yml");
    std::fs::write(&conf, yml).expect("write conf");
    let stats = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let nutcracker = ["/usr/sbin/nutcracker", "/usr/bin/nutcracker"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("nutcracker (Debian's nutcracker; scripts/test.sh installs it)");
    let child = std::process::Command::new(nutcracker)
        .arg("-c")
        .arg(&conf)
        .args(["-s", &stats.to_string(), "-a", "127.0.0.1", "-o"])
        .arg(dir.join("nutcracker.log"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn nutcracker");
    Proc(child)
}
