//! The HTTP/1 engine's edges found from outside (issue 31, defects 22-27), each against a worker
//! written on raw TCP that does the wrong thing on purpose: an unasked `101`, a body that
//! stalls, doubled or misplaced framing fields; and clients that break their uploads or send
//! heads an HTTP/1.1 server must refuse.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a [`Worker`] does with one connection: it gets the socket and the bytes read so far,
/// and records what it wants the test to see in the log.
type Serve = Arc<dyn Fn(TcpStream, Arc<Mutex<Vec<String>>>) -> tokio::task::JoinHandle<()> + Send + Sync>;

/// A worker on raw TCP: every connection is handed to `serve`; `log` collects what the
/// connections report.
struct Worker {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Worker {
    async fn start(serve: Serve) -> Worker {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&log);
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                serve(s, Arc::clone(&l));
            }
        });
        Worker { addr, log, task }
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request head (up to its blank line) from `s`, with what came after it.
async fn read_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i + 4]).into_owned();
            buf.drain(..i + 4);
            return Some(head);
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Reads until the peer closes (or `limit` passes): what came, and whether it closed.
async fn read_to_close(s: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let mut chunk = [0u8; 65536];
    let until = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Issue 31 (22): a worker that answers a plain GET with `101` and then reads the socket as
/// its new protocol never receives the next client's request: an unasked 101 fails the try (502,
/// nothing of it reaches the client) and ends that connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unasked_101_ends_its_connection_and_reaches_no_client() {
    let w = Worker::start(Arc::new(|mut s, log| {
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some(head) = read_head(&mut s, &mut buf).await {
                if head.contains("k=switch") {
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
                        )
                        .await;
                    // Everything after is "WebSocket data": the log shows what leaked into it.
                    let (rest, _) = read_to_close(&mut s, Duration::from_secs(3)).await;
                    let leaked = String::from_utf8_lossy(&buf).into_owned() + &rest;
                    log.lock().expect("log").push(leaked);
                    return;
                }
                if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                    return;
                }
            }
        })
    }))
    .await;
    let gw = start_gateway(&config_for(&[w.addr], "[pool.retry]\nattempts = 1\n", "")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    c.write_all(b"GET /thumb?k=switch HTTP/1.1\r\nHost: a\r\n\r\n").await.expect("write");
    let mut first = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut first)).await.expect("answer").expect("read");
    let first = String::from_utf8_lossy(&first[..n]);
    assert!(first.starts_with("HTTP/1.1 502"), "an unasked 101 is the worker's failure: {first}");
    for i in 0..5 {
        let resp = raw(
            gw.addr,
            format!(
                "GET /thumb?k=other{i} HTTP/1.1\r\nHost: a\r\nCookie: session=secret{i}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    }
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let log = w.log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(!log[0].contains("session="), "another client's request reached the switched connection: {:?}", log[0]);
    gw.task.abort();
}

/// Issue 31 (22): on a route that tunnels no upgrade, the WebSocket handshake's fields do not
/// reach the worker either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upgrade_forwards_no_websocket_handshake() {
    let w = Worker::start(Arc::new(|mut s, log| {
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some(head) = read_head(&mut s, &mut buf).await {
                log.lock().expect("log").push(head.to_ascii_lowercase());
                if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                    return;
                }
            }
        })
    }))
    .await;
    let text = config_for(&[w.addr], "", "").replace(
        "listen = \"127.0.0.1:0\"\n\n[[pool]]",
        "listen = \"127.0.0.1:0\"\n[[listener.route]]\npool = \"p\"\nupgrades = []\n\n[[pool]]",
    );
    let gw = start_gateway(&text).await;
    let resp = raw(
        gw.addr,
        b"GET /thumb?k=1 HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate\r\nSec-WebSocket-Protocol: chat\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let log = w.log();
    assert_eq!(log.len(), 1);
    assert!(!log[0].contains("upgrade"), "{}", log[0]);
    assert!(!log[0].contains("sec-websocket-"), "the handshake's fields went on: {}", log[0]);
    gw.task.abort();
}

