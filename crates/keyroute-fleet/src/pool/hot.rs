//! A pool's hot keys at run time: the detector the request path feeds, the replication rule a
//! timer ticks, and the [`HotSet`] requests read. What a protocol does with a hot key (the HTTP
//! gateway's response cache, the cache proxy's copies on replicas) is the protocol's.
//!
//! The algorithm and its guarantees are the library's ([`keyroute::hot`]); this module is the
//! plumbing:
//!
//! - **Request path.** [`HotKeysState::observe`] counts the request in a per-thread counter and,
//!   one request in `sample_every`, offers its key hash to the shared Space-Saving summary under a
//!   `try_lock` (a sample lost to contention is lost for the hot key and for the total alike, so
//!   rates stay unbiased). [`HotKeysState::replicas`] is one atomic load and a binary search of
//!   the published [`HotSet`] (empty: one length check).
//! - **Off the path.** The server's ticker ends each pool's window every `window_ms` ([`HotKeysState::tick`]): the summary's counts
//!   become rates, the rule applies its hysteresis, and the new set is swapped in.
//! - **State.** The state lives as long as the pool's `hot_keys` settings do: a snapshot built for
//!   a membership change carries the same `Arc`, a reload that changes the settings starts over.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use std::time::Duration;

use arc_swap::ArcSwap;
use keyroute::hot::{HotKeys, HotSet, SpaceSaving, Window};
use tokio::time::Instant;

use crate::config::HotKeysConfig;

/// A hot key as the admin API's `GET /hotkeys` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct HotKeyInfo {
    /// The key's text, once a sampled request showed it, if the pool shows key text
    /// (`hot_keys.show_keys`).
    pub key: Option<String>,
    /// The key's hash.
    pub hash: u64,
    /// Its measured rate, requests per second.
    pub rate: f64,
    /// Its replica count.
    pub replicas: usize,
    /// Its replicas: the first `replicas` workers of its ranking.
    pub owners: Vec<String>,
}

/// Counters of one pool's hot keys.
#[derive(Debug, Default)]
pub struct HotMetrics {
    /// Requests for a hot key (any replica).
    pub hot_requests: AtomicU64,
    /// Keys that became hot.
    pub became_hot: AtomicU64,
}

/// One pool's hot-key state. See the [module documentation](self).
#[derive(Debug)]
pub struct HotKeysState {
    pub config: HotKeysConfig,
    summary: Mutex<SpaceSaving>,
    rule: Mutex<HotKeys>,
    set: ArcSwap<HotSet>,
    /// The key text of hot hashes, for `/hotkeys` (only hot keys are kept, and only when the pool
    /// shows key text).
    names: Mutex<HashMap<u64, String>>,
    window_start: Mutex<Instant>,
    created: Instant,
    id: u64,
    /// Counters.
    pub metrics: HotMetrics,
}

/// Per-thread sampling counters, one per hot-key state (by its id, modulo the slots): a state
/// samples one in `sample_every` of its own requests on each thread, whatever other pools the
/// thread serves. More than `SLOTS` states on one thread share slots, which only blurs which
/// requests are sampled, not how many.
const SLOTS: usize = 8;

thread_local! {
    static SEEN: [Cell<(u64, u32)>; SLOTS] = const { [const { Cell::new((0, 0)) }; SLOTS] };
}

/// Ids of hot-key states, from 1.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl HotKeysState {
    /// The state for validated settings.
    pub fn new(config: HotKeysConfig, now: Instant) -> Option<Self> {
        let summary = SpaceSaving::try_new(config.counters).ok()?;
        let mut rule = HotKeys::try_new(config.rule).ok()?;
        // The rule's clock counts from the state's creation: the first window starts now.
        rule.start(Duration::ZERO);
        Some(HotKeysState {
            config,
            summary: Mutex::new(summary),
            rule: Mutex::new(rule),
            set: ArcSwap::from_pointee(HotSet::default()),
            names: Mutex::new(HashMap::new()),
            window_start: Mutex::new(now),
            created: now,
            id: NEXT_ID.fetch_add(1, Relaxed),
            metrics: HotMetrics::default(),
        })
    }

    /// Notes one request for `hash`, whose key text is `key` (the request path). A sampled request
    /// for a hot key whose text is not known yet leaves its text for `/hotkeys`.
    #[inline]
    pub fn observe(&self, hash: u64, key: &str) {
        let every = self.config.sample_every;
        let sampled = SEEN.with(|slots| {
            let slot = &slots[(self.id % SLOTS as u64) as usize];
            let (id, n) = slot.get();
            let n = if id == self.id { n.wrapping_add(1) } else { 1 };
            slot.set((self.id, n));
            n.is_multiple_of(every)
        });
        if !sampled {
            return;
        }
        if let Some(mut s) = self.summary.try_lock() {
            s.offer(hash);
        }
        if self.config.show_keys
            && self.replicas(hash) > 0
            && let Some(mut names) = self.names.try_lock()
            && names.len() < 4 * self.config.counters
        {
            names.entry(hash).or_insert_with(|| key.to_owned());
        }
    }

    /// The replica count of `hash`: 0 if it is not hot.
    #[inline]
    pub fn replicas(&self, hash: u64) -> usize {
        self.set.load().replicas(hash)
    }

    /// Ends the window if it is over at `now`: measures, applies the rule, publishes the set.
    pub fn tick(&self, now: Instant) {
        {
            let mut start = self.window_start.lock();
            if now.saturating_duration_since(*start) < self.config.window {
                return;
            }
            *start = now;
        }
        let window = {
            let mut summary = self.summary.lock();
            let w = Window::of(&summary, self.config.sample_every);
            summary.clear();
            w
        };
        let (set, entered) = {
            let mut rule = self.rule.lock();
            let before: Vec<u64> = rule.keys().iter().map(|k| k.hash).collect();
            let set = rule.tick(now.saturating_duration_since(self.created), &window);
            let entered = rule.keys().iter().filter(|k| !before.contains(&k.hash)).count();
            (set, entered)
        };
        self.metrics.became_hot.fetch_add(entered as u64, Relaxed);
        self.names.lock().retain(|h, _| set.replicas(*h) > 0);
        self.set.store(Arc::new(set));
    }

    /// The hot keys now, hottest first, each with its replicas in `snap`'s table.
    pub fn report(&self, snap: &super::Snapshot) -> Vec<HotKeyInfo> {
        let names = self.names.lock();
        let rule = self.rule.lock();
        rule.keys()
            .iter()
            .map(|k| HotKeyInfo {
                key: names.get(&k.hash).cloned(),
                hash: k.hash,
                rate: k.rate,
                replicas: k.replicas,
                owners: snap.policy.ranked(k.hash).take(k.replicas).map(|i| snap.workers[i].name.clone()).collect(),
            })
            .collect()
    }

    /// The published set.
    pub fn set(&self) -> Arc<HotSet> {
        self.set.load_full()
    }
}
