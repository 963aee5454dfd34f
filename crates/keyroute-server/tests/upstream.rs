//! Issue 34: the protocols a worker speaks. HTTP/2 to workers (prior knowledge, and by ALPN over
//! TLS), TLS to workers verified against a CA bundle, mutual TLS, and the refusals an operator
//! must see (a certificate expired, for another name, from an unknown CA). The workers are real
//! HTTP servers (hyper, over tokio-rustls for TLS) on 127.0.0.1; certificates are made here
//! (rcgen). gRPC, with real gRPC peers, is in `grpc.rs`.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::net::{TcpListener, TcpStream};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("keyroute-up-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    d
}

/// A body of one data frame, then trailers.
struct WithTrailers(Option<Bytes>, Option<HeaderMap>);

impl Body for WithTrailers {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(d) = self.0.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.1.take().map(|t| Ok(Frame::trailers(t))))
    }
}

/// A worker: answers with its name, the HTTP version it was asked in (`x-version`) and the `TE`
/// it got (`x-te`); `/trailers` ends its body with a trailer `x-status: done`. Counts the
/// connections it accepted and the requests it served. Serves HTTP/1.1 and HTTP/2 (by prior
/// knowledge, or ALPN under TLS).
struct Worker {
    name: String,
    addr: SocketAddr,
    connections: Arc<AtomicU64>,
    /// Connections open now.
    open: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    /// TLS handshakes that resumed a session.
    resumed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Worker {
    async fn start(name: &str, tls: Option<Arc<rustls::ServerConfig>>) -> Worker {
        Worker::start_with(name, tls, 0).await
    }

    /// A worker that closes each connection gracefully (HTTP/2: a GOAWAY) once it has taken
    /// `goaway_after` requests (0: never). `/big?n=N` answers N bytes; a `POST` is answered with
    /// the byte count of its body in `x-received`.
    async fn start_with(name: &str, tls: Option<Arc<rustls::ServerConfig>>, goaway_after: u64) -> Worker {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let resumed = Arc::new(AtomicU64::new(0));
        let open = Arc::new(AtomicU64::new(0));
        let (n, c, r) = (name.to_owned(), Arc::clone(&connections), Arc::clone(&requests));
        let now_open = Arc::clone(&open);
        let res = Arc::clone(&resumed);
        let task = tokio::spawn(async move {
            let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                c.fetch_add(1, SeqCst);
                let (n, r, acceptor, res) = (n.clone(), Arc::clone(&r), acceptor.clone(), Arc::clone(&res));
                let now_open = Arc::clone(&now_open);
                now_open.fetch_add(1, SeqCst);
                tokio::spawn(async move {
                    struct Closed(Arc<AtomicU64>);
                    impl Drop for Closed {
                        fn drop(&mut self) {
                            self.0.fetch_sub(1, SeqCst);
                        }
                    }
                    let _closed = Closed(now_open);
                    let on_conn = Arc::new(AtomicU64::new(0));
                    let enough = Arc::new(tokio::sync::Notify::new());
                    let (counted, told) = (Arc::clone(&on_conn), Arc::clone(&enough));
                    let service = service_fn(move |req: Request<Incoming>| {
                        r.fetch_add(1, SeqCst);
                        if goaway_after > 0 && counted.fetch_add(1, SeqCst) + 1 == goaway_after {
                            told.notify_one();
                        }
                        let n = n.clone();
                        async move { Ok::<_, Infallible>(answer(&n, req).await) }
                    });
                    let auto = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    match acceptor {
                        None => serve(auto.serve_connection(TokioIo::new(tcp), service), &enough).await,
                        Some(a) => {
                            if let Ok(tls) = a.accept(tcp).await {
                                if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                                    res.fetch_add(1, SeqCst);
                                }
                                serve(auto.serve_connection(TokioIo::new(tls), service), &enough).await;
                            }
                        }
                    }
                });
            }
        });
        Worker { name: name.to_owned(), addr, connections, open, requests, resumed, task }
    }
}

/// Serves a connection until it ends, closing it gracefully when `enough` is notified.
async fn serve<C, E>(conn: C, enough: &tokio::sync::Notify)
where
    C: std::future::Future<Output = Result<(), E>> + GracefulShutdown,
{
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = enough.notified() => {}
    }
    conn.as_mut().shutdown();
    let _ = conn.await;
}

