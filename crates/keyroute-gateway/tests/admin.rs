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
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
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
