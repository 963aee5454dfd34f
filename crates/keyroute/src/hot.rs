//! Hot keys: find the few keys that carry a large share of the traffic, and give each of them as
//! many owners as its rate needs, the first few of its own ranking.
//!
//! Consistent hashing sends every request for a key to one node. That is what keeps caches warm,
//! and it is also why "a popular image can overload that worker while the others sit idle": no
//! hash spreads one key. Bounded loads ([`crate::bounded`]) caps the owner's load and spills the
//! excess to the key's runner-up, then the next, so the key ends up cached wherever there was room.
//! This module does it the other way round: it *measures* each hot key's rate, decides how many
//! nodes it needs (`r`), and serves it from the least loaded of its top-`r` nodes. The set of nodes
//! that cache it is the smallest that can carry it, and it is the same on every gateway that gives
//! the key the same `r`, because it is a prefix of the key's ranking.
//!
//! # The parts
//!
//! - [`SpaceSaving`]: a heavy-hitter summary over 64-bit key hashes (Metwally, Agrawal and
//!   El Abbadi, *Efficient Computation of Frequent and Top-k Elements in Data Streams*, ICDT 2005).
//! - [`HotKeyDetector`]: a summary fed with one request in `sample_every` (a counter, not
//!   randomness: two detectors fed the same request sequence sample the same requests; a gateway
//!   with several threads samples each thread's share).
//! - [`HotKeys`]: the replication rule with hysteresis. Each window it turns the summary's counts
//!   into rates, and publishes a [`HotSet`] (hash -> replica count): the immutable value the
//!   request path reads.
//! - [`pick_replica`]: the least loaded of a key's top-`r` nodes.
//!
//! # Guarantees
//!
//! - **Error bound** (Space-Saving, `k` counters, `N` items offered): every monitored item has a
//!   count `c` and an error `e` with `c - e <= true count <= c`, `e <= N / k`; every item whose true
//!   count exceeds `N / k` is monitored. `tests/hot.rs` checks both on Zipf streams, exactly, for
//!   every item. Sampling one request in `s` adds the binomial error of the sample: a key with true
//!   rate `f` per window is estimated within `sqrt(f s)` (one standard deviation) plus `s N / k`.
//! - **No false hot keys from the summary's error, few from noise.** A key enters on its
//!   *guaranteed* count `c - e`, so a key is hot only if at least that many of the sampled requests
//!   were for it; with `confidence = z`, only once `c - e - z sqrt((c - e) s)` clears the threshold
//!   (its count's Poisson and sampling noise), so a lucky window neither makes a key hot nor adds a
//!   replica (`tests/hot.rs`: a key at 75% of the threshold never enters over 400 windows at
//!   `z = 2`, and does at `z = 0`). A key enters on one window's evidence; it grows on the
//!   evidence of its recent windows (decayed by [`EVIDENCE_DECAY`] per window).
//! - **Hysteresis.** A key enters at rate `T` and leaves below `T / 2`, and never before it has
//!   been hot for `hold`. Its replica count grows as soon as each replica would carry more than
//!   `per_replica` requests per second, and shrinks only when the remaining replicas would carry
//!   less than half of that, and not within `hold` of its last change. `tests/hot.rs` drives rates
//!   around each threshold and checks that no decision flaps.
//! - **Replicas are the key's top nodes.** [`pick_replica`] only ever returns one of the first `r`
//!   nodes of the key's ranking (or, when none of them is eligible, the first eligible node after
//!   them: ordinary failover).
//!
//! # Cost
//!
//! [`HotKeyDetector::observe`] is one counter increment per request, and one [`SpaceSaving::offer`]
//! (a scan of `k` hashes, vectorised) per sampled request: 5.7-8.3 ns per request with `k = 64`
//! and `s = 16`, 4.5-5.8 ns for the gateway's path (a per-thread counter, and a `try_lock` only for
//! the sampled request); an `offer` alone is 59-76 ns, a [`HotSet`] lookup 3-5 ns
//! (`cargo bench -p keyroute-bench --bench placement -- hot/`). Memory: 24 bytes per counter
//! (`k = 64`: 1,536 bytes), plus the [`HotSet`] (16 bytes per hot key).
//! [`HotKeys::tick`] runs once per window, off the request path: `O(k log k)`.
//!
//! # When to use it
//!
//! A cache-affine fleet where a single key's rate can exceed what one node serves even from cache
//! (a viral image, a celebrity's profile). Every other key keeps its single owner and its cache.

