//! Whose failure is it: the worker's (connect errors, timeouts, stalls, 5xx, bodies cut short)
//! feeds passive ejection and retries; the client's (a broken upload) never does.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use support::*;
use tokio::time::Instant;

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
    eventually(Duration::from_secs(10), "w2 serves before it dies", || async { bs[1].served.load(SeqCst) > 5 }).await;
    bs[1].kill();
    let mut total = 0;
    while let Some(r) = set.join_next().await {
        let statuses = r.expect("task");
        total += statuses.len();
        assert!(statuses.iter().all(|s| *s == StatusCode::OK), "a GET failed: {statuses:?}");
    }
    assert_eq!(total, 1200);
    gw.task.abort();
}

/// Issue 8, defect 1: six POSTs with a broken body used to eject a healthy worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_broken_body_never_counts_against_the_worker() {
    let bs = backends(2).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "strategy = \"rendezvous\"", "")).await;
    let bad_chunk =
        b"POST /thumb?k=same HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n";
    for _ in 0..8 {
        let resp = raw(gw.addr, bad_chunk).await;
        assert!(resp.is_empty() || resp.starts_with("HTTP/1.1 400") || resp.starts_with("HTTP/1.1 200"), "{resp}");
    }
    for _ in 0..8 {
        // An upload cut short: 1000 bytes announced, 9 sent, then the client stops writing.
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.expect("connect");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"POST /thumb?k=same HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\nonly-this")
            .await
            .expect("write");
        s.shutdown().await.expect("shutdown");
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
        let resp = String::from_utf8_lossy(&buf);
        assert!(!resp.starts_with("HTTP/1.1 5"), "a client's error is not a 5xx: {resp}");
    }
    for w in ["w1", "w2"] {
        let info = worker_info(&gw, w).await;
        assert_eq!(info["ejections"], 0, "{info}");
        assert_eq!(info["state"], "healthy", "{info}");
        assert_eq!(info["responses"]["error"], 0, "{info}");
        assert_eq!(info["responses"]["5xx"], 0, "{info}");
    }
    let (s, _, _) = get(&client(), &format!("http://{}/thumb?k=same", gw.addr)).await;
    assert_eq!(s, StatusCode::OK);
    gw.task.abort();
}

/// Issue 8, defect 2: a worker that cut every response short stayed in rotation, its responses
/// counted as 2xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cuts_responses_short_is_counted_as_failing_and_ejected() {
    let short =
        RawBackend::start(Arc::new(|_, _| Some(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort".to_vec()))).await;
    let good = Backend::start("good").await;
    let text = config_for(
        &[short.addr, good.addr],
        "strategy = \"rendezvous\"\n[pool.health]\npath = \"/healthz\"\ninterval_ms = 50\n[pool.passive]\nconsecutive_failures = 3",
        "",
    );
    let gw = start_gateway(&text).await;
    let c = client();
    let mut i = 0;
    // Requests over many keys until the cutting worker has been ejected.
    eventually(Duration::from_secs(10), "the cutting worker is ejected", || {
        i += 1;
        let url = format!("http://{}/thumb?k=k{i}", gw.addr);
        let c = c.clone();
        let gw = &gw;
        async move {
            if let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(5), c.get(url.parse().expect("uri"))).await {
                let _ = resp.into_body().collect().await;
            }
            worker_info(gw, "w1").await["ejections"].as_u64().unwrap_or(0) >= 1
        }
    })
    .await;
    let info = worker_info(&gw, "w1").await;
    assert_eq!(info["responses"]["2xx"], 0, "a response cut short is not a 2xx: {info}");
    assert!(info["responses"]["error"].as_u64().unwrap_or(0) >= 3, "{info}");
    assert!(info["truncated"].as_u64().unwrap_or(0) >= 3, "{info}");
    // Ejected, its keys go to the other worker, whole.
    for k in 0..20 {
        let (s, _, body) = get(&c, &format!("http://{}/thumb?k=after{k}", gw.addr)).await;
        assert_eq!((s, body.as_str()), (StatusCode::OK, "good"));
    }
    gw.task.abort();
}

/// README: requests with a body are never replayed; once a request may have reached a worker,
/// only idempotent methods are retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_is_delivered_once_while_a_get_is_retried() {
    // Workers that read the whole request, then die without answering.
    let mut raws = Vec::new();
    for _ in 0..3 {
        raws.push(RawBackend::start(Arc::new(|_, _| None)).await);
    }
    let addrs: Vec<_> = raws.iter().map(|r| r.addr).collect();
    let gw = start_gateway(&config_for(&addrs, "[pool.passive]\nconsecutive_failures = 0", "")).await;
    let delivered = || raws.iter().map(|r| r.requests.load(SeqCst)).sum::<u64>();
    let c: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let send = |method: &str, body: &'static str| {
        let req = Request::builder()
            .method(method)
            .uri(format!("http://{}/thumb?k=1", gw.addr))
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("request");
        c.request(req)
    };
    for (method, body) in [("POST", "payload"), ("PUT", "payload"), ("POST", "")] {
        let before = delivered();
        let resp = send(method, body).await.expect("response");
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY, "{method} {body:?}");
        assert_eq!(delivered() - before, 1, "{method} with body {body:?} reached exactly one worker, once");
    }
    let before = delivered();
    let resp = send("GET", "").await.expect("response");
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(delivered() - before, 3, "a GET is retried on each of the three workers");
    gw.task.abort();
}

