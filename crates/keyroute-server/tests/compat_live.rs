//! Live differential tests of the compatibility modes: the real nginx, HAProxy and Redis Cluster
//! (Debian packages, installed by `scripts/test.sh` when missing), started here on free loopback
//! ports and stopped by pid, against keyroute on keys generated now (the seed is printed, so a
//! failure can be replayed with `KEYROUTE_LIVE_SEED`). Zero mismatches is the only pass.
//!
//! nginx and HAProxy proxy to the same backends as a keyroute gateway in `nginx` / `haproxy` mode:
//! each key is sent to both, and the backend that answers must be the same one. For Redis, a
//! cluster made by `redis-cli --cluster create` answers `CLUSTER KEYSLOT` and, for `SET`, either
//! `OK` or `MOVED` to the master that owns the key; keyroute's `redis-cluster` must agree.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Empty};
use keyroute::hash::{RandomSource, SplitMix64};
use support::*;

/// A daemon started by a test, killed by its pid when dropped.
struct Daemon {
    child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a daemon, made by `command` for a port, on a free port (support's
/// `start_on_free_port`), its errors on the test's.
fn start_daemon(what: &str, mut command: impl FnMut(u16) -> Command) -> (Daemon, u16) {
    let (child, port) = start_on_free_port(what, |port| {
        let mut c = command(port);
        c.stdout(Stdio::null()).stderr(Stdio::inherit());
        c
    });
    (Daemon { child }, port)
}

/// A program of a Debian package: on the PATH, or in the sbin directories root's PATH has.
fn program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not installed: scripts/test.sh installs it (the README's test command)"))
}

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("keyroute-live-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn seed() -> u64 {
    let seed = std::env::var("KEYROUTE_LIVE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("live compat seed: {seed} (KEYROUTE_LIVE_SEED={seed} replays it)");
    seed
}

/// A random key a header can carry as is: visible ASCII, inner spaces and tabs, commas, and
/// multi-byte UTF-8; never empty, never with whitespace at its ends (nginx and HAProxy trim it).
fn header_key(rng: &mut SplitMix64) -> String {
    const EXTRA: [&str; 8] = ["é", "日本", "🙂", " ", "\t", ",", "{", "}"];
    let shape = rng.below(4);
    let mut k = match shape {
        0 => format!("user:{}", rng.below(10_000_000)),
        1 => format!("/thumb/img-{}.jpg?w={}", rng.below(5000), 40 * (1 + rng.below(8))),
        _ => String::new(),
    };
    let len = 1 + rng.below(if shape >= 2 { 40 } else { 4 }) as usize;
    for _ in 0..len {
        if rng.below(6) == 0 {
            k.push_str(EXTRA[rng.below(EXTRA.len() as u64) as usize]);
        } else {
            k.push(char::from(0x21 + rng.below(0x5e) as u8));
        }
    }
    let k = k.trim_matches([' ', '\t']).to_owned();
    if k.is_empty() { "x".into() } else { k }
}

/// The backend that answered `key` through `front`.
async fn answered(c: &TestClient, front: SocketAddr, key: &str) -> String {
    let req = Request::builder()
        .uri(format!("http://{front}/thumb"))
        .header("x-key", HeaderValue::from_str(key).expect("a header value"))
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("an answer within 10 s")
        .expect("an answer");
    assert_eq!(resp.status(), 200, "key {key:?} through {front}");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

fn gateway_config(strategy: &str, extra: &str, workers: &[(String, &Backend, u32, Option<u32>)]) -> String {
    let mut s = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\nstrategy = \"{strategy}\"\nkey = \"{{header.x-key}}\"\n{extra}\n"
    );
    for (name, b, weight, id) in workers {
        s.push_str(&format!("\n[[pool.worker]]\nname = \"{name}\"\naddress = \"{}\"\nweight = {weight}\n", b.addr));
        if let Some(id) = id {
            s.push_str(&format!("id = {id}\n"));
        }
    }
    s
}

/// Each key's answer through the original and through keyroute, checked equal; the answers.
async fn compare(what: &str, real: SocketAddr, gw: &Gw, keys: &[String]) -> HashMap<String, String> {
    let c = client();
    let mut mismatches = Vec::new();
    let mut answers = HashMap::new();
    for k in keys {
        let (a, b) = (answered(&c, real, k).await, answered(&c, gw.addr, k).await);
        if a != b {
            mismatches.push(format!("{k:?}: {what} {a}, keyroute {b}"));
        }
        answers.insert(k.clone(), b);
    }
    eprintln!("{what}: {} keys compared, {} mismatches", keys.len(), mismatches.len());
    assert!(
        mismatches.is_empty(),
        "{} of {} keys differ: {:?}",
        mismatches.len(),
        keys.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    answers
}

/// The backend that answered `key` through `front`, or `None` for an error status.
async fn try_answer(c: &TestClient, front: SocketAddr, key: &str) -> Option<String> {
    let req = Request::builder()
        .uri(format!("http://{front}/thumb"))
        .header("x-key", HeaderValue::from_str(key).ok()?)
        .body(Empty::<Bytes>::new())
        .ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req)).await.ok()?.ok()?;
    if resp.status() != 200 {
        return None;
    }
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// Kills backend `victim` and waits until the gateway's health checks have taken it out (and, with
/// `real_checks`, the original's own checks: HAProxy answers 503 for its keys until then); then
/// `compare` again: the original's failover and keyroute's ranking must send every key to the same
/// backend, and only the dead one's keys may move. `before` is the first comparison's answers: the
/// victim must have owned keys, or the failover would compare nothing.
#[allow(clippy::too_many_arguments)]
async fn compare_after_killing(
    what: &str,
    real: SocketAddr,
    gw: &Gw,
    keys: &[String],
    bs: &mut [Backend],
    victim: usize,
    before: &HashMap<String, String>,
    real_checks: bool,
) {
    let dead = bs[victim].name.clone();
    let theirs: Vec<&String> = keys.iter().filter(|k| before[*k] == dead).collect();
    assert!(!theirs.is_empty(), "{what}: {dead} owned none of {} keys", keys.len());
    bs[victim].kill();
    let name = gw_name(gw, &bs[victim]).await;
    eventually(Duration::from_secs(10), "the gateway sees the dead backend", || {
        let name = name.clone();
        async move { worker_info(gw, &name).await["state"] != "healthy" }
    })
    .await;
    // The original's own detection: nginx marks the peer failed on its first refused connection
    // (and retries the request along its walk); HAProxy needs a failed check (every 50 ms), and
    // until then answers 503 for the dead server's keys.
    if real_checks {
        let c = client();
        let probe = theirs[0].clone();
        eventually(Duration::from_secs(5), "the original takes the dead backend out", || {
            let (c, probe) = (c.clone(), probe.clone());
            async move { try_answer(&c, real, &probe).await.is_some() }
        })
        .await;
    }
    let after = compare(&format!("{what} with {dead} dead"), real, gw, keys).await;
    // Only the dead backend's keys moved (to where the original sent each): every other key is
    // answered by the backend that answered it before. (That none is answered by the dead one
    // needs no check: a killed backend answers nothing, and `compare` requires a 200 from both.)
    let moved: Vec<(&String, &String, &String)> = keys
        .iter()
        .filter(|k| before[*k] != dead && after[*k] != before[*k])
        .map(|k| (k, &before[k], &after[k]))
        .collect();
    assert!(moved.is_empty(), "{what}: keys of live backends moved when {dead} died: {moved:?}");
    eprintln!("{what}: {} keys of the dead {dead} failed over alike, no other key moved", theirs.len());
}

/// The gateway's name for a backend: its address in the nginx pool, its own name otherwise.
async fn gw_name(gw: &Gw, b: &Backend) -> String {
    let by_addr = b.addr.to_string();
    if worker_info(gw, &by_addr).await.is_null() { b.name.clone() } else { by_addr }
}

const HEALTH: &str = "[pool.health]\npath = \"/healthz\"\ninterval_ms = 250\ntimeout_ms = 250\nrise = 1\nfall = 1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_mode_places_as_the_real_nginx() {
    let mut rng = SplitMix64::new(seed());
    let n = 3 + rng.below(10) as usize;
    let mut bs = backends(n).await;
    let weights: Vec<u32> = (0..n).map(|_| 1 + rng.below(5) as u32).collect();
    let dir = temp_dir("nginx");
    let servers: String = bs
        .iter()
        .zip(&weights)
        .map(|(b, w)| format!("    server {} weight={w} max_fails=1 fail_timeout=60s;\n", b.addr))
        .collect();
    let d = dir.display();
    let conf = |port: u16| {
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 512; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
           upstream up {{\n    hash $http_x_key consistent;\n{servers}    keepalive 8;\n  }}\n\
           server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://up;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_next_upstream error timeout;\n      proxy_connect_timeout 2s;\n    }}\n  }}\n}}\n"
        )
    };
    let (nginx, port) = start_daemon("nginx", |port| {
        std::fs::write(dir.join("nginx.conf"), conf(port)).expect("write nginx.conf");
        let mut c = Command::new(program("nginx"));
        c.arg("-p").arg(&dir).arg("-c").arg(dir.join("nginx.conf"));
        c
    });
    let real = SocketAddr::from(([127, 0, 0, 1], port));
    // The worker's name is what nginx hashes: its `server` text.
    let workers: Vec<(String, &Backend, u32, Option<u32>)> =
        bs.iter().zip(&weights).map(|(b, &w)| (b.addr.to_string(), b, w, None)).collect();
    let gw = start_gateway(&gateway_config("nginx", HEALTH, &workers)).await;
    let keys: Vec<String> = (0..1500).map(|_| header_key(&mut rng)).collect();
    let what = format!("nginx ({n} servers, weights {weights:?})");
    let before = compare(&what, real, &gw, &keys).await;
    // nginx walks on to the next point's server; keyroute's nginx ranking is that walk.
    let victim = rng.below(n as u64) as usize;
    compare_after_killing(&what, real, &gw, &keys, &mut bs, victim, &before, false).await;
    gw.task.abort();
    drop(nginx);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_mode_places_as_the_real_haproxy() {
    let mut rng = SplitMix64::new(seed() ^ 0x4a9);
    let n = 3 + rng.below(10) as usize;
    let mut bs = backends(n).await;
    let weights: Vec<u32> = (0..n).map(|_| 1 + rng.below(20) as u32).collect();
    // Distinct ids, some explicit and some left to HAProxy's numbering.
    let mut ids: Vec<Option<u32>> = Vec::new();
    for _ in 0..n {
        let id = (rng.below(2) == 0).then(|| 1 + rng.below(40) as u32).filter(|i| !ids.contains(&Some(*i)));
        ids.push(id);
    }
    let dir = temp_dir("haproxy");
    let servers: String = bs
        .iter()
        .zip(&weights)
        .zip(&ids)
        .enumerate()
        .map(|(i, ((b, w), id))| {
            let id = id.map(|id| format!(" id {id}")).unwrap_or_default();
            format!("  server s{i} {}{id} weight {w} check inter 50ms fall 1 rise 1\n", b.addr)
        })
        .collect();
    let conf = |port: u16| {
        format!(
            "global\n  maxconn 512\n\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\n\n\
         frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\n\
         backend b\n  balance hdr(X-Key)\n  hash-type consistent\n{servers}"
        )
    };
    let cfg = dir.join("haproxy.cfg");
    let (haproxy, port) = start_daemon("haproxy", |port| {
        std::fs::write(&cfg, conf(port)).expect("write haproxy.cfg");
        let mut c = Command::new(program("haproxy"));
        c.arg("-db").arg("-f").arg(&cfg);
        c
    });
    let real = SocketAddr::from(([127, 0, 0, 1], port));
    // HAProxy hashes the server's id and weight, and the header's first value.
    let workers: Vec<(String, &Backend, u32, Option<u32>)> =
        bs.iter().zip(&weights).zip(&ids).map(|((b, &w), &id)| (b.name.clone(), b, w, id)).collect();
    let gw =
        start_gateway(&gateway_config("haproxy", &format!("normalize = [\"first-value\"]\n{HEALTH}"), &workers)).await;
    let keys: Vec<String> = (0..1500)
        .map(|_| header_key(&mut rng))
        .filter(|k| !keyroute::compat::haproxy::first_value(k.as_bytes()).is_empty())
        .collect();
    let what = format!("haproxy ({n} servers, weights {weights:?}, ids {ids:?})");
    let before = compare(&what, real, &gw, &keys).await;
    // HAProxy takes a server that fails its check out of the tree: its keys go to the nearest point
    // of those left, keyroute's haproxy ranking. Wait for HAProxy's check too.
    let victim = rng.below(n as u64) as usize;
    compare_after_killing(&what, real, &gw, &keys, &mut bs, victim, &before, true).await;
    gw.task.abort();
    drop(haproxy);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One RESP command; the reply's first line (`+OK`, `-MOVED 1234 127.0.0.1:7001`, `:12739`).
fn resp(conn: &mut BufReader<TcpStream>, args: &[&[u8]]) -> String {
    let mut cmd = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        cmd.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        cmd.extend_from_slice(a);
        cmd.extend_from_slice(b"\r\n");
    }
    conn.get_mut().write_all(&cmd).expect("send");
    let mut line = String::new();
    conn.read_line(&mut line).expect("reply");
    if let Some(len) = line.strip_prefix('$').and_then(|l| l.trim().parse::<usize>().ok()) {
        let mut bulk = vec![0; len + 2];
        conn.read_exact(&mut bulk).expect("bulk");
        return String::from_utf8_lossy(&bulk[..len]).into_owned();
    }
    line.trim_end().to_owned()
}

/// A cluster-enabled redis-server on a free port (it also binds the port plus 10,000 for the
/// cluster bus), and the port.
fn redis_node(dir: &Path) -> (Daemon, u16) {
    start_daemon("redis-server", |port| {
        let node_dir = dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir).expect("node dir");
        let mut c = Command::new(program("redis-server"));
        c.args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--cluster-enabled", "yes"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&node_dir);
        c
    })
}

#[test]
fn redis_cluster_mode_places_as_a_real_cluster() {
    use keyroute::compat::redis::{RedisCluster, key_slot};
    use keyroute::{Node, NodeSet, Placement};
    let mut rng = SplitMix64::new(seed() ^ 0x7ed15);
    let masters = 3 + rng.below(4) as usize;
    let dir = temp_dir("redis");
    let (_nodes, ports): (Vec<Daemon>, Vec<u16>) = (0..masters).map(|_| redis_node(&dir)).unzip();
    let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let create = Command::new(program("redis-cli"))
        .args(["--cluster", "create"])
        .args(&names)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli --cluster create");
    assert!(create.status.success(), "redis-cli --cluster create: {}", String::from_utf8_lossy(&create.stdout));
    let stream = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], ports[0]))).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut conn = BufReader::new(stream);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !resp(&mut conn, &[b"CLUSTER", b"INFO"]).contains("cluster_state:ok") {
        assert!(Instant::now() < deadline, "the cluster did not reach cluster_state:ok within 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let cluster = RedisCluster::new(NodeSet::try_new(names.iter().map(|n| Node::new_unchecked(n))).expect("unique"))
        .expect("valid");
    let mut mismatches = Vec::new();
    let mut compared = 0;
    for i in 0..3000 {
        // Binary-safe keys: any byte, with braces often, to exercise hash tags.
        let len = rng.below(24) as usize;
        let key: Vec<u8> = (0..len)
            .map(|_| match rng.below(8) {
                0 => b'{',
                1 => b'}',
                _ => rng.below(256) as u8,
            })
            .chain(format!(":{i}").into_bytes())
            .collect();
        let slot = resp(&mut conn, &[b"CLUSTER", b"KEYSLOT", &key]);
        let owner = match resp(&mut conn, &[b"SET", &key, b"1"]).as_str() {
            "+OK" => names[0].clone(),
            moved => moved.rsplit(' ').next().unwrap_or_default().to_owned(),
        };
        let mine = cluster.pick(&key).map(|n| n.name().to_owned()).unwrap_or_default();
        if slot != format!(":{}", key_slot(&key)) || owner != mine {
            mismatches.push(format!("{key:?}: redis {slot} {owner}, keyroute {} {mine}", key_slot(&key)));
        }
        compared += 1;
    }
    eprintln!("redis cluster ({masters} masters): {compared} keys compared, {} mismatches", mismatches.len());
    assert!(mismatches.is_empty(), "{} keys differ: {:?}", mismatches.len(), &mismatches[..mismatches.len().min(10)]);
    let _ = std::fs::remove_dir_all(&dir);
}
