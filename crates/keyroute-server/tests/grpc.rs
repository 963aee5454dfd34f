//! Issue 34: gRPC through keyroute, between real gRPC peers (grpcio servers and clients, run by
//! `tests/support/grpc_peer.py`; `scripts/test.sh` installs grpcio). Keyed unary calls land on
//! their key's owner, every kind of stream passes in order with its status, a server killed
//! mid-stream gives the client a status rather than a hang, and the gateway's own failures reach
//! the client as gRPC statuses (`UNAVAILABLE`, `DEADLINE_EXCEEDED`).

mod support;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::net::TcpStream;

fn peer_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/grpc_peer.py")
}

/// grpcio is there (`scripts/test.sh` installs it): a test that cannot run its peers fails.
fn require_grpcio() {
    let ok = Command::new("python3").args(["-c", "import grpc"]).status().is_ok_and(|s| s.success());
    assert!(ok, "python3 with grpcio is needed (scripts/test.sh installs it: python3 -m pip install grpcio)");
}

/// A grpcio server named `name` on a free loopback port, stopped by pid when dropped.
struct Server {
    name: String,
    addr: SocketAddr,
    _proc: Proc,
}

impl Server {
    fn start(name: &str) -> Server {
        Server::start_with(name, None)
    }

    /// A server that answers gRPC health checks NOT_SERVING while `down` exists.
    fn start_with(name: &str, down: Option<&std::path::Path>) -> Server {
        let mut child = Command::new("python3")
            .arg(peer_script())
            .args(["serve", name])
            .env("GRPC_PEER_DOWN_FILE", down.map(|d| d.as_os_str().to_owned()).unwrap_or_default())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3");
        let line = first_line(&mut child, Duration::from_secs(20));
        let port: u16 = line.strip_prefix("listening ").and_then(|p| p.trim().parse().ok()).expect("a port");
        Server { name: name.to_owned(), addr: SocketAddr::from(([127, 0, 0, 1], port)), _proc: Proc(child) }
    }
}

/// The first line a child prints, within `limit` (the child is killed past it).
fn first_line(child: &mut Child, limit: Duration) -> String {
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send((line, r));
    });
    match rx.recv_timeout(limit) {
        Ok((line, rest)) => {
            child.stdout = None;
            // Keep reading what follows so that the child never blocks on a full pipe.
            std::thread::spawn(move || {
                let mut rest = rest;
                let mut sink = String::new();
                while rest.read_line(&mut sink).is_ok_and(|n| n > 0) {
                    sink.clear();
                }
            });
            line
        }
        Err(_) => {
            let _ = child.kill();
            panic!("no line from the gRPC peer within {limit:?}");
        }
    }
}

/// Runs a client scenario against `target`: its JSON line (the client is killed after `limit`).
fn client(target: SocketAddr, what: &str, limit: Duration) -> serde_json::Value {
    let mut child = Command::new("python3")
        .arg(peer_script())
        .args(["client", &target.to_string(), what])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3");
    let line = first_line(&mut child, limit);
    let _ = child.wait();
    serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {line:?}"))
}

/// A gateway with an h2c listener in front of these gRPC servers, keyed by `key`.
async fn gateway(servers: &[&Server], key: &str, pool_extra: &str) -> Gw {
    let mut s = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\nh2c = true\n\n[[pool]]\nname = \"p\"\nkey = \"{key}\"\non_missing_key = \"reject\"\n{pool_extra}\n\n[pool.upstream]\nprotocol = \"h2\"\n"
    );
    for srv in servers {
        s.push_str(&format!("\n[[pool.worker]]\nname = \"{}\"\naddress = \"{}\"\n", srv.name, srv.addr));
    }
    start_gateway(&s).await
}

