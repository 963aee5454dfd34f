//! The memcached listener against real memcached servers (Debian's `memcached`, started here on
//! free loopback ports and stopped by pid), and beside real twemproxy (`nutcracker`) on the same
//! servers: a nutcracker user switches without a flush (issue 22).

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use support::memcache::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_commands_go_to_their_keys_servers() {
    let (procs, addrs) = memcacheds(3).await;
    let gw = start_gateway(&config(&addrs, "rendezvous", "")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    // Storage and retrieval, keys spread over the three servers.
    for i in 0..30 {
        let v = format!("value-{i}");
        let r = ask(&mut c, format!("set key-{i} {i} 0 {}\r\n{v}\r\n", v.len()).as_bytes(), "\r\n").await;
        assert_eq!(r, "STORED\r\n");
    }
    // Each value is on one server only, and the proxy finds it.
    let mut per_server = vec![0; 3];
    for i in 0..30 {
        let mut holders = 0;
        for (j, a) in addrs.iter().enumerate() {
            let mut d = TcpStream::connect(a).await.expect("direct");
            if ask(&mut d, format!("get key-{i}\r\n").as_bytes(), "END\r\n").await.starts_with("VALUE") {
                holders += 1;
                per_server[j] += 1;
            }
        }
        assert_eq!(holders, 1, "key-{i}");
    }
    assert!(per_server.iter().all(|&n| n > 0), "keys on every server: {per_server:?}");
    // One multi-get across servers: every value, in the client's order (a duplicate twice, a
    // missing key left out), under one END.
    let r = ask(&mut c, b"get key-3 key-1 nope key-29 key-3 key-0\r\n", "END\r\n").await;
    let order: Vec<&str> =
        r.lines().filter_map(|l| l.strip_prefix("VALUE ")).map(|l| l.split(' ').next().unwrap_or("")).collect();
    assert_eq!(order, ["key-3", "key-1", "key-29", "key-3", "key-0"], "{r}");
    assert!(r.contains("VALUE key-29 29 8\r\nvalue-29\r\n"), "{r}");
    // gets and cas.
    let r = ask(&mut c, b"gets key-5\r\n", "END\r\n").await;
    let cas = r.lines().next().and_then(|l| l.split(' ').nth(4)).expect("a cas unique").to_owned();
    assert_eq!(ask(&mut c, format!("cas key-5 0 0 1 {cas}\r\nx\r\n").as_bytes(), "\r\n").await, "STORED\r\n");
    assert_eq!(ask(&mut c, format!("cas key-5 0 0 1 {cas}\r\ny\r\n").as_bytes(), "\r\n").await, "EXISTS\r\n");
    // add, replace, append, prepend, incr, decr, touch, delete, noreply, meta: (request, the
    // answer's last bytes, the answer).
    let exchanges: [(&[u8], &str, &str); 18] = [
        (&b"add key-5 0 0 1\r\nz\r\n"[..], "\r\n", "NOT_STORED\r\n"),
        (&b"replace key-5 0 0 2\r\nab\r\n"[..], "\r\n", "STORED\r\n"),
        (&b"append key-5 0 0 1\r\nc\r\n"[..], "\r\n", "STORED\r\n"),
        (&b"prepend key-5 0 0 1\r\n_\r\n"[..], "\r\n", "STORED\r\n"),
        (&b"get key-5\r\n"[..], "END\r\n", "VALUE key-5 0 4\r\n_abc\r\nEND\r\n"),
        (&b"set n 0 0 2\r\n10\r\n"[..], "\r\n", "STORED\r\n"),
        (&b"incr n 5\r\n"[..], "\r\n", "15\r\n"),
        (&b"decr n 20\r\n"[..], "\r\n", "0\r\n"),
        (&b"touch n 100\r\n"[..], "\r\n", "TOUCHED\r\n"),
        // memcached keeps the length a decrement shortened, padded with spaces.
        (&b"gat 100 n\r\n"[..], "END\r\n", "VALUE n 0 2\r\n0 \r\nEND\r\n"),
        (&b"delete n\r\n"[..], "\r\n", "DELETED\r\n"),
        (&b"delete n\r\n"[..], "\r\n", "NOT_FOUND\r\n"),
        // noreply: no answer, and the next answer read is the next command's.
        (
            &b"set q 0 0 1 noreply\r\nq\r\ndelete nope noreply\r\nget q\r\n"[..],
            "END\r\n",
            "VALUE q 0 1\r\nq\r\nEND\r\n",
        ),
        // meta commands, quiet mode (only what is not the common case is sent) and mn.
        (&b"ms m 2 T0\r\nhi\r\n"[..], "\r\n", "HD\r\n"),
        (&b"mg m v\r\n"[..], "hi\r\n", "VA 2\r\nhi\r\n"),
        (&b"mg missing v q\r\nmg m v q\r\nmn\r\n"[..], "MN\r\n", "VA 2\r\nhi\r\nMN\r\n"),
        (&b"md bWlzc2luZw== b q\r\nmn\r\n"[..], "MN\r\n", "NF\r\nMN\r\n"),
        // an arithmetic on a missing key with autovivify (N) starts from J.
        (&b"ma counter N0 J13 v\r\n"[..], "13\r\n", "VA 2\r\n13\r\n"),
    ];
    for (request, until, expected) in exchanges {
        assert_eq!(ask(&mut c, request, until).await, expected, "{}", String::from_utf8_lossy(request));
    }
    // Refusals, each with memcached's line; the connection stays usable.
    assert_eq!(ask(&mut c, b"bogus\r\n", "\r\n").await, "ERROR\r\n");
    assert_eq!(
        ask(&mut c, format!("get {}\r\n", "k".repeat(251)).as_bytes(), "\r\n").await,
        "CLIENT_ERROR bad command line format\r\n"
    );
    assert!(ask(&mut c, b"stats\r\n", "\r\n").await.starts_with("CLIENT_ERROR 'stats'"));
    let big = "x".repeat(5000);
    assert_eq!(
        ask(&mut c, format!("set big 0 0 5000\r\n{big}\r\n").as_bytes(), "\r\n").await,
        "SERVER_ERROR object too large for cache\r\n"
    );
    assert!(ask(&mut c, b"version\r\n", "\r\n").await.starts_with("VERSION keyroute-"));
    // Pipelined: one write, the answers in order.
    let r = ask(&mut c, b"set p1 0 0 1\r\na\r\nget p1 key-2\r\nincr p1 1\r\nmn\r\n", "MN\r\n").await;
    assert_eq!(
        r,
        "STORED\r\nVALUE p1 0 1\r\na\r\nVALUE key-2 2 7\r\nvalue-2\r\nEND\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\nMN\r\n"
    );
    assert_eq!(ask(&mut c, b"quit\r\n", "").await, "");
    drop(procs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_moves_only_its_keys_and_no_command_hangs() {
    let (mut procs, addrs) = memcacheds(3).await;
    let gw =
        start_gateway(&config(&addrs, "rendezvous", "[pool.retry]\nattempts = 3\nper_try_timeout_ms = 500\n")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..60 {
        assert_eq!(ask(&mut c, format!("set k{i} 0 0 1\r\n{}\r\n", i % 10).as_bytes(), "\r\n").await, "STORED\r\n");
    }
    // Which keys the first server holds.
    let mut d = TcpStream::connect(addrs[0]).await.expect("direct");
    let mut on_dead = Vec::new();
    for i in 0..60 {
        if ask(&mut d, format!("get k{i}\r\n").as_bytes(), "END\r\n").await.starts_with("VALUE") {
            on_dead.push(i);
        }
    }
    assert!(!on_dead.is_empty());
    drop(d);
    procs.remove(0);
    // Its keys miss (and can be set again, on the next server of their ranking); every other
    // key still hits; nothing hangs, nothing errors after the first failure is seen.
    let mut errors = 0;
    for i in 0..60 {
        let r = ask(&mut c, format!("get k{i}\r\n").as_bytes(), "\r\n").await;
        let r = if r.starts_with("VALUE") && !r.ends_with("END\r\n") {
            r + &read_until(&mut c, "END\r\n").await
        } else {
            r
        };
        if on_dead.contains(&i) {
            if r.starts_with("SERVER_ERROR") {
                errors += 1;
            } else {
                assert_eq!(r, "END\r\n", "k{i}");
            }
        } else {
            assert!(r.starts_with("VALUE"), "k{i}: {r}");
        }
    }
    assert!(errors <= 1, "{errors} errors: only a command already sent to the dead server may fail");
    for &i in &on_dead {
        assert_eq!(ask(&mut c, format!("set k{i} 0 0 1\r\nn\r\n").as_bytes(), "\r\n").await, "STORED\r\n");
        assert_eq!(
            ask(&mut c, format!("get k{i}\r\n").as_bytes(), "END\r\n").await,
            format!("VALUE k{i} 0 1\r\nn\r\nEND\r\n")
        );
    }
    // A multi-get over every key answers at once with every value.
    let all: Vec<String> = (0..60).map(|i| format!("k{i}")).collect();
    let r = ask(&mut c, format!("get {}\r\n", all.join(" ")).as_bytes(), "END\r\n").await;
    assert_eq!(r.matches("VALUE ").count(), 60);
    // A server that accepts and never answers: SERVER_ERROR within the per-try timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let gw2 =
        start_gateway(&config(&[silent_addr], "rendezvous", "[pool.retry]\nattempts = 1\nper_try_timeout_ms = 300\n"))
            .await;
    let mut c2 = TcpStream::connect(gw2.addr).await.expect("connect");
    assert_eq!(ask(&mut c2, b"get x\r\n", "\r\n").await, "SERVER_ERROR server timeout\r\n");
    assert_eq!(ask(&mut c2, b"get x y\r\n", "\r\n").await, "END\r\n", "a multi-get's silent server: misses");
    assert_eq!(ask(&mut c2, b"set x 0 0 1\r\nx\r\n", "\r\n").await, "SERVER_ERROR server timeout\r\n");
    hold.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twemproxy_user_switches_without_a_flush() {
    let (procs, addrs) = memcacheds(8).await;
    // nutcracker in front of the eight, as its users run it: ketama over md5, with weights.
    let dir = std::env::temp_dir().join(format!("keyroute-nutcracker-{}", std::process::id()));
    let port = free_port();
    let weights = [1, 2, 1, 3, 1, 1, 2, 5];
    let servers: String = addrs.iter().zip(weights).map(|(a, w)| format!("   - {a}:{w}\n")).collect();
    let yml = format!(
        "cache:\n  listen: 127.0.0.1:{port}\n  hash: md5\n  distribution: ketama\n  hash_tag: \"{{}}\"\n  timeout: 1000\n  auto_eject_hosts: false\n  servers:\n{servers}"
    );
    let _nutcracker = start_nutcracker(&dir, &yml);
    let n_addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_port(n_addr).await;
    // keyroute with the configuration `keyroute from-nutcracker` makes of the same YAML (on
    // another port, to run beside it).
    let text = keyroute_server::config::from_nutcracker(&yml, "nutcracker.yml", "127.0.0.1:0".parse().expect("addr"))
        .expect("converted")
        .replace(&format!("listen = \"{n_addr}\""), "listen = \"127.0.0.1:0\"");
    let gw = start_gateway(&text).await;
    // 10,000 keys written through nutcracker (each once, so each on nutcracker's owner only)...
    let mut n = TcpStream::connect(n_addr).await.expect("connect nutcracker");
    let keys: Vec<String> = (0..10_000)
        .map(|i| if i % 10 == 0 { format!("{{user{}}}:profile:{i}", i % 7) } else { format!("item:{i}") })
        .collect();
    for chunk in keys.chunks(500) {
        let req: String = chunk.iter().map(|k| format!("set {k} 0 0 {}\r\n{k}\r\n", k.len())).collect();
        let mut r = ask(&mut n, req.as_bytes(), "\r\n").await;
        while r.matches("\r\n").count() < chunk.len() {
            r.push_str(&read_until(&mut n, "\r\n").await);
        }
        assert_eq!(r, "STORED\r\n".repeat(chunk.len()));
    }
    // ...are every one found through keyroute: keyroute places each on nutcracker's server, and
    // no cache is lost on the day of the switch.
    let mut k_conn = TcpStream::connect(gw.addr).await.expect("connect keyroute");
    let mut differences = Vec::new();
    for chunk in keys.chunks(100) {
        let r = ask(&mut k_conn, format!("get {}\r\n", chunk.join(" ")).as_bytes(), "END\r\n").await;
        differences.extend(chunk.iter().filter(|k| !r.contains(&format!("VALUE {k} 0 {}\r\n{k}\r\n", k.len()))));
    }
    assert!(
        differences.is_empty(),
        "{} of 10,000 keys placed elsewhere than nutcracker: {:?}",
        differences.len(),
        &differences[..differences.len().min(5)]
    );
    for a in &addrs {
        let mut s = TcpStream::connect(a).await.expect("direct");
        let stats = ask(&mut s, b"stats\r\n", "END\r\n").await;
        assert!(!stats.contains("STAT curr_items 0\r\n"), "every server holds keys: {a}");
    }
    // And keyroute's writes land where nutcracker reads them.
    for k in keys.iter().take(100) {
        assert_eq!(ask(&mut k_conn, format!("set {k} 1 0 2\r\nkr\r\n").as_bytes(), "\r\n").await, "STORED\r\n");
        assert_eq!(
            ask(&mut n, format!("get {k}\r\n").as_bytes(), "END\r\n").await,
            format!("VALUE {k} 1 2\r\nkr\r\nEND\r\n")
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    drop(procs);
}

/// A server joins (handoff window of 8 s): a miss on it is answered from the key's previous
/// server and filled into it, so no cached value is lost to the join; a write during the window
/// deletes the previous server's copy, so a later miss is never filled with an older value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_server_warms_from_the_previous_owner() {
    let (_procs, addrs) = memcacheds(4).await;
    let gw = start_gateway(&config(&addrs[..3], "rendezvous", "[pool.handoff]\nwindow_ms = 8000\n")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    let keys: Vec<String> = (0..300).map(|i| format!("img-{i}")).collect();
    for k in &keys {
        assert_eq!(ask(&mut c, format!("set {k} 7 0 {}\r\n{k}\r\n", k.len()).as_bytes(), "\r\n").await, "STORED\r\n");
    }
    let body = format!(r#"{{"name":"{}","address":"{}"}}"#, addrs[3], addrs[3]);
    let (status, answer) = admin(&gw, "POST", "/workers", &body, None).await;
    assert!(status.is_success(), "{status} {answer}");
    // Halfway through the window about half of the newcomer's keys are admitted to it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    // A multi-get is warmed key by key: every value, in the client's order.
    let r = ask(&mut c, format!("get {}\r\n", keys[..150].join(" ")).as_bytes(), "END\r\n").await;
    let want: String = keys[..150].iter().map(|k| format!("VALUE {k} 7 {}\r\n{k}\r\n", k.len())).collect();
    assert_eq!(r, format!("{want}END\r\n"), "no value of a multi-get lost to the join");
    for k in &keys {
        let r = ask(&mut c, format!("get {k}\r\n").as_bytes(), "END\r\n").await;
        assert_eq!(r, format!("VALUE {k} 7 {}\r\n{k}\r\nEND\r\n", k.len()), "no value lost to the join");
    }
    // The newcomer holds the keys it was asked for: filled from their previous servers.
    let mut newcomer = TcpStream::connect(addrs[3]).await.expect("direct");
    let mut filled = Vec::new();
    for k in &keys {
        if ask(&mut newcomer, format!("get {k}\r\n").as_bytes(), "END\r\n").await.starts_with("VALUE") {
            filled.push(k.clone());
        }
    }
    assert!(!filled.is_empty(), "some keys were filled into the newcomer");
    let (_, _, metrics) = get(&client(), &format!("http://{}/metrics", gw.admin)).await;
    let fills: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("keyroute_pool_warm_fills_total{pool=\"cache\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("keyroute_pool_warm_fills_total in {metrics}"));
    assert_eq!(fills, filled.len() as u64, "each fill counted once");
    // A delete during the window reaches the copy on the previous server too: no resurrection.
    let k = &filled[0];
    assert_eq!(ask(&mut c, format!("delete {k}\r\n").as_bytes(), "\r\n").await, "DELETED\r\n");
    assert_eq!(ask(&mut c, format!("get {k}\r\n").as_bytes(), "\r\n").await, "END\r\n");
}

/// A hot key (hot-key replication on the pool): its reads spread over its replicas, a `set` goes
/// to every replica, and another write goes to one and deletes the others' copies, so that no
/// replica serves a value older than the last write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_is_read_from_its_replicas_and_its_copies_deleted_on_a_write() {
    let (_procs, addrs) = memcacheds(4).await;
    let hot = "[pool.hot_keys]\nthreshold = 200.0\nper_worker = 100.0\nmax_replicas = 4\nwindow_ms = 100\nhold_ms = 30000\nsample_every = 1\nconfidence = 1\nshow_keys = true\n";
    let gw = start_gateway(&config(&addrs, "rendezvous", hot)).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, b"set viral 0 0 2\r\nv1\r\n", "\r\n").await, "STORED\r\n");
    // A burst of reads makes it hot: pipelines of 50 gets for a second and more.
    let burst: String = (0..50).map(|_| "get viral\r\n").collect();
    let mut replicas = 0;
    for _ in 0..60 {
        c.write_all(burst.as_bytes()).await.expect("write");
        let mut answers = String::new();
        while answers.matches("END\r\n").count() < 50 {
            answers.push_str(&read_until(&mut c, "END\r\n").await);
        }
        assert_eq!(answers.matches("VALUE viral 0 2\r\nv1\r\n").count(), 50, "every read hits");
        let (_, v) = admin(&gw, "GET", "/hotkeys", "", None).await;
        replicas = v["pools"][0]["keys"]
            .as_array()
            .and_then(|ks| ks.iter().find(|k| k["key"] == "viral"))
            .and_then(|k| k["replicas"].as_u64())
            .unwrap_or(0);
        if replicas > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(replicas > 1, "the key became hot with replicas");
    let holders = |value: &'static str| {
        let addrs = addrs.clone();
        async move {
            let mut n = 0;
            for a in &addrs {
                let mut d = TcpStream::connect(a).await.expect("direct");
                if ask(&mut d, b"get viral\r\n", "END\r\n").await.contains(value) {
                    n += 1;
                }
            }
            n
        }
    };
    // Reads spread: the replicas fill from the owner, each copy for 10 s at most.
    for _ in 0..20 {
        assert_eq!(ask(&mut c, b"get viral\r\n", "END\r\n").await, "VALUE viral 0 2\r\nv1\r\nEND\r\n");
    }
    assert!(holders("v1").await > 1, "copies on the replicas");
    let mut ttls = Vec::new();
    for a in &addrs {
        let mut d = TcpStream::connect(a).await.expect("direct");
        let r = ask(&mut d, b"mg viral t\r\n", "\r\n").await;
        if let Some(t) = r.strip_prefix("HD t") {
            ttls.push(t.trim().parse::<i64>().expect("ttl"));
        }
    }
    assert_eq!(ttls.iter().filter(|&&t| t == -1).count(), 1, "the owner's value never expires: {ttls:?}");
    assert!(ttls.iter().all(|&t| t == -1 || (0..=10).contains(&t)), "copies live 10 s at most: {ttls:?}");
    // A set goes to the owner and deletes every copy (copies are made only from the owner).
    assert_eq!(ask(&mut c, b"set viral 0 0 2\r\nv2\r\n", "\r\n").await, "STORED\r\n");
    assert_eq!(holders("v2").await, 1, "the owner holds the new value");
    assert_eq!(holders("v1").await, 0, "no copy of the old value is left");
    // Reads through the proxy all see it, whichever replica serves them.
    for _ in 0..20 {
        assert_eq!(ask(&mut c, b"get viral\r\n", "END\r\n").await, "VALUE viral 0 2\r\nv2\r\nEND\r\n");
    }
    // An append changes one copy and deletes the others: no replica keeps "v2".
    assert_eq!(ask(&mut c, b"append viral 0 0 1\r\n!\r\n", "\r\n").await, "STORED\r\n");
    assert_eq!(holders("v2!").await, 1);
    assert_eq!(holders("VALUE viral 0 2\r\n").await, 0, "no replica serves the value before the append");
    // Reads keep hitting: a replica's miss is filled from the owner. Pipelined, so that the
    // owner has reads in flight and the steering rule sends the next ones to the least loaded
    // replicas (one read at a time always finds the owner idle, and goes there).
    for _ in 0..5 {
        c.write_all(burst.as_bytes()).await.expect("write");
        let mut answers = String::new();
        while answers.matches("END\r\n").count() < 50 {
            answers.push_str(&read_until(&mut c, "END\r\n").await);
        }
        assert_eq!(answers.matches("VALUE viral 0 3\r\nv2!\r\nEND\r\n").count(), 50, "every read hits: {answers}");
    }
    assert!(holders("v2!").await > 1, "replicas filled again from the owner");
}

/// `keyroute move` for memcached (issue 22): three servers become four; the keys whose owner
/// changed are found by `lru_crawler metadump`, added on their new owner with their flags and
/// TTL, and deleted from the old one; the moves equal the dry run's plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyroute_move_moves_memcached_keys_to_their_new_owners() {
    use keyroute_server::relocate::{self, Layout, Options, Store};
    let (_procs, addrs) = memcacheds(4).await;
    let old_text = config(&addrs[..3], "rendezvous", "");
    let new_text = config(&addrs, "rendezvous", "");
    let n = 1200;
    let value = |i: usize| format!("value-{i}-{}", "x".repeat(i % 50));
    {
        let gw = start_gateway(&old_text).await;
        let mut c = TcpStream::connect(gw.addr).await.expect("connect");
        let mut req = Vec::new();
        for i in 0..n {
            let ttl = if i % 4 == 0 { 3000 } else { 0 };
            let v = value(i);
            req.extend_from_slice(format!("set mv:{i} {i} {ttl} {}\r\n{v}\r\n", v.len()).as_bytes());
        }
        req.extend_from_slice(b"mn\r\n");
        let r = ask(&mut c, &req, "MN\r\n").await;
        assert_eq!(r.matches("STORED\r\n").count(), n, "every set stored");
        gw.handle.shutdown();
    }
    let old = keyroute_server::Config::parse(&old_text, "old.toml").expect("old");
    let new = keyroute_server::Config::parse(&new_text, "new.toml").expect("new");
    let (from, to) = (Layout::of(&old.pools, "cache").expect("from"), Layout::of(&new.pools, "cache").expect("to"));
    let store = Store::of(new.cache_listeners(), "cache").expect("a memcached pool");
    let options = Options { batch: 64, ..Options::default() };
    let plan = relocate::plan(&store, &from, &to, &options).await.expect("plan");
    assert_eq!(plan.scanned, n as u64);
    assert!(plan.pairs.iter().all(|p| p.to == addrs[3].to_string()), "rendezvous moves keys to the joiner only");
    assert!((150..=500).contains(&plan.keys()), "{} keys move", plan.keys());
    let report = relocate::run(&store, &from, &to, &options, |_| {}).await.expect("move");
    let planned: Vec<(String, String, u64)> =
        plan.pairs.iter().map(|p| (p.from.clone(), p.to.clone(), p.keys)).collect();
    let moved: Vec<(String, String, u64)> =
        report.pairs.iter().map(|p| (p.from.clone(), p.to.clone(), p.keys)).collect();
    assert_eq!(moved, planned);
    assert_eq!((report.superseded, report.vanished, report.failed, report.misplaced), (0, 0, 0, 0));
    assert!(report.complete);
    // Each server holds exactly the keys it owns, with their values, flags and TTLs.
    let gw = start_gateway(&new_text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..n {
        let r = ask(&mut c, format!("mg mv:{i} v f t\r\n").as_bytes(), "\r\n").await;
        let r = if r.starts_with("VA") && !r.ends_with(&format!("{}\r\n", value(i))) {
            format!("{r}{}", read_until(&mut c, "\r\n").await)
        } else {
            r
        };
        let head = r.lines().next().unwrap_or_default().to_owned();
        let v = value(i);
        assert!(head.starts_with(&format!("VA {} f{i} ", v.len())), "mv:{i}: {r:?}");
        assert!(r.ends_with(&format!("\r\n{v}\r\n")), "mv:{i}: {r:?}");
        let ttl: i64 = head.rsplit(" t").next().and_then(|t| t.parse().ok()).expect("a TTL");
        if i % 4 == 0 {
            assert!((2900..=3000).contains(&ttl), "mv:{i} kept its TTL: {ttl}");
        } else {
            assert_eq!(ttl, -1, "mv:{i} never expires");
        }
    }
    let mut total = 0;
    for a in &addrs {
        let mut s = TcpStream::connect(a).await.expect("direct");
        let stats = ask(&mut s, b"stats\r\n", "END\r\n").await;
        total += stats
            .lines()
            .find_map(|l| l.strip_prefix("STAT curr_items "))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .expect("curr_items");
    }
    assert_eq!(total, n, "every key once");
}

/// A server that takes commands and answers nothing is stalled as an HTTP worker is (issue 22):
/// once commands have waited on it for the pool's stall window, it shows as `stalled` and new
/// commands for its keys go to the next server at once, not after the per-try timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_answers_nothing_is_stalled_and_routed_around() {
    let (_procs, addrs) = memcacheds(1).await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let extra = "[pool.retry]\nattempts = 2\nper_try_timeout_ms = 8000\n[pool.passive]\nstall_ms = 300\n";
    let gw = start_gateway(&config(&[addrs[0], silent_addr], "rendezvous", extra)).await;
    // A key the silent server owns.
    let mut key = None;
    for i in 0..100 {
        let (_, v) = admin(&gw, "GET", &format!("/placement?key=s{i}"), "", None).await;
        if v["owner"] == silent_addr.to_string() {
            key = Some(format!("s{i}"));
            break;
        }
    }
    let key = key.expect("a key on the silent server");
    // The key's value on the next server of its ranking (the only other one), set directly: a
    // proxy that asked it answers with the value; one that asked nobody could only say END.
    let mut direct = TcpStream::connect(addrs[0]).await.expect("direct");
    assert_eq!(ask(&mut direct, format!("set {key} 7 0 4\r\nnext\r\n").as_bytes(), "\r\n").await, "STORED\r\n");
    let mut waiting = TcpStream::connect(gw.addr).await.expect("connect");
    waiting.write_all(format!("get {key}\r\n").as_bytes()).await.expect("write");
    // Stalled once the stall window passes with the command waiting (polled, not slept on).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while worker_info(&gw, &silent_addr.to_string()).await["state"] != "stalled" {
        assert!(std::time::Instant::now() < deadline, "never stalled with a command waiting");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    let started = std::time::Instant::now();
    let got = ask(&mut c, format!("get {key}\r\n").as_bytes(), "END\r\n").await;
    assert_eq!(got, format!("VALUE {key} 7 4\r\nnext\r\nEND\r\n"), "answered by the next server");
    assert!(started.elapsed() < Duration::from_secs(4), "routed around at once, not after the 8 s timeout");
    hold.abort();
}

/// Clients share the proxy's server connections (issue 22): 24 clients pipelining sets and
/// multi-gets at once, each of its own keys, each get every answer of its own and no other's; the
/// servers see a few connections from the proxy, not one per client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_share_server_connections_and_each_gets_its_own_answers() {
    let (_procs, addrs) = memcacheds(3).await;
    let gw = start_gateway(&config(&addrs, "rendezvous", "")).await;
    let mut tasks = tokio::task::JoinSet::new();
    // The clients stay connected until the servers' connections are counted: a proxy that gave
    // each client its own server connections would hold 24 of them then (and none once they left).
    let (all_done, release) = (Arc::new(tokio::sync::Barrier::new(25)), Arc::new(tokio::sync::Barrier::new(25)));
    for client in 0..24 {
        let addr = gw.addr;
        let (all_done, release) = (Arc::clone(&all_done), Arc::clone(&release));
        tasks.spawn(async move {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            for round in 0..40 {
                let keys: Vec<String> = (0..12).map(|i| format!("c{client}:r{round}:k{i}")).collect();
                let mut req = String::new();
                for (i, k) in keys.iter().enumerate() {
                    let v = format!("{client}-{round}-{i}");
                    req.push_str(&format!("set {k} {client} 0 {}\r\n{v}\r\n", v.len()));
                }
                req.push_str(&format!("get {}\r\n", keys.join(" ")));
                for k in keys.iter().take(3) {
                    req.push_str(&format!("get {k}\r\n"));
                }
                let mut r = ask(&mut c, req.as_bytes(), "END\r\n").await;
                while r.matches("END\r\n").count() < 4 {
                    r.push_str(&read_until(&mut c, "END\r\n").await);
                }
                let mut want = "STORED\r\n".repeat(keys.len());
                for (i, k) in keys.iter().enumerate() {
                    let v = format!("{client}-{round}-{i}");
                    want.push_str(&format!("VALUE {k} {client} {}\r\n{v}\r\n", v.len()));
                }
                want.push_str("END\r\n");
                for (i, k) in keys.iter().enumerate().take(3) {
                    let v = format!("{client}-{round}-{i}");
                    want.push_str(&format!("VALUE {k} {client} {}\r\n{v}\r\nEND\r\n", v.len()));
                }
                assert_eq!(r, want, "client {client} round {round}");
            }
            all_done.wait().await;
            release.wait().await;
            drop(c);
        });
    }
    all_done.wait().await;
    // A few connections per server (one per proxy thread), not 24, with the 24 clients connected.
    for a in &addrs {
        let mut s = TcpStream::connect(a).await.expect("direct");
        let stats = ask(&mut s, b"stats\r\n", "END\r\n").await;
        let conns: usize = stats
            .lines()
            .find_map(|l| l.strip_prefix("STAT curr_connections "))
            .and_then(|v| v.trim().parse().ok())
            .expect("curr_connections");
        // memcached counts its listener, this connection, and the proxy's (one per proxy thread,
        // and an active check's, which lasts one `version`).
        assert!(conns <= 2 + 4 + 1, "{a}: {conns} connections with 24 clients connected");
    }
    release.wait().await;
    while let Some(done) = tasks.join_next().await {
        done.expect("a client");
    }
}

/// A silent server holds up only the commands sent to it (issue 22): a client whose batch waits
/// on a server that answers nothing has read its answers from the others, so the clients that
/// share those server connections with it are answered at once, not after its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_holds_up_only_its_own_commands() {
    let (_procs, addrs) = memcacheds(1).await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let extra = "[pool.retry]\nattempts = 1\nper_try_timeout_ms = 4000\n[pool.passive]\nstall_ms = 0\n";
    let gw = start_gateway(&config(&[addrs[0], silent_addr], "rendezvous", extra)).await;
    let owner = async |key: &str| {
        let (_, v) = admin(&gw, "GET", &format!("/placement?key={key}"), "", None).await;
        v["owner"].as_str().unwrap_or_default().to_owned()
    };
    let (mut on_live, mut on_silent) = (None, None);
    for i in 0..100 {
        let k = format!("h{i}");
        if owner(&k).await == silent_addr.to_string() {
            on_silent.get_or_insert(k);
        } else {
            on_live.get_or_insert(k);
        }
    }
    let (live, dead) = (on_live.expect("a live key"), on_silent.expect("a silent key"));
    // Clients that use the live server, one before the stuck batch (so the connections exist).
    let mut clients = Vec::new();
    for _ in 0..8 {
        let mut c = TcpStream::connect(gw.addr).await.expect("connect");
        assert_eq!(ask(&mut c, format!("get {live}\r\n").as_bytes(), "END\r\n").await, "END\r\n");
        clients.push(c);
    }
    // Stuck clients: a live key, then a silent one, in one batch.
    let mut stuck = Vec::new();
    for _ in 0..4 {
        let mut c = TcpStream::connect(gw.addr).await.expect("connect");
        c.write_all(format!("get {live}\r\nget {dead}\r\n").as_bytes()).await.expect("write");
        stuck.push(c);
    }
    // Their commands are at the silent server (the proxy counts them in flight there).
    eventually(Duration::from_secs(3), "the stuck batches sent", || async {
        worker_info(&gw, &silent_addr.to_string()).await["in_flight"].as_u64().unwrap_or(0) >= 4
    })
    .await;
    let started = std::time::Instant::now();
    for c in &mut clients {
        assert_eq!(ask(c, format!("get {live}\r\n").as_bytes(), "END\r\n").await, "END\r\n");
    }
    assert!(started.elapsed() < Duration::from_secs(2), "the live server's clients waited {:?}", started.elapsed());
    for c in &mut stuck {
        let r = read_until(c, "\r\n").await;
        let r = if r == "END\r\n" { r + &read_until(c, "\r\n").await } else { r };
        // The first to time out poisons the shared connection: the others' answer is lost with it.
        assert!(
            r == "END\r\nSERVER_ERROR server timeout\r\n" || r == "END\r\nSERVER_ERROR server connection lost\r\n",
            "{r:?}"
        );
    }
    hold.abort();
}

/// Reads what arrives within `quiet` of silence (or the connection's end): the whole answer to
/// a pipeline whose length is not known in advance. `true` with it when the peer closed.
async fn read_all_quiet(s: &mut TcpStream, quiet: Duration) -> (String, bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout(quiet, s.read(&mut chunk)).await {
            Err(_) => return (String::from_utf8_lossy(&buf).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&buf).into_owned(), true),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Issue 31 (2, 3): a storage command the proxy refuses still has its data block taken as
/// data, as memcached takes it, so the block never runs as a command; a block that does not
/// end where its length says is `CLIENT_ERROR bad data chunk` and the connection carries on;
/// a length that cannot be trusted is `CLIENT_ERROR` and the connection closes (nothing after
/// it can be framed). Each pipeline is sent to the proxy and to memcached itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_value_is_skipped_never_run_as_a_command() {
    let (_procs, addrs) = memcacheds(1).await;
    let gw = start_gateway(&config(&addrs, "rendezvous", "")).await;
    let quiet = Duration::from_millis(300);
    // The issue's exploit: the refused block is `delete v`.
    for refused in ["set a\x01b 0 0 8", "set a 4294967296 0 8", "set a 0 0 8 noreplyx", "cas a 0 0 8", "ms a 8 9"] {
        let mut c = TcpStream::connect(gw.addr).await.expect("connect");
        let pipeline = format!("set v 0 0 1\r\n1\r\n{refused}\r\ndelete v\r\nget v\r\n");
        c.write_all(pipeline.as_bytes()).await.expect("write");
        let (got, closed) = read_all_quiet(&mut c, quiet).await;
        assert_eq!(
            got,
            "STORED\r\nCLIENT_ERROR bad command line format\r\nVALUE v 0 1\r\n1\r\nEND\r\n",
            "{}",
            refused.escape_debug()
        );
        assert!(!closed, "{}: the connection carries on", refused.escape_debug());
    }
    // A block longer than its length: memcached's answers, line for line (the two bytes past
    // the declared ones are taken as the block's end; the CRLF left is an empty command).
    let pipeline = b"set k 0 0 1\r\nxyz\r\nset k2 0 0 1\r\nq\r\nget k2\r\n";
    let mut direct = TcpStream::connect(addrs[0]).await.expect("direct");
    direct.write_all(pipeline).await.expect("write");
    let (memcached, _) = read_all_quiet(&mut direct, quiet).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    c.write_all(pipeline).await.expect("write");
    let (proxy, closed) = read_all_quiet(&mut c, quiet).await;
    assert!(memcached.starts_with("CLIENT_ERROR bad data chunk\r\n"), "{memcached:?}");
    assert_eq!(proxy, memcached);
    assert!(!closed);
    // A length past what memcached takes: refused, and the connection closes before the 4 GB
    // it names (or any of its bytes) are read as anything.
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    c.write_all(b"set k 0 0 4294967296\r\ndelete v\r\n").await.expect("write");
    let (got, closed) = read_all_quiet(&mut c, Duration::from_secs(5)).await;
    assert_eq!(got, "CLIENT_ERROR bad command line format\r\n");
    assert!(closed, "the connection closes");
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, b"get v\r\n", "END\r\n").await, "VALUE v 0 1\r\n1\r\nEND\r\n", "nothing deleted v");
}

/// The replica count `/hotkeys` reports for `key` (0: not hot).
async fn hot_replicas(gw: &Gw, key: &str) -> u64 {
    let (_, v) = admin(gw, "GET", "/hotkeys", "", None).await;
    v["pools"][0]["keys"]
        .as_array()
        .and_then(|ks| ks.iter().find(|k| k["key"] == key))
        .and_then(|k| k["replicas"].as_u64())
        .unwrap_or(0)
}

/// How many of `addrs` hold `key` with the value `value` (`None`: hold it at all), asked
/// directly.
async fn holding(addrs: &[SocketAddr], key: &str, value: Option<&str>) -> usize {
    let mut n = 0;
    for a in addrs {
        let mut d = TcpStream::connect(a).await.expect("direct");
        let r = ask(&mut d, format!("get {key}\r\n").as_bytes(), "END\r\n").await;
        if r.starts_with("VALUE") && value.is_none_or(|v| r.contains(&format!("\r\n{v}\r\n"))) {
            n += 1;
        }
    }
    n
}

/// Issue 31 (9a): a copy made while a key was hot is deleted by a write after its hot period
/// ended, so when the key is hot again no read returns the value before the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_after_the_hot_period_reaches_every_copy() {
    let (_procs, addrs) = memcacheds(4).await;
    let hot = "[pool.hot_keys]\nthreshold = 200.0\nper_worker = 100.0\nmax_replicas = 4\nwindow_ms = 100\nhold_ms = 200\nsample_every = 1\nconfidence = 1\nshow_keys = true\n";
    let gw = start_gateway(&config(&addrs, "rendezvous", hot)).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, b"set viral 0 0 2\r\nv1\r\n", "\r\n").await, "STORED\r\n");
    let burst: String = (0..50).map(|_| "get viral\r\n").collect();
    let read_burst = async |c: &mut TcpStream| {
        c.write_all(burst.as_bytes()).await.expect("write");
        let mut answers = String::new();
        while answers.matches("END\r\n").count() < 50 {
            answers.push_str(&read_until(c, "END\r\n").await);
        }
        answers
    };
    for _ in 0..100 {
        assert_eq!(read_burst(&mut c).await.matches("VALUE viral 0 2\r\nv1\r\n").count(), 50);
        if hot_replicas(&gw, "viral").await > 1 && holding(&addrs, "viral", Some("v1")).await > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(holding(&addrs, "viral", Some("v1")).await > 1, "copies on the replicas");
    for _ in 0..100 {
        if hot_replicas(&gw, "viral").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(hot_replicas(&gw, "viral").await, 0, "the hot period is over");
    assert_eq!(ask(&mut c, b"set viral 0 0 2\r\nv2\r\n", "\r\n").await, "STORED\r\n");
    assert_eq!(holding(&addrs, "viral", Some("v1")).await, 0, "no copy of the value before the write is left");
    for _ in 0..30 {
        let answers = read_burst(&mut c).await;
        assert_eq!(answers.matches("VALUE viral 0 2\r\nv2\r\n").count(), 50, "{answers}");
    }
    // A delete after the hot period reaches every copy too.
    for _ in 0..100 {
        if hot_replicas(&gw, "viral").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ask(&mut c, b"delete viral\r\n", "\r\n").await, "DELETED\r\n");
    assert_eq!(holding(&addrs, "viral", None).await, 0, "no copy outlives the delete");
}

/// Issue 31 (9b): a replica's fill never lands after a later write: one client reads a hot key
/// as fast as it can while another sets and deletes it; once a delete is acknowledged no server
/// holds the key, and no read after an acknowledged set returns an older value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_never_lands_after_a_later_write() {
    let (_procs, addrs) = memcacheds(4).await;
    let hot = "[pool.hot_keys]\nthreshold = 200.0\nper_worker = 100.0\nmax_replicas = 4\nwindow_ms = 100\nhold_ms = 30000\nsample_every = 1\nconfidence = 1\nshow_keys = true\n";
    let gw = start_gateway(&config(&addrs, "rendezvous", hot)).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, b"set viral 0 0 2\r\nv0\r\n", "\r\n").await, "STORED\r\n");
    let burst: String = (0..50).map(|_| "get viral\r\n").collect();
    async fn read_burst(c: &mut TcpStream, burst: &str) {
        c.write_all(burst.as_bytes()).await.expect("write");
        let mut answers = String::new();
        while answers.matches("END\r\n").count() < 50 {
            answers.push_str(&read_until(c, "\r\n").await);
            assert!(!answers.contains("ERROR"), "{answers}");
        }
    }
    for _ in 0..100 {
        read_burst(&mut c, &burst).await;
        if hot_replicas(&gw, "viral").await > 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(hot_replicas(&gw, "viral").await > 2, "the key is hot");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = tokio::spawn({
        let stop = std::sync::Arc::clone(&stop);
        async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                read_burst(&mut c, &burst).await;
            }
        }
    });
    let mut w = TcpStream::connect(gw.addr).await.expect("connect");
    let mut check = TcpStream::connect(gw.addr).await.expect("connect");
    let (mut resurrected, mut stale) = (0, 0);
    for i in 10..30 {
        let v = format!("v{i}");
        assert_eq!(ask(&mut w, format!("set viral 0 0 3\r\n{v}\r\n").as_bytes(), "\r\n").await, "STORED\r\n");
        for _ in 0..5 {
            if ask(&mut check, b"get viral\r\n", "END\r\n").await != format!("VALUE viral 0 3\r\n{v}\r\nEND\r\n") {
                stale += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(ask(&mut w, b"delete viral\r\n", "\r\n").await, "DELETED\r\n");
        resurrected += holding(&addrs, "viral", None).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    reader.await.expect("join");
    assert_eq!(
        (resurrected, stale),
        (0, 0),
        "copies back after an acknowledged delete, reads older than an acknowledged set"
    );
}

/// Issue 31 (7): `keyroute move` with `[pool.handoff]` on the pool, as the README says: the proxy
/// sends every key whose owner joined to it at once and moves it there before any command runs
/// on it, and the move moves the rest, so they agree on where a key lives. Counters incremented
/// through the proxy during the move all read back afterwards, each with every acknowledged
/// increment, and none is left on a server that does not own it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_under_the_handoff_hides_no_key_and_loses_no_increment() {
    use keyroute_server::relocate::{self, Layout, Options, Store};
    let (_procs, addrs) = memcacheds(4).await;
    let handoff = "[pool.handoff]\nwindow_ms = 60000\n";
    let old_text = config(&addrs[..3], "rendezvous", handoff);
    let new_text = config(&addrs, "rendezvous", handoff);
    let n = 1000;
    let gw = start_gateway(&old_text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    let mut req = Vec::new();
    for i in 0..n {
        req.extend_from_slice(format!("set ctr:{i} 0 0 1\r\n0\r\n").as_bytes());
    }
    req.extend_from_slice(b"mn\r\n");
    assert_eq!(ask(&mut c, &req, "MN\r\n").await.matches("STORED\r\n").count(), n);
    // The proxy switches first: the fourth server joins, within its handoff window.
    let body = format!(r#"{{"name":"{}","address":"{}"}}"#, addrs[3], addrs[3]);
    let (status, answer) = admin(&gw, "POST", "/workers", &body, None).await;
    assert!(status.is_success(), "{status} {answer}");
    let old = keyroute_server::Config::parse(&old_text, "old.toml").expect("old");
    let new = keyroute_server::Config::parse(&new_text, "new.toml").expect("new");
    let (from, to) = (Layout::of(&old.pools, "cache").expect("from"), Layout::of(&new.pools, "cache").expect("to"));
    let store = Store::of(new.cache_listeners(), "cache").expect("a memcached pool");
    let options = Options { batch: 32, ..Options::default() };
    let mover = tokio::spawn(async move { relocate::run(&store, &from, &to, &options, |_| {}).await });
    // Increments through the proxy while the move runs: each acknowledged one is counted.
    let mut expected = vec![0u64; n];
    for round in 0..3 {
        let mut req = Vec::new();
        for i in (round..n).step_by(3) {
            req.extend_from_slice(format!("incr ctr:{i} 1\r\n").as_bytes());
        }
        req.extend_from_slice(b"mn\r\n");
        let r = ask(&mut c, &req, "MN\r\n").await;
        for (line, i) in r.lines().zip((round..n).step_by(3)) {
            if line.parse::<u64>().is_ok() {
                expected[i] += 1;
            }
        }
    }
    let report = mover.await.expect("join").expect("move");
    assert!(report.complete);
    assert_eq!((report.failed, report.misplaced), (0, 0), "{report:?}");
    let (mut missing, mut wrong) = (0, 0);
    for (i, want) in expected.iter().enumerate() {
        let r = ask(&mut c, format!("get ctr:{i}\r\n").as_bytes(), "END\r\n").await;
        match r.lines().nth(1) {
            None => missing += 1,
            Some(v) if v != want.to_string() => wrong += 1,
            Some(_) => {}
        }
    }
    assert_eq!((missing, wrong), (0, 0), "counters missing or with lost increments");
    assert!(expected.iter().sum::<u64>() > 0, "increments were acknowledged");
}

/// Issue 31 (11): every command a client finished sending before the gateway stops is answered,
/// and the gateway ends cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_answers_every_command_already_sent() {
    let (_procs, addrs) = memcacheds(2).await;
    let text = format!("shutdown_grace_ms = 10000\n{}", config(&addrs, "rendezvous", ""));
    let config = keyroute_server::Config::parse(&text, "t.toml").expect("valid");
    let gw = keyroute_server::Gateway::bind(config).await.expect("bind");
    let (addr, handle) = (gw.local_addrs()[0], gw.handle());
    let run = tokio::spawn(gw.run(std::future::pending()));
    let mut c = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(ask(&mut c, b"set warm 0 0 1\r\n1\r\n", "\r\n").await, "STORED\r\n");
    let n = 20_000;
    let pipeline: String = (0..n).map(|i| format!("set stop:{i} 0 0 1\r\nv\r\n")).collect();
    c.write_all(pipeline.as_bytes()).await.expect("write");
    handle.shutdown();
    let (got, closed) = read_to_close(&mut c).await;
    assert_eq!(got.matches("STORED\r\n").count(), n, "every command sent before the stop is answered");
    assert!(closed, "then the connection closes");
    let result = tokio::time::timeout(Duration::from_secs(15), run).await.expect("stops").expect("join");
    assert!(result.is_ok(), "nothing was cut: {result:?}");
}

/// Issue 31 (11): a command waiting on a paused server, and one after it to another server, both
/// sent before the stop: each is answered (the first with the timeout's error) and the gateway
/// ends cleanly; when the grace period ends first, the exit says commands were cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_behind_a_paused_server_answers_or_says_it_cut() {
    let (procs, addrs) = memcacheds(2).await;
    // Keys owned by each server: stored through the proxy, then found on the server.
    let owned_by = |grace: u64, per_try: u64| {
        format!(
            "shutdown_grace_ms = {grace}\n{}",
            config(&addrs, "rendezvous", &format!("[pool.retry]\nattempts = 1\nper_try_timeout_ms = {per_try}\n"))
        )
    };
    let probe = start_gateway(&owned_by(1000, 1000)).await;
    let mut c = TcpStream::connect(probe.addr).await.expect("connect");
    let mut owner_of = Vec::new();
    for i in 0..20 {
        assert_eq!(ask(&mut c, format!("set pk{i} 0 0 1\r\nv\r\n").as_bytes(), "\r\n").await, "STORED\r\n");
        let mut d = TcpStream::connect(addrs[0]).await.expect("direct");
        let on_first = ask(&mut d, format!("get pk{i}\r\n").as_bytes(), "END\r\n").await.starts_with("VALUE");
        owner_of.push(if on_first { 0 } else { 1 });
    }
    let (Some(a), Some(b)) = (owner_of.iter().position(|&o| o == 0), owner_of.iter().position(|&o| o == 1)) else {
        panic!("both servers own keys: {owner_of:?}");
    };
    let pid = procs[0].0.id().to_string();
    let signal = |s: &str| {
        let ok = Command::new("kill").args([s, &pid]).status().expect("kill").success();
        assert!(ok, "kill {s}");
    };
    for (grace, per_try, cut) in [(10_000, 600, false), (300, 5_000, true)] {
        let config = keyroute_server::Config::parse(&owned_by(grace, per_try), "t.toml").expect("valid");
        let gw = keyroute_server::Gateway::bind(config).await.expect("bind");
        let (addr, handle) = (gw.local_addrs()[0], gw.handle());
        let run = tokio::spawn(gw.run(std::future::pending()));
        let mut c = TcpStream::connect(addr).await.expect("connect");
        assert!(ask(&mut c, b"version\r\n", "\r\n").await.starts_with("VERSION"));
        signal("-STOP");
        c.write_all(format!("get pk{a}\r\n").as_bytes()).await.expect("write");
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.write_all(format!("set pk{b} 0 0 2\r\nv2\r\n").as_bytes()).await.expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        handle.shutdown();
        let (got, _) = read_to_close(&mut c).await;
        let result = tokio::time::timeout(Duration::from_secs(15), run).await.expect("stops").expect("join");
        signal("-CONT");
        if cut {
            assert!(
                matches!(result, Err(keyroute_server::GatewayError::GraceExpired { .. })),
                "a cut command shows in the exit: {result:?}"
            );
        } else {
            assert!(result.is_ok(), "nothing was cut: {result:?}");
            assert!(got.starts_with("SERVER_ERROR"), "the paused server's command gets its error: {got:?}");
            assert!(got.ends_with("STORED\r\n"), "the second command is answered: {got:?}");
        }
    }
}

/// Reads until the server closes the connection (at most 20 s): what came, and whether it closed.
async fn read_to_close(c: &mut TcpStream) -> (String, bool) {
    let mut got = Vec::new();
    let mut chunk = [0u8; 65536];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, c.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
            Ok(Ok(k)) => got.extend_from_slice(&chunk[..k]),
        }
    }
}