use std::time::Duration;

use crate::bounded::Choice;
use crate::{Error, LoadView, NodeSet};

/// A Space-Saving summary of `k` counters over 64-bit hashes. See the [module documentation](self).
///
/// The hashes are assumed to be well mixed (they are key hashes); the value 0 is allowed.
#[derive(Clone, Debug)]
pub struct SpaceSaving {
    hashes: Vec<u64>,
    counts: Vec<u64>,
    errors: Vec<u64>,
    total: u64,
    capacity: usize,
}

/// One monitored item of a [`SpaceSaving`] summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    /// The item's hash.
    pub hash: u64,
    /// Its count: at least its true count.
    pub count: u64,
    /// The most its count may exceed its true count by.
    pub error: u64,
}

impl Counted {
    /// The guaranteed count: at most the true count.
    pub fn guaranteed(&self) -> u64 {
        self.count - self.error
    }
}

impl SpaceSaving {
    /// A summary of `counters` counters (at least 1; 64 is plenty to find keys above 2% of traffic).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidParameter`](crate::ErrorKind::InvalidParameter) for 0 or more than 65,536
    /// counters.
    pub fn try_new(counters: usize) -> Result<Self, Error> {
        if counters == 0 || counters > 65_536 {
            return Err(Error::invalid_parameter("counters must be in 1..=65536"));
        }
        Ok(SpaceSaving {
            hashes: Vec::with_capacity(counters),
            counts: Vec::with_capacity(counters),
            errors: Vec::with_capacity(counters),
            total: 0,
            capacity: counters,
        })
    }

    /// The number of counters.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Items offered since the last [`SpaceSaving::clear`].
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The bytes of the counters.
    pub fn memory_bytes(&self) -> usize {
        self.capacity * 3 * std::mem::size_of::<u64>()
    }

    /// Counts one occurrence of `hash`: its counter if it has one, else a free counter, else the
    /// smallest counter is taken over (its count becomes the new item's error).
    #[inline]
    pub fn offer(&mut self, hash: u64) {
        self.total += 1;
        if let Some(i) = self.hashes.iter().position(|&h| h == hash) {
            self.counts[i] += 1;
            return;
        }
        if self.hashes.len() < self.capacity {
            self.hashes.push(hash);
            self.counts.push(1);
            self.errors.push(0);
            return;
        }
        let mut min = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            if c < self.counts[min] {
                min = i;
            }
        }
        let floor = self.counts[min];
        self.hashes[min] = hash;
        self.counts[min] = floor + 1;
        self.errors[min] = floor;
    }

    /// The monitored items, highest count first (ties by hash, so the order is deterministic).
    pub fn top(&self) -> Vec<Counted> {
        let mut v: Vec<Counted> = (0..self.hashes.len())
            .map(|i| Counted { hash: self.hashes[i], count: self.counts[i], error: self.errors[i] })
            .collect();
        v.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.hash.cmp(&b.hash)));
        v
    }

    /// The item's entry, if it is monitored.
    pub fn get(&self, hash: u64) -> Option<Counted> {
        let i = self.hashes.iter().position(|&h| h == hash)?;
        Some(Counted { hash, count: self.counts[i], error: self.errors[i] })
    }

    /// Forgets everything (a new window).
    pub fn clear(&mut self) {
        self.hashes.clear();
        self.counts.clear();
        self.errors.clear();
        self.total = 0;
    }
}

/// A [`SpaceSaving`] summary fed one request in `sample_every`.
#[derive(Clone, Debug)]
pub struct HotKeyDetector {
    summary: SpaceSaving,
    sample_every: u32,
    seen: u64,
}

impl HotKeyDetector {
    /// A detector of `counters` counters sampling one request in `sample_every` (1 = every one).
    ///
    /// # Errors
    ///
    /// As [`SpaceSaving::try_new`], and `sample_every` 0.
    pub fn try_new(counters: usize, sample_every: u32) -> Result<Self, Error> {
        if sample_every == 0 {
            return Err(Error::invalid_parameter("sample_every must be at least 1"));
        }
        Ok(HotKeyDetector { summary: SpaceSaving::try_new(counters)?, sample_every, seen: 0 })
    }

