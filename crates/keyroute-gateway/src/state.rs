//! What the running gateway's tasks share: the request path's [`Front`], the listeners and their
//! counters, the admin token and its throttle, and the shutdown signals.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::ListenerConfig;
use crate::metrics::ListenerMetrics;
use crate::proxy::Front;

/// Failed admin token attempts, per client address: more than [`AUTH_FAILURES`] in
/// [`AUTH_WINDOW`] and the address gets 429 until the window ends.
#[derive(Debug, Default)]
pub(crate) struct AuthThrottle {
    by_ip: Mutex<std::collections::HashMap<IpAddr, (u32, Instant)>>,
    pub(crate) failures: AtomicU64,
}

/// Failed token attempts allowed per address and window.
pub(crate) const AUTH_FAILURES: u32 = 10;
/// The window.
pub(crate) const AUTH_WINDOW: Duration = Duration::from_secs(60);

/// The key a client is counted under (token failures, feed subscriptions): the address, or its
/// /64 for IPv6 (one host usually has a whole /64 to send from).
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// The most addresses the throttle remembers. Past it, expired entries are dropped first, then
/// the oldest of those not blocked; a blocked address is never forgotten to make room (failures
/// from other addresses must not lift its block). When every entry is blocked, failures from
/// addresses not in the table are counted together under [`OVERFLOW`], which blocks them all
/// after [`AUTH_FAILURES`]: an attacker with more addresses than the table is throttled as one.
/// A valid token is still never learnt this way: a throttled address gets 429 for a wrong token
/// whatever it sends.
const THROTTLE_ENTRIES: usize = 10_000;

/// The key of the shared bucket of addresses the full table has no room for.
const OVERFLOW: IpAddr = IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED);

impl AuthThrottle {
    /// Whether `ip` is over its failures now (or the shared bucket is, when `ip` has no entry of
    /// its own in a full table).
    pub(crate) fn blocked(&self, ip: IpAddr, now: Instant) -> bool {
        let map = self.by_ip.lock();
        let over = |key: &IpAddr| {
            map.get(key).is_some_and(|(n, since)| *n >= AUTH_FAILURES && now.duration_since(*since) < AUTH_WINDOW)
        };
        let key = client_key(ip);
        over(&key) || (!map.contains_key(&key) && map.len() >= THROTTLE_ENTRIES && over(&OVERFLOW))
    }

    /// Counts a failure from `ip`.
    pub(crate) fn fail(&self, ip: IpAddr, now: Instant) {
        self.failures.fetch_add(1, Relaxed);
        let mut map = self.by_ip.lock();
        let mut key = client_key(ip);
        if !map.contains_key(&key) && map.len() >= THROTTLE_ENTRIES {
            make_room(&mut map, now);
            if map.len() >= THROTTLE_ENTRIES {
                key = OVERFLOW;
            }
        }
        let e = map.entry(key).or_insert((0, now));
        if now.duration_since(e.1) >= AUTH_WINDOW {
            *e = (0, now);
        }
        e.0 += 1;
    }
}

/// Frees entries of a full throttle table: the expired ones, then the older half of those not
/// blocked. Blocked entries stay, and so does the [`OVERFLOW`] bucket while it counts.
fn make_room(map: &mut std::collections::HashMap<IpAddr, (u32, Instant)>, now: Instant) {
    map.retain(|_, (_, since)| now.duration_since(*since) < AUTH_WINDOW);
    if map.len() < THROTTLE_ENTRIES {
        return;
    }
    let evictable = |ip: &IpAddr, n: u32| n < AUTH_FAILURES && *ip != OVERFLOW;
    let mut open: Vec<Instant> =
        map.iter().filter(|(ip, (n, _))| evictable(ip, *n)).map(|(_, (_, since))| *since).collect();
    if open.is_empty() {
        return;
    }
    open.sort_unstable();
    let cut = open[open.len() / 2];
    map.retain(|ip, (n, since)| !evictable(ip, *n) || *since > cut);
}