/// A server's `STAT name` value, asked directly.
/// Issue 32 (drift): a cache server's ejection is counted once in `ejections`, as an HTTP
/// worker's is (the cache path counted it again after the worker's own machine had).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_servers_ejection_is_counted_once() {
    let (mut procs, addrs) = memcacheds(3).await;
    let extra = "[pool.passive]\nconsecutive_failures = 2\nbase_ejection_ms = 60000\n";
    let gw = start_gateway(&config(&addrs, "rendezvous", extra)).await;
    drop(procs.remove(0));
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..60 {
        let r = ask(&mut c, format!("get e{i}\r\n").as_bytes(), "\r\n").await;
        assert!(r == "END\r\n" || r.starts_with("SERVER_ERROR"), "{r}");
    }
    let dead = worker_info(&gw, &addrs[0].to_string()).await;
    assert_eq!(dead["state"], "ejected", "{dead}");
    assert_eq!(dead["ejections"], 1, "one ejection, counted once: {dead}");
}

/// Issue 32 (drift): a cache listener's placements are counted by the steering rule's own reason,
/// as the HTTP gateway counts them: keys held back from a warming server are `warming`, not
/// `unavailable` (no server is down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_placements_are_counted_by_why_they_spilled() {
    let (_procs, addrs) = memcacheds(4).await;
    let extra = "[pool.slow_start]\nwindow_ms = 600000\nmin_share = 0.0\n";
    let gw = start_gateway(&config(&addrs[..3], "rendezvous", extra)).await;
    let add = format!(r#"{{"name":"{a}","address":"{a}"}}"#, a = addrs[3]);
    let (status, v) = admin(&gw, "POST", "/workers", &add, None).await;
    assert_eq!(status, http::StatusCode::CREATED, "{v}");
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..400 {
        assert_eq!(ask(&mut c, format!("get w{i}\r\n").as_bytes(), "END\r\n").await, "END\r\n");
    }
    let p = gw.handle.placements("cache").expect("pool");
    assert!(p.warming > 50, "keys of the warming server are counted as warming: {p:?}");
    assert_eq!(p.unavailable, 0, "no server is unavailable: {p:?}");
    assert_eq!(p.owner + p.warming, 400, "{p:?}");
}

