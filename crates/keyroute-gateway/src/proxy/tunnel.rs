//! An upgraded connection (WebSocket, or another protocol the route allows): after the worker's
//! 101, the client's and the worker's sockets are joined and bytes copied both ways until either
//! side closes, or until nothing has moved either way for the listener's
//! `tunnel_idle_timeout_ms` (60 s by default, NGINX's `proxy_read_timeout`). The tunnel counts
//! as one request in flight on its worker for as long as it lasts, so an idle one must end, or
//! it skews bounded loads and least-loaded. Its access-log line is written when it closes, with
//! the bytes each way and its duration.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::access::TunnelEnd;
use crate::metrics::ListenerMetrics;
use crate::pool::InFlight;

/// How a tunnel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// One side closed, and the rest was flushed.
    Ended,
    /// Nothing moved for the idle timeout.
    Idle,
    /// A socket failed.
    Failed,
}

/// A socket that notes, in milliseconds since `epoch`, when it last read or wrote anything, and
/// counts the bytes read from it.
struct Noted<S> {
    io: S,
    last: Arc<AtomicU64>,
    epoch: Instant,
    read: Arc<AtomicU64>,
}

impl<S> Noted<S> {
    fn touch(&self) {
        self.last.store(self.epoch.elapsed().as_millis() as u64, Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Noted<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.read.fetch_add(n as u64, Relaxed);
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Noted<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Copies between `client` and `worker` until one closes or nothing moves for `idle`; the bytes
/// client to worker and worker to client, and how it ended.
pub(crate) async fn join<C, W>(client: C, worker: W, idle: Duration) -> (u64, u64, Closed)
where
    C: AsyncRead + AsyncWrite + Unpin,
    W: AsyncRead + AsyncWrite + Unpin,
{
    let epoch = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    // The byte counts live outside the copy, so that an idle close still reports them.
    let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut c = Noted { io: client, last: Arc::clone(&last), epoch, read: Arc::clone(&up) };
    let mut w = Noted { io: worker, last: Arc::clone(&last), epoch, read: Arc::clone(&down) };
    let copy = tokio::io::copy_bidirectional(&mut c, &mut w);
    let watchdog = async {
        loop {
            let quiet_since = epoch + Duration::from_millis(last.load(Relaxed));
            if Instant::now() >= quiet_since + idle {
                return;
            }
            tokio::time::sleep_until(quiet_since + idle).await;
        }
    };
    tokio::select! {
        r = copy => match r {
            Ok((u, d)) => (u, d, Closed::Ended),
            Err(_) => (up.load(Relaxed), down.load(Relaxed), Closed::Failed),
        },
        () = watchdog => (up.load(Relaxed), down.load(Relaxed), Closed::Idle),
    }
}

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

    /// Runs the tunnel between `client` and the worker to its end, on its own task.
    pub(crate) fn start<C>(self, client: C)
    where
        C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Some(((io, rest), t)) = self.0.lock().take() else { return };
        tokio::spawn(run(client, keyroute_http1::Prefixed::new(rest, io), t));
    }
}

/// Copies until the tunnel ends, then logs it and releases its in-flight count.
async fn run<C, W>(client: C, worker: W, t: Tunnel)
where
    C: AsyncRead + AsyncWrite + Unpin,
    W: AsyncRead + AsyncWrite + Unpin,
{
    let (up, down, closed) = join(client, worker, t.idle).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_closes_after_the_idle_timeout_and_counts_its_bytes() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (worker, mut worker_peer) = tokio::io::duplex(1024);
        let run = tokio::spawn(join(client, worker, Duration::from_secs(60)));
        client_peer.write_all(b"hello").await.expect("write");
        let mut buf = [0u8; 5];
        worker_peer.read_exact(&mut buf).await.expect("read");
        tokio::time::sleep(Duration::from_secs(30)).await;
        worker_peer.write_all(b"hi").await.expect("write");
        let mut two = [0u8; 2];
        client_peer.read_exact(&mut two).await.expect("read");
        // 59 s after the last byte it is still open; at 60 s it closes.
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(!run.is_finished());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (up, down, closed) = run.await.expect("join");
        assert_eq!((up, down, closed), (5, 2, Closed::Idle));
    }

    #[tokio::test]
    async fn a_tunnel_ends_when_a_side_closes() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (worker, mut worker_peer) = tokio::io::duplex(1024);
        let run = tokio::spawn(join(client, worker, Duration::from_secs(60)));
        client_peer.write_all(b"abc").await.expect("write");
        client_peer.shutdown().await.expect("shutdown");
        let mut got = Vec::new();
        worker_peer.read_to_end(&mut got).await.expect("read");
        worker_peer.shutdown().await.expect("shutdown");
        let (up, down, closed) = run.await.expect("join");
        assert_eq!((got.as_slice(), up, down, closed), (&b"abc"[..], 3, 0, Closed::Ended));
    }
}
