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

/// A pool of `servers` keeping each key on `copies` of them, with quick timeouts.
fn replicated(servers: &[SocketAddr], copies: usize) -> String {
    config(
        servers,
        "rendezvous",
        &format!(
            "[pool.replication]\ncopies = {copies}\n[pool.retry]\nper_try_timeout_ms = 300\n[pool.passive]\nconsecutive_failures = 2\n"
        ),
    )
}

/// A key's copies, in the order reads ask them, as the admin API names them.
async fn copies_of(gw: &Gw, key: &str) -> Vec<SocketAddr> {
    let (status, placement) = admin(gw, "GET", &format!("/placement?key={key}"), "", None).await;
    assert!(status.is_success(), "{placement}");
    let names = placement["copies"].as_array().unwrap_or_else(|| panic!("copies in {placement}"));
    names.iter().map(|n| n.as_str().and_then(|n| n.parse().ok()).expect("an address")).collect()
}

/// The servers of `addrs` that hold `key` (with `value`, when given).
async fn holders(addrs: &[SocketAddr], key: &str, value: Option<&str>) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for a in addrs {
        // A server killed by the test holds nothing.
        let Ok(mut d) = TcpStream::connect(a).await else { continue };
        let got = ask(&mut d, format!("get {key}\r\n").as_bytes(), "END\r\n").await;
        if got.starts_with("VALUE") && value.is_none_or(|v| got.contains(&format!("\r\n{v}\r\n"))) {
            out.push(*a);
        }
    }
    out
}

async fn direct(addr: SocketAddr, request: &str, until: &str) -> String {
    let mut d = TcpStream::connect(addr).await.expect("direct");
    ask(&mut d, request.as_bytes(), until).await
}

