//! The gateway end to end: real sockets on 127.0.0.1, hyper backends inside the test, every test
//! bounded in time.

use std::collections::{HashMap, HashSet};
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
use keyroute_gateway::{Config, Gateway, GatewayHandle};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// A trivial backend: answers with its name, optionally after a delay; counts requests and its
/// peak concurrency; can be killed (every connection dropped) and restarted on the same port.
struct Backend {
    name: String,
    addr: SocketAddr,
    served: Arc<AtomicU64>,
    current: Arc<AtomicU64>,
    peak: Arc<AtomicU64>,
    delay_ms: Arc<AtomicU64>,
    healthy: Arc<AtomicBool>,
    tasks: Option<JoinSet<()>>,
}

impl Backend {
    async fn start(name: &str) -> Backend {
        let mut b = Backend {
            name: name.to_owned(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            served: Arc::default(),
            current: Arc::default(),
            peak: Arc::default(),
            delay_ms: Arc::default(),
            healthy: Arc::new(AtomicBool::new(true)),
            tasks: None,
        };
        b.restart().await;
        b
    }

    async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr).await.expect("bind backend");
        self.addr = listener.local_addr().expect("addr");
        let mut tasks = JoinSet::new();
        let (name, served, current, peak, delay, healthy) = (
            self.name.clone(),
            Arc::clone(&self.served),
            Arc::clone(&self.current),
            Arc::clone(&self.peak),
            Arc::clone(&self.delay_ms),
            Arc::clone(&self.healthy),
        );
        let conns = Arc::new(tokio::sync::Mutex::new(JoinSet::new()));
        let conns2 = Arc::clone(&conns);
        tasks.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (name, served, current, peak, delay, healthy) = (
                    name.clone(),
                    Arc::clone(&served),
                    Arc::clone(&current),
                    Arc::clone(&peak),
                    Arc::clone(&delay),
                    Arc::clone(&healthy),
                );
                conns2.lock().await.spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (name, served, current, peak, delay, healthy) = (
                            name.clone(),
                            Arc::clone(&served),
                            Arc::clone(&current),
                            Arc::clone(&peak),
                            Arc::clone(&delay),
                            Arc::clone(&healthy),
                        );
                        async move {
                            if req.uri().path() == "/healthz" {
                                let status =
                                    if healthy.load(SeqCst) { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                                let mut r = Response::new(Full::new(Bytes::from_static(b"ok")));
                                *r.status_mut() = status;
                                return Ok::<_, Infallible>(r);
                            }
                            let now = current.fetch_add(1, SeqCst) + 1;
                            peak.fetch_max(now, SeqCst);
                            let d = delay.load(SeqCst);
                            if d > 0 {
                                tokio::time::sleep(Duration::from_millis(d)).await;
                            }
                            let xff = req
                                .headers()
                                .get("x-forwarded-for")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_owned();
                            let host =
                                req.headers().get("host").and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
                            let fail = req.uri().query().is_some_and(|q| q.contains("fail=1"));
                            current.fetch_sub(1, SeqCst);
                            served.fetch_add(1, SeqCst);
                            let mut r = Response::new(Full::new(Bytes::from(name.clone())));
                            if fail {
                                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                            }
                            r.headers_mut()
                                .insert("x-seen-host", host.parse().unwrap_or_else(|_| "?".parse().expect("header")));
                            r.headers_mut().insert("x-backend", name.parse().expect("header"));
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
    }

    fn kill(&mut self) {
        if let Some(mut t) = self.tasks.take() {
            t.abort_all();
        }
    }
}

/// A running gateway under test.
struct Gw {
    addr: SocketAddr,
    admin: SocketAddr,
    handle: GatewayHandle,
    task: tokio::task::JoinHandle<()>,
}

fn config_text(backends: &[&Backend], pool_extra: &str, top_extra: &str) -> String {
    let mut s = format!(
        "{top_extra}\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\nkey = \"{{path}}?k={{query.k}}\"\nworker_header = \"x-keyroute-worker\"\n{pool_extra}\n"
    );
    for b in backends {
        s.push_str(&format!("\n[[pool.worker]]\nname = \"{}\"\naddress = \"{}\"\n", b.name, b.addr));
    }
    s
}

async fn start_gateway(text: &str) -> Gw {
    let config = Config::parse(text, "test.toml").expect("valid config");
    let gw = Gateway::bind(config).await.expect("bind");
    let addr = gw.local_addrs()[0];
    let admin = gw.admin_addr();
    let handle = gw.handle();
    let task = tokio::spawn(async move {
        gw.run(std::future::pending()).await.expect("run");
    });
    Gw { addr, admin, handle, task }
}

type TestClient = Client<HttpConnector, Empty<Bytes>>;

fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn get(c: &TestClient, url: &str) -> (StatusCode, HashMap<String, String>, String) {
    let resp = tokio::time::timeout(Duration::from_secs(10), c.get(url.parse().expect("uri")))
        .await
        .expect("response within 10 s")
        .expect("response");
    let status = resp.status();
    let headers = resp.headers().iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

async fn admin(gw: &Gw, method: &str, path: &str, body: &str, token: Option<&str>) -> (StatusCode, serde_json::Value) {
    let c: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = Request::builder().method(method).uri(format!("http://{}{path}", gw.admin));
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
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

async fn owners(c: &TestClient, gw: &Gw, keys: &[String]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for k in keys {
        let (status, h, _) = get(c, &format!("http://{}/thumb?k={k}", gw.addr)).await;
        assert_eq!(status, StatusCode::OK, "key {k}");
        out.insert(k.clone(), h["x-keyroute-worker"].clone());
    }
    out
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("img-{i}")).collect()
}

async fn backends(n: usize) -> Vec<Backend> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(Backend::start(&format!("w{}", i + 1)).await);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_same_worker_across_requests_and_gateways() {
    let bs = backends(4).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let text = config_text(&refs, "strategy = \"rendezvous\"", "");
    let (a, b) = (start_gateway(&text).await, start_gateway(&text).await);
    let c = client();
    let ks = keys(40);
    let first = owners(&c, &a, &ks).await;
    assert_eq!(owners(&c, &a, &ks).await, first);
    assert_eq!(owners(&c, &b, &ks).await, first, "two gateways with one config agree");
    let used: HashSet<&String> = first.values().collect();
    assert!(used.len() >= 3, "40 keys should spread over the workers: {used:?}");
    // The body is the backend's own name: the header tells the truth.
    let (_, h, body) = get(&c, &format!("http://{}/thumb?k=img-1", a.addr)).await;
    assert_eq!(h["x-keyroute-worker"], body);
    assert!(h["x-seen-xff"].contains("127.0.0.1"), "X-Forwarded-For is added");
    a.task.abort();
    b.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_owner_moves_only_its_keys_to_their_runner_up_and_back() {
    let mut bs = backends(4).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let text = config_text(
        &refs,
        "strategy = \"rendezvous\"\n[pool.health]\npath = \"/healthz\"\ninterval_ms = 30\ntimeout_ms = 200\nrise = 1\nfall = 1",
        "",
    );
    let gw = start_gateway(&text).await;
    let c = client();
    let ks = keys(60);
    let before = owners(&c, &gw, &ks).await;
    // The runner-up of each key, from the admin API's ranking.
    let mut runner_up = HashMap::new();
    for k in &ks {
        let (_, v) = admin(&gw, "GET", &format!("/placement?key=/thumb?k={k}"), "", None).await;
        let ranking: Vec<String> = v["ranking"]
            .as_array()
            .expect("ranking")
            .iter()
            .map(|r| r["name"].as_str().unwrap_or("").to_owned())
            .collect();
        assert_eq!(ranking[0], before[k], "placement agrees with the proxy for {k}");
        runner_up.insert(k.clone(), ranking[1].clone());
    }
    let victim = before["img-0"].clone();
    let idx = bs.iter().position(|b| b.name == victim).expect("victim");
    bs[idx].kill();
    // Wait for the health check to notice (or let retries cover it meanwhile).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let during = owners(&c, &gw, &ks).await;
    for k in &ks {
        if before[k] == victim {
            assert_eq!(during[k], runner_up[k], "{k} must go to its runner-up");
        } else {
            assert_eq!(during[k], before[k], "{k} did not belong to the dead worker and must not move");
        }
    }
    bs[idx].restart().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(owners(&c, &gw, &ks).await, before, "keys come back when the owner recovers");
    gw.task.abort();
}

async fn load(gw: &Gw, tasks: usize, per_task: usize) -> JoinSet<Vec<StatusCode>> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_under_load_fails_no_get() {
    let mut bs = backends(4).await;
    for b in &bs {
        b.delay_ms.store(2, SeqCst);
    }
    let refs: Vec<&Backend> = bs.iter().collect();
    let text = config_text(&refs, "strategy = \"rendezvous\"\n[pool.health]\ninterval_ms = 50\nfall = 1\n", "");
    let gw = start_gateway(&text).await;
    let mut set = load(&gw, 8, 150).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    bs[1].kill();
    let mut total = 0;
    while let Some(r) = set.join_next().await {
        let statuses = r.expect("task");
        total += statuses.len();
        assert!(statuses.iter().all(|s| *s == StatusCode::OK), "a GET failed: {statuses:?}");
    }
    assert_eq!(total, 1200);
    assert!(bs[1].served.load(SeqCst) > 0, "the killed worker served before it died");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_under_load_lose_no_request() {
    let bs = backends(5).await;
    for b in &bs {
        b.delay_ms.store(1, SeqCst);
    }
    let refs: Vec<&Backend> = bs[..4].iter().collect();
    let gw = start_gateway(&config_text(&refs, "strategy = \"ring\"", "")).await;
    let mut set = load(&gw, 6, 150).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let (s, v) =
        admin(&gw, "POST", "/workers", &format!("{{\"name\":\"w5\",\"address\":\"{}\"}}", bs[4].addr), None).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    tokio::time::sleep(Duration::from_millis(60)).await;
    let (s, v) = admin(&gw, "DELETE", "/workers/w2?drain=true", "", None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, v) = admin(&gw, "PATCH", "/workers/w3", "{\"weight\": 3}", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    while let Some(r) = set.join_next().await {
        assert!(r.expect("task").iter().all(|s| *s == StatusCode::OK));
    }
    assert!(bs[4].served.load(SeqCst) > 0, "the new worker took traffic");
    // The drained worker is gone once its requests finished.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, v) = admin(&gw, "GET", "/workers", "", None).await;
    let names: Vec<&str> =
        v["pools"][0]["workers"].as_array().expect("workers").iter().filter_map(|w| w["name"].as_str()).collect();
    assert_eq!(names, ["w1", "w3", "w4", "w5"]);
    let (_, metrics) = admin(&gw, "GET", "/metrics", "", None).await;
    let text = metrics.as_str().unwrap_or("");
    assert!(text.contains("keyroute_pool_membership_changes_total{pool=\"p\"} 3"), "{text}");
    assert!(text.contains("keyroute_worker_latency_seconds_bucket"));
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_reload_keeps_serving_the_old_config() {
    let bs = backends(2).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let dir = std::env::temp_dir().join(format!("keyroute-gw-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("gw.toml");
    let text = config_text(&refs, "strategy = \"rendezvous\"", "");
    std::fs::write(&path, &text).expect("write");
    let gw = start_gateway(&std::fs::read_to_string(&path).expect("read")).await;
    let c = client();
    let ks = keys(20);
    let before = owners(&c, &gw, &ks).await;
    std::fs::write(&path, text.replace("strategy = \"rendezvous\"", "strategy = \"nonsense\"")).expect("write");
    let err = gw.handle.reload_file(&path).expect_err("invalid");
    let msg = err.to_string();
    assert!(msg.contains("gw.toml:") && msg.contains("strategy") && msg.contains("unknown strategy"), "{msg}");
    assert_eq!(owners(&c, &gw, &ks).await, before, "the old configuration serves on");
    // A good reload applies: one worker only.
    let one = config_text(&refs[..1], "strategy = \"rendezvous\"", "");
    std::fs::write(&path, one).expect("write");
    gw.handle.reload_file(&path).expect("valid reload");
    assert!(owners(&c, &gw, &ks).await.values().all(|w| w == "w1"));
    std::fs::remove_dir_all(&dir).ok();
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_auth_is_enforced() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let text = config_text(&refs, "", "").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"s3cret-s3cret-s3cret\"",
    );
    let gw = start_gateway(&text).await;
    assert_eq!(admin(&gw, "GET", "/workers", "", None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(admin(&gw, "GET", "/workers", "", Some("s3cret-s3cret-s3creT")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(admin(&gw, "DELETE", "/workers/w1", "", Some("wrong")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(admin(&gw, "GET", "/workers", "", Some("s3cret-s3cret-s3cret")).await.0, StatusCode::OK);
    assert_eq!(admin(&gw, "GET", "/healthz", "", None).await.0, StatusCode::OK);
    gw.task.abort();
}

/// A current-thread runtime makes decisions strictly sequential, so the cap is exact.
#[tokio::test]
async fn bounded_loads_cap_a_hot_keys_worker() {
    let bs = backends(8).await;
    for b in &bs {
        b.delay_ms.store(100, SeqCst);
    }
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "strategy = \"bounded-rendezvous\"\nepsilon = 0.25", "")).await;
    let mut set = JoinSet::new();
    for _ in 0..32 {
        let url = format!("http://{}/thumb?k=hot", gw.addr);
        set.spawn(async move { get(&client(), &url).await.1["x-keyroute-worker"].clone() });
    }
    let mut served = HashMap::new();
    while let Some(r) = set.join_next().await {
        *served.entry(r.expect("task")).or_insert(0) += 1;
    }
    // 32 at once over 8 workers: capacity ceil(1.25 x 32 / 8) = 5 in flight per worker.
    let peak = bs.iter().map(|b| b.peak.load(SeqCst)).max().unwrap_or(0);
    assert!(peak <= 5, "a worker held {peak} requests at once: {served:?}");
    assert!(served.len() >= 7, "the hot key spilled along its ranking: {served:?}");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_statuses_say_why() {
    let mut bs = backends(2).await;
    bs[0].delay_ms.store(1500, SeqCst);
    let refs: Vec<&Backend> = bs.iter().collect();
    let text = config_text(
        &refs,
        "strategy = \"rendezvous\"\non_missing_key = \"reject\"\n[pool.retry]\nattempts = 1\nper_try_timeout_ms = 300\n[pool.passive]\nconsecutive_failures = 0",
        "",
    );
    let gw = start_gateway(&text).await;
    let c = client();
    // 400: the key's query parameter is missing.
    let (s, _, body) = get(&c, &format!("http://{}/thumb", gw.addr)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(body.contains("query.k"), "{body}");
    // 504 for keys owned by the slow worker (one try, 300 ms), 200 for the others.
    let mut got_504 = false;
    for i in 0..40 {
        let k = format!("k{i}");
        let (_, v) = admin(&gw, "GET", &format!("/placement?key=/thumb?k={k}"), "", None).await;
        let (s, _, body) = get(&c, &format!("http://{}/thumb?k={k}", gw.addr)).await;
        if v["owner"] == "w1" {
            assert_eq!(s, StatusCode::GATEWAY_TIMEOUT, "{body}");
            assert!(body.contains("timed out"), "{body}");
            got_504 = true;
            break;
        }
        assert_eq!(s, StatusCode::OK);
    }
    assert!(got_504);
    // 502: every worker refuses connections (no active checks, no ejection).
    bs[0].kill();
    bs[1].kill();
    // The first try may land on a pooled connection the kill reset ("upstream request failed");
    // once those are gone, connecting fails ("cannot connect"). Both are 502.
    let mut refused = false;
    for _ in 0..4 {
        let (s, _, body) = get(&c, &format!("http://{}/thumb?k=a", gw.addr)).await;
        assert_eq!(s, StatusCode::BAD_GATEWAY, "{body}");
        if body.contains("cannot connect") {
            refused = true;
            break;
        }
    }
    assert!(refused);
    // 503: every worker drained.
    for w in ["w1", "w2"] {
        admin(&gw, "DELETE", &format!("/workers/{w}"), "", None).await;
    }
    let (s, _, body) = get(&c, &format!("http://{}/thumb?k=a", gw.addr)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("no available worker") && body.contains("the pool has no workers"), "{body}");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_get_431_and_unknown_routes_404() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let text = config_text(&refs, "", "").replace("listen = \"127.0.0.1:0\"\n\n[[pool]]", "listen = \"127.0.0.1:0\"\nmax_header_bytes = 8192\n[[listener.route]]\npath_prefix = \"/thumb\"\npool = \"p\"\n\n[[pool]]");
    let gw = start_gateway(&text).await;
    let c: Client<HttpConnector, Empty<Bytes>> = client();
    let req = Request::builder()
        .uri(format!("http://{}/thumb?k=1", gw.addr))
        .header("x-big", "a".repeat(20_000))
        .body(Empty::new())
        .expect("request");
    let resp = c.request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    let (s, _, body) = get(&client(), &format!("http://{}/elsewhere", gw.addr)).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(body.contains("no route"));
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_requests_in_flight() {
    let bs = backends(1).await;
    bs[0].delay_ms.store(300, SeqCst);
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "", "shutdown_grace_ms = 5000")).await;
    let url = format!("http://{}/thumb?k=1", gw.addr);
    let pending = tokio::spawn(async move { get(&client(), &url).await.0 });
    tokio::time::sleep(Duration::from_millis(100)).await;
    gw.handle.shutdown();
    assert_eq!(pending.await.expect("task"), StatusCode::OK, "the request in flight completes");
    tokio::time::timeout(Duration::from_secs(5), gw.task).await.expect("stops").expect("clean");
    assert!(tokio::net::TcpStream::connect(gw.addr).await.is_err(), "no longer accepting");
}

#[tokio::test]
async fn a_shutdown_before_run_is_not_lost() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let config = Config::parse(&config_text(&refs, "", ""), "t.toml").expect("valid");
    let gw = Gateway::bind(config).await.expect("bind");
    gw.handle().shutdown();
    tokio::time::timeout(Duration::from_secs(5), gw.run(std::future::pending())).await.expect("returns").expect("ok");
    // And with the shutdown future already complete when run starts.
    let config = Config::parse(&config_text(&refs, "", ""), "t.toml").expect("valid");
    let gw = Gateway::bind(config).await.expect("bind");
    tokio::time::timeout(Duration::from_secs(5), gw.run(std::future::ready(()))).await.expect("returns").expect("ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_ejection_never_takes_out_more_than_half_the_pool() {
    let bs = backends(4).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw =
        start_gateway(&config_text(&refs, "[pool.passive]\nconsecutive_failures = 1\nbase_ejection_ms = 60000", ""))
            .await;
    let c = client();
    // A request the application always fails, on every key: 5xx from every worker.
    for i in 0..40 {
        let (s, _, _) = get(&c, &format!("http://{}/thumb?k=k{i}&fail=1", gw.addr)).await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "the 500 passes through; the pool is never emptied");
    }
    let (_, v) = admin(&gw, "GET", "/workers", "", None).await;
    let ejected =
        v["pools"][0]["workers"].as_array().expect("workers").iter().filter(|w| w["state"] == "ejected").count();
    assert_eq!(ejected, 2, "{v}");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_host_gets_one_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "", "")).await;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(b"GET /thumb?k=1 HTTP/1.0\r\nConnection: host\r\n\r\n").await.expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await.expect("in time").expect("read");
    let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    assert!(text.starts_with("http/1.0 200") || text.starts_with("http/1.1 200"), "{text}");
    assert!(text.contains(&format!("x-seen-host: {}", bs[0].addr)), "{text}");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_admin_token_is_refused() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "", "")).await;
    let text = config_text(&refs, "", "").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"a-brand-new-token-1\"",
    );
    let err = gw.handle.reload(Config::parse(&text, "t.toml").expect("valid")).expect_err("refused");
    assert!(err.to_string().contains("admin.token"), "{err}");
    gw.task.abort();
}
