//! Timeouts that hold whatever the client does (issue 19, defects 11 and 12): a client that never
//! reads its response, an HTTP/2 client that ignores GOAWAY and PINGs, and a silent client on an
//! h2c listener.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn with_listener(text: &str, extra: &str) -> String {
    text.replacen(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
        &format!("[[listener]]\nlisten = \"127.0.0.1:0\"\n{extra}\n"),
        1,
    )
}

/// The listener counted exactly one send timeout.
async fn assert_one_send_timeout(gw: &Gw) {
    let (_, metrics) = admin(gw, "GET", "/metrics", "", None).await;
    let text = metrics.as_str().unwrap_or_default();
    assert!(text.contains("keyroute_listener_send_timeouts_total{listener=\"listener-1\"} 1"), "{metrics}");
}

/// A worker that answers every request with a body of `len` bytes.
async fn big_backend(len: usize) -> RawBackend {
    let big = Arc::new({
        let mut r = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n").into_bytes();
        r.resize(r.len() + len, b'x');
        r
    });
    RawBackend::start(Arc::new(move |_: &str, _: &[u8]| Some(big.as_ref().clone()))).await
}

/// Reads until the server closes the connection (or `limit`); how long that took.
async fn until_closed(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .map(|()| start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_cut_at_the_send_timeout() {
    // 50 MB: far more than the socket buffers on both sides hold.
    let b = big_backend(50_000_000).await;
    let gw = start_gateway(&with_listener(&config_for(&[b.addr], "", ""), "send_timeout_ms = 600")).await;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(b"GET /big?k=1 HTTP/1.1\r\nHost: a\r\n\r\n").await.expect("write");
    eventually(Duration::from_secs(5), "the response started", || async {
        worker_info(&gw, "w1").await["in_flight"] == 1
    })
    .await;
    let stalled = Instant::now();
    // The client reads nothing; the gateway gives up on it and releases the worker's load.
    eventually(Duration::from_secs(10), "the worker's load released", || async {
        worker_info(&gw, "w1").await["in_flight"] == 0
    })
    .await;
    let held = stalled.elapsed();
    assert!(held >= Duration::from_millis(500), "released after {held:?}, before the send timeout");
    assert_one_send_timeout(&gw).await;
    // What the client reads now ends: the connection was closed.
    assert!(until_closed(&mut s, Duration::from_secs(30)).await.is_some(), "the connection is closed");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reading_client_is_never_cut_by_the_send_timeout() {
    let b = Backend::start("w1").await;
    b.delay_ms.store(900, std::sync::atomic::Ordering::SeqCst);
    // A worker slower than the send timeout is the per-try timeout's business, not the send
    // timeout's: the client is waiting, not refusing to read.
    let gw = start_gateway(&with_listener(&config_text(&[&b], "", ""), "send_timeout_ms = 300")).await;
    let (s, _, body) = get(&client(), &format!("http://{}/thumb?k=1", gw.addr)).await;
    assert_eq!((s.as_u16(), body.as_str()), (200, "w1"));
    gw.task.abort();
}

/// The HTTP/2 preface and an empty SETTINGS frame, then nothing: no SETTINGS ack, no PING ack.
const H2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_ignores_goaway_is_closed_at_the_head_timeout() {
    let b = Backend::start("w1").await;
    let gw = start_gateway(&with_listener(&config_text(&[&b], "", ""), "h2c = true\nheader_timeout_ms = 500")).await;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(H2_HELLO).await.expect("preface");
    let closed = until_closed(&mut s, Duration::from_secs(20)).await.expect("closed within 20 s");
    // Closed at the head timeout (500 ms), not when PINGs give up (40 s).
    assert!(closed < Duration::from_millis(1500), "closed after {closed:?}");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_of_an_h2c_listener_gets_one_head_timeout() {
    let b = Backend::start("w1").await;
    let gw = start_gateway(&with_listener(&config_text(&[&b], "", ""), "h2c = true\nheader_timeout_ms = 600")).await;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    let closed = until_closed(&mut s, Duration::from_secs(10)).await.expect("closed");
    // One head timeout, not the preface check's and then a fresh one for HTTP/1.1 (1.2 s).
    assert!(closed >= Duration::from_millis(550) && closed < Duration::from_millis(1100), "closed after {closed:?}");
    gw.task.abort();
    // A client that sends half a head late and stops: the same one budget, counted from the
    // connection's start. One budget closes it 1 s after the connect; a budget started again at
    // the first bytes (the old bug) would close it 1.8 s after. The bound sits between them.
    let gw = start_gateway(&with_listener(&config_text(&[&b], "", ""), "h2c = true\nheader_timeout_ms = 1000")).await;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    let connected = Instant::now();
    tokio::time::sleep(Duration::from_millis(800)).await;
    s.write_all(b"GET /thumb?k=1 HTTP/1.1\r\n").await.expect("write");
    until_closed(&mut s, Duration::from_secs(10)).await.expect("closed");
    let closed = connected.elapsed();
    assert!(closed < Duration::from_millis(1400), "closed {closed:?} after the connect, the half head at 800 ms");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_held_at_window_zero_is_cut_at_the_send_timeout() {
    let b = big_backend(1_000_000).await;
    let gw = start_gateway(&with_listener(&config_for(&[b.addr], "", ""), "h2c = true\nsend_timeout_ms = 600")).await;
    let tcp = TcpStream::connect(gw.addr).await.expect("connect");
    // A client whose streams never open their flow-control window: no byte of a body can come.
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake::<_, http_body_util::Empty<bytes::Bytes>>(hyper_util::rt::TokioIo::new(tcp))
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    let req = http::Request::get("http://x.test/thumb?k=1").body(http_body_util::Empty::new()).expect("request");
    let resp = sender.send_request(req).await.expect("response headers");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(worker_info(&gw, "w1").await["in_flight"], 1, "the response holds its worker");
    let held = Instant::now();
    eventually(Duration::from_secs(10), "the worker's load released", || async {
        worker_info(&gw, "w1").await["in_flight"] == 0
    })
    .await;
    assert!(held.elapsed() >= Duration::from_millis(400), "released after {:?}", held.elapsed());
    assert_one_send_timeout(&gw).await;
    drop(resp);
    gw.task.abort();
}