async fn pool_counter(gw: &Gw, name: &str) -> u64 {
    let (_, metrics) = admin(gw, "GET", "/metrics", "", None).await;
    let text = metrics.as_str().map(str::to_owned).unwrap_or_default();
    let prefix = format!("{name}{{pool=\"cache\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_pool_keeps_each_key_on_its_copies_and_repairs_a_miss() {
    let (mut procs, addrs) = memcacheds(4).await;
    let gw = start_gateway(&replicated(&addrs, 2)).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    // Every write on the key's two copies, and nowhere else.
    let mut first_copies = BTreeSet::new();
    for i in 0..40 {
        let v = format!("v{i}");
        let r = ask(&mut c, format!("set k{i} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes(), "\r\n").await;
        assert_eq!(r, "STORED\r\n");
        let copies = copies_of(&gw, &format!("k{i}")).await;
        assert_eq!(copies.len(), 2);
        first_copies.insert(copies[0]);
        let mut held = holders(&addrs, &format!("k{i}"), Some(&v)).await;
        held.sort();
        let mut want = copies.clone();
        want.sort();
        assert_eq!(held, want, "k{i}");
    }
    assert!(first_copies.len() > 2, "keys spread over the servers: {first_copies:?}");
    // noreply and meta set too.
    assert_eq!(ask(&mut c, b"set q 0 0 1 noreply\r\nq\r\nms m 2 T0\r\nhi\r\n", "\r\n").await, "HD\r\n");
    assert_eq!(holders(&addrs, "q", Some("q")).await.len(), 2);
    assert_eq!(holders(&addrs, "m", Some("hi")).await.len(), 2);
    // A read that misses on the first copy is answered from the second and repairs the first.
    let copies = copies_of(&gw, "k1").await;
    assert_eq!(direct(copies[0], "delete k1\r\n", "\r\n").await, "DELETED\r\n");
    assert_eq!(ask(&mut c, b"get k1\r\n", "END\r\n").await, "VALUE k1 0 2\r\nv1\r\nEND\r\n");
    assert_eq!(holders(&addrs, "k1", Some("v1")).await.len(), 2, "repaired");
    assert_eq!(pool_counter(&gw, "keyroute_pool_replica_repairs_total").await, 1);
    // A multi-get: each key's miss on its first copy, from the second, in the client's order.
    for i in 2..10 {
        let copies = copies_of(&gw, &format!("k{i}")).await;
        assert_eq!(direct(copies[0], &format!("delete k{i}\r\n"), "\r\n").await, "DELETED\r\n");
    }
    let got = ask(&mut c, b"get k2 k3 nope k4 k5 k6 k7 k8 k9\r\n", "END\r\n").await;
    let want: String = (2..10).map(|i| format!("VALUE k{i} 0 2\r\nv{i}\r\n")).collect::<String>() + "END\r\n";
    assert_eq!(got, want);
    for i in 2..10 {
        assert_eq!(holders(&addrs, &format!("k{i}"), None).await.len(), 2, "k{i} repaired");
    }
    assert!(pool_counter(&gw, "keyroute_pool_replica_failovers_total").await >= 9);
    // A get and a set of one key pipelined: the get's miss, asked of the next copy, never sees
    // the set the client sent after it (the set waits for the get's answer).
    for i in 0..5 {
        let r = ask(&mut c, format!("get piped{i}\r\nset piped{i} 0 0 5\r\nlater\r\n").as_bytes(), "STORED\r\n").await;
        assert_eq!(r, "END\r\nSTORED\r\n", "piped{i}");
    }
    // A write whose result depends on the value runs on the first copy, and the key is deleted on
    // the other: the copies never disagree.
    assert_eq!(ask(&mut c, b"set n 0 0 1\r\n5\r\nincr n 3\r\n", "8\r\n").await, "STORED\r\n8\r\n");
    let n_copies = copies_of(&gw, "n").await;
    assert_eq!(holders(&addrs, "n", None).await, [n_copies[0]]);
    assert_eq!(
        ask(&mut c, b"append n 0 0 1\r\n0\r\nget n\r\n", "END\r\n").await,
        "STORED\r\nVALUE n 0 2\r\n80\r\nEND\r\n"
    );
    // The worst answer: a delete that one copy had nothing for says NOT_FOUND (as mcrouter's
    // AllSync), though the other copy deleted it.
    let copies = copies_of(&gw, "k20").await;
    assert_eq!(direct(copies[1], "delete k20\r\n", "\r\n").await, "DELETED\r\n");
    assert_eq!(ask(&mut c, b"delete k20\r\n", "\r\n").await, "NOT_FOUND\r\n");
    assert!(holders(&addrs, "k20", None).await.is_empty());
    // A copy that cannot be reached: the write is on the other, and the client is told.
    let copies = copies_of(&gw, "k30").await;
    let dead = addrs.iter().position(|a| *a == copies[1]).expect("a server");
    drop(procs.remove(dead));
    let r = ask(&mut c, b"set k30 0 0 3\r\nnew\r\n", "\r\n").await;
    assert!(r.starts_with("SERVER_ERROR"), "{r}");
    assert_eq!(holders(&addrs, "k30", Some("new")).await, [copies[0]]);
    assert_eq!(ask(&mut c, b"get k30\r\n", "END\r\n").await, "VALUE k30 0 3\r\nnew\r\nEND\r\n");
}

/// Issue 35: a replicated pool with one server killed and another paused (SIGSTOP) under load
/// loses no read that a live copy could answer, and every write it acknowledged is read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_pool_answers_every_read_through_a_dead_and_a_paused_server() {
    let (mut procs, addrs) = memcacheds(4).await;
    // Three copies on four servers: with one dead and one paused, every key keeps a live copy.
    let gw = start_gateway(&replicated(&addrs, 3)).await;
    let keys = 300;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..keys {
        assert_eq!(ask(&mut c, format!("set r{i} 0 0 4\r\n{i:04}\r\n").as_bytes(), "\r\n").await, "STORED\r\n");
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Readers: one key at a time, and eight at a time.
    let mut readers = tokio::task::JoinSet::new();
    for reader in 0..2 {
        let (stop, addr) = (stop.clone(), gw.addr);
        readers.spawn(async move {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            let (mut reads, mut misses) = (0u64, Vec::new());
            let mut i = reader;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let batch: Vec<usize> = (0..if reader == 0 { 1 } else { 8 }).map(|j| (i + j * 37) % keys).collect();
                let line = batch.iter().map(|k| format!("r{k}")).collect::<Vec<_>>().join(" ");
                let got = ask(&mut c, format!("get {line}\r\n").as_bytes(), "END\r\n").await;
                for k in &batch {
                    reads += 1;
                    if !got.contains(&format!("VALUE r{k} 0 4\r\n{k:04}\r\n")) {
                        misses.push((*k, got.clone()));
                    }
                }
                i = (i + 1) % keys;
            }
            (reads, misses)
        });
    }
    // A writer of other keys: what it was told was stored must read back.
    let writer = {
        let (stop, addr) = (stop.clone(), gw.addr);
        tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            let mut last_acked = std::collections::BTreeMap::new();
            let mut round = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                round += 1;
                for k in 0..20 {
                    let r = ask(&mut c, format!("set w{k} 0 0 6\r\n{round:06}\r\n").as_bytes(), "\r\n").await;
                    if r == "STORED\r\n" {
                        last_acked.insert(k, Some(round));
                    } else {
                        // Not acknowledged: the value may be on some copies and not others.
                        last_acked.insert(k, None);
                    }
                }
            }
            last_acked
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(procs.remove(0));
    let paused = procs[0].0.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &paused]).status().expect("kill").success());
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut total = 0;
    while let Some(done) = readers.join_next().await {
        let (reads, misses) = done.expect("reader");
        total += reads;
        assert!(misses.is_empty(), "{} misses of {reads}; the first: {:?}", misses.len(), misses.first());
    }
    assert!(total > 100, "{total} reads");
    let acked = writer.await.expect("writer");
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for (k, round) in acked {
        let Some(round) = round else { continue };
        assert_eq!(
            ask(&mut c, format!("get w{k}\r\n").as_bytes(), "END\r\n").await,
            format!("VALUE w{k} 0 6\r\n{round:06}\r\nEND\r\n")
        );
    }
    assert!(pool_counter(&gw, "keyroute_pool_replica_failovers_total").await > 0);
    assert!(Command::new("kill").args(["-CONT", &paused]).status().expect("kill").success());
}

