//! What clients cannot do to the gateway: confuse its routing, loop it, hold all its
//! connections, or read its internals from error bodies.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use keyroute_server::Config;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_host_gets_one_upstream() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "", "")).await;
    let text = raw(gw.addr, b"GET /thumb?k=1 HTTP/1.0\r\nConnection: host\r\n\r\n").await.to_ascii_lowercase();
    assert!(text.starts_with("http/1.0 200") || text.starts_with("http/1.1 200"), "{text}");
    assert!(text.contains(&format!("x-seen-host: {}", bs[0].addr)), "{text}");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_get_431_and_unknown_routes_404() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let text = config_text(&refs, "", "").replace(
        "listen = \"127.0.0.1:0\"\n\n[[pool]]",
        "listen = \"127.0.0.1:0\"\nmax_header_bytes = 8192\n[[listener.route]]\npath_prefix = \"/thumb\"\npool = \"p\"\n\n[[pool]]",
    );
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
    assert!(body.contains("no_route"), "{body}");
    gw.task.abort();
}

/// Issue 8, defect 9: 101 short headers got 431 far under max_header_bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_count_limit_is_configurable() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let many: String = (0..60).map(|i| format!("x-h{i}: v\r\n")).collect();
    let req = format!("GET /thumb?k=1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n{many}\r\n");
    let default = start_gateway(&config_text(&refs, "", "")).await;
    let resp = raw(default.addr, req.as_bytes()).await;
    assert!(resp.starts_with("HTTP/1.1 200"), "63 headers pass the default limit of 100: {resp}");
    let text = config_text(&refs, "", "")
        .replace("listen = \"127.0.0.1:0\"\n\n[[pool]]", "listen = \"127.0.0.1:0\"\nmax_headers = 50\n\n[[pool]]");
    let lowered = start_gateway(&text).await;
    let resp = raw(lowered.addr, req.as_bytes()).await;
    assert!(resp.starts_with("HTTP/1.1 431") && !resp.contains("x-keyroute-worker"), "{resp}");
    default.task.abort();
    lowered.task.abort();
}

/// Issue 8, defect 4: routed by one host, forwarded with another; `/thumb/../admin` matched
/// `/thumb/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_a_route_matched_is_the_host_the_worker_sees() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let text = format!(
        r#"
[admin]
listen = "127.0.0.1:0"
[[listener]]
listen = "127.0.0.1:0"
[[listener.route]]
host = "a.example"
path_prefix = "/thumb/"
pool = "a"
[[listener.route]]
host = "b.example"
pool = "b"
[[pool]]
name = "a"
[[pool.worker]]
name = "a"
address = "{}"
[[pool]]
name = "b"
[[pool.worker]]
name = "b"
address = "{}"
"#,
        a.addr, b.addr
    );
    let gw = start_gateway(&text).await;
    let ask = |req: String| {
        let addr = gw.addr;
        async move { raw(addr, format!("{req}Connection: close\r\n\r\n").as_bytes()).await.to_ascii_lowercase() }
    };
    // Absolute form wins over Host, for the route and for the worker.
    let r = ask("GET http://a.example/thumb/x HTTP/1.1\r\nHost: b.example\r\n".into()).await;
    assert!(r.starts_with("http/1.1 200") && r.contains("x-backend: a") && r.contains("x-seen-host: a.example"), "{r}");
    let r = ask("GET http://b.example/thumb/x HTTP/1.1\r\nHost: a.example\r\n".into()).await;
    assert!(r.contains("x-backend: b") && r.contains("x-seen-host: b.example"), "{r}");
    // Two Hosts, or none on HTTP/1.1: 400, nothing forwarded.
    let r = ask("GET /thumb/x HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n".into()).await;
    assert!(r.starts_with("http/1.1 400") && r.contains("duplicate_host"), "{r}");
    let r = ask("GET /thumb/x HTTP/1.1\r\nHost: a.example\r\nhost: a.example\r\n".into()).await;
    assert!(r.starts_with("http/1.1 400"), "{r}");
    let r = ask("GET /thumb/x HTTP/1.1\r\n".into()).await;
    assert!(r.starts_with("http/1.1 400") && r.contains("missing_host"), "{r}");
    // Dot segments are resolved before routing, and the worker gets the resolved path.
    let r = ask("GET /thumb/../admin HTTP/1.1\r\nHost: a.example\r\n".into()).await;
    assert!(r.starts_with("http/1.1 404"), "/thumb/../admin is /admin, which no a.example route takes: {r}");
    let r = ask("GET /thumb/%2e%2e/admin HTTP/1.1\r\nHost: a.example\r\n".into()).await;
    assert!(r.starts_with("http/1.1 404"), "{r}");
    let r = ask("GET /other/../thumb/x HTTP/1.1\r\nHost: a.example\r\n".into()).await;
    assert!(r.starts_with("http/1.1 200") && r.contains("x-backend: a"), "{r}");
    gw.task.abort();
}

