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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_gateway_answers_its_own_503_and_blames_no_worker() {
    let bs = backends(1).await;
    let gw = start_gateway(&config_text(&[&bs[0]], "", "")).await;
    // A client connection open before the limit: no descriptor is needed on the client's side.
    let mut conn = TcpStream::connect(gw.addr).await.expect("connect");
    // Let the gateway accept it (its own descriptor) before the limit comes down.
    tokio::time::sleep(Duration::from_millis(100)).await;
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
