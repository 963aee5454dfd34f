//! Listener limits as an operator counts them (issue 19, defects 9 and 10): one connection limit
//! per listener whatever the number of runtime threads, and an address that another gateway
//! already holds refused unless both ask to share it.

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use keyroute_server::{Config, Gateway, GatewayError};
use support::*;
use tokio::task::JoinSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_connections_is_one_limit_across_runtime_threads() {
    let b = Backend::start("w1").await;
    b.delay_ms.store(700, SeqCst);
    let text = config_text(&[&b], "", "").replacen(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nmax_connections = 4\n",
        1,
    );
    let gw = Gateway::bind(Config::parse(&text, "test.toml").expect("config")).await.expect("bind");
    let addr = gw.local_addrs()[0];
    let handle = gw.handle();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        gw.run_threads(2, async move {
            let _ = stop_rx.await;
        })
    });
    // Eight clients at once, a connection each, closed after its answer.
    let mut set = JoinSet::new();
    for i in 0..8 {
        set.spawn(async move {
            let started = tokio::time::Instant::now();
            let req = format!("GET /thumb?k={i} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
            let answer = raw(addr, req.as_bytes()).await;
            (answer.starts_with("HTTP/1.1 200"), started.elapsed())
        });
    }
    let mut took = Vec::new();
    while let Some(r) = set.join_next().await {
        let (ok, elapsed) = r.expect("client");
        assert!(ok, "every client is served in the end");
        took.push(elapsed);
    }
    took.sort();
    let peak = b.peak.load(SeqCst);
    assert_eq!(peak, 4, "in flight at once on the worker (8 with a limit per thread): {took:?}");
    // The four that found the listener full waited for a connection to close: one request's time
    // more than the first four.
    assert!(took[3] < Duration::from_millis(1300), "the first four at once: {took:?}");
    assert!(took[4] >= Duration::from_millis(1300), "the fifth waited for a slot: {took:?}");
    handle.shutdown();
    drop(stop_tx);
    server.join().expect("server thread").expect("run");
}

#[tokio::test]
async fn a_second_gateway_on_the_same_address_is_refused_unless_both_share_it() {
    let b = Backend::start("w1").await;
    let gw = start_gateway(&config_text(&[&b], "", "")).await;
    let taken = config_text(&[&b], "", "").replacen(
        "listen = \"127.0.0.1:0\"\n\n[[pool]]",
        &format!("listen = \"{}\"\n\n[[pool]]", gw.addr),
        1,
    );
    assert!(taken.contains(&gw.addr.to_string()));
    match Gateway::bind(Config::parse(&taken, "second.toml").expect("config")).await {
        Err(GatewayError::Bind { addr, source }) => {
            assert_eq!(addr, gw.addr);
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse, "{source}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a second gateway bound the first one's address"),
    }
    // Both asking to share it (for a seamless reload), they do.
    let shared = |addr: &str| {
        config_text(&[&b], "", "").replacen(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
            &format!("[[listener]]\nlisten = \"{addr}\"\nreuse_port = true\n"),
            1,
        )
    };
    let first = Gateway::bind(Config::parse(&shared("127.0.0.1:0"), "a.toml").expect("config")).await.expect("first");
    let at = first.local_addrs()[0].to_string();
    let second = Gateway::bind(Config::parse(&shared(&at), "b.toml").expect("config")).await;
    assert!(second.is_ok(), "both share the address: {:?}", second.err().map(|e| e.to_string()));
    // And a gateway that does not ask to share it is still refused there.
    let plain =
        Gateway::bind(Config::parse(&shared(&at).replace("reuse_port = true\n", ""), "c.toml").expect("config")).await;
    assert!(plain.is_err(), "a plain gateway joined a shared address");
    gw.task.abort();
}