/// Issue 32 (drift): a hot key's reads are placed by the one steering rule that places an HTTP
/// request for it, on the load of the commands in flight: read one at a time, they find the owner
/// idle and go there (round robin sent two in three to the replicas); pipelined, they spread
/// over the replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_key_reads_follow_the_steering_rule() {
    let (_procs, addrs) = memcacheds(3).await;
    let hot = "[pool.hot_keys]\nthreshold = 200.0\nper_worker = 100.0\nmax_replicas = 3\nwindow_ms = 100\nhold_ms = 60000\nsample_every = 1\nconfidence = 1\nshow_keys = true\n";
    let gw = start_gateway(&config(&addrs, "rendezvous", hot)).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, b"set steer 0 0 2\r\nv1\r\n", "\r\n").await, "STORED\r\n");
    async fn pipelined(c: &mut TcpStream) {
        let burst: String = (0..50).map(|_| "get steer\r\n").collect();
        c.write_all(burst.as_bytes()).await.expect("write");
        let mut answers = String::new();
        while answers.matches("END\r\n").count() < 50 {
            answers.push_str(&read_until(c, "END\r\n").await);
        }
        assert_eq!(answers.matches("VALUE steer 0 2\r\nv1\r\n").count(), 50);
    }
    let mut replicas = 0;
    for _ in 0..60 {
        pipelined(&mut c).await;
        let (_, v) = admin(&gw, "GET", "/hotkeys", "", None).await;
        replicas = v["pools"][0]["keys"]
            .as_array()
            .and_then(|ks| ks.iter().find(|k| k["key"] == "steer"))
            .and_then(|k| k["replicas"].as_u64())
            .unwrap_or(0);
        if replicas == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(replicas, 3, "the key became hot on every server");
    let gets = |addrs: Vec<SocketAddr>| async move {
        let mut v = Vec::new();
        for a in addrs {
            v.push(stat(a, "cmd_get").await);
        }
        v
    };
    let before = gets(addrs.clone()).await;
    for _ in 0..30 {
        assert_eq!(ask(&mut c, b"get steer\r\n", "END\r\n").await, "VALUE steer 0 2\r\nv1\r\nEND\r\n");
    }
    let after = gets(addrs.clone()).await;
    let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(
        delta.iter().filter(|&&d| d > 0).count(),
        1,
        "one at a time, every read goes to the idle owner: {delta:?}"
    );
    assert_eq!(delta.iter().sum::<u64>(), 30, "{delta:?}");
    pipelined(&mut c).await;
    let spread = gets(addrs.clone()).await;
    let delta: Vec<u64> = spread.iter().zip(&after).map(|(a, b)| a - b).collect();
    assert!(delta.iter().filter(|&&d| d > 0).count() > 1, "pipelined reads spread over the replicas: {delta:?}");
}

