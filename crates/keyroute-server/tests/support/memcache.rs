//! Real memcached servers for the memcached listener's tests (Debian's `memcached`, on free
//! loopback ports, stopped by pid when dropped), and a client that reads to a marker.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Proc, start_on_free_port};

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

pub async fn wait_port(addr: SocketAddr) {
    for _ in 0..200 {
        if TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("nothing listens at {addr}");
}

/// A memcached server on a free loopback port.
pub async fn memcached() -> (Proc, SocketAddr) {
    let (child, port) = start_on_free_port("memcached", |port| {
        let mut cmd = Command::new("memcached");
        cmd.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0", "-m", "16", "-t", "1", "-c", "256"]);
        // memcached refuses to run as root unless told which user to be.
        if is_root() {
            cmd.args(["-u", "root"]);
        }
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        cmd
    });
    (Proc(child), SocketAddr::from(([127, 0, 0, 1], port)))
}

/// `n` memcached servers.
pub async fn memcacheds(n: usize) -> (Vec<Proc>, Vec<SocketAddr>) {
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..n {
        let (p, a) = memcached().await;
        procs.push(p);
        addrs.push(a);
    }
    (procs, addrs)
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Sends `request` and reads until the answer ends with `until`.
pub async fn ask(s: &mut TcpStream, request: &[u8], until: &str) -> String {
    s.write_all(request).await.expect("write");
    read_until(s, until).await
}

pub async fn read_until(s: &mut TcpStream, until: &str) -> String {
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !buf.ends_with(until.as_bytes()) {
        let mut chunk = [0u8; 65536];
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .unwrap_or_else(|_| {
                panic!("no '{}' in time; got {:?}", until.escape_debug(), String::from_utf8_lossy(&buf))
            })
            .expect("read");
        assert!(n > 0, "closed; got {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

pub fn config(servers: &[SocketAddr], strategy: &str, extra: &str) -> String {
    let mut s = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\nprotocol = \"memcached\"\npool = \"cache\"\nmax_item_bytes = 4096\n\n[[pool]]\nname = \"cache\"\nstrategy = \"{strategy}\"\nconnect_timeout_ms = 300\n{extra}\n"
    );
    for a in servers {
        s.push_str(&format!("[[pool.worker]]\nname = \"{a}\"\naddress = \"{a}\"\n"));
    }
    s
}

/// A memcached server's `stats` figure.
pub async fn stat(addr: SocketAddr, name: &str) -> u64 {
    let mut d = TcpStream::connect(addr).await.expect("direct");
    let stats = ask(&mut d, b"stats\r\n", "END\r\n").await;
    let prefix = format!("STAT {name} ");
    stats.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}
