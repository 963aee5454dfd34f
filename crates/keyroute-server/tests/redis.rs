//! The Redis listener against real Redis servers (Debian's `redis-server`, started here on free
//! loopback ports and stopped by pid), spoken to in RESP as redis-cli and client libraries do
//! (issue 22).

mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn redis_servers(n: usize) -> (Vec<Proc>, Vec<SocketAddr>) {
    redis_servers_with(n, &[]).await
}

async fn redis_servers_with(n: usize, extra: &[&str]) -> (Vec<Proc>, Vec<SocketAddr>) {
    let (mut procs, mut addrs) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (child, port) = start_on_free_port("redis-server", |port| {
            let mut cmd = Command::new("redis-server");
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            cmd
        });
        procs.push(Proc(child));
        addrs.push(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    (procs, addrs)
}

/// A command as an array of bulk strings.
fn cmd(args: &[&str]) -> Vec<u8> {
    let mut o = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        o.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    o
}

/// One whole RESP2 reply's length, if all there.
fn reply_len(b: &[u8]) -> Option<usize> {
    let nl = b.iter().position(|&c| c == b'\n')? + 1;
    let n: i64 = std::str::from_utf8(&b[1..nl - 2]).ok()?.parse().unwrap_or(0);
    match b[0] {
        b'$' if n < 0 => Some(nl),
        b'$' => (b.len() >= nl + n as usize + 2).then_some(nl + n as usize + 2),
        b'*' | b'~' | b'%' if n <= 0 => Some(nl),
        b'*' | b'~' | b'%' => {
            let mut at = nl;
            for _ in 0..if b[0] == b'%' { 2 * n } else { n } {
                at += reply_len(&b[at..])?;
            }
            Some(at)
        }
        _ => Some(nl),
    }
}

/// Sends `request` (one or more commands) and reads `replies` whole replies.
async fn ask(s: &mut TcpStream, request: &[u8], replies: usize) -> String {
    s.write_all(request).await.expect("write");
    let mut buf = Vec::new();
    loop {
        let mut at = 0;
        let mut got = 0;
        while got < replies {
            match reply_len(&buf[at..]) {
                Some(n) if at < buf.len() => {
                    at += n;
                    got += 1;
                }
                _ => break,
            }
        }
        if got == replies {
            return String::from_utf8_lossy(&buf).into_owned();
        }
        let mut chunk = [0u8; 65536];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .unwrap_or_else(|_| panic!("no reply in time; got {:?}", String::from_utf8_lossy(&buf)))
            .expect("read");
        assert!(n > 0, "closed; got {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn config(servers: &[SocketAddr], strategy: &str) -> String {
    let mut s = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\nprotocol = \"redis\"\npool = \"cache\"\nmax_item_bytes = 4096\n\n[[pool]]\nname = \"cache\"\nstrategy = \"{strategy}\"\nconnect_timeout_ms = 300\n[pool.retry]\nper_try_timeout_ms = 1000\n"
    );
    for (i, a) in servers.iter().enumerate() {
        s.push_str(&format!("[[pool.worker]]\nname = \"r{}\"\naddress = \"{a}\"\n", i + 1));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_commands_go_to_their_keys_servers() {
    let (_procs, addrs) = redis_servers(3).await;
    let gw = start_gateway(&config(&addrs, "rendezvous")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..30 {
        assert_eq!(ask(&mut c, &cmd(&["SET", &format!("key-{i}"), &format!("v{i}")]), 1).await, "+OK\r\n");
    }
    // Each key is on exactly one server, and every server holds some.
    let mut per_server = [0; 3];
    for i in 0..30 {
        let mut holders = 0;
        for (j, a) in addrs.iter().enumerate() {
            let mut d = TcpStream::connect(a).await.expect("direct");
            if ask(&mut d, &cmd(&["EXISTS", &format!("key-{i}")]), 1).await == ":1\r\n" {
                holders += 1;
                per_server[j] += 1;
            }
        }
        assert_eq!(holders, 1, "key-{i}");
    }
    assert!(per_server.iter().all(|&n| n > 0), "{per_server:?}");
    // Split and merged in the client's order; a missing key is nil.
    assert_eq!(
        ask(&mut c, &cmd(&["MGET", "key-3", "nope", "key-29", "key-0"]), 1).await,
        "*4\r\n$2\r\nv3\r\n$-1\r\n$3\r\nv29\r\n$2\r\nv0\r\n"
    );
    assert_eq!(ask(&mut c, &cmd(&["MSET", "a", "1", "b", "2", "c", "3", "d", "4"]), 1).await, "+OK\r\n");
    assert_eq!(
        ask(&mut c, &cmd(&["MGET", "d", "c", "b", "a"]), 1).await,
        "*4\r\n$1\r\n4\r\n$1\r\n3\r\n$1\r\n2\r\n$1\r\n1\r\n"
    );
    assert_eq!(ask(&mut c, &cmd(&["EXISTS", "a", "b", "nope", "a"]), 1).await, ":3\r\n");
    assert_eq!(ask(&mut c, &cmd(&["DEL", "a", "b", "nope"]), 1).await, ":2\r\n");
    assert_eq!(ask(&mut c, &cmd(&["UNLINK", "c", "d"]), 1).await, ":2\r\n");
    // One-key commands of every type.
    for (request, reply) in [
        (cmd(&["INCRBY", "n", "5"]), ":5\r\n"),
        (cmd(&["HSET", "h", "f", "x"]), ":1\r\n"),
        (cmd(&["HGET", "h", "f"]), "$1\r\nx\r\n"),
        (cmd(&["LPUSH", "l", "a", "b"]), ":2\r\n"),
        (cmd(&["LRANGE", "l", "0", "-1"]), "*2\r\n$1\r\nb\r\n$1\r\na\r\n"),
        (cmd(&["ZADD", "z", "1", "m"]), ":1\r\n"),
        (cmd(&["EXPIRE", "n", "100"]), ":1\r\n"),
        (cmd(&["TYPE", "h"]), "+hash\r\n"),
        (cmd(&["GET", "h"]), "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"),
        (cmd(&["PING"]), "+PONG\r\n"),
        (cmd(&["ECHO", "hi"]), "$2\r\nhi\r\n"),
        (cmd(&["SELECT", "0"]), "+OK\r\n"),
        (b"PING inline\r\n".to_vec(), "$6\r\ninline\r\n"),
    ] {
        assert_eq!(ask(&mut c, &request, 1).await, reply, "{}", String::from_utf8_lossy(&request));
    }
    // Hash tags: one server for {user1}.*, so MSETNX and EVAL over them run there.
    assert_eq!(ask(&mut c, &cmd(&["MSETNX", "{user1}.a", "1", "{user1}.b", "2"]), 1).await, ":1\r\n");
    assert_eq!(
        ask(
            &mut c,
            &cmd(&[
                "EVAL",
                "return redis.call('GET', KEYS[1]) .. redis.call('GET', KEYS[2])",
                "2",
                "{user1}.a",
                "{user1}.b"
            ]),
            1
        )
        .await,
        "$2\r\n12\r\n"
    );
    // A numkeys past the arguments, however large, is Redis's error, not a crash.
    for numkeys in ["3", "18446744073709551615", "-1", "x"] {
        let r = ask(&mut c, &cmd(&["EVAL", "return 1", numkeys, "{user1}.a"]), 1).await;
        assert!(r.starts_with("-ERR"), "{numkeys}: {r}");
    }
    let spread = ask(&mut c, &cmd(&["EVAL", "return 1", "4", "key-0", "key-1", "key-2", "key-3"]), 1).await;
    assert!(spread.starts_with("-ERR keyroute: the keys of EVAL are on different servers"), "{spread}");
    // What cannot be proxied, each with its reason.
    for (request, needle) in [
        (cmd(&["KEYS", "*"]), "KEYS concerns every server"),
        (cmd(&["SCAN", "0"]), "SCAN concerns every server"),
        (cmd(&["BLPOP", "l", "1"]), "BLPOP blocks"),
        (cmd(&["MULTI"]), "MULTI is a transaction"),
        (cmd(&["SUBSCRIBE", "ch"]), "SUBSCRIBE is pub/sub"),
        (cmd(&["SELECT", "1"]), "only database 0"),
        (cmd(&["FROBNICATE", "x"]), "unknown command or not proxied: 'FROBNICATE'"),
    ] {
        let r = ask(&mut c, &request, 1).await;
        assert!(r.starts_with("-ERR keyroute: ") && r.contains(needle), "{r}");
    }
    // Pipelined: 200 commands in one write, replies in order.
    let mut pipeline = Vec::new();
    let mut expected = String::new();
    for i in 0..100 {
        pipeline.extend_from_slice(&cmd(&["SET", &format!("p{i}"), &i.to_string()]));
        pipeline.extend_from_slice(&cmd(&["GET", &format!("p{}", i / 2)]));
        expected.push_str("+OK\r\n");
        let v = (i / 2).to_string();
        expected.push_str(&format!("${}\r\n{v}\r\n", v.len()));
    }
    assert_eq!(ask(&mut c, &pipeline, 200).await, expected);
    // An argument over max_item_bytes is a protocol error: answered, and the connection closes.
    let big = "x".repeat(5000);
    let r = ask(&mut c, &cmd(&["SET", "big", &big]), 1).await;
    assert!(r.starts_with("-ERR Protocol error"), "{r}");
    assert_eq!(ask(&mut TcpStream::connect(gw.addr).await.expect("connect"), &cmd(&["QUIT"]), 1).await, "+OK\r\n");
}

/// Issue 31 (12): a store's defaults. A paused Redis server's keys are never sent to another
/// server, however long it is silent (past the stall window and the failures that would eject a
/// cache's server): their commands fail with an error, nothing lands on a server that does not own
/// it, and the first command after it resumes is served by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_servers_keys_go_nowhere_else() {
    let (procs, addrs) = redis_servers(3).await;
    let text = config(&addrs, "rendezvous").replace("per_try_timeout_ms = 1000", "per_try_timeout_ms = 300");
    let gw = start_gateway(&text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..60 {
        assert_eq!(ask(&mut c, &cmd(&["SET", &format!("k{i}"), "v"]), 1).await, "+OK\r\n");
    }
    let mut d = TcpStream::connect(addrs[0]).await.expect("direct");
    let mut on_paused = Vec::new();
    for i in 0..60 {
        if ask(&mut d, &cmd(&["EXISTS", &format!("k{i}")]), 1).await == ":1\r\n" {
            on_paused.push(i);
        }
    }
    assert!(!on_paused.is_empty());
    let pid = procs[0].0.id().to_string();
    let signal = |s: &str| assert!(Command::new("kill").args([s, &pid]).status().expect("kill").success());
    signal("-STOP");
    // 12 writes of 300 ms each: past the 2 s stall window and 5 failures.
    for n in 0..12 {
        let i = on_paused[n % on_paused.len()];
        let r = ask(&mut c, &cmd(&["SET", &format!("k{i}"), "elsewhere"]), 1).await;
        assert!(r.starts_with("-ERR keyroute:"), "write {n} of k{i} while its server is paused: {r}");
    }
    signal("-CONT");
    for a in &addrs[1..] {
        let mut d = TcpStream::connect(a).await.expect("direct");
        for &i in &on_paused {
            assert_eq!(ask(&mut d, &cmd(&["EXISTS", &format!("k{i}")]), 1).await, ":0\r\n", "k{i} on {a}");
        }
    }
    let i = on_paused[0];
    let r = ask(&mut c, &cmd(&["GET", &format!("k{i}")]), 1).await;
    assert!(r == "$1\r\nv\r\n" || r == "$9\r\nelsewhere\r\n", "served by its owner once it is back: {r}");
}

/// With failover asked for (`attempts` and `consecutive_failures`), a dead Redis server's keys
/// move to the next server, and only its keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_server_moves_only_its_keys_when_failover_is_on() {
    let (mut procs, addrs) = redis_servers(3).await;
    let text = config(&addrs, "rendezvous").replace(
        "per_try_timeout_ms = 1000\n",
        "per_try_timeout_ms = 1000\nattempts = 3\n[pool.passive]\nconsecutive_failures = 5\n",
    );
    let gw = start_gateway(&text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..60 {
        assert_eq!(ask(&mut c, &cmd(&["SET", &format!("k{i}"), "v"]), 1).await, "+OK\r\n");
    }
    let mut d = TcpStream::connect(addrs[0]).await.expect("direct");
    let mut on_dead = Vec::new();
    for i in 0..60 {
        if ask(&mut d, &cmd(&["EXISTS", &format!("k{i}")]), 1).await == ":1\r\n" {
            on_dead.push(i);
        }
    }
    assert!(!on_dead.is_empty());
    drop(d);
    drop(procs.remove(0));
    let mut errors = 0;
    for i in 0..60 {
        let r = ask(&mut c, &cmd(&["GET", &format!("k{i}")]), 1).await;
        if on_dead.contains(&i) {
            if r.starts_with("-ERR keyroute:") {
                errors += 1;
            } else {
                assert_eq!(r, "$-1\r\n", "k{i}: moved to the next server, which has no value yet");
            }
        } else {
            assert_eq!(r, "$1\r\nv\r\n", "k{i}");
        }
    }
    assert!(errors <= 1, "{errors}: only a command already sent to the dead server may fail");
}

/// Passwords: clients AUTH to the proxy (NOAUTH before, WRONGPASS for a wrong one), and the proxy
/// AUTHs to servers that require it; a server whose password is not the proxy's is a failed
/// connect, and the key moves to the next server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_to_the_proxy_and_to_the_servers() {
    let (_procs, addrs) = redis_servers_with(2, &["--requirepass", "s3rver"]).await;
    let text = config(&addrs, "rendezvous").replace(
        "protocol = \"redis\"\n",
        "protocol = \"redis\"\npassword = \"cl1ent\"\nserver_password = \"s3rver\"\n",
    );
    let gw = start_gateway(&text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, &cmd(&["GET", "k"]), 1).await, "-NOAUTH Authentication required.\r\n");
    assert_eq!(
        ask(&mut c, &cmd(&["AUTH", "nope"]), 1).await,
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(ask(&mut c, &cmd(&["AUTH", "default", "cl1ent"]), 1).await, "+OK\r\n");
    for i in 0..20 {
        assert_eq!(ask(&mut c, &cmd(&["SET", &format!("k{i}"), "v"]), 1).await, "+OK\r\n");
    }
    assert_eq!(ask(&mut c, &cmd(&["MGET", "k1", "k2", "k3"]), 1).await, "*3\r\n$1\r\nv\r\n$1\r\nv\r\n$1\r\nv\r\n");
    // A proxy with the wrong server password reaches no server.
    let wrong = text.replace("server_password = \"s3rver\"", "server_password = \"other\"");
    let gw2 = start_gateway(&wrong).await;
    let mut c2 = TcpStream::connect(gw2.addr).await.expect("connect");
    assert_eq!(ask(&mut c2, &cmd(&["AUTH", "cl1ent"]), 1).await, "+OK\r\n");
    assert_eq!(ask(&mut c2, &cmd(&["GET", "k1"]), 1).await, "-ERR keyroute: no server available\r\n");
}

/// A file in the temporary directory, named for this test and process, removed first.
fn temp_file(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("keyroute-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// Each server's key count.
async fn dbsizes(addrs: &[SocketAddr]) -> Vec<u64> {
    let mut out = Vec::new();
    for a in addrs {
        let mut s = TcpStream::connect(a).await.expect("connect");
        let r = ask(&mut s, &cmd(&["DBSIZE"]), 1).await;
        out.push(r.trim_start_matches(':').trim().parse().expect("a count"));
    }
    out
}

/// `keyroute move` (issue 22): three servers become four; the dry run's plan is what moves, per
/// pair of servers; a run stopped halfway resumes from its state file; every key keeps its
/// value, type and TTL, nothing is lost and nothing is left on a server that does not own it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyroute_move_moves_exactly_its_plan_and_resumes() {
    use keyroute_server::relocate::{self, Layout, Options, Store};
    let (_procs, addrs) = redis_servers(4).await;
    let old_text = config(&addrs[..3], "ring");
    let new_text = config(&addrs, "ring");
    let n = 2000;
    {
        // Written through a proxy on the old member set, five types, every seventh with a TTL.
        let gw = start_gateway(&old_text).await;
        let mut c = TcpStream::connect(gw.addr).await.expect("connect");
        let mut req = Vec::new();
        for i in 0..n {
            let (k, v) = (format!("k:{i}"), format!("v{i}"));
            req.extend(match i % 5 {
                0 if i % 7 == 0 => cmd(&["SET", &k, &v, "EX", "3600"]),
                0 => cmd(&["SET", &k, &v]),
                1 => cmd(&["HSET", &k, "f", &v, "g", "x"]),
                2 => cmd(&["RPUSH", &k, "a", &v, "c"]),
                3 => cmd(&["SADD", &k, &v, "z"]),
                _ => cmd(&["ZADD", &k, &i.to_string(), &v]),
            });
        }
        let r = ask(&mut c, &req, n).await;
        assert!(!r.contains('-'), "every write succeeded: {}", &r[..r.len().min(300)]);
        gw.handle.shutdown();
    }
    assert_eq!(dbsizes(&addrs).await, {
        let mut d = dbsizes(&addrs[..3]).await;
        d.push(0);
        d
    });
    let old = keyroute_server::Config::parse(&old_text, "old.toml").expect("old");
    let new = keyroute_server::Config::parse(&new_text, "new.toml").expect("new");
    let (from, to) = (Layout::of(&old.pools, "cache").expect("from"), Layout::of(&new.pools, "cache").expect("to"));
    let store = Store::of(new.cache_listeners(), "cache").expect("a redis pool");
    let state = temp_file("move-state.json");
    let options = Options { batch: 100, state: Some(state.clone()), ..Options::default() };

    let plan = relocate::plan(&store, &from, &to, &options).await.expect("plan");
    assert_eq!(plan.scanned, n as u64);
    assert_eq!(plan.stay + plan.keys(), n as u64);
    // A ring's join moves keys to the joiner only, about a quarter of them.
    assert!(plan.pairs.iter().all(|p| p.to == addrs[3].to_string()), "{:?}", plan.pairs);
    assert!((250..=800).contains(&plan.keys()), "{} keys move", plan.keys());
    assert!(plan.pairs.iter().all(|p| p.bytes > 0), "bytes are counted: {:?}", plan.pairs);

    let first =
        relocate::run(&store, &from, &to, &Options { max_keys: Some(plan.keys() / 3), ..options.clone() }, |_| {})
            .await
            .expect("first run");
    assert!(!first.complete, "stopped at --max-keys");
    assert!(first.moved() >= plan.keys() / 3 && first.moved() < plan.keys(), "{}", first.moved());
    let done = relocate::run(&store, &from, &to, &options, |_| {}).await.expect("resumed run");
    assert!(done.complete);
    let planned: Vec<(String, String, u64)> =
        plan.pairs.iter().map(|p| (p.from.clone(), p.to.clone(), p.keys)).collect();
    let moved: Vec<(String, String, u64)> = done.pairs.iter().map(|p| (p.from.clone(), p.to.clone(), p.keys)).collect();
    assert_eq!(moved, planned, "keys moved = the plan, per pair");
    assert_eq!((done.superseded, done.vanished, done.failed, done.misplaced), (0, 0, 0, 0));
    // Nothing lost, nothing extra: every key once, on its owner.
    let sizes = dbsizes(&addrs).await;
    assert_eq!(sizes.iter().sum::<u64>(), n as u64, "{sizes:?}");
    assert_eq!(sizes[3], plan.keys());
    let again = relocate::plan(&store, &from, &to, &Options::default()).await.expect("plan after");
    assert_eq!(again.keys(), 0, "nothing left to move");

    // Through a proxy on the new member set: every value, type and TTL is there.
    let gw = start_gateway(&new_text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    let mut req = Vec::new();
    for i in 0..n {
        let k = format!("k:{i}");
        req.extend(match i % 5 {
            0 => cmd(&["GET", &k]),
            1 => cmd(&["HGET", &k, "f"]),
            2 => cmd(&["LINDEX", &k, "1"]),
            3 => cmd(&["SISMEMBER", &k, &format!("v{i}")]),
            _ => cmd(&["ZSCORE", &k, &format!("v{i}")]),
        });
    }
    let r = ask(&mut c, &req, n).await;
    let mut at = 0;
    for i in 0..n {
        let len = reply_len(&r.as_bytes()[at..]).expect("a reply");
        let one = &r[at..at + len];
        at += len;
        let want = match i % 5 {
            3 => ":1\r\n".to_owned(),
            4 => format!("${}\r\n{i}\r\n", i.to_string().len()),
            _ => format!("${}\r\nv{i}\r\n", format!("v{i}").len()),
        };
        assert_eq!(one, want, "key k:{i}");
    }
    for i in (0..n).step_by(35) {
        let ttl = ask(&mut c, &cmd(&["TTL", &format!("k:{i}")]), 1).await;
        let ttl: i64 = ttl.trim_start_matches(':').trim().parse().expect("a TTL");
        assert!((3500..=3600).contains(&ttl), "k:{i} kept its TTL: {ttl}");
    }
    let _ = std::fs::remove_file(&state);
}

/// Writes during a move are not lost (issue 22): the proxies switch first, with a handoff
/// window; a command on a key that moved to the joining server moves the key first (read-through
/// by MIGRATE), so increments, partial hash writes and deletes made before, during and after
/// `keyroute move` all hold, and a deleted key does not come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_during_a_move_are_not_lost() {
    use keyroute_server::relocate::{self, Layout, Options, Store};
    let (_procs, addrs) = redis_servers(4).await;
    let old_text =
        config(&addrs[..3], "rendezvous").replace("[pool.retry]", "[pool.handoff]\nwindow_ms = 120000\n[pool.retry]");
    let new_text = config(&addrs, "rendezvous");
    let n = 900;
    let gw = start_gateway(&old_text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    let mut req = Vec::new();
    for i in 0..n {
        req.extend(cmd(&["SET", &format!("n:{i}"), "100"]));
        req.extend(cmd(&["HSET", &format!("h:{i}"), "f1", "1"]));
        req.extend(cmd(&["SET", &format!("d:{i}"), "doomed"]));
    }
    ask(&mut c, &req, 3 * n).await;
    // The proxies switch: r4 joins.
    let body = format!("{{\"name\": \"r4\", \"address\": \"{}\"}}", addrs[3]);
    let (status, answer) = admin(&gw, "POST", "/workers", &body, None).await;
    assert!(status.is_success(), "{status} {answer}");
    // Writes to the first third before the move, the rest while it runs.
    let writes = |range: std::ops::Range<usize>| {
        let mut req = Vec::new();
        for i in range.clone() {
            req.extend(cmd(&["INCR", &format!("n:{i}")]));
            req.extend(cmd(&["HSET", &format!("h:{i}"), "f2", "2"]));
            req.extend(cmd(&["DEL", &format!("d:{i}")]));
        }
        (req, 3 * range.len())
    };
    let (req, replies) = writes(0..n / 3);
    ask(&mut c, &req, replies).await;
    let old = keyroute_server::Config::parse(&old_text, "old.toml").expect("old");
    let new = keyroute_server::Config::parse(&new_text, "new.toml").expect("new");
    let (from, to) = (Layout::of(&old.pools, "cache").expect("from"), Layout::of(&new.pools, "cache").expect("to"));
    let store = Store::of(new.cache_listeners(), "cache").expect("a redis pool");
    let plan = relocate::plan(&store, &from, &to, &Options::default()).await.expect("plan");
    assert!(plan.keys() > 0);
    let mover = tokio::spawn(async move {
        let options = Options { batch: 20, rate: Some(2000), ..Options::default() };
        relocate::run(&store, &from, &to, &options, |_| {}).await
    });
    for chunk in (n / 3..n).collect::<Vec<_>>().chunks(25) {
        let (req, replies) = writes(chunk[0]..chunk[chunk.len() - 1] + 1);
        let r = ask(&mut c, &req, replies).await;
        assert!(!r.contains("-ERR"), "{r}");
    }
    let report = mover.await.expect("join").expect("move");
    assert_eq!((report.failed, report.misplaced), (0, 0), "{report:?}");
    // Every write held; no deleted key came back.
    let mut req = Vec::new();
    for i in 0..n {
        req.extend(cmd(&["GET", &format!("n:{i}")]));
        req.extend(cmd(&["HGET", &format!("h:{i}"), "f1"]));
        req.extend(cmd(&["EXISTS", &format!("d:{i}")]));
    }
    let r = ask(&mut c, &req, 3 * n).await;
    assert_eq!(r, "$3\r\n101\r\n$1\r\n1\r\n:0\r\n".repeat(n), "counters, hashes and deletes after the move");
    let sizes = dbsizes(&addrs).await;
    assert_eq!(sizes.iter().sum::<u64>(), 2 * n as u64, "n: and h: keys, once each: {sizes:?}");
    let (_, _, metrics) = get(&client(), &format!("http://{}/metrics", gw.admin)).await;
    let fills: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("keyroute_pool_warm_fills_total{pool=\"cache\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(fills > 0, "keys touched before the move were read through: {fills}");
    gw.handle.shutdown();
}

/// RESP3 (issue 22): `HELLO 3` answers a map and switches the client's protocol, and with it its
/// connections to the servers, so maps, sets, nulls and doubles come back as RESP3 clients expect;
/// split commands merge in RESP3; `HELLO 2` switches back; an unknown version is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_3_speaks_resp3_to_the_client_and_its_servers() {
    let (_procs, addrs) = redis_servers(3).await;
    let gw = start_gateway(&config(&addrs, "rendezvous")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, &cmd(&["HSET", "h", "f", "1"]), 1).await, ":1\r\n");
    assert_eq!(ask(&mut c, &cmd(&["HGETALL", "h"]), 1).await, "*2\r\n$1\r\nf\r\n$1\r\n1\r\n", "RESP2 first");
    assert_eq!(ask(&mut c, &cmd(&["HELLO", "4"]), 1).await, "-NOPROTO unsupported protocol version\r\n");
    let hello = ask(&mut c, &cmd(&["HELLO", "3"]), 1).await;
    assert!(hello.starts_with("%7\r\n$6\r\nserver\r\n$8\r\nkeyroute\r\n"), "{hello}");
    assert!(hello.contains("$5\r\nproto\r\n:3\r\n"), "{hello}");
    assert_eq!(ask(&mut c, &cmd(&["HGETALL", "h"]), 1).await, "%1\r\n$1\r\nf\r\n$1\r\n1\r\n", "a map");
    assert_eq!(ask(&mut c, &cmd(&["SADD", "s", "m"]), 1).await, ":1\r\n");
    assert_eq!(ask(&mut c, &cmd(&["SMEMBERS", "s"]), 1).await, "~1\r\n$1\r\nm\r\n", "a set");
    assert_eq!(ask(&mut c, &cmd(&["GET", "missing"]), 1).await, "_\r\n", "RESP3's null");
    assert_eq!(ask(&mut c, &cmd(&["ZADD", "z", "1.5", "m"]), 1).await, ":1\r\n");
    assert_eq!(ask(&mut c, &cmd(&["ZSCORE", "z", "m"]), 1).await, ",1.5\r\n", "a double");
    // A split command over several servers, merged in RESP3.
    let mut req = Vec::new();
    for i in 0..12 {
        req.extend(cmd(&["SET", &format!("k{i}"), &format!("v{i}")]));
    }
    ask(&mut c, &req, 12).await;
    let mget = ask(&mut c, &cmd(&["MGET", "k0", "nope", "k5", "k11"]), 1).await;
    assert_eq!(mget, "*4\r\n$2\r\nv0\r\n_\r\n$2\r\nv5\r\n$3\r\nv11\r\n");
    // Pipelined across the switch back: the command after HELLO 2 is answered in RESP2.
    let r = ask(&mut c, &[cmd(&["HELLO", "2"]), cmd(&["HGETALL", "h"]), cmd(&["GET", "missing"])].concat(), 3).await;
    assert!(r.starts_with("*14\r\n"), "{r}");
    assert!(r.ends_with("*2\r\n$1\r\nf\r\n$1\r\n1\r\n$-1\r\n"), "{r}");
    gw.handle.shutdown();

    // With a password on the listener and on the servers: HELLO 3 AUTH authenticates.
    let (_procs, addrs) = redis_servers_with(2, &["--requirepass", "s3rv3r"]).await;
    let text = config(&addrs, "rendezvous").replace(
        "max_item_bytes = 4096\n",
        "max_item_bytes = 4096\npassword = \"cl13nt\"\nserver_password = \"s3rv3r\"\n",
    );
    let gw = start_gateway(&text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert!(ask(&mut c, &cmd(&["HELLO", "3"]), 1).await.starts_with("-NOAUTH HELLO must be called"));
    assert!(ask(&mut c, &cmd(&["HELLO", "3", "AUTH", "default", "wrong"]), 1).await.starts_with("-WRONGPASS"));
    assert!(ask(&mut c, &cmd(&["HELLO", "3", "AUTH", "default", "cl13nt"]), 1).await.starts_with("%7\r\n"));
    assert_eq!(ask(&mut c, &cmd(&["HSET", "h2", "a", "b"]), 1).await, ":1\r\n");
    assert_eq!(ask(&mut c, &cmd(&["HGETALL", "h2"]), 1).await, "%1\r\n$1\r\na\r\n$1\r\nb\r\n");
    gw.handle.shutdown();
}

/// Hot keys on the Redis listener (issue 22): a key read hard gets replicas; its GETs spread over
/// them (a replica's miss is read from the owner, answered, and copied there, with a TTL of at
/// most 10 s); a write (SET, APPEND, DEL...) goes to the owner and deletes the replicas' copies,
/// so that no read through the proxy sees a value older than the last write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_is_read_from_its_replicas_and_its_copies_deleted_on_a_write() {
    let (_procs, addrs) = redis_servers(4).await;
    let hot = "[pool.hot_keys]\nthreshold = 200.0\nper_worker = 100.0\nmax_replicas = 4\nwindow_ms = 100\nhold_ms = 30000\nsample_every = 1\nconfidence = 1\nshow_keys = true\n[pool.retry]";
    let gw = start_gateway(&config(&addrs, "rendezvous").replace("[pool.retry]", hot)).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, &cmd(&["SET", "viral", "v1"]), 1).await, "+OK\r\n");
    let burst: Vec<u8> = (0..50).flat_map(|_| cmd(&["GET", "viral"])).collect();
    let mut replicas = 0;
    for _ in 0..60 {
        assert_eq!(ask(&mut c, &burst, 50).await, "$2\r\nv1\r\n".repeat(50), "every read hits");
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
                if ask(&mut d, &cmd(&["GET", "viral"]), 1).await == value {
                    n += 1;
                }
            }
            n
        }
    };
    // Reads spread: the replicas fill from the owner.
    assert_eq!(ask(&mut c, &burst, 50).await, "$2\r\nv1\r\n".repeat(50));
    assert!(holders("$2\r\nv1\r\n").await > 1, "copies on the replicas");
    let ttls: Vec<i64> = {
        let mut t = Vec::new();
        for a in &addrs {
            let mut d = TcpStream::connect(a).await.expect("direct");
            t.push(
                ask(&mut d, &cmd(&["PTTL", "viral"]), 1).await.trim_start_matches(':').trim().parse().expect("pttl"),
            );
        }
        t
    };
    assert_eq!(ttls.iter().filter(|&&t| t == -1).count(), 1, "the owner's copy never expires: {ttls:?}");
    assert!(
        ttls.iter().all(|&t| t == -1 || t == -2 || (0..=10_000).contains(&t)),
        "copies live 10 s at most: {ttls:?}"
    );
    // A write goes to the owner and deletes the copies, in the same pipeline as the reads after it.
    let mut req = cmd(&["APPEND", "viral", "!"]);
    req.extend(&burst);
    let r = ask(&mut c, &req, 51).await;
    assert_eq!(r, format!(":3\r\n{}", "$3\r\nv1!\r\n".repeat(50)), "no read sees the value before the write");
    assert_eq!(holders("$2\r\nv1\r\n").await, 0, "no copy of the old value is left");
    // A DEL (a split command) deletes every copy too.
    let mut req = cmd(&["DEL", "viral"]);
    req.extend(&burst);
    let r = ask(&mut c, &req, 51).await;
    assert_eq!(r, format!(":1\r\n{}", "$-1\r\n".repeat(50)), "a deleted hot key is gone from every replica");
    assert_eq!(holders("$-1\r\n").await, 4);
    gw.handle.shutdown();
}

/// A twemproxy user with Redis pools switches without losing a key (issue 22): real nutcracker
/// (`redis: true`, ketama over md5, weights; one pool with `hash_tag`, one without) in front of
/// four redis-servers, and keyroute with the configuration `keyroute from-nutcracker` makes of the
/// same YAML beside it; 2,000 keys written through nutcracker (some with braces) are each read back
/// through keyroute, so each is placed on nutcracker's server, and AUTH is asked as nutcracker asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twemproxy_redis_user_switches_without_losing_a_key() {
    let (_procs, addrs) = redis_servers_with(4, &["--requirepass", "tw3m"]).await;
    let free = || std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let (tagged, whole) = (free(), free());
    let servers: String = addrs.iter().zip([1, 3, 1, 2]).map(|(a, w)| format!("   - {a}:{w}\n")).collect();
    let pool = |name: &str, port: u16, tag: &str| {
        format!(
            "{name}:\n  listen: 127.0.0.1:{port}\n  hash: md5\n  distribution: ketama\n{tag}  redis: true\n  redis_auth: tw3m\n  timeout: 1000\n  servers:\n{servers}"
        )
    };
    let yml = format!("{}{}", pool("tagged", tagged, "  hash_tag: \"{}\"\n"), pool("whole", whole, ""));
    let dir = std::env::temp_dir().join(format!("keyroute-nutcracker-redis-{}", std::process::id()));
    let _nutcracker = start_nutcracker(&dir, &yml);
    let mut text =
        keyroute_server::config::from_nutcracker(&yml, "nutcracker.yml", "127.0.0.1:0".parse().expect("addr"))
            .expect("converted");
    for port in [tagged, whole] {
        text = text.replace(&format!("listen = \"127.0.0.1:{port}\""), "listen = \"127.0.0.1:0\"");
    }
    let config = keyroute_server::Config::parse(&text, "converted.toml").expect("valid config");
    let gateway = keyroute_server::Gateway::bind(config).await.expect("bind");
    // The gateway's listeners, in the file's order: tagged, then whole.
    let ours = gateway.local_addrs();
    let handle = gateway.handle();
    let run = tokio::spawn(async move { gateway.run(std::future::pending()).await.expect("run") });
    for (theirs, mine, prefix) in [(tagged, ours[0], "t"), (whole, ours[1], "w")] {
        let addr = SocketAddr::from(([127, 0, 0, 1], theirs));
        let mut n = None;
        for _ in 0..100 {
            if let Ok(s) = TcpStream::connect(addr).await {
                n = Some(s);
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let mut n = n.expect("nutcracker listens");
        assert_eq!(ask(&mut n, &cmd(&["AUTH", "tw3m"]), 1).await, "+OK\r\n");
        let keys: Vec<String> = (0..1000)
            .map(|i| if i % 5 == 0 { format!("{prefix}:{{user{}}}:{i}", i % 9) } else { format!("{prefix}:item:{i}") })
            .collect();
        let req: Vec<u8> = keys.iter().flat_map(|k| cmd(&["SET", k, k])).collect();
        assert_eq!(ask(&mut n, &req, keys.len()).await, "+OK\r\n".repeat(keys.len()));
        let mut k = TcpStream::connect(mine).await.expect("keyroute");
        assert!(ask(&mut k, &cmd(&["GET", "x"]), 1).await.starts_with("-NOAUTH"), "AUTH first, as nutcracker");
        assert_eq!(ask(&mut k, &cmd(&["AUTH", "tw3m"]), 1).await, "+OK\r\n");
        let req: Vec<u8> = keys.iter().flat_map(|key| cmd(&["GET", key])).collect();
        let r = ask(&mut k, &req, keys.len()).await;
        let want: String = keys.iter().map(|key| format!("${}\r\n{key}\r\n", key.len())).collect();
        assert!(r == want, "keys placed elsewhere than nutcracker placed them ({prefix})");
    }
    handle.shutdown();
    run.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ids of a Redis server's client connections, other than the one asking.
async fn client_ids(addr: SocketAddr) -> Vec<u64> {
    let mut d = TcpStream::connect(addr).await.expect("direct");
    let own = ask(&mut d, &cmd(&["CLIENT", "ID"]), 1).await;
    let own: u64 = own.trim().trim_start_matches(':').parse().unwrap_or_else(|_| panic!("CLIENT ID: {own}"));
    let list = ask(&mut d, &cmd(&["CLIENT", "LIST"]), 1).await;
    list.lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")).and_then(|id| id.parse().ok()))
        .filter(|&id| id != own)
        .collect()
}

/// Reads until the peer closes (or 5 s pass): everything it sent.
async fn read_to_close(s: &mut TcpStream) -> (String, bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk)).await {
            Err(_) => return (String::from_utf8_lossy(&buf).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&buf).into_owned(), true),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Issue 31 (1): a line Redis refuses (unbalanced quotes, a length with `+` or a leading zero)
/// never reaches the server connection the thread's clients share: the client that sent it is
/// answered Redis's error and closed, as nutcracker closes it, while another client's pipelined
/// GETs all answer; the server closed no connection of the proxy's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_redis_refuses_never_reaches_a_shared_server_connection() {
    let (_procs, addrs) = redis_servers(1).await;
    let gw = start_gateway(&config(&addrs, "rendezvous")).await;
    let mut a = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut a, &cmd(&["SET", "k", "v"]), 1).await, "+OK\r\n");
    // The proxy's shared server connections now (a runtime thread that has served no client
    // yet may open its own during the test: that is no closed connection).
    let before = client_ids(addrs[0]).await;
    assert!(!before.is_empty(), "the proxy holds a server connection");
    let gets = 2000;
    let reader = tokio::spawn(async move {
        let mut pipeline = Vec::new();
        for _ in 0..gets {
            pipeline.extend_from_slice(&cmd(&["GET", "k"]));
        }
        let r = ask(&mut a, &pipeline, gets).await;
        (r, a)
    });
    let bad: [(&[u8], &str); 7] = [
        (b"SET k \"abc\r\n", "-ERR Protocol error: unbalanced quotes in request\r\n"),
        (b"SET k 'abc\r\n", "-ERR Protocol error: unbalanced quotes in request\r\n"),
        (b"SET k \"abc\"x\r\n", "-ERR Protocol error: unbalanced quotes in request\r\n"),
        (b"*1\r\n$+3\r\nGET\r\n", "-ERR Protocol error: invalid bulk length\r\n"),
        (b"*2\r\n$3\r\nGET\r\n$01\r\nk\r\n", "-ERR Protocol error: invalid bulk length\r\n"),
        (b"*02\r\n$3\r\nGET\r\n$1\r\nk\r\n", "-ERR Protocol error: invalid multibulk length\r\n"),
        (b"*+2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "-ERR Protocol error: invalid multibulk length\r\n"),
    ];
    for round in 0..3 {
        for (line, answer) in bad {
            let mut b = TcpStream::connect(gw.addr).await.expect("connect");
            // A good command first, on the same connection: the bad line follows it in one write.
            let mut request = cmd(&["GET", "k"]);
            request.extend_from_slice(line);
            b.write_all(&request).await.expect("write");
            let (got, closed) = read_to_close(&mut b).await;
            assert_eq!(got, format!("$1\r\nv\r\n{answer}"), "round {round}: {}", String::from_utf8_lossy(line));
            assert!(closed, "the client that sent it is closed");
        }
    }
    let (r, mut a) = reader.await.expect("join");
    assert_eq!(r, "$1\r\nv\r\n".repeat(gets), "every other client's GET answered");
    assert_eq!(ask(&mut a, &cmd(&["GET", "k"]), 1).await, "$1\r\nv\r\n");
    // Every connection of the proxy's is still open: the server closed none of them.
    let after = client_ids(addrs[0]).await;
    assert!(before.iter().all(|id| after.contains(id)), "before {before:?}, after {after:?}");
}

