//! A fleet as processes (issue 9): a real etcd, three `keyroute serve` gateways on one prefix, and
//! `keyroute worker --register` thumbnail workers that join, drain (SIGTERM) and die (`kill -9`)
//! under steady Zipf load through all three gateways. No GET may fail; a dead worker must leave
//! every table within its lease; keys move only as placement says, checked on 100k keys against
//! `keyroute place`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use keyroute_testkit::Etcd;

const PREFIX: &str = "/keyroute/pools/thumbs/workers/";
const TTL: u64 = 3;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_keyroute"))
}

/// A child process killed (by pid) when dropped, and its log lines.
struct Proc {
    child: Child,
    /// Kept: a process whose log reader is gone fails its next log write.
    _logs: mpsc::Receiver<String>,
    name: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns and waits (20 s at most) for a log line containing each needle; returns the `addr=`
/// of those that have one.
fn spawn(name: &str, cmd: &mut Command, needles: &[&str]) -> (Proc, Vec<SocketAddr>) {
    let (child, lines, logs) = keyroute_testkit::spawn_logged(cmd, needles);
    let addrs = lines.iter().filter_map(|l| keyroute_testkit::addr_in(l)).collect();
    (Proc { child, _logs: logs, name: name.to_owned() }, addrs)
}

fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Vec<u8>) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else { return (0, Vec::new()) };
    s.set_read_timeout(Some(Duration::from_secs(15))).expect("timeout");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut buf = Vec::new();
    if s.read_to_end(&mut buf).is_err() {
        return (0, Vec::new());
    }
    let Some(split) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { return (0, Vec::new()) };
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, buf[split + 4..].to_vec())
}