/// Keyed unary calls from a real gRPC client land on their key's owner, every time, and the keys
/// spread over the servers; streams of all three kinds pass whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_grpc_calls_and_streams_pass_between_real_peers() {
    require_grpcio();
    let servers = [Server::start("g1"), Server::start("g2"), Server::start("g3")];
    let gw = gateway(&servers.iter().collect::<Vec<_>>(), "{header.x-user-id}", "").await;
    let addr = gw.addr;
    let got =
        tokio::task::spawn_blocking(move || client(addr, "unary:40:3", Duration::from_secs(60))).await.expect("client");
    let users = got.as_object().expect("an object");
    assert_eq!(users.len(), 40);
    let mut used = HashSet::new();
    for (user, names) in users {
        let names: Vec<&str> = names.as_array().expect("names").iter().filter_map(|n| n.as_str()).collect();
        assert_eq!(names.len(), 3);
        assert!(names.iter().all(|n| *n == names[0]), "{user} moved between servers: {names:?}");
        used.insert(names[0].to_owned());
    }
    assert_eq!(used.len(), 3, "40 users over 3 servers: {used:?}");

    // The owner the gateway's table names for the key (one table, one hash, whatever the protocol).
    for (user, names) in users {
        let owner = gw.handle.owner("p", user).expect("pool").expect("an owner");
        assert_eq!(owner.as_str(), names[0].as_str().expect("name"), "{user}");
    }

    let streams =
        tokio::task::spawn_blocking(move || client(addr, "streams", Duration::from_secs(60))).await.expect("client");
    let server: Vec<&str> = streams["server"].as_array().expect("server").iter().filter_map(|m| m.as_str()).collect();
    let owner = server[0].split(':').next().expect("owner").to_owned();
    let expected: Vec<String> = (0..20).map(|i| format!("{owner}:{i}")).collect();
    assert_eq!(server, expected, "server stream in order");
    let all: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    assert_eq!(streams["client"], format!("{owner}:{}", all.join(",")), "client stream whole and in order");
    let bidi: Vec<&str> = streams["bidi"].as_array().expect("bidi").iter().filter_map(|m| m.as_str()).collect();
    assert_eq!(bidi, expected, "bidirectional stream in order, one owner");

    // Calls are counted by method and final status (from the trailers).
    for (method, n) in [("Unary", 120), ("ServerStream", 1), ("ClientStream", 1), ("Bidi", 1)] {
        assert_eq!(grpc_calls(&gw, &format!("keyroute.test.Echo/{method}"), 0).await, n, "{method}");
    }
    gw.task.abort();
}

/// A server killed while it streams: the client gets a status, not a hang; and the gateway's own
/// failures are gRPC statuses: no server reachable is `UNAVAILABLE` with the gateway's message,
/// a call past its `grpc-timeout` is `DEADLINE_EXCEEDED` (in a `200` with `grpc-status`, as gRPC
/// requires).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_reach_grpc_clients_as_statuses() {
    require_grpcio();
    let servers = [Server::start("k1"), Server::start("k2")];
    let gw = gateway(&servers.iter().collect::<Vec<_>>(), "{header.x-user-id}", "").await;
    let addr = gw.addr;

    // Mid-stream: the client reads a few messages; then its server is killed.
    let mut child = Command::new("python3")
        .arg(peer_script())
        .args(["client", &addr.to_string(), "midstream:user-7"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let streaming = rx.recv_timeout(Duration::from_secs(30)).expect("the stream started");
    let owner = streaming.strip_prefix("streaming ").expect("streaming line").to_owned();
    let killed_at = Instant::now();
    let mut servers: Vec<Server> = servers.into_iter().collect();
    let at = servers.iter().position(|s| s.name == owner).expect("owner");
    let killed = servers.remove(at);
    drop(killed);
    let end = rx.recv_timeout(Duration::from_secs(20)).expect("the client ended (no hang)");
    let _ = child.wait();
    let end: serde_json::Value = serde_json::from_str(&end).expect("json");
    assert!(killed_at.elapsed() < Duration::from_secs(15), "the stream's end took {:?}", killed_at.elapsed());
    let code = end["code"].as_str().unwrap_or_default();
    assert!(["UNAVAILABLE", "INTERNAL", "UNKNOWN", "CANCELLED"].contains(&code), "{end}");
    assert!(end["seen"].as_u64().is_some_and(|n| n >= 3), "{end}");

    // The killed server's calls go to the other one: nothing of a call was sent to a server that
    // could not be reached (its connection was refused), so it goes on to the next in its ranking.
    let addr = gw.addr;
    let got =
        tokio::task::spawn_blocking(move || client(addr, "unary:20:2", Duration::from_secs(60))).await.expect("client");
    let alive = &servers[0].name;
    for (user, names) in got.as_object().expect("users") {
        assert!(names.as_array().expect("names").iter().all(|n| n == alive.as_str()), "{user}: {names}");
    }
    gw.task.abort();

    // No server reachable: UNAVAILABLE, with the gateway's message.
    let gone = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let text = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\nh2c = true\n\n[[pool]]\nname = \"p\"\nkey = \"{{header.x-user-id}}\"\n\n[pool.upstream]\nprotocol = \"h2\"\n\n[[pool.worker]]\nname = \"gone\"\naddress = \"{gone}\"\n"
    );
    let gw = start_gateway(&text).await;
    let addr = gw.addr;
    let failed =
        tokio::task::spawn_blocking(move || client(addr, "failure", Duration::from_secs(30))).await.expect("client");
    assert_eq!(failed["code"], "UNAVAILABLE", "{failed}");
    assert_eq!(failed["details"], "no worker could be reached", "{failed}");
    assert_eq!(grpc_calls(&gw, "keyroute.test.Echo/Unary", 14).await, 1, "counted UNAVAILABLE");
    gw.task.abort();

    // Past its grpc-timeout: DEADLINE_EXCEEDED from the gateway, in time. A raw HTTP/2 client
    // (no client-side deadline of its own) shows it is the gateway's answer.
    let slow = Server::start("slow");
    let gw = gateway(&[&slow], "{grpc.method}", "").await;
    let tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await.expect("h2");
    tokio::spawn(conn);
    let mut frame = vec![0u8, 0, 0, 0, 1];
    frame.extend_from_slice(b"5");
    let req = Request::post(format!("http://{}/keyroute.test.Echo/Slow", gw.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "300m")
        .body(Full::new(Bytes::from(frame)))
        .expect("request");
    let asked = Instant::now();
    let resp = h2.send_request(req).await.expect("response");
    let took = asked.elapsed();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["grpc-status"], "4", "{:?}", resp.headers());
    assert_eq!(resp.headers()["content-type"], "application/grpc");
    assert!(took < Duration::from_secs(3), "answered after {took:?}, not at the call's 300 ms");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(body.is_empty(), "a Trailers-Only response");
    assert_eq!(grpc_calls(&gw, "keyroute.test.Echo/Slow", 4).await, 1, "counted DEADLINE_EXCEEDED");
    gw.task.abort();
}