/// Issue 8, gaps: a hung worker (answers nothing, its health checks still pass) under load, with
/// the default timeouts: no GET fails for a client that waits 10 s, and the stall window (2 s by
/// default, `passive.stall_ms`) bounds both how long new traffic keeps reaching the worker and how
/// long any GET waits (its try is abandoned at the window and retried elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_worker_costs_no_get_and_loses_its_traffic_at_the_stall_window() {
    let bs = backends(4).await;
    for b in &bs {
        b.delay_ms.store(1, SeqCst);
    }
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw =
        start_gateway(&config_text(&refs, "strategy = \"rendezvous\"\n[pool.health]\ninterval_ms = 200", "")).await;
    let hang_at = Instant::now() + Duration::from_millis(500);
    let end = hang_at + Duration::from_secs(8);
    let failures = Arc::new(AtomicU64::new(0));
    let slowest_us = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..6 {
        let (url, failures, slowest_us) =
            (format!("http://{}/thumb", gw.addr), Arc::clone(&failures), Arc::clone(&slowest_us));
        tasks.spawn(async move {
            let c = client();
            let mut i = 0u64;
            while Instant::now() < end {
                i += 1;
                let uri = format!("{url}?k=key-{t}-{}", i % 40).parse().expect("uri");
                let sent = Instant::now();
                match tokio::time::timeout(Duration::from_secs(10), c.get(uri)).await {
                    Ok(Ok(r)) if r.status() == StatusCode::OK => {
                        let _ = r.into_body().collect().await;
                        slowest_us.fetch_max(sent.elapsed().as_micros() as u64, SeqCst);
                    }
                    _ => {
                        failures.fetch_add(1, SeqCst);
                    }
                }
            }
        });
    }
    tokio::time::sleep_until(hang_at).await;
    bs[1].delay_ms.store(120_000, SeqCst);
    // The last time a new request reached the hung worker, sampled every 20 ms.
    let mut last_arrival = Duration::ZERO;
    let mut seen = bs[1].arrived.load(SeqCst);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = bs[1].arrived.load(SeqCst);
        if now != seen {
            seen = now;
            last_arrival = hang_at.elapsed();
        }
    }
    while tasks.join_next().await.is_some() {}
    eprintln!(
        "hung worker: last new request {:.2} s after it hung; slowest GET {:.2} s",
        last_arrival.as_secs_f64(),
        slowest_us.load(SeqCst) as f64 / 1e6
    );
    assert_eq!(failures.load(SeqCst), 0, "no GET failed");
    // The design gives about 2 s for both (the stall window); 3.5 s leaves room for a loaded
    // machine, and is far under what a missing stall rule gives (the 30 s per-try timeout, or the
    // 10 s ejection and the client's 10 s timeout).
    let slowest = Duration::from_micros(slowest_us.load(SeqCst));
    assert!(last_arrival > Duration::ZERO, "no request reached the worker after it hung");
    assert!(last_arrival < Duration::from_millis(3500), "traffic left the hung worker after {last_arrival:?}");
    assert!(slowest < Duration::from_millis(3500), "the slowest GET took {slowest:?}");
    assert!(slowest >= Duration::from_millis(1500), "no GET waited for the hung worker ({slowest:?}): did it hang?");
    let info = worker_info(&gw, "w2").await;
    assert!(info["ejections"].as_u64().unwrap_or(0) >= 1, "{info}");
    gw.task.abort();
}

