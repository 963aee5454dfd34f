//! Where a pool's hot keys have copies, so that no copy is ever served older than the last write
//! the proxy forwarded (the cache listeners' hot-key replicas, issue 31).
//!
//! A hot key's reads spread over its replicas; a replica that misses is *filled*: the value is
//! read from the key's owner and copied to the replica, with a bounded lifetime
//! ([`COPY_LIFETIME`]). Two things could then serve a value older than an acknowledged write:
//!
//! 1. **A copy that outlives the key's hot period.** A write of a key that is no longer hot goes
//!    to its owner only, while its replicas may still hold copies that a later hot period reads.
//!    So every fill records its replica here, and a write deletes the copies of every replica that
//!    may still hold one, hot or not, until the last copy's lifetime is over.
//! 2. **A fill that races a write.** A fill reads the owner before a write reaches it and copies
//!    the old value after the write deleted the copies. So each key has a *write epoch* and a
//!    *fill lock*: a fill takes the epoch before it reads the owner, and writes its copy only if
//!    the epoch is unchanged, holding the lock until the replica acknowledged the copy; a write,
//!    once its owner acknowledged it, advances the epoch, waits for the lock (a fill landing now
//!    lands before), and then deletes the copies. A fill either read the new value, or sees the
//!    new epoch and drops its copy, or lands before the write's deletes.
//!
//! Within one gateway process (the registry is the pool's, shared by its threads). Copies made by
//! another gateway are not known here: with several gateways in front of one pool, a copy made by
//! one may be served stale by it for up to [`COPY_LIFETIME`] after another forwarded a write.
//!
//! Cost: nothing on a read; on a write, one atomic load while no copy exists anywhere in the
//! pool, else one lookup under a lock. The registry holds only keys that were filled within the
//! last lifetime, and is swept by the hot-key ticker.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The longest a hot key's copy on a replica lives: Redis copies are set with `PX` of at most
/// this, memcached copies with `T` of at most this many seconds. It bounds how long the registry
/// remembers a copy, and how stale a copy made by another gateway can be.
pub(crate) const COPY_LIFETIME: Duration = Duration::from_secs(10);

/// How much longer than its lifetime a copy is still counted as present: memcached's clock ticks
/// in whole seconds, so a copy set for 10 s may be served for up to a second more.
const COPY_MARGIN: Duration = Duration::from_secs(2);

/// The copies of one pool's keys on servers other than their owners. See the
/// [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct Copies {
    keys: Mutex<HashMap<u64, Entry>>,
    /// The number of keys in `keys`: a write checks it first, without the lock.
    tracked: AtomicUsize,
}

#[derive(Debug)]
struct Entry {
    /// The servers that may hold a copy.
    holders: Vec<SocketAddr>,
    /// Until when a copy may still be served.
    until: Instant,
    /// Advanced by every write the owner acknowledged.
    epoch: u64,
    /// Held by a fill from its epoch check until its copy is acknowledged.
    fill: Arc<tokio::sync::Mutex<()>>,
}

/// A fill under way: its key, and the write epoch it started in.
#[derive(Debug)]
pub(crate) struct Fill {
    hash: u64,
    epoch: u64,
    lock: Arc<tokio::sync::Mutex<()>>,
}

/// A fill allowed to write its copy: the key's fill lock, held until [`Landing::landed`].
#[derive(Debug)]
pub(crate) struct Landing {
    hash: u64,
    _held: tokio::sync::OwnedMutexGuard<()>,
}

impl Copies {
    /// A fill of `hash`'s copy onto `holder` starts (before the owner is read): the holder is
    /// recorded, so that from now on a write deletes its copy.
    pub(crate) fn begin_fill(&self, hash: u64, holder: SocketAddr, now: Instant) -> Fill {
        let mut keys = self.keys.lock();
        let entry = keys.entry(hash).or_insert_with(|| Entry {
            holders: Vec::new(),
            until: now,
            epoch: 0,
            fill: Arc::new(tokio::sync::Mutex::new(())),
        });
        if !entry.holders.contains(&holder) {
            entry.holders.push(holder);
        }
        entry.until = entry.until.max(now + COPY_LIFETIME + COPY_MARGIN);
        let fill = Fill { hash, epoch: entry.epoch, lock: Arc::clone(&entry.fill) };
        self.tracked.store(keys.len(), Relaxed);
        fill
    }

