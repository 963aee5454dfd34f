//! `keyroute serve` and `keyroute worker` as processes: logs tell the bound ports, signals reload
//! and stop them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_keyroute"))
}

/// Spawns a process and waits (up to 20 s) for log lines containing each needle; returns the
/// `addr=` value of each.
fn spawn_and_wait(cmd: &mut Command, needles: &[&str]) -> (Child, Vec<SocketAddr>, mpsc::Receiver<String>) {
    let (child, lines, rx) = keyroute_testkit::spawn_logged(cmd, needles);
    let addrs = lines.iter().map(|l| keyroute_testkit::addr_in(l).expect("addr=")).collect();
    (child, addrs, rx)
}

fn http_get(addr: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read");
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").expect("headers end");
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status");
    (status, head.to_ascii_lowercase(), buf[split + 4..].to_vec())
}

fn kill(child: &Child, signal: &str) {
    let ok = Command::new("kill").args([signal, &child.id().to_string()]).status().expect("kill").success();
    assert!(ok);
}

#[test]
fn check_validates_and_names_the_line() {
    let dir = std::env::temp_dir().join(format!("keyroute-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/keyroute.toml");
    let o = bin().args(["serve", "--config", example, "--check"]).output().expect("run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for other in [
        "keyroute-etcd.toml",
        "grpc.toml",
        "tls-workers.toml",
        "dns.toml",
        "memcached.toml",
        "memcached-replicated.toml",
        "memcached-routes.toml",
        "memcached-shadow.toml",
        "redis.toml",
        "redis-cluster.toml",
    ] {
        let path = format!("{}/../../examples/{other}", env!("CARGO_MANIFEST_DIR"));
        let o = bin().args(["serve", "--config", &path, "--check"]).output().expect("run");
        assert!(o.status.success(), "{other}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(o.stderr.is_empty(), "{other}: no warnings: {}", String::from_utf8_lossy(&o.stderr));
    }
    let bad = dir.join("bad.toml");
    let text = std::fs::read_to_string(example).expect("example").replace("rise = 2", "rise = 2\nrize = 3");
    std::fs::write(&bad, text).expect("write");
    let o = bin().args(["serve", "--config", bad.to_str().expect("utf8"), "--check"]).output().expect("run");
    assert_eq!(o.status.code(), Some(64));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.toml:") && err.contains("pool.health.rize") && err.contains("unknown field"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gateway_and_workers_as_processes_with_reload_and_shutdown() {
    let dir = std::env::temp_dir().join(format!("keyroute-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let images = dir.join("images");
    let mut workers = Vec::new();
    let mut worker_addrs = Vec::new();
    for i in 0..2 {
        let cache = dir.join(format!("cache-{i}"));
        let mut cmd = bin();
        cmd.args(["worker", "--listen", "127.0.0.1:0", "--name", &format!("w{i}"), "--images"])
            .arg(&images)
            .arg("--cache-dir")
            .arg(&cache);
        if i == 0 {
            // The first worker generates the images, before it logs that it listens (which
            // spawn_and_wait waits for), so the second finds them.
            cmd.args(["--generate", "3"]);
        }
        // Keep the log receiver: a worker whose stderr reader is gone fails its next log write.
        let (child, addrs, logs) = spawn_and_wait(&mut cmd, &["worker listening"]);
        workers.push((child, logs));
        worker_addrs.push(addrs[0]);
    }
    let config = dir.join("gw.toml");
    let write_config = |extra: &str, w0_weight: u32| {
        let mut text = format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n[[pool]]\nname = \"thumbs\"\nstrategy = \"rendezvous\"\nkey = \"{{path}}?w={{query.w}}&h={{query.h}}\"\nworker_header = \"x-keyroute-worker\"\n{extra}\n"
        );
        for (i, a) in worker_addrs.iter().enumerate() {
            let weight = if i == 0 { w0_weight } else { 1 };
            text.push_str(&format!("[[pool.worker]]\nname = \"w{i}\"\naddress = \"{a}\"\nweight = {weight}\n"));
        }
        std::fs::write(&config, text).expect("config");
    };
    write_config("", 1);
    let (mut gw, addrs, logs) = spawn_and_wait(
        bin().args(["serve", "--threads", "1", "--watch", "--config"]).arg(&config),
        &["listening", "admin API listening"],
    );
    let (front, admin) = (addrs[0], addrs[1]);
    let (status, head, body) = http_get(front, "/thumb/img-001.jpg?w=100&h=100");
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("content-type: image/jpeg") && head.contains("x-cache: miss"), "{head}");
    assert_eq!(&body[..2], b"\xff\xd8", "a JPEG");
    let owner = head.lines().find_map(|l| l.strip_prefix("x-keyroute-worker: ")).expect("worker header").to_owned();
    let (_, head, _) = http_get(front, "/thumb/img-001.jpg?w=100&h=100");
    assert!(head.contains("x-cache: hit") && head.contains(&format!("x-keyroute-worker: {owner}")), "{head}");
    // A bad reload is refused and logged; the gateway serves on.
    write_config("colour = \"blue\"", 1);
    kill(&gw, "-HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let line = logs.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("reload log");
        if line.contains("reload refused") {
            assert!(line.contains("gw.toml:") && line.contains("colour"), "{line}");
            break;
        }
    }
    assert_eq!(http_get(front, "/thumb/img-002.jpg?w=64&h=64").0, 200);
    // Applied reloads under load, by SIGHUP and then by --watch: no request fails.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loader = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0u32, Vec::new());
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                i += 1;
                let (status, head, _) = http_get(front, &format!("/thumb/img-00{}.jpg?w={}&h=64", i % 3, 32 + i % 40));
                if status == 200 { ok += 1 } else { failed.push(head) }
            }
            (ok, failed)
        })
    };
    let w0_weight = || {
        let (_, _, body) = http_get(admin, "/workers");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        v["pools"][0]["workers"][0]["weight"].as_u64()
    };
    let wait_for = |want: u64, how: &str| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while w0_weight() != Some(want) {
            assert!(Instant::now() < deadline, "{how} did not apply");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    write_config("", 0);
    kill(&gw, "-HUP");
    wait_for(0, "the SIGHUP reload");
    let (_, head, _) = http_get(front, "/thumb/img-001.jpg?w=100&h=100");
    assert!(head.contains("x-keyroute-worker: w1"), "w0 has weight 0: {head}");
    // --watch polls the file's modification time once a second.
    write_config("", 2);
    wait_for(2, "the --watch reload");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ok, failed) = loader.join().expect("loader");
    assert!(
        failed.is_empty() && ok > 0,
        "{ok} ok, {} failed, the first: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    // SIGTERM: a clean exit.
    kill(&gw, "-TERM");
    let status = gw.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    for (mut w, _logs) in workers {
        kill(&w, "-TERM");
        assert!(w.wait().expect("wait").success());
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 19, defect 8: logrotate moves the access log away (or deletes it) and signals the
/// gateway; the next lines go to a new file at the configured path.
#[test]
fn access_logs_are_reopened_on_usr1_and_hup_for_logrotate() {
    let dir = std::env::temp_dir().join(format!("keyroute-logrotate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let log = dir.join("access.log");
    let config = dir.join("gw.toml");
    // A worker nobody listens at: every request is a 502, and every one is logged.
    let text = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\n[listener.access_log]\npath = \"{}\"\n[[pool]]\nname = \"p\"\nkey = \"{{path}}\"\n[[pool.worker]]\nname = \"w\"\naddress = \"127.0.0.1:9\"\n",
        log.display()
    );
    std::fs::write(&config, text).expect("config");
    let (mut gw, addrs, logs) = spawn_and_wait(
        bin().args(["serve", "--threads", "1", "--config"]).arg(&config),
        &["listening", "admin API listening"],
    );
    let lines = |p: &std::path::Path| std::fs::read_to_string(p).map(|t| t.lines().count()).unwrap_or(0);
    let wait = |what: &str, check: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check() {
            assert!(Instant::now() < deadline, "not within 10 s: {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let wait_log = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let line = logs.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("a log line");
            if line.contains(needle) {
                return;
            }
        }
    };
    http_get(addrs[0], "/a");
    wait("the first line", &|| lines(&log) == 1);
    // logrotate's default: move, then signal (USR1, as for NGINX).
    let rotated = dir.join("access.log.1");
    std::fs::rename(&log, &rotated).expect("rotate");
    kill(&gw, "-USR1");
    wait_log("SIGUSR1");
    http_get(addrs[0], "/b");
    wait("a line in the new file", &|| lines(&log) == 1);
    assert_eq!(lines(&rotated), 1, "nothing more went to the moved file");
    // Deleted, then SIGHUP (which also reloads).
    std::fs::remove_file(&log).expect("delete");
    kill(&gw, "-HUP");
    wait_log("reloaded");
    http_get(addrs[0], "/c");
    wait("a line in the recreated file", &|| lines(&log) == 1);
    kill(&gw, "-TERM");
    assert!(gw.wait().expect("wait").success());
    std::fs::remove_dir_all(&dir).ok();
}