/// Issue 31 (23): a client's broken upload is answered 400 when it breaks, not at the per-try
/// timeout, and the worker's connection holding the half request is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_upload_is_answered_when_it_breaks() {
    let w = Worker::start(Arc::new(|mut s, log| {
        tokio::spawn(async move {
            // Reads what comes and never answers: the log says when the gateway closed.
            let (_, closed) = read_to_close(&mut s, Duration::from_secs(20)).await;
            log.lock().expect("log").push(if closed { "closed" } else { "held" }.to_owned());
        })
    }))
    .await;
    let gw = start_gateway(&config_for(&[w.addr], "[pool.retry]\nper_try_timeout_ms = 20000\n", "")).await;
    let chunked = "POST /thumb?k=1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
    let cases: Vec<(String, bool)> = vec![
        (format!("{chunked}0x5\r\nhello\r\n0\r\n\r\n"), false),
        (format!("{chunked}-1\r\nx\r\n0\r\n\r\n"), false),
        (format!("{chunked}10000000000000000\r\nx\r\n"), false),
        (format!("{chunked}5\nhello\r\n0\r\n\r\n"), false),
        (format!("{chunked}3\r\nhello\r\n0\r\n\r\n"), false),
        ("POST /thumb?k=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhello".to_owned(), true),
    ];
    for (i, (request, fin)) in cases.iter().enumerate() {
        let mut c = TcpStream::connect(gw.addr).await.expect("connect");
        c.write_all(request.as_bytes()).await.expect("write");
        if *fin {
            c.shutdown().await.expect("fin");
        }
        let (resp, _) = read_to_close(&mut c, Duration::from_secs(5)).await;
        assert!(resp.starts_with("HTTP/1.1 400"), "case {i}: {request:?} got {resp:?}");
        eventually(Duration::from_secs(5), "the worker's connection is closed", || async { w.log().len() == i + 1 })
            .await;
        assert_eq!(w.log()[i], "closed", "case {i}");
    }
    gw.task.abort();
}

/// Issue 31 (24): a worker that stalls in the middle of a body is cut at the pool's
/// `read_timeout_ms` (nginx's `proxy_read_timeout`), counted as its failure, and the client's
/// response ends (short) rather than hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_is_cut_at_the_read_timeout() {
    let w = Worker::start(Arc::new(|mut s, log| {
        tokio::spawn(async move {
            let mut buf = Vec::new();
            if read_head(&mut s, &mut buf).await.is_some() {
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789").await;
                let (_, closed) = read_to_close(&mut s, Duration::from_secs(20)).await;
                log.lock().expect("log").push(if closed { "closed" } else { "held" }.to_owned());
            }
        })
    }))
    .await;
    let gw = start_gateway(&config_for(&[w.addr], "read_timeout_ms = 500\n", "")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    c.write_all(b"GET /thumb?k=1 HTTP/1.1\r\nHost: a\r\n\r\n").await.expect("write");
    let (resp, closed) = read_to_close(&mut c, Duration::from_secs(10)).await;
    assert!(closed, "the client's response ends: {resp:?}");
    assert!(resp.starts_with("HTTP/1.1 200") && resp.ends_with("0123456789"), "{resp:?}");
    eventually(Duration::from_secs(5), "the worker's connection is closed", || async { w.log() == ["closed"] }).await;
    let info = worker_info(&gw, "w1").await;
    assert_eq!(info["truncated"], 1, "counted as the worker's response cut short: {info}");
    assert_eq!(info["responses"]["error"], 1, "and as its failure: {info}");
    gw.task.abort();
}

/// Issue 31 (25): `Expect: 100-continue` in an HTTP/1.0 request is ignored (RFC 9110 §10.1.1):
/// no `100 Continue` is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_expect_gets_no_100_continue() {
    let w = RawBackend::start(Arc::new(|_, body: &[u8]| {
        let mut reply = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
        reply.extend_from_slice(body);
        Some(reply)
    }))
    .await;
    let gw = start_gateway(&config_for(&[w.addr], "", "")).await;
    for (version, continues) in [("1.0", false), ("1.1", true)] {
        let mut c = TcpStream::connect(gw.addr).await.expect("connect");
        c.write_all(
            format!("POST /thumb?k=1 HTTP/{version}\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("write");
        let mut got = [0u8; 256];
        let early = match tokio::time::timeout(Duration::from_millis(500), c.read(&mut got)).await {
            Ok(Ok(n)) => String::from_utf8_lossy(&got[..n]).into_owned(),
            _ => String::new(),
        };
        assert_eq!(early.starts_with("HTTP/1.1 100 Continue\r\n\r\n"), continues, "HTTP/{version}: {early:?}");
        c.write_all(b"hello").await.expect("body");
        let (rest, _) = read_to_close(&mut c, Duration::from_secs(5)).await;
        let all = early + &rest;
        assert_eq!(all.matches("100 Continue").count(), usize::from(continues), "HTTP/{version}: {all:?}");
        assert!(all.contains("200 OK") && all.ends_with("\r\n\r\nhello"), "HTTP/{version}: {all:?}");
    }
    gw.task.abort();
}

/// Issue 31 (26): a worker's doubled `Content-Length` reaches the client as one field, and an
/// HTTP/1.0 response with `Transfer-Encoding` (whose framing RFC 9112 §6.1 calls faulty) is a
/// bad response (502), never its chunk framing passed on as the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_framing_fields_are_read_as_the_rfc_says() {
    let w = RawBackend::start(Arc::new(|head: &str, _: &[u8]| {
        Some(if head.contains("k=double") {
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok".to_vec()
        } else {
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n".to_vec()
        })
    }))
    .await;
    let gw = start_gateway(&config_for(&[w.addr], "[pool.retry]\nattempts = 1\n", "")).await;
    let resp = raw(gw.addr, b"GET /thumb?k=double HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 200") && resp.ends_with("\r\n\r\nok"), "{resp:?}");
    assert_eq!(resp.to_ascii_lowercase().matches("content-length:").count(), 1, "{resp:?}");
    let resp = raw(gw.addr, b"GET /thumb?k=te10 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 502"), "{resp:?}");
    assert!(!resp.contains("2\r\nok\r\n0\r\n"), "{resp:?}");
    gw.task.abort();
}