/// Issue 32: a cache pool has active health checks (memcached `version`), with the states and
/// metrics of HTTP probes: a paused server goes unhealthy with no traffic at all, and comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_pool_is_probed_in_its_protocol() {
    let (procs, addrs) = memcacheds(2).await;
    let health = "[pool.health]\ninterval_ms = 100\ntimeout_ms = 100\nrise = 1\nfall = 1\n";
    let gw = start_gateway(&config(&addrs, "rendezvous", health)).await;
    let name = addrs[0].to_string();
    eventually(Duration::from_secs(5), "healthy", || async { worker_info(&gw, &name).await["state"] == "healthy" })
        .await;
    let pid = procs[0].0.id().to_string();
    let signal = |s: &str| assert!(Command::new("kill").args([s, &pid]).status().expect("kill").success());
    signal("-STOP");
    eventually(Duration::from_secs(10), "the paused server is found unhealthy by its probes", || async {
        worker_info(&gw, &name).await["state"] == "unhealthy"
    })
    .await;
    signal("-CONT");
    eventually(Duration::from_secs(10), "back once it answers `version`", || async {
        worker_info(&gw, &name).await["state"] == "healthy"
    })
    .await;
    let (_, metrics) = admin(&gw, "GET", "/metrics", "", None).await;
    let text = metrics.as_str().unwrap_or("");
    assert!(text.contains("keyroute_worker_healthy{"), "{text}");
}

