//! Who watches the dashboard (`GET /events`), and what a new subscriber is sent first: the one
//! owner of the feed's subscribers, its sampler's running flag and the history the sampler keeps.
//! The snapshots themselves are built by the admin API's dashboard module; this module knows nothing of
//! them but their bytes.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;

/// The subscribers and what a new one is sent first.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each subscriber's queue, and the client it is counted under.
    viewers: Vec<(std::net::IpAddr, mpsc::Sender<Bytes>)>,
    running: bool,
    history: HashMap<String, VecDeque<serde_json::Value>>,
    last: Option<Bytes>,
}

/// A new subscriber's side.
pub(crate) struct Subscription {
    /// `retry`, the history event and the last snapshot.
    pub(crate) first: Bytes,
    /// The snapshots to come.
    pub(crate) rx: mpsc::Receiver<Bytes>,
    /// The sampler is not running: the caller starts it.
    pub(crate) start_sampler: bool,
}

/// How many may subscribe.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// In all.
    pub(crate) total: usize,
    /// From one client address.
    pub(crate) per_client: usize,
}

/// Why a subscription was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Full {
    /// Every place is taken.
    Total,
    /// The client's address holds its share.
    Client,
}

impl Hub {
    /// Subscribers now.
    pub(crate) fn viewers(&self) -> usize {
        self.inner.lock().viewers.iter().filter(|(_, v)| !v.is_closed()).count()
    }

    /// Subscribes a client counted under `client` (its address, or what the caller counts
    /// clients under), with a queue of `queue` frames.
    ///
    /// # Errors
    ///
    /// [`Full`] past `limits.total` subscribers, or past `limits.per_client` under `client`: one
    /// address cannot shut the others out.
    pub(crate) fn subscribe(
        &self,
        client: std::net::IpAddr,
        limits: Limits,
        queue: usize,
    ) -> Result<Subscription, Full> {
        let mut inner = self.inner.lock();
        inner.viewers.retain(|(_, v)| !v.is_closed());
        if inner.viewers.len() >= limits.total {
            return Err(Full::Total);
        }
        if inner.viewers.iter().filter(|(c, _)| *c == client).count() >= limits.per_client {
            return Err(Full::Client);
        }
        let (tx, rx) = mpsc::channel(queue);
        let mut first = String::from("retry: 2000\n\n");
        let history = serde_json::json!({ "version": 1, "pools": inner.history });
        first.push_str(&format!("event: history\ndata: {history}\n\n"));
        if let Some(last) = &inner.last {
            first.push_str(&String::from_utf8_lossy(last));
        }
        inner.viewers.push((client, tx));
        let start_sampler = !inner.running;
        inner.running = true;
        Ok(Subscription { first: Bytes::from(first), rx, start_sampler })
    }

    /// At a sampler's tick: how many watch, or `None` when nobody does, and then the sampler
    /// ends (its history goes with it).
    pub(crate) fn watched(&self) -> Option<usize> {
        let mut inner = self.inner.lock();
        inner.viewers.retain(|(_, v)| !v.is_closed());
        if inner.viewers.is_empty() {
            *inner = Inner::default();
            return None;
        }
        Some(inner.viewers.len())
    }

    /// Sends a snapshot to every subscriber (one that is not reading misses it), and keeps each
    /// pool's affinity point, up to `history` of them.
    pub(crate) fn publish(&self, frame: Bytes, affinity: Vec<(String, serde_json::Value)>, history: usize) {
        let mut inner = self.inner.lock();
        inner.history.retain(|pool, _| affinity.iter().any(|(p, _)| p == pool));
        for (pool, point) in affinity {
            let h = inner.history.entry(pool).or_default();
            if h.len() == history {
                h.pop_front();
            }
            h.push_back(point);
        }
        for (_, v) in &inner.viewers {
            let _ = v.try_send(frame.clone());
        }
        inner.last = Some(frame);
    }

    /// Ends every subscriber's stream and the sampler (shutdown).
    pub(crate) fn close(&self) {
        *self.inner.lock() = Inner::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: Limits = Limits { total: 2, per_client: 2 };

    fn lo() -> std::net::IpAddr {
        std::net::Ipv4Addr::LOCALHOST.into()
    }

    #[test]
    fn the_sampler_runs_while_someone_watches() {
        let hub = Hub::default();
        let a = hub.subscribe(lo(), TWO, 4).expect("first");
        assert!(a.start_sampler);
        let mut b = hub.subscribe(lo(), TWO, 4).expect("second");
        assert!(!b.start_sampler);
        assert_eq!(hub.subscribe(lo(), TWO, 4).err(), Some(Full::Total), "past the limit");
        assert_eq!(hub.watched(), Some(2));
        hub.publish(Bytes::from_static(b"data: 1\n\n"), vec![("p".into(), serde_json::json!({"t": 1}))], 2);
        assert_eq!(b.rx.try_recv().ok(), Some(Bytes::from_static(b"data: 1\n\n")));
        // A new subscriber gets the history and the last snapshot first.
        drop(a);
        let c = hub.subscribe(lo(), TWO, 4).expect("a place freed");
        let first = String::from_utf8_lossy(&c.first).into_owned();
        assert!(first.contains(r#""pools":{"p":[{"t":1}]}"#) && first.ends_with("data: 1\n\n"), "{first}");
        drop((b, c));
        // Nobody left: the sampler ends and forgets; the next subscriber starts it again.
        assert_eq!(hub.watched(), None);
        let d = hub.subscribe(lo(), TWO, 4).expect("again");
        assert!(d.start_sampler && String::from_utf8_lossy(&d.first).contains(r#""pools":{}"#));
    }

    /// Issue 31, defect 17: one address held all 64 subscriptions.
    #[test]
    fn one_address_holds_its_share_only() {
        let hub = Hub::default();
        let limits = Limits { total: 4, per_client: 2 };
        let other: std::net::IpAddr = "10.0.0.2".parse().expect("ip");
        let held: Vec<_> = (0..2).map(|_| hub.subscribe(lo(), limits, 4).expect("its share")).collect();
        assert_eq!(hub.subscribe(lo(), limits, 4).err(), Some(Full::Client));
        let theirs = hub.subscribe(other, limits, 4).expect("another address");
        drop(held);
        assert!(hub.subscribe(lo(), limits, 4).is_ok(), "a place freed");
        drop(theirs);
    }
}