    /// Notes one request for `hash`.
    #[inline]
    pub fn observe(&mut self, hash: u64) {
        self.seen += 1;
        if self.seen.is_multiple_of(u64::from(self.sample_every)) {
            self.summary.offer(hash);
        }
    }

    /// Requests observed in this window.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The sampling period.
    pub fn sample_every(&self) -> u32 {
        self.sample_every
    }

    /// The summary of the sampled requests.
    pub fn summary(&self) -> &SpaceSaving {
        &self.summary
    }

    /// Ends the window: the requests seen, the summary's items (counts scaled back to requests), and
    /// a fresh start.
    pub fn take_window(&mut self) -> Window {
        let mut w = Window::of(&self.summary, self.sample_every);
        w.requests = self.seen;
        self.summary.clear();
        self.seen = 0;
        w
    }
}

/// One window's counts: what [`HotKeys::tick`] reads. Several detectors' windows (one per thread,
/// or per gateway) can be [merged](Window::merge).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// Requests in the window.
    pub requests: u64,
    /// The counted items (in requests, not samples).
    pub items: Vec<Counted>,
    /// One request in this many was sampled (0 or 1: all): a count `c` is then known to within
    /// `sqrt(c * sample_every)` (one standard deviation).
    pub sample_every: u32,
}

impl Window {
    /// The window of a summary fed one request in `sample_every`: counts scaled back to requests
    /// (`requests` is the summary's total times `sample_every`). Noise is the rule's to discount
    /// ([`HotKeyConfig::confidence`]): every item is reported, so that a hot key's falling rate is
    /// seen falling.
    pub fn of(summary: &SpaceSaving, sample_every: u32) -> Window {
        let s = u64::from(sample_every.max(1));
        let items = summary
            .top()
            .into_iter()
            .map(|c| Counted { hash: c.hash, count: c.count.saturating_mul(s), error: c.error.saturating_mul(s) })
            .collect();
        Window { requests: summary.total().saturating_mul(s), items, sample_every: sample_every.max(1) }
    }

    /// Adds another detector's window over the same period: counts and errors add (an item one
    /// summary does not hold may have had up to that summary's smallest count there, which is
    /// added to its error).
    pub fn merge(&mut self, other: &Window) {
        let floor = |w: &Window, full: bool| if full { w.items.iter().map(|c| c.count).min().unwrap_or(0) } else { 0 };
        let (mine, theirs) = (floor(self, !self.items.is_empty()), floor(other, !other.items.is_empty()));
        let mut merged: Vec<Counted> = Vec::with_capacity(self.items.len() + other.items.len());
        for c in &self.items {
            match other.items.iter().find(|o| o.hash == c.hash) {
                Some(o) => merged.push(Counted { hash: c.hash, count: c.count + o.count, error: c.error + o.error }),
                None => merged.push(Counted { hash: c.hash, count: c.count + theirs, error: c.error + theirs }),
            }
        }
        for o in &other.items {
            if !self.items.iter().any(|c| c.hash == o.hash) {
                merged.push(Counted { hash: o.hash, count: o.count + mine, error: o.error + mine });
            }
        }
        merged.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.hash.cmp(&b.hash)));
        self.requests += other.requests;
        self.items = merged;
    }
}

/// When a key is hot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Threshold {
    /// At this many requests per second.
    Rate(f64),
    /// At this share of all requests, in (0, 1].
    Share(f64),
}

/// The replication rule's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HotKeyConfig {
    /// When a key becomes hot (it stops being hot below half of it).
    pub threshold: Threshold,
    /// The rate one replica of a hot key should stay under: a key at rate `x` gets
    /// `ceil(x / per_replica)` replicas.
    pub per_replica: f64,
    /// The most replicas a key gets.
    pub max_replicas: usize,
    /// The least time between two changes of a key's replica count, and the least time a key stays
    /// hot.
    pub hold: Duration,
    /// How sure a key must be to enter or to grow, in standard deviations of its count (Poisson
    /// noise, and sampling): a key enters when `c - z sqrt(c s)` (count `c`, one in `s` sampled)
    /// says so, not on a lucky window. 0 decides on the count itself; 2 (about 98% one-sided) is
    /// what the gateway uses. Shrinking and leaving use the smoothed estimate.
    pub confidence: f64,
}