/// A reload that changes a cache listener's own settings (its protocol, pool, item limit or
/// passwords) is refused with the reason, as one that changes an HTTP listener's connection
/// settings is: the listener's connections hold them from their start. Before the listener became
/// one kind or the other in the configuration, such a reload was taken and silently ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_a_cache_listeners_settings_is_refused() {
    let (_procs, addrs) = memcacheds(1).await;
    let text = config(&addrs, "rendezvous", "");
    let gw = start_gateway(&text).await;
    let parse = |t: &str| keyroute_server::Config::parse(t, "t.toml").expect("valid");
    for changed in [
        text.replace("max_item_bytes = 4096", "max_item_bytes = 8192"),
        text.replace("protocol = \"memcached\"", "protocol = \"redis\""),
        text.replace("protocol = \"memcached\"\npool = \"cache\"\nmax_item_bytes = 4096\n", ""),
    ] {
        let err = gw.handle.reload(parse(&changed)).expect_err("refused");
        assert!(
            matches!(err, keyroute_server::GatewayError::Reload(keyroute_server::ReloadError::Listeners)),
            "{err:?}"
        );
    }
    // The same file, or one that changes only the pool, reloads.
    gw.handle.reload(parse(&text)).expect("the same file");
    gw.handle
        .reload(parse(&text.replace("connect_timeout_ms = 300", "connect_timeout_ms = 400")))
        .expect("a pool change");
    // The listener still refuses what its running limit refuses.
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    let big = "x".repeat(5000);
    let r = ask(&mut c, format!("set big 0 0 {}\r\n{big}\r\n", big.len()).as_bytes(), "\r\n").await;
    assert!(r.starts_with("SERVER_ERROR"), "{r}");
}