/// Issue 31 (5): an inline command's quoted key is placed by the key Redis stores (`SET "qk1" v`
/// stores `qk1`), so a later `GET qk1` finds it on every one of four servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quoted_inline_key_is_placed_as_redis_stores_it() {
    let (_procs, addrs) = redis_servers(4).await;
    let gw = start_gateway(&config(&addrs, "rendezvous")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    for i in 0..40 {
        let line = match i % 3 {
            0 => format!("SET \"qk{i}\" v{i}\r\n"),
            1 => format!("SET 'qk{i}' \"v{i}\"\r\n"),
            _ => format!("SET \"q\\x6b{i}\" v{i}\r\n"),
        };
        assert_eq!(ask(&mut c, line.as_bytes(), 1).await, "+OK\r\n", "{line}");
    }
    for i in 0..40 {
        let v = format!("v{i}");
        assert_eq!(
            ask(&mut c, &cmd(&["GET", &format!("qk{i}")]), 1).await,
            format!("${}\r\n{v}\r\n", v.len()),
            "qk{i}"
        );
    }
    // A value with a space and escapes arrives as Redis would have stored it.
    assert_eq!(ask(&mut c, b"SET sp \"a b\\tc\"\r\n", 1).await, "+OK\r\n");
    assert_eq!(ask(&mut c, &cmd(&["GET", "sp"]), 1).await, "$5\r\na b\tc\r\n");
}

