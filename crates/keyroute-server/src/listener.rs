//! Client connections: accepting them within limits, and the request-head timeout.
//!
//! - **Open files.** At start the gateway raises its soft `RLIMIT_NOFILE` to the hard limit (and
//!   logs both): every client connection can hold an upstream one, so 1,024 descriptors is about
//!   500 clients.
//! - **A connection limit per listener** (`max_connections`; by default half the open-file limit,
//!   shared among the listeners). At the limit the accept loop waits for a connection to close,
//!   and the kernel's backlog holds the rest, as NGINX's `worker_connections` and HAProxy's
//!   `maxconn` do; the limit and the times it was reached are metrics.
//! - **Back-off on accept errors**: out of descriptors (`EMFILE`, `ENFILE`) or memory, the loop
//!   sleeps from 10 ms doubling to 1 s instead of spinning, and logs once per episode.
//! - **The send timeout** (`send_timeout_ms`, 60 s by default, NGINX's `send_timeout`): a
//!   response the client reads nothing of for that long is cut and its connection closed, so that
//!   a client that never reads cannot hold its worker's in-flight count (and the response's
//!   buffers) for as long as it likes. Counted in `keyroute_listener_send_timeouts_total`.
//! - **The head timeout** (`header_timeout_ms`, 10 s by default): a request head that has not
//!   fully arrived that long after the connection opened (a TLS handshake or an h2c preface check
//!   included), or after the previous response was written and its request's body read, is
//!   answered `408 Request Timeout` and the connection closed; an idle keep-alive connection (no
//!   byte of a next request) is closed silently. HTTP/1.1 keeps both clocks in its connection
//!   loop (`connection::serve_h1`); HTTP/2 keeps them per connection and per stream.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use keyroute_fleet::metrics::ListenerMetrics;

/// Raises the soft open-file limit to the hard limit; returns (soft before, soft now).
pub(crate) fn raise_open_file_limit() -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        let (soft, hard) = rlimit::Resource::NOFILE.get().ok()?;
        if soft < hard && rlimit::Resource::NOFILE.set(hard, hard).is_ok() {
            return Some((soft, hard));
        }
        Some((soft, soft))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

pub(crate) use keyroute_gateway::upstream::is_resource_exhaustion;

/// The back-off after accept errors: 10 ms, doubling to 1 s; reset by a successful accept.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    next: Option<Duration>,
}

impl Backoff {
    /// The next wait, and whether it is the first of an episode (worth a log line).
    pub(crate) fn fail(&mut self) -> (Duration, bool) {
        let first = self.next.is_none();
        let d = self.next.unwrap_or(Duration::from_millis(10));
        self.next = Some((d * 2).min(Duration::from_secs(1)));
        (d, first)
    }

    /// A connection was accepted.
    pub(crate) fn reset(&mut self) {
        self.next = None;
    }
}

/// Counts an open connection on its listener until dropped, and then wakes whoever waits for
/// connections to close.
#[derive(Debug)]
pub(crate) struct OpenConn(Arc<ListenerMetrics>, Arc<tokio::sync::Notify>);

impl OpenConn {
    /// Counts one more.
    pub(crate) fn new(metrics: &Arc<ListenerMetrics>, closed: &Arc<tokio::sync::Notify>) -> Self {
        metrics.open.fetch_add(1, Relaxed);
        metrics.accepted.fetch_add(1, Relaxed);
        OpenConn(Arc::clone(metrics), Arc::clone(closed))
    }
}

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
        self.1.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_second_and_resets() {
        let mut b = Backoff::default();
        let waits: Vec<(u64, bool)> = (0..9).map(|_| b.fail()).map(|(d, f)| (d.as_millis() as u64, f)).collect();
        assert_eq!(
            waits,
            [
                (10, true),
                (20, false),
                (40, false),
                (80, false),
                (160, false),
                (320, false),
                (640, false),
                (1000, false),
                (1000, false)
            ]
        );
        b.reset();
        assert_eq!(b.fail(), (Duration::from_millis(10), true));
    }

    #[test]
    fn out_of_descriptors_is_resource_exhaustion() {
        assert!(is_resource_exhaustion(&std::io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(!is_resource_exhaustion(&std::io::Error::from_raw_os_error(libc::ECONNABORTED)));
    }
}