/// Issue 31 (26): an upload of 300,000 one-byte chunks reaches the worker in a few large chunks
/// (nginx sends 0.3 MB for it), not as 1.8 MB of chunk framing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_chunks_are_coalesced_on_the_way_to_the_worker() {
    let w = RawBackend::start(Arc::new(|_, body: &[u8]| {
        let text = format!("{}", body.len());
        Some(format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{text}", text.len()).into_bytes())
    }))
    .await;
    let gw = start_gateway(&config_for(&[w.addr], "", "")).await;
    let n = 300_000;
    let mut request =
        b"POST /thumb?k=1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for _ in 0..n {
        request.extend_from_slice(b"1\r\nX\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    let (mut r, mut wr) = c.split();
    let (_, (resp, _)) = tokio::join!(async { wr.write_all(&request).await.expect("write") }, async {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), r.read_to_end(&mut got)).await;
        (String::from_utf8_lossy(&got).into_owned(), ())
    });
    let wire: usize = resp.rsplit("\r\n\r\n").next().and_then(|b| b.parse().ok()).unwrap_or_else(|| panic!("{resp:?}"));
    assert!(wire >= n, "every byte arrived: {wire}");
    assert!(wire < 2 * n, "{wire} bytes on the wire for {n} bytes of body");
    drop(c);
    gw.task.abort();
}

/// Issue 31 (27): a space inside the request target is a malformed request line (400), not an
/// unsupported version (505).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_space_in_the_target_is_a_bad_request() {
    let w = RawBackend::start(Arc::new(|_, _| Some(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()))).await;
    let gw = start_gateway(&config_for(&[w.addr], "", "")).await;
    for line in ["GET /thumb?k=a b HTTP/1.1", "GET /a  HTTP/1.1", "GET  /a HTTP/1.1", "\r\nGET /a b HTTP/1.1"] {
        let resp = raw(gw.addr, format!("{line}\r\nHost: a\r\n\r\n").as_bytes()).await;
        assert!(resp.starts_with("HTTP/1.1 400"), "{line:?}: {resp:?}");
    }
    let resp = raw(gw.addr, b"GET /a HTTP/2.0\r\nHost: a\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 505"), "{resp:?}");
    gw.task.abort();
}

/// A head the engine refuses is answered in keyroute's one public error shape (`error`, `reason`,
/// `status`), as every other error of the gateway, the admin API and the workers is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_head_is_answered_in_the_one_error_shape() {
    let w = RawBackend::start(Arc::new(|_, _| Some(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()))).await;
    let gw = start_gateway(&config_for(&[w.addr], "", "")).await;
    for (request, status, reason) in [
        ("GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400, "bad_request_head"),
        ("GET /a HTTP/2.0\r\nHost: a\r\n\r\n", 505, "unsupported_version"),
        (
            "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            400,
            "invalid_content_length",
        ),
    ] {
        let resp = raw(gw.addr, request.as_bytes()).await;
        let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{request:?}: {e}: {resp:?}"));
        assert_eq!(v["status"], status, "{resp}");
        assert_eq!(v["reason"], reason, "{resp}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{resp}");
        assert!(v.get("message").is_none(), "{resp}");
    }
    gw.task.abort();
}
