//! Shutdown: not ready first, still accepting; then stop accepting and drain; say so when the
//! grace period cut requests.

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use http::StatusCode;
use keyroute_server::{Config, Gateway, GatewayError};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_requests_in_flight() {
    let bs = backends(1).await;
    bs[0].delay_ms.store(300, SeqCst);
    let refs: Vec<&Backend> = bs.iter().collect();
    let gw = start_gateway(&config_text(&refs, "", "shutdown_grace_ms = 5000")).await;
    let url = format!("http://{}/thumb?k=1", gw.addr);
    let pending = tokio::spawn(async move { get(&client(), &url).await.0 });
    eventually(Duration::from_secs(5), "the request reached the worker", || async { bs[0].arrived.load(SeqCst) == 1 })
        .await;
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

/// Issue 8, gaps: `/readyz` reports not ready for the shutdown delay while the listener still
/// accepts; then the listener closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_not_ready_while_the_listener_still_serves() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let config = Config::parse(&config_text(&refs, "", "shutdown_delay_ms = 1500"), "t.toml").expect("valid");
    let gw = Gateway::bind(config).await.expect("bind");
    let (addr, admin_addr, handle) = (gw.local_addrs()[0], gw.admin_addr(), gw.handle());
    let run = tokio::spawn(gw.run(std::future::pending()));
    let g = Gw { addr, admin: admin_addr, handle: handle.clone(), task: tokio::spawn(async {}) };
    assert_eq!(admin(&g, "GET", "/readyz", "", None).await.0, StatusCode::OK);
    handle.shutdown();
    eventually(Duration::from_secs(1), "readyz turns not ready", || async {
        admin(&g, "GET", "/readyz", "", None).await.0 == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    // Still accepting and serving during the delay.
    let (s, _, _) = get(&client(), &format!("http://{addr}/thumb?k=1")).await;
    assert_eq!(s, StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(5), run).await.expect("stops").expect("task").expect("clean");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "no longer accepting");
}

/// Issue 8, gaps: the exit says when the grace period cut requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_period_that_cuts_requests_is_an_error() {
    let bs = backends(1).await;
    bs[0].delay_ms.store(5_000, SeqCst);
    let refs: Vec<&Backend> = bs.iter().collect();
    let config =
        Config::parse(&config_text(&refs, "[pool.passive]\nstall_ms = 0", "shutdown_grace_ms = 200"), "t.toml")
            .expect("valid");
    let gw = Gateway::bind(config).await.expect("bind");
    let (addr, handle) = (gw.local_addrs()[0], gw.handle());
    let run = tokio::spawn(gw.run(std::future::pending()));
    let slow = tokio::spawn(async move {
        let c = client();
        c.get(format!("http://{addr}/thumb?k=1").parse().expect("uri")).await.map(|r| r.status())
    });
    eventually(Duration::from_secs(5), "the slow request reached the worker", || async {
        bs[0].arrived.load(SeqCst) == 1
    })
    .await;
    handle.shutdown();
    let result = tokio::time::timeout(Duration::from_secs(5), run).await.expect("stops").expect("task");
    assert!(matches!(result, Err(GatewayError::GraceExpired { connections: 1 })), "{result:?}");
    slow.abort();
}

/// Connections that never sent a request do not hold the shutdown until their head timeout, nor
/// count as requests cut by a grace period shorter than it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_new_connections_do_not_hold_the_shutdown() {
    let bs = backends(1).await;
    let refs: Vec<&Backend> = bs.iter().collect();
    let config = Config::parse(&config_text(&refs, "", "shutdown_grace_ms = 1000"), "t.toml").expect("valid");
    let gw = Gateway::bind(config).await.expect("bind");
    let (addr, handle) = (gw.local_addrs()[0], gw.handle());
    let run = tokio::spawn(gw.run(std::future::pending()));
    let mut idle = Vec::new();
    for _ in 0..5 {
        idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    let (s, _, _) = get(&client(), &format!("http://{addr}/thumb?k=1")).await;
    assert_eq!(s, StatusCode::OK);
    handle.shutdown();
    let result = tokio::time::timeout(Duration::from_secs(5), run).await.expect("stops").expect("task");
    assert!(result.is_ok(), "{result:?}");
    drop(idle);
}