/// hyper-util's connection, closed gracefully.
trait GracefulShutdown {
    fn shutdown(self: Pin<&mut Self>);
}

impl<I, S, E> GracefulShutdown for hyper_util::server::conn::auto::Connection<'_, I, S, E>
where
    S: hyper::service::HttpService<Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::ResBody: Body + Send + 'static,
    <S::ResBody as Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
{
    fn shutdown(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// The worker's answer (see [`Worker::start_with`]).
async fn answer(
    name: &str,
    req: Request<Incoming>,
) -> Response<http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>> {
    let version = format!("{:?}", req.version());
    let te = req.headers().get("te").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let path = req.uri().path().to_owned();
    let big = req.uri().query().and_then(|q| q.strip_prefix("n=")).and_then(|n| n.parse::<usize>().ok());
    let received = req.into_body().collect().await.map(|c| c.to_bytes().len()).unwrap_or(0);
    let builder = Response::builder().header("x-version", version).header("x-te", te).header("x-received", received);
    let body = match (path.as_str(), big) {
        ("/big", Some(n)) => http_body_util::Full::new(Bytes::from(vec![b'x'; n])).boxed_unsync(),
        ("/trailers", _) => {
            let mut t = HeaderMap::new();
            t.insert("x-status", "done".parse().expect("value"));
            WithTrailers(Some(Bytes::from(name.to_owned())), Some(t)).boxed_unsync()
        }
        _ => WithTrailers(Some(Bytes::from(name.to_owned())), None).boxed_unsync(),
    };
    builder.body(body).expect("response")
}

/// A config for pool `p` over these workers with `[pool.upstream]` set to `upstream`.
fn config(workers: &[&Worker], upstream: &str) -> String {
    let mut s = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\nh2c = true\n\n[[pool]]\nname = \"p\"\nkey = \"{{path}}?k={{query.k}}\"\nworker_header = \"x-keyroute-worker\"\n\n[pool.upstream]\n{upstream}\n"
    );
    for w in workers {
        s.push_str(&format!("\n[[pool.worker]]\nname = \"{}\"\naddress = \"{}\"\n", w.name, w.addr));
    }
    s
}

/// A CA, and certificates it signs, written as PEM files in `dir`.
struct Ca {
    dir: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: PathBuf,
}

impl Ca {
    fn new(dir: &Path, stem: &str) -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("keyroute test {stem}"));
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("CA");
        let pem = dir.join(format!("{stem}.pem"));
        std::fs::write(&pem, cert.pem()).expect("write CA");
        Ca { dir: dir.to_owned(), issuer: rcgen::Issuer::new(params, key), pem }
    }

    /// A certificate for `names` valid from `from` to `until` (years): its files, and the
    /// chain and key for a rustls server.
    fn issue(
        &self,
        stem: &str,
        names: &[&str],
        years: (i32, i32),
    ) -> (PathBuf, PathBuf, Vec<rustls::pki_types::CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>)
    {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("params");
        params.not_before = rcgen::date_time_ymd(years.0, 1, 1);
        params.not_after = rcgen::date_time_ymd(years.1, 1, 1);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        let (c, k) = (self.dir.join(format!("{stem}.pem")), self.dir.join(format!("{stem}.key")));
        std::fs::write(&c, cert.pem()).expect("write");
        std::fs::write(&k, key.serialize_pem()).expect("write");
        let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der");
        (c, k, vec![cert.der().clone()], der)
    }

    /// A rustls server config presenting a certificate this CA signed for `names`, offering h2
    /// and HTTP/1.1; asking for a client certificate from `clients` (mTLS) when given.
    fn server(&self, stem: &str, names: &[&str], years: (i32, i32), clients: Option<&Ca>) -> Arc<rustls::ServerConfig> {
        let (_, _, chain, key) = self.issue(stem, names, years);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .expect("versions");
        let builder = match clients {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                let pem = std::fs::read(&ca.pem).expect("CA pem");
                use rustls::pki_types::pem::PemObject;
                for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                    roots.add(c.expect("cert")).expect("add");
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .expect("verifier");
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key).expect("server config");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// The value of a worker's counter in `/metrics`.
async fn worker_metric(gw: &Gw, metric: &str, worker: &str) -> u64 {
    let (_, metrics) = admin(gw, "GET", "/metrics", "", None).await;
    let text = metrics.as_str().unwrap_or_default().to_owned();
    text.lines()
        .find(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&format!("worker=\"{worker}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// An HTTP/2 client over prior knowledge to the gateway's h2c listener.
async fn h2_client(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await.expect("h2 handshake");
    tokio::spawn(conn);
    send
}

/// Keyed requests from HTTP/1.1 clients go to HTTP/2 workers (prior knowledge) on a few shared
/// connections, each key to one worker every time; an HTTP/2 client's trailers and `TE: trailers`
/// pass through both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_workers_carry_keyed_requests_on_shared_connections_with_trailers() {
    let workers = [Worker::start("a", None).await, Worker::start("b", None).await, Worker::start("c", None).await];
    let gw = start_gateway(&config(&workers.iter().collect::<Vec<_>>(), "protocol = \"h2\"")).await;
    let c = client();
    let keys = keys(60);
    let first = owners(&c, &gw, &keys).await;
    // 64 concurrent clients, every key three more times: each key stays on its owner.
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..64 {
        let (c, keys, url) = (c.clone(), keys.clone(), format!("http://{}", gw.addr));
        tasks.spawn(async move {
            let mut seen = Vec::new();
            for k in keys.iter().skip(t % 7).step_by(7).chain(keys.iter().skip(t % 5).step_by(5)) {
                let (status, h, body) = get(&c, &format!("{url}/thumb?k={k}")).await;
                assert_eq!(status, StatusCode::OK, "{k}");
                assert_eq!(h["x-version"], "HTTP/2.0", "the worker was asked over HTTP/2");
                assert_eq!(h["x-keyroute-worker"], body);
                seen.push((k.clone(), body));
            }
            seen
        });
    }
    let mut served = 0;
    while let Some(seen) = tasks.join_next().await {
        for (k, owner) in seen.expect("task") {
            assert_eq!(first[&k], owner, "key {k} moved");
            served += 1;
        }
    }
    assert!(served > 1000, "{served}");
    let used: std::collections::HashSet<_> = first.values().collect();
    assert_eq!(used.len(), 3, "60 keys over 3 workers: {first:?}");
    for w in &workers {
        let (conns, reqs) = (w.connections.load(SeqCst), w.requests.load(SeqCst));
        // 64 clients at once share connections: at most a few per worker (100 streams each).
        assert!(conns <= 4, "{}: {conns} connections for {reqs} requests", w.name);
        assert!(reqs > 100, "{}: {reqs}", w.name);
    }

    // An HTTP/2 client asking for trailers gets the worker's, and the worker got `TE: trailers`.
    let mut h2 = h2_client(gw.addr).await;
    let req = Request::get(format!("http://{}/trailers?k=img-1", gw.addr))
        .header("te", "trailers")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = h2.send_request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-te"], "trailers");
    let collected = resp.into_body().collect().await.expect("body");
    let trailers = collected.trailers().cloned().expect("trailers passed through");
    assert_eq!(trailers["x-status"], "done");
    assert!(["a", "b", "c"].contains(&std::str::from_utf8(&collected.to_bytes()).expect("text")));
    gw.task.abort();
}

/// An HTTP health check of an HTTP/2 pool makes a connection for each probe and closes it: the
/// probes do not pile connections up on the worker (a review found they stayed open, pinged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_health_probes_do_not_pile_up_connections() {
    let w = Worker::start("a", None).await;
    let extra = "protocol = \"h2\"\n\n[pool.health]\npath = \"/healthz\"\ninterval_ms = 50\ntimeout_ms = 50\n";
    let gw = start_gateway(&config(&[&w], extra)).await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let (made, open) = (w.connections.load(SeqCst), w.open.load(SeqCst));
    assert!(made >= 10, "the probes ran: {made} connections");
    assert!(open <= 3, "{open} of {made} probe connections still open");
    gw.task.abort();
}

/// HTTP/2 workers that close their connections every 7 requests (GOAWAY) lose no request:
/// 400 requests from 16 clients all answered; and bodies far past HTTP/2's flow-control windows
/// (8 MiB each way) pass whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_goaways_lose_no_request_and_large_bodies_pass_flow_control() {
    let workers = [Worker::start_with("a", None, 7).await, Worker::start_with("b", None, 7).await];
    let gw = start_gateway(&config(&workers.iter().collect::<Vec<_>>(), "protocol = \"h2\"")).await;
    let c = client();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..16 {
        let (c, url) = (c.clone(), format!("http://{}", gw.addr));
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..25 {
                statuses.push(get(&c, &format!("{url}/x?k={t}-{i}")).await.0);
            }
            statuses
        });
    }
    let mut ok = 0;
    while let Some(s) = tasks.join_next().await {
        for status in s.expect("task") {
            assert_eq!(status, StatusCode::OK);
            ok += 1;
        }
    }
    assert_eq!(ok, 400);
    let conns: u64 = workers.iter().map(|w| w.connections.load(SeqCst)).sum();
    // Streams in flight at a GOAWAY finish on their connection, so a connection carries 7 or more.
    assert!(conns >= 10, "the workers did close their connections: {conns}");

    // 8 MiB down and up.
    let (status, _, body) = get(&c, &format!("http://{}/big?n={}", gw.addr, 8 << 20)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), 8 << 20);
    assert!(body.bytes().all(|b| b == b'x'));
    let upload =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http::<http_body_util::Full<Bytes>>();
    let req = Request::post(format!("http://{}/up?k=1", gw.addr))
        .body(http_body_util::Full::new(Bytes::from(vec![7u8; 8 << 20])))
        .expect("request");
    let resp = upload.request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-received"], (8usize << 20).to_string().as_str());
    gw.task.abort();
}

