//! A Redis Cluster behind keyroute's Redis listener (issue 35): six real `redis-server
//! --cluster-enabled yes` nodes (three masters, three replicas) made by `redis-cli --cluster
//! create`, resharded by `redis-cli --cluster reshard` while a writer and a reader run through
//! keyroute, which speaks plain Redis to them.

mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn cmd(args: &[&str]) -> Vec<u8> {
    let mut o = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        o.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    o
}

/// One whole RESP2 reply (a line, or a bulk string, or an array of those) at the start of `buf`.
fn reply_len(buf: &[u8]) -> Option<usize> {
    let line = buf.windows(2).position(|w| w == b"\r\n")? + 2;
    match buf.first()? {
        b'$' => {
            let n: i64 = std::str::from_utf8(&buf[1..line - 2]).ok()?.parse().ok()?;
            if n < 0 {
                return Some(line);
            }
            let end = line + n as usize + 2;
            (buf.len() >= end).then_some(end)
        }
        b'*' => {
            let n: i64 = std::str::from_utf8(&buf[1..line - 2]).ok()?.parse().ok()?;
            let mut at = line;
            for _ in 0..n.max(0) {
                at += reply_len(&buf[at..])?;
            }
            Some(at)
        }
        _ => Some(line),
    }
}

async fn ask(s: &mut TcpStream, request: &[u8]) -> String {
    s.write_all(request).await.expect("write");
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(n) = reply_len(&buf) {
            return String::from_utf8_lossy(&buf[..n]).into_owned();
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk)).await.expect("a reply in time").expect("read");
        assert!(n > 0, "closed; got {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A cluster node on a free loopback port (its bus on another), its files in `dir`.
fn node(dir: &std::path::Path) -> (Proc, SocketAddr) {
    let (child, port) = start_on_free_port("redis-server", |port| {
        let bus = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let mut c = Command::new("redis-server");
        c.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes", "--cluster-port", &bus.to_string()])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf"), "--cluster-node-timeout", "5000"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    });
    (Proc(child), SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Whether a `CLUSTER NODES` line's slot ranges hold `slot`.
fn slot_in(line: &str, slot: &str) -> bool {
    let Ok(slot) = slot.parse::<u32>() else { return false };
    line.split(' ').skip(8).any(|r| match r.split_once('-') {
        Some((a, b)) => a.parse::<u32>().is_ok_and(|a| a <= slot) && b.parse::<u32>().is_ok_and(|b| slot <= b),
        None => r.parse::<u32>() == Ok(slot),
    })
}

fn redis_cli(args: &[&str]) -> String {
    let out =
        Command::new("redis-cli").args(args).stdin(Stdio::null()).output().expect("redis-cli (Debian redis-tools)");
    assert!(out.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_resharded_under_load_fails_no_command() {
    let dir = std::env::temp_dir().join(format!("keyroute-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let nodes: Vec<(Proc, SocketAddr)> = (0..6).map(|_| node(&dir)).collect();
    let addrs: Vec<String> = nodes.iter().map(|(_, a)| a.to_string()).collect();
    let mut create = vec!["--cluster", "create"];
    create.extend(addrs.iter().map(String::as_str));
    create.extend(["--cluster-replicas", "1", "--cluster-yes"]);
    redis_cli(&create);
    let port = |a: &SocketAddr| a.port().to_string();
    eventually(Duration::from_secs(20), "the cluster's state ok on every node", async || {
        nodes.iter().all(|(_, a)| redis_cli(&["-p", &port(a), "cluster", "info"]).contains("cluster_state:ok"))
    })
    .await;
    // keyroute knows two seeds only; it finds the masters itself.
    let mut text = String::from(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\nprotocol = \"redis\"\npool = \"cluster\"\n\n[[pool]]\nname = \"cluster\"\nstrategy = \"rendezvous\"\nconnect_timeout_ms = 500\n[pool.cluster]\nrefresh_ms = 1000\n[pool.retry]\nper_try_timeout_ms = 2000\n",
    );
    for a in &addrs[..2] {
        text.push_str(&format!("[[pool.worker]]\nname = \"{a}\"\naddress = \"{a}\"\n"));
    }
    let gw = start_gateway(&text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    // Every key on its slot's master, read back; MSET and MGET split by slot.
    for i in 0..200 {
        assert_eq!(ask(&mut c, &cmd(&["SET", &format!("k{i}"), &format!("v{i}")])).await, "+OK\r\n");
    }
    for i in 0..200 {
        let v = format!("v{i}");
        assert_eq!(ask(&mut c, &cmd(&["GET", &format!("k{i}")])).await, format!("${}\r\n{v}\r\n", v.len()));
    }
    // Each key is on the master the cluster says serves its slot (asked with -c, which follows).
    for i in (0..200).step_by(13) {
        let direct = redis_cli(&["-c", "-p", &port(&nodes[2].1), "get", &format!("k{i}")]);
        assert_eq!(direct.trim(), format!("v{i}"));
    }
    assert_eq!(ask(&mut c, &cmd(&["MSET", "a", "1", "b", "2", "c", "3", "d", "4"])).await, "+OK\r\n");
    assert_eq!(
        ask(&mut c, &cmd(&["MGET", "a", "b", "nope", "c", "d"])).await,
        "*5\r\n$1\r\n1\r\n$1\r\n2\r\n$-1\r\n$1\r\n3\r\n$1\r\n4\r\n"
    );
    assert_eq!(ask(&mut c, &cmd(&["DEL", "a", "b", "c"])).await, ":3\r\n");
    let r = ask(&mut c, &cmd(&["MSETNX", "x", "1", "y", "2"])).await;
    assert!(r.starts_with("-CROSSSLOT"), "{r}");
    assert_eq!(ask(&mut c, &cmd(&["MSETNX", "{u}x", "1", "{u}y", "2"])).await, ":1\r\n");
    // The members are the cluster's three masters.
    eventually(Duration::from_secs(10), "three masters as members", async || {
        let (_, w) = admin(&gw, "GET", "/workers", "", None).await;
        w["pools"][0]["workers"].as_array().map(Vec::len) == Some(3)
    })
    .await;
    // A slot being migrated by hand: a key already moved is answered by its new node after ASK.
    let masters: Vec<SocketAddr> =
        nodes.iter().map(|(_, a)| *a).filter(|a| redis_cli(&["-p", &port(a), "role"]).starts_with("master")).collect();
    assert_eq!(masters.len(), 3);
    let id = |a: &SocketAddr| redis_cli(&["-p", &port(a), "cluster", "myid"]).trim().to_owned();
    let slot = redis_cli(&["-p", &port(&masters[0]), "cluster", "keyslot", "asked"]).trim().to_owned();
    let owner = masters
        .iter()
        .copied()
        .find(|m| {
            let nodes = redis_cli(&["-p", &port(m), "cluster", "nodes"]);
            nodes.lines().any(|l| l.contains("myself") && l.contains("master") && slot_in(l, &slot))
        })
        .expect("the slot's master");
    let target = masters.iter().copied().find(|m| *m != owner).expect("another master");
    assert_eq!(ask(&mut c, &cmd(&["SET", "asked", "here"])).await, "+OK\r\n");
    redis_cli(&["-p", &port(&target), "cluster", "setslot", &slot, "importing", &id(&owner)]);
    redis_cli(&["-p", &port(&owner), "cluster", "setslot", &slot, "migrating", &id(&target)]);
    redis_cli(&["-p", &port(&owner), "migrate", "127.0.0.1", &port(&target), "asked", "0", "5000"]);
    assert_eq!(ask(&mut c, &cmd(&["GET", "asked"])).await, "$4\r\nhere\r\n");
    let (_, m) = admin(&gw, "GET", "/metrics", "", None).await;
    let ask_line = "keyroute_pool_cluster_redirections_total{pool=\"cluster\",kind=\"ask\"} 1";
    assert!(m.as_str().is_some_and(|m| m.contains(ask_line)), "{m}");
    for node in [&target, &owner] {
        redis_cli(&["-p", &port(node), "cluster", "setslot", &slot, "node", &id(&target)]);
    }
    assert_eq!(ask(&mut c, &cmd(&["GET", "asked"])).await, "$4\r\nhere\r\n");
    // A writer and a reader through keyroute while 3,000 slots move from one master to another.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = tokio::task::JoinSet::new();
    for role in ["writer", "reader"] {
        let (stop, addr) = (stop.clone(), gw.addr);
        load.spawn(async move {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            let (mut done, mut failed, mut acked) = (0u64, Vec::new(), std::collections::BTreeMap::new());
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let key = format!("load{}", i % 2000);
                if role == "writer" {
                    let r = ask(&mut c, &cmd(&["SET", &key, &i.to_string()])).await;
                    if r == "+OK\r\n" {
                        acked.insert(key, i);
                    } else {
                        failed.push(r);
                    }
                } else {
                    let r = ask(&mut c, &cmd(&["GET", &key])).await;
                    if !r.starts_with('$') {
                        failed.push(r);
                    }
                }
                done += 1;
                i += 1;
            }
            (role, done, failed, acked)
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (from, to) = (id(&masters[0]), id(&masters[1]));
    let seed = masters[0].to_string();
    let reshard = tokio::task::spawn_blocking(move || {
        redis_cli(&[
            "--cluster",
            "reshard",
            &seed,
            "--cluster-from",
            &from,
            "--cluster-to",
            &to,
            "--cluster-slots",
            "3000",
            "--cluster-yes",
            "--cluster-pipeline",
            "20",
        ])
    });
    reshard.await.expect("reshard");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut acked = std::collections::BTreeMap::new();
    while let Some(done) = load.join_next().await {
        let (role, n, failed, a) = done.expect("load");
        assert!(n > 100, "{role}: {n} commands");
        assert!(failed.is_empty(), "{role}: {} of {n} failed; the first: {:?}", failed.len(), failed.first());
        acked.extend(a);
    }
    // The slots moved under the load: keyroute was redirected, and followed.
    let (_, m) = admin(&gw, "GET", "/metrics", "", None).await;
    let m = m.as_str().expect("text").to_owned();
    let redirections: u64 = m
        .lines()
        .filter(|l| l.starts_with("keyroute_pool_cluster_redirections_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(redirections > 0, "{m}");
    // Every acknowledged write reads back, through keyroute and straight from the cluster.
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for (key, value) in &acked {
        let v = value.to_string();
        assert_eq!(ask(&mut c, &cmd(&["GET", key])).await, format!("${}\r\n{v}\r\n", v.len()), "{key}");
    }
    drop(nodes);
    std::fs::remove_dir_all(&dir).ok();
}