/// Issue 35: commands counted by class (count, errors, latency) in `/metrics`, and the slow ones
/// in `/slowlog`, keys as hashes unless the pool shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_are_counted_by_class_and_slow_ones_logged() {
    let (procs, addrs) = memcacheds(2).await;
    let extra =
        "[pool.retry]\nattempts = 1\nper_try_timeout_ms = 300\n[pool.slow_log]\nthreshold_ms = 150\nentries = 3\n";
    let gw = start_gateway(&config(&addrs, "rendezvous", extra)).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..5 {
        assert_eq!(ask(&mut c, format!("set k{i} 0 0 1\r\nx\r\n").as_bytes(), "\r\n").await, "STORED\r\n");
    }
    assert_eq!(ask(&mut c, b"get k0\r\nget k1 k2\r\nbogus\r\nmn\r\n", "MN\r\n").await.matches("VALUE").count(), 3);
    let (_, metrics) = admin(&gw, "GET", "/metrics", "", None).await;
    let metrics = metrics.as_str().expect("text").to_owned();
    let series = |name: &str, command: &str| {
        let prefix = format!("{name}{{pool=\"cache\",protocol=\"memcached\",command=\"{command}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(series("keyroute_cache_commands_total", "set"), Some(5.0), "{metrics}");
    assert_eq!(series("keyroute_cache_commands_total", "get"), Some(2.0));
    assert_eq!(series("keyroute_cache_commands_total", "mn"), Some(1.0));
    assert_eq!(series("keyroute_cache_commands_total", "other"), Some(1.0));
    assert_eq!(series("keyroute_cache_command_errors_total", "other"), Some(1.0));
    assert_eq!(series("keyroute_cache_command_errors_total", "set"), Some(0.0));
    assert_eq!(series("keyroute_cache_command_duration_seconds_count", "set"), Some(5.0));
    assert_eq!(series("keyroute_cache_commands_total", "delete"), None, "a class never used has no series");
    // Nothing slow yet.
    let (_, log) = admin(&gw, "GET", "/slowlog", "", None).await;
    assert_eq!(log["pools"][0]["commands"].as_array().map(Vec::len), Some(0), "{log}");
    // A paused server: a get of one of its keys waits out the timeout, and is logged.
    let key = "slow-key";
    let owner = copies_owner(&gw, key).await;
    let paused = procs[addrs.iter().position(|a| *a == owner).expect("a server")].0.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &paused]).status().expect("kill").success());
    let r = ask(&mut c, format!("get {key}\r\n").as_bytes(), "\r\n").await;
    assert!(Command::new("kill").args(["-CONT", &paused]).status().expect("kill").success());
    assert!(r.starts_with("SERVER_ERROR"), "{r}");
    let (_, log) = admin(&gw, "GET", "/slowlog?pool=cache", "", None).await;
    let commands = log["pools"][0]["commands"].as_array().cloned().unwrap_or_default();
    assert_eq!(commands.len(), 1, "{log}");
    let entry = &commands[0];
    assert_eq!(
        (entry["command"].as_str(), entry["protocol"].as_str(), entry["error"].as_bool()),
        (Some("get"), Some("memcached"), Some(true))
    );
    assert!(entry["micros"].as_u64().is_some_and(|m| m >= 250_000), "{entry}");
    assert!(entry["key"].is_null(), "keys are hashes unless the pool shows them: {entry}");
    assert_eq!(entry["key_hash"].as_str().map(str::len), Some(16));
    assert_eq!(series("keyroute_cache_command_errors_total", "get"), Some(0.0), "from the scrape before");
    // With key text shown, and only the last `entries` kept.
    let gw = start_gateway(&config(
        &addrs,
        "rendezvous",
        &extra.replace("threshold_ms = 150", "threshold_ms = 0\nshow_keys = true"),
    ))
    .await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(
        ask(&mut c, b"get a1\r\nget a2\r\nget a3\r\nget a4\r\n", "END\r\nEND\r\nEND\r\nEND\r\n").await.len(),
        20
    );
    let (_, log) = admin(&gw, "GET", "/slowlog", "", None).await;
    let keys: Vec<&str> =
        log["pools"][0]["commands"].as_array().expect("commands").iter().filter_map(|e| e["key"].as_str()).collect();
    assert_eq!(keys, ["a4", "a3", "a2"], "{log}");
}