/// TLS to workers: verified against the pool's CA bundle (a worker's certificate names its IP
/// address); `auto` takes HTTP/2 by ALPN; a worker that requires a client certificate gets the
/// pool's; and a worker whose certificate expired, names another host or comes from another CA is
/// refused, counted as a connect error, and the request goes to a worker that verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_workers_are_verified_and_mutual_tls_presents_the_pool_s_certificate() {
    let dir = temp_dir("tls");
    let ca = Ca::new(&dir, "ca");
    let clients = Ca::new(&dir, "clients");
    let (client_cert, client_key, _, _) = clients.issue("gateway", &["gateway.test"], (2020, 2090));
    let good = Worker::start("good", Some(ca.server("good", &["127.0.0.1"], (2020, 2090), None))).await;
    let mutual = Worker::start("mutual", Some(ca.server("mutual", &["127.0.0.1"], (2020, 2090), Some(&clients)))).await;
    let tls = format!("tls = true\nca_file = \"{}\"\n", ca.pem.display());
    let mtls = format!("{tls}client_cert = \"{}\"\nclient_key = \"{}\"\n", client_cert.display(), client_key.display());

    // HTTP/1.1 over TLS, and `auto` (ALPN picks h2), to a worker verified by the CA.
    for (proto, version) in [("http1", "HTTP/1.1"), ("auto", "HTTP/2.0"), ("h2", "HTTP/2.0")] {
        let gw = start_gateway(&config(&[&good], &format!("protocol = \"{proto}\"\n{tls}"))).await;
        let c = client();
        for k in 0..20 {
            let (status, h, body) = get(&c, &format!("http://{}/x?k={k}", gw.addr)).await;
            assert_eq!(status, StatusCode::OK, "{proto}");
            assert_eq!(body, "good");
            assert_eq!(h["x-version"], version, "{proto}");
        }
        gw.task.abort();
    }
    // Connections are kept: 20 requests in sequence did not each make one.
    assert!(good.connections.load(SeqCst) <= 6, "{}", good.connections.load(SeqCst));

    // mTLS: without a client certificate the worker refuses the handshake; with the pool's, it serves.
    let gw = start_gateway(&config(&[&mutual], &tls)).await;
    let (status, _, _) = get(&client(), &format!("http://{}/x?k=1", gw.addr)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "no client certificate: refused");
    assert!(worker_metric(&gw, "keyroute_worker_connect_errors_total", "mutual").await >= 1);
    gw.task.abort();
    let gw = start_gateway(&config(&[&mutual], &mtls)).await;
    let (status, _, body) = get(&client(), &format!("http://{}/x?k=1", gw.addr)).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "mutual"));
    gw.task.abort();

    // Refused: expired, another name, an unknown CA. Each is counted against its worker, and the
    // request fails over to the one that verifies.
    let other = Ca::new(&dir, "other");
    let expired = Worker::start("expired", Some(ca.server("expired", &["127.0.0.1"], (2019, 2021), None))).await;
    let wrong = Worker::start("wrong", Some(ca.server("wrong", &["elsewhere.test"], (2020, 2090), None))).await;
    let unknown = Worker::start("unknown", Some(other.server("unknown", &["127.0.0.1"], (2020, 2090), None))).await;
    let gw = start_gateway(&config(&[&expired, &wrong, &unknown, &good], &tls)).await;
    let c = client();
    for k in 0..40 {
        let (status, _, body) = get(&c, &format!("http://{}/x?k={k}", gw.addr)).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "good"), "key {k}");
    }
    for bad in ["expired", "wrong", "unknown"] {
        assert!(worker_metric(&gw, "keyroute_worker_connect_errors_total", bad).await >= 1, "{bad} not counted");
    }
    assert_eq!(worker_metric(&gw, "keyroute_worker_connect_errors_total", "good").await, 0);
    for w in [&expired, &wrong, &unknown] {
        assert_eq!(w.requests.load(SeqCst), 0, "{} served a request through a refused handshake", w.name);
    }
    gw.task.abort();
    std::fs::remove_dir_all(&dir).ok();
}

