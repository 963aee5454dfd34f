//! Listener limits as an operator counts them (issue 19, defects 9 and 10): one connection limit
//! per listener whatever the number of runtime threads, and an address that another gateway
//! already holds refused unless both ask to share it.

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use keyroute_server::{Config, Gateway, GatewayError};
use support::*;
use tokio::task::JoinSet;

/// A gateway serving on two runtime threads of its own (`run_threads`), until `stop_tx` is
/// dropped.
struct TwoThreads {
    addr: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    handle: keyroute_server::GatewayHandle,
    stop_tx: tokio::sync::oneshot::Sender<()>,
    server: std::thread::JoinHandle<Result<(), GatewayError>>,
}

async fn on_two_threads(text: &str) -> TwoThreads {
    let gw = Gateway::bind(Config::parse(text, "test.toml").expect("config")).await.expect("bind");
    let (addr, admin, handle) = (gw.local_addrs()[0], gw.admin_addr(), gw.handle());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        gw.run_threads(2, async move {
            let _ = stop_rx.await;
        })
    });
    TwoThreads { addr, admin, handle, stop_tx, server }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_connections_is_one_limit_across_runtime_threads() {
    let b = Backend::start("w1").await;
    b.delay_ms.store(700, SeqCst);
    let text = config_text(&[&b], "", "").replacen(
        "[[listener]]\nlisten = \"127.0.0.1:0\"\n",
        "[[listener]]\nlisten = \"127.0.0.1:0\"\nmax_connections = 4\n",
        1,
    );
    let TwoThreads { addr, handle, stop_tx, server, .. } = on_two_threads(&text).await;
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

/// The value of `metric{thread="N"}` for each thread in a `/metrics` text.
fn per_thread(text: &str, metric: &str) -> Vec<u64> {
    let mut v = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(&format!("{metric}{{thread=\""))) {
        let (labels, value) = line.split_once(' ').unwrap_or_default();
        let thread: usize =
            labels.trim_start_matches(&format!("{metric}{{thread=\"")).trim_end_matches("\"}").parse().unwrap_or(0);
        if v.len() <= thread {
            v.resize(thread + 1, 0);
        }
        v[thread] = value.trim().parse().unwrap_or(0);
    }
    v
}

/// The kernel spreads connections over the threads' sockets by a hash: 200 land 100 and 100
/// only on average (about 7 apart, typically). A thread that accepts one while it serves two more
/// than another hands it over, so the threads serve within two of each other, whatever the
/// hash did (three when both threads decide at the same moment). Without the hand-over this
/// fails about five times in six (the kernel's split is three or more apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_threads_serve_as_many_connections_as_each_other() {
    let b = Backend::start("w1").await;
    let TwoThreads { addr, admin, handle, stop_tx, server } = on_two_threads(&config_text(&[&b], "", "")).await;
    let mut held = Vec::new();
    for _ in 0..200 {
        held.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    let metrics = || async move {
        let (_, _, answer) = get(&client(), &format!("http://{admin}/metrics")).await;
        (
            per_thread(&answer, "keyroute_thread_connections_open"),
            per_thread(&answer, "keyroute_thread_connections_accepted_total"),
        )
    };
    eventually(Duration::from_secs(5), "all 200 connections served", || async {
        metrics().await.0.iter().sum::<u64>() == 200
    })
    .await;
    let (open, accepted) = metrics().await;
    assert_eq!(open.len(), 2, "{open:?}");
    assert!(open[0].abs_diff(open[1]) <= 3, "served {open:?} (the kernel gave them {accepted:?})");
    // Still within two of each other once a thread's clients leave and new ones come.
    // Every other client leaves.
    held = held.into_iter().step_by(2).collect();
    for _ in 0..100 {
        held.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    eventually(Duration::from_secs(5), "200 connections again", || async {
        metrics().await.0.iter().sum::<u64>() == 200
    })
    .await;
    let (open, accepted) = metrics().await;
    assert!(open[0].abs_diff(open[1]) <= 3, "served {open:?} (the kernel gave them {accepted:?})");
    drop(held);
    handle.shutdown();
    drop(stop_tx);
    server.join().expect("server thread").expect("run");
}
