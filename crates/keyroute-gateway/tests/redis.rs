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
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server; scripts/test.sh installs it)");
        procs.push(Proc(child));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut up = false;
        for _ in 0..200 {
            if TcpStream::connect(addr).await.is_ok() {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(up, "redis-server at {addr}");
        addrs.push(addr);
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
        b'*' if n <= 0 => Some(nl),
        b'*' => {
            let mut at = nl;
            for _ in 0..n {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_server_moves_only_its_keys() {
    let (mut procs, addrs) = redis_servers(3).await;
    let gw = start_gateway(&config(&addrs, "rendezvous")).await;
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