/// A new connection to a TLS worker resumes the pool's session rather than pay a full
/// handshake; a reload that changes the CA file is what new connections verify with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sessions_resume_and_a_reload_takes_the_new_files() {
    let dir = temp_dir("reload");
    let (right, wrong) = (Ca::new(&dir, "right"), Ca::new(&dir, "wrong"));
    // One request per connection: every request needs a new connection, and a handshake.
    let w = Worker::start_with("w", Some(right.server("w", &["127.0.0.1"], (2020, 2090), None)), 1).await;
    let ca = dir.join("pool-ca.pem");
    std::fs::copy(&wrong.pem, &ca).expect("copy");
    let text = config(&[&w], &format!("tls = true\nca_file = \"{}\"\n", ca.display()));
    let gw = start_gateway(&text).await;
    let c = client();
    let (status, _, _) = get(&c, &format!("http://{}/x?k=1", gw.addr)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "the worker's CA is not the pool's");
    std::fs::copy(&right.pem, &ca).expect("copy");
    gw.handle.reload(keyroute_server::Config::parse(&text, "t.toml").expect("valid")).expect("reload");
    for k in 0..6 {
        let (status, _, body) = get(&c, &format!("http://{}/x?k={k}", gw.addr)).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "w"), "after the reload");
    }
    let (conns, resumed) = (w.connections.load(SeqCst), w.resumed.load(SeqCst));
    assert!(conns >= 6, "{conns}");
    assert!(resumed >= 4, "{resumed} of {conns} handshakes resumed");
    gw.task.abort();
    std::fs::remove_dir_all(&dir).ok();
}