/// Issue 32: a cache listener finds its pool by name. A reload that puts another pool before the
/// listener's (pools were found by their place in the file) leaves its commands on its own pool's
/// servers, for a client connected before the reload and one connected after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_reorders_pools_keeps_a_listener_on_its_pool() {
    let (_procs, addrs) = memcacheds(2).await;
    let text = config(&addrs[..1], "rendezvous", "");
    let gw = start_gateway(&text).await;
    let mut before = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut before, b"set k-first 0 0 1\r\nx\r\n", "\r\n").await, "STORED\r\n");
    let other = format!(
        "[[pool]]\nname = \"other\"\nstrategy = \"rendezvous\"\n\n[[pool.worker]]\nname = \"o\"\naddress = \"{}\"\n\n",
        addrs[1]
    );
    let reordered = text.replacen("[[pool]]\n", &format!("{other}[[pool]]\n"), 1);
    assert!(reordered.find("name = \"other\"") < reordered.find("name = \"cache\""), "{reordered}");
    gw.handle
        .reload(keyroute_server::Config::parse(&reordered, "t.toml").expect("valid"))
        .expect("a pool added before the listener's");
    let mut after = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..20 {
        let c = if i % 2 == 0 { &mut before } else { &mut after };
        assert_eq!(ask(c, format!("set k-{i} 0 0 1\r\nx\r\n").as_bytes(), "\r\n").await, "STORED\r\n");
    }
    for key in std::iter::once("k-first".to_string()).chain((0..20).map(|i| format!("k-{i}"))) {
        for (server, holds) in [(addrs[0], true), (addrs[1], false)] {
            let mut d = TcpStream::connect(server).await.expect("direct");
            let r = ask(&mut d, format!("get {key}\r\n").as_bytes(), "END\r\n").await;
            assert_eq!(r.starts_with("VALUE"), holds, "{key} on {server}: {r}");
        }
    }
}
