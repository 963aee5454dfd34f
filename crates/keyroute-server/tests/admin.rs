//! The admin API's edges, as an attacker finds them (issue 19, defects 2, 3, 4 and 14): each test
//! is the request that got through before, and what it changes when it does.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request with exactly these header lines; the status and body.
async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, String) {
    let (status, _, body) = send_full(addr, method, path, headers, body).await;
    (status, body)
}

/// [`send`], with the response head's lines too.
async fn send_full(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (u16, Vec<String>, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await.expect("answer").expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.lines().skip(1).map(str::to_owned).collect(), body.to_owned())
}

async fn worker_names(gw: &Gw) -> Vec<String> {
    let (_, v) = admin(gw, "GET", "/workers", "", None).await;
    v["pools"][0]["workers"]
        .as_array()
        .map(|ws| ws.iter().filter_map(|w| w["name"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

const ADD: &str = r#"{"name":"evil","address":"127.0.0.1:9","weight":1000}"#;

#[tokio::test]
async fn a_web_page_cannot_change_membership() {
    let b = Backend::start("w1").await;
    let gw = start_gateway(&config_text(&[&b], "", "")).await;
    let host = format!("host: {}", gw.admin);
    // The form a page on evil.example can post without a preflight.
    for headers in [
        vec![host.as_str(), "content-type: text/plain", "origin: http://evil.example"],
        vec![host.as_str(), "content-type: text/plain"],
        vec![host.as_str(), "content-type: application/x-www-form-urlencoded"],
        vec![host.as_str(), "content-type: application/json", "origin: http://evil.example"],
        vec![host.as_str(), "content-type: application/json", "origin: null"],
        vec![host.as_str(), "content-type: application/json", "sec-fetch-site: cross-site"],
        vec![host.as_str(), "content-type: application/json", "sec-fetch-site: same-site"],
    ] {
        let (status, body) = send(gw.admin, "POST", "/workers", &headers, ADD).await;
        assert!(status == 403 || status == 415, "{headers:?}: {status} {body}");
    }
    let (status, _) = send(gw.admin, "DELETE", "/workers/w1", &[&host, "origin: http://evil.example"], "").await;
    assert_eq!(status, 403);
    assert_eq!(worker_names(&gw).await, ["w1"], "nothing was added or removed");
    // The operator's own tools: JSON, same origin or none.
    let own_origin = format!("origin: http://{}", gw.admin);
    let (status, body) =
        send(gw.admin, "POST", "/workers", &[&host, "content-type: application/json", &own_origin], ADD).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(worker_names(&gw).await.len(), 2);
}

#[tokio::test]
async fn a_rebound_host_name_gets_421() {
    let b = Backend::start("w1").await;
    let extra = "[admin]\nlisten = \"127.0.0.1:0\"\nhosts = [\"admin.internal\"]\n";
    let text = config_text(&[&b], "", "").replace("[admin]\nlisten = \"127.0.0.1:0\"\n", extra);
    let gw = start_gateway(&text).await;
    let port = gw.admin.port();
    for host in [format!("rebind.attacker.example:{port}"), "localhost.attacker.example".into(), "10.0.0.7".into()] {
        let h = format!("host: {host}");
        let (status, body) = send(gw.admin, "GET", "/workers", &[&h], "").await;
        assert_eq!(status, 421, "GET with {host}: {body}");
        assert!(!body.contains("w1"), "{body}");
        let (status, _) = send(gw.admin, "POST", "/workers", &[&h, "content-type: application/json"], ADD).await;
        assert_eq!(status, 421, "POST with {host}");
    }
    assert_eq!(worker_names(&gw).await, ["w1"]);
    for host in [gw.admin.to_string(), format!("localhost:{port}"), "admin.internal".into(), format!("[::1]:{port}")] {
        let (status, body) = send(gw.admin, "GET", "/workers", &[&format!("host: {host}")], "").await;
        assert_eq!(status, 200, "{host}: {body}");
    }
}

#[tokio::test]
async fn no_gateway_serves_another_gateways_admin_api() {
    let b = Backend::start("w1").await;
    let gw1 = start_gateway(&config_text(&[&b], "", "")).await;
    // Gateway 2's only worker is gateway 1's admin port, as a member record can make it.
    let gw2 = start_gateway(&config_for(&[gw1.admin], "", "")).await;
    let c = client();
    for path in ["/workers", "/metrics", "/hotkeys"] {
        let (status, _, body) = get(&c, &format!("http://{}{path}", gw2.addr)).await;
        assert_eq!(status.as_u16(), 403, "{path} through gateway 2: {body}");
        assert!(!body.contains("w1") && !body.contains("keyroute_"), "{path}: {body}");
    }
    let h = format!("host: {}", gw1.admin);
    let (status, body) = send(gw2.addr, "POST", "/workers", &[&h, "content-type: application/json"], ADD).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(worker_names(&gw1).await, ["w1"], "nothing was added through gateway 2");
}

#[tokio::test]
async fn the_right_token_works_after_ten_wrong_ones() {
    let b = Backend::start("w1").await;
    let token = "0123456789abcdef0123";
    let text = config_text(&[&b], "", "").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"\n",
        &format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n"),
    );
    let gw = start_gateway(&text).await;
    for _ in 0..12 {
        let (status, _) = admin(&gw, "GET", "/workers", "", Some("wrong-token-wrong-token")).await;
        assert!(status.as_u16() == 401 || status.as_u16() == 429, "{status}");
    }
    let (status, _) = admin(&gw, "GET", "/workers", "", Some("wrong-token-wrong-token")).await;
    assert_eq!(status.as_u16(), 429, "wrong tokens are throttled");
    let (status, v) = admin(&gw, "GET", "/workers", "", Some(token)).await;
    assert_eq!(status.as_u16(), 200, "the right token is not locked out: {v}");
    // RFC 9110 §11.1: the scheme is case-insensitive.
    let h = format!("host: {}", gw.admin);
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let auth = format!("authorization: {scheme} {token}");
        let (status, body) = send(gw.admin, "GET", "/workers", &[&h, &auth], "").await;
        assert_eq!(status, 200, "{scheme}: {body}");
    }
}

// Issue 31, defects 13 to 21: the admin API and the dashboard.

const TOKEN: &str = "0123456789abcdef0123";

/// A gateway over `backends` whose admin API takes `admin_extra` lines (a token, hosts).
async fn gateway_with(backends: &[&Backend], pool_extra: &str, admin_extra: &str) -> Gw {
    let text = config_text(backends, pool_extra, "")
        .replace("[admin]\nlisten = \"127.0.0.1:0\"\n", &format!("[admin]\nlisten = \"127.0.0.1:0\"\n{admin_extra}\n"));
    start_gateway(&text).await
}

fn token_line() -> String {
    format!("token = \"{TOKEN}\"")
}

/// Opens `n` connections that each send a `POST /placement` head declaring a 1 MiB body, then
/// one byte of it, and nothing more.
async fn hold_bodies(addr: SocketAddr, n: usize, auth: Option<&str>) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let auth = auth.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
        let head = format!(
            "POST /placement HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{auth}content-length: 1048576\r\n\r\n{{"
        );
        s.write_all(head.as_bytes()).await.expect("write");
        held.push(s);
    }
    held
}