/// A real HTTP/2 server as the workers: nghttpd (Debian's nghttp2-server, h2c with prior
/// knowledge) serving files; each key's requests reach its owner, and a 1 MiB file passes whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nghttpd_workers_serve_keyed_requests_over_h2() {
    let dir = temp_dir("nghttpd");
    let mut procs = Vec::new();
    let mut text = String::from(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\nkey = \"{query.k}\"\nworker_header = \"x-keyroute-worker\"\n\n[pool.upstream]\nprotocol = \"h2\"\n",
    );
    for name in ["n1", "n2"] {
        let docs = dir.join(name);
        std::fs::create_dir_all(&docs).expect("dir");
        std::fs::write(docs.join("who"), name).expect("file");
        std::fs::write(docs.join("big"), vec![b'z'; 1 << 20]).expect("file");
        let (child, port) = start_nghttpd(&docs);
        procs.push(child);
        text.push_str(&format!("\n[[pool.worker]]\nname = \"{name}\"\naddress = \"127.0.0.1:{port}\"\n"));
    }
    let gw = start_gateway(&text).await;
    let c = client();
    let mut seen = std::collections::HashSet::new();
    for k in 0..40 {
        let (status, h, body) = get(&c, &format!("http://{}/who?k={k}", gw.addr)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h["x-keyroute-worker"], body, "key {k} answered by its owner");
        assert_eq!(gw.handle.owner("p", &k.to_string()).expect("pool").as_deref(), Some(body.as_str()));
        seen.insert(body);
    }
    assert_eq!(seen.len(), 2);
    let (status, _, body) = get(&c, &format!("http://{}/big?k=1", gw.addr)).await;
    assert_eq!((status, body.len()), (StatusCode::OK, 1 << 20));
    gw.task.abort();
    drop(procs);
    std::fs::remove_dir_all(&dir).ok();
}