/// The server a key's commands go to (its owner: the pool has one copy).
async fn copies_owner(gw: &Gw, key: &str) -> SocketAddr {
    let (_, placement) = admin(gw, "GET", &format!("/placement?key={key}"), "", None).await;
    placement["owner"].as_str().and_then(|o| o.parse().ok()).unwrap_or_else(|| panic!("{placement}"))
}

/// A silent server holds up only its own commands, also for the clients that share a
/// connection to a healthy server with one that waits on it: their wait for their turn there is
/// not the healthy server's silence (it once was, and got it ejected; the replicated pool's test
/// found it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_behind_a_client_held_up_by_a_silent_server_fails_nothing() {
    let (procs, addrs) = memcacheds(2).await;
    let extra = "[pool.retry]\nattempts = 1\nper_try_timeout_ms = 300\n[pool.passive]\nconsecutive_failures = 2\n";
    let gw = start_gateway(&config(&addrs, "rendezvous", extra)).await;
    let mut keys = std::collections::BTreeMap::new();
    for i in 0..40 {
        let k = format!("k{i}");
        keys.entry(copies_owner(&gw, &k).await).or_insert(k);
    }
    let (silent, healthy) = (&keys[&addrs[0]], &keys[&addrs[1]]);
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for k in [silent, healthy] {
        assert_eq!(ask(&mut c, format!("set {k} 0 0 1\r\nx\r\n").as_bytes(), "\r\n").await, "STORED\r\n");
    }
    let paused = procs[0].0.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &paused]).status().expect("kill").success());
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    // One client asks for both keys at once, the silent server's first: its reads there take
    // the whole timeout before it reads the healthy server's answer.
    let both = format!("get {silent} {healthy}\r\n");
    let mut tasks = tokio::task::JoinSet::new();
    let addr = gw.addr;
    tasks.spawn(async move {
        let mut c = TcpStream::connect(addr).await.expect("connect");
        while tokio::time::Instant::now() < until {
            ask(&mut c, both.as_bytes(), "END\r\n").await;
        }
        Vec::new()
    });
    // Others ask only the healthy server, on the same threads' connections.
    for _ in 0..8 {
        let one = format!("get {healthy}\r\n");
        tasks.spawn(async move {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            let mut wrong = Vec::new();
            while tokio::time::Instant::now() < until {
                let got = ask(&mut c, one.as_bytes(), "\r\n").await;
                let got = if got.starts_with("VALUE") && !got.ends_with("END\r\n") {
                    got + &read_until(&mut c, "END\r\n").await
                } else {
                    got
                };
                if !got.starts_with("VALUE") {
                    wrong.push(got);
                }
            }
            wrong
        });
    }
    while let Some(done) = tasks.join_next().await {
        let wrong = done.expect("client");
        assert!(wrong.is_empty(), "the healthy server's key failed {} times: {:?}", wrong.len(), wrong.first());
    }
    assert!(Command::new("kill").args(["-CONT", &paused]).status().expect("kill").success());
    let (_, w) = admin(&gw, "GET", "/workers", "", None).await;
    let healthy_state = w["pools"][0]["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .find(|x| x["address"] == addrs[1].to_string())
        .map(|x| x["state"].clone());
    assert_eq!(healthy_state, Some(serde_json::json!("healthy")), "{w}");
}