    /// Whether `fill` may write its copy: `None` when a write was acknowledged since it started
    /// (what it read may be older than that write). While the [`Landing`] lives, no write's
    /// deletes are sent.
    pub(crate) async fn landing(&self, fill: Fill) -> Option<Landing> {
        let held = fill.lock.lock_owned().await;
        let current = self.keys.lock().get(&fill.hash).map(|e| e.epoch);
        (current == Some(fill.epoch)).then_some(Landing { hash: fill.hash, _held: held })
    }

    /// The copy was acknowledged (or not): it lives [`COPY_LIFETIME`] from now at most.
    pub(crate) fn landed(&self, landing: Landing, now: Instant) {
        if let Some(e) = self.keys.lock().get_mut(&landing.hash) {
            e.until = e.until.max(now + COPY_LIFETIME + COPY_MARGIN);
        }
    }

    /// The servers that may hold a copy of `hash` now, for a write's deletes in its own batch
    /// (before any read after it on the same connections); empty at the cost of one atomic load
    /// when no key of the pool has copies.
    pub(crate) fn holders(&self, hash: u64, now: Instant) -> Vec<SocketAddr> {
        if self.tracked.load(Relaxed) == 0 {
            return Vec::new();
        }
        match self.keys.lock().get(&hash) {
            Some(e) if e.until > now => e.holders.clone(),
            _ => Vec::new(),
        }
    }

    /// A write of `hash` was acknowledged by its owner: the write epoch advances (a fill that
    /// read before it drops its copy), a fill landing now is waited for, and the servers whose
    /// copies must then be deleted are returned.
    pub(crate) async fn written(&self, hash: u64, now: Instant) -> Vec<SocketAddr> {
        if self.tracked.load(Relaxed) == 0 {
            return Vec::new();
        }
        let (lock, holders) = {
            let mut keys = self.keys.lock();
            let Some(e) = keys.get_mut(&hash) else { return Vec::new() };
            e.epoch += 1;
            if e.until <= now {
                return Vec::new();
            }
            (Arc::clone(&e.fill), e.holders.clone())
        };
        drop(lock.lock().await);
        holders
    }

    /// Forgets the keys whose last copy's lifetime is over (the hot-key ticker, off the request
    /// path). A key with a fill under way is kept: the fill's lock is shared.
    pub(crate) fn sweep(&self, now: Instant) {
        let mut keys = self.keys.lock();
        keys.retain(|_, e| e.until > now || Arc::strong_count(&e.fill) > 1);
        self.tracked.store(keys.len(), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// A fill that started before an acknowledged write never lands; one that started after does;
    /// a write waits for a fill landing meanwhile; holders are remembered for the copies'
    /// lifetime, hot or not, and then forgotten.
    #[tokio::test(start_paused = true)]
    async fn a_fill_never_lands_after_a_later_write() {
        let copies = Copies::default();
        let now = Instant::now();
        assert!(copies.holders(1, now).is_empty());
        let stale = copies.begin_fill(1, addr(1), now);
        assert_eq!(copies.holders(1, now), [addr(1)]);
        // A write acknowledged after the fill read the owner: the fill is dropped.
        assert_eq!(copies.written(1, now).await, [addr(1)]);
        assert!(copies.landing(stale).await.is_none(), "a fill older than a write never lands");
        // A fill after the write lands, and a write meanwhile waits for it.
        let fresh = copies.begin_fill(1, addr(2), now);
        let landing = copies.landing(fresh).await.expect("no write since");
        let copies = Arc::new(copies);
        let writer = tokio::spawn({
            let copies = Arc::clone(&copies);
            async move { copies.written(1, now).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!writer.is_finished(), "the write's deletes wait for the landing fill");
        copies.landed(landing, Instant::now());
        assert_eq!(writer.await.expect("join"), [addr(1), addr(2)]);
        // Remembered for the copies' lifetime, then swept.
        let later = Instant::now() + COPY_LIFETIME + COPY_MARGIN + Duration::from_secs(1);
        assert!(copies.holders(1, later).is_empty());
        assert!(copies.written(1, later).await.is_empty());
        copies.sweep(later);
        assert_eq!(copies.tracked.load(Relaxed), 0);
    }
}