/// nghttpd on a free port, serving `docs` over h2c: the process (stopped by pid when dropped)
/// and its port.
fn start_nghttpd(docs: &Path) -> (Proc, u16) {
    let bin = if Path::new("/usr/sbin/nghttpd").exists() { "/usr/sbin/nghttpd" } else { "nghttpd" };
    for _ in 0..20 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let child = std::process::Command::new(bin)
            .args(["--no-tls", "-a", "127.0.0.1", "-d"])
            .arg(docs)
            .arg(port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nghttpd (scripts/test.sh installs nghttp2-server)");
        let mut p = Proc(child);
        for _ in 0..50 {
            if listens(p.0.id(), port) {
                return (p, port);
            }
            if p.0.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = p.0.kill();
    }
    panic!("nghttpd did not start");
}

/// nginx as a TLS worker that requires a client certificate (`ssl_verify_client on`): the pool's
/// certificate gets its answer; without one, nginx answers 400 itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_as_a_mutual_tls_worker() {
    let dir = temp_dir("nginx-mtls");
    let (ca, clients) = (Ca::new(&dir, "ca"), Ca::new(&dir, "clients"));
    let (cert, key, _, _) = ca.issue("nginx", &["127.0.0.1"], (2020, 2090));
    let (client_cert, client_key, _, _) = clients.issue("gw", &["gw.test"], (2020, 2090));
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let prefix = dir.join("nginx");
    std::fs::create_dir_all(prefix.join("logs")).expect("dir");
    let conf = prefix.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "master_process off;\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/logs/error.log warn;\nevents {{ worker_connections 64; }}\nhttp {{\n access_log off;\n client_body_temp_path {p}/body;\n proxy_temp_path {p}/proxy;\n fastcgi_temp_path {p}/fastcgi;\n uwsgi_temp_path {p}/uwsgi;\n scgi_temp_path {p}/scgi;\n server {{\n  listen 127.0.0.1:{port} ssl;\n  ssl_certificate {c};\n  ssl_certificate_key {k};\n  ssl_client_certificate {ca};\n  ssl_verify_client on;\n  location / {{ return 200 \"nginx-mtls\"; }}\n }}\n}}\n",
            p = prefix.display(),
            c = cert.display(),
            k = key.display(),
            ca = clients.pem.display(),
        ),
    )
    .expect("conf");
    let nginx = if Path::new("/usr/sbin/nginx").exists() { "/usr/sbin/nginx" } else { "nginx" };
    let child = std::process::Command::new(nginx)
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf)
        .args(["-g", "daemon off;"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nginx");
    let proc = Proc(child);
    let pid = proc.0.id();
    eventually(std::time::Duration::from_secs(10), "nginx listens", || async move { listens(pid, port) }).await;
    let w: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let tls = format!("tls = true\nca_file = \"{}\"\n", ca.pem.display());
    let mtls = format!("{tls}client_cert = \"{}\"\nclient_key = \"{}\"\n", client_cert.display(), client_key.display());
    let gw = start_gateway(&config_for(&[w], &format!("\n[pool.upstream]\n{mtls}"), "")).await;
    let (status, _, body) = get(&client(), &format!("http://{}/x?k=1", gw.addr)).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "nginx-mtls"));
    gw.task.abort();
    let gw = start_gateway(&config_for(&[w], &format!("\n[pool.upstream]\n{tls}"), "")).await;
    let (status, _, _) = get(&client(), &format!("http://{}/x?k=1", gw.addr)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "nginx's own answer without a client certificate");
    gw.task.abort();
    drop(proc);
    std::fs::remove_dir_all(&dir).ok();
}