/// Issue 35: shadow traffic. A share of the keys (always the same ones) is copied to another
/// pool; a paused shadow drops copies and never holds up a client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_of_keys_is_shadowed_and_a_paused_shadow_holds_up_no_client() {
    let (_primary_procs, primary) = memcacheds(2).await;
    let (shadow_procs, shadow) = memcacheds(2).await;
    let mut text = config(&primary, "rendezvous", "[pool.shadow]\npool = \"shadow\"\nshare = 0.5\nqueue = 256\n");
    text.push_str(
        "\n[[pool]]\nname = \"shadow\"\nstrategy = \"rendezvous\"\n[pool.retry]\nper_try_timeout_ms = 30000\n",
    );
    for a in &shadow {
        text.push_str(&format!("[[pool.worker]]\nname = \"{a}\"\naddress = \"{a}\"\n"));
    }
    let gw = start_gateway(&text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    let keys = 200;
    for round in ["one", "two"] {
        for i in 0..keys {
            let r = ask(&mut c, format!("set s{i} 0 0 3\r\n{round}\r\n").as_bytes(), "\r\n").await;
            assert_eq!(r, "STORED\r\n");
        }
    }
    // Each key on the shadow pool is there with its last value, or not at all.
    let answered = async || {
        let (_, m) = admin(&gw, "GET", "/metrics", "", None).await;
        let m = m.as_str().expect("text").to_owned();
        let get = |o: &str| {
            let prefix = format!("keyroute_pool_shadow_commands_total{{pool=\"cache\",outcome=\"{o}\"}} ");
            m.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        };
        (get("answered"), get("failed"), get("dropped"))
    };
    // The copies are sent behind the client's answers: wait until the count stops moving.
    let mut last = u64::MAX;
    for _ in 0..50 {
        let (a, _, _) = answered().await;
        if a == last {
            break;
        }
        last = a;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut shadowed = 0;
    for i in 0..keys {
        let on_shadow = holders(&shadow, &format!("s{i}"), None).await;
        let with_last = holders(&shadow, &format!("s{i}"), Some("two")).await;
        assert_eq!(on_shadow, with_last, "s{i} is on the shadow pool with its last value or not at all");
        assert!(on_shadow.len() <= 1);
        shadowed += on_shadow.len();
    }
    assert!((60..=140).contains(&shadowed), "about half the keys shadowed: {shadowed} of {keys}");
    let (a, f, d) = answered().await;
    assert_eq!((a, f, d), (2 * shadowed as u64, 0, 0), "two writes of each shadowed key, all answered");
    // The primary pool has every key, and gets are shadowed too.
    assert_eq!(ask(&mut c, b"get s1\r\n", "END\r\n").await, "VALUE s1 0 3\r\ntwo\r\nEND\r\n");
    // A paused shadow (answers waited for up to 30 s): the client's commands go on, the copies
    // that do not fit the queue are dropped.
    for p in &shadow_procs {
        assert!(Command::new("kill").args(["-STOP", &p.0.id().to_string()]).status().expect("kill").success());
    }
    for i in 0..4000 {
        let r = ask(&mut c, format!("set s{} 0 0 5\r\nthree\r\n", i % keys).as_bytes(), "\r\n").await;
        assert_eq!(r, "STORED\r\n");
    }
    let (_, _, dropped) = answered().await;
    // About 2,000 copies: 256 taken by the task (held up), 256 queued, the rest dropped.
    assert!(dropped > 1000, "copies dropped rather than queued: {dropped}");
    for p in &shadow_procs {
        assert!(Command::new("kill").args(["-CONT", &p.0.id().to_string()]).status().expect("kill").success());
    }
}

/// Pools of one server each, by name, after the memcached listener's `pool = "cache"` (whose
/// servers are `servers`), with `routes` in the listener.
fn routed(servers: &[SocketAddr], routes: &str, pools: &[(&str, SocketAddr)]) -> String {
    let mut text = config(servers, "rendezvous", "")
        .replace("max_item_bytes = 4096\n", &format!("max_item_bytes = 4096\nbroadcast = true\n{routes}\n"));
    for (name, addr) in pools {
        text.push_str(&format!("\n[[pool]]\nname = \"{name}\"\nstrategy = \"rendezvous\"\n[[pool.worker]]\nname = \"{addr}\"\naddress = \"{addr}\"\n"));
    }
    text
}

/// Issue 35: routes by key prefix (the longest wins) and by operation (a route's reads to
/// another pool), with the client's order kept across pools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_route_by_key_prefix_and_reads_by_operation() {
    let (_procs, addrs) = memcacheds(4).await;
    let (default, users, users_ro, admins) = (addrs[0], addrs[1], addrs[2], addrs[3]);
    let routes = "read_pool = \"cache\"\n[[listener.prefix_route]]\nprefix = \"user:\"\npool = \"users\"\nread_pool = \"users-ro\"\n[[listener.prefix_route]]\nprefix = \"user:admin:\"\npool = \"admins\"\n";
    let gw =
        start_gateway(&routed(&[default], routes, &[("users", users), ("users-ro", users_ro), ("admins", admins)]))
            .await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    // Pipelined across three pools: answered in the client's order.
    let r = ask(
        &mut c,
        b"set a 0 0 1\r\n1\r\nset user:7 0 0 1\r\n2\r\nset user:admin:1 0 0 1\r\n3\r\nset b 0 0 1\r\n4\r\ndelete user:7\r\nset user:8 0 0 1\r\n5\r\nmn\r\n",
        "MN\r\n",
    )
    .await;
    assert_eq!(r, "STORED\r\nSTORED\r\nSTORED\r\nSTORED\r\nDELETED\r\nSTORED\r\nMN\r\n");
    assert_eq!(holders(&addrs, "a", Some("1")).await, [default]);
    assert_eq!(holders(&addrs, "b", Some("4")).await, [default]);
    assert_eq!(holders(&addrs, "user:8", Some("5")).await, [users], "a prefix's writes to its pool");
    assert_eq!(holders(&addrs, "user:admin:1", Some("3")).await, [admins], "the longest prefix wins");
    assert!(holders(&addrs, "user:7", None).await.is_empty());
    // After a refused value skipped as it arrives, the next command is routed anew (it once
    // stayed on the pool of the batch the refusal was in).
    let big = "x".repeat(200_000);
    let r =
        ask(&mut c, format!("set big 0 0 200000\r\n{big}\r\nset user:9 0 0 1\r\nz\r\n").as_bytes(), "STORED\r\n").await;
    assert_eq!(r, "SERVER_ERROR object too large for cache\r\nSTORED\r\n");
    assert_eq!(holders(&addrs, "user:9", Some("z")).await, [users]);
    // A route's reads go to its read pool: what is there, not what was written.
    assert_eq!(direct(users_ro, "set user:8 0 0 7\r\nreplica\r\n", "\r\n").await, "STORED\r\n");
    assert_eq!(ask(&mut c, b"get user:8\r\n", "END\r\n").await, "VALUE user:8 0 7\r\nreplica\r\nEND\r\n");
    // `gets` reads the write pool (the `cas` after it needs that server's unique), as `mg` with
    // a TTL does (it writes one).
    let r = ask(&mut c, b"gets user:8\r\n", "END\r\n").await;
    assert!(r.starts_with("VALUE user:8 0 1 ") && r.ends_with("\r\n5\r\nEND\r\n"), "{r}");
    assert_eq!(ask(&mut c, b"mg user:8 v T30\r\n", "\r\n5\r\n").await, "VA 1 \r\n5\r\n".replace("VA 1 ", "VA 1"));
    assert_eq!(ask(&mut c, b"mg user:8 v\r\n", "replica\r\n").await, "VA 7\r\nreplica\r\n");
    // A multi-get within one pool is served; across pools, refused (its parts would go to
    // different pools).
    assert_eq!(ask(&mut c, b"get a b\r\n", "END\r\n").await, "VALUE a 0 1\r\n1\r\nVALUE b 0 1\r\n4\r\nEND\r\n");
    assert_eq!(
        ask(&mut c, b"get a user:8\r\n", "\r\n").await,
        "CLIENT_ERROR keys of one command route to different pools\r\n"
    );
    // A command of every server goes to the listener's own pool.
    assert_eq!(ask(&mut c, b"flush_all\r\n", "\r\n").await, "OK\r\n");
    assert!(holders(&addrs, "a", None).await.is_empty());
    assert_eq!(holders(&addrs, "user:admin:1", None).await, [admins]);
    // Each pool's commands are counted in it.
    let (_, m) = admin(&gw, "GET", "/metrics", "", None).await;
    let m = m.as_str().expect("text");
    assert!(
        m.contains("keyroute_cache_commands_total{pool=\"admins\",protocol=\"memcached\",command=\"set\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("keyroute_cache_commands_total{pool=\"users-ro\",protocol=\"memcached\",command=\"get\"} 1"),
        "{m}"
    );
}
