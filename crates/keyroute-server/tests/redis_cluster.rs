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
    ask_n(s, request, 1).await
}

/// `request` sent, and `n` replies read.
async fn ask_n(s: &mut TcpStream, request: &[u8], n: usize) -> String {
    s.write_all(request).await.expect("write");
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut at = 0;
        for _ in 0..n {
            match reply_len(&buf[at..]) {
                Some(len) => at += len,
                None => {
                    at = usize::MAX;
                    break;
                }
            }
        }
        if at != usize::MAX {
            return String::from_utf8_lossy(&buf[..at]).into_owned();
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

fn port(a: &SocketAddr) -> String {
    a.port().to_string()
}

/// Six nodes made a cluster of three masters, a replica each, by `redis-cli --cluster create`,
/// their files in a directory of the test's `name`.
async fn cluster_of_six(name: &str) -> (std::path::PathBuf, Vec<(Proc, SocketAddr)>) {
    let dir = std::env::temp_dir().join(format!("keyroute-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let nodes: Vec<(Proc, SocketAddr)> = (0..6).map(|_| node(&dir)).collect();
    let addrs: Vec<String> = nodes.iter().map(|(_, a)| a.to_string()).collect();
    let mut create = vec!["--cluster", "create"];
    create.extend(addrs.iter().map(String::as_str));
    create.extend(["--cluster-replicas", "1", "--cluster-yes"]);
    redis_cli(&create);
    eventually(Duration::from_secs(20), "the cluster's state ok on every node", async || {
        nodes.iter().all(|(_, a)| redis_cli(&["-p", &port(a), "cluster", "info"]).contains("cluster_state:ok"))
    })
    .await;
    // Every replica knows its master, and is in sync with it.
    eventually(Duration::from_secs(20), "three replicas in sync", async || {
        nodes.iter().filter(|(_, a)| redis_cli(&["-p", &port(a), "role"]).contains("connected")).count() == 3
    })
    .await;
    (dir, nodes)
}

/// The master of `key`'s slot, of `masters`.
fn master_of(masters: &[SocketAddr], key: &str) -> SocketAddr {
    let slot = redis_cli(&["-p", &port(&masters[0]), "cluster", "keyslot", key]).trim().to_owned();
    masters
        .iter()
        .copied()
        .find(|m| {
            let nodes = redis_cli(&["-p", &port(m), "cluster", "nodes"]);
            nodes.lines().any(|l| l.contains("myself") && l.contains("master") && slot_in(l, &slot))
        })
        .expect("the slot's master")
}

/// A key's Redis Cluster slot.
fn slot_of(key: &str) -> u16 {
    keyroute::slots::key_slot(key.as_bytes())
}

/// The redirections keyroute followed.
async fn redirections(gw: &Gw) -> u64 {
    let (_, m) = admin(gw, "GET", "/metrics", "", None).await;
    let m = m.as_str().expect("text").to_owned();
    m.lines()
        .filter(|l| l.starts_with("keyroute_pool_cluster_redirections_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The replica of master `m`, of `nodes`.
fn replica_of(nodes: &[SocketAddr], m: SocketAddr) -> SocketAddr {
    nodes
        .iter()
        .copied()
        .find(|a| {
            let role = redis_cli(&["-p", &port(a), "role"]);
            role.starts_with("slave") && role.lines().nth(2) == Some(&port(&m))
        })
        .expect("a replica")
}

/// How many `GET`s the node at `a` has served.
fn gets(a: &SocketAddr) -> u64 {
    let stats = redis_cli(&["-p", &port(a), "info", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_get:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_resharded_under_load_fails_no_command() {
    let (dir, nodes) = cluster_of_six("cluster").await;
    let addrs: Vec<String> = nodes.iter().map(|(_, a)| a.to_string()).collect();
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
    let owner = master_of(&masters, "asked");
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
    // Writers and readers through keyroute (SET, GET, MSET, MGET) while 3,000 slots move from one
    // master to another.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = tokio::task::JoinSet::new();
    // (MSET and MGET of keys in different slots: split, each part on its own slot's node.)
    for role in ["writer", "reader", "mwriter", "mreader"] {
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
                } else if role == "mwriter" {
                    let (a, b) = (format!("mload{}", i % 1000), format!("mload{}", 1000 + i % 1000));
                    if slot_of(&a) == slot_of(&b) {
                        i += 1;
                        continue;
                    }
                    let v = i.to_string();
                    let r = ask(&mut c, &cmd(&["MSET", &a, &v, &b, &v])).await;
                    if r == "+OK\r\n" {
                        acked.insert(a, i);
                        acked.insert(b, i);
                    } else {
                        failed.push(r);
                    }
                } else if role == "mreader" {
                    let keys = [key.clone(), format!("load{}", (i + 7) % 2000), format!("mload{}", i % 2000)];
                    // Keys of one slot, some moved and some not, are TRYAGAIN in Redis Cluster too.
                    if slot_of(&keys[0]) == slot_of(&keys[1])
                        || slot_of(&keys[1]) == slot_of(&keys[2])
                        || slot_of(&keys[0]) == slot_of(&keys[2])
                    {
                        i += 1;
                        continue;
                    }
                    let r = ask(&mut c, &cmd(&["MGET", &keys[0], &keys[1], &keys[2]])).await;
                    if !r.starts_with("*3\r\n") {
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

/// Reads from a cluster's replicas (`READONLY`): every read spread over its slot's master and
/// replica (`replica_reads = "always"`), except a key written through keyroute within the last
/// second (read from its master: a replica may not have the write yet); a hot key's reads spread,
/// a cold key's on its master (`[pool.hot_keys]`, `replica_reads = "hot"`); a replica's miss asked
/// of its master; a replica killed: every read still answered, from its master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_serve_reads_and_a_hot_keys_spread_over_its_slot() {
    let (dir, nodes) = cluster_of_six("replicas").await;
    let addrs: Vec<SocketAddr> = nodes.iter().map(|(_, a)| *a).collect();
    let masters: Vec<SocketAddr> =
        addrs.iter().copied().filter(|a| redis_cli(&["-p", &port(a), "role"]).starts_with("master")).collect();
    assert_eq!(masters.len(), 3);
    let replica_of = |m: SocketAddr| replica_of(&addrs, m);
    let gateway = |pool: &str| {
        let mut text = format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\nprotocol = \"redis\"\npool = \"cluster\"\n\n[[pool]]\nname = \"cluster\"\nstrategy = \"rendezvous\"\nconnect_timeout_ms = 500\n[pool.cluster]\nrefresh_ms = 1000\n{pool}\n[pool.retry]\nper_try_timeout_ms = 2000\n"
        );
        text.push_str(&format!("[[pool.worker]]\nname = \"seed\"\naddress = \"{}\"\n", addrs[0]));
        text
    };
    // Every read may go to a replica.
    let gw = start_gateway(&gateway("replica_reads = \"always\"")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..100 {
        assert_eq!(ask(&mut c, &cmd(&["SET", &format!("r{i}"), &format!("v{i}")])).await, "+OK\r\n");
    }
    // The map's nodes become the members (the refresh task starts with the first command).
    eventually(Duration::from_secs(10), "masters and replicas as members", async || {
        let (_, w) = admin(&gw, "GET", "/workers", "", None).await;
        w["pools"][0]["workers"].as_array().map(Vec::len) == Some(6)
    })
    .await;
    // Just written: read from the master only, whichever node is less loaded.
    let key = "pinned";
    let (m, r) = (master_of(&masters, key), replica_of(master_of(&masters, key)));
    let (m0, r0) = (gets(&m), gets(&r));
    assert_eq!(ask(&mut c, &cmd(&["SET", key, "new"])).await, "+OK\r\n");
    for _ in 0..20 {
        assert_eq!(ask(&mut c, &cmd(&["GET", key])).await, "$3\r\nnew\r\n");
    }
    assert_eq!((gets(&m) - m0, gets(&r) - r0), (20, 0), "a key just written is read from its master");
    // A second later, its reads spread over the master and the replica, each a value written.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let before: Vec<u64> = addrs.iter().map(gets).collect();
    for _ in 0..5 {
        for i in 0..100 {
            let v = format!("v{i}");
            assert_eq!(ask(&mut c, &cmd(&["GET", &format!("r{i}")])).await, format!("${}\r\n{v}\r\n", v.len()));
        }
    }
    let mget = ask(&mut c, &cmd(&["MGET", "r1", "r2", "r3", "nope"])).await;
    assert_eq!(mget, "*4\r\n$2\r\nv1\r\n$2\r\nv2\r\n$2\r\nv3\r\n$-1\r\n");
    let served: Vec<u64> = addrs.iter().zip(&before).map(|(a, b)| gets(a) - b).collect();
    assert!(served.iter().all(|&n| n > 20), "every node, master or replica, served reads: {served:?}");
    // A replica's miss is asked of the master (the key may be newer than the replica): every read
    // of a key that is nowhere reaches the master.
    let (m, r) = (master_of(&masters, "absent"), replica_of(master_of(&masters, "absent")));
    let (m0, r0) = (gets(&m), gets(&r));
    for _ in 0..10 {
        assert_eq!(ask(&mut c, &cmd(&["GET", "absent"])).await, "$-1\r\n");
    }
    let (on_master, on_replica) = (gets(&m) - m0, gets(&r) - r0);
    assert!(
        on_master == 10 && on_replica > 0,
        "a miss asked again: {on_master} on the master, {on_replica} on the replica"
    );
    // A read and a write of one key pipelined: the read never sees the write, even when a
    // replica's miss is asked again of the master (the write waits for that answer).
    for i in 0..20 {
        let key = format!("piped{i}");
        let mut request = cmd(&["GET", &key]);
        request.extend(cmd(&["SET", &key, "later"]));
        assert_eq!(ask_n(&mut c, &request, 2).await, "$-1\r\n+OK\r\n", "{key}");
    }
    // A replica killed: every read still answered (from the master, or the next node).
    let dead = replica_of(masters[0]);
    let at = addrs.iter().position(|a| *a == dead).expect("its node");
    let mut nodes = nodes;
    drop(nodes.remove(at));
    let live: Vec<SocketAddr> = nodes.iter().map(|(_, a)| *a).collect();
    let replica_of = |m: SocketAddr| self::replica_of(&live, m);
    let (redirected, m0) = (redirections(&gw).await, gets(&masters[0]));
    for _ in 0..3 {
        for i in 0..100 {
            let v = format!("v{i}");
            assert_eq!(ask(&mut c, &cmd(&["GET", &format!("r{i}")])).await, format!("${}\r\n{v}\r\n", v.len()));
        }
    }
    // Its slots' reads went to their master, not where the pool's strategy would have sent them.
    assert_eq!(redirections(&gw).await, redirected, "no read was redirected");
    assert!(gets(&masters[0]) - m0 > 30, "the dead replica's master served its reads");
    drop(gw);

    // Hot keys: a hot key's reads spread over its slot's nodes; a cold key's stay on its master.
    let hot = "replica_reads = \"hot\"\n[pool.hot_keys]\nthreshold = 200.0\nper_worker = 100.0\nmax_replicas = 4\nwindow_ms = 100\nhold_ms = 30000\nsample_every = 1\nconfidence = 1\nshow_keys = true";
    let gw = start_gateway(&gateway(hot)).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    // Keys whose replica is alive.
    let (hot_key, cold_key) = (0..)
        .map(|i| (format!("viral{i}"), format!("cold{i}")))
        .find(|(h, c)| {
            [h, c].iter().all(|k| {
                let m = master_of(&masters, k);
                m != masters[0]
            })
        })
        .expect("keys");
    assert_eq!(ask(&mut c, &cmd(&["SET", &hot_key, "v1"])).await, "+OK\r\n");
    assert_eq!(ask(&mut c, &cmd(&["SET", &cold_key, "c1"])).await, "+OK\r\n");
    let mut replicas = 0;
    for _ in 0..100 {
        for _ in 0..50 {
            assert_eq!(ask(&mut c, &cmd(&["GET", &hot_key])).await, "$2\r\nv1\r\n");
        }
        let (_, v) = admin(&gw, "GET", "/hotkeys", "", None).await;
        replicas = v["pools"][0]["keys"]
            .as_array()
            .and_then(|ks| ks.iter().find(|k| k["key"] == hot_key.as_str()))
            .and_then(|k| k["replicas"].as_u64())
            .unwrap_or(0);
        if replicas > 1 {
            break;
        }
    }
    assert!(replicas > 1, "the key became hot");
    eventually(Duration::from_secs(10), "the live masters and replicas as members", async || {
        let (_, w) = admin(&gw, "GET", "/workers", "", None).await;
        w["pools"][0]["workers"].as_array().map(Vec::len) >= Some(5)
    })
    .await;
    // (Past the second its write keeps its reads on its master.)
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (m, r) = (master_of(&masters, &hot_key), replica_of(master_of(&masters, &hot_key)));
    let (m0, r0) = (gets(&m), gets(&r));
    for _ in 0..100 {
        assert_eq!(ask(&mut c, &cmd(&["GET", &hot_key])).await, "$2\r\nv1\r\n");
    }
    let (on_master, on_replica) = (gets(&m) - m0, gets(&r) - r0);
    assert!(
        on_master > 10 && on_replica > 10,
        "a hot key's reads spread: {on_master} on its master, {on_replica} on its replica"
    );
    let (m, r) = (master_of(&masters, &cold_key), replica_of(master_of(&masters, &cold_key)));
    let (m0, r0) = (gets(&m), gets(&r));
    for _ in 0..20 {
        assert_eq!(ask(&mut c, &cmd(&["GET", &cold_key])).await, "$2\r\nc1\r\n");
    }
    assert_eq!((gets(&m) - m0, gets(&r) - r0), (20, 0), "a cold key is read from its master");
    // A write of the hot key is read back at once, from its master.
    let (m, r) = (master_of(&masters, &hot_key), replica_of(master_of(&masters, &hot_key)));
    let (m0, r0) = (gets(&m), gets(&r));
    assert_eq!(ask(&mut c, &cmd(&["SET", &hot_key, "v2"])).await, "+OK\r\n");
    for _ in 0..20 {
        assert_eq!(ask(&mut c, &cmd(&["GET", &hot_key])).await, "$2\r\nv2\r\n");
    }
    assert_eq!((gets(&m) - m0, gets(&r) - r0), (20, 0), "a hot key just written is read from its master");
    drop(nodes);
    std::fs::remove_dir_all(&dir).ok();
}