fn json(addr: SocketAddr, method: &str, path: &str, body: &str) -> serde_json::Value {
    let (status, bytes) = http(addr, method, path, body);
    assert_eq!(status, 200, "{method} {path}: {}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).expect("json")
}

/// The names of a gateway's workers, sorted.
fn members(admin: SocketAddr) -> Vec<String> {
    let v = json(admin, "GET", "/workers", "");
    let mut names: Vec<String> = v["pools"][0]["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| w["name"].as_str().expect("name").to_owned())
        .collect();
    names.sort();
    names
}

fn wait_members(admins: &[SocketAddr], want: &[&str], limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if admins.iter().all(|a| members(*a) == want) {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "members {want:?} not on every gateway within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each key's owner on a gateway (POST /placement, 20k keys at a time).
fn placements(admin: SocketAddr, keys: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for chunk in keys.chunks(20_000) {
        let body = serde_json::json!({ "keys": chunk }).to_string();
        let v = json(admin, "POST", "/placement", &body);
        out.extend(v["owners"].as_array().expect("owners").iter().map(|o| o.as_str().unwrap_or("").to_owned()));
    }
    out
}

/// Each key's owner by `keyroute place` over `nodes`.
fn place(nodes: &str, keys: &[String]) -> Vec<String> {
    let mut child = bin()
        .args(["place", "--strategy", "rendezvous", "--nodes", nodes])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("place");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = keys.join("\n") + "\n";
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("output");
    writer.join().expect("writer").expect("write keys");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .expect("utf8")
        .lines()
        .map(|l| l.rsplit('\t').next().expect("owner").to_owned())
        .collect()
}

fn worker(dir: &Path, etcd: &Etcd, name: &str, generate: bool) -> (Proc, SocketAddr) {
    let mut cmd = bin();
    cmd.args(["worker", "--listen", "127.0.0.1:0", "--name", name, "--images"])
        .arg(dir.join("images"))
        .arg("--cache-dir")
        .arg(dir.join(format!("cache-{name}")))
        .args(["--register", &format!("etcd://{}{PREFIX}", etcd.client), "--ttl", &TTL.to_string()])
        .args(["--drain-grace-ms", "500"]);
    if generate {
        cmd.args(["--generate", "24"]);
    }
    let (p, addrs) = spawn(name, &mut cmd, &["worker listening", "registered"]);
    (p, addrs[0])
}

#[test]
fn a_fleet_of_processes_loses_no_request_while_workers_join_drain_and_die() {
    let etcd = Etcd::start();
    let dir = std::env::temp_dir().join(format!("keyroute-fleet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut workers = vec![worker(&dir, &etcd, "w1", true)];
    for name in ["w2", "w3"] {
        workers.push(worker(&dir, &etcd, name, false));
    }
    let mut gateways = Vec::new();
    let (mut fronts, mut admins) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let config = dir.join(format!("gw{i}.toml"));
        std::fs::write(
            &config,
            format!(
                "[admin]\nlisten = \"127.0.0.1:0\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n[[pool]]\nname = \"thumbs\"\nstrategy = \"rendezvous\"\nkey = \"{{path}}?w={{query.w}}&h={{query.h}}\"\n[pool.health]\ninterval_ms = 200\n[pool.membership]\nsource = \"etcd\"\nendpoints = [\"{}\"]\nprefix = \"{PREFIX}\"\n",
                etcd.endpoint()
            ),
        )
        .expect("config");
        let (p, addrs) = spawn(
            &format!("gw{i}"),
            bin().args(["serve", "--config"]).arg(&config),
            &["listening", "admin API listening"],
        );
        gateways.push(p);
        fronts.push(addrs[0]);
        admins.push(addrs[1]);
    }
    wait_members(&admins, &["w1", "w2", "w3"], Duration::from_secs(10));

    // Steady load: Zipf-distributed images and sizes through all three gateways.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failures) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::<String>::new())));
    let mut loaders = Vec::new();
    for t in 0..6 {
        let (front, stop, ok, failures) = (fronts[t % 3], Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&failures));
        loaders.push(std::thread::spawn(move || {
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ t as u64;
            while !stop.load(SeqCst) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Zipf-like: the rank's reciprocal of a uniform number.
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                let rank = ((1.0 / (u + 1e-3)) as u64).min(480);
                let (img, size) = (rank % 24, 32 + 8 * (rank / 24));
                let path = format!("/thumb/img-{img:03}.jpg?w={size}&h={size}");
                match http(front, "GET", &path, "") {
                    (200, _) => {
                        ok.fetch_add(1, SeqCst);
                    }
                    (status, body) => failures
                        .lock()
                        .expect("lock")
                        .push(format!("{front}{path}: {status} {}", String::from_utf8_lossy(&body))),
                }
                // A new connection per GET: pace them so that closed ones (TIME_WAIT) stay few.
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
    }
    let keys: Vec<String> = (0..100_000).map(|i| format!("/thumb/img-{:03}.jpg?w={}&h={}", i % 24, i, i)).collect();
    std::thread::sleep(Duration::from_millis(500));

    // A worker joins: keys move only to it.
    let before = placements(admins[0], &keys);
    workers.push(worker(&dir, &etcd, "w4", false));
    let joined = wait_members(&admins, &["w1", "w2", "w3", "w4"], Duration::from_secs(5));
    let after = placements(admins[0], &keys);
    let moved: Vec<usize> = (0..keys.len()).filter(|&i| before[i] != after[i]).collect();
    assert!(moved.iter().all(|&i| after[i] == "w4"), "a join moved keys between old workers");
    for a in &admins[1..] {
        assert_eq!(placements(*a, &keys), after, "every gateway places alike");
    }
    std::thread::sleep(Duration::from_millis(500));

    // A worker drains and leaves (SIGTERM): only its keys move.
    let w2 = workers.iter().position(|(p, _)| p.name == "w2").expect("w2");
    let (mut w2, _) = workers.remove(w2);
    let sent = Command::new("kill").args(["-TERM", &w2.child.id().to_string()]).status().expect("kill").success();
    assert!(sent);
    let t = Instant::now();
    let drained = wait_members(&admins, &["w1", "w3", "w4"], Duration::from_secs(15));
    let status = w2.child.wait().expect("w2 exits");
    let drain_exit = t.elapsed();
    assert!(status.success(), "the draining worker exits cleanly");
    let after_drain = placements(admins[0], &keys);
    assert!(
        (0..keys.len()).all(|i| after_drain[i] == after[i] || after[i] == "w2"),
        "a leave moved keys the leaver did not own"
    );
    std::thread::sleep(Duration::from_millis(500));

    // A worker is killed: retries hide it, and its lease takes it out of every table.
    let w3 = workers.iter().position(|(p, _)| p.name == "w3").expect("w3");
    let (mut w3, _) = workers.remove(w3);
    let _ = w3.child.kill(); // SIGKILL
    let _ = w3.child.wait();
    let gone = wait_members(&admins, &["w1", "w4"], Duration::from_secs(TTL + 3));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, SeqCst);
    for l in loaders {
        l.join().expect("loader");
    }
    let final_placement = placements(admins[0], &keys);
    assert!(
        (0..keys.len()).all(|i| final_placement[i] == after_drain[i] || after_drain[i] == "w3"),
        "a death moved keys the dead worker did not own"
    );
    // Against `keyroute place` over the final members, on every gateway.
    let expected = place("w4,w1", &keys);
    for a in &admins {
        assert_eq!(placements(*a, &keys), expected, "a gateway differs from `keyroute place`");
    }
    let failures = failures.lock().expect("lock");
    println!(
        "GETs: {} ok, {} failed; join applied everywhere in {joined:?}; drain: gone in {drained:?}, worker exited after {drain_exit:?}; kill -9: gone after {gone:?} (lease {TTL} s); {} keys of 100,000 moved on the join",
        ok.load(SeqCst),
        failures.len(),
        moved.len()
    );
    assert!(failures.is_empty(), "failed GETs: {:?}", &failures[..failures.len().min(10)]);
    drop(gateways);
    drop(workers);
    std::fs::remove_dir_all(&dir).ok();
}

/// A minimal HTTP server whose `/healthz` answers 200 or 503 as `healthy` says.
fn toggled_server(healthy: Arc<AtomicBool>) -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let status = if healthy.load(SeqCst) { "200 OK" } else { "503 Service Unavailable" };
            let _ = write!(s, "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    addr
}

fn listed(registry: &str) -> serde_json::Value {
    let o = bin().args(["members", "--registry", registry, "list", "--json"]).output().expect("members list");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("json")
}

fn record_of(registry: &str, name: &str) -> Option<serde_json::Value> {
    listed(registry)["workers"].as_array().expect("workers").iter().find(|w| w["name"] == name).cloned()
}

fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < until, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn members_and_the_register_sidecar_keep_etcd_as_operators_and_health_say() {
    let etcd = Etcd::start();
    let registry = format!("etcd://{}/keyroute/pools/other/workers/", etcd.client);
    let members =
        |args: &[&str]| bin().args(["members", "--registry", &registry]).args(args).output().expect("members");
    // Operators' records.
    let o = members(&["add", "m1", "--address", "127.0.0.1:9101", "--weight", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(members(&["add", "m1", "--address", "127.0.0.1:9102"]).status.code(), Some(64), "a name that exists");
    assert_eq!(members(&["add", "m2", "--address", "nowhere"]).status.code(), Some(64), "an invalid address");
    assert_eq!(members(&["weight", "m1", "0"]).status.code(), Some(64), "weight 0");
    assert!(members(&["weight", "m1", "5"]).status.success());
    assert!(members(&["drain", "m1"]).status.success());
    let m1 = record_of(&registry, "m1").expect("m1");
    assert_eq!(
        (m1["record"]["weight"].as_i64(), m1["record"]["state"].as_str(), m1["lease"].as_bool()),
        (Some(5), Some("draining"), Some(false))
    );
    assert!(members(&["remove", "m1"]).status.success());
    assert_eq!(members(&["remove", "m1"]).status.code(), Some(64), "no such worker");
    assert!(record_of(&registry, "m1").is_none());
    // The sidecar: registered while the health URL answers 2xx, withdrawn while it does not.
    let healthy = Arc::new(AtomicBool::new(true));
    let addr = toggled_server(Arc::clone(&healthy));
    let (mut sidecar, _) = spawn(
        "sidecar",
        bin().args(["register", &registry, "--name", "foreign", "--address", &addr.to_string()]).args([
            "--health",
            &format!("http://{addr}/healthz"),
            "--interval-ms",
            "200",
            "--ttl",
            "3",
            "--drain-grace-ms",
            "200",
        ]),
        &["registered"],
    );
    let r = record_of(&registry, "foreign").expect("registered");
    assert_eq!((r["record"]["address"].as_str(), r["lease"].as_bool()), (Some(addr.to_string().as_str()), Some(true)));
    healthy.store(false, SeqCst);
    eventually(Duration::from_secs(5), "withdrawn while unhealthy", || record_of(&registry, "foreign").is_none());
    healthy.store(true, SeqCst);
    eventually(Duration::from_secs(5), "registered again", || record_of(&registry, "foreign").is_some());
    let sent = Command::new("kill").args(["-TERM", &sidecar.child.id().to_string()]).status().expect("kill").success();
    assert!(sent);
    let status = sidecar.child.wait().expect("exits");
    assert!(status.success());
    assert!(record_of(&registry, "foreign").is_none(), "it left on SIGTERM");
}

/// `sim fleet --workers-from etcd://...`: the pool's active members, as the gateways apply them.
#[test]
fn the_simulator_starts_from_the_members_in_etcd() {
    let etcd = Etcd::start();
    let registry = format!("etcd://{}/keyroute/pools/sim/workers/", etcd.client);
    let members =
        |args: &[&str]| bin().args(["members", "--registry", &registry]).args(args).output().expect("members");
    for (name, port, weight) in [("a10", "9110", "1"), ("a2", "9102", "3"), ("a3", "9103", "1")] {
        assert!(
            members(&["add", name, "--address", &format!("127.0.0.1:{port}"), "--weight", weight]).status.success()
        );
    }
    assert!(members(&["drain", "a3"]).status.success());
    let o = bin()
        .args([
            "sim",
            "fleet",
            "--workers-from",
            &registry,
            "--strategies",
            "rendezvous",
            "--requests",
            "3000",
            "--json",
        ])
        .output()
        .expect("sim");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let members = &v[0][1][0]["config"]["members"];
    assert_eq!(members, &serde_json::json!([["a2", 3], ["a3", 0], ["a10", 1]]), "in the gateways' order, drained at 0");
}

/// Issue 19, defect 4: a record at a gateway's own admin API or listener would put that admin API
/// behind every gateway's public listener (or loop requests back into the fleet). Gateways
/// announce their addresses in etcd, and `keyroute members add` refuses them; the announcement
/// goes when the gateway stops.
#[test]
fn members_add_refuses_a_gateways_admin_and_listener_addresses() {
    let etcd = Etcd::start();
    let dir = std::env::temp_dir().join(format!("keyroute-gw-announce-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let prefix = "/keyroute/pools/announced/workers/";
    let config = dir.join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n[[listener]]\nlisten = \"0.0.0.0:0\"\n[[pool]]\nname = \"p\"\n[pool.membership]\nsource = \"etcd\"\nendpoints = [\"{}\"]\nprefix = \"{prefix}\"\n",
            etcd.endpoint()
        ),
    )
    .expect("config");
    let (mut gateway, addrs) =
        spawn("gw", bin().args(["serve", "--config"]).arg(&config), &["listening", "admin API listening"]);
    let (front, admin) = (addrs[0], addrs[1]);
    let registry = format!("etcd://{}{prefix}", etcd.client);
    let add = |name: &str, address: &str| {
        bin().args(["members", "--registry", &registry, "add", name, "--address", address]).output().expect("members")
    };
    // The announcement is written as the gateway starts; wait for it by asking what the
    // command asks.
    eventually(Duration::from_secs(10), "the gateway announced", || {
        add("probe", &admin.to_string()).status.code() == Some(64)
    });
    let o = add("sneaky", &admin.to_string());
    assert_eq!(o.status.code(), Some(64), "the admin API's address");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is an address of gateway"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The listener is bound to every interface: its loopback address is the gateway's too.
    let listener = format!("127.0.0.1:{}", front.port());
    assert_eq!(add("looping", &listener).status.code(), Some(64), "the listener's address");
    // Issue 31, defect 20: every spelling the gateway marks `loop` is refused too: any loopback
    // address, IPv4-mapped ones, and the host's interface addresses, on the wildcard's port.
    let port = front.port();
    let mut spellings =
        vec![format!("127.0.0.2:{port}"), format!("[::ffff:127.0.0.3]:{port}"), format!("[::1]:{port}")];
    let host = Command::new("hostname").arg("-I").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    spellings.extend(
        host.unwrap_or_default()
            .split_whitespace()
            .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, port).to_string()),
    );
    for (i, address) in spellings.iter().enumerate() {
        let o = add(&format!("looping{i}"), address);
        assert_eq!(o.status.code(), Some(64), "{address}: {}", String::from_utf8_lossy(&o.stderr));
    }
    // Nothing was written, and a real worker's address is taken.
    assert!(record_of(&registry, "sneaky").is_none() && record_of(&registry, "looping").is_none());
    let worker = format!("127.0.0.1:{}", front.port().wrapping_add(1).max(1));
    let o = add("w1", &worker);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A gateway that stops is forgotten: its announcement is revoked as it stops, or expires
    // with its lease (10 s) when the process ends first.
    let term = Command::new("kill").args(["-TERM", &gateway.child.id().to_string()]).status().expect("kill");
    assert!(term.success());
    let _ = gateway.child.wait();
    eventually(Duration::from_secs(15), "the announcement withdrawn", || {
        add("later", &admin.to_string()).status.success()
    });
}
