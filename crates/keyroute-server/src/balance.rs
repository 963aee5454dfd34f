//! Spreading a listener's connections over the runtime threads by how many each serves.
//!
//! Every runtime thread accepts on a socket of its own (`SO_REUSEPORT`), and the kernel picks
//! the socket by a hash of the connection's addresses: 32 connections land 16 and 16 on two
//! threads only on average, and 12 and 21 often enough (`keyroute_thread_connections_accepted`).
//! The thread with 21 then serves its clients 75% more slowly, and its requests are the tail of
//! every latency figure. So, as HAProxy does with its threads, a thread that accepts a
//! connection while it serves more than one connection more than the least busy thread hands
//! the socket over to that thread (through a channel; the socket moves from one runtime's
//! reactor to the other's), which serves it as if it had accepted it. A connection is handed
//! over at most once, before anything of it is read.
//!
//! Counted per listener: a thread's connections are those it serves now, whoever accepted them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use keyroute_fleet::metrics::ThreadMetrics;
use parking_lot::Mutex;
use tokio::sync::mpsc;

/// An accepted socket on its way to another thread.
pub(crate) type Handed = (std::net::TcpStream, SocketAddr);

/// One listener's threads: how many connections each serves, and each one's inbox.
#[derive(Debug, Default)]
pub(crate) struct Balance {
    lanes: Mutex<Vec<Option<Lane>>>,
}

#[derive(Debug)]
struct Lane {
    open: Arc<AtomicUsize>,
    inbox: mpsc::UnboundedSender<Handed>,
}

impl Balance {
    /// Runtime thread `thread` accepts on this listener: its count and its inbox.
    pub(crate) fn join(&self, thread: usize) -> (Arc<AtomicUsize>, mpsc::UnboundedReceiver<Handed>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let open = Arc::new(AtomicUsize::new(0));
        let mut lanes = self.lanes.lock();
        if lanes.len() <= thread {
            lanes.resize_with(thread + 1, || None);
        }
        lanes[thread] = Some(Lane { open: Arc::clone(&open), inbox: tx });
        (open, rx)
    }

    /// Where a connection that `thread` (serving `mine`) just accepted should go instead: the
    /// least busy other thread, when it serves at least two fewer. The connection is counted
    /// there at once (the receiver [`Serving::adopt`]s it), so that two threads deciding at the
    /// same time see each other's hand-overs; `unsent` takes it back if it never arrives.
    pub(crate) fn elsewhere(&self, thread: usize, mine: usize) -> Option<Destination> {
        let lanes = self.lanes.lock();
        let (_, lane) = lanes
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != thread)
            .filter_map(|(i, l)| Some((i, l.as_ref()?)))
            .filter(|(_, l)| !l.inbox.is_closed())
            .min_by_key(|(_, l)| l.open.load(Relaxed))?;
        if lane.open.load(Relaxed) + 1 >= mine {
            return None;
        }
        lane.open.fetch_add(1, Relaxed);
        Some(Destination { inbox: lane.inbox.clone(), open: Arc::clone(&lane.open) })
    }
}

/// A thread a connection is handed to, which counts it already.
#[derive(Debug)]
pub(crate) struct Destination {
    pub(crate) inbox: mpsc::UnboundedSender<Handed>,
    open: Arc<AtomicUsize>,
}

impl Destination {
    /// The connection did not go: no longer counted there.
    pub(crate) fn unsent(self) {
        self.open.fetch_sub(1, Relaxed);
    }
}

/// One connection served by a thread: counted while it lives, in the listener's lane and in the
/// thread's metrics.
#[derive(Debug)]
pub(crate) struct Serving(Arc<AtomicUsize>, Arc<ThreadMetrics>);

impl Serving {
    /// A connection this thread accepted.
    pub(crate) fn new(open: &Arc<AtomicUsize>, thread: &Arc<ThreadMetrics>) -> Serving {
        open.fetch_add(1, Relaxed);
        Serving::adopt(open, thread)
    }

    /// A connection handed to this thread (already counted in `open` by [`Balance::elsewhere`]).
    pub(crate) fn adopt(open: &Arc<AtomicUsize>, thread: &Arc<ThreadMetrics>) -> Serving {
        thread.open.fetch_add(1, Relaxed);
        Serving(Arc::clone(open), Arc::clone(thread))
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
        self.1.open.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_goes_to_a_thread_serving_two_fewer() {
        let b = Balance::default();
        let (a, _ra) = b.join(0);
        let (c, _rc) = b.join(1);
        let (d, _rd) = b.join(2);
        let t = Arc::new(ThreadMetrics::default());
        let held: Vec<Serving> =
            (0..3).map(|_| Serving::new(&a, &t)).chain((0..2).map(|_| Serving::new(&c, &t))).collect();
        let _d1 = Serving::new(&d, &t);
        assert_eq!(t.open.load(Relaxed), 6);
        // Thread 0 serves 3, the others 2 and 1: thread 2 is the least busy, and two fewer; the
        // connection counts there from now on.
        let to = b.elsewhere(0, a.load(Relaxed)).expect("a thread serving two fewer");
        let lane2 = b.lanes.lock()[2].as_ref().map(|l| l.inbox.clone()).expect("lane 2");
        assert!(to.inbox.same_channel(&lane2));
        assert_eq!(d.load(Relaxed), 2);
        // Now thread 0 (3) has none two fewer: 2 and 2.
        assert!(b.elsewhere(0, a.load(Relaxed)).is_none());
        to.unsent();
        assert_eq!(d.load(Relaxed), 1);
        // Thread 1 serves 2: one more than thread 2 is not enough to move a connection.
        assert!(b.elsewhere(1, c.load(Relaxed)).is_none());
        drop(held);
        assert_eq!(a.load(Relaxed), 0);
        assert!(b.elsewhere(0, 0).is_none());
    }

    #[test]
    fn a_thread_that_is_gone_is_never_chosen() {
        let b = Balance::default();
        let (_a, _ra) = b.join(0);
        let (_c, rc) = b.join(1);
        drop(rc);
        assert!(b.elsewhere(0, 10).is_none());
        let single = Balance::default();
        let _ = single.join(0);
        assert!(single.elsewhere(0, 100).is_none(), "one thread: nowhere else");
    }
}
