//! README: a gateway out of file descriptors answers with its own 503 (`gateway_overloaded`), never
//! counting it against the worker. Its own test binary: it lowers the process's open-file limit,
//! which would break any test running beside it.
#![cfg(unix)]

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sets the soft open-file limit; returns the previous (soft, hard) limits.
fn set_soft_limit(soft: u64) -> (u64, u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass, which lives for the call.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0, "getrlimit");
    let before = (lim.rlim_cur, lim.rlim_max);
    let new = libc::rlimit { rlim_cur: soft.min(lim.rlim_max), rlim_max: lim.rlim_max };
    // SAFETY: setrlimit reads the struct we pass, which lives for the call.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) }, 0, "setrlimit");
    before
}

/// The lowest free descriptor number (what the next socket would get): a soft limit of it leaves
/// no descriptor to open.
fn lowest_free_descriptor() -> u64 {
    use std::os::fd::AsRawFd;
    let probe = std::fs::File::open("/dev/null").expect("open /dev/null");
    probe.as_raw_fd() as u64
}

/// The accept queue of the socket listening on 127.0.0.1:`port` (`/proc/net/tcp`: a listening
/// socket's `rx_queue` is its connections not yet accepted).
fn accept_queue(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let listening = f.get(3) == Some(&"0A") && f.get(1)?.ends_with(&format!(":{port:04X}"));
        let (_, rx) = f.get(4)?.split_once(':')?;
        listening.then(|| u64::from_str_radix(rx, 16).ok()).flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_gateway_answers_its_own_503_and_blames_no_worker() {
    let bs = backends(1).await;
    let gw = start_gateway(&config_text(&[&bs[0]], "", "")).await;
    // A client connection open before the limit: no descriptor is needed on the client's side.
    let mut conn = TcpStream::connect(gw.addr).await.expect("connect");
    // The gateway has accepted it (its own descriptor) before the limit comes down: its listening
    // socket's accept queue is empty again (read from /proc, which opens no connection that
    // would close later and free a descriptor).
    eventually(Duration::from_secs(5), "the connection accepted", || async { accept_queue(gw.addr.port()) == Some(0) })
        .await;
    // Every descriptor in use now, and not one more: the gateway's upstream connect gets EMFILE.
    let (soft, _) = set_soft_limit(lowest_free_descriptor());
    let sent = conn.write_all(b"GET /thumb?k=1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut buf)).await;
    set_soft_limit(soft);
    sent.expect("write");
    read.expect("an answer within 5 s").expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("gateway_overloaded"), "the gateway's own error, not the worker's: {text}");
    assert!(!text.to_ascii_lowercase().contains("x-keyroute-worker"), "no worker answered: {text}");
    // Nothing reached the worker, and the worker is not blamed: not ejected, no failure counted.
    assert_eq!(bs[0].arrived.load(SeqCst), 0);
    let info = worker_info(&gw, "w1").await;
    assert_eq!(info["state"], "healthy", "{info}");
    assert_eq!(info["ejections"], 0, "{info}");
    for class in ["5xx", "error"] {
        assert_eq!(info["responses"][class], 0, "no {class} counted against the worker: {info}");
    }
    // With descriptors back, the same request is served.
    let (s, h, _) = get(&client(), &format!("http://{}/thumb?k=1", gw.addr)).await;
    assert_eq!(s, http::StatusCode::OK);
    assert_eq!(h["x-keyroute-worker"], "w1");
    gw.task.abort();
}
