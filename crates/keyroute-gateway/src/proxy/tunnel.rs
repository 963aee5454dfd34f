//! An upgraded connection (WebSocket, or another protocol the route allows): after the worker's
//! 101, the client's and the worker's transports are joined ([`keyroute_http1::tunnel`]: through
//! the thread's read buffer, so an idle tunnel holds no buffer) and bytes copied both ways until
//! both sides close, one fails, or nothing has moved either way for the listener's
//! `tunnel_idle_timeout_ms` (60 s by default, NGINX's `proxy_read_timeout`). The tunnel counts
//! as one request in flight on its worker for as long as it lasts, so an idle one must end, or
//! it skews bounded loads and least-loaded. Its access-log line is written when it closes, with
//! the bytes each way and its duration.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use keyroute_http1::Transport;
use keyroute_http1::tunnel::{Closed, join};

use crate::access::TunnelEnd;
use keyroute_fleet::metrics::ListenerMetrics;
use keyroute_fleet::pool::InFlight;

/// What a tunnel needs beyond its two sides.
pub(crate) struct Tunnel {
    pub(crate) request_id: String,
    pub(crate) worker: String,
    pub(crate) idle: Duration,
    /// The worker's in-flight count, held until the tunnel closes.
    pub(crate) in_flight: InFlight,
    /// Where its access-log line waits for the bytes, if the listener logs.
    pub(crate) end: Option<tokio::sync::oneshot::Sender<TunnelEnd>>,
    pub(crate) metrics: Option<Arc<ListenerMetrics>>,
}

/// A tunnel waiting for its 101 to be written: the worker's side and the tunnel's details. It
/// travels in the response's extensions to the client's connection, which starts it with its own
/// transport ([`Pending::start`]); dropped unstarted (a caller without a connection), it closes
/// the worker's side and releases its in-flight count.
#[derive(Clone)]
pub(crate) struct Pending(Arc<parking_lot::Mutex<Option<(crate::upstream::Upgraded, Tunnel)>>>);

impl Pending {
    pub(crate) fn new(worker_side: crate::upstream::Upgraded, t: Tunnel) -> Self {
        Pending(Arc::new(parking_lot::Mutex::new(Some((worker_side, t)))))
    }

    /// Runs the tunnel between the client's transport (and the bytes it sent past its head) and
    /// the worker to its end, on its own task.
    pub(crate) fn start<C: Transport>(self, client: C, client_rest: Bytes) {
        let Some(((io, worker_rest), t)) = self.0.lock().take() else { return };
        tokio::spawn(run(client, worker_rest, io, client_rest, t));
    }
}

/// Copies until the tunnel ends, then logs it and releases its in-flight count.
async fn run<C: Transport>(client: C, to_client: Bytes, worker: tokio::net::TcpStream, to_worker: Bytes, t: Tunnel) {
    let (up, down, closed) = join(client, to_client, worker, to_worker, t.idle).await;
    if closed == Closed::Idle
        && let Some(m) = &t.metrics
    {
        m.tunnel_idle_closed.fetch_add(1, Relaxed);
    }
    tracing::debug!(request_id = %t.request_id, worker = %t.worker, up, down, ?closed, "tunnel closed");
    if let Some(end) = t.end {
        let _ = end.send(TunnelEnd { up, down });
    }
    // The tunnel counted as one request in flight on its worker until now.
    drop(t.in_flight);
}