/// Issue 8, defect 3: a worker at the admin listener's address let public clients call the admin
/// API; one at the public listener's address looped until the headers overflowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_never_forwards_to_itself() {
    // In a configuration file: a worker at the admin or the public listener is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    for (listen, admin) in
        [(format!("127.0.0.1:{port}"), "127.0.0.1:0".to_owned()), ("127.0.0.1:0".into(), format!("127.0.0.1:{port}"))]
    {
        let text = format!(
            "[admin]\nlisten = \"{admin}\"\n[[listener]]\nlisten = \"{listen}\"\n[[pool]]\nname = \"p\"\n[[pool.worker]]\nname = \"me\"\naddress = \"127.0.0.1:{port}\"\n"
        );
        let err = Config::parse(&text, "t.toml").expect_err("a worker at the gateway's own address");
        assert!(err.field.ends_with("worker.me.address") && err.message.contains("own listener"), "{err}");
    }
    let w = Backend::start("w").await;
    let gw = start_gateway(&config_text(&[&w], "", "")).await;
    // Through the admin API, at the bound (port 0) addresses.
    for own in [gw.addr, gw.admin] {
        let (s, v) = admin(&gw, "POST", "/workers", &format!(r#"{{"name":"me","address":"{own}"}}"#), None).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    }
    // Two gateways pointed at each other: the loop is caught by Via and answered 508.
    let other = start_gateway(&config_text(&[&w], "", "")).await;
    for (from, to) in [(&gw, &other), (&other, &gw)] {
        let (s, v) =
            admin(from, "POST", "/workers", &format!(r#"{{"name":"peer","address":"{}"}}"#, to.addr), None).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let (s, v) = admin(from, "PATCH", "/workers/w", r#"{"weight":0}"#, None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let (s, _, body) = get(&client(), &format!("http://{}/thumb?k=1", gw.addr)).await;
    assert_eq!(s, StatusCode::LOOP_DETECTED, "{body}");
    gw.task.abort();
    other.task.abort();
}

/// Issue 8, defect 5: 1,100 silent connections made every GET time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eleven_hundred_idle_connections_do_not_stop_it() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "", "")).await;
    let mut idle = Vec::new();
    for _ in 0..1100 {
        idle.push(TcpStream::connect(gw.addr).await.expect("connect"));
    }
    let (s, _, _) = get(&client(), &format!("http://{}/thumb?k=1", gw.addr)).await;
    assert_eq!(s, StatusCode::OK);
    let (_, m) = admin(&gw, "GET", "/metrics", "", None).await;
    let m = m.as_str().unwrap_or("").to_owned();
    let open = m
        .lines()
        .find(|l| l.starts_with("keyroute_listener_connections{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    eprintln!("connections held open: {open}");
    assert!(open >= 1100, "{open}");
    drop(idle);
    gw.task.abort();
}

/// Issue 8, defect 5: a connection limit, and a head timeout that answers 408.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_get_408_and_the_connection_limit_holds() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let text = config_text(&refs, "", "").replace(
        "listen = \"127.0.0.1:0\"\n\n[[pool]]",
        "listen = \"127.0.0.1:0\"\nmax_connections = 20\nheader_timeout_ms = 400\n\n[[pool]]",
    );
    let gw = start_gateway(&text).await;
    // Half a head, then silence: 408 and closed.
    let r = raw_partial(gw.addr, b"GET /thumb?k=1 HTTP/1.1\r\nHost: a\r\n").await;
    assert!(r.starts_with("HTTP/1.1 408"), "{r:?}");
    // 25 silent connections against a limit of 20: a new client waits in the backlog until the
    // silent ones time out, then is served.
    let mut silent = Vec::new();
    let first_silent = tokio::time::Instant::now();
    for _ in 0..25 {
        silent.push(TcpStream::connect(gw.addr).await.expect("connect"));
    }
    // The client really waits: about the head timeout (400 ms from the first silent connections),
    // where a gateway without the limit would answer in a millisecond.
    let sent = tokio::time::Instant::now();
    let (s, _, _) = get(&client(), &format!("http://{}/thumb?k=1", gw.addr)).await;
    let waited = sent.elapsed();
    assert_eq!(s, StatusCode::OK);
    let since_silent = first_silent.elapsed();
    eprintln!("the 26th client waited {waited:?} ({since_silent:?} after the first silent connection)");
    assert!(since_silent >= Duration::from_millis(380), "served after {since_silent:?}, before a place was free");
    assert!(waited >= Duration::from_millis(250), "the client over the limit waited only {waited:?}");
    assert!(waited < Duration::from_secs(3), "the client over the limit waited {waited:?}");
    let (_, m) = admin(&gw, "GET", "/metrics", "", None).await;
    let m = m.as_str().unwrap_or("").to_owned();
    let value = |name: &str| {
        m.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse::<u64>().ok())
    };
    assert_eq!(value("keyroute_listener_connection_limit{"), Some(20), "{m}");
    assert!(value("keyroute_listener_connection_limit_reached_total{").unwrap_or(0) >= 1, "{m}");
    // The first 20 silent connections and the half head time out; the new client only needed
    // some of them to free its place, so wait for the rest.
    eventually(Duration::from_secs(5), "21 head timeouts", || async {
        let (_, m) = admin(&gw, "GET", "/metrics", "", None).await;
        let m = m.as_str().unwrap_or("").to_owned();
        m.lines()
            .find(|l| l.starts_with("keyroute_listener_header_timeouts_total{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n >= 21)
    })
    .await;
    // A keep-alive connection that goes quiet after a response is closed without a 408.
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(b"GET /thumb?k=1 HTTP/1.1\r\nHost: a\r\n\r\n").await.expect("write");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 200") && !text.contains("408"), "{text}");
    drop(silent);
    gw.task.abort();
}

/// Writes bytes, then reads whatever comes until the server closes (at most 5 s).
async fn raw_partial(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// Review finding: after an early response, the rest of a slow upload was taken for a slow next
/// head, and a 408 was written after the complete response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_after_an_early_response_is_not_a_slow_head() {
    // A worker that answers at once, then goes on reading the body.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let waddr = listener.local_addr().expect("addr");
    let worker = tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                if c.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nw1").await.is_err() {
                    return;
                }
                while matches!(c.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    let text = config_for(&[waddr], "", "").replace(
        "listen = \"127.0.0.1:0\"\n\n[[pool]]",
        "listen = \"127.0.0.1:0\"\nheader_timeout_ms = 300\n\n[[pool]]",
    );
    let gw = start_gateway(&text).await;
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(b"POST /thumb?k=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 20\r\n\r\nfirst").await.expect("write");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\r\n\r\nw1") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("response").expect("read");
        assert!(n > 0, "closed before the response");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    // The rest of the body, slowly: 15 bytes over 900 ms, three times the head timeout.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if s.write_all(b"xxxxx").await.is_err() {
            break;
        }
    }
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut rest)).await;
    let rest = String::from_utf8_lossy(&rest);
    assert!(!rest.contains("408"), "a 408 after a complete response: {rest:?}");
    gw.task.abort();
    worker.abort();
}

/// Found by fuzzing: a GET with a chunked body reached the worker without it (hyper sends no
/// body for a GET without framing headers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_keeps_its_framing_whatever_the_method() {
    let echo = RawBackend::start(std::sync::Arc::new(|head: &str, _: &[u8]| {
        let body = head.to_ascii_lowercase();
        // The backend closes after each answer, and says so: without `connection: close` the
        // gateway may pool the connection and lose the race with its close on the next request
        // (a POST with a body is not replayed, so that would be a 502).
        Some(
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
                .into_bytes(),
        )
    }))
    .await;
    let gw = start_gateway(&config_for(&[echo.addr], "", "")).await;
    for method in ["GET", "POST"] {
        let req = format!(
            "{method} /thumb?k=1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let resp = raw(gw.addr, req.as_bytes()).await;
        assert!(resp.starts_with("HTTP/1.1 200") && resp.contains("transfer-encoding: chunked"), "{method}: {resp}");
    }
    gw.task.abort();
}