/// Issue 31 (4): the first command after a server closed the proxy's connection (its `timeout`,
/// a `CLIENT KILL`, a restart) is answered: a connection found closed before anything was
/// written to it is opened anew, as nutcracker does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_command_after_a_server_closed_its_side_is_answered() {
    let (_procs, addrs) = redis_servers(1).await;
    let gw = start_gateway(&config(&addrs, "rendezvous")).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, &cmd(&["SET", "k", "v"]), 1).await, "+OK\r\n");
    for round in 0..5 {
        let mut d = TcpStream::connect(addrs[0]).await.expect("direct");
        let killed = ask(&mut d, &cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]), 1).await;
        assert!(killed.starts_with(':') && killed != ":0\r\n", "round {round}: {killed}");
        // The server's close reaches the proxy's socket before the next command.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(ask(&mut c, &cmd(&["GET", "k"]), 1).await, "$1\r\nv\r\n", "round {round}");
    }
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

/// How many of `addrs` answer `GET key` with `reply`, asked directly.
async fn holding(addrs: &[SocketAddr], key: &str, reply: &str) -> usize {
    let mut n = 0;
    for a in addrs {
        let mut d = TcpStream::connect(a).await.expect("direct");
        if ask(&mut d, &cmd(&["GET", key]), 1).await == reply {
            n += 1;
        }
    }
    n
}