/// Issue 8, defect 9: a response with both Content-Length and chunked kept its Content-Length,
/// so the client got the first bytes only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_response_with_a_content_length_arrives_whole() {
    let both = RawBackend::start(Arc::new(|_, _| {
        Some(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n"
                .to_vec(),
        )
    }))
    .await;
    let gw = start_gateway(&config_for(&[both.addr], "", "")).await;
    let (s, h, body) = get(&client(), &format!("http://{}/thumb?k=1", gw.addr)).await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "hello world"), "{h:?}");
    assert_ne!(h.get("content-length").map(String::as_str), Some("3"));
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_statuses_say_why_and_tell_nothing_internal() {
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
    let public = |body: &str| {
        let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert!(v["request_id"].as_str().is_some_and(|id| !id.is_empty()), "{body}");
        for secret in ["127.0.0.1", "w1", "w2", "error trying", "connection"] {
            assert!(!body.contains(secret), "a public body tells {secret:?}: {body}");
        }
        v["reason"].as_str().unwrap_or("").to_owned()
    };
    let (s, _, body) = get(&c, &format!("http://{}/thumb", gw.addr)).await;
    assert_eq!((s, public(&body).as_str()), (StatusCode::BAD_REQUEST, "missing_key"));
    // 504 for a key owned by the slow worker (one try, 300 ms).
    let mut got_504 = false;
    for i in 0..40 {
        let k = format!("k{i}");
        let (_, v) = admin(&gw, "GET", &format!("/placement?key=/thumb?k={k}"), "", None).await;
        let (s, h, body) = get(&c, &format!("http://{}/thumb?k={k}", gw.addr)).await;
        if v["owner"] == "w1" {
            assert_eq!((s, public(&body).as_str()), (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"));
            assert!(h.contains_key("x-request-id"));
            got_504 = true;
            break;
        }
        assert_eq!(s, StatusCode::OK);
    }
    assert!(got_504);
    // A client's request id is kept, in the error body and upstream.
    let req = http::Request::builder()
        .uri(format!("http://{}/thumb", gw.addr))
        .header("x-request-id", "trace-me-42")
        .body(http_body_util::Empty::<Bytes>::new())
        .expect("request");
    let resp = c.request(req).await.expect("response");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("\"request_id\":\"trace-me-42\""));
    // 502: every worker refuses connections (no active checks, no ejection).
    bs[0].kill();
    bs[1].kill();
    let mut refused = false;
    for _ in 0..4 {
        let (s, _, body) = get(&c, &format!("http://{}/thumb?k=a", gw.addr)).await;
        assert_eq!(s, StatusCode::BAD_GATEWAY, "{body}");
        let reason = public(&body);
        assert!(reason == "upstream_connect" || reason == "upstream_failed", "{body}");
        if reason == "upstream_connect" {
            refused = true;
            break;
        }
    }
    assert!(refused);
    // 503 with the true reason: every weight 0, then no worker at all.
    for w in ["w1", "w2"] {
        admin(&gw, "PATCH", &format!("/workers/{w}"), "{\"weight\": 0}", None).await;
    }
    let (s, _, body) = get(&c, &format!("http://{}/thumb?k=a", gw.addr)).await;
    assert_eq!((s, public(&body).as_str()), (StatusCode::SERVICE_UNAVAILABLE, "all_weights_zero"));
    for w in ["w1", "w2"] {
        admin(&gw, "DELETE", &format!("/workers/{w}"), "", None).await;
    }
    let (s, _, body) = get(&c, &format!("http://{}/thumb?k=a", gw.addr)).await;
    assert_eq!((s, public(&body).as_str()), (StatusCode::SERVICE_UNAVAILABLE, "pool_empty"));
    gw.task.abort();
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

/// Review finding: a client's slow upload made its worker look stalled (new requests went
/// elsewhere, or got 503 in a one-worker pool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_never_makes_its_worker_look_stalled() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A worker that reads the whole body before it answers.
    let w = RawBackend::start(Arc::new(|_, _| Some(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()))).await;
    let gw = start_gateway(&config_for(&[w.addr], "", "")).await;
    let addr = gw.addr;
    let upload = tokio::spawn(async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"POST /thumb?k=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n").await.expect("head");
        // 12 bytes over 3 s: longer than the 2 s stall window.
        for _ in 0..12 {
            s.write_all(b"x").await.expect("byte");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let mut buf = vec![0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("answer").expect("read");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    });
    // Nothing else reaches the worker meanwhile (any response would count as a sign of life).
    while !upload.is_finished() {
        assert_ne!(worker_info(&gw, "w1").await["state"], "stalled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(upload.await.expect("upload").starts_with("HTTP/1.1 200"));
    assert_eq!(worker_info(&gw, "w1").await["ejections"], 0);
    let (s, _, body) = get(&client(), &format!("http://{}/thumb?k=2", gw.addr)).await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "ok"));
    gw.task.abort();
}