impl HotKeyConfig {
    /// Checks the ranges.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidParameter`](crate::ErrorKind::InvalidParameter) naming the parameter.
    pub fn validate(&self) -> Result<(), Error> {
        match self.threshold {
            Threshold::Rate(r) if !(r.is_finite() && r > 0.0) => {
                return Err(Error::invalid_parameter("threshold must be a rate > 0"));
            }
            Threshold::Share(s) if !(s > 0.0 && s <= 1.0) => {
                return Err(Error::invalid_parameter("threshold share must be in (0, 1]"));
            }
            _ => {}
        }
        if !(self.per_replica.is_finite() && self.per_replica > 0.0) {
            return Err(Error::invalid_parameter("per_replica must be > 0"));
        }
        if !(self.confidence.is_finite() && self.confidence >= 0.0) {
            return Err(Error::invalid_parameter("confidence must be >= 0"));
        }
        if self.max_replicas == 0 || self.max_replicas > 255 {
            return Err(Error::invalid_parameter("max_replicas must be in 1..=255"));
        }
        Ok(())
    }
}

/// The most keys [`HotKeys`] holds hot at once: the hottest, by rate. Past a few hundred, keys
/// are hardly "hot" (each carries under a few tenths of a percent of the traffic), and every one
/// costs an entry in the set each request searches.
pub const MAX_HOT_KEYS: usize = 256;

/// A hot key as [`HotKeys`] tracks it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HotKey {
    /// The key's hash.
    pub hash: u64,
    /// Its rate, requests per second (the last window's, guaranteed part, smoothed).
    pub rate: f64,
    /// Its replica count, 1 or more.
    pub replicas: usize,
    /// When it became hot.
    pub since: Duration,
    /// When its replica count last changed (or it became hot).
    pub changed: Duration,
    /// Its recent count and the time it was counted over, each decayed by [`EVIDENCE_DECAY`] per
    /// window: the evidence growth is decided on.
    evidence: f64,
    span: f64,
}

/// How much of a hot key's recent count each window keeps (0.9: about the last ten windows), for
/// the confidence bound that decides whether it needs more replicas: one window is too little
/// evidence to add a replica on (a lucky one would), ten are enough to add it within a second.
pub const EVIDENCE_DECAY: f64 = 0.9;

/// The hot keys and their replica counts, immutable: what the request path reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HotSet {
    /// (hash, replicas), sorted by hash.
    entries: Vec<(u64, u32)>,
}

impl HotSet {
    /// The replica count of `hash`: 0 if it is not hot.
    #[inline]
    pub fn replicas(&self, hash: u64) -> usize {
        if self.entries.is_empty() {
            return 0;
        }
        match self.entries.binary_search_by_key(&hash, |e| e.0) {
            Ok(i) => self.entries[i].1 as usize,
            Err(_) => 0,
        }
    }

    /// Whether no key is hot.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The number of hot keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// (hash, replicas), sorted by hash.
    pub fn iter(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.entries.iter().map(|&(h, r)| (h, r as usize))
    }
}

/// The replication rule with hysteresis. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct HotKeys {
    config: HotKeyConfig,
    keys: Vec<HotKey>,
    last: Option<Duration>,
}

impl HotKeys {
    /// The rule.
    ///
    /// # Errors
    ///
    /// As [`HotKeyConfig::validate`].
    pub fn try_new(config: HotKeyConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(HotKeys { config, keys: Vec::new(), last: None })
    }

    /// Starts the first window at `now` (otherwise the first [`HotKeys::tick`] counts its window
    /// as one second long).
    pub fn start(&mut self, now: Duration) {
        self.last = Some(now);
    }

    /// The configuration.
    pub fn config(&self) -> &HotKeyConfig {
        &self.config
    }

    /// The hot keys, hottest first.
    pub fn keys(&self) -> &[HotKey] {
        &self.keys
    }