/// State shared by every connection, the admin API and background tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The pools, every listener's: members, placement, health, and their tasks.
    pub(crate) fleet: Arc<keyroute_fleet::Fleet>,
    /// What the HTTP request path reads: routes and pools, the Via entry, request ids, draining.
    pub(crate) front: Arc<Front>,
    pub(crate) admin_token: Option<String>,
    /// `admin.hosts`: names the admin API answers to besides its address and `localhost`.
    pub(crate) admin_hosts: Vec<String>,
    pub(crate) epoch: Instant,
    pub(crate) listeners: Vec<ListenerConfig>,
    pub(crate) listener_metrics: Vec<Arc<ListenerMetrics>>,
    /// The admin listener's connection counts.
    pub(crate) admin_metrics: Arc<ListenerMetrics>,
    /// Client connections accepted by each runtime thread (the index is the thread's), as
    /// Envoy counts per worker: shows how the kernel spreads connections over the threads.
    pub(crate) thread_accepted: Mutex<Vec<Arc<AtomicU64>>>,
    /// Each listener's connection limit in force.
    pub(crate) connection_limits: Vec<usize>,
    /// Each listener's connection permits: one semaphore shared by every thread accepting on it.
    pub(crate) connection_permits: Vec<Arc<tokio::sync::Semaphore>>,
    /// Each TLS listener's certificates, which a reload replaces.
    pub(crate) certificates: Vec<Option<Arc<crate::tls::Certificates>>>,
    pub(crate) admin_listen: SocketAddr,
    /// SIGTERM received: `/readyz` says not ready.
    pub(crate) not_ready: AtomicBool,
    /// Set by a shutdown request.
    pub(crate) shutdown: watch::Sender<bool>,
    /// Set when the listeners stop accepting (after the shutdown delay).
    pub(crate) stop_accepting: watch::Sender<bool>,
    /// Set when the gateway has stopped (the grace period is over): extra runtime threads end.
    pub(crate) finished: watch::Sender<bool>,
    /// Woken whenever a client or admin connection closes (the shutdown waits on it).
    pub(crate) closed: Arc<tokio::sync::Notify>,
    /// The shutdown delay and grace period in milliseconds (a reload may change them).
    pub(crate) delay_ms: AtomicU64,
    pub(crate) grace_ms: AtomicU64,
    pub(crate) auth: AuthThrottle,
    /// Serialises reloads.
    pub(crate) reload: Mutex<()>,
    /// The dashboard's subscribers and sampler.
    pub(crate) dashboard: crate::feed::Hub,
    /// The `/placement` what-ifs being built now (at most [`crate::admin::MAX_WHAT_IFS`]).
    pub(crate) what_ifs: Arc<tokio::sync::Semaphore>,
}

impl Shared {
    /// Runtime thread `thread`'s accepted-connection counter (made on first use).
    pub(crate) fn thread_accepted(&self, thread: usize) -> Arc<AtomicU64> {
        let mut v = self.thread_accepted.lock();
        while v.len() <= thread {
            v.push(Arc::default());
        }
        Arc::clone(&v[thread])
    }

    /// Every address the gateway listens at: no worker may be one of them.
    pub(crate) fn own_addrs(&self) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = self.listeners.iter().map(|l| l.listen).collect();
        v.push(self.admin_listen);
        v
    }
}

/// Until `rx` says stop (the guard `wait_for` returns is dropped here, not held in a `select!`
/// across awaits, which would make the future not `Send`).
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

impl Shared {
    /// Client and admin connections open now.
    pub(crate) fn open_connections(&self) -> u64 {
        self.listener_metrics.iter().chain(std::iter::once(&self.admin_metrics)).map(|m| m.open.load(Relaxed)).sum()
    }
}

/// See [`GatewayHandle::ready`].
pub(crate) fn ready(shared: &Shared) -> bool {
    !shared.not_ready.load(Relaxed) && shared.fleet.ready(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failed_tokens_are_throttled_per_address_and_window() {
        let t = AuthThrottle::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().expect("ip"), "10.0.0.2".parse().expect("ip"));
        for _ in 0..AUTH_FAILURES {
            assert!(!t.blocked(a, Instant::now()));
            t.fail(a, Instant::now());
        }
        assert!(t.blocked(a, Instant::now()));
        assert!(!t.blocked(b, Instant::now()));
        // IPv6 addresses of one /64 count together; an IPv4-mapped address is its IPv4 one.
        let v6: IpAddr = "2001:db8:1:2::1".parse().expect("ip");
        for _ in 0..AUTH_FAILURES {
            t.fail(v6, Instant::now());
        }
        assert!(t.blocked("2001:db8:1:2:ffff::9".parse().expect("ip"), Instant::now()));
        assert!(!t.blocked("2001:db8:1:3::1".parse().expect("ip"), Instant::now()));
        assert!(t.blocked("::ffff:10.0.0.1".parse().expect("ip"), Instant::now()));
        tokio::time::advance(AUTH_WINDOW).await;
        assert!(!t.blocked(a, Instant::now()));
        assert_eq!(t.failures.load(Relaxed), u64::from(2 * AUTH_FAILURES));
    }

    /// Issue 31, defect 15: 10,000 failures from other addresses lifted an address's block.
    #[tokio::test(start_paused = true)]
    async fn failures_from_other_addresses_do_not_lift_a_block() {
        let t = AuthThrottle::default();
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        for _ in 0..AUTH_FAILURES {
            t.fail(a, Instant::now());
        }
        for i in 0..3 * THROTTLE_ENTRIES as u32 {
            t.fail(IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i)), Instant::now());
        }
        assert!(t.blocked(a, Instant::now()), "the flood lifted the block");
        assert!(t.by_ip.lock().len() <= THROTTLE_ENTRIES + 1);
        // A table full of blocked addresses: the rest are throttled together.
        let t = AuthThrottle::default();
        for i in 0..THROTTLE_ENTRIES as u32 {
            for _ in 0..AUTH_FAILURES {
                t.fail(IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i)), Instant::now());
            }
        }
        let (x, y): (IpAddr, IpAddr) = ("10.9.9.9".parse().expect("ip"), "10.9.9.8".parse().expect("ip"));
        for _ in 0..AUTH_FAILURES {
            assert!(!t.blocked(x, Instant::now()));
            t.fail(x, Instant::now());
        }
        assert!(t.blocked(x, Instant::now()) && t.blocked(y, Instant::now()));
        assert!(t.blocked(IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000)), Instant::now()));
    }
}