/// gRPC's health protocol as the active check: a server that says NOT_SERVING is taken out and
/// its keys go to another; SERVING again, it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_checks_take_a_not_serving_server_out_and_back() {
    require_grpcio();
    let dir = std::env::temp_dir().join(format!("keyroute-grpc-health-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let down = dir.join("h1.down");
    let servers = [Server::start_with("h1", Some(&down)), Server::start("h2")];
    let health = "\n[pool.health]\ngrpc_service = \"\"\ninterval_ms = 100\ntimeout_ms = 100\nrise = 1\nfall = 1\n";
    let gw = gateway(&servers.iter().collect::<Vec<_>>(), "{header.x-user-id}", health).await;
    let state = |name: &'static str| {
        let gw = &gw;
        async move { worker_info(gw, name).await["state"].as_str().unwrap_or_default().to_owned() }
    };
    eventually(Duration::from_secs(10), "both serving", || async {
        state("h1").await == "healthy" && state("h2").await == "healthy"
    })
    .await;
    std::fs::write(&down, b"").expect("down");
    eventually(Duration::from_secs(10), "h1 unhealthy (NOT_SERVING)", || async { state("h1").await == "unhealthy" })
        .await;
    let addr = gw.addr;
    let got =
        tokio::task::spawn_blocking(move || client(addr, "unary:12:1", Duration::from_secs(60))).await.expect("client");
    for (user, names) in got.as_object().expect("users") {
        assert_eq!(names[0], "h2", "{user} went to a NOT_SERVING server");
    }
    std::fs::remove_file(&down).expect("up");
    eventually(Duration::from_secs(10), "h1 healthy again", || async { state("h1").await == "healthy" }).await;
    gw.task.abort();
    std::fs::remove_dir_all(&dir).ok();
}

/// `keyroute_grpc_calls_total` for pool `p`, a method and a status.
async fn grpc_calls(gw: &Gw, method: &str, status: u8) -> u64 {
    let (_, metrics) = admin(gw, "GET", "/metrics", "", None).await;
    let want = format!("keyroute_grpc_calls_total{{pool=\"p\",method=\"{method}\",grpc_status=\"{status}\"}} ");
    metrics
        .as_str()
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}