/// `[pool.upstream]` mistakes are configuration errors naming the file, line and field.
#[test]
fn upstream_settings_are_checked_where_they_are_written() {
    let dir = temp_dir("cfg");
    let ca = Ca::new(&dir, "ca");
    let (cert, key, _, _) = ca.issue("client", &["c.test"], (2020, 2090));
    let w: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let cases: Vec<(String, &str, &str)> = vec![
        ("protocol = \"h3\"".into(), "pool.p.upstream.protocol", "not one of"),
        ("protocol = \"auto\"".into(), "pool.p.upstream.protocol", "needs TLS"),
        ("ca_file = \"x.pem\"".into(), "pool.p.upstream.ca_file", "without tls = true"),
        ("tls = true\nca_file = \"/nonexistent/ca.pem\"".into(), "pool.p.upstream.ca_file", "cannot read"),
        (format!("tls = true\nca_file = \"{}\"", key.display()), "pool.p.upstream.ca_file", "no usable CA"),
        (
            format!("tls = true\nca_file = \"{}\"\nclient_cert = \"{}\"", ca.pem.display(), cert.display()),
            "pool.p.upstream.client_key",
            "needs client_key",
        ),
        (
            format!(
                "tls = true\nca_file = \"{}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"",
                ca.pem.display(),
                cert.display(),
                cert.display()
            ),
            "pool.p.upstream.client_key",
            "not a PEM private key",
        ),
        (
            format!("tls = true\nca_file = \"{}\"\nserver_name = \"not a name\"", ca.pem.display()),
            "pool.p.upstream.server_name",
            "not a DNS name",
        ),
        (
            format!("tls = true\nca_file = \"{}\"\nmin_version = \"1.1\"", ca.pem.display()),
            "pool.p.upstream.min_version",
            "not one of",
        ),
        ("max_streams = 0".into(), "pool.p.upstream.max_streams", "1..=10000"),
        ("tls = true\nversion = 2".into(), "", "unknown field"),
    ];
    for (section, field, needle) in cases {
        let text = config_for(&[w], &format!("\n[pool.upstream]\n{section}\n"), "");
        let e = keyroute_server::Config::parse(&text, "up.toml").expect_err(&section).to_string();
        let line = e.strip_prefix("up.toml:").and_then(|r| r.split(':').next()).and_then(|n| n.parse::<u32>().ok());
        assert!(line.is_some(), "file and line: {section}: {e}");
        assert!(e.contains(field), "{section}: {e}");
        assert!(e.contains(needle), "{section}: {e}");
    }
    // Workers named by DNS carry a port by default: no certificate names them.
    let text = format!(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\n\n[pool.upstream]\ntls = true\nca_file = \"{}\"\nserver_name = \"{{worker}}\"\n\n[pool.membership]\nsource = \"dns\"\nname = \"_h._tcp.a.test\"\nserver = \"127.0.0.1\"\n",
        ca.pem.display()
    );
    let e = keyroute_server::Config::parse(&text, "up.toml").expect_err("worker names with ports").to_string();
    assert!(e.contains("pool.p.upstream.server_name") && e.contains("with a port"), "{e}");
    // A gRPC health check needs HTTP/2 to the workers, and asks a service, not a path.
    for (extra, field, needle) in [
        ("\n[pool.health]\ngrpc_service = \"\"\n", "pool.p.health.grpc_service", "needs HTTP/2"),
        (
            "\n[pool.upstream]\nprotocol = \"h2\"\n\n[pool.health]\ngrpc_service = \"s\"\npath = \"/x\"\n",
            "pool.p.health.path",
            "not a path",
        ),
    ] {
        let e = keyroute_server::Config::parse(&config_for(&[w], extra, ""), "up.toml").expect_err(extra).to_string();
        assert!(e.contains(field) && e.contains(needle), "{extra}: {e}");
    }
    // Valid ones parse, with the pool's client certificate checked against its key.
    for section in [
        "protocol = \"h2\"\nmax_streams = 50".to_owned(),
        format!(
            "tls = true\nca_file = \"{}\"\nprotocol = \"auto\"\nmin_version = \"1.3\"\nserver_name = \"{{worker}}\"",
            ca.pem.display()
        ),
        format!(
            "tls = true\nca_file = \"{}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"\nserver_name = \"api.test\"",
            ca.pem.display(),
            cert.display(),
            key.display()
        ),
    ] {
        let text = config_for(&[w], &format!("\n[pool.upstream]\n{section}\n"), "");
        if let Err(e) = keyroute_server::Config::parse(&text, "up.toml") {
            panic!("{section}: {e}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
