//! What memcached operators need past placement (issue 35), against real memcached servers:
//! commands of every server broadcast (`flush_all`, `verbosity`, `stats`), checked by
//! libmemcached's own conformance suite (`memccapable -a`, Debian's libmemcached-tools), and
//! replicated pools.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use support::memcache::*;
use support::*;
use tokio::net::TcpStream;

/// The memcached listener's configuration, with the commands of every server broadcast.
fn broadcasting(servers: &[SocketAddr], extra: &str) -> String {
    config(servers, "rendezvous", extra).replace("max_item_bytes = 4096\n", "max_item_bytes = 4096\nbroadcast = true\n")
}

/// `memccapable -a` against `addr`: the tests that passed, and how many ran.
fn memccapable(addr: SocketAddr) -> (BTreeSet<String>, usize) {
    // Each test's name goes to stdout and its verdict to stderr: one pipe keeps them in order.
    let run = format!("memccapable -a -t 5 -h 127.0.0.1 -p {} 2>&1", addr.port());
    let out = Command::new("sh")
        .args(["-c", &run])
        .output()
        .expect("memccapable (Debian libmemcached-tools; scripts/test.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut passed = BTreeSet::new();
    let mut ran = 0;
    for line in text.lines() {
        let Some(name) = line.strip_suffix("[pass]").or_else(|| line.strip_suffix("[FAIL]")) else { continue };
        ran += 1;
        if line.ends_with("[pass]") {
            passed.insert(name.trim().to_owned());
        }
    }
    assert!(ran > 0, "memccapable said: {text}");
    (passed, ran)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memccapable_passes_through_keyroute_as_against_memcached() {
    let (_procs, addrs) = memcacheds(3).await;
    let (direct, ran) = memccapable(addrs[0]);
    assert_eq!(ran, 27, "memccapable -a runs its 27 ASCII tests");
    let gw = start_gateway(&broadcasting(&addrs, "")).await;
    let (through, ran) = memccapable(gw.addr);
    assert_eq!(ran, 27);
    let missing: Vec<_> = direct.difference(&through).collect();
    assert!(missing.is_empty(), "pass against memcached, fail through keyroute: {missing:?}");
    assert_eq!(through.len(), 27, "{through:?}");
    // Without broadcasts, the commands of every server are refused (as before, and as
    // nutcracker does): their four tests fail, and `add` and `replace` may too, since they
    // count on the flush that was refused.
    let gw = start_gateway(&config(&addrs, "rendezvous", "")).await;
    let (through, _) = memccapable(gw.addr);
    let failed: BTreeSet<_> = direct.difference(&through).map(String::as_str).collect();
    let refused = BTreeSet::from(["ascii flush", "ascii flush noreply", "ascii stat", "ascii verbosity"]);
    assert!(failed.is_superset(&refused), "{failed:?}");
    assert!(failed.difference(&refused).all(|t| ["ascii add", "ascii replace"].contains(t)), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcasts_reach_every_server_and_say_when_one_did_not() {
    let (mut procs, addrs) = memcacheds(3).await;
    let gw = start_gateway(&broadcasting(&addrs, "[pool.retry]\nper_try_timeout_ms = 1000\n")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    let fill = async |c: &mut TcpStream| {
        for i in 0..30 {
            assert_eq!(ask(c, format!("set k{i} 0 0 1\r\n{}\r\n", i % 10).as_bytes(), "\r\n").await, "STORED\r\n");
        }
    };
    fill(&mut c).await;
    for a in &addrs {
        assert!(stat(*a, "curr_items").await > 0, "{a} holds keys");
    }
    // flush_all: every server's items gone.
    assert_eq!(ask(&mut c, b"flush_all\r\n", "\r\n").await, "OK\r\n");
    for a in &addrs {
        let mut d = TcpStream::connect(a).await.expect("direct");
        let got = ask(&mut d, b"get k0 k1 k2 k3 k4 k5 k6 k7 k8 k9 k10 k11 k12 k13 k14\r\n", "END\r\n").await;
        assert_eq!(got, "END\r\n", "{a}");
    }
    // With a delay: still there now, gone once it passes.
    fill(&mut c).await;
    assert_eq!(ask(&mut c, b"flush_all 2\r\nget k3\r\n", "END\r\n").await, "OK\r\nVALUE k3 0 1\r\n3\r\nEND\r\n");
    eventually(Duration::from_secs(6), "the delayed flush", async || {
        let mut c = TcpStream::connect(gw.addr).await.expect("connect");
        ask(&mut c, b"get k3 k4 k5\r\n", "END\r\n").await == "END\r\n"
    })
    .await;
    // noreply: nothing said, the next answer is the next command's.
    assert_eq!(ask(&mut c, b"verbosity 1 noreply\r\nflush_all noreply\r\nmn\r\n", "\r\n").await, "MN\r\n");
    assert_eq!(ask(&mut c, b"verbosity 0\r\n", "\r\n").await, "OK\r\n");
    // stats: the proxy's own lines, then each server's under its name, to one END.
    let stats = ask(&mut c, b"stats\r\n", "END\r\n").await;
    assert!(stats.starts_with(&format!("STAT pid {}\r\n", std::process::id())), "{stats}");
    assert!(stats.contains("STAT servers 3\r\nSTAT servers_failed 0\r\n"), "{stats}");
    for a in &addrs {
        assert_eq!(stats.matches(&format!("STAT {a}:pid ")).count(), 1, "{a}: {stats}");
        assert!(stats.contains(&format!("STAT {a}:version 1.")), "{a}: {stats}");
    }
    assert_eq!(stats.matches("END\r\n").count(), 1);
    let items = ask(&mut c, b"stats settings\r\n", "END\r\n").await;
    assert!(items.contains(&format!("STAT {}:maxbytes ", addrs[2])), "{items}");
    assert!(!items.contains("STAT pid"), "a group has no proxy lines: {items}");
    assert_eq!(ask(&mut c, b"stats reset\r\n", "\r\n").await, "RESET\r\n");
    assert!(stat(addrs[1], "cmd_get").await == 0, "stats reset reached every server");
    // memcached's refusals, and the connection still in step.
    assert_eq!(
        ask(&mut c, b"stats noreply\r\nverbosity\r\nflush_all x\r\nmn\r\n", "MN\r\n").await,
        "ERROR\r\nERROR\r\nCLIENT_ERROR bad command line format\r\nMN\r\n"
    );
    // A server down: the others flushed, the client told that one did not.
    fill(&mut c).await;
    procs.remove(1);
    let r = ask(&mut c, b"flush_all\r\n", "\r\n").await;
    assert_eq!(r, "SERVER_ERROR flush_all failed on 1 of 3 servers\r\n");
    for a in [addrs[0], addrs[2]] {
        let mut d = TcpStream::connect(a).await.expect("direct");
        assert_eq!(ask(&mut d, b"get k0 k1 k2 k3 k4 k5 k6 k7 k8 k9\r\n", "END\r\n").await, "END\r\n", "{a}");
    }
    let stats = ask(&mut c, b"stats\r\n", "END\r\n").await;
    assert!(stats.contains("STAT servers 3\r\nSTAT servers_failed 1\r\n"), "{stats}");
    assert!(!stats.contains(&format!("STAT {}:", addrs[1])), "{stats}");
    assert_eq!(ask(&mut c, b"verbosity 1\r\n", "\r\n").await, "SERVER_ERROR verbosity failed on 1 of 3 servers\r\n");
}