    /// The replica count a rate needs: `ceil(rate / per_replica)`, within `1..=max_replicas`.
    pub fn needed(&self, rate: f64) -> usize {
        let r = (rate / self.config.per_replica).ceil();
        if r.is_finite() { (r as usize).clamp(1, self.config.max_replicas) } else { self.config.max_replicas }
    }

    /// Ends a window at `now` (time since any fixed origin, passed in): turns its counts into rates,
    /// applies the rule, and returns the new [`HotSet`].
    ///
    /// The window's length is the time since the previous tick, or since [`HotKeys::start`] (a
    /// first tick without either counts as one second).
    pub fn tick(&mut self, now: Duration, window: &Window) -> HotSet {
        let elapsed = match self.last {
            Some(prev) if now > prev => (now - prev).as_secs_f64(),
            Some(_) => {
                // No time passed: nothing to measure.
                return self.set();
            }
            None => 1.0,
        };
        self.last = Some(now);
        let threshold = match self.config.threshold {
            Threshold::Rate(r) => r,
            Threshold::Share(s) => s * window.requests as f64 / elapsed,
        };
        let s = f64::from(window.sample_every.max(1));
        let z = self.config.confidence;
        // (estimate, lower confidence bound), requests per second.
        let rates = |c: &Counted| -> (f64, f64) {
            let g = c.guaranteed() as f64;
            (g / elapsed, (g - z * (g * s).sqrt()).max(0.0) / elapsed)
        };
        let rate_of =
            |hash: u64| -> (f64, f64) { window.items.iter().find(|c| c.hash == hash).map_or((0.0, 0.0), rates) };
        let held = |since: Duration| now.saturating_sub(since) >= self.config.hold;
        // Keys already hot: update, shrink or leave.
        let mut kept = Vec::with_capacity(self.keys.len());
        for mut k in std::mem::take(&mut self.keys) {
            let (measured, _) = rate_of(k.hash);
            // Smoothed downwards, immediate upwards: a surge is served at once, a lull must last.
            k.rate = if measured >= k.rate { measured } else { 0.5 * (k.rate + measured) };
            // `<=`: with a share threshold, a window without traffic has a threshold of 0.
            if k.rate <= threshold / 2.0 && held(k.since) && held(k.changed) {
                continue;
            }
            k.evidence = k.evidence * EVIDENCE_DECAY + measured * elapsed;
            k.span = k.span * EVIDENCE_DECAY + elapsed;
            // Growing takes a rate the recent windows are sure of (with confidence): noise must
            // not add replicas. Without, the window's own rate.
            let sure = if z > 0.0 {
                ((k.evidence - z * (k.evidence * s).sqrt()).max(0.0) / k.span.max(1e-9)).min(k.rate)
            } else {
                measured
            };
            let need = self.needed(sure);
            if need > k.replicas {
                k.replicas = need;
                k.changed = now;
            } else if k.replicas > 1
                && k.rate < (k.replicas - 1) as f64 * self.config.per_replica / 2.0
                && held(k.changed)
            {
                // The remaining replicas would each carry under half of `per_replica`.
                k.replicas = self.needed(2.0 * k.rate).min(k.replicas - 1);
                k.changed = now;
            }
            kept.push(k);
        }
        // New hot keys.
        for c in &window.items {
            let (rate, sure) = rates(c);
            if sure < threshold || sure <= 0.0 || kept.iter().any(|k| k.hash == c.hash) {
                continue;
            }
            let replicas = self.needed(sure);
            let (evidence, span) = (rate * elapsed, elapsed);
            kept.push(HotKey { hash: c.hash, rate, replicas, since: now, changed: now, evidence, span });
        }
        kept.sort_by(|a, b| b.rate.total_cmp(&a.rate).then(a.hash.cmp(&b.hash)));
        // Held keys stay for `hold` and new ones enter every window: without a bound, a client
        // walking through many keys just above the threshold grows the set to `counters x hold /
        // window` keys. The hottest stay.
        kept.truncate(MAX_HOT_KEYS);
        self.keys = kept;
        self.set()
    }

    /// The current [`HotSet`].
    pub fn set(&self) -> HotSet {
        let mut entries: Vec<(u64, u32)> = self.keys.iter().map(|k| (k.hash, k.replicas as u32)).collect();
        entries.sort_unstable_by_key(|e| e.0);
        HotSet { entries }
    }
}