/// Issue 31 (9a): a copy made while a key was hot is deleted by a write after its hot period
/// ended: the write reaches every server that may still hold a copy, so when the key is hot
/// again no read returns the value before the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_after_the_hot_period_reaches_every_copy() {
    let (_procs, addrs) = redis_servers(4).await;
    let hot = "[pool.hot_keys]\nthreshold = 200.0\nper_worker = 100.0\nmax_replicas = 4\nwindow_ms = 100\nhold_ms = 200\nsample_every = 1\nconfidence = 1\nshow_keys = true\n[pool.retry]";
    let gw = start_gateway(&config(&addrs, "rendezvous").replace("[pool.retry]", hot)).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, &cmd(&["SET", "viral", "v1"]), 1).await, "+OK\r\n");
    let burst: Vec<u8> = (0..50).flat_map(|_| cmd(&["GET", "viral"])).collect();
    for _ in 0..100 {
        assert_eq!(ask(&mut c, &burst, 50).await, "$2\r\nv1\r\n".repeat(50));
        if hot_replicas(&gw, "viral").await > 1 && holding(&addrs, "viral", "$2\r\nv1\r\n").await > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(holding(&addrs, "viral", "$2\r\nv1\r\n").await > 1, "copies on the replicas");
    // Quiet until the key is no longer hot.
    for _ in 0..100 {
        if hot_replicas(&gw, "viral").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(hot_replicas(&gw, "viral").await, 0, "the hot period is over");
    assert_eq!(ask(&mut c, &cmd(&["SET", "viral", "v2"]), 1).await, "+OK\r\n");
    assert_eq!(holding(&addrs, "viral", "$2\r\nv1\r\n").await, 0, "no copy of the value before the write is left");
    // Hot again: every read sees the write.
    for _ in 0..30 {
        assert_eq!(ask(&mut c, &burst, 50).await, "$2\r\nv2\r\n".repeat(50));
    }
}

/// Issue 31 (9b): a replica's fill never lands after a later write: with one client reading a
/// hot key as fast as it can (its replicas filling from the owner) and another writing and
/// deleting it, no server but the owner holds the key once a delete is acknowledged, and no read
/// after an acknowledged write returns an older value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_never_lands_after_a_later_write() {
    let (_procs, addrs) = redis_servers(4).await;
    let hot = "[pool.hot_keys]\nthreshold = 200.0\nper_worker = 100.0\nmax_replicas = 4\nwindow_ms = 100\nhold_ms = 30000\nsample_every = 1\nconfidence = 1\nshow_keys = true\n[pool.retry]";
    let gw = start_gateway(&config(&addrs, "rendezvous").replace("[pool.retry]", hot)).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    assert_eq!(ask(&mut c, &cmd(&["SET", "viral", "v0"]), 1).await, "+OK\r\n");
    let burst: Vec<u8> = (0..50).flat_map(|_| cmd(&["GET", "viral"])).collect();
    for _ in 0..100 {
        ask(&mut c, &burst, 50).await;
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
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                ask(&mut c, &burst, 50).await;
                reads += 50;
            }
            reads
        }
    });
    let mut w = TcpStream::connect(gw.addr).await.expect("connect");
    let mut check = TcpStream::connect(gw.addr).await.expect("connect");
    let (mut resurrected, mut stale) = (0, 0);
    for i in 1..=20 {
        let v = format!("v{i}");
        assert_eq!(ask(&mut w, &cmd(&["SET", "viral", &v]), 1).await, "+OK\r\n");
        // Reads after the acknowledged write see it (or a later one).
        for _ in 0..5 {
            if ask(&mut check, &cmd(&["GET", "viral"]), 1).await != format!("${}\r\n{v}\r\n", v.len()) {
                stale += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(ask(&mut w, &cmd(&["DEL", "viral"]), 1).await, ":1\r\n");
        resurrected += 4 - holding(&addrs, "viral", "$-1\r\n").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.await.expect("join");
    assert!(reads > 0);
    assert_eq!(
        (resurrected, stale),
        (0, 0),
        "copies back after an acknowledged DEL, reads older than an acknowledged SET"
    );
}

/// Issue 31 (11): every command a client finished sending before the gateway stops is answered:
/// a pipeline of 20,000 commands written whole, then a stop, gets 20,000 replies, and the
/// gateway ends cleanly (nothing was cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_answers_every_command_already_sent() {
    let (_procs, addrs) = redis_servers(2).await;
    let text = format!("shutdown_grace_ms = 10000\n{}", config(&addrs, "rendezvous"));
    let config = keyroute_server::Config::parse(&text, "t.toml").expect("valid");
    let gw = keyroute_server::Gateway::bind(config).await.expect("bind");
    let (addr, handle) = (gw.local_addrs()[0], gw.handle());
    let run = tokio::spawn(gw.run(std::future::pending()));
    let mut c = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(ask(&mut c, &cmd(&["SET", "warm", "1"]), 1).await, "+OK\r\n");
    let n = 20_000;
    let pipeline: Vec<u8> = (0..n).flat_map(|i| cmd(&["SET", &format!("stop:{i}"), "v"])).collect();
    c.write_all(&pipeline).await.expect("write");
    handle.shutdown();
    let (replies, closed) = read_to_close(&mut c).await;
    assert_eq!(replies.matches("+OK\r\n").count(), n, "every command sent before the stop is answered");
    assert!(closed, "then the connection closes");
    let result = tokio::time::timeout(Duration::from_secs(15), run).await.expect("stops").expect("join");
    assert!(result.is_ok(), "nothing was cut: {result:?}");
}

/// Issue 35: a Redis listener's routes by key prefix; a command of several keys across routes is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_commands_route_by_key_prefix() {
    let (_procs, addrs) = redis_servers(2).await;
    let mut text = config(&addrs[..1], "rendezvous").replace(
        "max_item_bytes = 4096\n",
        "max_item_bytes = 4096\n[[listener.prefix_route]]\nprefix = \"session:\"\npool = \"sessions\"\n",
    );
    text.push_str(&format!(
        "\n[[pool]]\nname = \"sessions\"\nstrategy = \"rendezvous\"\n[[pool.worker]]\nname = \"s1\"\naddress = \"{}\"\n",
        addrs[1]
    ));
    let gw = start_gateway(&text).await;
    let mut c = TcpStream::connect(gw.addr).await.expect("connect");
    let mut pipeline = cmd(&["SET", "a", "1"]);
    pipeline.extend(cmd(&["SET", "session:1", "2"]));
    pipeline.extend(cmd(&["INCR", "session:1"]));
    pipeline.extend(cmd(&["GET", "a"]));
    assert_eq!(ask(&mut c, &pipeline, 4).await, "+OK\r\n+OK\r\n:3\r\n$1\r\n1\r\n");
    let mut d = TcpStream::connect(addrs[1]).await.expect("direct");
    assert_eq!(ask(&mut d, &cmd(&["GET", "session:1"]), 1).await, "$1\r\n3\r\n");
    assert_eq!(ask(&mut d, &cmd(&["EXISTS", "a"]), 1).await, ":0\r\n");
    let r = ask(&mut c, &cmd(&["MGET", "a", "session:1"]), 1).await;
    assert!(r.starts_with("-ERR") && r.contains("different pools"), "{r}");
    assert_eq!(ask(&mut c, &cmd(&["MGET", "session:1", "session:2"]), 1).await, "*2\r\n$1\r\n3\r\n$-1\r\n");
}