/// What a held connection was answered, read until it closes (within `limit`).
async fn answer_of(mut s: TcpStream, limit: Duration) -> String {
    let mut buf = Vec::new();
    match tokio::time::timeout(limit, s.read_to_end(&mut buf)).await {
        Ok(_) => String::from_utf8_lossy(&buf).lines().next().unwrap_or("").to_owned(),
        Err(_) => "still held".to_owned(),
    }
}

/// `GET path` must be answered within 5 s; its status.
async fn probe(addr: SocketAddr, path: &str) -> u16 {
    let h = format!("host: {addr}");
    match tokio::time::timeout(Duration::from_secs(5), send(addr, "GET", path, &[&h], "")).await {
        Ok((status, _)) => status,
        Err(_) => panic!("{path} was not answered within 5 s"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_31_13_bodies_without_a_token_do_not_hold_the_admin_api() {
    let b = Backend::start("w1").await;
    let gw = gateway_with(&[&b], "", &token_line()).await;
    let held = hold_bodies(gw.admin, 260, None).await;
    assert_eq!(probe(gw.admin, "/healthz").await, 200);
    assert_eq!(probe(gw.admin, "/readyz").await, 200);
    // Each was refused on its head (no token), and closed without waiting for its body.
    for s in held {
        let line = answer_of(s, Duration::from_secs(10)).await;
        assert!(line.starts_with("HTTP/1.1 401") || line.starts_with("HTTP/1.1 503"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_31_13_slow_bodies_are_cut_and_the_probes_still_answer() {
    let b = Backend::start("w1").await;
    // No token (loopback): every held body is authorized, and read until its deadline.
    let gw = gateway_with(&[&b], "", "").await;
    let held = hold_bodies(gw.admin, 260, None).await;
    assert_eq!(probe(gw.admin, "/healthz").await, 200);
    assert_eq!(probe(gw.admin, "/readyz").await, 200);
    let mut cut = 0;
    for s in held {
        let line = answer_of(s, Duration::from_secs(30)).await;
        assert!(line.starts_with("HTTP/1.1 408") || line.starts_with("HTTP/1.1 503"), "{line}");
        cut += usize::from(line.starts_with("HTTP/1.1 408"));
    }
    assert!(cut > 0, "the bodies that were read were cut at their deadline");
    // And with a token that is right, a slow body is cut as well.
    let gw = gateway_with(&[&b], "", &token_line()).await;
    let held = hold_bodies(gw.admin, 1, Some(TOKEN)).await;
    for s in held {
        assert!(answer_of(s, Duration::from_secs(30)).await.starts_with("HTTP/1.1 408"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_31_13_silent_connections_in_every_place_leave_the_probes_answered() {
    let b = Backend::start("w1").await;
    let gw = gateway_with(&[&b], "", &token_line()).await;
    // More connections than the listener's places and its reserve, each sending nothing.
    let mut held = Vec::new();
    for _ in 0..280 {
        held.push(TcpStream::connect(gw.admin).await.expect("connect"));
    }
    assert_eq!(probe(gw.admin, "/healthz").await, 200);
    assert_eq!(probe(gw.admin, "/readyz").await, 200);
    drop(held);
}

#[tokio::test]
async fn issue_31_14_the_challenge_offers_basic_on_its_own_line() {
    let b = Backend::start("w1").await;
    let gw = gateway_with(&[&b], "", &token_line()).await;
    let h = format!("host: {}", gw.admin);
    for path in ["/dashboard", "/events"] {
        let (status, head, _) = send_full(gw.admin, "GET", path, &[&h], "").await;
        assert_eq!(status, 401, "{path}");
        let challenges: Vec<&str> = head
            .iter()
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| k.eq_ignore_ascii_case("www-authenticate"))
            .map(|(_, v)| v.trim())
            .collect();
        assert_eq!(challenges, ["Bearer", "Basic realm=\"keyroute admin\", charset=\"UTF-8\""], "{path}: {head:?}");
    }
}

#[tokio::test]
async fn issue_31_15_wrong_tokens_do_not_keep_a_browser_login_from_starting() {
    let b = Backend::start("w1").await;
    let gw = gateway_with(&[&b], "", &token_line()).await;
    let h = format!("host: {}", gw.admin);
    let wrong = "authorization: Bearer wrong-token-wrong-token";
    for _ in 0..12 {
        send(gw.admin, "GET", "/workers", &[&h, wrong], "").await;
    }
    let (status, _) = send(gw.admin, "GET", "/workers", &[&h, wrong], "").await;
    assert_eq!(status, 429, "wrong tokens are throttled");
    // A browser's first request carries no credentials: it must get the challenge, or it never
    // asks the operator for the token.
    let (status, head, body) = send_full(gw.admin, "GET", "/dashboard", &[&h], "").await;
    assert_eq!(status, 401, "{body}");
    assert!(head.iter().any(|l| l.to_ascii_lowercase().starts_with("www-authenticate: basic")), "{head:?}");
    let basic = format!("authorization: Basic {}", b64(&format!("operator:{TOKEN}")));
    let (status, _) = send(gw.admin, "GET", "/dashboard", &[&h, &basic], "").await;
    assert_eq!(status, 200, "then its credentials work");
}

fn b64(text: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in text.as_bytes().chunks(3) {
        let n = c.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

#[tokio::test]
async fn issue_31_16_a_what_if_cannot_build_a_table_of_millions() {
    let bs = backends(3).await;
    let gw = gateway_with(&bs.iter().collect::<Vec<_>>(), "strategy = \"ring\"\n", "").await;
    // 4,000,000 points: under the gateway's limit on a real table, 8,000 times this pool's.
    let (status, v) = admin(&gw, "GET", "/placement?key=k&add=big:24996", "", None).await;
    assert_eq!(status.as_u16(), 400, "{v}");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("what-if") && e.contains("entries")), "{v}");
    // keyroute's one error shape: a message, a class and the status (the gateway's and workers' too).
    assert_eq!((v["reason"].as_str(), v["status"].as_u64()), (Some("bad_request"), Some(400)), "{v}");
    // A what-if of the pool's own size is answered.
    let (status, v) = admin(&gw, "GET", "/placement?key=k&add=w9:3", "", None).await;
    assert_eq!(status.as_u16(), 200, "{v}");
    assert!(v["what_if"]["owner"].is_string(), "{v}");
}

/// `GET /events` with these extra header lines (a Host too); the status.
async fn events_status(addr: SocketAddr, host: &str, extra: &[&str]) -> u16 {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("GET /events HTTP/1.1\r\nhost: {host}\r\n");
    for e in extra {
        req.push_str(e);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("an answer").expect("read");
    String::from_utf8_lossy(&buf[..n]).split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn issue_31_17_a_cross_site_page_cannot_hold_the_feed() {
    let b = Backend::start("w1").await;
    let gw = gateway_with(&[&b], "", "hosts = [\"admin.internal\"]").await;
    let host = format!("admin.internal:{}", gw.admin.port());
    // What Chromium sends for `<img src="http://admin.internal:PORT/events">` on a plain-http
    // page of another site: no Origin, no Fetch Metadata (the admin host is not a potentially
    // trustworthy origin), an image Accept, the page's origin as Referer.
    let img = [
        "accept: image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8",
        "referer: http://evil.example/",
        "user-agent: Mozilla/5.0 (X11; Linux x86_64) Chrome/120.0.0.0",
    ];
    assert_eq!(events_status(gw.admin, &host, &img).await, 403, "an <img>");
    assert_eq!(events_status(gw.admin, &host, &img[..1]).await, 403, "an <img> with no Referer");
    // A `<script>` or `<video>` (Accept */*), with the page's origin as Referer.
    assert_eq!(events_status(gw.admin, &host, &["accept: */*", "referer: http://evil.example/"]).await, 403);
    // Loopback is potentially trustworthy: there Chromium says what the request is.
    let lo = gw.admin.to_string();
    for extra in
        [["sec-fetch-mode: no-cors", "sec-fetch-dest: image"], ["sec-fetch-mode: no-cors", "sec-fetch-dest: script"]]
    {
        assert_eq!(events_status(gw.admin, &lo, &extra).await, 403, "{extra:?}");
    }
    let (status, v) = admin(&gw, "GET", "/placement?key=k", "", None).await;
    assert_eq!(status.as_u16(), 200, "{v}");
    let (status, _) = send(gw.admin, "GET", "/placement?key=k", &[&format!("host: {host}"), img[0], img[1]], "").await;
    assert_eq!(status, 403, "the placement what-if from an <img>");
    // The page's own EventSource, and a tool, are served.
    let own =
        ["accept: text/event-stream", "sec-fetch-mode: cors", "sec-fetch-dest: empty", "sec-fetch-site: same-origin"];
    assert_eq!(events_status(gw.admin, &lo, &own).await, 200);
    assert_eq!(events_status(gw.admin, &host, &["accept: text/event-stream"]).await, 200);
    assert_eq!(events_status(gw.admin, &lo, &[]).await, 200, "curl");
}

#[tokio::test]
async fn issue_31_17_one_address_cannot_take_every_feed_subscription() {
    let b = Backend::start("w1").await;
    let gw = gateway_with(&[&b], "", "").await;
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..64 {
        let mut s = TcpStream::connect(gw.admin).await.expect("connect");
        s.write_all(format!("GET /events HTTP/1.1\r\nhost: {}\r\n\r\n", gw.admin).as_bytes()).await.expect("write");
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("answer").expect("read");
        refused += usize::from(!buf[..n].starts_with(b"HTTP/1.1 200"));
        held.push(s);
    }
    assert!(refused > 0, "one address held all 64 subscriptions");
    // Another address still subscribes (127.0.0.2 is loopback as well).
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind("127.0.0.2:0".parse().expect("addr")).expect("bind 127.0.0.2");
    let mut s = sock.connect(gw.admin).await.expect("connect");
    s.write_all(format!("GET /events HTTP/1.1\r\nhost: {}\r\n\r\n", gw.admin).as_bytes()).await.expect("write");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("answer").expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
}

#[tokio::test]
async fn issue_31_18_a_plus_in_a_query_is_a_space() {
    let b = Backend::start("w1").await;
    let routes = "[[listener]]\nlisten = \"127.0.0.1:0\"\n[[listener.route]]\npath_prefix = \"/two/\"\npool = \"pool two\"\n[[listener.route]]\npath_prefix = \"/\"\npool = \"p\"\n";
    let text = config_text(&[&b], "", "").replacen("[[listener]]\nlisten = \"127.0.0.1:0\"\n", routes, 1)
        + "\n[[pool]]\nname = \"pool two\"\nkey = \"{path}\"\n\n[[pool.worker]]\nname = \"w2\"\naddress = \"127.0.0.1:9\"\n";
    let gw = start_gateway(&text).await;
    let (status, plus) = admin(&gw, "GET", "/placement?pool=pool+two&key=a+b", "", None).await;
    assert_eq!(status.as_u16(), 200, "{plus}");
    let (_, encoded) = admin(&gw, "GET", "/placement?pool=pool%20two&key=a%20b", "", None).await;
    assert_eq!(plus["key"], "a b");
    assert_eq!(plus["hash"], encoded["hash"]);
    // A literal plus is %2B.
    let (_, literal) = admin(&gw, "GET", "/placement?pool=pool%20two&key=a%2Bb", "", None).await;
    assert_eq!(literal["key"], "a+b");
}

#[tokio::test]
async fn issue_31_21_every_json_answer_says_nosniff() {
    let b = Backend::start("w1").await;
    let gw = gateway_with(&[&b], "", &token_line()).await;
    let h = format!("host: {}", gw.admin);
    let auth = format!("authorization: Bearer {TOKEN}");
    let json = "content-type: application/json";
    for (method, path, headers, body) in [
        ("GET", "/workers", vec![h.as_str(), auth.as_str()], ""),
        ("GET", "/hotkeys", vec![h.as_str(), auth.as_str()], ""),
        ("GET", "/placement?key=k", vec![h.as_str(), auth.as_str()], ""),
        ("POST", "/placement", vec![h.as_str(), auth.as_str(), json], r#"{"keys":["a"]}"#),
        ("POST", "/placement", vec![h.as_str(), auth.as_str(), json], "{"),
        ("GET", "/nope", vec![h.as_str(), auth.as_str()], ""),
        ("PUT", "/workers", vec![h.as_str(), auth.as_str()], ""),
        ("GET", "/workers", vec![h.as_str()], ""),
        ("GET", "/workers", vec!["host: evil.example"], ""),
        ("GET", "/metrics", vec![h.as_str(), auth.as_str()], ""),
        ("GET", "/healthz", vec![h.as_str()], ""),
    ] {
        let (status, head, _) = send_full(gw.admin, method, path, &headers, body).await;
        assert!(
            head.iter().any(|l| l.eq_ignore_ascii_case("x-content-type-options: nosniff")),
            "{method} {path} ({status}): {head:?}"
        );
    }
}
