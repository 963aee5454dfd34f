//! Two transports joined after a protocol switch (WebSocket and other upgrades), through the
//! thread's read buffer: a tunnel holds no buffer of its own.
//!
//! Each direction reads what its source has into the thread's buffer ([`Transport::poll_read_bytes`])
//! and writes it to the other side at once. What the other side does not take stays pending (and
//! nothing more is read from the source until it is written: back-pressure); a remainder is moved
//! into an allocation of its own, so that a stalled tunnel never pins a block of the thread's
//! buffer. An idle tunnel, the common case, owns nothing but its two transports. When a source
//! ends, the other side's write half is shut once its pending bytes are written; the tunnel ends
//! when both directions have, when a transport fails, or when nothing has moved either way for
//! the idle timeout.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::time::Instant;

use crate::server::Transport;

/// How a tunnel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Both sides ended, and everything was written.
    Ended,
    /// Nothing moved for the idle timeout.
    Idle,
    /// A transport failed.
    Failed,
}

/// One direction: bytes read from one side, to be written to the other.
#[derive(Default)]
struct Direction {
    pending: Bytes,
    /// The source has ended.
    ended: bool,
    /// The destination's write half is shut (after the source ended).
    shut: bool,
    /// Bytes read from the source.
    moved: u64,
}

/// The result of driving one direction as far as it goes.
enum Drive {
    /// Waiting for the source or the destination.
    Waiting {
        progressed: bool,
    },
    Failed,
}

impl Direction {
    fn done(&self) -> bool {
        self.ended && self.pending.is_empty() && self.shut
    }

    fn drive<A: Transport, B: Transport>(&mut self, from: &mut A, to: &mut B, cx: &mut Context<'_>) -> Drive {
        let mut progressed = false;
        loop {
            if !self.pending.is_empty() {
                match Pin::new(&mut *to).poll_write(cx, &self.pending) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Drive::Failed,
                    Poll::Ready(Ok(n)) => {
                        self.pending.advance(n);
                        progressed = true;
                        continue;
                    }
                    Poll::Pending => {
                        // Waiting on a slow reader: keep the rest in an allocation of its own.
                        if self.pending.len() < crate::buf::BLOCK {
                            self.pending = Bytes::copy_from_slice(&self.pending);
                        }
                        return Drive::Waiting { progressed };
                    }
                }
            }
            if self.ended {
                if !self.shut {
                    match Pin::new(&mut *to).poll_flush(cx).map(|r| r.and(Ok(()))) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(_)) => return Drive::Failed,
                        Poll::Pending => return Drive::Waiting { progressed },
                    }
                    match Pin::new(&mut *to).poll_shutdown(cx) {
                        // The other side may have gone already: the direction is over either way.
                        Poll::Ready(_) => {
                            self.shut = true;
                            progressed = true;
                        }
                        Poll::Pending => return Drive::Waiting { progressed },
                    }
                }
                return Drive::Waiting { progressed };
            }
            match Pin::new(&mut *from).poll_read_bytes(cx) {
                Poll::Ready(Ok(b)) if b.is_empty() => {
                    self.ended = true;
                    progressed = true;
                }
                Poll::Ready(Ok(b)) => {
                    self.moved += b.len() as u64;
                    self.pending = b;
                    progressed = true;
                }
                Poll::Ready(Err(_)) => return Drive::Failed,
                Poll::Pending => {
                    // Flush what a buffered transport (TLS) holds before waiting for more.
                    if progressed && let Poll::Ready(Err(_)) = Pin::new(&mut *to).poll_flush(cx) {
                        return Drive::Failed;
                    }
                    return Drive::Waiting { progressed };
                }
            }
        }
    }
}

/// Joins `a` and `b` until both sides end, one fails, or nothing moves for `idle`. `to_a` and
/// `to_b` are bytes already read that belong to the other side (what each sent past its head).
/// Returns the bytes read from `a` (to `b`), from `b` (to `a`), and how it ended.
pub async fn join<A: Transport, B: Transport>(
    mut a: A,
    to_a: Bytes,
    mut b: B,
    to_b: Bytes,
    idle: Duration,
) -> (u64, u64, Closed) {
    let mut a_to_b = Direction { pending: to_b, ..Direction::default() };
    let mut b_to_a = Direction { pending: to_a, ..Direction::default() };
    let mut quiet = Box::pin(tokio::time::sleep(idle));
    let closed = poll_fn(|cx| {
        let one = a_to_b.drive(&mut a, &mut b, cx);
        let two = b_to_a.drive(&mut b, &mut a, cx);
        match (one, two) {
            (Drive::Failed, _) | (_, Drive::Failed) => return Poll::Ready(Closed::Failed),
            (Drive::Waiting { progressed: p1 }, Drive::Waiting { progressed: p2 }) => {
                if a_to_b.done() && b_to_a.done() {
                    return Poll::Ready(Closed::Ended);
                }
                if p1 || p2 {
                    quiet.as_mut().reset(Instant::now() + idle);
                }
            }
        }
        match quiet.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Closed::Idle),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    (a_to_b.moved, b_to_a.moved, closed)
}

impl Transport for tokio::io::DuplexStream {}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn bytes_both_ways_then_idle() {
        let (a, mut a_peer) = tokio::io::duplex(1024);
        let (b, mut b_peer) = tokio::io::duplex(1024);
        let run = tokio::spawn(join(a, Bytes::from_static(b"early"), b, Bytes::new(), Duration::from_secs(60)));
        let mut five = [0u8; 5];
        a_peer.read_exact(&mut five).await.expect("read");
        assert_eq!(&five, b"early");
        a_peer.write_all(b"hello").await.expect("write");
        b_peer.read_exact(&mut five).await.expect("read");
        assert_eq!(&five, b"hello");
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(!run.is_finished());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(run.await.expect("join"), (5, 0, Closed::Idle));
    }

    #[tokio::test]
    async fn ends_when_both_sides_end() {
        let (a, mut a_peer) = tokio::io::duplex(1024);
        let (b, mut b_peer) = tokio::io::duplex(1024);
        let run = tokio::spawn(join(a, Bytes::new(), b, Bytes::new(), Duration::from_secs(60)));
        a_peer.write_all(b"ping").await.expect("write");
        a_peer.shutdown().await.expect("shutdown");
        let mut got = Vec::new();
        b_peer.read_to_end(&mut got).await.expect("read to the end");
        assert_eq!(got, b"ping");
        b_peer.write_all(b"pong").await.expect("write");
        drop(b_peer);
        let mut back = Vec::new();
        a_peer.read_to_end(&mut back).await.expect("read to the end");
        assert_eq!(back, b"pong");
        assert_eq!(run.await.expect("join"), (4, 4, Closed::Ended));
    }
}