/// The least loaded (by load over weight) eligible node among the first `replicas` nodes of a
/// key's ranking, the earlier in the ranking on a tie; if none of them is eligible, the first
/// eligible node after them. `rank` in the result is the position in the ranking.
pub fn pick_replica<I, L>(
    ranking: I,
    replicas: usize,
    nodes: &NodeSet,
    loads: &L,
    eligible: impl Fn(usize) -> bool,
) -> Option<Choice>
where
    I: IntoIterator<Item = usize>,
    L: LoadView + ?Sized,
{
    let r = replicas.max(1);
    let mut best: Option<(Choice, (u64, u32))> = None;
    for (rank, node) in ranking.into_iter().enumerate() {
        if rank >= r && best.is_some() {
            break;
        }
        if !eligible(node) {
            continue;
        }
        if rank >= r {
            return Some(Choice { node, rank });
        }
        let lw = (loads.load(node), nodes.get(node).map_or(1, |n| n.weight().max(1)));
        if best.is_none_or(|(_, b)| crate::choices::lighter(lw, b)) {
            best = Some((Choice { node, rank }, lw));
        }
    }
    best.map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(threshold: f64) -> HotKeyConfig {
        HotKeyConfig {
            threshold: Threshold::Rate(threshold),
            per_replica: 100.0,
            max_replicas: 5,
            hold: Duration::from_secs(10),
            confidence: 0.0,
        }
    }

    #[test]
    fn the_hot_set_is_bounded_and_keeps_the_hottest() {
        let mut rule = HotKeys::try_new(config(10.0)).expect("valid");
        // Windows of 400 keys above the threshold each, held for 10 s: 4,000 would be hot.
        for t in 0..10u64 {
            let items: Vec<(u64, u64)> = (0..400).map(|i| (t * 1000 + i, 20 + i)).collect();
            let set = rule.tick(Duration::from_secs(t + 1), &window(100_000, &items));
            assert!(set.entries.len() <= MAX_HOT_KEYS, "{}", set.entries.len());
        }
        let keys = rule.keys();
        assert_eq!(keys.len(), MAX_HOT_KEYS);
        assert!(keys.windows(2).all(|w| w[0].rate >= w[1].rate), "hottest first");
        assert!(keys.iter().all(|k| k.rate >= 20.0 + 399.0 - MAX_HOT_KEYS as f64), "the hottest stay");
    }

    fn window(requests: u64, hot: &[(u64, u64)]) -> Window {
        Window {
            requests,
            items: hot.iter().map(|&(hash, count)| Counted { hash, count, error: 0 }).collect(),
            sample_every: 1,
        }
    }

    #[test]
    fn a_key_enters_at_the_threshold_and_gets_the_replicas_its_rate_needs() {
        let mut h = HotKeys::try_new(config(50.0)).expect("valid");
        let s = h.tick(Duration::from_secs(1), &window(1000, &[(7, 49)]));
        assert!(s.is_empty());
        let s = h.tick(Duration::from_secs(2), &window(1000, &[(7, 250)]));
        assert_eq!(s.replicas(7), 3);
        assert_eq!(s.replicas(8), 0);
    }

    #[test]
    fn pick_replica_stays_in_the_top_r_and_takes_the_least_loaded() {
        let nodes = NodeSet::parse("a,b,c,d,e").expect("valid");
        let ranking = [3usize, 1, 4, 0, 2];
        let loads = [0u64, 5, 0, 9, 2];
        let c = pick_replica(ranking, 3, &nodes, &loads[..], |_| true).expect("one");
        assert_eq!((c.node, c.rank), (4, 2));
        // Node 0 and 2 are idle, but outside the top 3.
        let c = pick_replica(ranking, 2, &nodes, &loads[..], |_| true).expect("one");
        assert_eq!(c.node, 1);
        // None of the top 2 eligible: ordinary failover to the next.
        let c = pick_replica(ranking, 2, &nodes, &loads[..], |i| i != 3 && i != 1).expect("one");
        assert_eq!((c.node, c.rank), (4, 2));
        // Ties go to the earlier rank.
        let c = pick_replica(ranking, 3, &nodes, &[0u64; 5][..], |_| true).expect("one");
        assert_eq!(c.node, 3);
    }
}
